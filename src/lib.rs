//! fencegate: distributed locks with fencing tokens, and a sidecar that
//! enforces them in front of HTTP APIs that cannot check tokens themselves.
//!
//! See ARCHITECTURE.md for the codemap and the invariants.

pub mod audit;
pub mod auth;
pub mod backup;
pub mod batch;
pub mod cli;
pub mod config;
pub mod durable;
pub mod http;
pub mod inventory;
pub mod lock;
pub mod log_limit;
pub mod metrics;
pub mod percent;
pub mod private;
pub mod raft;
pub mod server;
pub mod sidecar;
pub mod tls;
