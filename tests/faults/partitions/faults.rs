//! The nemesis of the partition suite: faults made by the kernel, not by
//! relays. Firewall rules (nftables, silent drops) inside the leader's
//! namespace cut a link both ways or one way, isolate the leader from its
//! peers (clients still reach it, and it forwards nothing) or from its
//! clients (its peers still reach it), or drop a share of every node's
//! packets; an NFQUEUE verdict loop delays the leader's packets; and
//! worker processes are SIGSTOPped past their TTL and SIGCONTed, so that
//! a stale holder writes after a newer grant.
//!
//! Network faults come in seeded rounds, each a shuffle of every kind, so
//! that any run of one round's length sees each kind once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencegate_testkit::netns::delay::Delay;
use fencegate_testkit::netns::Rules;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::net::{node, Net, SIDECAR, WORKERS};
use fencegate_testkit::verify::history::{Kind, Op, Outcome};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// The leader and one follower: every packet both ways dropped.
    CutLink,
    /// The leader's packets to one follower dropped; the follower's still arrive.
    OneWay,
    /// The leader cut from every peer; clients and the sidecar still reach it.
    IsolateFromPeers,
    /// The leader cut from the workers and the sidecar; its peers still reach it.
    IsolateFromClients,
    /// A share of every node's packets dropped at random (10 or 30 %).
    Loss,
    /// Every packet in and out of the leader held 100–400 ms.
    Delay,
    /// A worker process SIGSTOPped past its TTL, then SIGCONTed.
    PauseWorker,
}

const NETWORK: [Fault; 6] =
    [Fault::CutLink, Fault::OneWay, Fault::IsolateFromPeers, Fault::IsolateFromClients, Fault::Loss, Fault::Delay];

/// Network faults until `until`; how many of each.
pub async fn network(net: &Net<'_>, seed: u64, until: Instant) -> BTreeMap<Fault, usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counts = BTreeMap::new();
    let mut round: Vec<Fault> = vec![];
    while Instant::now() + Duration::from_secs(3) < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..1200))).await;
        if round.is_empty() {
            round = NETWORK.to_vec();
            round.shuffle(&mut rng);
        }
        let fault = round.pop().unwrap();
        let hold = Duration::from_millis(rng.random_range(1500..3000));
        let leader = net.leader().await.unwrap_or(1);
        let others: Vec<u64> = net.ids().into_iter().filter(|i| *i != leader).collect();
        let other = *others.choose(&mut rng).unwrap();
        let lab = net.lab;
        let at = |id: u64| lab.addr(&node(id));
        let on_leader = |rules: Rules| lab.set_rules(&node(leader), &rules);
        match fault {
            Fault::CutLink => on_leader(Rules::default().cut(at(other))),
            Fault::OneWay => on_leader(Rules::default().drop_to(at(other))),
            Fault::IsolateFromPeers => on_leader(others.iter().fold(Rules::default(), |r, o| r.cut(at(*o)))),
            Fault::IsolateFromClients => on_leader(Rules::default().cut(lab.addr(WORKERS)).cut(lab.addr(SIDECAR))),
            Fault::Loss => {
                let percent = *[10u8, 30].choose(&mut rng).unwrap();
                for id in net.ids() {
                    lab.set_rules(&node(id), &Rules::default().loss(percent));
                }
            }
            Fault::Delay | Fault::PauseWorker => {}
        }
        if fault == Fault::Delay {
            let by = Duration::from_millis(rng.random_range(100..400));
            let d = Delay::start(lab, &node(leader), by);
            tokio::time::sleep(hold).await;
            d.stop();
        } else {
            tokio::time::sleep(hold).await;
        }
        heal(net);
        *counts.entry(fault).or_default() += 1;
    }
    counts
}

/// Every node's firewall emptied.
pub fn heal(net: &Net<'_>) {
    for id in net.ids() {
        net.lab.set_rules(&node(id), &Rules::default());
    }
}

/// Every 0.8–1.6 s until `until`, SIGSTOP a worker that holds a lock for
/// 1.5–2× `ttl`, then SIGCONT it (pauses overlap: a pause does not hold
/// the next one back); how many pauses. A holder is one whose history
/// (`workers`: pid and history file) ends with its grant or a write: most
/// of a holder's time is its think time before a write, so the pause
/// mostly lands between its validity check and the write.
pub async fn pauses(workers: &[(u32, PathBuf)], ttl: Duration, seed: u64, until: Instant) -> usize {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_0057);
    let paused = Arc::new(Mutex::new(BTreeSet::new()));
    let mut tasks = tokio::task::JoinSet::new();
    while Instant::now() + ttl * 2 < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(800..1600))).await;
        let holders: Vec<u32> = workers
            .iter()
            .filter(|(pid, h)| !paused.lock().unwrap().contains(pid) && holds(h))
            .map(|(p, _)| *p)
            .collect();
        let Some(&pid) = holders.choose(&mut rng) else { continue };
        if kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).is_err() {
            continue; // it has exited
        }
        paused.lock().unwrap().insert(pid);
        let (paused, hold) = (paused.clone(), ttl.mul_f64(rng.random_range(1.5..2.0)));
        tasks.spawn(async move {
            tokio::time::sleep(hold).await;
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            paused.lock().unwrap().remove(&pid);
        });
    }
    tasks.join_all().await.len()
}

/// Whether a worker's history ends with a grant or a write (it holds a lock).
fn holds(history: &Path) -> bool {
    let text = std::fs::read_to_string(history).unwrap_or_default();
    let last = text.lines().last().and_then(|l| serde_json::from_str::<Op>(l).ok());
    matches!(last, Some(op) if matches!((&op.kind, &op.outcome), (Kind::Acquire { .. }, Outcome::Ok) | (Kind::Write { .. }, _)))
}
