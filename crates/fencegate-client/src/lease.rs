//! A held lease: background keepalives and a conservative local view of
//! whether it is still valid (L4).
//!
//! The lease is valid until `t_sent + ttl*(1-drift) - margin`, where `t_sent`
//! is this process's monotonic time when it *sent* the latest request the
//! leader acknowledged. The leader measures from when it *received* that
//! request (later), so as long as clock rates differ by less than `drift`, the
//! client always gives up before the service can expire the lease.
//!
//! For an acquire, `t_sent` is the *first* attempt's send time (a retry may
//! be answered with an earlier attempt's grant); when a long wait leaves
//! less than half the TTL, the client anchors afresh with an immediate
//! keepalive before handing the lease out. Loss is final: an
//! acknowledgement that arrives after the deadline passed does not revive
//! the lease.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::client::{Client, ClientError};
use crate::wire::Token;

/// Why a lease stopped being valid, as [`Lease::lost`] reports it. In every
/// case: stop using the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// The service answered a keepalive with `lease_not_found`: the lease
    /// expired or was released there. Another holder may already have the key.
    NotFound,
    /// The local validity deadline (L4) passed without an acknowledged
    /// keepalive, e.g. the lock service is unreachable or this process was
    /// paused. The service may still hold the lease, but can no longer be
    /// counted on to.
    Expired,
    /// This process gave it back with [`Lease::release`].
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::NotFound => "the lock service no longer has the lease",
            LostReason::Expired => "no keepalive was acknowledged in time",
            LostReason::Released => "released",
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Validity {
    until: Instant,
    lost: Option<LostReason>,
}

struct Shared {
    client: Client,
    /// An etcd lease (`Client::acquire_etcd`), kept alive and revoked
    /// through etcd's gateway rather than fencegate's API.
    etcd: bool,
    lease_id: String,
    ttl: Duration,
    validity: watch::Sender<Validity>,
    /// Set once `acquire` has returned the lease: from then on loss is final.
    handed_out: AtomicBool,
}

impl Shared {
    fn deadline(&self, sent: Instant) -> Instant {
        let o = self.client.options();
        (sent + self.ttl.mul_f64(1.0 - o.drift)).checked_sub(o.margin).unwrap_or(sent)
    }

    /// Record an acknowledgement of a request sent at `sent`.
    fn acknowledged(&self, sent: Instant) {
        let until = self.deadline(sent);
        let now = Instant::now();
        let handed_out = self.handed_out.load(Ordering::Acquire);
        self.validity.send_if_modified(|v| {
            if handed_out && v.lost.is_none() && now >= v.until {
                // The deadline passed before this answer came back: the lease
                // already counted as lost (`lost()` may have fired), and loss
                // is final, so a late acknowledgement does not revive it.
                // Before the lease is handed out (`acquire` anchoring it),
                // nobody can have seen it lost.
                v.lost = Some(LostReason::Expired);
                return true;
            }
            let extend = v.lost.is_none() && until > v.until;
            if extend {
                v.until = until;
            }
            extend
        });
    }

    fn lose(&self, reason: LostReason) {
        self.validity.send_if_modified(|v| {
            let first = v.lost.is_none();
            if first {
                v.lost = Some(reason);
            }
            first
        });
    }

    fn validity(&self) -> Validity {
        let v = *self.validity.borrow();
        match v.lost {
            None if Instant::now() >= v.until => Validity { lost: Some(LostReason::Expired), ..v },
            _ => v,
        }
    }

    async fn keepalive_now(&self) -> Result<(), ClientError> {
        let sent = Instant::now();
        let left = self.validity().until.saturating_duration_since(sent).max(self.client.options().request_timeout);
        let answer = match self.etcd {
            true => self.client.etcd_keepalive(&self.lease_id).await,
            false => self.client.keepalive(&self.lease_id, left).await.map(drop),
        };
        match answer {
            Ok(()) => {
                self.acknowledged(sent);
                Ok(())
            }
            Err(ClientError::LeaseNotFound) => {
                self.lose(LostReason::NotFound);
                Err(ClientError::LeaseNotFound)
            }
            Err(e) => Err(e),
        }
    }
}

/// A granted lease, from [`Client::acquire`]. Keepalives run in the background
/// every `ttl/3` (retried soon after a failure) until the lease is released,
/// dropped or lost.
///
/// Use the lease only while [`Lease::is_valid`] is true, and stop as soon as
/// [`Lease::lost`] resolves. Dropping it without [`Lease::release`] stops the
/// keepalives only: the service expires the lease after its TTL, and the
/// key's lock-delay then applies.
pub struct Lease {
    key: String,
    token: Token,
    shared: Arc<Shared>,
    /// The background keepalive, started when the lease is handed out.
    keeper: Option<JoinHandle<()>>,
}

impl Lease {
    pub(crate) fn start(
        client: Client,
        key: String,
        token: Token,
        lease_id: String,
        ttl: Duration,
        sent: Instant,
    ) -> Self {
        Self::start_on(client, false, key, token, lease_id, ttl, sent)
    }

    /// [`Lease::start`] of a fencegate lease, or (`etcd`) of an etcd one.
    pub(crate) fn start_on(
        client: Client,
        etcd: bool,
        key: String,
        token: Token,
        lease_id: String,
        ttl: Duration,
        sent: Instant,
    ) -> Self {
        let (validity, _) = watch::channel(Validity { until: sent, lost: None });
        let shared = Arc::new(Shared { client, etcd, lease_id, ttl, validity, handed_out: AtomicBool::new(false) });
        shared.acknowledged(sent);
        Lease { key, token, shared, keeper: None }
    }

    /// The token, once an etcd lock is held (its key's create revision).
    pub(crate) fn set_token(&mut self, token: Token) {
        self.token = token;
    }

    /// The lease is the caller's from now on: keepalives start in the
    /// background, and a loss is final.
    pub(crate) fn hand_out(mut self) -> Self {
        self.shared.handed_out.store(true, Ordering::Release);
        self.keeper = Some(tokio::spawn(keep_alive(self.shared.clone())));
        self
    }

    /// The key this lease holds.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: send it with every write to the protected resource
    /// (in the [`TOKEN_HEADER`](crate::TOKEN_HEADER) header, for the sidecar).
    pub fn token(&self) -> Token {
        self.token
    }

    /// Secret; proves ownership to the lock service. Never send it to resources.
    pub fn lease_id(&self) -> &str {
        &self.shared.lease_id
    }

    /// The TTL the service granted; each acknowledged keepalive renews it.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// True while the lease is guaranteed to be held (L4): before
    /// `t_sent + ttl × (1 − drift) − margin` for the latest acknowledged
    /// request, and not lost. Check it before each write.
    pub fn is_valid(&self) -> bool {
        self.shared.validity().lost.is_none()
    }

    /// How long the lease is guaranteed for, from now; zero once lost.
    pub fn remaining(&self) -> Duration {
        let v = self.shared.validity();
        if v.lost.is_some() {
            return Duration::ZERO;
        }
        v.until.saturating_duration_since(Instant::now())
    }

    pub(crate) async fn keepalive_now(&self) -> Result<(), ClientError> {
        self.shared.keepalive_now().await
    }

    /// Resolves as soon as the lease may be lost: the service said so, or the
    /// local validity deadline passed without an acknowledged keepalive.
    /// Race it against the work with `tokio::select!`; it may be called (and
    /// dropped) any number of times.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.shared.validity.subscribe();
        loop {
            let v = self.shared.validity();
            if let Some(reason) = v.lost {
                return reason;
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(v.until) => {}
            }
        }
    }

    /// Give the lease back. The key is free for the next holder at once, with
    /// no lock-delay. The keepalives stop first, so the lease counts as lost
    /// whatever the answer.
    ///
    /// [`ClientError::LeaseNotFound`] means it had already ended;
    /// [`ClientError::Unavailable`] means the outcome is unknown; if the
    /// service still has the lease, it expires it after its TTL.
    pub async fn release(mut self) -> Result<(), ClientError> {
        self.stop_keeping();
        self.shared.lose(LostReason::Released);
        match self.shared.etcd {
            true => self.shared.client.etcd_revoke(&self.shared.lease_id).await,
            false => self.shared.client.release(&self.shared.lease_id).await,
        }
    }
}

impl Lease {
    fn stop_keeping(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop_keeping();
    }
}

async fn keep_alive(shared: Arc<Shared>) {
    let interval = shared.ttl / 3;
    // Retries come soon (the validity is running out), jittered so that the
    // holders of one failed leader do not all retry in the same instant.
    let mut retry = Backoff::new(Duration::from_millis(50), (interval / 4).min(Duration::from_millis(250)))
        .with_floor(Duration::from_millis(10));
    let mut next = Instant::now() + interval;
    loop {
        tokio::time::sleep_until(next).await;
        if let Some(reason) = shared.validity().lost {
            shared.lose(reason);
            return;
        }
        match shared.keepalive_now().await {
            Ok(()) => {
                retry.reset();
                next = Instant::now() + interval;
            }
            Err(ClientError::LeaseNotFound) => return,
            Err(e) => {
                tracing::warn!(lease = %shared.lease_id, "keepalive failed: {e}");
                // Retry soon; `lost()` fires on its own when validity runs out.
                next = Instant::now() + retry.next_delay();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// L4 with the defaults: valid until t_sent + 10 s × 0.99 − 100 ms = 9.8 s,
    /// when no keepalive gets through (nothing listens on the endpoint).
    #[tokio::test(start_paused = true)]
    async fn validity_runs_from_the_send_time_minus_drift_and_margin() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let client = Client::new(vec![format!("http://127.0.0.1:{port}")]).unwrap();
        let sent = Instant::now();
        let lease = Lease::start(client, "k".into(), 7, "id".into(), Duration::from_secs(10), sent).hand_out();
        tokio::time::sleep_until(sent + Duration::from_millis(9_799)).await;
        assert!(lease.is_valid());
        let reason = lease.lost().await;
        assert_eq!(reason, LostReason::Expired);
        assert_eq!(Instant::now(), sent + Duration::from_millis(9_800), "lost() fires exactly at the bound");
        assert!(!lease.is_valid());
        assert_eq!(lease.remaining(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_acknowledgement_extends_from_its_own_send_time_and_loss_is_final() {
        let client = Client::new(vec!["http://127.0.0.1:1".into()]).unwrap();
        let t0 = Instant::now();
        let lease = Lease::start(client, "k".into(), 7, "id".into(), Duration::from_secs(10), t0).hand_out();
        lease.shared.acknowledged(t0 + Duration::from_secs(5));
        assert_eq!(lease.shared.validity().until, t0 + Duration::from_millis(14_800));
        // An older acknowledgement never shortens it.
        lease.shared.acknowledged(t0 + Duration::from_secs(1));
        assert_eq!(lease.shared.validity().until, t0 + Duration::from_millis(14_800));
        lease.shared.lose(LostReason::NotFound);
        lease.shared.acknowledged(t0 + Duration::from_secs(6));
        assert_eq!(lease.lost().await, LostReason::NotFound, "a lost lease stays lost");
    }

    /// A keepalive answered after the local deadline passed does not make a
    /// lease that already counted as lost valid again.
    #[tokio::test(start_paused = true)]
    async fn an_acknowledgement_after_the_deadline_does_not_revive_the_lease() {
        let client = Client::new(vec!["http://127.0.0.1:1".into()]).unwrap();
        let t0 = Instant::now();
        let lease = Lease::start(client, "k".into(), 7, "id".into(), Duration::from_secs(10), t0).hand_out();
        let sent = t0 + Duration::from_secs(9);
        tokio::time::sleep_until(t0 + Duration::from_secs(11)).await;
        assert!(!lease.is_valid());
        lease.shared.acknowledged(sent);
        assert!(!lease.is_valid(), "loss is final");
        assert_eq!(lease.lost().await, LostReason::Expired);
    }

    /// Before `acquire` hands the lease out it re-anchors a grant whose
    /// validity ran low; that answer may come back after the first deadline
    /// and must anchor the lease, not lose it.
    #[tokio::test(start_paused = true)]
    async fn a_late_anchor_before_the_lease_is_handed_out_extends_it() {
        let client = Client::new(vec!["http://127.0.0.1:1".into()]).unwrap();
        let t0 = Instant::now();
        let lease = Lease::start(client, "k".into(), 7, "id".into(), Duration::from_secs(10), t0);
        tokio::time::sleep_until(t0 + Duration::from_millis(9_900)).await;
        lease.shared.acknowledged(t0 + Duration::from_millis(9_500));
        let lease = lease.hand_out();
        assert!(lease.is_valid());
        assert_eq!(lease.shared.validity().until, t0 + Duration::from_millis(9_500 + 9_800));
    }
}
