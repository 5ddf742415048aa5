//! fencegate: distributed locks with fencing tokens, and a sidecar that
//! enforces them in front of HTTP APIs that cannot check tokens themselves.
//!
//! See ARCHITECTURE.md for the codemap and the invariants.

// `pub(crate)` by default: what is `pub` is reachable from outside, through
// the facades at the end of this file (the lint keeps it so).
#![deny(unreachable_pub)]

mod audit;
mod auth;
mod backup;
mod batch;
mod cli;
mod config;
mod durable;
mod http;
mod inventory;
mod lock;
mod log_limit;
mod metrics;
mod percent;
mod private;
mod raft;
mod server;
mod sidecar;
mod tls;

// What is public, and why: everything else is the crate's own, so rustc's
// dead-code lint sees every item no caller uses.

/// The command line, for `main.rs`.
pub use cli::{run, Cli};

/// What the fuzz targets (`fuzz/fuzz_targets/`) feed: the product's own
/// decoders, exactly as the node and the sidecar call them.
pub mod fuzzing {
    pub use crate::config::node::{LeaseConfig, NodeConfig};
    pub use crate::config::sidecar::SidecarConfig;
    pub use crate::config::ConfigFile;
    pub use crate::http::parse_json;
    pub use crate::lock::state::LockState;
    pub use crate::lock::validate;
    pub use crate::percent::hex_byte;
    pub use crate::raft::guard::Peers;
    pub use crate::raft::types::NodeId;
    pub use crate::server::inputs;
    pub use crate::sidecar::fencing::decision::{parse_token, Reason};
    pub use crate::sidecar::idempotency;
    pub use crate::sidecar::routing::{canonical, MatchError, Matched, Routes};
}

/// What the integration tests and benchmarks reach inside: the Raft types
/// a hostile peer forges, the peer secret's proofs, the event loops hyper's
/// floor runs on, and the memory bounds a scale run reports.
pub mod testing {
    pub use crate::auth::PeerSecrets;
    pub use crate::http::Workers;
    pub use crate::lock::state::REQUEST_ID_MEMORY;
    pub use crate::raft::state_machine::EVENT_MEMORY;
    pub use crate::raft::types::{Entry, TypeConfig};
}
