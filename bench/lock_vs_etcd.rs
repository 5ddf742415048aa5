//! Lock service vs etcd: the same lock client logic, over one JSON-over-HTTP
//! client, against a 3-node fencegate cluster and a 3-member etcd cluster,
//! side by side in one run. Both run on loopback with fsync on, data on the
//! project's disk and the same election timeouts; the client talks to the
//! leader, as a client that found it would.
//!
//! A lock on etcd is what its lock recipes do, minus the waiting: grant a
//! lease, then put the key attached to it if the key does not exist; the
//! fencing token is the revision of that put. Release revokes the lease.
//!
//! Per system and repetition: acquire+release latency with 1 client; pairs/s
//! with 1, 16, 64 and 256 clients (closed loop, a key each); grants per leader
//! fsync and server CPU per 1,000 pairs at 256 clients; keepalives/s from 64
//! holders; peak RSS of the three servers; and the time from SIGKILL of the
//! leader to the next grant.
//!
//! Run: `cargo bench --bench lock_vs_etcd` (env: BENCH_REPS, default 3;
//! BENCH_SECONDS per phase, default 5). Writes bench/results/lock_vs_etcd.md
//! and .json.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use common::etcd::{base64, start_etcd, Etcd};
use common::fencegate_cluster;
use common::locks::{call, p50_p99_ms, pairs, plural, Backend, FencegateApi, Held, LOAD_TIMEOUT, TTL};
use common::procs::Usage;
use common::report::{self, mib, Spread, Table};
use fencegate_client::http::HttpClient;
use fencegate_testkit::Cluster;
use hyper::Method;
use serde_json::{json, Value};
use tokio::time::Instant;

const CLIENTS: [usize; 4] = [1, 16, 64, 256];
/// Where grants per fsync and CPU per pair are measured: the heaviest load,
/// closest to saturation.
const MEASURED_CLIENTS: usize = 256;
const HOLDERS: usize = 64;
/// Failover grants are never released; they expire while the killed member
/// restarts, before the next repetition.
const FAILOVER_TTL: Duration = Duration::from_secs(2);
/// While failing over, give up on a dead member quickly and try the next.
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(300);
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// openraft 0.9 makes a follower wait a leader lease (election_timeout_max)
/// on top of its election timeout before it campaigns: with the defaults
/// (100–250 ms) after 350–500 ms, where etcd campaigns after 300–600 ms.
/// A second fencegate cluster with the defaults before this release
/// (100 ms, 300–600 ms: 900–1200 ms) shows what they cost (failover only).
const OLD_RAFT: &str = "raft:\n  heartbeat: 100ms\n  election_timeout_min: 300ms\n  election_timeout_max: 600ms\n";

/// etcd's JSON gateway: 64-bit numbers travel as decimal strings, keys and
/// values as base64, and fields with default values (false, 0) are left out.
#[derive(Clone)]
struct EtcdApi(HttpClient);

impl Backend for EtcdApi {
    async fn acquire(&self, url: &str, key: &str, ttl: Duration, timeout: Duration) -> Result<Held> {
        let grant = json!({"TTL": ttl.as_secs()});
        let grant = call(&self.0, Method::POST, &format!("{url}/v3/lease/grant"), Some(grant), timeout).await?;
        let lease = grant["ID"].as_str().context("no lease ID")?.to_string();
        let key = base64(key.as_bytes());
        let txn = json!({
            "compare": [{"key": key, "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": base64(b"bench"), "lease": lease}}],
        });
        let put = call(&self.0, Method::POST, &format!("{url}/v3/kv/txn"), Some(txn), timeout).await?;
        if put["succeeded"] != true {
            bail!("key {key} is held");
        }
        let token = put["header"]["revision"].as_str().context("no revision")?.parse()?;
        Ok(Held { token, lease })
    }

    async fn release(&self, url: &str, held: &Held) -> Result<()> {
        let body = json!({"ID": held.lease});
        call(&self.0, Method::POST, &format!("{url}/v3/lease/revoke"), Some(body), LOAD_TIMEOUT).await.map(drop)
    }

    async fn keepalive(&self, url: &str, held: &Held) -> Result<()> {
        let body = json!({"ID": held.lease});
        let v = call(&self.0, Method::POST, &format!("{url}/v3/lease/keepalive"), Some(body), LOAD_TIMEOUT).await?;
        // A lease that is gone answers 200 without a TTL.
        v["result"]["TTL"].as_str().map(drop).context("lease lost")
    }
}

/// How one member sees the cluster.
struct Status {
    me: String,
    leader: Option<String>,
    applied: u64,
}

/// A running 3-member cluster, members numbered 1..=3.
trait Servers {
    const NAME: &'static str;
    /// The counter of log fsyncs on /metrics.
    const FSYNCS: &'static str;
    fn urls(&self) -> &BTreeMap<u64, String>;
    fn member_pid(&self, id: u64) -> u32;
    fn kill(&mut self, id: u64);
    fn restart(&mut self, id: u64);
    async fn status(&self, http: &HttpClient, url: &str) -> Result<Status>;
}

impl Servers for Cluster {
    const NAME: &'static str = "fencegate";
    const FSYNCS: &'static str = "fencegate_raft_log_syncs_total";

    fn urls(&self) -> &BTreeMap<u64, String> {
        self.url_map()
    }
    fn member_pid(&self, id: u64) -> u32 {
        self.pid(id)
    }
    fn kill(&mut self, id: u64) {
        Cluster::kill(self, id)
    }
    fn restart(&mut self, id: u64) {
        self.start_node(id)
    }

    async fn status(&self, http: &HttpClient, url: &str) -> Result<Status> {
        let v = call(http, Method::GET, &format!("{url}/v1/cluster"), None, STATUS_TIMEOUT).await?;
        Ok(Status {
            me: v["id"].to_string(),
            leader: v["leader"].as_u64().map(|l| l.to_string()),
            applied: v["commit_index"].as_u64().context("no commit_index")?,
        })
    }
}

impl Servers for Etcd {
    const NAME: &'static str = "etcd";
    const FSYNCS: &'static str = "etcd_disk_wal_fsync_duration_seconds_count";

    fn urls(&self) -> &BTreeMap<u64, String> {
        &self.urls
    }
    fn member_pid(&self, id: u64) -> u32 {
        Etcd::member_pid(self, id)
    }
    fn kill(&mut self, id: u64) {
        self.kill_member(id)
    }
    fn restart(&mut self, id: u64) {
        self.start_member(id)
    }

    async fn status(&self, http: &HttpClient, url: &str) -> Result<Status> {
        let v =
            call(http, Method::POST, &format!("{url}/v3/maintenance/status"), Some(json!({})), STATUS_TIMEOUT).await?;
        Ok(Status {
            me: v["header"]["member_id"].as_str().context("no member_id")?.into(),
            leader: v["leader"].as_str().filter(|l| *l != "0").map(String::from),
            applied: v["raftAppliedIndex"].as_str().context("no raftAppliedIndex")?.parse()?,
        })
    }
}

/// Wait until every member answers, follows the same leader and has applied
/// the same index (so a restarted member has caught up); the leader's number.
async fn healthy<S: Servers>(s: &S, http: &HttpClient) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut seen = vec![];
        for (id, url) in s.urls() {
            if let Ok(status) = s.status(http, url).await {
                seen.push((*id, status));
            }
        }
        if let Some(leader) = agreed(&seen, s.urls().len()) {
            return leader;
        }
        assert!(Instant::now() < deadline, "{} did not become healthy", S::NAME);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader's number if all `n` members answered, follow the same leader
/// and have applied the same index.
fn agreed(seen: &[(u64, Status)], n: usize) -> Option<u64> {
    let first = &seen.first()?.1;
    let leader = first.leader.as_ref()?;
    let same = seen.iter().all(|(_, st)| st.leader == first.leader && st.applied == first.applied);
    if seen.len() < n || !same {
        return None;
    }
    seen.iter().find(|(_, st)| st.me == *leader).map(|(id, _)| *id)
}

/// A counter (or a histogram's count) on `url`/metrics.
async fn metric(http: &HttpClient, url: &str, name: &str) -> f64 {
    let a = http.call(Method::GET, &format!("{url}/metrics"), None, STATUS_TIMEOUT).await.unwrap();
    let text = String::from_utf8_lossy(&a.body);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} on {url}/metrics"))
}

/// CPU seconds the three servers have used so far.
fn cpu_seconds<S: Servers>(s: &S) -> f64 {
    s.urls().keys().map(|&id| Usage::of_tree(s.member_pid(id)).cpu_seconds).sum()
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

/// SIGKILL the leader while a client acquires fresh keys in a loop, trying
/// the next member after any failure; milliseconds from the kill to the next
/// grant. The killed member is restarted.
async fn failover<B: Backend, S: Servers>(api: &B, s: &mut S, leader: u64, tag: &str) -> f64 {
    let urls: Vec<String> = s.urls().values().cloned().collect();
    let leader_at = s.urls().keys().position(|&id| id == leader).unwrap();
    let (tx, mut grants) = tokio::sync::mpsc::unbounded_channel();
    let (api, tag) = (api.clone(), tag.to_string());
    let client = tokio::spawn(async move {
        let mut at = leader_at;
        for n in 0u64.. {
            match api.acquire(&urls[at], &format!("bench/{tag}/{n}"), FAILOVER_TTL, FAILOVER_TIMEOUT).await {
                Ok(_) => {
                    let _ = tx.send((Instant::now(), at));
                }
                Err(_) => {
                    at = (at + 1) % urls.len();
                    // Refusals come back at once; don't spin on the two cores the election needs.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    grants.recv().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.kill(leader);
    let killed = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            // An answer from the dead leader may still be read after the kill.
            match grants.recv().await.unwrap() {
                (t, at) if t > killed && at != leader_at => return t,
                _ => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{}: no grant within 30 s of killing the leader", S::NAME));
    client.abort();
    s.restart(leader);
    (next - killed).as_secs_f64() * 1e3
}

/// One repetition's numbers for one system.
#[derive(Default)]
struct Rep {
    p50_ms: f64,
    p99_ms: f64,
    /// Per entry of `CLIENTS`.
    pairs_per_s: Vec<f64>,
    keepalives_per_s: f64,
    grants_per_fsync: f64,
    cpu_s_per_1000: f64,
    peak_rss_mib: f64,
    failover_ms: f64,
}

async fn measure<B: Backend, S: Servers>(api: &B, s: &mut S, http: &HttpClient, rep: usize, seconds: f64) -> Rep {
    let progress = |what: &str| eprintln!("rep {rep} {}: {what}", S::NAME);
    progress("waiting until healthy");
    let leader = healthy(s, http).await;
    let url = s.urls()[&leader].clone();
    let mut r = Rep::default();
    for clients in CLIENTS {
        progress(&plural(clients, "client"));
        let (fsyncs, cpu) = (metric(http, &url, S::FSYNCS).await, cpu_seconds(s));
        let (rate, latencies) = pairs(api, &url, &format!("{rep}/{clients}"), clients, seconds).await;
        r.pairs_per_s.push(rate);
        let grants = latencies.len() as f64;
        if clients == 1 {
            (r.p50_ms, r.p99_ms) = p50_p99_ms(latencies);
        }
        if clients == MEASURED_CLIENTS {
            r.grants_per_fsync = grants / (metric(http, &url, S::FSYNCS).await - fsyncs);
            r.cpu_s_per_1000 = (cpu_seconds(s) - cpu) / grants * 1000.0;
        }
    }
    progress(&format!("{HOLDERS} holders keeping alive"));
    r.keepalives_per_s = keepalives(api, &url, &format!("{rep}/ka"), seconds).await;
    r.peak_rss_mib = mib(s.urls().keys().map(|&id| Usage::of_tree(s.member_pid(id)).peak_rss).sum());
    progress("killing the leader");
    r.failover_ms = failover(api, s, leader, &format!("{rep}/failover")).await;
    progress(&format!("next grant {:.0} ms after the kill", r.failover_ms));
    r
}

#[tokio::main]
async fn main() {
    let reps: usize = common::env_or("BENCH_REPS", 3);
    let seconds: f64 = common::env_or("BENCH_SECONDS", 5.0);
    // One client for both: metrics pages are large, lock answers small.
    let http = HttpClient::new(8 << 20);
    let (fencegate_api, etcd_api) = (FencegateApi(http.clone()), EtcdApi(http.clone()));
    eprintln!("starting a 3-node fencegate cluster and a 3-member etcd cluster");
    let mut fencegate = fencegate_cluster("").await;
    let mut etcd = start_etcd();
    let mut old = fencegate_cluster(OLD_RAFT).await;
    let (mut f, mut e, mut old_failover) = (vec![], vec![], vec![]);
    for rep in 1..=reps {
        // Alternate who goes first, so that neither always meets a warmer machine.
        if rep % 2 == 1 {
            f.push(measure(&fencegate_api, &mut fencegate, &http, rep, seconds).await);
        }
        e.push(measure(&etcd_api, &mut etcd, &http, rep, seconds).await);
        if rep % 2 == 0 {
            f.push(measure(&fencegate_api, &mut fencegate, &http, rep, seconds).await);
        }
        eprintln!("rep {rep} fencegate (old defaults: heartbeat 100 ms, elections 300–600 ms): killing the leader");
        let leader = healthy(&old, &http).await;
        old_failover.push(failover(&fencegate_api, &mut old, leader, &format!("{rep}/failover")).await);
    }

    let mut table = Table::new(&["measurement", "fencegate", "etcd", "fencegate ÷ etcd", "better"]);
    // One table row and its {"fencegate": Spread, "etcd": Spread} JSON.
    let mut row = |label: &str, higher_is_better: bool, digits: usize, get: &dyn Fn(&Rep) -> f64| {
        let spread = |reps: &[Rep]| Spread::of(&reps.iter().map(get).collect::<Vec<_>>());
        let (fs, es) = (spread(&f), spread(&e));
        let better = if higher_is_better { "higher" } else { "lower" };
        table.row(&[
            label.into(),
            fs.show(digits),
            es.show(digits),
            format!("{:.2}", fs.median / es.median),
            better.into(),
        ]);
        json!({"fencegate": fs, "etcd": es})
    };
    let p50 = row("acquire+release p50, 1 client (ms)", false, 2, &|r| r.p50_ms);
    let p99 = row("acquire+release p99, 1 client (ms)", false, 2, &|r| r.p99_ms);
    let throughput: Vec<Value> = CLIENTS
        .iter()
        .enumerate()
        .map(|(i, &clients)| {
            let mut v =
                row(&format!("acquire+release pairs/s, {}", plural(clients, "client")), true, 0, &|r| r.pairs_per_s[i]);
            v["clients"] = json!(clients);
            v
        })
        .collect();
    let keepalives = row(&format!("keepalives/s, {HOLDERS} holders"), true, 0, &|r| r.keepalives_per_s);
    let per_fsync =
        row(&format!("grants per leader fsync, {MEASURED_CLIENTS} clients"), true, 2, &|r| r.grants_per_fsync);
    let cpu = row(&format!("server CPU s per 1,000 pairs, {MEASURED_CLIENTS} clients (3 members)"), false, 3, &|r| {
        r.cpu_s_per_1000
    });
    let rss = row("peak RSS, 3 members summed (MiB)", false, 0, &|r| r.peak_rss_mib);
    let failover_ms = row("leader SIGKILL → next grant (ms)", false, 0, &|r| r.failover_ms);
    let (old, etcd_failover) =
        (Spread::of(&old_failover), Spread::of(&e.iter().map(|r| r.failover_ms).collect::<Vec<_>>()));
    table.row(&[
        "leader SIGKILL → next grant (ms), fencegate's old defaults: heartbeat 100 ms, elections 300–600 ms".into(),
        old.show(0),
        etcd_failover.show(0),
        format!("{:.2}", old.median / etcd_failover.median),
        "lower".into(),
    ]);

    // The JSON: {"reps": N, "seconds": S (per phase),
    //   "latency_ms": {"p50": M, "p99": M}, "throughput": [M + {"clients": C}, ...],
    //   "keepalives_per_s": M, "grants_per_fsync": M, "cpu_s_per_1000": M,
    //   "peak_rss_mib": M, "failover_ms": M, "failover_old_defaults_ms": {"fencegate": Spread}}
    // where every M is {"fencegate": Spread, "etcd": Spread} and a Spread is
    // {"median", "min", "max"} over the repetitions.
    let json = json!({
        "reps": reps,
        "seconds": seconds,
        "latency_ms": {"p50": p50, "p99": p99},
        "throughput": throughput,
        "keepalives_per_s": keepalives,
        "grants_per_fsync": per_fsync,
        "cpu_s_per_1000": cpu,
        "peak_rss_mib": rss,
        "failover_ms": failover_ms,
        "failover_old_defaults_ms": {"fencegate": old},
    });
    let markdown = format!(
        "3 fencegate nodes and 3 etcd {} members on loopback, fsync on; fencegate's default Raft timings \
         (heartbeat 50 ms, election timeout 100–250 ms, plus openraft's leader lease of election_timeout_max \
         before a follower campaigns: 350–500 ms), etcd's election timeout 300 ms (campaigns after 300–600 ms); \
         the last row is a second fencegate cluster with the old defaults (100 ms, 300–600 ms); \
         one JSON-over-HTTP client sends to the leader (etcd through its JSON gateway: lease grant + \
         put-if-absent txn, release = lease revoke). BENCH_REPS={reps}, BENCH_SECONDS={seconds} (per phase); \
         median (min–max) over the repetitions; the ratio is of the medians.\n\n{}",
        etcd_version(),
        table.markdown()
    );
    report::write("lock_vs_etcd", "Lock service vs etcd", &markdown, json);
}

fn etcd_version() -> String {
    let out = std::process::Command::new("etcd").arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().and_then(|l| l.strip_prefix("etcd Version: ")).unwrap_or("?").to_string()
}
