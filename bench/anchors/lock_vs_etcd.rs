//! Lock-service anchors: fencegate beside etcd — through its native gRPC
//! API (v3lock `Lock`/`Unlock` on a session's lease) and through its JSON
//! gateway (lease grant + put-if-absent txn + revoke) — and beside Redis
//! (`SET NX PX` + compare-and-delete, the unsafe baseline), side by side in
//! one run, one client logic (`Backend`) for all four. The clusters run on
//! loopback with fsync on, data on the project's disk and the same election
//! timeouts; every client talks to the leader, as a client that found it
//! would.
//!
//! Per repetition (systems in an order that rotates every repetition): for
//! each system, acquire+release latency with 1 client; pairs/s with 1, 16,
//! 64 and 256 clients (closed loop, a key each); grants per leader fsync and
//! server CPU per 1,000 pairs at 256 clients; keepalives/s from 64 holders;
//! peak RSS. Then, for fencegate and etcd gRPC (which goes first
//! alternates), acquire+release latency of one closed-loop client while
//! `BENCH_LIVE_LEASES` other leases are kept alive and a watch is open
//! (fencegate: a sidecar's; etcd: on the lock prefix). Last, the time from
//! SIGKILL of the leader to the next grant (fencegate; etcd through the
//! JSON client; and a fencegate cluster with the old Raft defaults).
//!
//! Before/after: with `BENCH_BEFORE_BIN` naming another `fencegate` binary
//! (an earlier build), a second 3-node cluster of it is one more system,
//! "fencegate before", in the same rotation and with the same phases (not
//! the loaded phase, nor failover): a change's effect next to etcd's, from
//! one run on one machine. The table then has a "fencegate ÷ fencegate
//! before" column and a line with its p50 and 64-client pairs/s ratios.
//!
//! Run: `bench/run lock_vs_etcd` (it builds the `fencegate` binary this
//! package starts, and installs etcd, Redis and protoc). Env: BENCH_REPS
//! (default 3), BENCH_SECONDS per phase (default 5), BENCH_LIVE_LEASES
//! (default 10000), BENCH_BEFORE_BIN (unset: no "fencegate before"; a
//! relative path is taken from the workspace root, where `bench/run` runs).
//! Writes bench/results/lock_vs_etcd.md and .json.

#[path = "../common/mod.rs"]
mod common;
mod etcd_grpc;
mod etcd_json;
mod redis_lock;
mod servers;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::etcd::start_etcd;
use common::holders::{Holders, KeepaliveStats};
use common::locks::{p50_p99_ms, pairs, plural, Backend, FencegateApi, LOAD_TIMEOUT, TTL};
use common::procs::Usage;
use common::report::{self, mib, Spread, Table};
use common::{cluster_options, fenced_sidecar, fencegate_cluster};
use etcd_grpc::{EtcdGrpc, EtcdLive};
use etcd_json::EtcdJson;
use fencegate_client::http::HttpClient;
use fencegate_testkit::upstream::{Recording, Upstream};
use fencegate_testkit::{Bin, Cluster};
use redis_lock::{RedisApi, RedisServer};
use serde_json::{json, Value};
use servers::{failover, healthy, metric, Servers};
use std::sync::atomic::Ordering::Relaxed;
use tokio::time::Instant;

const CLIENTS: [usize; 4] = [1, 16, 64, 256];
/// Where grants per fsync and CPU per pair are measured: the heaviest load,
/// closest to saturation.
const MEASURED_CLIENTS: usize = 256;
const HOLDERS: usize = 64;
/// openraft 0.9 makes a follower wait a leader lease (election_timeout_max)
/// on top of its election timeout before it campaigns: with the defaults
/// (100–250 ms) after 350–500 ms, where etcd campaigns after 300–600 ms.
/// A second fencegate cluster with the defaults before this release
/// (100 ms, 300–600 ms: 900–1200 ms) shows what they cost (failover only).
const OLD_RAFT: &str = "raft:\n  heartbeat: 100ms\n  election_timeout_min: 300ms\n  election_timeout_max: 600ms\n";

/// The systems, in the tables' order: (column, JSON key). "fencegate
/// before" only with `BENCH_BEFORE_BIN`.
const SYSTEMS: [(&str, &str); 5] = [
    ("fencegate", "fencegate"),
    ("fencegate before", "fencegate_before"),
    ("etcd gRPC", "etcd_grpc"),
    ("etcd JSON", "etcd_json"),
    ("Redis", "redis"),
];
const FENCEGATE: usize = 0;
const BEFORE: usize = 1;
const ETCD_GRPC: usize = 2;
const ETCD_JSON: usize = 3;
const REDIS: usize = 4;
/// The before/after line's pairs/s: at the client count of the README's
/// throughput target (≥ 2× etcd gRPC at 64 clients).
const BEFORE_AFTER_CLIENTS: usize = 64;

/// One repetition's numbers for one system; None where a number does not
/// apply to it (see the table's notes).
#[derive(Default)]
struct Rep {
    p50_ms: f64,
    p99_ms: f64,
    /// Per entry of `CLIENTS`.
    pairs_per_s: Vec<f64>,
    keepalives_per_s: f64,
    grants_per_fsync: Option<f64>,
    cpu_s_per_1000: f64,
    peak_rss_mib: f64,
    failover_ms: Option<f64>,
    /// 1 client while the live leases are kept alive and a watch is open.
    loaded_p50_ms: Option<f64>,
    loaded_p99_ms: Option<f64>,
}

/// Where one system's costs are read while it is measured: its server
/// processes, and the leader's fsync counter on /metrics (none for Redis).
struct Meter<'a> {
    http: &'a HttpClient,
    pids: Vec<u32>,
    fsyncs: Option<(String, &'static str)>,
}

impl Meter<'_> {
    fn of<'a, S: Servers>(s: &S, http: &'a HttpClient, leader_url: &str) -> Meter<'a> {
        let pids = s.urls().keys().map(|&id| s.member_pid(id)).collect();
        Meter { http, pids, fsyncs: Some((leader_url.into(), S::FSYNCS)) }
    }

    async fn fsyncs(&self) -> Option<f64> {
        let (url, name) = self.fsyncs.as_ref()?;
        Some(metric(self.http, url, name).await)
    }

    fn cpu_seconds(&self) -> f64 {
        self.pids.iter().map(|&pid| Usage::of_tree(pid).cpu_seconds).sum()
    }
}

async fn measure<B: Backend>(api: &B, url: &str, meter: &Meter<'_>, name: &str, rep: usize, seconds: f64) -> Rep {
    let progress = |what: &str| eprintln!("rep {rep} {name}: {what}");
    let mut r = Rep::default();
    for clients in CLIENTS {
        progress(&plural(clients, "client"));
        let (fsyncs, cpu) = (meter.fsyncs().await, meter.cpu_seconds());
        let (rate, latencies) = pairs(api, url, &format!("{rep}/{clients}"), clients, seconds).await;
        r.pairs_per_s.push(rate);
        let grants = latencies.len() as f64;
        if clients == 1 {
            (r.p50_ms, r.p99_ms) = p50_p99_ms(latencies);
        }
        if clients == MEASURED_CLIENTS {
            r.grants_per_fsync = fsyncs.zip(meter.fsyncs().await).map(|(before, after)| grants / (after - before));
            r.cpu_s_per_1000 = (meter.cpu_seconds() - cpu) / grants * 1000.0;
        }
    }
    progress(&format!("{HOLDERS} holders keeping alive"));
    r.keepalives_per_s = keepalives(api, url, &format!("{rep}/ka"), seconds).await;
    r.peak_rss_mib = mib(meter.pids.iter().map(|&pid| Usage::of_tree(pid).peak_rss).sum());
    r
}

/// `HOLDERS` leases, each kept alive back to back for `seconds`: keepalives/s.
async fn keepalives<B: Backend>(api: &B, url: &str, tag: &str, seconds: f64) -> f64 {
    let mut held = vec![];
    for h in 0..HOLDERS {
        held.push(api.acquire(url, &format!("bench/{tag}/{h}"), TTL, LOAD_TIMEOUT).await.unwrap());
    }
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = held
        .into_iter()
        .map(|held| {
            let (api, url) = (api.clone(), url.to_string());
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    api.keepalive(&url, &held).await.unwrap();
                    n += 1;
                }
                let end = Instant::now();
                api.release(&url, &held).await.unwrap();
                (n, end)
            })
        })
        .collect();
    let (mut total, mut end) = (0, start);
    for t in tasks {
        let (n, e) = t.await.unwrap();
        total += n;
        end = end.max(e);
    }
    total as f64 / (end - start).as_secs_f64()
}

/// The prober's latency under load, and how the live leases fared.
struct Loaded {
    p50_ms: f64,
    p99_ms: f64,
    keepalives_sent: u64,
    keepalive_errors: u64,
}

impl Loaded {
    async fn probe<B: Backend>(api: &B, url: &str, rep: usize, seconds: f64, stats: &KeepaliveStats) -> Loaded {
        let (sent, errors) = (stats.sent.load(Relaxed), stats.errors.load(Relaxed));
        let (_, latencies) = pairs(api, url, &format!("{rep}/loaded"), 1, seconds).await;
        let (p50_ms, p99_ms) = p50_p99_ms(latencies);
        Loaded {
            p50_ms,
            p99_ms,
            keepalives_sent: stats.sent.load(Relaxed) - sent,
            keepalive_errors: stats.errors.load(Relaxed) - errors,
        }
    }
}

/// fencegate with `live` leases on keys `live/{rep}/{i}` kept alive (paced
/// loops, a keepalive every 20 s each, as `bench/scale.rs` keeps them) and
/// a sidecar (strict, cached) watching the lock service.
async fn loaded_fencegate(
    cluster: &Cluster,
    api: &FencegateApi,
    url: &str,
    upstream_port: u16,
    live: usize,
    rep: usize,
    seconds: f64,
) -> Loaded {
    let sidecar = fenced_sidecar(cluster, &format!("sidecar-{rep}"), upstream_port, "cached").await;
    let mut holders = Holders::new(url.into(), &format!("live/{rep}/"));
    let rate = holders.grow_to(live).await;
    eprintln!("rep {rep} fencegate: {live} live leases (built at {rate:.0}/s), a sidecar watching; 1 client");
    let loaded = Loaded::probe(api, url, rep, seconds, &holders.stats).await;
    holders.release_all().await;
    drop(sidecar);
    loaded
}

/// etcd with `live` leases, each holding a v3lock lock on
/// `bench/live/{rep}/{i}`, kept alive on keepalive streams at the same rate,
/// and a watch on `bench/`, where the prober's locks are too.
async fn loaded_etcd(api: &EtcdGrpc, url: &str, live: usize, rep: usize, seconds: f64) -> Loaded {
    let start = Instant::now();
    let leases = EtcdLive::start(url, &format!("bench/live/{rep}/"), "bench/", live).await.unwrap();
    let rate = live as f64 / start.elapsed().as_secs_f64();
    eprintln!("rep {rep} etcd gRPC: {live} live leases (built at {rate:.0}/s), a watch on bench/; 1 client");
    let loaded = Loaded::probe(api, url, rep, seconds, &leases.stats).await;
    leases.release_all().await;
    loaded
}

/// The earlier build's binary, if `BENCH_BEFORE_BIN` names one (relative
/// to the workspace root: Cargo runs this in `bench/anchors`).
fn before_bin() -> Option<PathBuf> {
    let var = std::env::var("BENCH_BEFORE_BIN").ok().filter(|v| !v.is_empty())?;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(&var);
    let path = std::fs::canonicalize(path).unwrap_or_else(|e| panic!("BENCH_BEFORE_BIN={var}: {e}"));
    assert!(path.is_file(), "BENCH_BEFORE_BIN={var} is not a file");
    Some(path)
}

#[tokio::main]
async fn main() {
    let reps: usize = common::env_or("BENCH_REPS", 3);
    let seconds: f64 = common::env_or("BENCH_SECONDS", 5.0);
    let live: usize = common::env_or("BENCH_LIVE_LEASES", 10_000);
    // One client for both: metrics pages are large, lock answers small.
    let http = HttpClient::new(8 << 20);
    let (fencegate_api, etcd_json) = (FencegateApi(http.clone()), EtcdJson(http.clone()));
    eprintln!("starting a 3-node fencegate cluster, a 3-member etcd cluster and redis-server");
    let mut fencegate = fencegate_cluster("").await;
    let mut etcd = start_etcd();
    let redis = RedisServer::start().await;
    let redis_api = RedisApi::connect(&redis.url).await.unwrap();
    let upstream = Upstream::start_on_own_thread(Recording::CountOnly);
    let mut old = fencegate_cluster(OLD_RAFT).await;
    let before_bin = before_bin();
    let mut before = None;
    if let Some(path) = &before_bin {
        eprintln!("starting a 3-node fencegate cluster of {} (fencegate before)", path.display());
        // The same options as this build's cluster: only the binary differs.
        before = Some(Cluster::start_with(&Bin::new(path), cluster_options("")).await);
    }
    let systems: Vec<usize> = (0..SYSTEMS.len()).filter(|&s| s != BEFORE || before.is_some()).collect();
    let mut runs: [Vec<Rep>; SYSTEMS.len()] = Default::default();
    let (mut old_failover, mut loaded_keepalives) = (vec![], [(0, 0); 2]);
    for rep in 1..=reps {
        let f_leader = healthy(&fencegate, &http).await;
        let e_leader = healthy(&etcd, &http).await;
        let (f_url, e_url) = (Servers::urls(&fencegate)[&f_leader].clone(), etcd.urls()[&e_leader].clone());
        // A session on this repetition's leader: the leader may have moved.
        let etcd_grpc = EtcdGrpc::connect(&e_url, TTL, HOLDERS).await.unwrap();
        let mut b_url = String::new();
        if let Some(b) = &before {
            b_url = Servers::urls(b)[&healthy(b, &http).await].clone();
        }
        // Rotate who goes first, so that none always meets a warmer machine.
        let mut order = systems.clone();
        order.rotate_left((rep - 1) % systems.len());
        for system in order {
            let name = SYSTEMS[system].0;
            let r = match system {
                FENCEGATE => {
                    measure(&fencegate_api, &f_url, &Meter::of(&fencegate, &http, &f_url), name, rep, seconds).await
                }
                BEFORE => {
                    let meter = Meter::of(before.as_ref().unwrap(), &http, &b_url);
                    measure(&fencegate_api, &b_url, &meter, name, rep, seconds).await
                }
                ETCD_GRPC => measure(&etcd_grpc, &e_url, &Meter::of(&etcd, &http, &e_url), name, rep, seconds).await,
                ETCD_JSON => measure(&etcd_json, &e_url, &Meter::of(&etcd, &http, &e_url), name, rep, seconds).await,
                REDIS => {
                    let meter = Meter { http: &http, pids: vec![redis.pid()], fsyncs: None };
                    measure(&redis_api, &redis.url, &meter, name, rep, seconds).await
                }
                _ => unreachable!("no system {system}"),
            };
            runs[system].push(r);
        }
        // Latency under load: which system goes first alternates.
        let f_loaded = || loaded_fencegate(&fencegate, &fencegate_api, &f_url, upstream.port, live, rep, seconds);
        let e_loaded = || loaded_etcd(&etcd_grpc, &e_url, live, rep, seconds);
        let loaded = if rep % 2 == 1 {
            let f = f_loaded().await;
            [f, e_loaded().await]
        } else {
            let e = e_loaded().await;
            [f_loaded().await, e]
        };
        etcd_grpc.close().await;
        for (l, system) in loaded.iter().zip([FENCEGATE, ETCD_GRPC]) {
            let r = runs[system].last_mut().unwrap();
            (r.loaded_p50_ms, r.loaded_p99_ms) = (Some(l.p50_ms), Some(l.p99_ms));
        }
        for (total, l) in loaded_keepalives.iter_mut().zip(&loaded) {
            (total.0, total.1) = (total.0 + l.keepalives_sent, total.1 + l.keepalive_errors);
        }
        // Failover is the cluster's: etcd's is measured once, with the JSON client.
        eprintln!("rep {rep}: killing the leaders");
        let ms = failover(&fencegate_api, &mut fencegate, f_leader, &format!("{rep}/failover")).await;
        runs[FENCEGATE].last_mut().unwrap().failover_ms = Some(ms);
        let ms = failover(&etcd_json, &mut etcd, e_leader, &format!("{rep}/failover")).await;
        runs[ETCD_JSON].last_mut().unwrap().failover_ms = Some(ms);
        eprintln!("rep {rep} fencegate (old defaults: heartbeat 100 ms, elections 300–600 ms): killing the leader");
        let leader = healthy(&old, &http).await;
        old_failover.push(failover(&fencegate_api, &mut old, leader, &format!("{rep}/failover")).await);
    }
    let run = Run { systems, before_bin, reps, seconds, live };
    let (markdown, json) = results(&run, &runs, &old_failover, loaded_keepalives);
    report::write("lock_vs_etcd", "Lock service vs etcd and Redis", &markdown, json);
}

/// How a run was set up.
struct Run {
    /// Those of `SYSTEMS` measured, in the tables' order.
    systems: Vec<usize>,
    before_bin: Option<PathBuf>,
    reps: usize,
    seconds: f64,
    live: usize,
}

/// The table (Markdown) and the JSON of a run.
fn results(
    run: &Run,
    runs: &[Vec<Rep>; SYSTEMS.len()],
    old_failover: &[f64],
    loaded_keepalives: [(u64, u64); 2],
) -> (String, Value) {
    let Run { ref systems, reps, seconds, live, .. } = *run;
    // A ratio column "fencegate ÷ X" for every other system measured.
    let others = &systems[1..];
    let mut headers = vec!["measurement".to_string()];
    headers.extend(systems.iter().map(|&s| SYSTEMS[s].0.to_string()));
    headers.extend(others.iter().map(|&s| format!("fencegate ÷ {}", SYSTEMS[s].0)));
    headers.push("better".into());
    let mut table = Table::new(&headers.iter().map(String::as_str).collect::<Vec<_>>());
    // One table row and its {"fencegate": Spread, "etcd_grpc": ..., "etcd_json": ..., "redis": ...}
    // JSON (null where a system has no such number; "fencegate_before" only if measured).
    let mut row = |label: &str, higher_is_better: bool, digits: usize, get: &dyn Fn(&Rep) -> Option<f64>| {
        let spreads: Vec<Option<Spread>> = runs
            .iter()
            .map(|reps| reps.iter().map(get).collect::<Option<Vec<f64>>>().filter(|v| !v.is_empty()))
            .map(|v| v.map(|v| Spread::of(&v)))
            .collect();
        let show = |s: &Option<Spread>, f: &dyn Fn(&Spread) -> String| s.as_ref().map_or("–".into(), f);
        let mut cells = vec![label.to_string()];
        cells.extend(systems.iter().map(|&s| show(&spreads[s], &|s| s.show(digits))));
        for &other in others {
            let ratio = spreads[FENCEGATE].zip(spreads[other]).map(|(f, o)| f.median / o.median);
            cells.push(ratio.map_or("–".into(), |r| format!("{r:.2}")));
        }
        cells.push(if higher_is_better { "higher" } else { "lower" }.into());
        table.row(&cells);
        Value::Object(systems.iter().map(|&s| (SYSTEMS[s].1.to_string(), json!(spreads[s]))).collect())
    };
    let p50 = row("acquire+release p50, 1 client (ms)", false, 2, &|r| Some(r.p50_ms));
    let p99 = row("acquire+release p99, 1 client (ms)", false, 2, &|r| Some(r.p99_ms));
    let throughput: Vec<Value> = CLIENTS
        .iter()
        .enumerate()
        .map(|(i, &clients)| {
            let label = format!("acquire+release pairs/s, {}", plural(clients, "client"));
            let mut v = row(&label, true, 0, &|r| Some(r.pairs_per_s[i]));
            v["clients"] = json!(clients);
            v
        })
        .collect();
    let under_load = format!("1 client, {live} other leases kept alive and a watch open");
    let loaded_p50 = row(&format!("acquire+release p50, {under_load} (ms)"), false, 2, &|r| r.loaded_p50_ms);
    let loaded_p99 = row(&format!("acquire+release p99, {under_load} (ms)"), false, 2, &|r| r.loaded_p99_ms);
    let keepalives = row(&format!("keepalives/s, {HOLDERS} holders"), true, 0, &|r| Some(r.keepalives_per_s));
    let per_fsync =
        row(&format!("grants per leader fsync, {MEASURED_CLIENTS} clients"), true, 2, &|r| r.grants_per_fsync);
    let cpu_label = format!("server CPU s per 1,000 pairs, {MEASURED_CLIENTS} clients (all members)");
    let cpu = row(&cpu_label, false, 3, &|r| Some(r.cpu_s_per_1000));
    let rss = row("peak RSS, all members summed (MiB)", false, 0, &|r| Some(r.peak_rss_mib));
    let failover_ms = row("leader SIGKILL → next grant (ms)", false, 0, &|r| r.failover_ms);
    let old = Spread::of(old_failover);
    let label = "leader SIGKILL → next grant (ms), fencegate's old defaults: heartbeat 100 ms, elections 300–600 ms";
    let etcd_failover = Spread::of(&runs[ETCD_JSON].iter().filter_map(|r| r.failover_ms).collect::<Vec<_>>());
    let ratio = format!("{:.2}", old.median / etcd_failover.median);
    let mut cells = vec![label.to_string()];
    cells.extend(systems.iter().map(|&s| match s {
        FENCEGATE => old.show(0),
        ETCD_JSON => etcd_failover.show(0),
        _ => "–".into(),
    }));
    cells.extend(others.iter().map(|&s| if s == ETCD_JSON { ratio.clone() } else { "–".into() }));
    cells.push("lower".into());
    table.row(&cells);

    // The JSON: {"reps": N, "seconds": S (per phase), "systems": [keys], "live_leases": L,
    //   "latency_ms": {"p50": M, "p99": M}, "throughput": [M + {"clients": C}, ...],
    //   "loaded_latency_ms": {"p50": M, "p99": M}, "keepalives_per_s": M, "grants_per_fsync": M,
    //   "cpu_s_per_1000": M, "peak_rss_mib": M, "failover_ms": M,
    //   "failover_old_defaults_ms": {"fencegate": Spread}, "before_bin": path or null}
    // where every M is {"fencegate": Spread, "etcd_grpc": ..., "etcd_json": ..., "redis": ...}
    // (null where not measured; with BENCH_BEFORE_BIN "fencegate_before" too) and a Spread
    // is {"median", "min", "max"} over the repetitions.
    let json = json!({
        "reps": reps,
        "seconds": seconds,
        "systems": systems.iter().map(|&s| SYSTEMS[s].1).collect::<Vec<_>>(),
        "before_bin": run.before_bin,
        "live_leases": live,
        "latency_ms": {"p50": p50, "p99": p99},
        "throughput": throughput,
        "loaded_latency_ms": {"p50": loaded_p50, "p99": loaded_p99},
        "keepalives_per_s": keepalives,
        "grants_per_fsync": per_fsync,
        "cpu_s_per_1000": cpu,
        "peak_rss_mib": rss,
        "failover_ms": failover_ms,
        "failover_old_defaults_ms": {"fencegate": old},
    });
    let [(f_sent, f_errors), (e_sent, e_errors)] = loaded_keepalives;
    let markdown = format!(
        "3 fencegate nodes and 3 etcd {} members on loopback, fsync on; fencegate's default Raft timings \
         (heartbeat 50 ms, election timeout 100–250 ms, plus openraft's leader lease of election_timeout_max \
         before a follower campaigns: 350–500 ms), etcd's election timeout 300 ms (campaigns after 300–600 ms); \
         one redis-server {} with its defaults (no AOF, RDB snapshots). Every client sends to the leader. \
         fencegate: `POST /v1/locks/{{key}}` + `DELETE /v1/leases/{{id}}` over HTTP/1.1. etcd gRPC: one session \
         (a lease kept alive on a LeaseKeepAlive stream) shared by the process's clients; a pair is \
         `Lock(name, lease)` + `Unlock(key)`, the token the lock key's create revision. etcd JSON: lease grant + \
         put-if-absent txn, release = lease revoke. Redis: `SET key value NX PX`, release a compare-and-delete \
         script; no fencing token. Under load: one closed-loop client while {live} other leases are kept alive \
         (a keepalive every 20 s each; fencegate over HTTP in paced loops, etcd on keepalive streams of 1,000 \
         leases each) and a watch is open (fencegate: a sidecar's, on all keys; etcd: on the lock prefix); \
         keepalives sent / failed while probed: fencegate {f_sent} / {f_errors}, etcd {e_sent} / {e_errors}. \
         Failover is the cluster's (etcd's with the JSON client); the last row is another fencegate cluster \
         with the old defaults (100 ms, 300–600 ms). BENCH_REPS={reps}, BENCH_SECONDS={seconds} (per phase); \
         median (min–max) over the repetitions; the ratios are of the medians; – where a number does not apply.\n\n{}{}",
        version("etcd", "etcd Version: "),
        version("redis-server", "Redis server v="),
        before_after(run, runs),
        table.markdown()
    );
    (markdown, json)
}

/// With "fencegate before": what it is, and the two before/after ratios
/// the comparison is about; else nothing.
fn before_after(run: &Run, runs: &[Vec<Rep>; SYSTEMS.len()]) -> String {
    let Some(path) = &run.before_bin else { return String::new() };
    let at = CLIENTS.iter().position(|&c| c == BEFORE_AFTER_CLIENTS).unwrap();
    let ratio = |get: &dyn Fn(&Rep) -> f64| {
        let median = |s: usize| Spread::of(&runs[s].iter().map(get).collect::<Vec<_>>()).median;
        median(FENCEGATE) / median(BEFORE)
    };
    let (p50, pairs) = (ratio(&|r| r.p50_ms), ratio(&|r| r.pairs_per_s[at]));
    format!(
        "fencegate before: a second 3-node cluster, the same options, of another build \
         (BENCH_BEFORE_BIN={}), measured with the same phases in the same rotation; not under load nor in \
         failover (–). Peak RSS is a high-water mark: from the second repetition on, fencegate's also \
         covers the loaded phase, which fencegate before skips. **fencegate ÷ fencegate before: p50, 1 client {p50:.2} (lower is better); pairs/s, \
         {BEFORE_AFTER_CLIENTS} clients {pairs:.2} (higher is better).**\n\n",
        path.display()
    )
}

/// `program --version`'s version: the first word after `prefix`.
fn version(program: &str, prefix: &str) -> String {
    let out = std::process::Command::new(program).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.split_once(prefix).map(|(_, rest)| rest.split_whitespace().next().unwrap_or("?"));
    v.unwrap_or("?").to_string()
}
