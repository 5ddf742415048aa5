//! openraft glue: the type configuration, the durable log (an append-only
//! WAL) and the data directory's metadata (redb), the state
//! machine that applies `lock::state` commands, and the HTTP peer network.

// openraft fixes the storage error type (`StorageError`, ~224 bytes); boxing
// it at every call would only add noise.
#![allow(clippy::result_large_err)]

pub(crate) mod guard;
pub(crate) mod identity;
pub(crate) mod log_store;
pub(crate) mod log_upgrade;
pub(crate) mod meta;
pub(crate) mod network;
pub(crate) mod snapshot_file;
pub(crate) mod state_machine;
pub(crate) mod types;
pub(crate) mod upgrade;
