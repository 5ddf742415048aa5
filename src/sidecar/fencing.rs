//! The fence check for one request, in order:
//!
//! ```text
//!  token header ──parse (S6)──▶ decide from knowledge ──AskService──▶ linearizable read (S3)
//!                                   │  (linearizable route: read first, S5)      │
//!                                   ▼                                           ▼
//!                               Forward ──▶ ordering barrier (S1) ──▶ vouch if it waited or read ──▶ raise floor (fsync, S2)
//!   (sidecar.rs: buffered body, idempotency record's fsync) ──▶ dispatch: vouch ──▶ upstream
//! ```
//!
//! The decision is re-taken after the barrier if the request waited there
//! or read the key, and again immediately before the request is sent
//! upstream, because a newer grant may have been learnt meanwhile, or the
//! proof the decision stood on may have lapsed (a read answered late
//! vouches for nothing): what counts is what is known when it is
//! dispatched. (Decided from the watch and let through the barrier at once,
//! it awaited nothing since its decision: deciding again there would only
//! repeat it.)
//!
//! `vouch`: every route of the lock service (`cached` or `linearizable`)
//! decides from knowledge proven current less than `max_staleness` ago —
//! the watch's (see `freshness`), or a read of the key sent that recently —
//! and otherwise reads the key first; a read answered `max_staleness` or
//! more after it was sent vouches for nothing (503). Before the barrier, a
//! `cached` route decides from the watch alone while it is proven fresh.
//!
//! A refusal on cached knowledge stands without a read, since knowledge only
//! grows. Forwarding needs a read on linearizable routes, whenever the watch
//! is down, and on cached routes once the proof is older than
//! `max_staleness`. Knows no upstream.

pub(crate) mod barrier;
pub(crate) mod decision;
pub(crate) mod etcd;
pub(crate) mod freshness;
pub(crate) mod knowledge;
pub(crate) mod zookeeper;

use std::borrow::Cow;
use std::sync::Arc;

use hyper::HeaderMap;
use tokio::time::Instant;

use crate::config::sidecar::{Consistency, Fence, FenceMode, MissingToken};
use crate::lock::state::Token;
use crate::sidecar::answer::{Answer, Rejection};
use crate::sidecar::console::{Happened, Timeline};
use crate::sidecar::fencing::barrier::{Order, Permit};
use crate::sidecar::fencing::decision::{decide, parse_token, Knowledge, Reason, Verdict};
use crate::sidecar::fencing::knowledge::LockView;
use crate::sidecar::routing::{Route, Routes};
use crate::sidecar::state::floors::Floors;

/// The prefixes the lock keys of the `cached` routes of the lock service
/// start with: each key template's text before its first placeholder (a
/// template without one names a single lock: its name and a `/`). What
/// etcd follows (`knowledge`); config validation refuses a `cached` route
/// on etcd whose template starts with a placeholder.
pub(crate) fn followed(routes: &Routes) -> Vec<String> {
    let mut prefixes: Vec<String> = routes
        .iter()
        .filter(|r| r.fence.trusts_the_watch())
        .filter_map(|r| r.lock_key())
        .map(|k| match k.split_once('{') {
            Some((fixed, _)) => fixed.to_string(),
            None => format!("{k}/"),
        })
        .collect();
    prefixes.sort();
    // One that another starts with is covered by it.
    prefixes.dedup();
    let all = prefixes.clone();
    prefixes.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q.as_str())));
    prefixes
}

/// A fenced request that passed the check: its place in the order, and
/// what `dispatch` needs to decide again.
pub(crate) struct Cleared<'r> {
    pub permit: Permit,
    mode: FenceMode,
    token: Token,
    key: &'r str,
    route: &'r str,
    /// When the latest read of the key that vouches for it was sent.
    read_at: Option<Instant>,
    /// Every grant of the key up to this has ended, by the reads so far.
    ended: Token,
}

pub(crate) struct Fencer {
    /// `None` when no route needs the lock service (observed mode only).
    pub view: Option<Arc<LockView>>,
    pub floors: Floors,
    pub order: Arc<Order>,
    /// Told the first forward of each token (its floor raised).
    pub timeline: Arc<Timeline>,
}

impl Fencer {
    /// Check a request on `route` for `key`. `Ok(None)`: forward unfenced;
    /// `Ok(Some(cleared))`: forward once `dispatch` agrees, holding
    /// `cleared.permit` until the upstream answers.
    pub(crate) async fn check<'r>(
        &self,
        route: &'r Route,
        key: &'r str,
        headers: &HeaderMap,
        arrived: Instant,
    ) -> Result<Option<Cleared<'r>>, Answer> {
        let Fence::On { mode, consistency } = route.fence else { return Ok(None) };
        let reject =
            |reason, token, current| Answer::Rejected(Rejection { reason, key: key.to_string(), token, current });
        let token = match parse_token(headers) {
            Ok(Some(t)) => t,
            Ok(None) if route.missing_token == MissingToken::Allow => return Ok(None),
            Ok(None) => return Err(reject(Reason::MissingToken, None, None)),
            Err(reason) => return Err(reject(reason, None, None)),
        };
        let unavailable = |_| reject(Reason::LockServiceUnavailable, Some(token), None);

        // Knowledge only grows, so a refusal on what is cached stands; but to
        // forward, a linearizable route needs a read (S5), and so does any
        // route of the lock service while its watch is down, or while its
        // knowledge was last proven current longer than `max_staleness` ago:
        // cached knowledge would otherwise age without bound (a lease that
        // ended unseen would still look live).
        let watch_down = self.view.as_ref().is_some_and(|v| !v.is_up());
        let cached = mode != FenceMode::Observed && consistency == Consistency::Cached;
        let (mut known, trusted) = self.look(mode, key, None);
        let stale = cached && !watch_down && !trusted;
        let needs_read =
            mode != FenceMode::Observed && (consistency == Consistency::Linearizable || watch_down || stale);
        // The send time of a read of this key that vouches for it (it
        // started no earlier than the request arrived).
        let mut read_at = None;
        let mut ended = 0;
        loop {
            match decide(mode, token, &known, read_at.is_some()) {
                Verdict::Forward if read_at.is_some() || !needs_read => break,
                Verdict::Reject { reason, current } => return Err(reject(reason, Some(token), Some(current))),
                Verdict::Forward | Verdict::AskService => {
                    if stale {
                        self.count_stale(&route.name);
                    }
                    ended = ended.max(self.read(key, arrived).await.map_err(unavailable)?);
                    read_at = Some(arrived);
                    known = self.look(mode, key, read_at).0;
                    known.ended_through(ended);
                }
            }
        }

        // The barrier is per floor: an observed route's unverified tokens
        // must not hold back or refuse a strict route on the same lock key.
        let floor = floor_key(mode, key);
        let entered = self
            .order
            .enter(&floor, token)
            .await
            .map_err(|higher| reject(Reason::StaleToken, Some(token), Some(higher)))?;
        let mut cleared = Cleared { permit: entered.permit, mode, token, key, route: &route.name, read_at, ended };
        // A wait may have outlasted the proof (or the read) the first
        // decision stood on, and a read answered late vouches for nothing:
        // re-decide, reading again if it lapsed, before the floor records
        // the token as forwarded. Decided from the watch and let through at
        // once, nothing was awaited since that decision (`dispatch` decides
        // once more before the request leaves).
        if entered.waited || read_at.is_some() {
            self.vouch(&mut cleared).await?;
        }
        let rose = self.floors.raise(&floor, token).await.map_err(|e| Answer::Internal(e.to_string()))?;
        // An observed route's floor is of tokens nobody vouched for.
        if rose && mode != FenceMode::Observed {
            self.timeline.record(key, Happened::Forwarded { token });
        }
        Ok(Some(cleared))
    }

    /// The last check, immediately before the request is sent upstream
    /// (after the floor's fsync, a buffered body, an idempotency record's
    /// fsync), still holding the order permit: what decides is what is known
    /// when it is dispatched, proven less than `max_staleness` ago.
    pub(crate) async fn dispatch(&self, cleared: &mut Cleared<'_>) -> Result<(), Answer> {
        self.vouch(cleared).await
    }

    /// Decide `cleared` again from knowledge that is vouched for now: the
    /// watch's, proven current less than `max_staleness` ago, or a read of
    /// the key sent less than `max_staleness` ago; otherwise read the key
    /// first. A read answered `max_staleness` or more after it was sent
    /// vouches for nothing by then: 503. Every route of the lock service,
    /// `cached` or `linearizable` (whose read on arrival may be old by now).
    async fn vouch(&self, c: &mut Cleared<'_>) -> Result<(), Answer> {
        let reject = |reason, current| {
            Answer::Rejected(Rejection { reason, key: c.key.to_string(), token: Some(c.token), current })
        };
        if c.mode == FenceMode::Observed {
            // Nothing to prove but the floors: a strict route on the key may
            // have raised its own meanwhile.
            return match decide(c.mode, c.token, &self.look(c.mode, c.key, None).0, true) {
                Verdict::Reject { reason, current } => Err(reject(reason, Some(current))),
                Verdict::Forward | Verdict::AskService => Ok(()),
            };
        }
        let (mut known, trusted) = self.look(c.mode, c.key, c.read_at);
        if !trusted {
            self.count_stale(c.route);
            let sent = Instant::now();
            let ended = self.read(c.key, sent).await.map_err(|_| reject(Reason::LockServiceUnavailable, None))?;
            c.ended = c.ended.max(ended);
            let (after, trusted) = self.look(c.mode, c.key, Some(sent));
            if !trusted {
                return Err(reject(Reason::LockServiceUnavailable, None));
            }
            (known, c.read_at) = (after, Some(sent));
        }
        known.ended_through(c.ended);
        match decide(c.mode, c.token, &known, true) {
            Verdict::Reject { reason, current } => Err(reject(reason, Some(current))),
            Verdict::Forward | Verdict::AskService => Ok(()),
        }
    }

    /// What is known of `key` (its floor included), and whether it may be
    /// trusted now, within `max_staleness`: the watch's knowledge, or a
    /// read of the key sent at `read_at`. One lookup of each.
    fn look(&self, mode: FenceMode, key: &str, read_at: Option<Instant>) -> (Knowledge, bool) {
        let (mut known, trusted) = match &self.view {
            Some(view) => {
                let now = Instant::now();
                let (known, trusted) = view.look(key, now);
                let known = match mode {
                    FenceMode::Strict | FenceMode::Monotonic => known,
                    FenceMode::Observed => Knowledge::default(),
                };
                (known, trusted || read_at.is_some_and(|at| view.read_trusted(at, now)))
            }
            None => (Knowledge::default(), true),
        };
        known.floor = match mode {
            FenceMode::Strict | FenceMode::Monotonic => self.floors.get(key),
            // An observed token keeps up with the key's verified floor too
            // (a route switched from strict by a reload keeps it), though
            // it raises only its own.
            FenceMode::Observed => self.floors.get(&floor_key(mode, key)).max(self.floors.get(key)),
        };
        (known, trusted)
    }

    fn count_stale(&self, route: &str) {
        if let Some(view) = &self.view {
            view.count_stale(route);
        }
    }

    async fn read(&self, key: &str, arrived: Instant) -> Result<Token, String> {
        match &self.view {
            // Boxed: a read is an HTTP exchange, a large future, and rare on
            // a cached route; inline, every request's future would carry
            // (and move) its room.
            Some(view) => Box::pin(view.read(key, arrived)).await,
            None => Err("no lock service configured".into()),
        }
    }

    /// The latest token known for `key`, for logs.
    pub(crate) fn current(&self, key: &str) -> Token {
        self.look(FenceMode::Strict, key, None).0.latest
    }
}

/// Observed-mode floors are tokens nobody verified: kept apart from the
/// floors of lock-service routes, so that an observed route cannot raise (or
/// forge) the floor a strict or monotonic route trusts. `@` never appears in
/// a lock key. (The other way round is safe: an observed route also
/// refuses what is below the key's strict floor, see `look`.)
fn floor_key(mode: FenceMode, key: &str) -> Cow<'_, str> {
    match mode {
        FenceMode::Observed => Cow::Owned(format!("@observed/{key}")),
        FenceMode::Strict | FenceMode::Monotonic => Cow::Borrowed(key),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fencegate_client::Client;

    use super::*;
    use crate::metrics::SidecarMetrics;
    use crate::sidecar::fencing::knowledge::tests::{learnt_late, slow_reads};
    use crate::sidecar::state::Store;

    /// A fencer whose lock service answers reads of `rack/1` (token 34,
    /// held) 150 ms after they are sent, and whose watch never proves
    /// anything (the stand-in has no stream).
    async fn fencer(dir: &std::path::Path, max_staleness: Duration) -> Fencer {
        let metrics = SidecarMetrics::new(&prometheus::Registry::new()).unwrap();
        let client = Client::new(vec![slow_reads(Arc::default()).await]).unwrap();
        let (store, loaded) = Store::open(dir).unwrap();
        Fencer {
            view: Some(LockView::start(client, metrics, max_staleness, vec![], Arc::default())),
            floors: Floors::new(Arc::new(store), loaded.floors),
            order: Arc::default(),
            timeline: Arc::default(),
        }
    }

    /// etcd follows each cached route's fixed part once, not one inside
    /// another, and nothing of the other routes.
    #[test]
    fn the_followed_prefixes_are_the_cached_routes_fixed_parts() {
        let table = crate::sidecar::routing::tests::routes(concat!(
            "[{ name: a, path: '/racks/{rack}', lock_key: 'rack/{rack}' },",
            " { name: b, path: '/racks/{rack}/slots/{slot}', lock_key: 'rack/{rack}/slot/{slot}' },",
            " { name: c, path: '/items', lock_key: 'items' },",
            " { name: d, path: '/hosts/{h}', lock_key: 'host/{h}', fence: { consistency: linearizable } },",
            " { name: e, path: '/files/{f}', lock_key: 'file/{f}', fence: { mode: observed } },",
            " { name: f, path: '/racked/{r}', lock_key: 'racked-{r}' }]"
        ));
        assert_eq!(followed(&table), ["items/", "rack/", "racked-"]);
    }

    async fn vouched(f: &Fencer) -> Result<(), Answer> {
        vouched_after(f, None, 0).await
    }

    /// `vouch` for token 34 of `rack/1`, after a read sent at `read_at` that
    /// showed every grant up to `ended` ended.
    async fn vouched_after(f: &Fencer, read_at: Option<Instant>, ended: Token) -> Result<(), Answer> {
        let permit = f.order.enter("rack/1", 34).await.unwrap().permit;
        let mut c = Cleared { permit, mode: FenceMode::Strict, token: 34, key: "rack/1", route: "r", read_at, ended };
        f.vouch(&mut c).await
    }

    /// A read showed 34 ended; an older answer that says it is held, learnt
    /// after the read (a slower etcd member, a watch line behind it), does
    /// not make it live again for a decision that stands on that read.
    #[tokio::test]
    async fn an_answer_older_than_the_read_does_not_undo_what_it_ended() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(dir.path(), Duration::from_secs(5)).await;
        learnt_late(f.view.as_ref().unwrap(), "rack/1", 34);
        match vouched_after(&f, Some(Instant::now()), 40).await {
            Err(Answer::Rejected(r)) => assert_eq!(r.reason, Reason::LeaseExpired),
            other => panic!("34 ended by the read: {:?}", other.map_err(|a| a.to_string())),
        }
        assert!(vouched_after(&f, Some(Instant::now()), 33).await.is_ok(), "a read that ended only grants before 34");
    }

    /// A read answered `max_staleness` or more after it was sent vouches for
    /// nothing by then: 503, not a forward on what it said.
    #[tokio::test]
    async fn a_read_answered_after_max_staleness_vouches_for_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let slow = fencer(&dir.path().join("a"), Duration::from_millis(100)).await;
        match vouched(&slow).await {
            Err(Answer::Rejected(r)) => assert_eq!(r.reason, Reason::LockServiceUnavailable),
            other => panic!("a 150 ms read under a 100 ms bound: {:?}", other.map_err(|a| a.to_string())),
        }
        let ok = fencer(&dir.path().join("b"), Duration::from_secs(1)).await;
        assert!(vouched(&ok).await.is_ok(), "the same read within a 1 s bound vouches");
    }

    /// A linearizable check whose read on arrival came back after
    /// `max_staleness` is refused at the check, before the floor records its
    /// token as forwarded: also when nothing held it at the barrier.
    #[tokio::test]
    async fn a_check_on_a_late_read_is_refused_before_the_floor_rises() {
        let dir = tempfile::tempdir().unwrap();
        let table = crate::sidecar::routing::tests::routes(
            "[{ name: r, path: '/racks/{rack}', lock_key: 'rack/{rack}', fence: { consistency: linearizable } }]",
        );
        let route = table.iter().next().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-fence-token", "34".parse().unwrap());
        let headers = &headers;
        let check = |f: Fencer| async move {
            let refused = match f.check(route, "rack/1", headers, Instant::now()).await {
                Err(Answer::Rejected(r)) => Some(r.reason),
                Err(other) => panic!("{other}"),
                Ok(_) => None,
            };
            (refused, f.floors.get("rack/1"))
        };
        let slow = fencer(&dir.path().join("a"), Duration::from_millis(100)).await;
        assert_eq!(check(slow).await, (Some(Reason::LockServiceUnavailable), 0), "a 150 ms read, a 100 ms bound");
        let ok = fencer(&dir.path().join("b"), Duration::from_secs(1)).await;
        assert_eq!(check(ok).await, (None, 34), "the control: the same read within a 1 s bound");
    }
}
