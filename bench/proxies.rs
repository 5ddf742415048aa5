//! What the sidecar costs next to the proxy you already run: the same small
//! upstream and the same load, straight, through nginx (`proxy_pass`),
//! through HAProxy, and through `fencegate sidecar` (fencing on, strict;
//! `cached` and `linearizable`), in one run; and hyper's floor
//! (`common/floor.rs`), hyper's server and client with nothing else.
//!
//! Per path and repetition: closed-loop throughput over `BENCH_CONNECTIONS`
//! keep-alive connections, then latency at each fixed rate of `BENCH_RATES`
//! (coordinated-omission corrected), the proxy's CPU seconds per 1,000
//! requests (and the lock cluster's, for the sidecar) and its peak RSS.
//! Paths are interleaved within each repetition so drift hits all alike.
//!
//! Run: `bench/run proxies` (installs nginx and HAProxy), or
//! `cargo bench --bench proxies` with both on PATH. Env: BENCH_SECONDS per
//! phase (5), BENCH_REPS (3), BENCH_CONNECTIONS (32), BENCH_RATES
//! ("2000,5000,10000"). Writes bench/results/proxies.{md,json}.

mod common;
#[path = "common/floor.rs"]
mod floor;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::load::{self, MakeRequest};
use common::procs::Usage;
use common::proxies::{self, NginxProcesses};
use common::report::{self, mib, Spread, Table};
use common::{env_or, fenced_sidecar, fencegate_cluster, wait_for_port};
use fencegate_client::AcquireOptions;
use fencegate_testkit::free_ports;
use fencegate_testkit::http::fenced_put;
use fencegate_testkit::upstream::{Recording, Upstream};
use serde_json::json;

/// "hyper floor" is hyper's server and client and nothing else
/// (`common/floor.rs`): the least a proxy on the sidecar's parts costs.
/// "sidecar (fence off)" is the cached sidecar on a route with fencing off:
/// the proxying alone, to tell its cost from the fencing's.
const PATHS: [&str; 7] = [
    "straight",
    "nginx",
    "haproxy",
    "hyper floor",
    "sidecar (fence off)",
    "sidecar (cached)",
    "sidecar (linearizable)",
];

/// One path under test: where to send what, and whose CPU to charge.
struct Target {
    port: u16,
    make: MakeRequest,
    proxy_pid: Option<u32>,
    /// The lock cluster's pids, charged separately (sidecar paths only).
    cluster_pids: Vec<u32>,
}

impl Target {
    fn usage(&self) -> (Usage, f64) {
        let proxy = self.proxy_pid.map(Usage::of_tree).unwrap_or_default();
        let cluster: f64 = self.cluster_pids.iter().map(|p| Usage::of_tree(*p).cpu_seconds).sum();
        (proxy, cluster)
    }
}

/// Measurements of one path, one value per repetition.
#[derive(Default)]
struct Samples {
    rps: Vec<f64>,
    cpu_per_1000: Vec<f64>,
    cluster_cpu_per_1000: Vec<f64>,
    /// rate -> quantile name -> µs per repetition.
    fixed: BTreeMap<u64, BTreeMap<&'static str, Vec<f64>>>,
    /// rate -> CPU seconds per 1,000 requests per repetition.
    fixed_cpu: BTreeMap<u64, Vec<f64>>,
    errors: u64,
    peak_rss: u64,
}

/// The index of path `name` in PATHS.
fn at(name: &str) -> usize {
    PATHS.iter().position(|p| *p == name).unwrap()
}

const QUANTILES: [(&str, f64); 3] = [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)];

fn main() {
    floor::run_if_asked();
    measure();
}

#[tokio::main(flavor = "multi_thread")]
async fn measure() {
    let seconds = Duration::from_secs(env_or("BENCH_SECONDS", 5));
    let reps: usize = env_or("BENCH_REPS", 3);
    let connections: usize = env_or("BENCH_CONNECTIONS", 32);
    let rates: Vec<u64> = std::env::var("BENCH_RATES")
        .unwrap_or_else(|_| "2000,5000,10000".into())
        .split(',')
        .map(|r| r.trim().parse().expect("BENCH_RATES: comma-separated requests/s"))
        .collect();

    // The small upstream: reads each body and answers with a short JSON body,
    // counting only, on its own thread.
    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let up = upstream.port;
    let cluster = fencegate_cluster("").await;
    let dir = cluster.dir().to_path_buf();
    let [nginx_port, haproxy_port, floor_port] = free_ports();
    // Two workers, threads or event loops for two cores.
    let nginx = proxies::nginx(&dir, Path::new("nginx"), nginx_port, up, NginxProcesses::Workers(2));
    let haproxy = proxies::haproxy(&dir, Path::new("haproxy"), haproxy_port, up, 2);
    let floor = floor::start(&dir, &std::env::current_exe().unwrap(), floor_port, up, 2);
    let cached = fenced_sidecar(&cluster, "sidecar-cached", up, "cached").await;
    let linearizable = fenced_sidecar(&cluster, "sidecar-linearizable", up, "linearizable").await;
    let (cached_port, cached_pid) = (cached.port, cached.pid().unwrap());
    let (lin_port, lin_pid) = (linearizable.port, linearizable.pid().unwrap());
    wait_for_port(nginx_port).await;
    wait_for_port(haproxy_port).await;
    wait_for_port(floor_port).await;
    let cluster_pids: Vec<u32> = cluster.ids().into_iter().map(|id| cluster.pid(id)).collect();

    let lease = cluster.client().acquire("rack/1", AcquireOptions::new(Duration::from_secs(600))).await.unwrap();
    let token = lease.token();
    let put = |uri: &'static str| -> MakeRequest { Arc::new(move |_| fenced_put(uri, token)) };
    let paths: Vec<Target> = vec![
        Target { port: up, make: put("/racks/1"), proxy_pid: None, cluster_pids: vec![] },
        Target { port: nginx_port, make: put("/racks/1"), proxy_pid: Some(nginx.pid()), cluster_pids: vec![] },
        Target { port: haproxy_port, make: put("/racks/1"), proxy_pid: Some(haproxy.pid()), cluster_pids: vec![] },
        Target { port: floor_port, make: put("/racks/1"), proxy_pid: Some(floor.pid()), cluster_pids: vec![] },
        // The route `rest` (fence: off) takes any path but /racks/{rack}.
        Target { port: cached_port, make: put("/unfenced/1"), proxy_pid: Some(cached_pid), cluster_pids: vec![] },
        Target {
            port: cached_port,
            make: put("/racks/1"),
            proxy_pid: Some(cached_pid),
            cluster_pids: cluster_pids.clone(),
        },
        Target { port: lin_port, make: put("/racks/1"), proxy_pid: Some(lin_pid), cluster_pids },
    ];
    // Warm-up: connections, pools, and the sidecars learn the grant.
    for (name, p) in PATHS.iter().zip(&paths) {
        let run = load::closed_loop(p.port, 4, Duration::from_secs(1), p.make.clone()).await;
        assert!(
            run.ok > 0 && run.errors == 0,
            "warm-up failed {name}: {} errors; logs in {}",
            run.errors,
            dir.display()
        );
    }

    let mut samples: Vec<Samples> = PATHS.iter().map(|_| Samples::default()).collect();
    for rep in 1..=reps {
        for (i, p) in paths.iter().enumerate() {
            eprintln!("rep {rep}/{reps}: {} closed loop", PATHS[i]);
            let (u0, c0) = p.usage();
            let run = load::closed_loop(p.port, connections, seconds, p.make.clone()).await;
            let (u1, c1) = p.usage();
            let s = &mut samples[i];
            s.rps.push(run.rate());
            s.cpu_per_1000.push((u1.cpu_seconds - u0.cpu_seconds) * 1000.0 / run.ok as f64);
            s.cluster_cpu_per_1000.push((c1 - c0) * 1000.0 / run.ok as f64);
            s.errors += run.errors;
            for &rate in &rates {
                eprintln!("rep {rep}/{reps}: {} at {rate}/s", PATHS[i]);
                let (u0, _) = p.usage();
                let run = load::fixed_rate(p.port, connections, rate as f64, seconds, p.make.clone()).await;
                let (u1, _) = p.usage();
                for (name, q) in QUANTILES {
                    s.fixed.entry(rate).or_default().entry(name).or_default().push(run.us(q));
                }
                s.fixed_cpu.entry(rate).or_default().push((u1.cpu_seconds - u0.cpu_seconds) * 1000.0 / run.ok as f64);
                s.errors += run.errors;
            }
            s.peak_rss = p.usage().0.peak_rss;
        }
    }
    lease.release().await.unwrap();
    write_results(&samples, &rates, reps, seconds, connections);
}

fn write_results(samples: &[Samples], rates: &[u64], reps: usize, seconds: Duration, connections: usize) {
    let spread = |v: &[f64]| Spread::of(v);
    let mid = rates[rates.len() / 2];

    let mut t = Table::new(&[
        "path",
        "closed loop req/s",
        &format!("p50 µs @{mid}/s"),
        &format!("p99 µs @{mid}/s"),
        &format!("p99.9 µs @{mid}/s"),
        &format!("CPU s /1000 req @{mid}/s"),
        "CPU s /1000 req, closed loop",
        "peak RSS MiB",
        "errors",
    ]);
    for (name, s) in PATHS.iter().zip(samples) {
        let proxied = *name != "straight";
        let q = |n: &str| spread(&s.fixed[&mid][n]).show(0);
        let cpu = |v: &[f64]| if proxied { spread(v).show(3) } else { "–".into() };
        t.row(&[
            name.to_string(),
            spread(&s.rps).show(0),
            q("p50"),
            q("p99"),
            q("p99.9"),
            cpu(&s.fixed_cpu[&mid]),
            cpu(&s.cpu_per_1000),
            if proxied { format!("{:.1}", mib(s.peak_rss)) } else { "–".into() },
            s.errors.to_string(),
        ]);
    }

    let mut lat = Table::new(&["path", "rate /s", "p50 µs", "p99 µs", "p99.9 µs"]);
    for (name, s) in PATHS.iter().zip(samples) {
        for rate in rates {
            let f = &s.fixed[rate];
            lat.row(&[
                name.to_string(),
                rate.to_string(),
                spread(&f["p50"]).show(0),
                spread(&f["p99"]).show(0),
                spread(&f["p99.9"]).show(0),
            ]);
        }
    }

    // The targets, as ratios of medians from this run.
    let med = |path: usize, pick: fn(&Samples, u64) -> &[f64]| spread(pick(&samples[path], mid)).median;
    let (nginx, cached) = (at("nginx"), at("sidecar (cached)"));
    let rps: fn(&Samples, u64) -> &[f64] = |s, _| &s.rps;
    let p50: fn(&Samples, u64) -> &[f64] = |s, rate| &s.fixed[&rate]["p50"];
    let p99: fn(&Samples, u64) -> &[f64] = |s, rate| &s.fixed[&rate]["p99"];
    let cpu: fn(&Samples, u64) -> &[f64] = |s, rate| &s.fixed_cpu[&rate];
    let mut targets = Table::new(&["target", "measured", "met"]);
    let mut target = |what: &str, shown: String, ok: bool| {
        targets.row(&[what.to_string(), shown, if ok { "yes".into() } else { "no".into() }]);
    };
    let r = med(cached, rps) / med(nginx, rps);
    target("sidecar (cached) throughput ≥ 1.0× nginx", format!("{r:.2}×"), r >= 1.0);
    let r = med(cached, p99) / med(nginx, p99);
    target(&format!("sidecar (cached) p99 ≤ 1.0× nginx @{mid}/s"), format!("{r:.2}×"), r <= 1.0);
    let added = med(cached, p50) - med(at("straight"), p50);
    target(&format!("added p50 over straight ≤ 100 µs @{mid}/s"), format!("{added:.0} µs"), added <= 100.0);
    let c = med(cached, cpu);
    target(&format!("≤ 0.05 CPU s per 1,000 requests @{mid}/s"), format!("{c:.3}"), c <= 0.05);
    // What the targets ask of hyper itself (`common/floor.rs`).
    let floor = at("hyper floor");
    targets.row(&[
        "(the floor: hyper's server and client alone ÷ nginx)".into(),
        format!(
            "throughput {:.2}×, p99 @{mid}/s {:.2}×, CPU s per 1,000 requests @{mid}/s {:.2}×",
            med(floor, rps) / med(nginx, rps),
            med(floor, p99) / med(nginx, p99),
            med(floor, cpu) / med(nginx, cpu),
        ),
        "–".into(),
    ]);

    let lock_cpu: Vec<String> = [at("sidecar (cached)"), at("sidecar (linearizable)")]
        .iter()
        .map(|&i| format!("{}: {}", PATHS[i], spread(&samples[i].cluster_cpu_per_1000).show(3)))
        .collect();
    let markdown = format!(
        "`PUT /racks/1` with a valid `X-Fence-Token`, {connections} keep-alive connections, {} s per phase, \
         {reps} repetitions: median (min–max). Load generator, upstream, proxies and the 3-node lock cluster \
         share the machine.\n\n## Summary\n\n{}\n## Latency at fixed rates (coordinated omission corrected)\n\n{}\n\
         ## Targets\n\n{}\nLock cluster CPU s per 1,000 requests in the closed loop: {}.\n",
        seconds.as_secs(),
        t.markdown(),
        lat.markdown(),
        targets.markdown(),
        lock_cpu.join("; "),
    );
    // JSON for bench/plot.py: {"paths": [{"name", "rps": Spread, "cpu_per_1000": Spread,
    //   "peak_rss_mib", "fixed": [{"rate", "p50"|"p99"|"p99.9": Spread (µs), "cpu_per_1000": Spread}]}], ...}
    let json = json!({
        "reps": reps,
        "seconds": seconds.as_secs(),
        "connections": connections,
        "paths": PATHS.iter().zip(samples).map(|(name, s)| json!({
            "name": name,
            "rps": spread(&s.rps),
            "cpu_per_1000": spread(&s.cpu_per_1000),
            "peak_rss_mib": mib(s.peak_rss),
            "errors": s.errors,
            "fixed": rates.iter().map(|r| json!({
                "rate": r,
                "p50": spread(&s.fixed[r]["p50"]),
                "p99": spread(&s.fixed[r]["p99"]),
                "p99.9": spread(&s.fixed[r]["p99.9"]),
                "cpu_per_1000": spread(&s.fixed_cpu[r]),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    report::write("proxies", "Sidecar vs reverse proxies", &markdown, json);
}
