//! What idempotency keys cost (I1): the same fenced writes (strict, cached,
//! `PUT /racks/1` with a live token) through two sidecars side by side in
//! one run, on one cluster and one upstream: one whose route has
//! `idempotency` (every request a new key, so every one makes a pending
//! record and keeps its answer: two durable writes, batched), one without.
//!
//! Run: `cargo bench --bench idempotency` (beside `bench/run`, like `hardening`). Env:
//! BENCH_SECONDS (5), BENCH_REPS (3), BENCH_CONNECTIONS (32), BENCH_RATE
//! (5000, for the latency phase). Writes bench/results/idempotency.{md,json}.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::load::MakeRequest;
use common::pair::{self, Settings};
use common::report::{self, Spread};
use fencegate_client::AcquireOptions;
use fencegate_testkit::http::fenced_put;
use fencegate_testkit::upstream::{Recording, Upstream};

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let s = Settings::from_env();
    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let cluster = common::fencegate_cluster("").await;
    let url = format!("http://127.0.0.1:{}", upstream.port);
    let plain = cluster.sidecar_with("sidecar-plain", &url, common::fenced_options("cached", false)).await;
    let keyed = cluster.sidecar_with("sidecar-keyed", &url, common::fenced_options("cached", true)).await;
    let lease = cluster.client().acquire("rack/1", AcquireOptions::new(Duration::from_secs(600))).await.unwrap();
    let token = lease.token();
    let without: MakeRequest = Arc::new(move |_| fenced_put("/racks/1", token));
    let with = common::keyed_puts(token);
    let names = ["without keys", "with a new key on every write"];
    let p = pair::compare(names, [plain.port, keyed.port], [without, with], &s).await;
    lease.release().await.unwrap();

    let (ratio, per_rep) = p.ratios();
    let p99 = Spread::of(&p.p99[1]).median / Spread::of(&p.p99[0]).median;
    let markdown = format!(
        "Strict, cached, `PUT /racks/1` with a live token, {} keep-alive connections; BENCH_REPS={}, \
         BENCH_SECONDS={} per phase; median (min–max).\n\n{}\n\
         Throughput with ÷ without: {ratio:.3} (ratio of medians); per repetition {} (target: ≥ 0.8). \
         p99 with ÷ without: {p99:.2} (target: ≤ 2).\n",
        s.connections,
        s.reps,
        s.seconds.as_secs(),
        p.table(s.rate),
        Spread::of(&per_rep).show(3),
    );
    report::write("idempotency", "Idempotency keys: fenced writes with and without", &markdown, p.json());
}
