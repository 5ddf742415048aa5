//! The audit log: one structured line (target `fencegate::audit`) for every
//! grant, release, revocation, expiry and refusal, naming the identity.
//! State changes are written by every node as it applies them (so that no
//! applied change goes unlogged, whatever became of the request, and every
//! node's log holds the whole trail); refusals by the node that refused.

use crate::auth::Right;
use crate::lock::state::Token;

const TARGET: &str = "fencegate::audit";

pub fn granted(identity: &str, key: &str, token: Token) {
    tracing::info!(target: TARGET, event = "grant", identity, key, token);
}

pub fn released(identity: &str, key: &str, token: Token) {
    tracing::info!(target: TARGET, event = "release", identity, key, token);
}

/// An admin released a lease another identity owns.
pub fn revoked(identity: &str, owner: &str, key: &str, token: Token) {
    tracing::warn!(target: TARGET, event = "revoke", identity, owner, key, token);
}

pub fn expired(owner: &str, key: &str, token: Token) {
    tracing::info!(target: TARGET, event = "expire", identity = owner, key, token);
}

/// `identity` lacked `right` on `key` (or the lease was not its own).
pub fn denied(identity: &str, right: Right, key: &str, why: &str) {
    tracing::warn!(target: TARGET, event = "deny", identity, right = right.as_str(), key, why);
}

/// A request whose credentials were missing or unknown.
pub fn unauthenticated(addr: std::net::SocketAddr, why: &str) {
    tracing::warn!(target: TARGET, event = "unauthenticated", %addr, why);
}

/// A connection to the peer plane whose certificate does not fit what it did.
pub fn peer_refused(addr: std::net::SocketAddr, why: &str) {
    tracing::warn!(target: TARGET, event = "peer_refused", %addr, why);
}
