//! S1, the per-key ordering barrier: the upstream receives fenced requests for
//! a key in non-decreasing token order. A request with token T is dispatched
//! only once no request with a lower token is in flight for that key; those
//! end when the upstream answers or the route's upstream timeout fires (the
//! residual window of docs/DESIGN.md, "Residual windows").
//!
//! A permit lives until the upstream answered, the route's timeout passed,
//! or the request provably never left (connection refused). Each request
//! runs in its own task, so a client hanging up does not drop its permit.
//! Observed-mode routes order under their own namespace (`@observed/<key>`),
//! so an unverified token never holds back a strict route's requests.
//! `idle()` is what shutdown waits for. Knows no HTTP.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::lock::state::Token;

#[derive(Default)]
pub(crate) struct Order {
    keys: Mutex<HashMap<String, Gate>>,
    /// Told when the last permit of all is dropped.
    emptied: Notify,
    /// Requests waiting for a lower token in flight on their key.
    waiting: AtomicUsize,
}

#[derive(Default)]
struct Gate {
    /// In-flight requests per token.
    inflight: BTreeMap<Token, usize>,
    changed: Arc<Notify>,
}

/// A request in flight; dropping it lets higher tokens go. It owns a handle
/// on the barrier, so it can outlive the request that took it (see
/// `Sidecar::handle`: an upstream that failed mid-exchange may still apply).
pub(crate) struct Permit {
    order: Arc<Order>,
    key: String,
    token: Token,
}

impl Order {
    /// Wait until no lower token is in flight for `key`, then register
    /// `token`. `Err(higher)` if a higher token is already in flight: this
    /// request is stale and must not be dispatched after it.
    pub(crate) async fn enter(self: &Arc<Self>, key: &str, token: Token) -> Result<Permit, Token> {
        loop {
            let notified = {
                let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
                let gate = keys.entry(key.to_string()).or_default();
                if let Some((&highest, _)) = gate.inflight.last_key_value() {
                    if highest > token {
                        return Err(highest);
                    }
                }
                if gate.inflight.range(..token).next().is_none() {
                    *gate.inflight.entry(token).or_default() += 1;
                    return Ok(Permit { order: self.clone(), key: key.to_string(), token });
                }
                let mut notified = Box::pin(gate.changed.clone().notified_owned());
                notified.as_mut().enable();
                notified
            };
            self.waiting.fetch_add(1, Ordering::Relaxed);
            let _waited = Waited(&self.waiting);
            notified.await;
        }
    }

    /// Requests waiting now for a lower token in flight on their key (an
    /// upstream slow to answer a key's writes shows here).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Keys with requests in flight.
    pub(crate) fn busy_keys(&self) -> usize {
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).len()
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
        let mut keys = self.order.keys.lock().unwrap_or_else(|p| p.into_inner());
        let Some(gate) = keys.get_mut(&self.key) else { return };
        if let Some(n) = gate.inflight.get_mut(&self.token) {
            *n -= 1;
            if *n == 0 {
                gate.inflight.remove(&self.token);
            }
        }
        gate.changed.notify_waiters();
        if gate.inflight.is_empty() {
            keys.remove(&self.key);
            if keys.is_empty() {
                self.order.emptied.notify_waiters();
            }
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
        let low = order.enter("k", 33).await.unwrap();
        let same = order.enter("k", 33).await.unwrap(); // same token: concurrent is fine
        let o = order.clone();
        let high = tokio::spawn(async move { o.enter("k", 34).await.map(|_| ()) });
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
        high.await.unwrap().unwrap();
        assert_eq!((order.busy_keys(), order.waiting()), (0, 0), "gates are removed when idle");
    }

    #[tokio::test]
    async fn a_lower_token_after_a_higher_one_is_refused() {
        let order = Arc::new(Order::default());
        let _high = order.enter("k", 34).await.unwrap();
        assert_eq!(order.enter("k", 33).await.err(), Some(34));
        assert!(order.enter("other", 1).await.is_ok(), "keys are independent");
    }

    #[tokio::test]
    async fn idle_waits_for_every_permit_of_every_key() {
        let order = Arc::new(Order::default());
        let (a, b) = (order.enter("a", 1).await.unwrap(), order.enter("b", 2).await.unwrap());
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
