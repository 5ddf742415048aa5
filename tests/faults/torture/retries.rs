//! The idempotency arm (I1): workers that retry every write whose outcome
//! they do not know, with the same `Idempotency-Key`, through sidecar
//! restarts (SIGKILL) and upstream exchanges cut mid-flight (a relay between
//! sidecar and upstream, dropped while writes are in flight there). The
//! recording upstream must show each key applied at most once. The control
//! runs the same workload on a route without `idempotency`, where the same
//! retries apply writes twice: the checker can fail.

use std::collections::BTreeMap;
use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_testkit::relay::Relay;
use fencegate_testkit::routes::{everything_else, table, Route};
use fencegate_testkit::upstream::{Seen, DELAY_HEADER};
use fencegate_testkit::{bin, Sidecar, Upstream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use fencegate_testkit::verify::checker::Report;

const KEY_HEADER: &str = "idempotency-key";
const WORKERS: usize = 4;
/// Attempts per write, and the time they may take, at most.
const ATTEMPTS: usize = 40;
const PER_WRITE: Duration = Duration::from_secs(20);

pub struct RetryArm {
    pub name: &'static str,
    /// How the writes ended: `ok`, `outcome_unknown` (left to an operator),
    /// `gave up` (attempts or time ran out), `refused ...`.
    pub outcomes: BTreeMap<String, usize>,
    pub attempts: usize,
    pub faults: BTreeMap<&'static str, usize>,
    pub report: Report,
}

fn routes(idempotent: bool) -> String {
    let mut rack = Route::fenced("rack-writes", "/racks/{rack}", "rack/{rack}", "{ mode: observed }")
        .methods(&["PUT"])
        .timeout("1s");
    if idempotent {
        rack = rack.with("idempotency", "{ retention: 1h }");
    }
    table(&[rack, everything_else()])
}

/// Keys the upstream applied more than once.
pub fn duplicates(seen: &[Seen]) -> Report {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for s in seen {
        if let Some(k) = s.headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()) {
            *count.entry(k).or_default() += 1;
        }
    }
    let violations = count.iter().filter(|(_, n)| **n > 1).map(|(k, n)| format!("{k} applied {n} times")).collect();
    Report { name: "writes applied twice (I1)", violations }
}

pub async fn arm(idempotent: bool, seconds: u64, seed: u64) -> RetryArm {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let relay = Relay::start(up.port).await;
    let mut sc = Sidecar::start(&bin!(), dir.path().join("sc"), &relay.url(), &[], &routes(idempotent)).await;
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut workers = vec![];
    for worker in 0..WORKERS {
        let url = sc.url();
        let mut rng = StdRng::seed_from_u64(seed ^ (worker as u64 + 1).wrapping_mul(0x9e37_79b9));
        workers.push(tokio::spawn(async move {
            let http = HttpClient::new(1 << 20);
            let (mut outcomes, mut attempts) = (BTreeMap::<String, usize>::new(), 0);
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let key = format!("w{worker}-{n}");
                let (outcome, tries) = write_until_known(&http, &url, &key, &mut rng).await;
                *outcomes.entry(outcome).or_default() += 1;
                attempts += tries;
            }
            (outcomes, attempts)
        }));
    }
    // The nemesis: cut the upstream link under writes in flight, or kill
    // and restart the sidecar, every few hundred milliseconds.
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = BTreeMap::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..700))).await;
        if rng.random_bool(0.7) {
            relay.set_cut(true);
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..300))).await;
            relay.set_cut(false);
            *faults.entry("cut the upstream exchange").or_default() += 1;
        } else {
            sc.restart().await;
            *faults.entry("kill -9 and restart the sidecar").or_default() += 1;
        }
    }
    relay.set_cut(false);
    let (mut outcomes, mut attempts) = (BTreeMap::new(), 0);
    for w in workers {
        let (o, a) = w.await.unwrap();
        for (k, v) in o {
            *outcomes.entry(k).or_default() += v;
        }
        attempts += a;
    }
    // Writes delayed at the upstream take effect even after their exchange broke.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let name = if idempotent { "retries with idempotency keys" } else { "retries, control (no idempotency)" };
    RetryArm { name, outcomes, attempts, faults, report: duplicates(&up.seen()) }
}

/// Send one write until its outcome is known: how it ended, and in how many
/// attempts. Timeouts, broken connections, 502, 503, 504 and `409
/// idempotency_in_flight` are retried with the same key.
async fn write_until_known(http: &HttpClient, url: &str, key: &str, rng: &mut StdRng) -> (String, usize) {
    let started = Instant::now();
    for attempt in 1..=ATTEMPTS {
        if started.elapsed() > PER_WRITE {
            return ("gave up".into(), attempt - 1);
        }
        // Some writes are in flight at the upstream for a while, for the
        // nemesis to cut under them.
        let delay = rng.random_range(0..150).to_string();
        let req = hyper::Request::put(format!("{url}/racks/{key}"))
            .header("x-fence-token", "1")
            .header(KEY_HEADER, key)
            .header(DELAY_HEADER, delay)
            .body(http_body_util::Full::new(bytes::Bytes::from(format!("{{\"op\":\"{key}\"}}"))))
            .unwrap();
        match http.send(req, Duration::from_secs(2)).await {
            Ok(a) if a.status == 200 => return ("ok".into(), attempt),
            Ok(a) => {
                let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_default();
                let error = v["error"].as_str().unwrap_or("");
                match (a.status.as_u16(), error) {
                    (409, "outcome_unknown") => return ("outcome_unknown".into(), attempt),
                    (409, "idempotency_in_flight") | (502..=504, _) => {}
                    (status, error) => return (format!("refused {status} {error}"), attempt),
                }
            }
            Err(_) => {} // timed out, or the sidecar was down: retry
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ("gave up".into(), ATTEMPTS)
}
