//! The torture workload on etcd: workers take real `etcdctl lock`s on a few
//! lock names, write through a `cached` sidecar (`max_staleness` 1 s) with
//! the holder key's create revision, and now and then pause (SIGSTOP of
//! their `etcdctl lock`) past the lease's TTL, then go on writing with the
//! old token, as a paused holder would. The torture suite's checker judges
//! the history (`fencegate_testkit::verify`); a control arm runs the same
//! workload straight to its upstream and must show out-of-order writes.
//! Seeded (`ETCD_TORTURE_SEED`) and bounded (`SECONDS` of workload per arm,
//! both arms at once on one etcd, each on its own lock names).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_testkit::verify::checker::{self, APPLY_MARGIN_MS, MAX_STALENESS_MS};
use fencegate_testkit::verify::history::{History, Kind, Outcome};
use fencegate_testkit::verify::summary::{self, Arm};
use fencegate_testkit::verify::workload;
use fencegate_testkit::Upstream;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{sidecar_with, Etcd, Holder, CACHED, LOCK_TTL_S};

const SECONDS: u64 = 20;
const WORKERS: usize = 4;
const KEYS: usize = 2;
const WRITES: usize = 4;
const PAUSE: f64 = 0.25;

fn keys(arm: &str) -> Vec<String> {
    (0..KEYS).map(|i| format!("rack/{arm}{i}")).collect()
}

/// Every worker of one arm, writing to `target`, until `until`.
async fn run(etcd: Arc<Etcd>, dir: &Path, target: String, arm: &'static str, seed: u64, history: Arc<History>) {
    let until = Instant::now() + Duration::from_secs(SECONDS);
    let mut tasks = vec![];
    for worker in 0..WORKERS {
        let (etcd, dir, target, history) = (etcd.clone(), dir.to_path_buf(), target.clone(), history.clone());
        let mut rng = StdRng::seed_from_u64(seed ^ (worker as u64).wrapping_mul(0x9e37_79b9));
        tasks.push(tokio::spawn(async move {
            let http = HttpClient::new(1 << 20);
            for round in 0.. {
                if Instant::now() >= until {
                    break;
                }
                let key = format!("rack/{arm}{}", rng.random_range(0..KEYS));
                let who = format!("{arm}-w{worker}-r{round}");
                one_round(&etcd, &dir, &who, worker, &key, &target, &http, &history, &mut rng).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Lock `key` with `etcdctl lock`, write `WRITES` times with its token
/// (pausing past the TTL now and then), release.
#[allow(clippy::too_many_arguments)]
async fn one_round(
    etcd: &Etcd,
    dir: &Path,
    who: &str,
    worker: usize,
    key: &str,
    target: &str,
    http: &HttpClient,
    history: &History,
    rng: &mut StdRng,
) {
    let start = Instant::now();
    let mut holder = Holder::start(etcd, dir, who, key);
    let deadline = start + Duration::from_secs(15);
    let token = loop {
        if let Some((token, _)) = holder.held() {
            break token;
        }
        if Instant::now() >= deadline {
            let why = "not held within 15 s".to_string();
            history.record(worker, start, Kind::Acquire { key: key.into(), token: None }, Outcome::Unknown { why });
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    history.record(worker, start, Kind::Acquire { key: key.into(), token: Some(token) }, Outcome::Ok);
    let mut valid_until = None;
    for _ in 0..WRITES {
        if valid_until.is_none() && rng.random_bool(PAUSE) {
            // Valid at most until the pause began: its keepalives stop.
            valid_until = Some(Instant::now());
            holder.proc.signal(Signal::SIGSTOP);
            tokio::time::sleep(Duration::from_millis(LOCK_TTL_S * 1500)).await;
            holder.proc.signal(Signal::SIGCONT);
        }
        let start = Instant::now();
        let outcome = workload::send_write(http, target, worker, key, token).await;
        let stale = valid_until.is_some();
        history.record(worker, start, Kind::Write { key: key.into(), token, stale }, outcome);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
    }
    let end = valid_until.unwrap_or_else(Instant::now);
    history.record(worker, end, Kind::ValidUntil { key: key.into(), token }, Outcome::Ok);
    holder.release();
    let released = holder.proc.exit_within(Duration::from_secs(5)).await;
    let outcome = match released {
        Some(_) => Outcome::Ok,
        None => Outcome::Unknown { why: "etcdctl lock did not exit within 5 s".into() },
    };
    history.record(worker, Instant::now(), Kind::Release { key: key.into(), token }, outcome);
}

/// etcd's revision now: above every grant made so far.
fn revision(etcd: &Etcd) -> u64 {
    let out = etcd.etcdctl().args(["get", "none", "-w", "json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["header"]["revision"].as_u64().unwrap()
}

/// Both arms at once on one etcd: 0 violations through the sidecar; the
/// control arm shows the paused holders' writes out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_etcd_lock_holders_write_nothing_stale_through_the_sidecar() {
    let seed = std::env::var("ETCD_TORTURE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x3e7c_d011);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let etcd = Arc::new(Etcd::start(dir.path()));
    etcd.ready().await;
    let (up, control_up) = (Upstream::start().await, Upstream::start().await);
    let sc = sidecar_with(&etcd, &up, &dir.path().join("sc"), "", CACHED).await;
    let (with, without) = (Arc::new(History::new()), Arc::new(History::new()));
    tokio::join!(
        run(etcd.clone(), dir.path(), sc.url(), "s", seed, with.clone()),
        run(etcd.clone(), dir.path(), control_up.url(), "c", seed, without.clone()),
    );

    // etcd's latest revision is above every grant: of durability, only
    // "no acknowledged token refused as unknown" applies.
    let latest: BTreeMap<String, u64> = keys("s").into_iter().map(|k| (k, revision(&etcd))).collect();
    let ops = with.ops();
    let (window, window_ms) =
        checker::stale_window(&ops, &workload::applied_at(&up, &keys("s"), &with), MAX_STALENESS_MS + APPLY_MARGIN_MS);
    let reports = vec![
        checker::upstream_order(&workload::applied(&up, &keys("s"))),
        checker::token_order(&ops),
        checker::durability(&ops, &latest),
        checker::exclusion(&ops),
        window,
    ];
    let with =
        Arm { name: "sidecar on etcd", history: with, faults: BTreeMap::<&str, usize>::new(), reports, window_ms };
    let (_, control_window) = checker::stale_window(
        &without.ops(),
        &workload::applied_at(&control_up, &keys("c"), &without),
        MAX_STALENESS_MS,
    );
    let without = Arm {
        name: "control (no sidecar)",
        reports: vec![checker::upstream_order(&workload::applied(&control_up, &keys("c")))],
        history: without,
        faults: BTreeMap::new(),
        window_ms: control_window,
    };
    println!("{}", summary::table("etcd torture", &[&with, &without], seed));
    let replay = summary::Replay {
        suite: "etcd-torture",
        seed,
        seed_var: "ETCD_TORTURE_SEED",
        dir: env!("CARGO_TARGET_TMPDIR"),
    };
    let failures = summary::failures(&replay, &with, &without);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    let stale_sent = ops.iter().filter(|op| matches!(op.kind, Kind::Write { stale: true, .. })).count();
    assert!(stale_sent > 0, "no holder paused: the run tested nothing");
}
