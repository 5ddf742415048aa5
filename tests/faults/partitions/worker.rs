//! The workers as separate processes: this test binary started again (its
//! `worker_process` test, with the worker's [`Spec`] in `FGP_WORKER`) in the
//! workers' namespace. Each loops until the end of the run: acquire (with
//! wait) → for each write: check the lease is valid, "think" a while, then
//! write with the token → release. A worker does not check its lease again
//! between the check and the write, as a real program does not: a SIGSTOP
//! in that window that outlasts the TTL makes the write stale, and the
//! sidecar must refuse it.
//!
//! Each operation is appended to the worker's history file as one JSON
//! line, stamped on the test's timeline (CLOCK_MONOTONIC, shared by every
//! process, minus the test's start), so a worker killed mid-run leaves what
//! it did.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_client::{AcquireOptions, Client, ClientError};
use fencegate_testkit::netns::monotonic_ns;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use fencegate_testkit::verify::history::{Kind, Op, Outcome};
use fencegate_testkit::verify::workload::send_write;

/// The variable holding a worker's spec (JSON).
pub const ENV: &str = "FGP_WORKER";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    pub worker: usize,
    pub endpoints: Vec<String>,
    /// Where writes go: the sidecar, or the upstream itself (control arm).
    pub target: String,
    pub keys: usize,
    pub writes: usize,
    pub ttl_ms: u64,
    /// The think time between the validity check and the write, at random in this range.
    pub think_ms: (u64, u64),
    pub seed: u64,
    /// The history's zero and the run's end, in CLOCK_MONOTONIC nanoseconds.
    pub t0_ns: u64,
    pub until_ns: u64,
    pub out: PathBuf,
}

struct Recorder {
    worker: usize,
    t0_ns: u64,
    file: std::fs::File,
}

impl Recorder {
    fn now(&self) -> f64 {
        monotonic_ns().saturating_sub(self.t0_ns) as f64 / 1e6
    }

    fn record(&mut self, start_ms: f64, kind: Kind, outcome: Outcome) {
        let op = Op { worker: self.worker, start_ms, end_ms: self.now(), kind, outcome };
        let mut line = serde_json::to_vec(&op).unwrap();
        line.push(b'\n');
        self.file.write_all(&line).unwrap();
    }
}

/// The worker process's main.
pub fn main(spec: Spec) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(run(spec));
}

async fn run(s: Spec) {
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&s.out).unwrap();
    let mut rec = Recorder { worker: s.worker, t0_ns: s.t0_ns, file };
    let client = Client::new(s.endpoints.clone()).unwrap();
    let http = HttpClient::new(1 << 20);
    let mut rng = StdRng::seed_from_u64(s.seed ^ (s.worker as u64).wrapping_mul(0x9e37_79b9));
    while monotonic_ns() < s.until_ns {
        let key = format!("rack/{}", rng.random_range(0..s.keys));
        round(&s, &mut rec, &client, &http, &key, &mut rng).await;
    }
}

async fn round(s: &Spec, rec: &mut Recorder, client: &Client, http: &HttpClient, key: &str, rng: &mut StdRng) {
    let start = rec.now();
    let ttl = Duration::from_millis(s.ttl_ms);
    let opts = AcquireOptions::new(ttl).wait(Duration::from_secs(2)).holder(format!("worker-{}", s.worker));
    let lease = match tokio::time::timeout(Duration::from_secs(15), client.acquire(key, opts)).await {
        Ok(Ok(lease)) => lease,
        Ok(Err(ClientError::Held { .. })) => {
            let refused = Outcome::Refused { status: 409, error: "held".into() };
            rec.record(start, Kind::Acquire { key: key.into(), token: None }, refused);
            return;
        }
        other => {
            let why = match other {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".into(),
            };
            rec.record(start, Kind::Acquire { key: key.into(), token: None }, Outcome::Unknown { why });
            tokio::time::sleep(Duration::from_millis(200)).await;
            return;
        }
    };
    let token = lease.token();
    rec.record(start, Kind::Acquire { key: key.into(), token: Some(token) }, Outcome::Ok);
    let mut valid_until = rec.now() + lease.remaining().as_secs_f64() * 1000.0;
    for _ in 0..s.writes {
        if !lease.is_valid() {
            break; // a well-behaved holder stops writing once it may have lost the lock
        }
        valid_until = rec.now() + lease.remaining().as_secs_f64() * 1000.0;
        // The window: a SIGSTOP here that outlasts the TTL makes the write stale.
        tokio::time::sleep(Duration::from_millis(rng.random_range(s.think_ms.0..=s.think_ms.1))).await;
        let stale = !lease.is_valid();
        write(s, rec, http, key, token, stale).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
    }
    let now = rec.now();
    rec.record(valid_until.min(now), Kind::ValidUntil { key: key.into(), token }, Outcome::Ok);
    let start = rec.now();
    let outcome = match tokio::time::timeout(Duration::from_secs(10), lease.release()).await {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(ClientError::LeaseNotFound)) => Outcome::Refused { status: 404, error: "lease_not_found".into() },
        Ok(Err(e)) => Outcome::Unknown { why: e.to_string() },
        Err(_) => Outcome::Unknown { why: "timed out".into() },
    };
    rec.record(start, Kind::Release { key: key.into(), token }, outcome);
}

async fn write(s: &Spec, rec: &mut Recorder, http: &HttpClient, key: &str, token: u64, stale: bool) {
    let start = rec.now();
    let outcome = send_write(http, &s.target, s.worker, key, token).await;
    rec.record(start, Kind::Write { key: key.into(), token, stale }, outcome);
}

/// Every operation in a worker's history file (a line cut short by a kill is skipped).
pub fn read_history(path: &std::path::Path) -> Vec<Op> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}
