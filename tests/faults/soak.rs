//! The soak: acquires (with the library's keepalives), watch streams and
//! fenced writes through a sidecar for a long time, with a fault every few
//! seconds, recording per minute the RSS and open file descriptors of every
//! fencegate process and the p99 of acquire and write latency. It passes if
//! memory and descriptors plateau and each minute's p99 stays within 2× of
//! the first minute's.
//!
//! Only node 3 is ever killed: nodes 1 and 2 and the sidecar live the whole
//! run (paused, partitioned, deposed, never restarted), so a leak in any of
//! them shows in their numbers instead of being reset by a restart.
//!
//! `SOAK_MINUTES=30 cargo test --release --features faults --test faults -- --ignored --nocapture soak::`
//! (the table is also written to `target/tmp/soak-<seed>.md`).

mod load;
mod minutes;

use std::sync::Arc;
use std::time::Duration;

use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::{bin, Cluster, Upstream};
use minutes::{Minute, Sample, Watched};
use tokio::time::Instant;

/// Faster failure detection than the defaults, as in the verification suite:
/// more elections per minute.
const NODE_YAML: &str =
    "raft: { heartbeat: 50ms, election_timeout_min: 200ms, election_timeout_max: 400ms, propose_timeout: 2s }\n";

/// The faults of every minute, in this order, each held for 1.5 s and then
/// healed, one every 6 s: the same mix each minute. An operation during a
/// fault or the 2 s after it counts as faulted; the others (about 40% of the
/// time) are quiet, and their p99 is what the minutes compare.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// SIGKILL node 3, restart it on its data.
    KillNode3,
    /// SIGSTOP the leader (it is deposed meanwhile), SIGCONT.
    PauseLeader,
    /// Cut the leader from its peers both ways.
    IsolateLeader,
    /// Drop what the leader sends one peer.
    OneWayFromLeader,
    /// SIGSTOP the sidecar, SIGCONT.
    PauseSidecar,
}

const CYCLE: [Fault; 5] =
    [Fault::KillNode3, Fault::PauseLeader, Fault::IsolateLeader, Fault::OneWayFromLeader, Fault::PauseSidecar];
const EVERY: Duration = Duration::from_secs(6);
const HOLD: Duration = Duration::from_millis(1500);

fn signal(pid: u32, s: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s);
}

/// After a fault is healed, elections and reconnections settle within this.
const SETTLE: Duration = Duration::from_secs(2);

async fn inject(c: &mut Cluster, sidecar_pid: u32, fault: Fault, stats: &load::Stats) {
    stats.fault_started();
    let leader = c.leader().await.unwrap_or(1);
    let other = if leader == 1 { 2 } else { 1 };
    match fault {
        Fault::KillNode3 => c.kill(3),
        Fault::PauseLeader => c.freeze(leader, true),
        Fault::IsolateLeader => c.isolate(leader, true),
        Fault::OneWayFromLeader => c.set_one_way(leader, other, true),
        Fault::PauseSidecar => signal(sidecar_pid, nix::sys::signal::Signal::SIGSTOP),
    }
    tokio::time::sleep(HOLD).await;
    match fault {
        Fault::KillNode3 => c.restart(3),
        Fault::PauseLeader => c.freeze(leader, false),
        Fault::IsolateLeader => c.isolate(leader, false),
        Fault::OneWayFromLeader => c.set_one_way(leader, other, false),
        Fault::PauseSidecar => signal(sidecar_pid, nix::sys::signal::Signal::SIGCONT),
    }
    tokio::time::sleep(SETTLE).await;
    stats.fault_settled();
}

/// One minute of faults (the cycle, twice); how many.
async fn minute_of_faults(c: &mut Cluster, sidecar_pid: u32, end: Instant, stats: &load::Stats) -> usize {
    let mut n = 0;
    for fault in CYCLE.iter().cycle() {
        let at = Instant::now() + EVERY - HOLD - SETTLE;
        if at + HOLD + SETTLE > end {
            break;
        }
        tokio::time::sleep_until(at).await;
        inject(c, sidecar_pid, *fault, stats).await;
        n += 1;
    }
    n
}

/// Every fencegate process (node 3's pid changes with each restart).
fn processes(c: &Cluster, sidecar_pid: u32) -> Vec<Watched> {
    let mut p: Vec<Watched> = c
        .ids()
        .into_iter()
        .map(|id| Watched { name: format!("node {id}"), pid: c.pid(id), restarted: id == 3 })
        .collect();
    p.push(Watched { name: "sidecar".into(), pid: sidecar_pid, restarted: false });
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the soak: run by hand with SOAK_MINUTES (default 30) and SOAK_SEED"]
async fn soak() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let minutes = env("SOAK_MINUTES").unwrap_or(30).max(2);
    let seed = env("SOAK_SEED").unwrap_or_else(rand::random);
    println!("soak: {minutes} min, seed {seed}");

    let mut c = Cluster::start(&bin!(), 3, NODE_YAML).await;
    let up = Upstream::start().await;
    let routes = table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]), everything_else()]);
    let sc = c.sidecar("sidecar", &up.url(), &routes).await;
    let sidecar_pid = sc.pid().expect("the sidecar runs");

    let started = Instant::now();
    let until = started + Duration::from_secs(60 * minutes);
    let stats = Arc::new(load::Stats::default());
    let load = tokio::spawn(load::run(c.client(), c.urls(), sc.url(), stats.clone(), seed, until));

    let mut rows: Vec<Minute> = vec![];
    for n in 1..=minutes {
        let end = started + Duration::from_secs(60 * n);
        let faults = minute_of_faults(&mut c, sidecar_pid, end, &stats).await;
        tokio::time::sleep_until(end).await;
        let row = Minute { n, faults, sample: Sample::take(&processes(&c, sidecar_pid), &stats) };
        println!("{}", row.line());
        rows.push(row);
    }
    load.await.unwrap();

    let report = minutes::report(&processes(&c, sidecar_pid), &rows, seed);
    let path = format!("{}/soak-{seed}.md", env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(&path, &report.table).unwrap();
    println!("\n{}\n(written to {path})", report.table);
    assert!(report.failures.is_empty(), "\n{}", report.failures.join("\n"));
}
