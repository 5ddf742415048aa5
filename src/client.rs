//! The lock client library: talks to any node of a cluster, finds the leader,
//! fails over, acquires leases and keeps them alive.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fencegate::client::ClientError> {
//! use std::time::Duration;
//! use fencegate::client::{AcquireOptions, Client};
//! let client = Client::new(vec!["http://127.0.0.1:7401".into()])?;
//! let lease = client.acquire("rack/42", AcquireOptions::new(Duration::from_secs(30))).await?;
//! // ... pass lease.token() to the resource with every write ...
//! tokio::select! {
//!     reason = lease.lost() => eprintln!("stop now: {reason}"),
//!     _ = async { /* work */ } => {}
//! }
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod lease;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use thiserror::Error;
use tokio::time::Instant;

pub use lease::{Lease, LostReason};

use crate::http::{Answer, HttpClient};
use crate::lock::state::Token;

/// Default endpoint when neither `--endpoints` nor `$FENCEGATE_ENDPOINTS` is set.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7401";

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("no endpoints given")]
    NoEndpoints,
    #[error("invalid endpoint {0:?}: {1}")]
    BadEndpoint(String, String),
    #[error("{key} is held by {holder:?} (token {token}){}", if *lock_delay { ", in lock-delay" } else { "" })]
    Held { key: String, holder: Option<String>, token: Token, lock_delay: bool },
    #[error("lease not found (released, expired or never granted)")]
    LeaseNotFound,
    #[error("the lock service refused the request ({status}): {error}: {message}")]
    Refused { status: StatusCode, error: String, message: String },
    /// No node answered in time. For a write, the outcome is unknown.
    #[error("lock service unavailable: {0}")]
    Unavailable(String),
    #[error("unexpected answer from the lock service: {0}")]
    Protocol(String),
}

/// Tunables for L4 (client conservatism) and request timing.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Upper bound on the rate difference between this host's clock and the
    /// leader's (default 1%).
    pub drift: f64,
    /// Safety margin subtracted from every validity deadline (default 100 ms).
    pub margin: Duration,
    /// Deadline for one request to one node (default 3 s).
    pub request_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self { drift: 0.01, margin: Duration::from_millis(100), request_timeout: Duration::from_secs(3) }
    }
}

/// What to ask for when acquiring.
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    pub ttl: Duration,
    /// How long the service may queue the request while the key is held.
    pub wait: Duration,
    pub holder: Option<String>,
    /// Per-request lock-delay (L6); the server default applies when `None`.
    pub lock_delay: Option<Duration>,
}

impl AcquireOptions {
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, wait: Duration::ZERO, holder: None, lock_delay: None }
    }
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }
    pub fn lock_delay(mut self, d: Duration) -> Self {
        self.lock_delay = Some(d);
        self
    }
}

/// `GET /v1/locks/{key}`.
#[derive(Debug, Clone, Deserialize)]
pub struct LockInfo {
    pub key: String,
    pub held: bool,
    pub token: Token,
    pub holder: Option<String>,
    pub expires_in_ms: Option<u64>,
}

/// `GET /v1/cluster`.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterInfo {
    pub id: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub state: String,
    pub members: Vec<Member>,
    pub commit_index: u64,
    pub last_log_index: u64,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Member {
    pub id: u64,
    pub url: Option<String>,
}

/// A handle on a cluster. Cheap to clone.
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

/// How long to keep retrying a call that found no leader, beyond its own wait.
const FAILOVER_BUDGET: Duration = Duration::from_secs(5);

impl Client {
    pub fn new(endpoints: Vec<String>) -> Result<Self, ClientError> {
        Self::with_options(endpoints, ClientOptions::default())
    }

    pub fn with_options(endpoints: Vec<String>, options: ClientOptions) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let endpoints: Vec<String> = endpoints.into_iter().map(|e| e.trim_end_matches('/').to_string()).collect();
        for e in &endpoints {
            crate::config::check_base_url("endpoint", e)
                .map_err(|err| ClientError::BadEndpoint(e.clone(), err.to_string()))?;
        }
        let inner = Inner {
            endpoints,
            preferred: AtomicUsize::new(0),
            rediscover: AtomicBool::new(true),
            http: HttpClient::new(1 << 20),
            options,
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// Send `method path` to the cluster: the preferred node first, then the
    /// others, retrying through elections until `budget` runs out. Answers
    /// other than 503 are returned as they are.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        extra: Duration,
    ) -> Result<Answer, ClientError> {
        let deadline = Instant::now() + extra + FAILOVER_BUDGET;
        let n = self.inner.endpoints.len();
        let mut last_error;
        let mut attempt = 0usize;
        loop {
            if self.inner.rediscover.swap(false, Ordering::Relaxed) {
                self.discover_leader().await;
            }
            let i = (self.inner.preferred.load(Ordering::Relaxed) + attempt) % n;
            let url = format!("{}{path}", self.inner.endpoints[i]);
            let bytes = body.as_ref().map(|b| serde_json::to_vec(b).expect("JSON values serialise"));
            let timeout = self.inner.options.request_timeout + extra;
            match self.inner.http.call(method.clone(), &url, bytes, timeout).await {
                Ok(a) if a.status != StatusCode::SERVICE_UNAVAILABLE => {
                    self.inner.preferred.store(i, Ordering::Relaxed);
                    return Ok(a);
                }
                Ok(a) => last_error = format!("{url}: {}", String::from_utf8_lossy(&a.body).trim()),
                Err(e) => last_error = e.to_string(),
            }
            attempt += 1;
            self.inner.rediscover.store(true, Ordering::Relaxed);
            if Instant::now() >= deadline {
                return Err(ClientError::Unavailable(last_error));
            }
            if attempt % n == 0 {
                // Every node said no: give the cluster an election's time.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// Point `preferred` at the leader, if some node names one that is among
    /// our endpoints. Followers forward anyway; this only saves a hop.
    async fn discover_leader(&self) {
        let endpoints = &self.inner.endpoints;
        for e in endpoints {
            let url = format!("{e}/v1/cluster");
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
    pub async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Lease, ClientError> {
        let request_id = format!("{:032x}", rand::random::<u128>());
        let first_sent = Instant::now();
        let wait_until = first_sent + opts.wait;
        let mut body = json!({
            "ttl_ms": opts.ttl.as_millis() as u64,
            "holder": opts.holder,
            "request_id": request_id,
        });
        if let Some(d) = opts.lock_delay {
            body["lock_delay_ms"] = json!(d.as_millis() as u64);
        }
        let remaining = wait_until.saturating_duration_since(Instant::now());
        body["wait_ms"] = json!(remaining.as_millis() as u64);
        let answer = self.call(Method::POST, &format!("/v1/locks/{key}"), Some(body), remaining).await?;
        #[derive(Deserialize)]
        struct Granted {
            key: String,
            token: Token,
            lease_id: String,
            ttl_ms: u64,
        }
        let g: Granted = decode(answer)?;
        // L4: the grant happened after `first_sent` (the earliest attempt that
        // could have produced it), so validity is measured from there.
        let lease = Lease::start(self.clone(), g.key, g.token, g.lease_id, Duration::from_millis(g.ttl_ms), first_sent);
        if !lease.is_valid() || lease.remaining() < lease.ttl() / 2 {
            // A long wait ate the validity: anchor it afresh with a keepalive.
            lease.keepalive_now().await?;
        }
        Ok(lease)
    }

    /// Linearizable read of a key: its latest token (0 if never granted) and holder.
    pub async fn read(&self, key: &str) -> Result<LockInfo, ClientError> {
        decode(self.call(Method::GET, &format!("/v1/locks/{key}"), None, Duration::ZERO).await?)
    }

    /// The cluster as the first answering node sees it.
    pub async fn cluster(&self) -> Result<ClusterInfo, ClientError> {
        decode(self.call(Method::GET, "/v1/cluster", None, Duration::ZERO).await?)
    }

    /// One keepalive. `Ok(ttl)` only when the leader acknowledged it.
    async fn keepalive(&self, lease_id: &str, timeout: Duration) -> Result<Duration, ClientError> {
        let path = format!("/v1/leases/{lease_id}/keepalive");
        let call = self.call(Method::POST, &path, None, Duration::ZERO);
        let answer = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| ClientError::Unavailable(format!("keepalive not acknowledged within {timeout:?}")))??;
        #[derive(Deserialize)]
        struct Ack {
            ttl_ms: u64,
        }
        let ack: Ack = decode(answer)?;
        Ok(Duration::from_millis(ack.ttl_ms))
    }

    async fn release(&self, lease_id: &str) -> Result<(), ClientError> {
        let answer = self.call(Method::DELETE, &format!("/v1/leases/{lease_id}"), None, Duration::ZERO).await?;
        decode::<Value>(answer).map(|_| ())
    }
}

/// Map an answer to its JSON body, or to the error it carries.
fn decode<T: serde::de::DeserializeOwned>(a: Answer) -> Result<T, ClientError> {
    if a.status == StatusCode::OK {
        return serde_json::from_slice(&a.body).map_err(|e| ClientError::Protocol(e.to_string()));
    }
    let v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    match (a.status, field("error").as_str()) {
        (StatusCode::CONFLICT, "held") => Err(ClientError::Held {
            key: field("key"),
            holder: v.get("holder").and_then(Value::as_str).map(String::from),
            token: v.get("token").and_then(Value::as_u64).unwrap_or(0),
            lock_delay: v.get("lock_delay").and_then(Value::as_bool).unwrap_or(false),
        }),
        (StatusCode::NOT_FOUND, "lease_not_found") => Err(ClientError::LeaseNotFound),
        (status, error) => Err(ClientError::Refused { status, error: error.to_string(), message: field("message") }),
    }
}
