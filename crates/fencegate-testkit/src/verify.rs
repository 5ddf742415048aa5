//! The verification suites' shared parts (Jepsen-style): the [`history`] a
//! run records, the [`workload`] of holders that pause past their TTL and
//! keep writing, the [`checker`] that reports each invariant separately from
//! a history alone, and the [`summary`] table a run prints. Used by the
//! torture, partition and membership suites; [`recipe`] runs the torture
//! workload over locks etcd's and ZooKeeper's own clients hold.

pub mod checker;
pub mod history;
pub mod recipe;
pub mod summary;
pub mod workload;
