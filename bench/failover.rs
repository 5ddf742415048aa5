//! Failover as clients see it: the longest gap between successful acquires
//! when the leader stops, gracefully (SIGTERM: it hands leadership over
//! first) or with kill -9, alternating on one 3-node cluster with the
//! default Raft timings, BENCH_REPS (5) times each. Four workers acquire
//! fresh keys back to back through the client library (its failover and
//! backoff included); the stopped node is restarted and caught up between
//! runs.
//!
//! Run: `cargo bench --bench failover`. Writes bench/results/failover.{md,json}.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::report::{self, Spread, Table};
use fencegate_client::AcquireOptions;
use tokio::time::Instant;

/// Load before the stop, and how long after it a gap is looked for.
const BEFORE: Duration = Duration::from_millis(1500);
const AFTER: Duration = Duration::from_secs(5);
const WORKERS: usize = 4;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let reps: usize = common::env_or("BENCH_REPS", 5);
    let mut c = common::fencegate_cluster("").await;
    let arms = ["SIGTERM (hands over)", "kill -9"];
    let mut gaps: [Vec<f64>; 2] = [vec![], vec![]];
    for rep in 0..reps {
        for (arm, name) in arms.iter().enumerate() {
            eprintln!("rep {}/{reps}: {name}", rep + 1);
            let leader = c.wait_for_leader(Duration::from_secs(20)).await;
            let successes = Arc::new(Mutex::new(Vec::<Instant>::new()));
            let until = Instant::now() + BEFORE + AFTER;
            let workers: Vec<_> = (0..WORKERS)
                .map(|w| {
                    let (client, successes) = (c.client(), successes.clone());
                    tokio::spawn(async move {
                        let mut n = 0u64;
                        while Instant::now() < until {
                            n += 1;
                            let opts = AcquireOptions::new(Duration::from_secs(2));
                            if let Ok(lease) = client.acquire(&format!("failover/{rep}-{arm}-{w}-{n}"), opts).await {
                                successes.lock().unwrap().push(Instant::now());
                                drop(lease);
                            }
                        }
                    })
                })
                .collect();
            tokio::time::sleep(BEFORE).await;
            let stopped = Instant::now();
            match arm {
                0 => {
                    c.terminate(leader, Duration::from_secs(20)).await;
                }
                _ => c.kill(leader),
            }
            for w in workers {
                w.await.unwrap();
            }
            let mut times = successes.lock().unwrap().clone();
            times.sort();
            // The longest gap between successes from the last one before
            // the signal to the end of the run (which counts as one, so a
            // cluster that never recovers shows the whole window).
            let from = times.iter().rev().find(|t| **t <= stopped).copied().unwrap_or(stopped);
            let mut points: Vec<Instant> = times.into_iter().filter(|t| *t >= from).collect();
            points.push(until);
            let longest = points.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
            gaps[arm].push(longest.as_secs_f64() * 1000.0);
            c.start_node(leader);
            let index = c.cluster_info(c.wait_for_leader(Duration::from_secs(20)).await).await.unwrap().last_log_index;
            c.wait_for_applied(leader, index, Duration::from_secs(20)).await;
        }
    }
    let mut t = Table::new(&["leader stopped by", "longest gap between successful acquires, ms"]);
    for (arm, name) in arms.iter().enumerate() {
        t.row(&[name.to_string(), Spread::of(&gaps[arm]).show(0)]);
    }
    let ratio = Spread::of(&gaps[0]).median / Spread::of(&gaps[1]).median;
    let markdown = format!(
        "3 nodes, default Raft timings, {WORKERS} workers acquiring fresh keys back to back; BENCH_REPS={reps}; \
         median (min–max).\n\n{}\nSIGTERM ÷ kill -9: {ratio:.2} (target for the graceful one: ≤ 300 ms).\n",
        t.markdown()
    );
    let json = serde_json::json!({ "sigterm_ms": gaps[0], "kill_ms": gaps[1] });
    report::write("failover", "Failover: a graceful stop of the leader vs kill -9", &markdown, json);
}
