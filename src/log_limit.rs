//! Repeated log lines, summarised: the first occurrence is logged at once,
//! then at most one line per interval, saying how many were left out
//! ("… 37 more in the last 10s"). A condition that repeats every 200 ms (a
//! lock service down, a peer not started yet) then costs one line per
//! interval instead of filling the log.
//!
//! The decision is a pure function of the instants it is given
//! ([`Window::hit`]); each caller owns its window (behind its own lock if
//! shared) and passes the real clock in.
//!
//! Used where a failure repeats by the hundred: the sidecar's watch
//! reconnects, a node's RPCs to a peer that is down (`raft::network`).

use std::fmt;
use std::time::{Duration, Instant};

/// The interval used by the call sites: one line per 10 s per condition.
pub(crate) const EVERY: Duration = Duration::from_secs(10);

/// One repeated condition's window, without a clock.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    interval: Duration,
    /// When the last line was logged; `None` before the first, or after a reset.
    logged_at: Option<Instant>,
    /// Occurrences left out since that line.
    left_out: u64,
}

impl Window {
    pub(crate) fn new(interval: Duration) -> Self {
        Self { interval, logged_at: None, left_out: 0 }
    }

    /// One occurrence at `now`: `Some(summary)` if it is to be logged (the
    /// summary says how many were left out since the last line), `None` if
    /// it is left out.
    pub(crate) fn hit(&mut self, now: Instant) -> Option<LeftOut> {
        match self.logged_at {
            Some(at) if now.saturating_duration_since(at) < self.interval => {
                self.left_out += 1;
                None
            }
            _ => {
                let summary = LeftOut { count: self.left_out, interval: self.interval };
                self.logged_at = Some(now);
                self.left_out = 0;
                Some(summary)
            }
        }
    }

    /// The condition cleared: its next occurrence is logged at once. Returns
    /// how many were left out since the last line (for a closing line).
    pub(crate) fn reset(&mut self) -> LeftOut {
        let summary = LeftOut { count: self.left_out, interval: self.interval };
        *self = Self::new(self.interval);
        summary
    }
}

/// How many occurrences a logged line stands for besides itself. Displays
/// as `` (none) or ` (… 37 more in the last 10s)`, to append to the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeftOut {
    pub count: u64,
    interval: Duration,
}

impl fmt::Display for LeftOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.count {
            0 => Ok(()),
            n => write!(f, " (… {n} more in the last {})", humantime::format_duration(self.interval)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_is_logged_then_one_per_interval_with_the_count_left_out() {
        let t0 = Instant::now();
        let mut w = Window::new(ms(10_000));
        let first = w.hit(t0).expect("the first occurrence is logged at once");
        assert_eq!(first.count, 0);
        assert_eq!(first.to_string(), "");
        // Every 200 ms for the rest of the interval: 49 left out.
        for i in 1..50 {
            assert_eq!(w.hit(t0 + ms(200 * i)), None, "occurrence {i}");
        }
        let next = w.hit(t0 + ms(10_000)).expect("one line per interval");
        assert_eq!(next.count, 49);
        assert_eq!(next.to_string(), " (… 49 more in the last 10s)");
        // The window restarts at the line just logged.
        assert_eq!(w.hit(t0 + ms(19_999)), None);
        assert_eq!(w.hit(t0 + ms(20_000)).map(|l| l.count), Some(1));
    }

    #[test]
    fn a_reset_logs_the_next_occurrence_at_once_and_reports_what_was_left_out() {
        let t0 = Instant::now();
        let mut w = Window::new(ms(10_000));
        w.hit(t0).unwrap();
        assert_eq!(w.hit(t0 + ms(100)), None);
        assert_eq!(w.hit(t0 + ms(200)), None);
        assert_eq!(w.reset().count, 2);
        assert_eq!(w.hit(t0 + ms(300)).map(|l| l.count), Some(0), "logged at once after the reset");
    }

    #[test]
    fn an_instant_before_the_last_line_is_within_the_window() {
        // Instants from several threads may arrive out of order.
        let t0 = Instant::now() + ms(1000);
        let mut w = Window::new(ms(10_000));
        w.hit(t0).unwrap();
        assert_eq!(w.hit(t0 - ms(500)), None);
    }
}
