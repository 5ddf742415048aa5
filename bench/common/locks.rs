//! The lock client logic the lock-service benchmarks share: the lock calls
//! (`Backend`, one implementation per API; fencegate's here, etcd's and
//! Redis's in `bench/anchors`) and the closed loop that measures
//! acquire+release pairs with them.

use std::future::Future;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use fencegate_client::http::HttpClient;
use hyper::Method;
use serde_json::{json, Value};
use tokio::time::Instant;

/// Long enough that no lease under load expires.
pub const TTL: Duration = Duration::from_secs(30);
/// Under load a slow answer is a result, not an error.
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// A lock held: its fencing token and what release and keepalive need.
pub struct Held {
    /// None where the lock has no fencing token (Redis).
    pub token: Option<u64>,
    /// The lease to keep alive or release (Redis: the holder's random value).
    pub lease: String,
    /// The key to delete on release where that is how a lock is released
    /// (etcd's v3lock: the key `Lock` answered; Redis: the lock's key).
    pub key: String,
}

/// The lock calls, sent to member `url`.
pub trait Backend: Clone + Send + Sync + 'static {
    fn acquire(
        &self,
        url: &str,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<Held>> + Send;
    fn release(&self, url: &str, held: &Held) -> impl Future<Output = Result<()>> + Send;
    fn keepalive(&self, url: &str, held: &Held) -> impl Future<Output = Result<()>> + Send;
}

/// `method url` with an optional JSON body; the JSON answer if 200.
pub async fn call(
    http: &HttpClient,
    method: Method,
    url: &str,
    body: Option<Value>,
    timeout: Duration,
) -> Result<Value> {
    let a = http.call(method, url, body.map(|b| b.to_string().into_bytes()), timeout).await?;
    if a.status != 200 {
        bail!("{url}: {} {}", a.status, String::from_utf8_lossy(&a.body));
    }
    Ok(serde_json::from_slice(&a.body)?)
}

/// fencegate's API over `HttpClient` (plain or HTTPS, with whatever
/// credentials the client carries).
#[derive(Clone)]
pub struct FencegateApi(pub HttpClient);

impl Backend for FencegateApi {
    async fn acquire(&self, url: &str, key: &str, ttl: Duration, timeout: Duration) -> Result<Held> {
        let body = json!({"ttl_ms": ttl.as_millis() as u64, "holder": "bench"});
        let v = call(&self.0, Method::POST, &format!("{url}/v1/locks/{key}"), Some(body), timeout).await?;
        Ok(Held {
            token: Some(v["token"].as_u64().context("no token")?),
            lease: v["lease_id"].as_str().context("no lease_id")?.into(),
            key: key.into(),
        })
    }

    async fn release(&self, url: &str, held: &Held) -> Result<()> {
        call(&self.0, Method::DELETE, &format!("{url}/v1/leases/{}", held.lease), None, LOAD_TIMEOUT).await.map(drop)
    }

    async fn keepalive(&self, url: &str, held: &Held) -> Result<()> {
        let url = format!("{url}/v1/leases/{}/keepalive", held.lease);
        call(&self.0, Method::POST, &url, None, LOAD_TIMEOUT).await.map(drop)
    }
}

/// `clients` closed loops for `seconds`, each acquiring and releasing key
/// `bench/{tag}/{its number}`: pairs per second and every pair's latency.
pub async fn pairs<B: Backend>(api: &B, url: &str, tag: &str, clients: usize, seconds: f64) -> (f64, Vec<Duration>) {
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (api, url, key) = (api.clone(), url.to_string(), format!("bench/{tag}/{c}"));
            tokio::spawn(async move {
                let (mut latencies, mut last_token) = (vec![], 0);
                while Instant::now() < until {
                    let t = Instant::now();
                    let held = api.acquire(&url, &key, TTL, LOAD_TIMEOUT).await.unwrap();
                    // The one property every lock service must have for fencing.
                    if let Some(token) = held.token {
                        assert!(token > last_token, "{key}: token {token} after {last_token}");
                        last_token = token;
                    }
                    api.release(&url, &held).await.unwrap();
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = vec![];
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all.len() as f64 / start.elapsed().as_secs_f64(), all)
}

/// The 50th and 99th percentiles of `latencies`, in milliseconds.
pub fn p50_p99_ms(mut latencies: Vec<Duration>) -> (f64, f64) {
    latencies.sort();
    let ms = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    (ms(0.50), ms(0.99))
}

pub fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}
