//! The torture workload on etcd (`fencegate_testkit::verify::recipe`):
//! workers take real `etcdctl lock`s on a few lock names, write through a
//! `cached` sidecar (`max_staleness` 1 s) with the holder key's create
//! revision, and now and then pause their `etcdctl lock` past the lease's
//! TTL, then go on writing with the old token. A control arm runs the same
//! workload straight to its upstream and must show out-of-order writes.
//! Seeded (`ETCD_TORTURE_SEED`) and bounded (`SECONDS` of workload per arm,
//! both arms at once on one etcd, each on its own lock names).

use std::sync::Arc;
use std::time::Duration;

use fencegate_testkit::verify::recipe::{self, Plan, Suite};
use fencegate_testkit::Upstream;

use super::{sidecar_with, Etcd, Holder, CACHED, LOCK_TTL_S};

const PLAN: Plan = Plan {
    seconds: 20,
    rounds: usize::MAX,
    workers: 4,
    keys: 2,
    writes: 4,
    pause: 0.25,
    pause_for: Duration::from_millis(LOCK_TTL_S * 1500),
};

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
    let suite = Suite {
        name: "etcd-torture",
        service: "etcd",
        arm: "sidecar on etcd",
        seed,
        seed_var: "ETCD_TORTURE_SEED",
        dir: env!("CARGO_TARGET_TMPDIR"),
        sidecar_url: sc.url(),
    };
    let (root, e) = (dir.path().to_path_buf(), etcd.clone());
    let start = move |who: &str, key: &str| Holder::start(&e, &root, who, key);
    let arm = |arm, target, history| recipe::run(PLAN, start.clone(), target, arm, seed, history);
    recipe::judge(&suite, &PLAN, (&up, &control_up), arm, async { revision(&etcd) }).await;
}
