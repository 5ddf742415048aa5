//! Spurious elections under load with the default Raft timings: a 3-node
//! cluster, no fault, client-library workers acquiring and releasing back
//! to back (both cores busy), for BENCH_SECONDS (600). Every node's term and
//! leader are sampled every 100 ms: a term that moves is a campaign, a
//! leader that changes is an election someone won. With no fault both
//! should stay 0.
//!
//! The control arm runs the same load on a fresh cluster for
//! BENCH_CONTROL_SECONDS (30) and SIGSTOPs the leader for 2 s in the middle:
//! the same counters must see that election, or they could not see any.
//!
//! Run: `cargo bench --bench elections` (BENCH_NODE_YAML, appended to every
//! node's config, tries other settings). Writes bench/results/elections.{md,json}.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::report::{self, Table};
use fencegate_client::AcquireOptions;
use fencegate_testkit::Cluster;
use serde_json::json;
use tokio::time::Instant;

const WORKERS: usize = 64;
const SAMPLE: Duration = Duration::from_millis(100);

/// What one run saw.
#[derive(Debug, Default, serde::Serialize)]
struct Seen {
    seconds: f64,
    pairs: u64,
    failed: u64,
    /// How far the highest term moved after the first leader.
    term_moves: u64,
    /// Distinct leaders after the first one, in order of appearance.
    leader_changes: u64,
    samples: u64,
}

/// Load `c` for `length`; `fault` runs beside it (the control arm's pause).
async fn run(c: &Cluster, length: Duration, fault: impl std::future::Future<Output = ()>) -> Seen {
    let start = c.wait_for_leader(Duration::from_secs(20)).await;
    let first_term = c.cluster_info(start).await.unwrap().term;
    let until = Instant::now() + length;
    let (pairs, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (client, pairs, failed) = (c.client(), pairs.clone(), failed.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    n += 1;
                    let key = format!("elections/{w}/{}", n % 16);
                    let ok = match client.acquire(&key, AcquireOptions::new(Duration::from_secs(10))).await {
                        Ok(lease) => lease.release().await.is_ok(),
                        Err(_) => false,
                    };
                    let counter = if ok { &pairs } else { &failed };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let watch = async {
        let (mut top, mut leaders, mut last_leader, mut samples) = (first_term, 0u64, start, 0u64);
        let mut next_report = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            for id in c.ids() {
                let Some(info) = c.cluster_info(id).await else { continue };
                top = top.max(info.term);
                if let Some(l) = info.leader.filter(|l| *l != last_leader) {
                    leaders += 1;
                    last_leader = l;
                    eprintln!("  node {id} sees a new leader {l} (term {})", info.term);
                }
            }
            samples += 1;
            if Instant::now() >= next_report {
                let left = until.saturating_duration_since(Instant::now()).as_secs();
                eprintln!("  {} pairs, term +{}, {left} s to go", pairs.load(Ordering::Relaxed), top - first_term);
                next_report += Duration::from_secs(60);
            }
            tokio::time::sleep(SAMPLE).await;
        }
        (top - first_term, leaders, samples)
    };
    let ((term_moves, leader_changes, samples), ()) = tokio::join!(watch, fault);
    for w in workers {
        w.await.unwrap();
    }
    Seen {
        seconds: length.as_secs_f64(),
        pairs: pairs.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        term_moves,
        leader_changes,
        samples,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let seconds: u64 = common::env_or("BENCH_SECONDS", 600);
    let control_seconds: u64 = common::env_or("BENCH_CONTROL_SECONDS", 30);
    let yaml = std::env::var("BENCH_NODE_YAML").unwrap_or_default();

    eprintln!("no fault, default timings, {seconds} s");
    let c = common::fencegate_cluster(&yaml).await;
    let quiet = run(&c, Duration::from_secs(seconds), async {}).await;
    drop(c);

    eprintln!("control: the leader SIGSTOPped for 2 s, {control_seconds} s");
    let c = common::fencegate_cluster(&yaml).await;
    let pause = async {
        tokio::time::sleep(Duration::from_secs(control_seconds / 2)).await;
        let leader = c.wait_for_leader(Duration::from_secs(5)).await;
        c.freeze(leader, true);
        tokio::time::sleep(Duration::from_secs(2)).await;
        c.freeze(leader, false);
    };
    let control = run(&c, Duration::from_secs(control_seconds), pause).await;
    drop(c);

    let headers = ["run", "seconds", "acquire+release pairs/s", "failed", "samples", "term moves", "leader changes"];
    let mut t = Table::new(&headers);
    for (name, s) in [("no fault (the result)", &quiet), ("control: leader paused 2 s", &control)] {
        t.row(&[
            name.into(),
            format!("{:.0}", s.seconds),
            format!("{:.0}", s.pairs as f64 / s.seconds),
            s.failed.to_string(),
            s.samples.to_string(),
            s.term_moves.to_string(),
            s.leader_changes.to_string(),
        ]);
    }
    let verdict = match (quiet.term_moves, control.leader_changes) {
        (_, 0) => "the control arm saw no election: the counters are broken, the result means nothing".to_string(),
        (0, _) => "no spurious election under load; the control arm's pause was seen".to_string(),
        (n, _) => format!("{n} term moves without a fault: spurious elections"),
    };
    let markdown = format!(
        "3 nodes, default Raft timings (heartbeat 50 ms, election timeout 100–250 ms), {WORKERS} client-library \
         workers acquiring and releasing back to back; every node's term and leader sampled every {} ms.\n\n\
         {}\n{verdict}.\n",
        SAMPLE.as_millis(),
        t.markdown()
    );
    report::write(
        "elections",
        "Spurious elections under load",
        &markdown,
        json!({"no_fault": quiet, "control": control}),
    );
}
