//! What the sidecar's hardening costs: the same fenced load (strict, cached,
//! `PUT /racks/1` with a live token) through two sidecars side by side in
//! one run, on one cluster and one upstream: this build's, and an earlier
//! build's (`BENCH_BASELINE_BIN`, a `fencegate` binary). Interleaved per
//! repetition so drift hits both alike.
//!
//! Run: build the baseline, e.g.
//! `git worktree add /tmp/base <rev> && (cd /tmp/base && CARGO_TARGET_DIR=target/baseline cargo build --release)`,
//! then `BENCH_BASELINE_BIN=target/baseline/release/fencegate cargo bench --bench hardening`.
//! Env: BENCH_SECONDS (5), BENCH_REPS (3), BENCH_CONNECTIONS (32), BENCH_RATE
//! (5000, for the latency phase). Writes bench/results/hardening.{md,json}.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::load::{self, MakeRequest};
use common::report::{self, Spread, Table};
use common::{env_or, fenced_sidecar, fenced_sidecar_of, fencegate_cluster};
use fencegate_client::AcquireOptions;
use fencegate_testkit::http::fenced_put;
use fencegate_testkit::upstream::{Recording, Upstream};
use fencegate_testkit::Bin;
use serde_json::json;

const SIDECARS: [&str; 2] = ["before (baseline build)", "after (this build)"];

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Ok(baseline) = std::env::var("BENCH_BASELINE_BIN") else {
        eprintln!("hardening: set BENCH_BASELINE_BIN to an earlier build's fencegate binary (see bench/hardening.rs)");
        return;
    };
    let seconds = Duration::from_secs(env_or("BENCH_SECONDS", 5));
    let reps: usize = env_or("BENCH_REPS", 3);
    let connections: usize = env_or("BENCH_CONNECTIONS", 32);
    let rate: u64 = env_or("BENCH_RATE", 5000);

    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let cluster = fencegate_cluster("").await;
    let before = fenced_sidecar_of(&Bin::new(&baseline), &cluster, "sidecar-before", upstream.port, "cached").await;
    let after = fenced_sidecar(&cluster, "sidecar-after", upstream.port, "cached").await;
    let ports = [before.port, after.port];
    let lease = cluster.client().acquire("rack/1", AcquireOptions::new(Duration::from_secs(600))).await.unwrap();
    let token = lease.token();
    let make: MakeRequest = Arc::new(move |_| fenced_put("/racks/1", token));
    for (name, port) in SIDECARS.iter().zip(ports) {
        let run = load::closed_loop(port, 4, Duration::from_secs(1), make.clone()).await;
        assert!(run.ok > 0 && run.errors == 0, "warm-up failed {name}: {} errors", run.errors);
    }

    let mut rps = [vec![], vec![]];
    let mut p50 = [vec![], vec![]];
    let mut p99 = [vec![], vec![]];
    for rep in 1..=reps {
        // Alternate which goes first.
        let order = if rep % 2 == 0 { [1, 0] } else { [0, 1] };
        for i in order {
            eprintln!("rep {rep}/{reps}: {}", SIDECARS[i]);
            let run = load::closed_loop(ports[i], connections, seconds, make.clone()).await;
            assert_eq!(run.errors, 0, "{}", SIDECARS[i]);
            rps[i].push(run.rate());
            let run = load::fixed_rate(ports[i], connections, rate as f64, seconds, make.clone()).await;
            p50[i].push(run.us(0.5));
            p99[i].push(run.us(0.99));
        }
    }
    lease.release().await.unwrap();

    let med = |v: &[f64]| Spread::of(v).median;
    let ratio = med(&rps[1]) / med(&rps[0]);
    let mut t =
        Table::new(&["sidecar", "closed loop req/s", &format!("p50 µs @{rate}/s"), &format!("p99 µs @{rate}/s")]);
    for i in 0..2 {
        let row = [
            SIDECARS[i].to_string(),
            Spread::of(&rps[i]).show(0),
            Spread::of(&p50[i]).show(0),
            Spread::of(&p99[i]).show(0),
        ];
        t.row(&row);
    }
    let per_rep: Vec<f64> = rps[1].iter().zip(&rps[0]).map(|(a, b)| a / b).collect();
    let markdown = format!(
        "Baseline: {baseline}.\n\nStrict, cached, `PUT /racks/1` with a live token, {connections} keep-alive connections; \
         BENCH_REPS={reps}, BENCH_SECONDS={} per phase; median (min–max).\n\n{}\n\
         Throughput after ÷ before: {ratio:.3} (ratio of medians); per repetition {} (target: ≥ 0.97).\n",
        seconds.as_secs(),
        t.markdown(),
        Spread::of(&per_rep).show(3),
    );
    let json = json!({ "rps": rps, "p50_us": p50, "p99_us": p99, "ratio": ratio, "per_rep": per_rep });
    report::write("hardening", "Sidecar hardening: before vs after", &markdown, json);
}
