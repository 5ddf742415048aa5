//! Lock service load generator: a real 3-node cluster on loopback (fsync on),
//! driven through the client library.
//!
//! Measures, in one run:
//! - acquire+release latency, p50/p99, with 1 client;
//! - acquire+release throughput with 64 concurrent clients on distinct keys;
//! - grants per fsync on the leader at that load;
//! - keepalives/s with 64 concurrent holders (no log writes), as a ratio to
//!   acquires/s.
//!
//! Run: `cargo bench --bench lock_service` (env: BENCH_SECONDS, default 10).
//! Writes the table to stdout and to bench/results/lock_service.md.

mod common;

use std::time::Duration;

use common::cluster::{start_cluster, Cluster};
use fencegate::client::{AcquireOptions, Client};
use tokio::time::Instant;

async fn leader_url(c: &Cluster, client: &Client) -> String {
    let info = client.cluster().await.unwrap();
    c.urls[&info.leader.unwrap()].clone()
}

async fn counter(url: &str, name: &str) -> f64 {
    let http = fencegate::http::HttpClient::new(8 << 20);
    let a = http.call(hyper::Method::GET, &format!("{url}/metrics"), None, Duration::from_secs(2)).await.unwrap();
    let text = String::from_utf8_lossy(&a.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).map(|v| v.parse().unwrap()))
        .unwrap_or(0.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let seconds: u64 = std::env::var("BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let cluster = start_cluster().await;
    let probe = Client::new(cluster.urls.values().cloned().collect()).unwrap();
    let leader = leader_url(&cluster, &probe).await;
    // Talk to the leader directly, as a client that found it would.
    let client = Client::new(vec![leader.clone()]).unwrap();
    let opts = AcquireOptions::new(Duration::from_secs(30));

    // 1 client, sequential.
    let mut lat = vec![];
    let until = Instant::now() + Duration::from_secs(seconds / 2);
    while Instant::now() < until {
        let t = Instant::now();
        client.acquire("bench/single", opts.clone()).await.unwrap().release().await.unwrap();
        lat.push(t.elapsed());
    }
    lat.sort();
    let single_ops = lat.len();

    // 64 clients, closed loop, distinct keys.
    let (g0, s0) = (
        counter(&leader, "fencegate_lock_grants_total").await,
        counter(&leader, "fencegate_raft_log_syncs_total").await,
    );
    let e0 = counter(&leader, "fencegate_raft_log_entries_total").await;
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let mut tasks = vec![];
    for w in 0..64 {
        let (client, opts) = (client.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                client.acquire(&format!("bench/k{w}"), opts.clone()).await.unwrap().release().await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (g1, s1) = (
        counter(&leader, "fencegate_lock_grants_total").await,
        counter(&leader, "fencegate_raft_log_syncs_total").await,
    );
    let e1 = counter(&leader, "fencegate_raft_log_entries_total").await;

    // 64 holders, each sending keepalives back to back.
    let http = fencegate::http::HttpClient::new(1 << 20);
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds / 2);
    let mut tasks = vec![];
    for w in 0..64 {
        let (client, opts, http, leader) = (client.clone(), opts.clone(), http.clone(), leader.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client.acquire(&format!("bench/ka{w}"), opts).await.unwrap();
            let url = format!("{leader}/v1/leases/{}/keepalive", lease.lease_id());
            let mut n = 0u64;
            while Instant::now() < until {
                let a = http.call(hyper::Method::POST, &url, None, Duration::from_secs(5)).await.unwrap();
                assert_eq!(a.status, 200);
                n += 1;
            }
            lease.release().await.unwrap();
            n
        }));
    }
    let mut keepalives = 0;
    for t in tasks {
        keepalives += t.await.unwrap();
    }
    let keepalive_rate = keepalives as f64 / start.elapsed().as_secs_f64();

    let table = format!(
        "| measurement | value |\n|---|---|\n\
         | 1 client: acquire+release p50 | {} |\n\
         | 1 client: acquire+release p99 | {} |\n\
         | 1 client: pairs measured | {single_ops} |\n\
         | 64 clients: acquire+release pairs/s | {:.0} |\n\
         | 64 clients: grants/s | {:.0} |\n\
         | 64 clients: log entries per fsync (leader) | {:.1} |\n\
         | 64 clients: grants per fsync (leader) | {:.2} |\n\
         | 64 holders: keepalives/s | {keepalive_rate:.0} |\n\
         | keepalives/s ÷ grants/s | {:.1} |\n",
        ms(percentile(&lat, 0.50)),
        ms(percentile(&lat, 0.99)),
        ops as f64 / elapsed,
        (g1 - g0) / elapsed,
        (e1 - e0) / (s1 - s0).max(1.0),
        (g1 - g0) / (s1 - s0).max(1.0),
        keepalive_rate / ((g1 - g0) / elapsed),
    );
    println!("\nfencegate lock service, 3 nodes on loopback, fsync on, {seconds} s per phase\n\n{table}");
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/results");
    std::fs::create_dir_all(out).unwrap();
    std::fs::write(format!("{out}/lock_service.md"), table).unwrap();
}
