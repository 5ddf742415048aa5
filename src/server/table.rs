//! `GET /v1/locks?prefix=P[&limit=N]`: the lock table under a prefix, as
//! the leader holds it (what the node's console lists; `wire::LockTable`).
//!
//! A leader call, answered after a quorum confirmed the leadership (so the
//! lease clock's time left is the leader's, reset for its term), listing
//! only the keys the caller may `read`: a key it may not read is neither
//! shown nor counted, and only where its rules reach is walked. At most
//! `MAX_LIMIT` keys per answer; `truncated` says more lie under the
//! prefix, to be narrowed.

use fencegate_client::wire::{LockRow, LockTable};
use tokio::time::Instant;

use super::error::ApiError;
use super::Node;
use crate::auth::Right;

/// Keys listed when the query names no `limit`.
pub(super) const DEFAULT_LIMIT: usize = 500;
/// Keys listed at most.
pub(super) const MAX_LIMIT: usize = 1000;
/// Keys looked at per listing, at most (those a rule naming a whole key
/// walks past are looked at too).
const MAX_SCANNED: usize = 4 * MAX_LIMIT;

/// Read `prefix=P[&limit=N]`, each value percent-decoded once and checked.
pub(super) fn params(query: Option<&str>) -> Result<(String, usize), ApiError> {
    let (mut prefix, mut limit) = (String::new(), DEFAULT_LIMIT);
    for pair in crate::percent::query(query) {
        match pair.map_err(ApiError::BadRequest)? {
            ("prefix", p) => prefix = p,
            ("limit", n) => {
                limit = match n.parse::<usize>() {
                    Ok(l @ 1..=MAX_LIMIT) => l,
                    _ => return Err(ApiError::BadRequest(format!("limit={n:?} is not a number in 1..={MAX_LIMIT}"))),
                }
            }
            (name, _) => return Err(ApiError::BadRequest(format!("unknown parameter {name:?} (prefix, limit)"))),
        }
    }
    crate::lock::validate::prefix(&prefix)?;
    Ok((prefix, limit))
}

/// The first `limit` keys under `prefix` that `identity` may read, now.
/// Only the prefixes its rules reach are walked, and at most `MAX_SCANNED`
/// keys of them (the applied state is held meanwhile: applying waits).
pub(super) fn list(node: &Node, identity: &str, prefix: &str, limit: usize) -> LockTable {
    let acl = node.acl.load();
    let walks = acl.scans(identity, Right::Read, prefix);
    let s = node.applied.lock();
    let now = Instant::now();
    let millis = |d: std::time::Duration| d.as_millis() as u64;
    let keys = walks.iter().flat_map(|walk| s.locks.keys_with_prefix(walk));
    let (shown, truncated) = first(keys, |(key, _)| acl.allows(identity, Right::Read, key), limit, MAX_SCANNED);
    let locks = shown
        .into_iter()
        .map(|(key, k)| {
            let lease = s.locks.holder_of(key);
            LockRow {
                key: key.clone(),
                held: lease.is_some(),
                token: k.token,
                holder: lease.map(|(_, l)| l.holder.clone()),
                owner: lease.map(|(_, l)| l.owner.clone()),
                expires_in_ms: lease.and_then(|(id, _)| s.clock.remaining(id, now)).map(millis),
                ttl_ms: lease.map(|(_, l)| l.ttl_ms),
                lock_delay_ms: lease.map(|(_, l)| l.lock_delay_ms),
                delay_left_ms: k.delay.as_ref().and_then(|_| s.clock.delay_remaining(key, now)).map(millis),
                waiters: node.waitlist.waiting(key),
            }
        })
        .collect();
    LockTable { rev: s.locks.revision(), cluster: s.locks.cluster().map(str::to_string), locks, truncated }
}

/// The first `limit` items `allowed` lets through, looking at `max_seen`
/// items at most; and whether more were left (allowed, or not looked at).
fn first<T>(
    items: impl Iterator<Item = T>,
    allowed: impl Fn(&T) -> bool,
    limit: usize,
    max_seen: usize,
) -> (Vec<T>, bool) {
    let mut items = items.fuse();
    let mut shown = Vec::new();
    for item in items.by_ref().take(max_seen) {
        if !allowed(&item) {
            continue;
        }
        if shown.len() == limit {
            return (shown, true);
        }
        shown.push(item);
    }
    let more = items.next().is_some();
    (shown, more)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At most `limit` shown, at most `max_seen` looked at; `truncated`
    /// when an allowed one was left, or any was not looked at.
    #[test]
    fn the_first_allowed_within_the_bounds() {
        let even = |n: &u32| n % 2 == 0;
        assert_eq!(first(0..10, even, 3, 100), (vec![0, 2, 4], true));
        assert_eq!(first(0..10, even, 5, 100), (vec![0, 2, 4, 6, 8], false), "all shown");
        assert_eq!(first(0..9, even, 5, 100), (vec![0, 2, 4, 6, 8], false));
        assert_eq!(first(0..10, even, 100, 4), (vec![0, 2], true), "4 looked at, 6 not");
        assert_eq!(first(0..4, even, 100, 4), (vec![0, 2], false), "4 looked at, none left");
        assert_eq!(first(0..10, |_: &u32| false, 5, 100), (vec![], false), "none allowed: none counted");
    }

    #[test]
    fn params_are_checked() {
        assert_eq!(params(None).unwrap(), (String::new(), DEFAULT_LIMIT));
        assert_eq!(params(Some("prefix=rack%2F&limit=7")).unwrap(), ("rack/".into(), 7));
        for bad in ["limit=0", "limit=1001", "limit=x", "after=3", "prefix=%ff"] {
            assert!(matches!(params(Some(bad)), Err(ApiError::BadRequest(_))), "{bad}");
        }
        for bad in ["prefix=..", "prefix=a//b", "prefix=a%20b"] {
            assert!(matches!(params(Some(bad)), Err(ApiError::Invalid(_))), "{bad}");
        }
    }
}
