//! The verification suites' shared parts (Jepsen-style): the [`history`] a
//! run records, the [`workload`] of holders that pause past their TTL and
//! keep writing, the [`checker`] that reports each invariant separately from
//! a history alone, and the [`summary`] table a run prints. Used by the
//! torture, partition and membership suites.

pub mod checker;
pub mod history;
pub mod summary;
pub mod workload;
