//! The default tier: fencegate end to end on real processes, on loopback
//! only, as any user on any Linux machine with nothing installed but the
//! Rust toolchain. One binary, so it is linked once; each module is a suite
//! (`cargo test --test e2e sidecar::` runs one).
//!
//! What needs root, extra packages or long minutes is the fault tier
//! (`tests/faults/main.rs`).

mod attacks;
mod backup;
mod cli;
mod compaction;
mod console;
mod deploy;
mod docs;
mod idempotency;
mod lock_cli;
mod lock_service;
mod membership;
mod messages;
mod metrics;
mod security;
mod sidecar;
mod sidecar_order;
mod sidecar_tls;
mod staleness;
