//! The sidecar on each lock service it stands on, side by side in one run:
//! strict, cached, `PUT /racks/1` with the live holder's token, through a
//! sidecar on fencegate's own 3-node cluster, through one on a 3-member
//! etcd (`lock_service.kind: etcd`, the lock held by a real `etcdctl
//! lock`) and through one on a 3-server ZooKeeper ensemble
//! (`lock_service.kind: zookeeper`, the lock held by a real kazoo `Lock`
//! on znode `/rack/1`, its token the czxid of the holder's znode). One
//! upstream; interleaved per repetition (the order rotates), so drift hits
//! all three alike. For reference, what taking a lock costs on each: one
//! client, `CYCLES` acquire + release in a row of an uncontended lock,
//! by fencegate's client, by fencegate's client on etcd's recipe (the
//! JSON gateway; etcd's own gRPC `Lock` is in `lock_vs_etcd`) and by kazoo
//! (timed inside its Python process).
//!
//! Run: `cargo bench --bench backends`, with etcd and etcdctl on PATH,
//! Debian's zookeeper installed and a Python with kazoo in target/ci-venv
//! (or FENCEGATE_KAZOO_PYTHON): `bash .ci/lockservices` installs all of
//! them, and `bench/run backends` runs it. Env: BENCH_SECONDS (5),
//! BENCH_REPS (3), BENCH_CONNECTIONS (32), BENCH_RATE (5000, for the latency
//! phase). Writes bench/results/backends.{md,json}.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::load::MakeRequest;
use common::pair::{self, Settings};
use common::report::{self, Spread};
use common::{fenced_options, fenced_sidecar, fencegate_bin, fencegate_cluster};
use fencegate_client::AcquireOptions;
use fencegate_testkit::http::fenced_put;
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::upstream::{Recording, Upstream};
use fencegate_testkit::zookeeper::ZooKeeper;
use fencegate_testkit::{etcd, zookeeper, Sidecar};

/// Acquire + release cycles per lock service, for reference.
const CYCLES: usize = 200;

/// A lock service's sidecar against the one on fencegate's own cluster.
struct Versus {
    name: &'static str,
    /// Closed-loop throughput ÷ fencegate's: of the medians, per repetition.
    ratio: f64,
    per_rep: Vec<f64>,
    /// p99 at the fixed rate ÷ fencegate's (of the medians).
    p99: f64,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let s = Settings::from_env();
    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let upstream_url = format!("http://127.0.0.1:{}", upstream.port);
    let cluster = fencegate_cluster("").await;
    let on_fencegate = fenced_sidecar(&cluster, "sidecar-on-fencegate", upstream.port, "cached").await;

    let etcd = common::etcd::start_etcd();
    // Its data on the project's disk too, as etcd's and the cluster's.
    let zk = ZooKeeper::start(Path::new(env!("CARGO_TARGET_TMPDIR")));
    etcd.ready().await;
    zk.ready().await;
    let options = |lock_service: Vec<String>, kind: &str| SidecarOptions {
        lock_service,
        lock_service_yaml: format!("  kind: {kind}\n"),
        ..fenced_options("cached", false)
    };
    let (etcd_dir, zk_dir) = (etcd.dir.path(), zk.dir.path());
    let etcd_urls = etcd.urls.values().cloned().collect();
    let on_etcd = Sidecar::start_with(
        &fencegate_bin(),
        etcd_dir.join("sidecar-on-etcd"),
        &upstream_url,
        options(etcd_urls, "etcd"),
    )
    .await;
    let zk_hosts = zk.hosts().split(',').map(str::to_string).collect();
    let on_zk = Sidecar::start_with(
        &fencegate_bin(),
        zk_dir.join("sidecar-on-zookeeper"),
        &upstream_url,
        options(zk_hosts, "zookeeper"),
    )
    .await;

    let lease = cluster.client().acquire("rack/1", AcquireOptions::new(Duration::from_secs(600))).await.unwrap();
    let etcd_holder = etcd::Holder::start(&etcd, etcd_dir, "bench-holder", "rack/1");
    // Lock key `rack/1` is znode `/rack/1` on ZooKeeper.
    let zk_holder = zookeeper::Holder::start(&zk, zk_dir, "bench-holder", "/rack/1");
    let token = lease.token();
    let (etcd_token, _) = etcd_holder.token().await;
    let zk_token = zk_holder.token().await;
    let makes: [MakeRequest; 3] = [
        Arc::new(move |_| fenced_put("/racks/1", token)),
        Arc::new(move |_| fenced_put("/racks/1", etcd_token)),
        Arc::new(move |_| fenced_put("/racks/1", zk_token)),
    ];
    let names = ["on fencegate", "on etcd", "on ZooKeeper"];
    let p = pair::compare(names, [on_fencegate.port, on_etcd.port, on_zk.port], makes, &s).await;
    lease.release().await.unwrap();
    etcd_holder.release();
    zk_holder.release();
    let fencegate_client = cluster.client();
    let on_etcd_client = fencegate_client::Client::new(etcd.urls.values().cloned().collect()).unwrap();
    let ttl = Duration::from_secs(10);
    let acquire = [
        cycles(|| async {
            fencegate_client.acquire("cost/1", AcquireOptions::new(ttl)).await.unwrap().release().await.unwrap();
        })
        .await,
        cycles(|| async {
            on_etcd_client.acquire_etcd("cost/1", ttl, Duration::ZERO).await.unwrap().release().await.unwrap();
        })
        .await,
        kazoo_cycles(&zk).await,
    ];

    let versus: Vec<Versus> = (1..names.len())
        .map(|i| {
            let (ratio, per_rep) = p.ratios_to_first(i);
            Versus { name: names[i], ratio, per_rep, p99: p.p99_to_first(i) }
        })
        .collect();
    let each = |show: fn(&Versus) -> String| {
        versus.iter().map(|v| format!("{} {}", v.name, show(v))).collect::<Vec<_>>().join(", ")
    };
    let throughput = each(|v| format!("{:.3}", v.ratio));
    let per_rep = each(|v| Spread::of(&v.per_rep).show(3));
    let p99 = each(|v| format!("{:.3}", v.p99));
    let markdown = format!(
        "3 fencegate nodes, 3 etcd 3.4 members and 3 ZooKeeper 3.8 servers on loopback, fsync on; one upstream. \
         Strict, cached, `PUT /racks/1` with the live holder's token (fencegate: a lease's; etcd: the create \
         revision of an `etcdctl lock rack/1` holder's key; ZooKeeper: the czxid of a kazoo `Lock` holder's znode \
         under `/rack/1`), {} keep-alive connections; BENCH_REPS={}, BENCH_SECONDS={} per phase; median \
         (min–max).\n\n{}\n\
         Throughput ÷ on fencegate: {throughput} (ratios of medians); per repetition {per_rep}. \
         p99 at {}/s ÷ on fencegate: {p99}.\n\n\
         Taking the lock itself, for reference: one client, {CYCLES} acquire + release in a row of an \
         uncontended lock (fencegate: its client; etcd: fencegate's client on `etcdctl lock`'s recipe through the \
         JSON gateway, etcd's gRPC `Lock` being in bench/results/lock_vs_etcd.md; ZooKeeper: kazoo's `Lock`, \
         timed in its Python process): p50 / p99 µs: {}.\n",
        s.connections,
        s.reps,
        s.seconds.as_secs(),
        p.table(s.rate),
        s.rate,
        names
            .iter()
            .zip(&acquire)
            .map(|(n, (p50, p99))| format!("{n} {p50:.0} / {p99:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let vs_fencegate: serde_json::Map<String, serde_json::Value> = versus
        .iter()
        .map(|v| (v.name.into(), serde_json::json!({ "ratio": v.ratio, "per_rep": v.per_rep, "p99_ratio": v.p99 })))
        .collect();
    let json = serde_json::json!({
        "names": names,
        "rps": p.rps,
        "p50_us": p.p50,
        "p99_us": p.p99,
        "vs_fencegate": vs_fencegate,
        "acquire_release_us": names.iter().zip(&acquire).map(|(n, (p50, p99))| (n.to_string(), serde_json::json!({ "p50": p50, "p99": p99 }))).collect::<serde_json::Map<_, _>>(),
    });
    report::write("backends", "The sidecar on fencegate, on etcd and on ZooKeeper", &markdown, json);
}

/// p50 and p99 in µs of `CYCLES` runs of `cycle`, one after another.
async fn cycles<F, Fut>(cycle: F) -> (f64, f64)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut us = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let start = std::time::Instant::now();
        cycle().await;
        us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    percentiles(us)
}

/// The same with kazoo's `Lock` on one session, timed in Python.
async fn kazoo_cycles(zk: &ZooKeeper) -> (f64, f64) {
    let code = format!(
        "import time\nlock = zk.Lock('/cost/1')\nfor _ in range({CYCLES}):\n    t = time.perf_counter()\n    \
         lock.acquire()\n    lock.release()\n    print((time.perf_counter() - t) * 1e6)"
    );
    percentiles(zk.kazoo(&code).await.lines().map(|l| l.trim().parse().unwrap()).collect())
}

fn percentiles(mut us: Vec<f64>) -> (f64, f64) {
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}
