//! The leader's lease clock: when each lease and each lock-delay is due.
//!
//! Pure bookkeeping over a monotonic `now` passed in by the caller. Deadlines
//! are local to the node and never replicated: a node that becomes leader calls
//! [`LeaseClock::reset`], which gives every live lease a full TTL from that
//! moment (L3: expiry may be late, never early). Expiry itself is a replicated
//! `Expire` command that the leader proposes for whatever [`LeaseClock::due`]
//! returns.
//!
//! Why `expiring`: once a lease is handed to `due`, an `Expire` is on its way
//! to the log. A keepalive acknowledged after that point would promise the
//! holder a TTL the service is about to break, so [`LeaseClock::keepalive`]
//! refuses leases in that state.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::state::{Command, Event, EventKind, LockState, Token};

/// How long to wait before proposing an `Expire`/`EndDelay` again when the
/// first proposal did not make it into the log (no quorum, leader change).
pub(crate) const RETRY: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Lease(String),
    Delay(String, Token),
}

#[derive(Debug, Default)]
pub(crate) struct LeaseClock {
    /// lease id -> (deadline, expiring)
    leases: HashMap<String, LeaseDeadline>,
    /// key -> (deadline, token of the expired lease)
    delays: HashMap<String, (Instant, Token)>,
    /// Every pending deadline in time order.
    queue: BTreeSet<(Instant, Due)>,
}

#[derive(Debug, Clone, Copy)]
struct LeaseDeadline {
    at: Instant,
    expiring: bool,
}

impl LeaseClock {
    /// Forget everything and give every live lease and every lock-delay its
    /// full duration from `now`. Called when this node becomes leader.
    pub(crate) fn reset(&mut self, state: &LockState, now: Instant) {
        *self = Self::default();
        for (id, lease) in state.leases() {
            self.arm_lease(id, now + Duration::from_millis(lease.ttl_ms));
        }
        for (key, delay) in state.delays() {
            self.arm_delay(key, delay.token, now + Duration::from_millis(delay.ms));
        }
    }

    /// Track an event just applied at local time `now`.
    pub(crate) fn observe(&mut self, event: &Event, now: Instant) {
        match &event.kind {
            EventKind::Granted { ttl_ms, .. } => {
                self.arm_lease(&event.lease_id, now + Duration::from_millis(*ttl_ms));
            }
            EventKind::Released => self.forget_lease(&event.lease_id),
            EventKind::Expired { lock_delay_ms } => {
                self.forget_lease(&event.lease_id);
                if *lock_delay_ms > 0 {
                    self.arm_delay(&event.key, event.token, now + Duration::from_millis(*lock_delay_ms));
                }
            }
        }
    }

    /// A lock-delay ended in the log: stop tracking it.
    pub(crate) fn delay_ended(&mut self, key: &str, token: Token) {
        if let Some((at, t)) = self.delays.get(key).copied() {
            if t == token {
                self.delays.remove(key);
                self.queue.remove(&(at, Due::Delay(key.to_string(), t)));
            }
        }
    }

    /// Extend `lease_id` to at least `received + ttl`, where `received` is when
    /// the keepalive reached this node. Returns false when the lease is not
    /// live in `state` or an expiry for it is already on its way.
    pub(crate) fn keepalive(&mut self, state: &LockState, lease_id: &str, received: Instant) -> bool {
        let Some(lease) = state.lease(lease_id) else { return false };
        let ttl = Duration::from_millis(lease.ttl_ms);
        let at = match self.leases.get(lease_id) {
            Some(d) if d.expiring => return false,
            Some(d) => d.at.max(received + ttl),
            None => received + ttl,
        };
        self.arm_lease(lease_id, at);
        true
    }

    /// Time left on a lease by this node's clock (meaningful on the leader).
    pub(crate) fn remaining(&self, lease_id: &str, now: Instant) -> Option<Duration> {
        self.leases.get(lease_id).map(|d| d.at.saturating_duration_since(now))
    }

    /// Time left on `key`'s lock-delay by this node's clock (meaningful on
    /// the leader).
    pub(crate) fn delay_remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        self.delays.get(key).map(|(at, _)| at.saturating_duration_since(now))
    }

    /// Commands whose time has come. Each returned lease is marked expiring and
    /// re-armed at `now + RETRY`, in case the proposal is lost.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Command> {
        let mut out = Vec::new();
        while let Some((at, due)) = self.queue.first().cloned() {
            if at > now {
                break;
            }
            self.queue.pop_first();
            match due {
                Due::Lease(id) => {
                    if let Some(d) = self.leases.get_mut(&id) {
                        d.expiring = true;
                        d.at = now + RETRY;
                        self.queue.insert((d.at, Due::Lease(id.clone())));
                    }
                    out.push(Command::Expire { lease_id: id });
                }
                Due::Delay(key, token) => {
                    let retry = now + RETRY;
                    self.delays.insert(key.clone(), (retry, token));
                    self.queue.insert((retry, Due::Delay(key.clone(), token)));
                    out.push(Command::EndDelay { key, token });
                }
            }
        }
        out
    }

    /// The earliest pending deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.queue.first().map(|(at, _)| *at)
    }

    fn arm_lease(&mut self, id: &str, at: Instant) {
        if let Some(old) = self.leases.insert(id.to_string(), LeaseDeadline { at, expiring: false }) {
            self.queue.remove(&(old.at, Due::Lease(id.to_string())));
        }
        self.queue.insert((at, Due::Lease(id.to_string())));
    }

    fn arm_delay(&mut self, key: &str, token: Token, at: Instant) {
        if let Some((old, t)) = self.delays.insert(key.to_string(), (at, token)) {
            self.queue.remove(&(old, Due::Delay(key.to_string(), t)));
        }
        self.queue.insert((at, Due::Delay(key.to_string(), token)));
    }

    fn forget_lease(&mut self, id: &str) {
        if let Some(old) = self.leases.remove(id) {
            self.queue.remove(&(old.at, Due::Lease(id.to_string())));
        }
    }
}
