//! The torture workload on ZooKeeper: workers take real kazoo `Lock`s
//! (`Holder`, a python process each) on a few lock znodes, write through a
//! `cached` sidecar (`max_staleness` 1 s) with their znode's czxid, and now
//! and then pause (SIGSTOP of the holder) past its session, so that a
//! waiter takes the lock over, then go on writing with the old token, as a
//! paused holder would. The torture suite's checker judges the history
//! (`fencegate_testkit::verify`); a control arm runs the same workload
//! straight to its upstream and must show out-of-order writes. Seeded
//! (`ZOOKEEPER_TORTURE_SEED`) and bounded (`SECONDS` of workload per arm and
//! at most `ROUNDS` locks per worker, both arms at once on one ensemble,
//! each on its own lock znodes).

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
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{sidecar, Holder, ZooKeeper, CACHED, SESSION_TIMEOUT_S};

const SECONDS: u64 = 20;
/// Locks a worker takes at most: each is a python process, and a paused
/// one holds its lock for a whole session.
const ROUNDS: usize = 8;
const WORKERS: usize = 4;
const KEYS: usize = 2;
const WRITES: usize = 4;
const PAUSE: f64 = 0.25;

fn keys(arm: &str) -> Vec<String> {
    (0..KEYS).map(|i| format!("rack/{arm}{i}")).collect()
}

/// Every worker of one arm, writing to `target`, until `until` (or
/// `ROUNDS` locks each).
async fn run(zk: Arc<ZooKeeper>, dir: &Path, target: String, arm: &'static str, seed: u64, history: Arc<History>) {
    let until = Instant::now() + Duration::from_secs(SECONDS);
    let mut tasks = vec![];
    for worker in 0..WORKERS {
        let (zk, dir, target, history) = (zk.clone(), dir.to_path_buf(), target.clone(), history.clone());
        let mut rng = StdRng::seed_from_u64(seed ^ (worker as u64).wrapping_mul(0x9e37_79b9));
        tasks.push(tokio::spawn(async move {
            let http = HttpClient::new(1 << 20);
            for round in 0..ROUNDS {
                if Instant::now() >= until {
                    break;
                }
                let key = format!("rack/{arm}{}", rng.random_range(0..KEYS));
                let who = format!("{arm}-w{worker}-r{round}");
                one_round(&zk, &dir, &who, worker, &key, &target, &http, &history, &mut rng).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Lock `key` (znode `/key`) with kazoo's `Lock`, write `WRITES` times with
/// its token (pausing past the session now and then), release.
#[allow(clippy::too_many_arguments)]
async fn one_round(
    zk: &ZooKeeper,
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
    let mut holder = Holder::start(zk, dir, who, &format!("/{key}"));
    let deadline = start + Duration::from_secs(15);
    let token = loop {
        if let Some(token) = holder.held() {
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
            // Valid at most until the pause began: its heartbeats stop, and
            // ZooKeeper expires its session (and deletes its znode) within
            // a tick of `SESSION_TIMEOUT_S` later.
            valid_until = Some(Instant::now());
            holder.proc.freeze(true);
            tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_S * 1500)).await;
            holder.proc.freeze(false);
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
        None => Outcome::Unknown { why: "the kazoo holder did not exit within 5 s".into() },
    };
    history.record(worker, Instant::now(), Kind::Release { key: key.into(), token }, outcome);
}

/// A zxid above every grant made so far: the czxid of a znode made now
/// (ephemeral, gone with the script's session).
async fn zxid_now(zk: &ZooKeeper) -> u64 {
    let code = "print(zk.exists(zk.create('/torture-now-', ephemeral=True, sequence=True)).czxid)";
    zk.kazoo(code).await.trim().parse().unwrap()
}

/// Both arms at once on one ensemble: 0 violations through the sidecar;
/// the control arm shows the paused holders' writes out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_zookeeper_lock_holders_write_nothing_stale_through_the_sidecar() {
    let seed = std::env::var("ZOOKEEPER_TORTURE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x200c_ee9e);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let zk = Arc::new(ZooKeeper::start(dir.path()));
    zk.ready().await;
    let (up, control_up) = (Upstream::start().await, Upstream::start().await);
    let sc = sidecar(&zk, &up, &dir.path().join("sc"), "", CACHED).await;
    let (with, without) = (Arc::new(History::new()), Arc::new(History::new()));
    tokio::join!(
        run(zk.clone(), dir.path(), sc.url(), "s", seed, with.clone()),
        run(zk.clone(), dir.path(), control_up.url(), "c", seed, without.clone()),
    );

    // A zxid made now is above every grant: of durability, only "no
    // acknowledged token refused as unknown" applies.
    let now = zxid_now(&zk).await;
    let latest: BTreeMap<String, u64> = keys("s").into_iter().map(|k| (k, now)).collect();
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
        Arm { name: "sidecar on ZooKeeper", history: with, faults: BTreeMap::<&str, usize>::new(), reports, window_ms };
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
    println!("{}", summary::table("ZooKeeper torture", &[&with, &without], seed));
    let replay = summary::Replay {
        suite: "zookeeper-torture",
        seed,
        seed_var: "ZOOKEEPER_TORTURE_SEED",
        dir: env!("CARGO_TARGET_TMPDIR"),
    };
    let failures = summary::failures(&replay, &with, &without);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    let stale_sent = ops.iter().filter(|op| matches!(op.kind, Kind::Write { stale: true, .. })).count();
    assert!(stale_sent > 0, "no holder paused: the run tested nothing");
    // A paused holder's write refused for a newer holder's token: a waiter
    // took its lock over while it was paused.
    let taken_over = ops.iter().any(|op| match (&op.kind, &op.outcome) {
        (Kind::Write { stale: true, .. }, Outcome::Refused { error, .. }) => error == "stale_token",
        _ => false,
    });
    assert!(taken_over, "no paused holder's lock was taken over: the run tested nothing");
}
