//! What one proxied request costs in instructions, a figure that does not
//! move with the load on a shared machine: the sidecar (strict, cached,
//! fencing on; and the same process on a route with fencing off) and nginx
//! (and HAProxy), each run under valgrind's callgrind, in front of the same
//! upstream (not under callgrind), the same `PUT /racks/1` with a live token.
//! Also hyper's floor (`common/floor.rs`): hyper's server and client and
//! nothing else, what any proxy on these parts costs at the least.
//!
//! Per proxy and repetition, on connections opened and warmed up before:
//! zero the counters, send exactly `BENCH_REQUESTS` requests, dump; then as
//! long again without requests, dump. The second dump is what the process
//! does on its own over time (the sidecar's probes of the lock service,
//! timers), which callgrind's ~50× slowdown would otherwise charge to every
//! request 50 times over: it is subtracted at its rate per second. Counts
//! include every thread (tokio's workers, the sidecar's store and writer).
//!
//! Run: `bench/run instructions` (installs valgrind, nginx, HAProxy), or
//! `cargo bench --bench instructions`. Env: BENCH_REPS (3), BENCH_REQUESTS
//! (2000), BENCH_CONNECTIONS (4), BENCH_WARMUP (500 requests). Writes
//! bench/results/instructions.{md,json}; the dumps stay in
//! target/tmp/instructions/ for `callgrind_annotate`.

mod common;
#[path = "common/floor.rs"]
mod floor;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::callgrind::{self, Counter, Dump};
use common::load::{Connections, MakeRequest};
use common::proxies::{self, NginxProcesses};
use common::report::{self, Spread, Table};
use common::{env_or, fencegate_cluster, wait_for_port};
use fencegate_client::AcquireOptions;
use fencegate_testkit::http::fenced_put;
use fencegate_testkit::routes::{everything_else, rack_writes, table, Route};
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::upstream::{Recording, Upstream};
use fencegate_testkit::{bin, free_ports, Bin, Sidecar};
use serde_json::json;

/// Bounds each run of requests: under callgrind a few thousand take seconds.
const WITHIN: Duration = Duration::from_secs(300);

/// How many functions of the sidecar's and nginx's profiles to list.
const TOP: [usize; 2] = [15, 10];

/// One path: a proxy (its counters, by index) and what to send it.
struct Target {
    name: &'static str,
    counter: usize,
    connections: Connections,
    make: MakeRequest,
}

/// Per path, one value per repetition.
#[derive(Default)]
struct Samples {
    /// Instructions per request, the process's own background subtracted.
    net: Vec<f64>,
    /// Instructions per request as counted.
    gross: Vec<f64>,
    /// Instructions per second without requests.
    background: Vec<f64>,
    /// Requests per second under callgrind.
    rps: Vec<f64>,
    /// The last repetition's dump of the requests.
    last: Option<Dump>,
}

fn main() {
    floor::run_if_asked();
    measure();
}

#[tokio::main(flavor = "multi_thread")]
async fn measure() {
    let reps: usize = env_or("BENCH_REPS", 3);
    let requests: u64 = env_or("BENCH_REQUESTS", 2000);
    let connections: usize = env_or("BENCH_CONNECTIONS", 4);
    let warmup: u64 = env_or("BENCH_WARMUP", 500);
    let perf = perf_counts_instructions();

    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let up = upstream.port;
    let cluster = fencegate_cluster("").await;
    let dir = cluster.dir().to_path_buf();
    let out = PathBuf::from(concat!(env!("CARGO_TARGET_TMPDIR"), "/instructions"));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();

    // One nginx process and one HAProxy thread: callgrind runs a process's
    // threads one at a time anyway, and counts the process it started.
    let [nginx_port, haproxy_port, floor_port] = free_ports();
    let nginx_cg = callgrind::wrap(&out, "nginx", Path::new("nginx"));
    let nginx = proxies::nginx(&dir, &nginx_cg.script, nginx_port, up, NginxProcesses::Single);
    let haproxy_cg = callgrind::wrap(&out, "haproxy", Path::new("haproxy"));
    let haproxy = proxies::haproxy(&dir, &haproxy_cg.script, haproxy_port, up, 1);
    let sidecar_cg = callgrind::wrap(&out, "sidecar", bin!().path());
    // hyper's floor (`floor.rs`) on one event loop: its cheapest (two cost
    // ~3 % more, as they would the sidecar, which runs one per core).
    let floor_cg = callgrind::wrap(&out, "floor", &std::env::current_exe().unwrap());
    let floor = floor::start(&dir, &floor_cg.script, floor_port, up, 1);
    // The rack route, and the same fenced writes with idempotency keys (I1)
    // under `/keyed/`: what a key costs on top of a fenced write.
    let fence = "{ mode: strict, consistency: cached }";
    let keyed = Route::fenced("keyed-writes", "/keyed/{rack}", "rack/{rack}", fence).methods(&["PUT"]);
    let routes =
        [rack_writes(fence).methods(&["PUT"]), keyed.with("idempotency", "{ retention: 1h }"), everything_else()];
    let options = SidecarOptions {
        lock_service: cluster.urls(),
        // Room for every record a run makes in one lock key's quota (a
        // 16th of the store): each keyed request is a new record of rack/1.
        // And connections kept however long they idle between their turns
        // (10 s by default: past it, a connection closed under the load
        // generator was an error, and the new one's idle timer was polled
        // on every wake until its first 10 s were over, ~1 % more
        // instructions per request on some runs).
        yaml: format!("limits: {{ idempotency_store: 4GiB, header_timeout: 5m }}\n{}", table(&routes)),
        log_filter: "warn".into(),
        ..Default::default()
    };
    let upstream_url = format!("http://127.0.0.1:{up}");
    let sidecar =
        Sidecar::start_with(&Bin::new(&sidecar_cg.script), dir.join("sidecar-cached"), &upstream_url, options).await;
    wait_for_port(nginx_port).await;
    wait_for_port(haproxy_port).await;
    wait_for_port(floor_port).await;
    let mut counters: Vec<Counter> = vec![
        nginx_cg.counter(nginx.pid()),
        haproxy_cg.counter(haproxy.pid()),
        sidecar_cg.counter(sidecar.pid().unwrap()),
        floor_cg.counter(floor.pid()),
    ];

    let lease = cluster.client().acquire("rack/1", AcquireOptions::new(Duration::from_secs(600))).await.unwrap();
    let token = lease.token();
    let put = |uri: &'static str| -> MakeRequest { Arc::new(move |_| fenced_put(uri, token)) };
    let next = AtomicU64::new(0);
    let keyed: MakeRequest = Arc::new(move |_| {
        let mut req = fenced_put("/keyed/1", token);
        let key = format!("bench-{}", next.fetch_add(1, Ordering::Relaxed));
        req.headers_mut().insert("idempotency-key", key.parse().unwrap());
        req
    });
    let target = |name, counter, port, make| async move {
        Target { name, counter, connections: Connections::open(port, connections).await, make }
    };
    let mut targets = vec![
        target("nginx", 0, nginx_port, put("/racks/1")).await,
        target("haproxy", 1, haproxy_port, put("/racks/1")).await,
        target("hyper floor", 3, floor_port, put("/racks/1")).await,
        // The route `rest` (fence: off) takes any path but /racks/{rack}.
        target("sidecar (fence off)", 2, sidecar.port, put("/unfenced/1")).await,
        target("sidecar (cached)", 2, sidecar.port, put("/racks/1")).await,
        target("sidecar (cached, a new Idempotency-Key)", 2, sidecar.port, keyed).await,
    ];
    // Warm-up: the proxies' upstream connections, and the sidecar learns the grant.
    for t in &mut targets {
        let run = t.connections.exactly(warmup, WITHIN, t.make.clone()).await;
        assert_eq!(run.errors, 0, "warm-up of {}: {} errors; logs in {}", t.name, run.errors, dir.display());
    }

    let mut samples: Vec<Samples> = targets.iter().map(|_| Samples::default()).collect();
    for rep in 1..=reps {
        for (t, s) in targets.iter_mut().zip(&mut samples) {
            eprintln!("rep {rep}/{reps}: {}, {requests} requests", t.name);
            let counter = &mut counters[t.counter];
            counter.zero().await;
            let start = Instant::now();
            let run = t.connections.exactly(requests, WITHIN, t.make.clone()).await;
            let busy = counter.dump(&format!("{} rep {rep}", t.name)).await;
            let busy_seconds = start.elapsed().as_secs_f64();
            assert_eq!(run.errors, 0, "{}: {} errors; logs in {}", t.name, run.errors, dir.display());
            // As long again without requests.
            let start = Instant::now();
            tokio::time::sleep(Duration::from_secs_f64(busy_seconds)).await;
            let idle = counter.dump(&format!("{} rep {rep} idle", t.name)).await;
            let background = idle.instructions as f64 / start.elapsed().as_secs_f64();
            let gross = busy.instructions as f64 / requests as f64;
            s.net.push((busy.instructions as f64 - background * busy_seconds) / requests as f64);
            s.gross.push(gross);
            s.background.push(background);
            s.rps.push(run.rate());
            s.last = Some(busy);
        }
    }
    lease.release().await.unwrap();
    // Each path's last dump of requests, for callgrind_annotate.
    let mut annotate = vec![];
    for (t, s) in targets.iter().zip(&samples) {
        let copy = callgrind::for_annotate(&s.last.as_ref().unwrap().path);
        println!("{}: callgrind_annotate --inclusive=no {} | head -60", t.name, copy.display());
        annotate.push(copy);
    }
    println!("(--inclusive=yes: by inclusive cost)");
    write_results(&targets, &samples, &annotate, reps, requests, connections, perf);
}

/// Whether `perf stat` can count instructions here (virtual machines often
/// have no hardware counters); the benchmark uses callgrind either way, so
/// that figures from any machine compare.
fn perf_counts_instructions() -> String {
    let out = std::process::Command::new("perf").args(["stat", "-x,", "-e", "instructions:u", "--", "true"]).output();
    match out {
        Err(_) => "perf is not installed".into(),
        Ok(o) => {
            let said = String::from_utf8_lossy(&o.stderr);
            let count = said.lines().find(|l| l.contains("instructions")).and_then(|l| l.split(',').next());
            match count {
                Some(c) if c.trim().parse::<u64>().is_ok() => "perf counts instructions here too".into(),
                Some(c) => format!("`perf stat -e instructions:u` answers `{}` here", c.trim()),
                None => "perf stat printed no instruction count here".into(),
            }
        }
    }
}

fn write_results(
    targets: &[Target],
    samples: &[Samples],
    annotate: &[PathBuf],
    reps: usize,
    requests: u64,
    connections: usize,
    perf: String,
) {
    let at = |name: &str| targets.iter().position(|t| t.name == name).unwrap();
    let (nginx, cached) = (at("nginx"), at("sidecar (cached)"));
    let mut t = Table::new(&[
        "path",
        "instructions per request",
        "÷ nginx",
        "as counted, per request",
        "background, instructions/s",
        "requests/s under callgrind",
    ]);
    let med = |v: &[f64]| Spread::of(v).median;
    for (target, s) in targets.iter().zip(samples) {
        t.row(&[
            target.name.to_string(),
            Spread::of(&s.net).show(0),
            format!("{:.2}", med(&s.net) / med(&samples[nginx].net)),
            Spread::of(&s.gross).show(0),
            Spread::of(&s.background).show(0),
            Spread::of(&s.rps).show(0),
        ]);
    }
    let ratio = med(&samples[cached].net) / med(&samples[nginx].net);
    let per_rep: Vec<f64> = samples[cached].net.iter().zip(&samples[nginx].net).map(|(s, n)| s / n).collect();
    let shown: Vec<String> = per_rep.iter().map(|r| format!("{r:.3}")).collect();
    let mut targets_t = Table::new(&["target", "measured", "met"]);
    targets_t.row(&[
        "sidecar (cached) instructions per request ≤ 1.0× nginx".into(),
        format!("{ratio:.2}× (per repetition {})", shown.join(", ")),
        if ratio <= 1.0 { "yes" } else { "no" }.into(),
    ]);
    // What the target asks of hyper itself, and what is fencegate's own.
    let floor = med(&samples[at("hyper floor")].net);
    targets_t.row(&[
        "(the floor: hyper's server and client alone ÷ nginx)".into(),
        format!(
            "{:.2}×; the sidecar (cached) is {:.2}× the floor",
            floor / med(&samples[nginx].net),
            med(&samples[cached].net) / floor
        ),
        "–".into(),
    ]);

    let profile = |i: usize, n: usize| -> (String, Vec<serde_json::Value>) {
        let mut t = Table::new(&["function (self cost)", "instructions per request", "% of the requests' dump"]);
        let dump = samples[i].last.as_ref().unwrap();
        let top = callgrind::top_self(&annotate[i], n);
        for (count, function) in &top {
            t.row(&[
                format!("`{}`", function.replace('|', "\\|")),
                format!("{:.0}", *count as f64 / requests as f64),
                format!("{:.1}", *count as f64 * 100.0 / dump.instructions.max(1) as f64),
            ]);
        }
        let json =
            top.iter().map(|(c, f)| json!({"function": f, "per_request": *c as f64 / requests as f64})).collect();
        (t.markdown().to_string(), json)
    };
    let (sidecar_top, sidecar_json) = profile(cached, TOP[0]);
    let (nginx_top, nginx_json) = profile(nginx, TOP[1]);

    let markdown = format!(
        "`PUT /racks/1` with a valid `X-Fence-Token` (the fence-off row: `PUT /unfenced/1`), {requests} requests \
         per repetition over {connections} keep-alive connections opened and warmed up before, {reps} \
         repetitions: median (min–max). hyper floor: hyper's HTTP/1 server and client, one upstream connection per \
         client connection, nothing else, on one event loop (`bench/common/floor.rs`): the least any proxy built \
         on hyper and tokio costs. Each proxy runs under `valgrind --tool=callgrind` (all its threads); the \
         upstream and the lock cluster do not. \"Instructions per request\" subtracts what the process does \
         without requests over as long (its background, measured right after); \"as counted\" does not. nginx: one \
         process (`master_process off`), HAProxy: one thread. The sidecar has its default `workers` (one event \
         loop per core). {perf}.\n\n## Summary\n\n{}\n## Targets\n\n{}\n\
         ## Where the sidecar's instructions go (cached, last repetition)\n\n\
         Self cost by function, a function's inlined code included, from `callgrind_annotate --inclusive=no` \
         on the dump of the requests (background included).\n\n{sidecar_top}\n\
         ## nginx, for comparison\n\n{nginx_top}",
        t.markdown(),
        targets_t.markdown(),
    );
    let json = json!({
        "reps": reps,
        "requests": requests,
        "connections": connections,
        "paths": targets.iter().zip(samples).map(|(t, s)| json!({
            "name": t.name,
            "per_request": Spread::of(&s.net),
            "gross_per_request": Spread::of(&s.gross),
            "background_per_s": Spread::of(&s.background),
            "rps_under_callgrind": Spread::of(&s.rps),
        })).collect::<Vec<_>>(),
        "ratio_sidecar_cached_to_nginx": ratio,
        "ratio_per_rep": per_rep,
        "ratio_floor_to_nginx": floor / med(&samples[nginx].net),
        "top_self_sidecar_cached": sidecar_json,
        "top_self_nginx": nginx_json,
    });
    report::write("instructions", "Instructions per proxied request (callgrind)", &markdown, json);
}
