//! Scale: the lock service as live leases grow, and the sidecar as fenced keys
//! grow.
//!
//! 1. A 3-node cluster holding 1 → 100,000 live leases on distinct keys (TTL
//!    60 s, one keepalive per lease every 20 s): acquire+release pairs/s with
//!    64 closed-loop clients on other keys, the leader's and the cluster's
//!    RSS, the leader's CPU seconds per 1,000 pairs, how fast each level was
//!    built, and whether the keepalives kept up.
//! 2. One sidecar (strict, cached) over 1 → 10,000 keys, each with a held
//!    lease: closed-loop PUTs spread over all keys; req/s, p50/p99, RSS.
//!
//! Run: `cargo bench --bench scale`. Env: BENCH_SECONDS per measurement
//! (default 5), BENCH_REPS (default 3), BENCH_SCALE_MAX the largest lease
//! level (default 100000), BENCH_SCALE_KEYS_MAX the largest sidecar level
//! (default 10000). Progress goes to stderr; results to
//! bench/results/scale.{md,json}.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::holders::{Holders, TTL};
use common::load::{closed_loop, MakeRequest};
use common::procs::Usage;
use common::report::{mib, Spread, Table};
use common::{env_or, fenced_sidecar, fencegate_cluster, report};
use fencegate::testing::EVENT_MEMORY;
use fencegate::testing::REQUEST_ID_MEMORY;
use fencegate_client::http::HttpClient;
use fencegate_client::{AcquireOptions, Client};
use fencegate_testkit::http::fenced_put;
use fencegate_testkit::upstream::{Recording, Upstream};
use futures_util::{stream, StreamExt};
use hyper::StatusCode;
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;

const PAIR_CLIENTS: usize = 64;
const SIDECAR_CONNECTIONS: usize = 32;
const LEADER_WITHIN: Duration = Duration::from_secs(20);

/// The `defaults` below `max`, then `max`.
fn levels(defaults: &[usize], max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = defaults.iter().copied().filter(|&l| l < max).collect();
    v.push(max);
    v
}

/// 64 clients (client library), each acquiring and releasing its own key
/// back to back for `seconds`: (pairs, failed pairs).
async fn pairs(client: &Client, seconds: u64) -> (u64, u64) {
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = JoinSet::new();
    for w in 0..PAIR_CLIENTS {
        let client = client.clone();
        tasks.spawn(async move {
            let (mut ok, mut failed) = (0, 0);
            while Instant::now() < until {
                let done = match client.acquire(&format!("pairs/{w}"), AcquireOptions::new(TTL)).await {
                    Ok(lease) => lease.release().await.is_ok(),
                    Err(_) => false,
                };
                if done {
                    ok += 1
                } else {
                    failed += 1
                }
            }
            (ok, failed)
        });
    }
    tasks.join_all().await.into_iter().fold((0, 0), |(a, b), (ok, failed)| (a + ok, b + failed))
}

async fn leases_part(live_levels: &[usize], reps: usize, seconds: u64) -> (String, Vec<Value>) {
    let cluster = fencegate_cluster("").await;
    let leader_id = cluster.wait_for_leader(LEADER_WITHIN).await;
    let leader = cluster.url(leader_id);
    let leader_pid = cluster.pid(leader_id);
    // Talk to the leader directly, as a client that found it would.
    let client = Client::new(vec![leader.clone()]).unwrap();
    let mut holders = Holders::new(leader, "scale/");
    // Fill the service's bounded histories first (acquire request ids, and
    // events at two per pair), so that RSS grows between levels because of
    // the live leases, not because of what the earlier levels' pairs left.
    let history = REQUEST_ID_MEMORY.max(EVENT_MEMORY / 2) as u64;
    let mut done = 0;
    while done < history {
        let (ok, _) = pairs(&client, seconds).await;
        assert!(ok > 0, "no acquire+release pair succeeded");
        done += ok;
        eprintln!("leases: warm-up, {done} of {history} pairs");
    }
    let mut table = Table::new(&[
        "live leases",
        "build leases/s",
        "acquire+release pairs/s",
        "leader RSS MiB",
        "cluster RSS MiB",
        "leader CPU s / 1000 pairs",
        "keepalives/s",
        "failed pairs / keepalives",
        "max keepalive lag ms",
    ]);
    let mut rows = vec![];
    for &live in live_levels {
        eprintln!("leases: building {live}");
        let build = holders.grow_to(live).await;
        eprintln!("leases: {live} held, built at {build:.0}/s");
        let (mut rate, mut leader_rss, mut cluster_rss, mut cpu, mut ka_rate) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut failed_pairs = 0;
        for rep in 1..=reps {
            let (u0, sent0, t0) = (Usage::of_tree(leader_pid), holders.stats.sent.load(Relaxed), Instant::now());
            let (ok, failed) = pairs(&client, seconds).await;
            let elapsed = t0.elapsed().as_secs_f64();
            let u1 = Usage::of_tree(leader_pid);
            rate.push(ok as f64 / elapsed);
            cpu.push((u1.cpu_seconds - u0.cpu_seconds) / ok.max(1) as f64 * 1000.0);
            leader_rss.push(mib(u1.rss));
            cluster_rss.push(mib(cluster.ids().into_iter().map(|id| Usage::of_tree(cluster.pid(id)).rss).sum()));
            ka_rate.push((holders.stats.sent.load(Relaxed) - sent0) as f64 / elapsed);
            failed_pairs += failed;
            eprintln!(
                "leases {live} rep {rep}/{reps}: {:.0} pairs/s ({failed} failed), leader {:.0} MiB",
                ok as f64 / elapsed,
                mib(u1.rss)
            );
        }
        let log = client.cluster().await.unwrap();
        eprintln!("leases {live}: log index {}, snapshot at {:?}", log.last_log_index, log.snapshot_index);
        let new_leader = cluster.wait_for_leader(LEADER_WITHIN).await;
        if new_leader != leader_id {
            eprintln!(
                "WARNING: leader moved from node {leader_id} to {new_leader}; leader figures are node {leader_id}'s"
            );
        }
        // Errors and lag since the previous level: its build and its reps.
        let ka_errors = holders.stats.errors.swap(0, Relaxed);
        let max_lag = holders.stats.max_late_ms.swap(0, Relaxed);
        let s = |v: &[f64]| Spread::of(v);
        table.row(&[
            live.to_string(),
            format!("{build:.0}"),
            s(&rate).show(0),
            s(&leader_rss).show(0),
            s(&cluster_rss).show(0),
            s(&cpu).show(3),
            s(&ka_rate).show(0),
            format!("{failed_pairs} / {ka_errors}"),
            max_lag.to_string(),
        ]);
        rows.push(json!({
            "live": live, "build_leases_per_s": build, "pairs_per_s": s(&rate),
            "leader_rss_mib": s(&leader_rss), "cluster_rss_mib": s(&cluster_rss), "cpu_s_per_1000": s(&cpu),
            "keepalives_per_s": s(&ka_rate), "failed_pairs": failed_pairs, "keepalive_errors": ka_errors,
            "max_keepalive_lag_ms": max_lag,
        }));
    }
    (table.markdown().to_string(), rows)
}

async fn sidecar_part(key_levels: &[usize], reps: usize, seconds: u64) -> (String, Vec<Value>) {
    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let cluster = fencegate_cluster("").await;
    let leader = cluster.url(cluster.wait_for_leader(LEADER_WITHIN).await);
    let sidecar = fenced_sidecar(&cluster, "sidecar", upstream.port, "cached").await;
    let (port, pid) = (sidecar.port, sidecar.pid().unwrap());
    let mut holders = Holders::new(leader, "rack/");
    let http = HttpClient::new(1 << 20);
    let mut table =
        Table::new(&["keys", "requests/s", "p50 µs", "p99 µs", "sidecar RSS MiB", "failed warm-up / measured"]);
    let mut rows = vec![];
    for &keys in key_levels {
        eprintln!("sidecar: {keys} keys");
        holders.grow_to(keys).await;
        let tokens = Arc::new(holders.tokens.clone());
        // Every key once first: the first request at a new token waits for
        // the sidecar to learn the grant and to fsync the key's new floor.
        let base = format!("http://127.0.0.1:{port}");
        let warm_failed = stream::iter(0..keys)
            .map(|i| http.send(fenced_put(format!("{base}/racks/{i}"), tokens[i]), Duration::from_secs(10)))
            .buffer_unordered(SIDECAR_CONNECTIONS)
            .filter(|a| std::future::ready(!matches!(a, Ok(a) if a.status == StatusCode::OK)))
            .count()
            .await;
        let make: MakeRequest = Arc::new(move |n| {
            let i = n as usize % tokens.len();
            fenced_put(format!("/racks/{i}"), tokens[i])
        });
        let (mut rps, mut p50, mut p99, mut rss) = (vec![], vec![], vec![], vec![]);
        let mut failed = 0;
        for rep in 1..=reps {
            let run = closed_loop(port, SIDECAR_CONNECTIONS, Duration::from_secs(seconds), make.clone()).await;
            rps.push(run.rate());
            p50.push(run.us(0.5));
            p99.push(run.us(0.99));
            rss.push(mib(Usage::of_tree(pid).rss));
            failed += run.errors;
            eprintln!("sidecar {keys} keys rep {rep}/{reps}: {:.0} req/s ({} failed)", run.rate(), run.errors);
        }
        let s = |v: &[f64]| Spread::of(v);
        table.row(&[
            keys.to_string(),
            s(&rps).show(0),
            s(&p50).show(0),
            s(&p99).show(0),
            s(&rss).show(1),
            format!("{warm_failed} / {failed}"),
        ]);
        rows.push(json!({
            "keys": keys, "rps": s(&rps), "p50_us": s(&p50), "p99_us": s(&p99), "rss_mib": s(&rss),
            "failed_warm_up": warm_failed, "failed": failed,
        }));
    }
    (table.markdown().to_string(), rows)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let seconds: u64 = env_or("BENCH_SECONDS", 5);
    let reps: usize = env_or("BENCH_REPS", 3);
    let live_levels = levels(&[1, 1_000, 10_000], env_or("BENCH_SCALE_MAX", 100_000));
    let key_levels = levels(&[1, 100, 1_000], env_or("BENCH_SCALE_KEYS_MAX", 10_000));

    // Each part on its own cluster, the first one gone before the second starts.
    let (leases_md, leases) = leases_part(&live_levels, reps, seconds).await;
    let (sidecar_md, sidecar_keys) = sidecar_part(&key_levels, reps, seconds).await;

    // Spread = {"median","min","max"} over the reps.
    // {"reps", "seconds",
    //  "leases": [{"live", "build_leases_per_s", "pairs_per_s": Spread, "leader_rss_mib": Spread,
    //              "cluster_rss_mib": Spread, "cpu_s_per_1000": Spread, "keepalives_per_s": Spread,
    //              "failed_pairs", "keepalive_errors", "max_keepalive_lag_ms"}, ...],
    //  "sidecar_keys": [{"keys", "rps": Spread, "p50_us": Spread, "p99_us": Spread, "rss_mib": Spread,
    //                    "failed_warm_up", "failed"}, ...]}
    let json = json!({ "reps": reps, "seconds": seconds, "leases": leases, "sidecar_keys": sidecar_keys });
    let markdown = format!(
        "Median (min–max) over {reps} runs of {seconds} s; all processes share the machine's cores.\n\n\
         ## Lock service with many live leases\n\n\
         3 nodes, fsync on. Each live lease has a 60 s TTL and a keepalive every 20 s (paced loops, not one \
         `Lease` each). {PAIR_CLIENTS} client-library clients acquire and release their own keys back to back. \
         Leader CPU includes serving the keepalives. Failures and keepalive lag cover the level's build and \
         its runs. Before the first level, pairs fill the service's bounded request-id and event histories, so \
         RSS grows with the leases rather than with history (the Raft log, snapshotted every 10,000 entries, \
         still varies).\n\n{leases_md}\n\
         ## Sidecar with many keys\n\n\
         One sidecar (strict, cached), {SIDECAR_CONNECTIONS} closed-loop connections; request n writes key \
         n mod keys with that key's token, after one warm-up request per key.\n\n{sidecar_md}"
    );
    report::write("scale", "Scale: live leases and fenced keys", &markdown, json);
}
