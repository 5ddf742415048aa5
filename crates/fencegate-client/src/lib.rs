//! The fencegate lock client: take a lease on a key, keep it alive, know —
//! conservatively — the moment it may be lost, and carry its fencing token to
//! the resource.
//!
//! This crate is all a Rust program needs to use a fencegate cluster: it
//! pulls in no Raft, storage, HTTP server or command line. The lock service
//! and the sidecar speak the [`wire`] protocol defined here.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fencegate_client::ClientError> {
//! use std::time::Duration;
//! use fencegate_client::{AcquireOptions, Client};
//!
//! let client = Client::new(vec!["http://127.0.0.1:7401".into()])?;
//! let lease = client.acquire("rack/42", AcquireOptions::new(Duration::from_secs(30))).await?;
//! // ... send lease.token() in `X-Fence-Token` with every write ...
//! tokio::select! {
//!     reason = lease.lost() => eprintln!("stop now: {reason}"),
//!     _ = async { /* the work */ } => {}
//! }
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! A complete program is in `examples/hold_lock.rs`. Start a local cluster
//! with `cargo run --release -- dev` in the repository, then run
//! `cargo run -p fencegate-client --example hold_lock [KEY]` (the endpoints
//! come from `$FENCEGATE_ENDPOINTS`, default `http://127.0.0.1:7401`).
//!
//! The guarantees (L1–L6) are in the repository's `docs/DESIGN.md`.
#![warn(missing_docs)]

pub mod backoff;
mod client;
pub mod etcd;
pub mod http;
pub mod idempotency;
mod lease;
pub mod tls;
pub mod url;
pub mod wire;

pub use client::{AcquireOptions, Client, ClientError, ClientOptions, DEFAULT_ENDPOINTS, FAILOVER_BUDGET};
pub use lease::{Lease, LostReason};
pub use wire::{ClusterInfo, LockInfo, Member, Token, TOKEN_HEADER};
