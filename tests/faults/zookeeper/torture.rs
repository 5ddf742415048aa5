//! The torture workload on ZooKeeper (`fencegate_testkit::verify::recipe`):
//! workers take real kazoo `Lock`s (a python process each) on a few lock
//! znodes, write through a `cached` sidecar (`max_staleness` 1 s) with
//! their znode's czxid, and now and then pause their holder past its
//! session, so that a waiter takes the lock over, then go on writing with
//! the old token. A control arm runs the same workload straight to its
//! upstream and must show out-of-order writes. Seeded
//! (`ZOOKEEPER_TORTURE_SEED`) and bounded (`SECONDS` of workload per arm
//! and at most `rounds` locks per worker, both arms at once on one
//! ensemble, each on its own lock znodes).

use std::sync::Arc;
use std::time::Duration;

use fencegate_testkit::verify::history::{Kind, Outcome};
use fencegate_testkit::verify::recipe::{self, Plan, Suite};
use fencegate_testkit::Upstream;

use super::{sidecar, Holder, ZooKeeper, CACHED, SESSION_TIMEOUT_S};

const PLAN: Plan = Plan {
    seconds: 20,
    // Each lock is a python process, and a paused one holds its lock for a
    // whole session.
    rounds: 8,
    workers: 4,
    keys: 2,
    writes: 4,
    pause: 0.25,
    pause_for: Duration::from_millis(SESSION_TIMEOUT_S * 1500),
};

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
    let suite = Suite {
        name: "zookeeper-torture",
        service: "ZooKeeper",
        arm: "sidecar on ZooKeeper",
        seed,
        seed_var: "ZOOKEEPER_TORTURE_SEED",
        dir: env!("CARGO_TARGET_TMPDIR"),
        sidecar_url: sc.url(),
    };
    let (root, z) = (dir.path().to_path_buf(), zk.clone());
    let start = move |who: &str, key: &str| Holder::start(&z, &root, who, &format!("/{key}"));
    let arm = |arm, target, history| recipe::run(PLAN, start.clone(), target, arm, seed, history);
    let ops = recipe::judge(&suite, &PLAN, (&up, &control_up), arm, zxid_now(&zk)).await;
    // A paused holder's write refused for a newer holder's token: a waiter
    // took its lock over while it was paused.
    let taken_over = ops.iter().any(|op| match (&op.kind, &op.outcome) {
        (Kind::Write { stale: true, .. }, Outcome::Refused { error, .. }) => error == "stale_token",
        _ => false,
    });
    assert!(taken_over, "no paused holder's lock was taken over: the run tested nothing");
}
