//! Many live fencegate leases on distinct keys, kept alive the way clients
//! keep them (a keepalive every ttl/3), for benchmarks that measure the lock
//! service or the sidecar while they are held (`scale`, `bench/anchors`).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_client::wire::Token;
use futures_util::{stream, StreamExt};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub const TTL: Duration = Duration::from_secs(60);
/// ttl/3, as the client library's `Lease` does.
pub const KEEPALIVE_EVERY: Duration = Duration::from_secs(20);
/// Leases per keepalive task: 50 keepalives/s each, sent one at a time.
pub const LEASES_PER_KEEPER: usize = 1_000;
/// Acquires in flight while building; the leader packs concurrent commands
/// into one log entry, so this sets the build rate.
pub const BUILD_CONCURRENCY: usize = 128;

#[derive(Default)]
pub struct KeepaliveStats {
    pub sent: AtomicU64,
    pub errors: AtomicU64,
    /// How far behind schedule a keepalive went out, at worst (ms).
    pub max_late_ms: AtomicU64,
}

/// Leases on keys `{prefix}{i}`, i = 0..n, held through the raw Lock API.
///
/// The keepalives come from a few paced loops rather than one client-library
/// `Lease` (a task and a watch channel) per lease: the leader sees the same
/// `leases / 20 s` keepalives per second, and at 100,000 leases the load
/// generator, which shares the two cores with the cluster, stays light and
/// can count every failed keepalive.
pub struct Holders {
    http: HttpClient,
    leader: String,
    prefix: String,
    pub tokens: Vec<Token>,
    lease_ids: Vec<String>,
    pub stats: Arc<KeepaliveStats>,
    /// Dropping the set stops the keepalives.
    keepers: JoinSet<()>,
}

impl Holders {
    pub fn new(leader: String, prefix: &str) -> Holders {
        Holders {
            http: HttpClient::new(1 << 20),
            leader,
            prefix: prefix.into(),
            tokens: vec![],
            lease_ids: vec![],
            stats: Arc::default(),
            keepers: JoinSet::new(),
        }
    }

    /// Acquire leases until `n` are held; returns the build rate, leases/s.
    // `is_multiple_of` is newer than the root package's rust-version (1.85);
    // `bench/anchors`, which includes this file, is on 1.88.
    #[allow(clippy::manual_is_multiple_of)]
    pub async fn grow_to(&mut self, n: usize) -> f64 {
        let (from, start) = (self.tokens.len(), Instant::now());
        let (http, leader, prefix) = (self.http.clone(), self.leader.clone(), self.prefix.clone());
        let mut acquired =
            stream::iter(from..n).map(|i| acquire(&http, &leader, format!("{prefix}{i}"))).buffered(BUILD_CONCURRENCY);
        let mut ids = vec![];
        while let Some((token, id)) = acquired.next().await {
            self.tokens.push(token);
            self.lease_ids.push(id.clone());
            ids.push(id);
            // Keep each batch alive as soon as it is complete: the first
            // leases of a long build must not wait for the last.
            if ids.len() == LEASES_PER_KEEPER {
                self.keep(std::mem::take(&mut ids));
            }
            if self.tokens.len() % 10_000 == 0 {
                eprintln!("  {} leases held", self.tokens.len());
            }
        }
        if !ids.is_empty() {
            self.keep(ids);
        }
        (n - from) as f64 / start.elapsed().as_secs_f64()
    }

    fn keep(&mut self, ids: Vec<String>) {
        self.keepers.spawn(keep_alive(self.http.clone(), self.leader.clone(), ids, self.stats.clone()));
    }

    /// Stop the keepalives and release every lease, so that none expires
    /// later, in the middle of another measurement.
    pub async fn release_all(mut self) {
        self.keepers.shutdown().await;
        let (http, leader) = (&self.http, &self.leader);
        stream::iter(&self.lease_ids)
            .map(|id| async move {
                let url = format!("{leader}/v1/leases/{id}");
                let a = http.call(Method::DELETE, &url, None, Duration::from_secs(10)).await.unwrap();
                assert_eq!(a.status, StatusCode::OK, "releasing {id}: {}", String::from_utf8_lossy(&a.body));
            })
            .buffer_unordered(BUILD_CONCURRENCY)
            .collect::<()>()
            .await;
    }
}

/// `POST /v1/locks/{key}`: the token and lease id.
async fn acquire(http: &HttpClient, leader: &str, key: String) -> (Token, String) {
    let body = serde_json::to_vec(&json!({ "ttl_ms": TTL.as_millis() as u64 })).unwrap();
    let url = format!("{leader}/v1/locks/{key}");
    let a = http.call(Method::POST, &url, Some(body), Duration::from_secs(10)).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "acquiring {key}: {}", String::from_utf8_lossy(&a.body));
    let v: Value = serde_json::from_slice(&a.body).unwrap();
    (v["token"].as_u64().unwrap(), v["lease_id"].as_str().unwrap().to_string())
}

/// One keepalive per lease of `ids` every `KEEPALIVE_EVERY`, over HTTP.
async fn keep_alive(http: HttpClient, leader: String, ids: Vec<String>, stats: Arc<KeepaliveStats>) {
    paced(ids, stats, |id| {
        let (http, url) = (http.clone(), format!("{leader}/v1/leases/{id}/keepalive"));
        async move {
            match http.call(Method::POST, &url, None, Duration::from_secs(5)).await {
                Ok(a) if a.status == StatusCode::OK => None,
                Ok(a) => Some(format!("{}: {}", a.status, String::from_utf8_lossy(&a.body).trim())),
                Err(e) => Some(e.to_string()),
            }
        }
    })
    .await
}

/// `send` once per item of `ids` every `KEEPALIVE_EVERY`, forever, item j at
/// phase j/len of the period, so that the load is even rather than in
/// bursts; counted in `stats`. `send` answers why it failed, if it did.
pub async fn paced<T, F, Fut>(ids: Vec<T>, stats: Arc<KeepaliveStats>, mut send: F)
where
    F: FnMut(&T) -> Fut,
    Fut: Future<Output = Option<String>>,
{
    let (start, step) = (Instant::now(), KEEPALIVE_EVERY / ids.len() as u32);
    for round in 0.. {
        for (j, id) in ids.iter().enumerate() {
            let due = start + KEEPALIVE_EVERY * round + step * j as u32;
            tokio::time::sleep_until(due).await;
            stats.max_late_ms.fetch_max(due.elapsed().as_millis() as u64, Relaxed);
            let failure = send(id).await;
            stats.sent.fetch_add(1, Relaxed);
            if let Some(why) = failure {
                stats.failed(&why);
            }
        }
    }
}

impl KeepaliveStats {
    pub fn failed(&self, why: &str) {
        // Say why for the first few: a count alone does not tell a stall from an expiry.
        if self.errors.fetch_add(1, Relaxed) < 5 {
            eprintln!("  keepalive failed: {why}");
        }
    }
}
