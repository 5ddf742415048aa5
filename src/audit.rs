//! The audit log: one structured line (target `fencegate::audit`) for every
//! grant, release, revocation, expiry and refusal, naming the identity.
//! State changes are written by every node as it applies them (so that no
//! applied change goes unlogged, whatever became of the request, and every
//! node's log holds the whole trail); refusals by the node that refused.

use crate::auth::Right;
use crate::lock::state::Token;

const TARGET: &str = "fencegate::audit";

/// A state change, as applied: recorded under the state's lock, written
/// after it is released (writing a log line is I/O, and the apply loop
/// holds the lock every API call needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    Grant {
        owner: String,
        key: String,
        token: Token,
    },
    Release {
        owner: String,
        key: String,
        token: Token,
    },
    /// An admin (`by`) released a lease another identity owns.
    Revoke {
        by: String,
        owner: String,
        key: String,
        token: Token,
    },
    Expire {
        owner: String,
        key: String,
        token: Token,
    },
}

/// The changes node `node` applied, each line in that node's span
/// (`node{id=2}:`). The span is at error level, so that no level filter
/// drops it, and of this target, so that `fencegate::audit[node{id=1}]=info`
/// selects one node's trail (`fencegate dev`: three nodes in one process
/// print each change once).
pub(crate) fn applied(node: u64, changes: &[Change]) {
    if changes.is_empty() {
        return;
    }
    let _node = tracing::error_span!(target: TARGET, "node", id = node).entered();
    for change in changes {
        change.write();
    }
}

impl Change {
    fn write(&self) {
        match self {
            Change::Grant { owner, key, token } => {
                tracing::info!(target: TARGET, event = "grant", identity = owner.as_str(), key = key.as_str(), token)
            }
            Change::Release { owner, key, token } => {
                tracing::info!(target: TARGET, event = "release", identity = owner.as_str(), key = key.as_str(), token)
            }
            Change::Revoke { by, owner, key, token } => tracing::warn!(
                target: TARGET,
                event = "revoke",
                identity = by.as_str(),
                owner = owner.as_str(),
                key = key.as_str(),
                token
            ),
            Change::Expire { owner, key, token } => {
                tracing::info!(target: TARGET, event = "expire", identity = owner.as_str(), key = key.as_str(), token)
            }
        }
    }
}

/// `identity` lacked `right` on `key` (or the lease was not its own).
pub(crate) fn denied(identity: &str, right: Right, key: &str, why: &str) {
    tracing::warn!(target: TARGET, event = "deny", identity, right = right.as_str(), key, why);
}

/// A request whose credentials were missing or unknown.
pub(crate) fn unauthenticated(addr: std::net::SocketAddr, why: &str) {
    tracing::warn!(target: TARGET, event = "unauthenticated", %addr, why);
}

/// A connection to the peer plane whose certificate does not fit what it did.
pub(crate) fn peer_refused(addr: std::net::SocketAddr, why: &str) {
    tracing::warn!(target: TARGET, event = "peer_refused", %addr, why);
}

/// `identity` asked the leader for a membership change (`what`).
pub(crate) fn membership(identity: &str, what: &str) {
    tracing::warn!(target: TARGET, event = "membership", identity, change = what);
}

/// `identity` took a backup of the whole table (holders and owners included).
pub(crate) fn snapshot(identity: &str, revision: u64) {
    tracing::warn!(target: TARGET, event = "snapshot", identity, revision);
}
