//! Memory of a lock node under a steady acquire/release load on a few keys
//! (the soak's pattern without its faults). `memgrowth_experiment` is run by
//! hand: `MG_CYCLES=20000 MG_RID=1 cargo test --features faults --test faults -- --ignored --nocapture memgrowth::`.
//!
//! Seen (debug build, one node, 8 workers, 4 keys each), when the event
//! ring held 65,536 events: without request ids, RSS grew ~0.57 KB per
//! cycle until the watch `EventLog` was full (32,768 cycles) and was flat
//! after (+0.4 MB from 32,000 to 40,000); with a request id per acquire,
//! the snapshot grew 187 bytes per cycle (2.2 MB after 12,000) under rules
//! 0 (65,536 request ids of any lease), and stays at ~768 KB (4,096 ended
//! leases' ids) under rules 1, which a lone node moves to at once; RSS then
//! leveled off once the `EventLog` was full (+1.6, +1.0, +0.8, +0.2 MB per
//! 8,000 cycles from 32,000 to 64,000). The ring now holds 16,384 events
//! (8,192 cycles).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencegate_testkit::{bin, Cluster};
use hyper::Method;

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(field)).unwrap().trim().trim_end_matches(" kB").trim().parse().unwrap()
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Run `n` acquire+release cycles on `keys` keys over 8 workers.
async fn cycles(c: &Cluster, from: usize, n: usize, keys: usize, rid: bool) {
    let next = Arc::new(AtomicUsize::new(from));
    let http = c.client_options().http_client(1 << 20).unwrap();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..8 {
        let (next, http, url) = (next.clone(), http.clone(), c.url(1));
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= from + n {
                    return;
                }
                let key = format!("soak/w{}/k{}", w, i % keys);
                let body = if rid {
                    format!(
                        r#"{{"ttl_ms":3000,"wait_ms":5000,"holder":"worker-{w}","request_id":"{:032x}"}}"#,
                        rand::random::<u128>()
                    )
                } else {
                    format!(r#"{{"ttl_ms":3000,"wait_ms":5000,"holder":"worker-{w}"}}"#)
                };
                let a = http
                    .call(
                        Method::POST,
                        &format!("{url}/v1/locks/{key}"),
                        Some(body.into_bytes()),
                        Duration::from_secs(10),
                    )
                    .await
                    .unwrap();
                assert_eq!(a.status.as_u16(), 200, "{}", String::from_utf8_lossy(&a.body));
                let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
                let lease = v["lease_id"].as_str().unwrap().to_string();
                let r = http
                    .call(Method::DELETE, &format!("{url}/v1/leases/{lease}"), None, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert!(r.status.is_success(), "{}", String::from_utf8_lossy(&r.body));
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        r.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an experiment, run by hand"]
async fn memgrowth_experiment() {
    let (total, step, keys) = (env("MG_CYCLES", 20_000), env("MG_STEP", 2_000), env("MG_KEYS", 4));
    let rid = env("MG_RID", 1) == 1;
    let yaml = std::env::var("MG_YAML").unwrap_or_default();
    let c = Cluster::start(&bin!(), 1, &yaml).await;
    let pid = c.pid(1);
    let started = std::time::Instant::now();
    println!("cycles\tsecs\trss_anon_kib\trss_kib\tsnapshot_bytes");
    let mut done = 0;
    loop {
        let snap = c.get(1, "/v1/snapshot").await.map_or(0, |b| b.len());
        println!(
            "{done}\t{:.0}\t{}\t{}\t{snap}",
            started.elapsed().as_secs_f64(),
            rss_kib(pid, "RssAnon:"),
            rss_kib(pid, "VmRSS:")
        );
        if done >= total {
            break;
        }
        cycles(&c, done, step, keys, rid).await;
        done += step;
    }
}
