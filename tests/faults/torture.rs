//! The verification suite (Jepsen-style): real `fencegate server` processes
//! and a real sidecar under a seeded schedule of faults, workers that pause
//! past their TTL, a recording upstream, and a checker that reports every
//! invariant separately — plus a control arm without the sidecar that must
//! show violations, proving the checker can fail. The sidecar arm's cluster
//! speaks TLS on both planes and authenticates every client. Then the
//! idempotency arms (`retries.rs`): writes retried with their key through
//! sidecar kills and cut upstream exchanges are applied at most once (I1),
//! and the same retries without idempotency apply some twice.
//!
//! The sidecar arm's nodes keep their data on power-loss filesystems (the
//! test kit's `powerloss`, FUSE)
//! and the nemesis also cuts the power of a majority.
//!
//! The lifecycle arms (`lifecycle.rs`): a backup, the cluster lost and
//! restored, and a node of another cluster offered to `member add`, in the
//! middle of the workload; their control rebuilds the cluster empty instead
//! and must show tokens granted twice.
//!
//! - short profile (the fault tier): `cargo test --features faults --test faults torture::short`
//! - long profile: `TORTURE_SECONDS=600 TORTURE_SEED=7 TORTURE_NODES=5 cargo test --release --features faults --test faults -- --ignored --nocapture torture::long`
//!
//! A failing run writes its history to `target/tmp/torture-<arm>-seed-<seed>.json`
//! and prints the seed that replays its schedule.

mod lifecycle;
mod nemesis;
mod retries;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fencegate_testkit::cluster::{ClusterOptions, Security};
use fencegate_testkit::powerloss::{Mode, PowerLossFs};
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::verify::checker::{self, MAX_STALENESS_MS};
use fencegate_testkit::verify::history::History;
use fencegate_testkit::verify::summary::{self, Columns};
use fencegate_testkit::verify::workload::{self, Workload};
use fencegate_testkit::{bin, Cluster, Upstream};
use nemesis::Fault;
use tokio::time::Instant;

/// Where a failing run keeps its histories (`target/tmp`), and its replay.
fn replay(suite: &str, seed: u64) -> summary::Replay<'_> {
    summary::Replay { suite, seed, seed_var: "TORTURE_SEED", dir: env!("CARGO_TARGET_TMPDIR") }
}

fn routes() -> String {
    table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]).timeout("5s"), everything_else()])
}

/// Faster failure detection than the defaults, so a short run sees many
/// elections; the propose timeout bounds how long a request waits for a quorum.
const NODE_YAML: &str =
    "raft: { heartbeat: 50ms, election_timeout_min: 200ms, election_timeout_max: 400ms, propose_timeout: 2s }\n";

const LIVENESS_BOUND_MS: f64 = 10_000.0;

type Arm = summary::Arm<Fault>;

fn keys(w: &Workload, prefix: &str) -> Vec<String> {
    (0..w.keys).map(|k| format!("rack/{prefix}{k}")).collect()
}

fn workload() -> Workload {
    Workload { workers: 6, keys: 3, writes: 3, ttl: Duration::from_millis(1500), pause_probability: 0.15 }
}

/// The cluster runs as in production: TLS on the peer and client planes,
/// the clients and the sidecar authenticated, an ACL.
async fn sidecar_arm(nodes: u64, seconds: u64, seed: u64) -> Arm {
    let w = workload();
    // Each node's data on a power-loss filesystem, for the nemesis's power cuts.
    let mount = || PowerLossFs::mount(None, Mode::Strict).expect("mounting a power-loss filesystem (FUSE)");
    let power: Option<BTreeMap<u64, PowerLossFs>> = Some((1..=nodes).map(|id| (id, mount())).collect());
    let data_roots = power.iter().flatten().map(|(id, fs)| (*id, fs.path())).collect();
    let o = ClusterOptions {
        nodes,
        yaml: NODE_YAML.into(),
        security: Some(Security::default()),
        data_roots,
        ..Default::default()
    };
    let mut c = Cluster::start_with(&bin!(), o).await;
    let up = Upstream::start().await;
    let mut sc = c.sidecar("sidecar", &up.url(), &routes()).await;
    let history = Arc::new(History::new());
    let until = Instant::now() + Duration::from_secs(seconds);
    let work = tokio::spawn(workload::run(w, history.clone(), c.client(), sc.url(), seed, "", until));
    let faults = nemesis::run_with_power(&mut c, &mut sc, seed, until, power.as_ref()).await;
    work.await.unwrap();

    nemesis::heal(&mut c);
    let client = c.client();
    let recovered = workload::recovery(&client, LIVENESS_BOUND_MS).await;
    let latest = workload::latest(&client, &keys(&w, "")).await;
    let (reports, window_ms) =
        summary::sidecar_checks(&history, &up, &keys(&w, ""), &latest, recovered, LIVENESS_BOUND_MS);
    Arm { name: "sidecar", history, faults, reports, window_ms }
}

/// The same workload, straight to the upstream.
async fn control_arm(seconds: u64, seed: u64) -> Arm {
    let w = workload();
    let c = Cluster::start(&bin!(), 3, NODE_YAML).await;
    let up = Upstream::start().await;
    let history = Arc::new(History::new());
    let until = Instant::now() + Duration::from_secs(seconds);
    workload::run(w, history.clone(), c.client(), up.url(), seed, "", until).await;
    let reports = vec![checker::upstream_order(&workload::applied(&up, &keys(&w, "")))];
    // Measured, not checked: without a sidecar, nothing bounds it.
    let (_, window_ms) =
        checker::stale_window(&history.ops(), &workload::applied_at(&up, &keys(&w, ""), &history), MAX_STALENESS_MS);
    Arm { name: "control (no sidecar)", history, faults: BTreeMap::new(), reports, window_ms }
}

fn summary(arms: &[&Arm], seed: u64) -> String {
    summary::table("torture", arms, seed)
}

fn retry_summary(arms: &[&retries::RetryArm]) -> String {
    let mut t = Columns::new(arms.iter().map(|a| a.name).collect());
    for (i, arm) in arms.iter().enumerate() {
        for (k, v) in &arm.outcomes {
            t.put(i, format!("writes: {k}"), v.to_string());
        }
        t.put(i, "attempts".into(), arm.attempts.to_string());
        for (f, n) in &arm.faults {
            t.put(i, format!("fault: {f}"), n.to_string());
        }
        t.put(i, format!("violations: {}", arm.report.name), arm.report.violations.len().to_string());
    }
    format!("\n{}", t.markdown())
}

async fn profile(nodes: u64, seconds: u64, control_seconds: u64, seed: u64) {
    let with = sidecar_arm(nodes, seconds, seed).await;
    let without = control_arm(control_seconds, seed).await;
    let keyed = retries::arm(true, control_seconds, seed).await;
    let unkeyed = retries::arm(false, control_seconds, seed).await;
    println!("{}{}", summary(&[&with, &without], seed), retry_summary(&[&keyed, &unkeyed]));
    let mut failures = vec![];
    for v in keyed.report.violations.iter().take(5) {
        failures.push(format!("{}: {v}", keyed.report.name));
    }
    if unkeyed.report.violations.is_empty() {
        failures.push("the retry control arm applied no write twice: the duplicate check could not fail".into());
    }
    failures.extend(summary::failures(&replay("torture", seed), &with, &without));
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_profile() {
    profile(3, 30, 10, 0x0f3a_57ed).await;
}

/// The operator's rare actions mid-run: no token is granted twice across a
/// restore, no stale write reaches the upstream, a foreign node is refused;
/// the control (the cluster rebuilt empty, no sidecar) must show the damage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_profile() {
    let seed = 0x1f3c_7c1e;
    let with = lifecycle::arm(true, 20, seed).await;
    let without = lifecycle::arm(false, 20, seed).await;
    println!("{}", summary::table("lifecycle", &[&with, &without], seed));
    let mut failures = summary::failures(&replay("lifecycle", seed), &with, &without);
    if without.reports[1].violations.is_empty() {
        failures.push("the control applied no stale write: the upstream check could not fail".into());
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long profile: run by hand with TORTURE_SECONDS / TORTURE_SEED / TORTURE_NODES"]
async fn long_profile() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seconds = env("TORTURE_SECONDS").unwrap_or(600);
    let seed = env("TORTURE_SEED").unwrap_or_else(rand::random);
    let nodes = env("TORTURE_NODES").unwrap_or(3);
    println!("long profile: {nodes} nodes, {seconds} s, seed {seed}");
    profile(nodes, seconds, 30.min(seconds), seed).await;
}
