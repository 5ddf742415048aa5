//! S1, the per-key ordering barrier: the upstream receives fenced requests for
//! a key in non-decreasing token order. A request with token T is dispatched
//! only once no request with a lower token is in flight for that key; those
//! end when the upstream answers or the route's upstream timeout fires (the
//! residual window of docs/DESIGN.md, "Residual windows").
//!
//! A permit lives until the upstream answered, the route's timeout passed,
//! or the request provably never left (connection refused). A request that
//! hyper drops when its client hangs up finishes on a task of its own
//! (`http::Outlive`), so it does not drop its permit.
//! Observed-mode routes order under their own namespace (`@observed/<key>`),
//! so an unverified token never holds back a strict route's requests.
//! `idle()` is what shutdown waits for. Knows no HTTP.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::lock::state::Token;

/// Gates with nothing in flight kept for their keys' next requests (which
/// then allocate nothing) before they are swept.
const IDLE_GATES: usize = 1024;

#[derive(Default)]
pub(crate) struct Order {
    gates: Mutex<Gates>,
    /// Told when the last permit of all is dropped.
    emptied: Notify,
    /// Requests waiting for a lower token in flight on their key.
    waiting: AtomicUsize,
}

#[derive(Default)]
struct Gates {
    by_key: HashMap<Arc<str>, Gate>,
    /// Gates with a request in flight.
    busy: usize,
}

/// A key's requests in flight. They all carry one token: a request enters
/// only when none with a lower token is in flight, and is refused when one
/// with a higher token is.
struct Gate {
    key: Arc<str>,
    token: Token,
    /// How many; 0: none (the gate is idle).
    inflight: usize,
    changed: Arc<Notify>,
}

/// A request let through the barrier.
pub(crate) struct Entered {
    pub permit: Permit,
    /// It waited for a lower token in flight: time passed since it came.
    pub waited: bool,
}

/// A request in flight; dropping it lets higher tokens go. It owns a handle
/// on the barrier, so it can outlive the request that took it (see
/// `Sidecar::handle`: an upstream that failed mid-exchange may still apply).
pub(crate) struct Permit {
    order: Arc<Order>,
    key: Arc<str>,
    token: Token,
}

impl Order {
    /// Wait until no lower token is in flight for `key`, then register
    /// `token`. `Err(higher)` if a higher token is already in flight: this
    /// request is stale and must not be dispatched after it.
    pub(crate) async fn enter(self: &Arc<Self>, key: &str, token: Token) -> Result<Entered, Token> {
        let mut waited = false;
        loop {
            let notified = {
                let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
                let Gates { by_key, busy } = &mut *gates;
                let gate = match by_key.get_mut(key) {
                    Some(gate) => gate,
                    None => {
                        let key: Arc<str> = key.into();
                        let gate = Gate { key: key.clone(), token, inflight: 0, changed: Arc::default() };
                        by_key.entry(key).or_insert(gate)
                    }
                };
                match gate.inflight {
                    0 => {
                        (gate.token, gate.inflight) = (token, 1);
                        *busy += 1;
                        let permit = Permit { order: self.clone(), key: gate.key.clone(), token };
                        return Ok(Entered { permit, waited });
                    }
                    _ if gate.token == token => {
                        gate.inflight += 1;
                        let permit = Permit { order: self.clone(), key: gate.key.clone(), token };
                        return Ok(Entered { permit, waited });
                    }
                    _ if gate.token > token => return Err(gate.token),
                    // A lower token is in flight: wait for it.
                    _ => {}
                }
                let mut notified = Box::pin(gate.changed.clone().notified_owned());
                notified.as_mut().enable();
                notified
            };
            self.waiting.fetch_add(1, Ordering::Relaxed);
            let _waited = Waited(&self.waiting);
            notified.await;
            waited = true;
        }
    }

    /// Requests waiting now for a lower token in flight on their key (an
    /// upstream slow to answer a key's writes shows here).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Keys with requests in flight.
    pub(crate) fn busy_keys(&self) -> usize {
        self.gates.lock().unwrap_or_else(|p| p.into_inner()).busy
    }

    /// Resolves once no permit is held: every fenced request dispatched has
    /// been answered, timed out, or provably never left. A shutting-down
    /// sidecar waits for this, so that a restarted one cannot dispatch a
    /// higher token while an older write may still be applied (S1).
    pub(crate) async fn idle(&self) {
        loop {
            let emptied = self.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            if self.busy_keys() == 0 {
                return;
            }
            emptied.await;
        }
    }
}

/// One request counted in `waiting` until it stops waiting, also when its
/// future is dropped while it waits.
struct Waited<'a>(&'a AtomicUsize);

impl Drop for Waited<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut gates = self.order.gates.lock().unwrap_or_else(|p| p.into_inner());
        let Gates { by_key, busy } = &mut *gates;
        let Some(gate) = by_key.get_mut(&*self.key) else { return };
        if gate.inflight == 0 || gate.token != self.token {
            return;
        }
        gate.inflight -= 1;
        if gate.inflight > 0 {
            return;
        }
        // Higher tokens waiting on the key may go.
        gate.changed.notify_waiters();
        *busy -= 1;
        if *busy == 0 {
            self.order.emptied.notify_waiters();
        }
        // Idle gates are kept for their keys' next requests, up to a bound.
        // One swept here has no waiter left to tell: they were told above,
        // when it emptied, and look their key up again.
        if by_key.len() - *busy > IDLE_GATES {
            by_key.retain(|_, g| g.inflight > 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_higher_token_waits_for_lower_ones_in_flight() {
        let order = Arc::new(Order::default());
        let low = order.enter("k", 33).await.unwrap().permit;
        let same = order.enter("k", 33).await.unwrap().permit; // same token: concurrent is fine
        let o = order.clone();
        let high = tokio::spawn(async move { o.enter("k", 34).await.map(|e| e.waited) });
        for _ in 0..1000 {
            if order.waiting() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(order.waiting(), 1, "34 must wait for 33");
        assert!(!high.is_finished());
        drop(low);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!high.is_finished(), "one 33 is still in flight");
        drop(same);
        assert!(high.await.unwrap().unwrap(), "34 waited");
        assert_eq!((order.busy_keys(), order.waiting()), (0, 0), "no key is busy once idle");
    }

    #[tokio::test]
    async fn a_lower_token_after_a_higher_one_is_refused() {
        let order = Arc::new(Order::default());
        let _high = order.enter("k", 34).await.unwrap().permit;
        assert_eq!(order.enter("k", 33).await.err(), Some(34));
        assert!(order.enter("other", 1).await.is_ok(), "keys are independent");
    }

    /// Idle gates are kept for their keys' next requests, but no more than
    /// `IDLE_GATES` of them: a stream of new keys does not grow the map
    /// without bound, and a key whose gate was swept still orders.
    #[tokio::test]
    async fn idle_gates_are_kept_up_to_a_bound() {
        let order = Arc::new(Order::default());
        let held = order.enter("held", 7).await.unwrap().permit;
        for i in 0..3 * IDLE_GATES {
            drop(order.enter(&format!("k{i}"), 1).await.unwrap().permit);
            let gates = order.gates.lock().unwrap().by_key.len();
            assert!(gates <= IDLE_GATES + 2, "{gates} gates after {i} keys");
        }
        assert_eq!(order.busy_keys(), 1, "the held key's gate survives every sweep");
        assert_eq!(order.enter("held", 6).await.err(), Some(7), "and still orders its key");
        let _again = order.enter("k0", 2).await.unwrap().permit;
        drop(held);
        assert_eq!(order.busy_keys(), 1);
    }

    #[tokio::test]
    async fn idle_waits_for_every_permit_of_every_key() {
        let order = Arc::new(Order::default());
        let (a, b) = (order.enter("a", 1).await.unwrap().permit, order.enter("b", 2).await.unwrap().permit);
        let o = order.clone();
        let idle = tokio::spawn(async move { o.idle().await });
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!idle.is_finished(), "b is still in flight");
        drop(b);
        tokio::time::timeout(Duration::from_secs(1), idle).await.expect("idle once the last permit is gone").unwrap();
        tokio::time::timeout(Duration::from_millis(10), order.idle()).await.expect("and at once when already idle");
    }
}
