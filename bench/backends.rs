//! The sidecar on each lock service it stands on, side by side in one run:
//! strict, cached, `PUT /racks/1` with the live holder's token, through a
//! sidecar on fencegate's own 3-node cluster and through one on a 3-member
//! etcd (`lock_service.kind: etcd`, the lock held by a real `etcdctl
//! lock`). One upstream; interleaved per repetition, so drift hits both
//! alike. What taking a lock costs on each service is `lock_vs_etcd`'s
//! (bench/anchors), named in the results for reference.
//!
//! Run: `cargo bench --bench backends` (etcd and etcdctl on PATH:
//! `bench/run backends` installs them). Env: BENCH_SECONDS (5), BENCH_REPS
//! (3), BENCH_CONNECTIONS (32), BENCH_RATE (5000, for the latency phase).
//! Writes bench/results/backends.{md,json}.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::load::MakeRequest;
use common::pair::{self, Settings};
use common::report::{self, Spread};
use common::{fenced_options, fenced_sidecar, fencegate_bin, fencegate_cluster};
use fencegate_client::AcquireOptions;
use fencegate_testkit::etcd::Holder;
use fencegate_testkit::http::fenced_put;
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::upstream::{Recording, Upstream};
use fencegate_testkit::Sidecar;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let s = Settings::from_env();
    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let cluster = fencegate_cluster("").await;
    let on_fencegate = fenced_sidecar(&cluster, "sidecar-on-fencegate", upstream.port, "cached").await;
    let etcd = common::etcd::start_etcd();
    etcd.ready().await;
    let options = SidecarOptions {
        lock_service: etcd.urls.values().cloned().collect(),
        lock_service_yaml: "  kind: etcd\n".into(),
        ..fenced_options("cached", false)
    };
    let dir = etcd.dir.path();
    let upstream_url = format!("http://127.0.0.1:{}", upstream.port);
    let on_etcd = Sidecar::start_with(&fencegate_bin(), dir.join("sidecar-on-etcd"), &upstream_url, options).await;

    let lease = cluster.client().acquire("rack/1", AcquireOptions::new(Duration::from_secs(600))).await.unwrap();
    let holder = Holder::start(&etcd, dir, "bench-holder", "rack/1");
    let token = lease.token();
    let (etcd_token, _) = holder.token().await;
    let makes: [MakeRequest; 2] =
        [Arc::new(move |_| fenced_put("/racks/1", token)), Arc::new(move |_| fenced_put("/racks/1", etcd_token))];
    let names = ["on fencegate", "on etcd"];
    let p = pair::compare(names, [on_fencegate.port, on_etcd.port], makes, &s).await;
    lease.release().await.unwrap();
    holder.release();

    let (ratio, per_rep) = p.ratios();
    let med = |v: &[f64]| Spread::of(v).median;
    let markdown = format!(
        "3 fencegate nodes and 3 etcd 3.4 members on loopback, fsync on; one upstream. Strict, cached, `PUT \
         /racks/1` with the live holder's token (fencegate: a lease's; etcd: the create revision of an `etcdctl \
         lock rack/1` holder's key), {} keep-alive connections; BENCH_REPS={}, BENCH_SECONDS={} per phase; \
         median (min–max).\n\n{}\n\
         Throughput on etcd ÷ on fencegate: {ratio:.3} (ratio of medians); per repetition {}. \
         p99 at {}/s on etcd ÷ on fencegate: {:.3}.\n\n\
         Taking the lock itself (single client, acquire + release p50) is measured by `lock_vs_etcd` \
         (bench/results/lock_vs_etcd.md): fencegate's own beside etcd's gRPC `Lock` and its JSON gateway.\n",
        s.connections,
        s.reps,
        s.seconds.as_secs(),
        p.table(s.rate),
        Spread::of(&per_rep).show(3),
        s.rate,
        med(&p.p99[1]) / med(&p.p99[0]),
    );
    report::write("backends", "The sidecar on fencegate and on etcd", &markdown, p.json());
}
