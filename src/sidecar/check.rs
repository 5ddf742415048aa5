//! The fence check for one request, in order:
//!
//! ```text
//!  token header ──parse (S6)──▶ decide from knowledge ──AskService──▶ linearizable read (S3)
//!                                   │  (linearizable route: read first, S5)      │
//!                                   ▼                                           ▼
//!                               Forward ──▶ ordering barrier (S1) ──▶ re-decide ──▶ raise floor (fsync, S2) ──▶ dispatch
//! ```
//!
//! The decision is re-taken after the barrier because a newer grant may have
//! been learnt while the request waited; what counts is what is known when it
//! is dispatched.
//!
//! A `cached` route decides from the watch stream alone only while that
//! knowledge was proven current less than `max_staleness` ago (see
//! `freshness`), both before and after the barrier; past it, it reads the
//! key first, as while the watch is down.

use std::sync::Arc;

use hyper::HeaderMap;
use tokio::time::Instant;

use super::answer::{Answer, Rejection};
use super::fence::{decide, parse_token, Consistency, Fence, FenceMode, Knowledge, MissingToken, Reason, Verdict};
use super::floors::Floors;
use super::knowledge::LockView;
use super::order::{Order, Permit};
use super::routes::Route;
use crate::lock::state::Token;

pub struct Fencer {
    /// `None` when no route needs the lock service (observed mode only).
    pub view: Option<Arc<LockView>>,
    pub floors: Floors,
    pub order: Arc<Order>,
}

impl Fencer {
    /// Check a request on `route` for `key`. `Ok(None)`: forward unfenced;
    /// `Ok(Some(permit))`: forward, holding the permit until the upstream
    /// answers.
    pub async fn check(
        &self,
        route: &Route,
        key: &str,
        headers: &HeaderMap,
        arrived: Instant,
    ) -> Result<Option<Permit>, Answer> {
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
        let stale = cached && !watch_down && !self.trusted(None);
        let needs_read =
            mode != FenceMode::Observed && (consistency == Consistency::Linearizable || watch_down || stale);
        // The send time of a read of this key that vouches for it (it
        // started no earlier than the request arrived).
        let mut read_at = None;
        loop {
            match decide(mode, token, &self.knowledge(mode, key), read_at.is_some()) {
                Verdict::Forward if read_at.is_some() || !needs_read => break,
                Verdict::Reject { reason, current } => return Err(reject(reason, Some(token), Some(current))),
                Verdict::Forward | Verdict::AskService => {
                    if stale {
                        self.count_stale(&route.name);
                    }
                    self.read(key, arrived).await.map_err(unavailable)?;
                    read_at = Some(arrived);
                }
            }
        }

        // The barrier is per floor: an observed route's unverified tokens
        // must not hold back or refuse a strict route on the same lock key.
        let floor = floor_key(mode, key);
        let permit = self
            .order
            .enter(&floor, token)
            .await
            .map_err(|higher| reject(Reason::StaleToken, Some(token), Some(higher)))?;
        // The wait may have outlasted the proof the first decision stood on:
        // a cached route decides at dispatch time from knowledge proven less
        // than `max_staleness` ago, or reads again.
        if cached && !self.trusted(read_at) {
            self.count_stale(&route.name);
            let now = Instant::now();
            self.read(key, now).await.map_err(unavailable)?;
        }
        if let Verdict::Reject { reason, current } = decide(mode, token, &self.knowledge(mode, key), true) {
            return Err(reject(reason, Some(token), Some(current)));
        }
        self.floors.raise(&floor, token).await.map_err(|e| Answer::Internal(e.to_string()))?;
        Ok(Some(permit))
    }

    /// Whether the watch's knowledge (or a read of the key sent at
    /// `read_at`) may be trusted now, within `max_staleness`.
    fn trusted(&self, read_at: Option<Instant>) -> bool {
        let Some(view) = &self.view else { return true };
        let now = Instant::now();
        view.trusted(now) || read_at.is_some_and(|at| view.read_trusted(at, now))
    }

    fn count_stale(&self, route: &str) {
        if let Some(view) = &self.view {
            view.count_stale(route);
        }
    }

    fn knowledge(&self, mode: FenceMode, key: &str) -> Knowledge {
        let mut k = match (&self.view, mode) {
            (Some(view), FenceMode::Strict | FenceMode::Monotonic) => view.get(key),
            _ => Knowledge::default(),
        };
        k.floor = self.floors.get(&floor_key(mode, key));
        k
    }

    async fn read(&self, key: &str, arrived: Instant) -> Result<(), String> {
        match &self.view {
            Some(view) => view.read(key, arrived).await,
            None => Err("no lock service configured".into()),
        }
    }

    /// The latest token known for `key`, for logs.
    pub fn current(&self, key: &str) -> Token {
        self.knowledge(FenceMode::Strict, key).latest
    }
}

/// Observed-mode floors are tokens nobody verified: kept apart from the
/// floors of lock-service routes, so that an observed route cannot raise (or
/// forge) the floor a strict or monotonic route trusts. `@` never appears in
/// a lock key.
fn floor_key(mode: FenceMode, key: &str) -> String {
    match mode {
        FenceMode::Observed => format!("@observed/{key}"),
        FenceMode::Strict | FenceMode::Monotonic => key.to_string(),
    }
}
