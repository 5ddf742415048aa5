//! What the sidecar's hardening costs: the same fenced load (strict, cached,
//! `PUT /racks/1` with a live token) through two sidecars side by side in
//! one run, on one cluster and one upstream: this build's, and an earlier
//! build's (`BENCH_BASELINE_BIN`, a `fencegate` binary). Interleaved per
//! repetition so drift hits both alike.
//!
//! Run: build the baseline, e.g.
//! `git worktree add /tmp/base <rev> && (cd /tmp/base && CARGO_TARGET_DIR=target/baseline cargo build --release)`,
//! then `BENCH_BASELINE_BIN=target/baseline/release/fencegate cargo bench --bench hardening`.
//! BENCH_BASELINE_NAME names the baseline in the results (e.g. its commit).
//! Env: BENCH_SECONDS (5), BENCH_REPS (3), BENCH_CONNECTIONS (32), BENCH_RATE
//! (5000, for the latency phase), BENCH_CONSISTENCY (`cached`, or
//! `linearizable`), BENCH_KEYED (`1`: the route keeps idempotency records
//! and every write has a new key: the keyed path). Writes
//! bench/results/hardening.{md,json}.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::load::MakeRequest;
use common::pair::{self, Settings};
use common::report::{self, Spread};
use common::{fenced_options, fenced_sidecar_of, fencegate_bin, fencegate_cluster, keyed_puts};
use fencegate_client::AcquireOptions;
use fencegate_testkit::http::fenced_put;
use fencegate_testkit::upstream::{Recording, Upstream};
use fencegate_testkit::Bin;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Ok(baseline) = std::env::var("BENCH_BASELINE_BIN") else {
        eprintln!("hardening: set BENCH_BASELINE_BIN to an earlier build's fencegate binary (see bench/hardening.rs)");
        return;
    };
    let s = Settings::from_env();
    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let cluster = fencegate_cluster("").await;
    let consistency = std::env::var("BENCH_CONSISTENCY").unwrap_or_else(|_| "cached".into());
    let keyed = std::env::var("BENCH_KEYED").is_ok_and(|k| k == "1");
    let options = || fenced_options(&consistency, keyed);
    let before = fenced_sidecar_of(&Bin::new(&baseline), &cluster, "sidecar-before", upstream.port, options()).await;
    let after = fenced_sidecar_of(&fencegate_bin(), &cluster, "sidecar-after", upstream.port, options()).await;
    let lease = cluster.client().acquire("rack/1", AcquireOptions::new(Duration::from_secs(600))).await.unwrap();
    let token = lease.token();
    let make: MakeRequest = match keyed {
        true => keyed_puts(token),
        false => Arc::new(move |_| fenced_put("/racks/1", token)),
    };
    let names = ["before (baseline build)", "after (this build)"];
    let p = pair::compare(names, [before.port, after.port], [make.clone(), make], &s).await;
    lease.release().await.unwrap();

    let (ratio, per_rep) = p.ratios();
    let markdown = format!(
        "Baseline: {}.\n\nStrict, {consistency}{}, `PUT /racks/1` with a live token, {} keep-alive connections; \
         BENCH_REPS={}, BENCH_SECONDS={} per phase; median (min–max).\n\n{}\n\
         Throughput after ÷ before: {ratio:.3} (ratio of medians); per repetition {} (target: ≥ 0.97).\n",
        // Named, not its path: the results are committed, a machine's paths are not.
        std::env::var("BENCH_BASELINE_NAME").unwrap_or_else(|_| "an earlier build (BENCH_BASELINE_BIN)".into()),
        if keyed { ", a new Idempotency-Key on every write" } else { "" },
        s.connections,
        s.reps,
        s.seconds.as_secs(),
        p.table(s.rate),
        Spread::of(&per_rep).show(3),
    );
    report::write("hardening", "Sidecar hardening: before vs after", &markdown, p.json());
}
