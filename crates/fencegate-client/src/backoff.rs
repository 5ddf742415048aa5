//! The one retry policy: exponential backoff with full jitter.
//!
//! Used wherever fencegate retries over the network (the client's failover,
//! a lease's keepalive, the sidecar's watch stream). Jitter matters: with a
//! fixed sleep, every sidecar and client that lost the same leader would come
//! back in the same instant, and keep doing so.

use std::time::Duration;

/// Delays for successive attempts: attempt `n` waits a uniformly random time
/// in `[0, min(max, base·2^n)]`, never less than `floor`.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    floor: Duration,
    attempt: u32,
}

impl Backoff {
    /// Grows from `base` up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self { base, max: max.max(base), floor: Duration::ZERO, attempt: 0 }
    }

    /// Never wait less than `floor` (a lower bound inside the jitter).
    pub fn with_floor(mut self, floor: Duration) -> Self {
        self.floor = floor.min(self.max);
        self
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.base.saturating_mul(1 << self.attempt.min(20)).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let jittered = ceiling.mul_f64(rand::random::<f64>());
        jittered.max(self.floor)
    }

    /// Start again from `base` (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_and_resets() {
        let mut b =
            Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).with_floor(Duration::from_millis(10));
        let ceilings = [100, 200, 400, 800, 1600, 2000, 2000];
        for ceiling in ceilings {
            let d = b.next_delay();
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(ceiling), "{d:?} > {ceiling}ms");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_spreads_the_delays() {
        let delays: std::collections::HashSet<Duration> =
            (0..50).map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay()).collect();
        assert!(delays.len() > 40, "50 fresh policies must not wait the same time: {}", delays.len());
    }
}
