//! openraft glue: the type configuration, the durable log (redb), the state
//! machine that applies `lock::state` commands, and the HTTP peer network.

pub mod log_store;
pub mod network;
pub mod state_machine;
pub mod types;
