//! openraft glue: the type configuration, the durable log (redb), the state
//! machine that applies `lock::state` commands, and the HTTP peer network.

// openraft fixes the storage error type (`StorageError`, ~224 bytes); boxing
// it at every call would only add noise.
#![allow(clippy::result_large_err)]

pub mod guard;
pub mod identity;
pub mod log_store;
pub mod network;
pub mod snapshot_file;
pub mod state_machine;
pub mod types;
pub mod upgrade;
