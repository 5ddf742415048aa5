//! How recently the sidecar's cached knowledge was *proven* current, and
//! whether a `cached` route may still decide from it (`max_staleness`).
//! Pure: the caller passes every instant in; no clock, IO or config.
//!
//! The proof: the sidecar sends a probe (`GET /v1/revision`) at `sent`, on
//! its own monotonic clock. The leader answers with the revision `rev` it
//! had applied after a quorum confirmed its leadership, in a round that
//! began after the probe arrived; so every grant, release and expiry
//! acknowledged before `sent` is at or below `rev`. Once the watch stream has
//! delivered everything up to `rev`, the sidecar knows all of them: its
//! knowledge was current as of `sent` (not as of when the answer, or the
//! stream's line, arrived: that is later, and says nothing about what
//! happened meanwhile).
//!
//! What is *not* proof: a watch line or heartbeat by itself (the node
//! sending it may have lost its leader and still stream its old table), and
//! the time an answer was received.
//!
//! `behind`: a stream short of an answered probe's revision for
//! `4 × max_staleness` (at least 1 s) is reopened on the next endpoint.

use std::time::Duration;

use tokio::time::Instant;

/// Probes answered whose revision the stream has not delivered yet, at most.
/// Dropping the oldest only delays a proof (a later probe proves more).
const WAITING: usize = 16;

#[derive(Debug, Default)]
pub(crate) struct Freshness {
    /// The watch stream has delivered every event up to this revision.
    delivered: u64,
    /// Answered probes, `(sent, rev)`, waiting for the stream to reach `rev`.
    waiting: Vec<(Instant, u64)>,
    /// The latest `sent` of a probe whose `rev` the stream has reached.
    proven: Option<Instant>,
}

impl Freshness {
    /// The watch stream is complete up to `rev` (an event, a heartbeat, or a
    /// finished state dump at `rev`). Positions never go back.
    pub(crate) fn delivered(&mut self, rev: u64) {
        self.delivered = self.delivered.max(rev);
        self.settle();
    }

    /// A probe sent at `sent` was answered with revision `rev`.
    pub(crate) fn answered(&mut self, sent: Instant, rev: u64) {
        if self.waiting.len() == WAITING {
            self.waiting.remove(0);
        }
        self.waiting.push((sent, rev));
        self.settle();
    }

    fn settle(&mut self) {
        let delivered = self.delivered;
        let mut proven = self.proven;
        self.waiting.retain(|&(sent, rev)| {
            if rev <= delivered {
                proven = proven.max(Some(sent));
                return false;
            }
            true
        });
        self.proven = proven;
    }

    /// When the knowledge was last proven current (`None`: never).
    pub(crate) fn proven(&self) -> Option<Instant> {
        self.proven
    }

    /// The send time of the oldest answered probe whose revision the stream
    /// has not delivered yet.
    pub(crate) fn oldest_waiting(&self) -> Option<Instant> {
        self.waiting.iter().map(|&(sent, _)| sent).min()
    }

    /// The highest revision an answered probe waits for (0: none).
    pub(crate) fn awaited(&self) -> u64 {
        self.waiting.iter().map(|&(_, rev)| rev).max().unwrap_or(0)
    }
}

/// Whether what is known of one key may be trusted at `now`: the watch's
/// knowledge proven at `proven`, if the stream covers the key (`watched`),
/// or the latest read of the key, sent at `read_at`, within `max_staleness`.
/// A key the stream never told of (the sidecar may read it but not watch
/// it) is not covered by the probes' proof.
pub(crate) fn key_trusted(
    watched: bool,
    proven: Option<Instant>,
    read_at: Option<Instant>,
    now: Instant,
    max_staleness: Duration,
) -> bool {
    (watched && trusted(proven, now, max_staleness)) || trusted(read_at, now, max_staleness)
}

/// How long the stream may stay short of a probe's revision before it is
/// taken for stuck behind the leader (and reopened on another endpoint):
/// four times `max_staleness`, at least 1 s (a loaded node's normal lag is
/// not a reason to reconnect).
pub(crate) fn behind_patience(max_staleness: Duration) -> Duration {
    (max_staleness * 4).max(Duration::from_secs(1))
}

/// Whether a stream still short of a revision answered to a probe sent at
/// `oldest_waiting` is behind for good at `now`.
pub(crate) fn behind(oldest_waiting: Option<Instant>, now: Instant, patience: Duration) -> bool {
    oldest_waiting.is_some_and(|sent| now.saturating_duration_since(sent) >= patience)
}

/// Whether knowledge proven current at `proven` may still be trusted at
/// `now`: strictly before `proven + max_staleness`.
pub(crate) fn trusted(proven: Option<Instant>, now: Instant, max_staleness: Duration) -> bool {
    proven.and_then(|p| p.checked_add(max_staleness)).is_some_and(|deadline| now < deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_millis(300);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_is_trusted_before_the_first_proof() {
        let t0 = Instant::now();
        let mut f = Freshness::default();
        f.delivered(40);
        assert_eq!(f.proven(), None, "a stream alone proves nothing");
        assert!(!trusted(f.proven(), t0, MAX));
    }

    /// Proven as of when the probe was *sent*, once the stream reached its
    /// revision, however late that was.
    #[test]
    fn a_probe_proves_as_of_its_send_time_once_the_stream_caught_up() {
        let t0 = Instant::now();
        let mut f = Freshness::default();
        f.delivered(10);
        f.answered(t0, 12);
        assert_eq!(f.proven(), None, "the stream has not delivered 11 and 12 yet");
        f.delivered(11);
        assert_eq!(f.proven(), None);
        f.delivered(12);
        assert_eq!(f.proven(), Some(t0), "as of the send, not of the line's arrival");
        assert!(trusted(f.proven(), t0 + ms(299), MAX));
        assert!(!trusted(f.proven(), t0 + MAX, MAX), "the deadline itself is past");
    }

    /// A node cut from its leader keeps streaming heartbeats of its old
    /// revision: the stream never reaches the leader's, nothing is proven,
    /// and trust runs out `max_staleness` after the last proof.
    #[test]
    fn a_stream_stuck_behind_the_leader_proves_nothing() {
        let t0 = Instant::now();
        let mut f = Freshness::default();
        f.delivered(20);
        f.answered(t0, 20);
        assert_eq!(f.proven(), Some(t0), "nothing happened since: current");
        for i in 1..10 {
            f.delivered(20); // heartbeats of a lagging node
            f.answered(t0 + ms(100 * i), 21 + i);
        }
        assert_eq!(f.proven(), Some(t0));
        assert!(!trusted(f.proven(), t0 + MAX, MAX));
        f.delivered(25);
        assert_eq!(f.proven(), Some(t0 + ms(400)), "the latest probe whose revision was reached");
    }

    #[test]
    fn proofs_and_positions_never_go_back() {
        let t0 = Instant::now();
        let mut f = Freshness::default();
        f.answered(t0 + ms(200), 5);
        f.delivered(5);
        f.answered(t0, 1); // a late answer of an older probe
        assert_eq!(f.proven(), Some(t0 + ms(200)));
        f.delivered(3);
        assert_eq!(f.delivered, 5);
    }

    /// Only the last few answers wait; dropping the oldest delays a proof,
    /// never makes one up.
    #[test]
    fn waiting_answers_are_bounded() {
        let t0 = Instant::now();
        let mut f = Freshness::default();
        for i in 0..100 {
            f.answered(t0 + ms(i), 1000 + i);
        }
        assert_eq!(f.waiting.len(), WAITING);
        f.delivered(1000);
        assert_eq!(f.proven(), None, "that answer was dropped");
        f.delivered(1099);
        assert_eq!(f.proven(), Some(t0 + ms(99)));
    }

    /// A stream that does not reach a probe's revision within the patience
    /// is behind; one that reaches it is not.
    #[test]
    fn a_stream_short_of_a_probe_for_long_is_behind() {
        let t0 = Instant::now();
        let mut f = Freshness::default();
        let patience = behind_patience(MAX);
        assert_eq!(patience, ms(1200), "four times max_staleness");
        assert_eq!(behind_patience(ms(100)), Duration::from_secs(1), "at least 1 s");
        assert_eq!(behind_patience(Duration::from_secs(2)), Duration::from_secs(8));
        f.delivered(10);
        f.answered(t0, 12);
        f.answered(t0 + ms(300), 13);
        assert_eq!((f.oldest_waiting(), f.awaited()), (Some(t0), 13));
        assert!(!behind(f.oldest_waiting(), t0 + ms(999), patience));
        assert!(behind(f.oldest_waiting(), t0 + patience, patience));
        f.delivered(13);
        assert!(!behind(f.oldest_waiting(), t0 + ms(5000), patience), "caught up: nothing waits");
    }

    /// A key the stream never told of is trusted only until its read's
    /// send time plus `max_staleness`, however fresh the proof.
    #[test]
    fn an_unwatched_key_is_trusted_only_as_long_as_its_read() {
        let t0 = Instant::now();
        let fresh = Some(t0 + ms(1000));
        assert!(key_trusted(true, fresh, None, t0 + ms(1100), MAX));
        assert!(!key_trusted(false, fresh, None, t0 + ms(1100), MAX), "no read: nothing vouches");
        assert!(key_trusted(false, fresh, Some(t0 + ms(900)), t0 + ms(1100), MAX));
        assert!(!key_trusted(false, fresh, Some(t0 + ms(800)), t0 + ms(1100), MAX), "the read is too old");
        assert!(key_trusted(true, None, Some(t0 + ms(900)), t0 + ms(1100), MAX), "a recent read vouches too");
    }

    #[test]
    fn an_overflowing_deadline_is_not_trusted() {
        let t0 = Instant::now();
        assert!(!trusted(Some(t0), t0, Duration::MAX));
    }
}
