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
//! Then, per repetition, a second load generator on the same servers: wrk
//! (`common/wrk.rs`; `-t2 -c<BENCH_CONNECTIONS> -d<BENCH_SECONDS>s
//! --latency`), closed loop, sending the same request (the lease's valid
//! token, the same body) through every path, the paths in an order that
//! rotates every repetition. Lighter than ours, it leaves the proxies more
//! of the cores. A wrk run with non-2xx answers or socket errors is a failed
//! measurement, printed and left out; non-2xx through a sidecar stops the
//! benchmark (it refused valid requests).
//!
//! Run: `bench/run proxies` (installs nginx, HAProxy and wrk), or
//! `cargo bench --bench proxies` with them on PATH. Env: BENCH_SECONDS per
//! phase (5), BENCH_REPS (3), BENCH_CONNECTIONS (32), BENCH_RATES
//! ("2000,5000,10000"), BENCH_WRK (1; 0 skips wrk: our generator's phases
//! alone, no wrk needed). Writes bench/results/proxies.{md,json}.

mod common;
#[path = "common/floor.rs"]
mod floor;
#[path = "common/wrk.rs"]
mod wrk;

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
    /// The path of every request (`make`'s).
    uri: &'static str,
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
    wrk: WrkSamples,
}

/// wrk's measurements of one path, one value per repetition that measured.
#[derive(Default)]
struct WrkSamples {
    rps: Vec<f64>,
    /// percent (`wrk::PERCENTS`) -> µs per repetition.
    latency: BTreeMap<u32, Vec<f64>>,
    /// Runs with non-2xx answers or socket errors, or no usable report.
    failed: u64,
}

/// wrk's threads: two, for two cores.
const WRK_THREADS: usize = 2;

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
    let with_wrk = env_or("BENCH_WRK", 1u8) != 0;
    if with_wrk {
        assert!(wrk::available(), "no wrk on PATH: install Debian's wrk (bench/run does), or BENCH_WRK=0");
        wrk::check_parser();
    }

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
    let target = |port: u16, uri: &'static str, proxy_pid: Option<u32>, cluster_pids: Vec<u32>| Target {
        port,
        uri,
        make: Arc::new(move |_| fenced_put(uri, token)),
        proxy_pid,
        cluster_pids,
    };
    let paths: Vec<Target> = vec![
        target(up, "/racks/1", None, vec![]),
        target(nginx_port, "/racks/1", Some(nginx.pid()), vec![]),
        target(haproxy_port, "/racks/1", Some(haproxy.pid()), vec![]),
        target(floor_port, "/racks/1", Some(floor.pid()), vec![]),
        // The route `rest` (fence: off) takes any path but /racks/{rack}.
        target(cached_port, "/unfenced/1", Some(cached_pid), vec![]),
        target(cached_port, "/racks/1", Some(cached_pid), cluster_pids.clone()),
        target(lin_port, "/racks/1", Some(lin_pid), cluster_pids),
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

    // wrk's scripts: the request each path's `make` builds (the lease's token).
    let scripts: Vec<_> = PATHS.iter().enumerate().map(|(i, _)| dir.join(format!("wrk-{i}.lua"))).collect();
    if with_wrk {
        for (p, script) in paths.iter().zip(&scripts) {
            wrk::write_script(script, (p.make)(0)).await;
        }
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
        if !with_wrk {
            continue;
        }
        // wrk through every path, starting one further each repetition.
        for k in 0..paths.len() {
            let i = (k + rep - 1) % paths.len();
            let (name, p) = (PATHS[i], &paths[i]);
            eprintln!("rep {rep}/{reps}: {name} under wrk");
            // The token in the script is the lease's: still valid (kept alive).
            assert!(lease.is_valid(), "the lease on rack/1 was lost; logs in {}", dir.display());
            let run = wrk::run(p.port, p.uri, &scripts[i], WRK_THREADS, connections, seconds.as_secs()).await;
            let s = &mut samples[i].wrk;
            match run {
                Ok(run) => {
                    eprintln!(
                        "  {:.0} req/s, p50 {:.0} µs, p99 {:.0} µs",
                        run.requests_per_second,
                        run.us(50),
                        run.us(99)
                    );
                    s.rps.push(run.requests_per_second);
                    for percent in wrk::PERCENTS {
                        s.latency.entry(percent).or_default().push(run.us(percent));
                    }
                }
                Err(failed) => {
                    eprintln!(
                        "rep {rep}/{reps}: {name} under wrk: FAILED MEASUREMENT, left out: {}\n{}",
                        failed.why, failed.output
                    );
                    assert!(
                        !(name.starts_with("sidecar") && failed.non_2xx > 0),
                        "{name} refused valid requests under wrk: {}; logs in {}",
                        failed.why,
                        dir.display()
                    );
                    s.failed += 1;
                }
            }
        }
    }
    lease.release().await.unwrap();
    write_results(&samples, &rates, reps, seconds, connections, with_wrk);
}

fn write_results(
    samples: &[Samples],
    rates: &[u64],
    reps: usize,
    seconds: Duration,
    connections: usize,
    with_wrk: bool,
) {
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

    // Under wrk: the spreads of the repetitions that measured (none: "–").
    let some = |v: Option<&Vec<f64>>| v.filter(|v| !v.is_empty()).map(|v| Spread::of(v));
    let wrk_title = format!("Under wrk (closed loop, {connections} connections, {WRK_THREADS} threads)");
    let mut wrk_table = Table::new(&["path", "req/s", "p50 µs", "p99 µs", "failed runs"]);
    for (name, s) in PATHS.iter().zip(samples) {
        let show = |v: Option<&Vec<f64>>| some(v).map_or("–".into(), |s| s.show(0));
        wrk_table.row(&[
            name.to_string(),
            show(Some(&s.wrk.rps)),
            show(s.wrk.latency.get(&50)),
            show(s.wrk.latency.get(&99)),
            s.wrk.failed.to_string(),
        ]);
    }
    let wrk_ratio = |pick: fn(&WrkSamples) -> Option<&Vec<f64>>| -> Option<f64> {
        Some(some(pick(&samples[cached].wrk))?.median / some(pick(&samples[nginx].wrk))?.median)
    };
    let wrk_rps = wrk_ratio(|w| Some(&w.rps));
    let wrk_p99 = wrk_ratio(|w| w.latency.get(&99));
    let show_ratio = |r: Option<f64>| r.map_or("–".into(), |r| format!("{r:.2}×"));
    let wrk_section = if with_wrk {
        format!(
            "## {wrk_title}\n\nThe same request through the same servers, by wrk (`-t{WRK_THREADS} -c{connections} \
             -d{}s --latency`) instead of the bench's own generator; latency from when a request is written. A \
             run with non-2xx answers or socket errors is left out (failed runs).\n\n{}\n\
             sidecar (cached) ÷ nginx under wrk: throughput {}, p99 {} (own generator, closed loop: throughput \
             {:.2}×).\n\n",
            seconds.as_secs(),
            wrk_table.markdown(),
            show_ratio(wrk_rps),
            show_ratio(wrk_p99),
            med(cached, rps) / med(nginx, rps),
        )
    } else {
        "wrk: skipped (BENCH_WRK=0).\n\n".into()
    };

    let lock_cpu: Vec<String> = [at("sidecar (cached)"), at("sidecar (linearizable)")]
        .iter()
        .map(|&i| format!("{}: {}", PATHS[i], spread(&samples[i].cluster_cpu_per_1000).show(3)))
        .collect();
    let markdown = format!(
        "`PUT /racks/1` with a valid `X-Fence-Token`, {connections} keep-alive connections, {} s per phase, \
         {reps} repetitions: median (min–max). Load generator, upstream, proxies and the 3-node lock cluster \
         share the machine.\n\n## Summary\n\n{}\n{wrk_section}## Latency at fixed rates (coordinated omission \
         corrected)\n\n{}\n## Targets\n\n{}\nLock cluster CPU s per 1,000 requests in the closed loop: {}.\n",
        seconds.as_secs(),
        t.markdown(),
        lat.markdown(),
        targets.markdown(),
        lock_cpu.join("; "),
    );
    // wrk's, null with BENCH_WRK=0: {"threads", "connections", "paths": [{"name", "rps": Spread or null,
    //   "p50"|"p75"|"p90"|"p99": Spread (µs) or null, "failed"}], "cached_over_nginx": {"rps", "p99"}}
    let wrk_json = with_wrk.then(|| {
        json!({
            "threads": WRK_THREADS,
            "connections": connections,
            "paths": PATHS.iter().zip(samples).map(|(name, s)| {
                let mut path = json!({ "name": name, "rps": some(Some(&s.wrk.rps)), "failed": s.wrk.failed });
                for p in wrk::PERCENTS {
                    path[format!("p{p}")] = json!(some(s.wrk.latency.get(&p)));
                }
                path
            }).collect::<Vec<_>>(),
            "cached_over_nginx": { "rps": wrk_rps, "p99": wrk_p99 },
        })
    });
    // JSON for bench/plot.py: {"paths": [{"name", "rps": Spread, "cpu_per_1000": Spread,
    //   "peak_rss_mib", "fixed": [{"rate", "p50"|"p99"|"p99.9": Spread (µs), "cpu_per_1000": Spread}]}],
    //   "wrk": as above, ...}
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
        "wrk": wrk_json,
    });
    report::write("proxies", "Sidecar vs reverse proxies", &markdown, json);
}
