//! The verification suite on a real network: every `fencegate server` in a
//! network namespace of its own, the sidecar, the worker processes and the
//! test's controller in others ([`fencegate_testkit::netns`]); links cut
//! by firewall rules that drop silently (connections go half-open), packet
//! loss and delay made by the kernel, and worker *processes* SIGSTOPped
//! past their TTL. The torture suite's checker runs on the result; a
//! control arm with the same workers and pauses, straight to the upstream,
//! must show damage, proving the checker can fail here too.
//!
//! Runs as root with `ip`, `nft` and `iptables` (`.ci/partitions` installs
//! them); without them it fails.
//!
//! - short profile (the fault tier): `cargo test --features faults --test faults partitions::short`
//! - long profile: `PARTITIONS_SECONDS=600 PARTITIONS_SEED=7 PARTITIONS_NODES=5 cargo test --features faults --test faults -- --ignored --nocapture partitions::long`
//!
//! A failing run writes its history to `target/tmp/partitions-<arm>-seed-<seed>.json`.

mod faults;
mod net;
mod worker;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use faults::Fault;
use fencegate_testkit::netns::{self, monotonic_ns, Lab};
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::verify::checker::{self, MAX_STALENESS_MS};
use fencegate_testkit::verify::history::History;
use fencegate_testkit::verify::{summary, workload};
use fencegate_testkit::{bin, Proc, Upstream};
use net::{Net, CTL, UPSTREAM_PORT, WORKERS};
use tokio::time::Instant;

const NODE_YAML: &str =
    "raft: { heartbeat: 50ms, election_timeout_min: 200ms, election_timeout_max: 400ms, propose_timeout: 2s }\n";

const LIVENESS_BOUND_MS: f64 = 10_000.0;

const WORKERS_N: usize = 6;
const KEYS: usize = 3;
const TTL: Duration = Duration::from_millis(1500);

/// Where a failing run keeps its histories (`target/tmp`), and its replay.
fn replay(suite: &str, seed: u64) -> summary::Replay<'_> {
    summary::Replay { suite, seed, seed_var: "PARTITIONS_SEED", dir: env!("CARGO_TARGET_TMPDIR") }
}

fn routes() -> String {
    table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]).timeout("5s"), everything_else()])
}

type Arm = summary::Arm<Fault>;

/// Start the worker processes in their namespace, writing to `target`,
/// until `until`; their processes and history files.
fn start_workers(net: &Net<'_>, history: &History, target: &str, seed: u64, until: Instant) -> Vec<(Proc, PathBuf)> {
    // The history's zero on CLOCK_MONOTONIC: read next to the history's own clock.
    let t0_ns = monotonic_ns() - (history.ms(Instant::now()) * 1e6) as u64;
    let until_ns = monotonic_ns() + until.saturating_duration_since(Instant::now()).as_nanos() as u64;
    let exe = std::env::current_exe().unwrap();
    (0..WORKERS_N)
        .map(|w| {
            let out = net.dir.path().join(format!("worker{w}-{}.jsonl", target.len()));
            let _ = std::fs::remove_file(&out);
            let spec = worker::Spec {
                worker: w,
                endpoints: net.urls(),
                target: target.into(),
                keys: KEYS,
                writes: 3,
                ttl_ms: TTL.as_millis() as u64,
                think_ms: (150, 400),
                seed,
                t0_ns,
                until_ns,
                out: out.clone(),
            };
            let mut cmd = net.lab.command(WORKERS, &exe);
            cmd.args(["partitions::worker_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
                .env(worker::ENV, serde_json::to_string(&spec).unwrap());
            let log = net.dir.path().join(format!("worker{w}.log"));
            (Proc::spawn(&format!("worker{w}"), cmd, &log), out)
        })
        .collect()
}

/// Until every worker has exited (they stop by themselves at `until`),
/// then their histories into `history`.
async fn collect(workers: Vec<(Proc, PathBuf)>, history: &History) {
    for (mut p, out) in workers {
        // A worker may be stopped by a pause that began just before the end.
        p.freeze(false);
        if p.exit_within(Duration::from_secs(40)).await.is_none() {
            eprintln!("{} did not exit in time: killed\n{}", p.name, p.log());
        }
        drop(p);
        for op in worker::read_history(&out) {
            history.push(op);
        }
    }
}

fn keys() -> Vec<String> {
    (0..KEYS).map(|k| format!("rack/{k}")).collect()
}

async fn sidecar_arm(lab: &Lab, nodes: u64, seconds: u64, seed: u64) -> Arm {
    let net = Net::start(lab, &bin!(), nodes, NODE_YAML).await;
    let up = Upstream::start_at(SocketAddr::new(lab.addr(CTL).into(), UPSTREAM_PORT)).await;
    let (sidecar, sidecar_url) = net.sidecar(&up.url(), &routes()).await;
    let history = Arc::new(History::new());
    let until = Instant::now() + Duration::from_secs(seconds);
    let workers = start_workers(&net, &history, &sidecar_url, seed, until);
    let pids: Vec<(u32, PathBuf)> = workers.iter().map(|(p, h)| (p.pid(), h.clone())).collect();
    let (mut faults, paused) =
        tokio::join!(faults::network(&net, seed, until), faults::pauses(&pids, TTL, seed, until));
    faults.insert(Fault::PauseWorker, paused);
    faults::heal(&net);
    collect(workers, &history).await;

    let client = net.client();
    let recovered = workload::recovery(&client, LIVENESS_BOUND_MS).await;
    let latest = workload::latest(&client, &keys()).await;
    drop(sidecar);
    let (reports, window_ms) = summary::sidecar_checks(&history, &up, &keys(), &latest, recovered, LIVENESS_BOUND_MS);
    Arm { name: "sidecar", history, faults, reports, window_ms }
}

/// The same worker processes and pauses, no network faults, straight to the upstream.
async fn control_arm(lab: &Lab, seconds: u64, seed: u64) -> Arm {
    let net = Net::start(lab, &bin!(), 3, NODE_YAML).await;
    let up = Upstream::start_at(SocketAddr::new(lab.addr(CTL).into(), UPSTREAM_PORT + 1)).await;
    let history = Arc::new(History::new());
    let until = Instant::now() + Duration::from_secs(seconds);
    let workers = start_workers(&net, &history, &up.url(), seed, until);
    let pids: Vec<(u32, PathBuf)> = workers.iter().map(|(p, h)| (p.pid(), h.clone())).collect();
    let paused = faults::pauses(&pids, TTL, seed, until).await;
    collect(workers, &history).await;
    let reports = vec![checker::upstream_order(&workload::applied(&up, &keys()))];
    let (_, window_ms) =
        checker::stale_window(&history.ops(), &workload::applied_at(&up, &keys(), &history), MAX_STALENESS_MS);
    let faults = BTreeMap::from([(Fault::PauseWorker, paused)]);
    Arm { name: "control (no sidecar)", history, faults, reports, window_ms }
}

fn summary(arms: &[&Arm], seed: u64) -> String {
    summary::table("partitions", arms, seed)
}

async fn profile(lab: &Lab, nodes: u64, seconds: u64, control_seconds: u64, seed: u64) {
    let with = sidecar_arm(lab, nodes, seconds, seed).await;
    let without = control_arm(lab, control_seconds, seed).await;
    println!("{}", summary(&[&with, &without], seed));
    let mut failures = vec![];
    failures.extend(summary::failures(&replay("partitions", seed), &with, &without));
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Run `profile` in a lab of `nodes` nodes: on a thread of its own that,
/// with every thread of its runtime, is in the controller's namespace.
fn in_lab(nodes: u64, seconds: u64, control_seconds: u64, seed: u64) {
    netns::preflight();
    let names = net::members(nodes);
    let lab = Lab::new(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let ctl = lab.member(CTL).ns.clone();
    std::thread::scope(|s| {
        let run = s.spawn(|| {
            netns::enter_ns(&ctl);
            let ns = ctl.clone();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .on_thread_start(move || netns::enter_ns(&ns))
                .build()
                .unwrap();
            rt.block_on(profile(&lab, nodes, seconds, control_seconds, seed));
        });
        if let Err(panic) = run.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

#[test]
fn short_profile() {
    in_lab(3, 35, 15, 0x9a27_17e0);
}

#[test]
#[ignore = "long profile: run by hand with PARTITIONS_SECONDS / PARTITIONS_SEED / PARTITIONS_NODES"]
fn long_profile() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seconds = env("PARTITIONS_SECONDS").unwrap_or(600);
    let seed = env("PARTITIONS_SEED").unwrap_or_else(rand::random);
    let nodes = env("PARTITIONS_NODES").unwrap_or(3);
    println!("long profile: {nodes} nodes, {seconds} s, seed {seed}");
    in_lab(nodes, seconds, 30.min(seconds), seed);
}

/// Not a test: a worker process the profiles start (see `partitions/worker.rs`).
#[test]
#[ignore = "a worker process: the profiles start it with FGP_WORKER set"]
fn worker_process() {
    if let Ok(spec) = std::env::var(worker::ENV) {
        worker::main(serde_json::from_str(&spec).expect("FGP_WORKER"));
    }
}

/// The lab's faults are what they claim, seen from a socket: a dropped
/// link times out (silent: no refusal, no reset), one way is one way, loss
/// is loss, and a delayed link takes at least twice the delay to connect
/// (the SYN out and the SYN-ACK back are both held).
#[test]
fn the_lab_drops_silently_and_delays() {
    use fencegate_testkit::netns::delay::Delay;
    use fencegate_testkit::netns::Rules;
    use std::net::TcpStream;
    use std::time::Instant;

    netns::preflight();
    let lab = Lab::new(&["a", "b"]);
    let b = SocketAddr::new(lab.addr("b").into(), 7000);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            lab.enter("b");
            let listener = std::net::TcpListener::bind(b).unwrap();
            listener.set_nonblocking(true).unwrap();
            // Accepts the probes below and keeps them open until the test ends.
            let mut open = vec![];
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                match listener.accept() {
                    Ok((c, _)) => open.push(c),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        s.spawn(|| {
            /// Ends the listener's loop however this thread ends.
            struct Done<'a>(&'a std::sync::atomic::AtomicBool);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
            let _done = Done(&done);
            lab.enter("a");
            // Until the listener is up.
            let deadline = Instant::now() + Duration::from_secs(5);
            while TcpStream::connect_timeout(&b, Duration::from_millis(200)).is_err() {
                assert!(Instant::now() < deadline, "b never listened");
            }
            let probe = || {
                let t = Instant::now();
                (TcpStream::connect_timeout(&b, Duration::from_millis(800)), t.elapsed())
            };
            lab.set_rules("a", &Rules::default().cut(lab.addr("b")));
            let (r, _) = probe();
            assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::TimedOut, "a cut link drops silently");
            lab.set_rules("a", &Rules::default().drop_from(lab.addr("b")));
            let (r, _) = probe();
            assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::TimedOut, "the SYN-ACK is lost");
            lab.set_rules("a", &Rules::default().loss(100));
            assert_eq!(probe().0.unwrap_err().kind(), std::io::ErrorKind::TimedOut, "100 % loss");
            lab.set_rules("a", &Rules::default());
            let (r, fast) = probe();
            r.unwrap();
            let d = Delay::start(&lab, "a", Duration::from_millis(150));
            let (r, slow) = probe();
            r.unwrap();
            let held = d.stop();
            assert!(slow >= Duration::from_millis(300), "delayed connect took {slow:?} (undelayed {fast:?})");
            assert!(held >= 2, "{held} packets held");
        });
    });
}
