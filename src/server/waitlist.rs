//! FIFO fairness for waiting acquires, kept on the leader only.
//!
//! Waiting is not replicated: a waiter is an HTTP request parked on the
//! leader. If the leader changes, parked requests get 503 and their clients
//! retry on the new leader (with the same request id, so nothing is granted
//! twice); fairness holds within one leader's term.
//!
//! The waiters are counted in `fencegate_lock_waiters`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use prometheus::IntGauge;
use tokio::sync::Notify;

pub(super) struct WaitList {
    queues: Mutex<HashMap<String, VecDeque<u64>>>,
    next: AtomicU64,
    /// Signalled whenever a ticket leaves a queue, so the next one can go.
    pub changed: Notify,
    /// `fencegate_lock_waiters`: tickets held on this node.
    waiters: IntGauge,
}

/// A place in a key's queue; leaving (drop) lets the next waiter go.
pub(super) struct Ticket<'a> {
    list: &'a WaitList,
    key: String,
    id: u64,
}

impl WaitList {
    pub(super) fn new(waiters: IntGauge) -> Self {
        Self { queues: Mutex::default(), next: AtomicU64::new(0), changed: Notify::new(), waiters }
    }

    pub(super) fn join(&self, key: &str) -> Ticket<'_> {
        self.waiters.inc();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_string()).or_default().push_back(id);
        Ticket { list: self, key: key.to_string(), id }
    }

    /// How many wait on `key`.
    pub(super) fn waiting(&self, key: &str) -> u64 {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.get(key).map_or(0, |q| q.len() as u64)
    }

    pub(super) fn is_head(&self, t: &Ticket<'_>) -> bool {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.get(&t.key).and_then(|q| q.front()) == Some(&t.id)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut queues = self.list.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(q) = queues.get_mut(&self.key) {
            q.retain(|id| *id != self.id);
            if q.is_empty() {
                queues.remove(&self.key);
            }
        }
        drop(queues);
        self.list.waiters.dec();
        self.list.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_come_first_served_per_key() {
        let gauge = IntGauge::new("w", "w").unwrap();
        let w = WaitList::new(gauge.clone());
        let a = w.join("k");
        let b = w.join("k");
        let c = w.join("k");
        let other = w.join("other");
        assert!(w.is_head(&a) && !w.is_head(&b) && !w.is_head(&c));
        assert!(w.is_head(&other), "queues are per key");
        assert_eq!((w.waiting("k"), w.waiting("other"), w.waiting("none")), (3, 1, 0));
        drop(b); // a waiter that gave up leaves without disturbing the order
        assert!(w.is_head(&a) && !w.is_head(&c));
        drop(a);
        assert!(w.is_head(&c));
        assert_eq!(gauge.get(), 2, "the gauge counts the tickets held");
        drop(c);
        assert!(w.queues.lock().unwrap().get("k").is_none(), "empty queues are removed");
    }
}
