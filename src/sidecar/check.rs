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
        // route of the lock service while its watch is down: cached
        // knowledge would otherwise age without bound (a lease that ended
        // unseen would still look live).
        let watch_down = self.view.as_ref().is_some_and(|v| !v.is_up());
        let needs_read = mode != FenceMode::Observed && (consistency == Consistency::Linearizable || watch_down);
        let mut fresh = false;
        loop {
            match decide(mode, token, &self.knowledge(mode, key), fresh) {
                Verdict::Forward if fresh || !needs_read => break,
                Verdict::Reject { reason, current } => return Err(reject(reason, Some(token), Some(current))),
                Verdict::Forward | Verdict::AskService => {
                    self.read(key, arrived).await.map_err(unavailable)?;
                    fresh = true;
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
        if let Verdict::Reject { reason, current } = decide(mode, token, &self.knowledge(mode, key), true) {
            return Err(reject(reason, Some(token), Some(current)));
        }
        self.floors.raise(&floor, token).await.map_err(|e| Answer::Internal(e.to_string()))?;
        Ok(Some(permit))
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
