//! [`Client`]: talks to any node of a cluster, finds the leader, fails over,
//! acquires leases and keeps them alive.
//!
//! Leaders are found through `GET /v1/cluster`; an acquire keeps one request
//! id across its retries, so a retry is answered with the grant an earlier
//! attempt got instead of a second one. Knows the API's paths, not the
//! server.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::http::{HttpClient, Reply};
use crate::lease::Lease;
use crate::wire::{self, AcquireRequest, ClusterInfo, ErrorCode, Granted, KeepaliveAck, LockInfo, Released, Token};

/// The endpoints `fencegate`'s commands use when neither `--endpoints` nor
/// `$FENCEGATE_ENDPOINTS` is set: the three local nodes of `fencegate dev`
/// (and of `config/node{1,2,3}.yaml`), so that one of them being down
/// changes nothing.
pub const DEFAULT_ENDPOINTS: [&str; 3] = ["http://127.0.0.1:7401", "http://127.0.0.1:7402", "http://127.0.0.1:7403"];

/// Why a [`Client`] or [`Lease`] call failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// [`Client::new`] got an empty list of endpoints.
    #[error("no endpoints given")]
    NoEndpoints,
    /// An endpoint is not `http://host:port` (`https://` with
    /// [`ClientOptions::tls`]): the endpoint as given, and why.
    #[error("invalid endpoint `{0}`: {1}")]
    BadEndpoint(String, String),
    /// [`ClientOptions::token`] is not a usable bearer token.
    #[error("{0}")]
    BadToken(#[from] crate::http::BadToken),
    /// The key was not granted within the acquire's
    /// [`wait`](field@AcquireOptions::wait): someone else holds it, or it is
    /// in lock-delay (L6). Retry later, or wait longer.
    #[error("{}", held_message(key, holder.as_deref(), *token, *lock_delay))]
    Held {
        /// The key asked for.
        key: String,
        /// The current holder's name; `None` while the key is in lock-delay
        /// and nobody holds it.
        holder: Option<String>,
        /// The key's latest grant: the current holder's token, or in
        /// lock-delay the token of the lease that expired.
        token: Token,
        /// `true` if the key is free but in lock-delay after an expiry (L6).
        lock_delay: bool,
    },
    /// The service does not have the lease (any more): it was released, it
    /// expired, or it was never granted. Someone else may hold the key now;
    /// stop using the token.
    #[error("lease not found (released, expired or never granted)")]
    LeaseNotFound,
    /// The service answered with an error other than the above (an invalid
    /// key, a TTL outside the service's range, a bug). Retrying the same
    /// request will usually fail the same way.
    #[error("the lock service refused the request ({status}): {}: {message}", error.as_str())]
    Refused {
        /// The HTTP status of the answer (never 503: those are retried).
        status: StatusCode,
        /// The Lock API error code; [`ErrorCode::Unknown`] if the body was not
        /// a Lock API error (for example, not a fencegate node).
        error: ErrorCode,
        /// The service's explanation, or the start of a body that was not a
        /// Lock API error.
        message: String,
    },
    /// No node answered in time: every attempt timed out, failed to connect
    /// or got 503 until the failover budget (about 5 s, plus an acquire's
    /// wait) ran out. For a write (acquire, keepalive, release) the outcome
    /// is unknown: it may have taken effect. The string is the last failure.
    #[error("lock service unavailable: {0}")]
    Unavailable(String),
    /// A success answer whose body could not be decoded (a different protocol
    /// version, or not a fencegate node). The string is the decoding error.
    #[error("unexpected answer from the lock service: {0}")]
    Protocol(String),
    /// An endpoint answered an error, but not as a lock node does: no
    /// [`wire::CLUSTER_HEADER`] and no Lock API error in the body. The wrong
    /// address or port (another service), or something in between.
    #[error(
        "{url} answered {status} but is not a fencegate lock node (no {} header, no Lock API error): \
         is the endpoint a node's `listen` address?",
        wire::CLUSTER_HEADER
    )]
    NotALockNode {
        /// The URL asked.
        url: String,
        /// The status it answered with.
        status: StatusCode,
    },
}

/// How an [`ClientError::Unavailable`] begins when no endpoint answered at
/// all (every attempt failed to connect or timed out), as opposed to nodes
/// that answered without a quorum.
const NO_NODE_ANSWERED: &str = "no node answered";

impl ClientError {
    /// Unavailable because no endpoint answered at all: nothing listening
    /// there, or nothing reachable; not a cluster without a quorum.
    pub fn no_node_answered(&self) -> bool {
        matches!(self, ClientError::Unavailable(m) if m.starts_with(NO_NODE_ANSWERED))
    }
}

/// [`ClientError::Held`] for a person: who holds the key, or why nobody can have it yet.
fn held_message(key: &str, holder: Option<&str>, token: Token, lock_delay: bool) -> String {
    match (holder, lock_delay) {
        (Some(h), false) => format!("{key} is held by {h} (token {token})"),
        (Some(h), true) => format!("{key} is held by {h} (token {token}), in lock-delay"),
        (None, true) => format!("{key} is in lock-delay after lease {token} expired"),
        (None, false) => format!("{key} is held (token {token})"),
    }
}

/// Tunables for L4 (client conservatism) and request timing.
///
/// A lease counts as lost at `t_sent + ttl × (1 − drift) − margin`.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Upper bound on the rate difference between this host's clock and the
    /// leader's, as a fraction in `[0, 1)` (default `0.01`, i.e. 1 %).
    pub drift: f64,
    /// Safety margin subtracted from every validity deadline (default 100 ms).
    pub margin: Duration,
    /// Deadline for one request to one node (default 3 s); an acquire's wait
    /// is added to it.
    pub request_timeout: Duration,
    /// Speak HTTPS with this config (endpoints must then be `https://`);
    /// see [`crate::tls::TlsFiles`]. `None`: plain HTTP.
    pub tls: Option<rustls::ClientConfig>,
    /// Bearer token sent with every request (`Authorization: Bearer`), for a
    /// lock service that authenticates clients by token.
    pub token: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            drift: 0.01,
            margin: Duration::from_millis(100),
            request_timeout: Duration::from_secs(3),
            tls: None,
            token: None,
        }
    }
}

impl ClientOptions {
    /// The HTTP client these options describe (TLS, token), refusing bodies
    /// above `max_body`. The sidecar's watch stream uses one of its own.
    pub fn http_client(&self, max_body: usize) -> Result<HttpClient, ClientError> {
        let http = match &self.tls {
            Some(tls) => HttpClient::https(max_body, tls.clone(), None),
            None => HttpClient::new(max_body),
        };
        match &self.token {
            Some(t) => Ok(http.with_bearer(t)?),
            None => Ok(http),
        }
    }
}

/// What to ask for when acquiring (see [`Client::acquire`]).
///
/// Durations are sent in whole milliseconds.
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    /// The lease's time to live, renewed by every acknowledged keepalive. The
    /// service refuses values outside its `[min_ttl, max_ttl]` (by default
    /// 500 ms to 1 h) with [`ClientError::Refused`].
    pub ttl: Duration,
    /// How long the service may queue the request (FIFO per key) while the
    /// key is held or in lock-delay. Zero (the default) fails at once with
    /// [`ClientError::Held`]. At most the service's `lease.max_wait`.
    pub wait: Duration,
    /// The name shown as the key's holder (`fencegate status KEY`, watch
    /// lines, [`ClientError::Held`]): 1–128 printable ASCII characters. The
    /// service uses `anonymous` when `None`.
    pub holder: Option<String>,
    /// Per-request lock-delay (L6): how long the key stays ungranted after
    /// this lease *expires* (not after a release). The server's
    /// `lease.lock_delay` applies when `None`.
    pub lock_delay: Option<Duration>,
}

impl AcquireOptions {
    /// A lease of `ttl`, no waiting, no holder name, the server's lock-delay.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, wait: Duration::ZERO, holder: None, lock_delay: None }
    }
    /// Wait up to `wait` for the key if it is taken.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
    /// Name the holder (see the [`holder`](field@AcquireOptions::holder) field).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }
    /// Set this lease's lock-delay (see the
    /// [`lock_delay`](field@AcquireOptions::lock_delay) field).
    pub fn lock_delay(mut self, d: Duration) -> Self {
        self.lock_delay = Some(d);
        self
    }
}

/// A handle on a cluster. Cheap to clone; clones share the connection pool
/// and the knowledge of which node leads.
///
/// Leader calls go to the known leader first and fail over to the other
/// endpoints through elections. Its calls must run inside a Tokio runtime
/// with timers enabled.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    /// Index of the endpoint to try first: the known leader, else the last
    /// one that answered.
    preferred: AtomicUsize,
    /// Whether a leader lookup is due (at first use and after failures).
    rediscover: AtomicBool,
    http: HttpClient,
    options: ClientOptions,
}

/// How long to keep retrying a call that found no leader, beyond its own
/// wait: a call nobody answers gives up after this.
pub const FAILOVER_BUDGET: Duration = Duration::from_secs(5);

/// The time a call may take beyond [`ClientOptions::request_timeout`].
#[derive(Debug, Clone, Copy)]
enum Extra {
    /// A wait the service spends on the request (an acquire's `wait_ms`):
    /// added to each attempt's timeout and to the failover budget.
    Wait(Duration),
    /// A slow answer (a membership change, a backup): added to each
    /// attempt's timeout only, so that a cluster nobody answers for is given
    /// up on within the failover budget, as for any other call.
    Slow(Duration),
}

impl Extra {
    const NONE: Extra = Extra::Wait(Duration::ZERO);
}
/// How long a membership change may take on the leader: a new member's
/// catch-up (`server::members::CATCH_UP`) and both steps of the change.
const MEMBER_CHANGE: Duration = Duration::from_secs(150);
/// The extra time of a member list: the leader probes every member (800 ms).
const MEMBER_LIST: Duration = Duration::from_secs(2);

/// Time added to one request for a backup: a large table takes a while to send.
const SNAPSHOT: Duration = Duration::from_secs(60);

impl Client {
    /// A client for the cluster behind `endpoints` (`http://host:port`; any
    /// nodes of the cluster will do), with the default [`ClientOptions`].
    ///
    /// Fails with [`ClientError::NoEndpoints`] or [`ClientError::BadEndpoint`];
    /// nothing is contacted yet.
    pub fn new(endpoints: Vec<String>) -> Result<Self, ClientError> {
        Self::with_options(endpoints, ClientOptions::default())
    }

    /// A client with explicit L4 and timing tunables; otherwise as [`Client::new`].
    pub fn with_options(endpoints: Vec<String>, options: ClientOptions) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let endpoints: Vec<String> = endpoints.into_iter().map(|e| e.trim_end_matches('/').to_string()).collect();
        for e in &endpoints {
            let uri = crate::url::parse_endpoint(e, options.tls.is_some())
                .map_err(|err| ClientError::BadEndpoint(e.clone(), err))?;
            if options.token.is_some() && options.tls.is_none() && !crate::url::is_loopback(&uri) {
                let why = "a bearer token must not cross the network in clear text: use https:// (with a CA)";
                return Err(ClientError::BadEndpoint(e.clone(), why.into()));
            }
        }
        let inner = Inner {
            endpoints,
            preferred: AtomicUsize::new(0),
            rediscover: AtomicBool::new(true),
            http: options.http_client(1 << 20)?,
            options,
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The options this client was made with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// The endpoints, as given (without a trailing `/`).
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The HTTP client the calls go through.
    pub(crate) fn http(&self) -> &HttpClient {
        &self.inner.http
    }

    /// Send `method path` to the cluster: the preferred node first, then the
    /// others, retrying through elections until the failover budget (plus a
    /// [`Extra::Wait`]) runs out. Answers other than 503 are returned as
    /// they are.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        extra: Extra,
    ) -> Result<Reply, ClientError> {
        self.call_on(&self.inner.http, method, path, body, extra).await
    }

    /// [`Client::call`] through `http` (one with a larger body limit).
    async fn call_on(
        &self,
        http: &HttpClient,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        extra: Extra,
    ) -> Result<Reply, ClientError> {
        let (extra, budget) = match extra {
            Extra::Wait(wait) => (wait, FAILOVER_BUDGET + wait),
            Extra::Slow(slow) => (slow, FAILOVER_BUDGET),
        };
        let deadline = Instant::now() + budget;
        let n = self.inner.endpoints.len();
        let bytes = body.map(|b| serde_json::to_vec(b).expect("wire types serialise"));
        let mut backoff = election_backoff();
        let mut last_error;
        let mut attempt = 0usize;
        // The endpoints tried, in order, and whether any answered HTTP at all.
        let mut tried: Vec<usize> = Vec::with_capacity(n);
        let mut answered = false;
        loop {
            if self.inner.rediscover.swap(false, Ordering::Relaxed) {
                self.discover_leader().await;
            }
            let i = (self.inner.preferred.load(Ordering::Relaxed) + attempt) % n;
            let url = format!("{}{path}", self.inner.endpoints[i]);
            let timeout = self.inner.options.request_timeout + extra;
            if !tried.contains(&i) {
                tried.push(i);
            }
            match http.call(method.clone(), &url, bytes.clone(), timeout).await {
                // Not a 503: a proxy in front of a restarting node says that too.
                Ok(a) if a.status != StatusCode::SERVICE_UNAVAILABLE && !from_a_lock_node(&a) => {
                    return Err(ClientError::NotALockNode { url, status: a.status });
                }
                Ok(a) if a.status != StatusCode::SERVICE_UNAVAILABLE => {
                    self.inner.preferred.store(i, Ordering::Relaxed);
                    return Ok(a);
                }
                Ok(a) => {
                    answered = true;
                    last_error = format!("{url}: {}", String::from_utf8_lossy(&a.body).trim());
                }
                Err(e) => last_error = e.to_string(),
            }
            attempt += 1;
            self.inner.rediscover.store(true, Ordering::Relaxed);
            if Instant::now() >= deadline {
                let tried: Vec<&str> = tried.iter().map(|&i| self.inner.endpoints[i].as_str()).collect();
                let nobody = if answered { "" } else { "no node answered; " };
                debug_assert!(nobody.is_empty() || nobody.starts_with(NO_NODE_ANSWERED));
                return Err(ClientError::Unavailable(format!(
                    "{nobody}tried {} (last error: {last_error})",
                    tried.join(", ")
                )));
            }
            if attempt % n == 0 {
                // Every node said no: give the cluster an election's time,
                // jittered so that many clients do not come back in lockstep.
                tokio::time::sleep(backoff.next_delay().min(deadline - Instant::now())).await;
            }
        }
    }

    /// Point `preferred` at the leader, if some node names one that is among
    /// our endpoints. Followers forward anyway; this only saves a hop.
    async fn discover_leader(&self) {
        let endpoints = &self.inner.endpoints;
        for e in endpoints {
            let url = format!("{e}{}", wire::CLUSTER_PATH);
            let Ok(a) = self.inner.http.call(Method::GET, &url, None, Duration::from_millis(500)).await else {
                continue;
            };
            let Ok(info) = serde_json::from_slice::<ClusterInfo>(&a.body) else { continue };
            let leader_url = info.leader.and_then(|l| info.members.into_iter().find(|m| m.id == l)).and_then(|m| m.url);
            if let Some(j) = leader_url.and_then(|u| endpoints.iter().position(|x| *x == u.trim_end_matches('/'))) {
                self.inner.preferred.store(j, Ordering::Relaxed);
            }
            return;
        }
    }

    /// Take `key`, waiting up to `opts.wait` behind earlier holders (FIFO on
    /// the leader). Retries after a lost answer reuse one request id, so the
    /// service never grants twice for one call.
    ///
    /// The returned [`Lease`] is kept alive in the background. Its validity
    /// runs from when the first attempt was sent (L4); if a long wait left
    /// less than half the TTL, it is renewed before this returns.
    ///
    /// # Errors
    ///
    /// - [`ClientError::Held`]: not granted within `opts.wait`.
    /// - [`ClientError::Refused`]: e.g. an invalid key, or a `ttl`, `wait` or
    ///   `lock_delay` the service does not accept.
    /// - [`ClientError::Unavailable`]: the outcome is unknown. The key may
    ///   have been granted; such a lease expires after its TTL (and then its
    ///   lock-delay runs).
    /// - [`ClientError::LeaseNotFound`]: granted, but already gone when
    ///   renewed after a long wait.
    /// - [`ClientError::Protocol`].
    pub async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Lease, ClientError> {
        let first_sent = Instant::now();
        let wait_until = first_sent + opts.wait;
        let remaining = wait_until.saturating_duration_since(Instant::now());
        let body = AcquireRequest {
            ttl_ms: Some(opts.ttl.as_millis() as u64),
            wait_ms: Some(remaining.as_millis() as u64),
            holder: opts.holder,
            request_id: Some(format!("{:032x}", rand::random::<u128>())),
            lock_delay_ms: opts.lock_delay.map(|d| d.as_millis() as u64),
        };
        let path = format!("{}{key}", wire::LOCKS_PATH);
        let g: Granted = decode(self.call(Method::POST, &path, Some(&body), Extra::Wait(remaining)).await?)?;
        // L4: the grant happened after `first_sent` (the earliest attempt that
        // could have produced it), so validity is measured from there.
        let lease = Lease::start(self.clone(), g.key, g.token, g.lease_id, Duration::from_millis(g.ttl_ms), first_sent);
        if !lease.is_valid() || lease.remaining() < lease.ttl() / 2 {
            // A long wait ate the validity: anchor it afresh with a keepalive.
            lease.keepalive_now().await?;
            if !lease.is_valid() {
                // Even that answer came too late to leave any validity.
                let _ = lease.release().await;
                return Err(ClientError::Unavailable("the grant could not be kept alive in time".into()));
            }
        }
        Ok(lease.hand_out())
    }

    /// Linearizable read of a key: its latest token (0 if never granted) and
    /// holder. Fails with [`ClientError::Refused`] for an invalid key and
    /// [`ClientError::Unavailable`] without a quorum.
    pub async fn read(&self, key: &str) -> Result<LockInfo, ClientError> {
        let path = format!("{}{key}", wire::LOCKS_PATH);
        decode(self.call(Method::GET, &path, None::<&()>, Extra::NONE).await?)
    }

    /// The table's revision, read linearizably: at least the revision of
    /// every event acknowledged before this call was made. Needs the `watch`
    /// right on some key.
    /// The answer names the leader's cluster: revisions of two clusters
    /// say nothing of each other.
    pub async fn revision(&self) -> Result<wire::Revision, ClientError> {
        decode(self.call(Method::GET, wire::REVISION_PATH, None::<&()>, Extra::NONE).await?)
    }

    /// The cluster as the answering node sees it (the known leader is asked
    /// first). Not a leader call: any live node answers.
    pub async fn cluster(&self) -> Result<ClusterInfo, ClientError> {
        decode(self.call(Method::GET, wire::CLUSTER_PATH, None::<&()>, Extra::NONE).await?)
    }

    /// The members, as the leader sees them (needs the `admin` right).
    pub async fn members(&self) -> Result<wire::MemberList, ClientError> {
        // A read: the leader's probes of the members take under a second.
        decode(self.call(Method::GET, wire::MEMBERS_PATH, None::<&()>, Extra::Slow(MEMBER_LIST)).await?)
    }

    /// Add a member: a learner first, a voter once it has caught up. Waits
    /// for both (up to a few minutes for a long catch-up).
    pub async fn add_member(&self, add: &wire::AddMember) -> Result<wire::MemberList, ClientError> {
        decode(self.call(Method::POST, wire::MEMBERS_PATH, Some(add), Extra::Slow(MEMBER_CHANGE)).await?)
    }

    /// Remove a member (the leader hands over first if it is the one).
    pub async fn remove_member(&self, id: u64, force: bool) -> Result<wire::MemberList, ClientError> {
        let path = format!("{}/{id}{}", wire::MEMBERS_PATH, if force { "?force=true" } else { "" });
        decode(self.call(Method::DELETE, &path, None::<&()>, Extra::Slow(MEMBER_CHANGE)).await?)
    }

    /// The leader's backup of the lock table, as `fencegate snapshot save`
    /// writes it (up to `max_bytes`); the caller checks its checksum.
    pub async fn snapshot(&self, max_bytes: usize) -> Result<Bytes, ClientError> {
        let http = self.inner.options.http_client(max_bytes)?;
        let a = self.call_on(&http, Method::GET, wire::SNAPSHOT_PATH, None::<&()>, Extra::Slow(SNAPSHOT)).await?;
        match a.status {
            StatusCode::OK => Ok(a.body),
            _ => decode::<()>(a).map(|()| Bytes::new()),
        }
    }

    /// One keepalive. `Ok(ttl)` only when the leader acknowledged it.
    pub(crate) async fn keepalive(&self, lease_id: &str, timeout: Duration) -> Result<Duration, ClientError> {
        let path = format!("{}{lease_id}/keepalive", wire::LEASES_PATH);
        let call = self.call(Method::POST, &path, None::<&()>, Extra::NONE);
        let answer = tokio::time::timeout(timeout, call).await.map_err(|_| {
            ClientError::Unavailable(format!(
                "keepalive not acknowledged within {}",
                humantime::format_duration(timeout)
            ))
        })??;
        let ack: KeepaliveAck = decode(answer)?;
        Ok(Duration::from_millis(ack.ttl_ms))
    }

    pub(crate) async fn release(&self, lease_id: &str) -> Result<(), ClientError> {
        let path = format!("{}{lease_id}", wire::LEASES_PATH);
        decode::<Released>(self.call(Method::DELETE, &path, None::<&()>, Extra::NONE).await?).map(|_| ())
    }
}

/// Waits between rounds in which every node said no: about an election.
fn election_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).with_floor(Duration::from_millis(20))
}

/// Map an answer to its body, or to the error it carries.
/// Whether an answer can be a lock node's: a success, or an error that
/// names the cluster or is a Lock API error with a code of the API. (A
/// node says its cluster id only once it has one; its errors are always
/// Lock API errors. Another service's `{"error": "not found"}` is not one.)
fn from_a_lock_node(a: &Reply) -> bool {
    a.status.is_success()
        || a.headers.contains_key(wire::CLUSTER_HEADER)
        || serde_json::from_slice::<wire::ApiError>(&a.body).is_ok_and(|e| !matches!(e.error, ErrorCode::Unknown))
}

fn decode<T: DeserializeOwned>(a: Reply) -> Result<T, ClientError> {
    if a.status == StatusCode::OK {
        return serde_json::from_slice(&a.body).map_err(|e| ClientError::Protocol(e.to_string()));
    }
    let Ok(refusal) = serde_json::from_slice::<wire::ApiError>(&a.body) else {
        let body = String::from_utf8_lossy(&a.body).chars().take(200).collect();
        return Err(ClientError::Refused { status: a.status, error: ErrorCode::Unknown, message: body });
    };
    match (refusal.error, refusal.held) {
        (ErrorCode::Held, Some(h)) => {
            Err(ClientError::Held { key: h.key, holder: h.holder, token: h.token, lock_delay: h.lock_delay })
        }
        (ErrorCode::LeaseNotFound, _) => Err(ClientError::LeaseNotFound),
        (error, _) => {
            Err(ClientError::Refused { status: a.status, error, message: refusal.message.unwrap_or_default() })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::AtomicUsize;

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::rt::TokioIo;

    use super::*;

    /// A stand-in lock service whose acquire answers after `grant_delay` and
    /// whose keepalive answers after `ack_delay`; counts releases.
    async fn slow_service(grant_delay: Duration, ack_delay: Duration, releases: Arc<AtomicUsize>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let releases = releases.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let releases = releases.clone();
                        async move {
                            let body = match (req.method().clone(), req.uri().path()) {
                                (Method::POST, p) if p.starts_with(wire::LOCKS_PATH) => {
                                    tokio::time::sleep(grant_delay).await;
                                    r#"{"key":"k","token":7,"lease_id":"l","ttl_ms":1000}"#
                                }
                                (Method::POST, _) => {
                                    tokio::time::sleep(ack_delay).await;
                                    r#"{"ttl_ms":1000}"#
                                }
                                (Method::DELETE, _) => {
                                    releases.fetch_add(1, Ordering::SeqCst);
                                    r#"{"key":"k","token":7,"released":true}"#
                                }
                                // Leader discovery: no leader named, the client keeps its endpoint.
                                _ => r#"{"error":"not_found","message":"m"}"#,
                            };
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(body.as_bytes()))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        url
    }

    /// L4 in `acquire`: a grant that came back with little validity left is
    /// anchored afresh by a keepalive before the lease is handed out.
    #[tokio::test]
    async fn a_late_grant_is_anchored_before_it_is_handed_out() {
        let releases = Arc::new(AtomicUsize::new(0));
        let url = slow_service(Duration::from_millis(600), Duration::ZERO, releases.clone()).await;
        let client = Client::new(vec![url]).unwrap();
        let lease = client.acquire("k", AcquireOptions::new(Duration::from_secs(1))).await.unwrap();
        // Without the anchor, 1000 × 0.99 − 100 − 600 = 290 ms would be left.
        assert!(lease.remaining() > Duration::from_millis(700), "{:?} left", lease.remaining());
        assert_eq!(releases.load(Ordering::SeqCst), 0);
    }

    /// ...and if even that keepalive answers too late to leave any validity,
    /// the grant is given back and `acquire` fails: it never hands out a
    /// lease that is already lost.
    #[tokio::test]
    async fn a_grant_that_cannot_be_anchored_in_time_is_released() {
        let releases = Arc::new(AtomicUsize::new(0));
        let url = slow_service(Duration::from_millis(600), Duration::from_millis(1000), releases.clone()).await;
        let client = Client::new(vec![url]).unwrap();
        match client.acquire("k", AcquireOptions::new(Duration::from_secs(1))).await {
            Err(ClientError::Unavailable(_)) => {}
            other => panic!("expected unavailable, got {:?}", other.map(|l| l.is_valid())),
        }
        assert_eq!(releases.load(Ordering::SeqCst), 1, "the grant was given back");
    }
}
