//! The workers: acquire (with wait) → several writes with the token, some
//! time apart → release; now and then a worker "pauses" (its process would be
//! SIGSTOPped: keepalives stop too) for longer than its TTL and then carries
//! on writing with its old token, exactly as a GC-paused holder would.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::Upstream;
use fencegate_client::http::HttpClient;
use fencegate_client::{AcquireOptions, Client, ClientError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::history::{History, Kind, Outcome};

#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub workers: usize,
    pub keys: usize,
    pub writes: usize,
    pub ttl: Duration,
    pub pause_probability: f64,
}

pub fn path_of(key: &str) -> String {
    format!("/racks/{}", key.trim_start_matches("rack/"))
}

/// Run every worker until `until`.
pub async fn run(
    w: Workload,
    history: Arc<History>,
    client: Client,
    target: String,
    seed: u64,
    prefix: &str,
    until: Instant,
) {
    let mut tasks = vec![];
    for worker in 0..w.workers {
        let (history, client, target, prefix) = (history.clone(), client.clone(), target.clone(), prefix.to_string());
        let mut rng = StdRng::seed_from_u64(seed ^ (worker as u64).wrapping_mul(0x9e37_79b9));
        tasks.push(tokio::spawn(async move {
            let http = HttpClient::new(1 << 20);
            while Instant::now() < until {
                let key = format!("rack/{prefix}{}", rng.random_range(0..w.keys));
                one_round(worker, &w, &history, &client, &http, &target, &key, &mut rng).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn one_round(
    worker: usize,
    w: &Workload,
    history: &History,
    client: &Client,
    http: &HttpClient,
    target: &str,
    key: &str,
    rng: &mut StdRng,
) {
    let start = Instant::now();
    let opts = AcquireOptions::new(w.ttl).wait(Duration::from_secs(2)).holder(format!("worker-{worker}"));
    let lease = match tokio::time::timeout(Duration::from_secs(15), client.acquire(key, opts)).await {
        Ok(Ok(lease)) => lease,
        Ok(Err(ClientError::Held { .. })) => {
            let refused = Outcome::Refused { status: 409, error: "held".into() };
            history.record(worker, start, Kind::Acquire { key: key.into(), token: None }, refused);
            return;
        }
        other => {
            let why = match other {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".into(),
            };
            history.record(worker, start, Kind::Acquire { key: key.into(), token: None }, Outcome::Unknown { why });
            tokio::time::sleep(Duration::from_millis(200)).await;
            return;
        }
    };
    let token = lease.token();
    history.record(worker, start, Kind::Acquire { key: key.into(), token: Some(token) }, Outcome::Ok);
    let mut valid_until = Instant::now() + lease.remaining();
    let mut lease = Some(lease);
    for _ in 0..w.writes {
        if let Some(l) = &lease {
            if rng.random_bool(w.pause_probability) {
                // The pause: validity ends where the library last guaranteed it.
                valid_until = Instant::now() + l.remaining();
                lease = None; // keepalives stop with the "process"
                tokio::time::sleep(w.ttl.mul_f64(1.5)).await;
            } else if !l.is_valid() {
                break; // lost (faults): a well-behaved holder stops writing
            } else {
                valid_until = Instant::now() + l.remaining();
            }
        }
        write(worker, history, http, target, key, token, lease.is_none()).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
    }
    let now = Instant::now();
    history.record(worker, valid_until.min(now), Kind::ValidUntil { key: key.into(), token }, Outcome::Ok);
    if let Some(l) = lease {
        let start = Instant::now();
        let outcome = match tokio::time::timeout(Duration::from_secs(10), l.release()).await {
            Ok(Ok(())) => Outcome::Ok,
            Ok(Err(ClientError::LeaseNotFound)) => Outcome::Refused { status: 404, error: "lease_not_found".into() },
            Ok(Err(e)) => Outcome::Unknown { why: e.to_string() },
            Err(_) => Outcome::Unknown { why: "timed out".into() },
        };
        history.record(worker, start, Kind::Release { key: key.into(), token }, outcome);
    }
}

async fn write(worker: usize, history: &History, http: &HttpClient, target: &str, key: &str, token: u64, stale: bool) {
    let start = Instant::now();
    let outcome = send_write(http, target, worker, key, token).await;
    history.record(worker, start, Kind::Write { key: key.into(), token, stale }, outcome);
}

/// One fenced write of `key` with `token` to `target` (a sidecar, or the
/// upstream itself in a control arm), and what its answer means.
pub async fn send_write(http: &HttpClient, target: &str, worker: usize, key: &str, token: u64) -> Outcome {
    let req = hyper::Request::put(format!("{target}{}", path_of(key)))
        .header("x-fence-token", token.to_string())
        .body(http_body_util::Full::new(bytes::Bytes::from(format!("{{\"state\":\"w{worker}@{token}\"}}"))))
        .unwrap();
    match http.send(req, Duration::from_secs(10)).await {
        Ok(a) if a.status == 200 => Outcome::Ok,
        Ok(a) => {
            let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_default();
            let error = v["error"].as_str().unwrap_or("").to_string();
            // 503 is the sidecar refusing to judge (never forwarded); a
            // 502/504 may or may not have reached the upstream.
            if a.status.is_server_error() && a.status != 503 {
                Outcome::Unknown { why: format!("{} {error}", a.status) }
            } else {
                Outcome::Refused { status: a.status.as_u16(), error }
            }
        }
        Err(e) => Outcome::Unknown { why: e.to_string() },
    }
}

/// Each key's tokens in the order the upstream applied its writes.
pub fn applied(up: &Upstream, keys: &[String]) -> BTreeMap<String, Vec<u64>> {
    keys.iter().map(|key| (key.clone(), up.tokens(&path_of(key)).into_iter().flatten().collect())).collect()
}

/// Each key's writes as the upstream applied them: token and when, on the
/// history's clock (the upstream runs in this process).
pub fn applied_at(up: &Upstream, keys: &[String], history: &History) -> BTreeMap<String, Vec<(u64, f64)>> {
    let seen = up.seen();
    keys.iter()
        .map(|key| {
            let path = path_of(key);
            let writes = seen
                .iter()
                .filter(|s| s.path == path && s.method != "GET")
                .filter_map(|s| Some((s.token?, history.ms(Instant::from_std(s.at)))))
                .collect();
            (key.clone(), writes)
        })
        .collect()
}

/// After healing: how long until an acquire succeeds again (ms; `None`
/// if none did within `bound_ms`).
pub async fn recovery(client: &Client, bound_ms: f64) -> Option<f64> {
    let healed = Instant::now();
    while healed.elapsed().as_secs_f64() * 1000.0 < bound_ms {
        if let Ok(l) = client.acquire("rack/liveness", AcquireOptions::new(Duration::from_secs(5))).await {
            let _ = l.release().await;
            return Some(healed.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Each key's latest token as the service reads it now (keys it cannot read are left out).
pub async fn latest(client: &Client, keys: &[String]) -> BTreeMap<String, u64> {
    let mut latest = BTreeMap::new();
    for key in keys {
        if let Ok(info) = client.read(key).await {
            latest.insert(key.clone(), info.token);
        }
    }
    latest
}
