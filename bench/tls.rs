//! TLS on vs off: the same lock client logic against two 3-node fencegate
//! clusters side by side in one run, one plain and one secure (TLS on both
//! planes, mTLS between members, clients authenticated, an ACL). The secure
//! cluster is measured twice: clients presenting a bearer token, and clients
//! presenting a certificate instead. Both clusters run on loopback with fsync
//! on and data on the project's disk; clients talk to the leader.
//!
//! Per system and repetition: acquire+release latency with 1 client; pairs/s
//! with 1, 16 and 64 clients (closed loop, a key each) over keep-alive
//! connections opened beforehand; CPU per 1,000 pairs at 64 clients, of the
//! servers and of the load generator.
//!
//! Run: `cargo bench --bench tls` (env: BENCH_REPS, default 3; BENCH_SECONDS
//! per phase, default 5). Writes bench/results/tls.md and .json.

mod common;

use std::time::Duration;

use common::locks::{p50_p99_ms, pairs, plural, FencegateApi};
use common::procs::Usage;
use common::report::{self, Spread, Table};
use common::{cluster_options, env_or};
use fencegate_client::http::HttpClient;
use fencegate_client::tls::TlsFiles;
use fencegate_client::ClientOptions;
use fencegate_testkit::cluster::{ClusterOptions, Security};
use fencegate_testkit::{bin, Cluster};
use serde_json::{json, Map, Value};

const CLIENTS: [usize; 3] = [1, 16, 64];
/// Where CPU per pair is measured, and where the issue sets its target.
const MEASURED_CLIENTS: usize = 64;
/// mTLS may cost at most this share of the plain cluster's throughput.
const TARGET_LOSS: f64 = 0.10;
/// Unmeasured, before every phase: the phase's clients open their
/// connections (TLS handshakes included) and the measured phase reuses them.
/// Needed every time: nodes close connections idle for their header timeout
/// (10 s), as they are while the other systems are measured.
const WARMUP_SECONDS: f64 = 1.0;
/// The identity of the certificate-presenting clients.
const CERT_IDENTITY: &str = "bench-cert";
/// Lock answers are small.
const MAX_BODY: usize = 1 << 20;

/// One way of reaching a cluster, measured as a system of its own.
struct System<'a> {
    name: &'static str,
    api: FencegateApi,
    cluster: &'a Cluster,
}

/// One repetition's numbers for one system.
#[derive(Default)]
struct Rep {
    p50_ms: f64,
    p99_ms: f64,
    /// Per entry of `CLIENTS`.
    pairs_per_s: Vec<f64>,
    server_cpu_per_1000: f64,
    client_cpu_per_1000: f64,
}

/// CPU seconds the cluster's members have used so far.
fn server_cpu(c: &Cluster) -> f64 {
    c.ids().into_iter().map(|id| Usage::of_tree(c.pid(id)).cpu_seconds).sum()
}

/// CPU seconds of this process (the load generator) so far; the servers are
/// processes of their own.
fn client_cpu() -> f64 {
    Usage::of_pid(std::process::id()).expect("/proc/self").cpu_seconds
}

async fn measure(s: &System<'_>, rep: usize, seconds: f64) -> Rep {
    let leader = s.cluster.wait_for_leader(Duration::from_secs(30)).await;
    let url = s.cluster.url(leader);
    let mut r = Rep::default();
    for clients in CLIENTS {
        eprintln!("rep {rep} {}: {}", s.name, plural(clients, "client"));
        pairs(&s.api, &url, &format!("{rep}/warm"), clients, WARMUP_SECONDS).await;
        let (server, client) = (server_cpu(s.cluster), client_cpu());
        let (rate, latencies) = pairs(&s.api, &url, &format!("{rep}/{clients}"), clients, seconds).await;
        eprintln!("rep {rep} {}: {rate:.0} pairs/s", s.name);
        r.pairs_per_s.push(rate);
        let thousands = latencies.len() as f64 / 1000.0;
        if clients == 1 {
            (r.p50_ms, r.p99_ms) = p50_p99_ms(latencies);
        }
        if clients == MEASURED_CLIENTS {
            r.server_cpu_per_1000 = (server_cpu(s.cluster) - server) / thousands;
            r.client_cpu_per_1000 = (client_cpu() - client) / thousands;
        }
    }
    r
}

/// HTTPS presenting a certificate that names `CERT_IDENTITY`, and no token.
fn cert_client(secure: &Cluster) -> HttpClient {
    let pki = secure.pki().expect("a secure cluster");
    let (cert, key) = pki.client_cert(CERT_IDENTITY);
    let files = TlsFiles { ca: pki.ca.clone(), cert: Some(cert), key: Some(key) };
    let tls = files.client_config(["ca", "cert", "key"]).unwrap();
    ClientOptions { tls: Some(tls), token: None, ..secure.client_options() }.http_client(MAX_BODY).unwrap()
}

#[tokio::main]
async fn main() {
    let reps: usize = env_or("BENCH_REPS", 3);
    let seconds: f64 = env_or("BENCH_SECONDS", 5.0);
    eprintln!("starting two 3-node fencegate clusters, one plain and one secure");
    let plain = Cluster::start_with(&bin!(), cluster_options("")).await;
    let acl = format!("  - {{ identity: {CERT_IDENTITY}, prefixes: [\"bench/\"], rights: [acquire] }}\n");
    let security = Security { acl, tokens: vec![], ..Default::default() };
    let secure = Cluster::start_with(&bin!(), ClusterOptions { security: Some(security), ..cluster_options("") }).await;
    // The kit's client options: plain HTTP; or HTTPS trusting the cluster CA
    // with the kit's bearer token.
    let api = |c: &Cluster| FencegateApi(c.client_options().http_client(MAX_BODY).unwrap());
    let systems = [
        System { name: "plain HTTP", api: api(&plain), cluster: &plain },
        System { name: "TLS + token", api: api(&secure), cluster: &secure },
        System { name: "TLS + client cert", api: FencegateApi(cert_client(&secure)), cluster: &secure },
    ];
    let mut results: Vec<Vec<Rep>> = systems.iter().map(|_| vec![]).collect();
    for rep in 1..=reps {
        // Rotate who goes first, so that none always meets a warmer machine.
        for k in 0..systems.len() {
            let i = (rep - 1 + k) % systems.len();
            results[i].push(measure(&systems[i], rep, seconds).await);
        }
    }

    let mut headers = vec!["measurement".to_string(), systems[0].name.into()];
    for s in &systems[1..] {
        headers.extend([s.name.into(), format!("{} ÷ plain", s.name)]);
    }
    headers.push("better".into());
    let mut table = Table::new(&headers.iter().map(String::as_str).collect::<Vec<_>>());
    // One table row and its {system name: Spread} JSON.
    let mut row = |label: &str, better: &str, digits: usize, get: &dyn Fn(&Rep) -> f64| -> Value {
        let spreads: Vec<Spread> =
            results.iter().map(|reps| Spread::of(&reps.iter().map(get).collect::<Vec<_>>())).collect();
        let mut cells = vec![label.to_string(), spreads[0].show(digits)];
        for s in &spreads[1..] {
            cells.extend([s.show(digits), format!("{:.2}", s.median / spreads[0].median)]);
        }
        cells.push(better.into());
        table.row(&cells);
        let by_name: Map<String, Value> =
            systems.iter().zip(&spreads).map(|(s, sp)| (s.name.into(), json!(sp))).collect();
        by_name.into()
    };
    let p50 = row("acquire+release p50, 1 client (ms)", "lower", 2, &|r| r.p50_ms);
    let p99 = row("acquire+release p99, 1 client (ms)", "lower", 2, &|r| r.p99_ms);
    let throughput: Vec<Value> = CLIENTS
        .iter()
        .enumerate()
        .map(|(i, &clients)| {
            let label = format!("acquire+release pairs/s, {}", plural(clients, "client"));
            let mut v = row(&label, "higher", 0, &|r| r.pairs_per_s[i]);
            v["clients"] = json!(clients);
            v
        })
        .collect();
    let server_cpu =
        row(&format!("server CPU s per 1,000 pairs, {MEASURED_CLIENTS} clients (3 members)"), "lower", 3, &|r| {
            r.server_cpu_per_1000
        });
    let client_cpu =
        row(&format!("load generator CPU s per 1,000 pairs, {MEASURED_CLIENTS} clients"), "lower", 3, &|r| {
            r.client_cpu_per_1000
        });

    // The target, per secure system: the ratio of medians, and the ratios of
    // the systems' runs within each repetition (they ran minutes apart at most).
    let at = CLIENTS.iter().position(|&c| c == MEASURED_CLIENTS).unwrap();
    let rates = |reps: &[Rep]| reps.iter().map(|r| r.pairs_per_s[at]).collect::<Vec<_>>();
    let plain_rates = rates(&results[0]);
    let mut targets = Table::new(&["target", "measured", "per repetition", "met"]);
    let mut ratios = Map::new();
    for (s, reps) in systems.iter().zip(&results).skip(1) {
        let secure_rates = rates(reps);
        let of_medians = Spread::of(&secure_rates).median / Spread::of(&plain_rates).median;
        let per_rep = Spread::of(&secure_rates.iter().zip(&plain_rates).map(|(s, p)| s / p).collect::<Vec<_>>());
        let met = if of_medians >= 1.0 - TARGET_LOSS { "yes" } else { "no" };
        targets.row(&[
            format!("{}: pairs/s at {MEASURED_CLIENTS} clients ≥ {:.2}× plain", s.name, 1.0 - TARGET_LOSS),
            format!("{of_medians:.2}× ({:+.1} %)", (of_medians - 1.0) * 100.0),
            per_rep.show(2),
            met.into(),
        ]);
        ratios.insert(s.name.into(), json!({"of_medians": of_medians, "per_rep": per_rep}));
    }

    // The JSON: {"reps": N, "seconds": S (per phase), "systems": [name, ...],
    //   "latency_ms": {"p50": M, "p99": M}, "throughput": [M + {"clients": C}, ...],
    //   "server_cpu_s_per_1000": M, "client_cpu_s_per_1000": M,
    //   "throughput_ratio": {secure name: {"of_medians": R, "per_rep": Spread}}}
    // where every M is {system name: Spread} and a Spread is {"median",
    // "min", "max"} over the repetitions; ratios are secure ÷ plain at 64 clients.
    let json = json!({
        "reps": reps,
        "seconds": seconds,
        "systems": systems.iter().map(|s| s.name).collect::<Vec<_>>(),
        "latency_ms": {"p50": p50, "p99": p99},
        "throughput": throughput,
        "server_cpu_s_per_1000": server_cpu,
        "client_cpu_s_per_1000": client_cpu,
        "throughput_ratio": ratios,
    });
    let markdown = format!(
        "Two 3-node fencegate clusters on loopback, fsync on, data on the project's disk, no relays: one plain HTTP \
         on both planes; one with TLS on both planes (member certificates, mTLS between members), clients \
         authenticated and an ACL. The secure cluster is measured with two kinds of client: HTTPS with a bearer \
         token (the test kit's), and HTTPS with a client certificate (identity `{CERT_IDENTITY}`, ACL: acquire on \
         `bench/`) and no token. One JSON-over-HTTP/1.1 client logic sends to the leader. Before every phase its \
         clients run {WARMUP_SECONDS} s unmeasured, so the measured phase reuses keep-alive connections (no \
         handshakes in it). The three take turns going first per repetition. CPU is user+system from /proc: \
         the measured cluster's 3 members, and this benchmark's own process (every client). \
         BENCH_REPS={reps}, BENCH_SECONDS={seconds} (per phase); median (min–max) over the repetitions; ratios \
         are of the medians.\n\n{}\n#### Target\n\n{}",
        table.markdown(),
        targets.markdown()
    );
    report::write("tls", "Lock service with TLS on vs off", &markdown, json);
}
