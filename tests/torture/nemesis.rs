//! Faults on a seeded schedule: node crashes and restarts, process pauses,
//! partitions through the relays (leader isolated, one-way loss, a flapping
//! link), whole-cluster restarts and sidecar restarts with the lock service up
//! and down. Each fault is held for a while, then healed.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use fencegate_testkit::{Cluster, Sidecar};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    KillLeader,
    KillFollower,
    StopLeader,
    IsolateLeader,
    /// The leader and as many others as still make a minority, against the rest.
    SplitMinorityWithLeader,
    OneWayFromLeader,
    FlapLink,
    RestartAll,
    RestartSidecar,
    RestartSidecarServiceDown,
}

const ALL: [Fault; 10] = [
    Fault::KillLeader,
    Fault::KillFollower,
    Fault::StopLeader,
    Fault::IsolateLeader,
    Fault::SplitMinorityWithLeader,
    Fault::OneWayFromLeader,
    Fault::FlapLink,
    Fault::RestartAll,
    Fault::RestartSidecar,
    Fault::RestartSidecarServiceDown,
];

/// Inject faults until `until`; returns how many of each.
pub async fn run(c: &mut Cluster, sidecar: &mut Sidecar, seed: u64, until: Instant) -> BTreeMap<Fault, usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counts = BTreeMap::new();
    while Instant::now() + Duration::from_secs(3) < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(800..1600))).await;
        let fault = *ALL.choose(&mut rng).unwrap();
        let hold = Duration::from_millis(rng.random_range(800..2500));
        let leader = c.leader().await.unwrap_or(1);
        let others: Vec<u64> = c.ids().into_iter().filter(|i| *i != leader).collect();
        let other = *others.choose(&mut rng).unwrap();
        match fault {
            Fault::KillLeader | Fault::KillFollower => {
                let victim = if fault == Fault::KillLeader { leader } else { other };
                c.kill(victim);
                tokio::time::sleep(hold).await;
                c.start_node(victim);
            }
            Fault::StopLeader => {
                c.freeze(leader, true);
                tokio::time::sleep(hold).await;
                c.freeze(leader, false);
            }
            Fault::IsolateLeader => {
                c.isolate(leader, true);
                tokio::time::sleep(hold).await;
                c.isolate(leader, false);
            }
            Fault::SplitMinorityWithLeader => {
                let ids = c.ids();
                let minority: Vec<u64> =
                    std::iter::once(leader).chain(others.iter().copied()).take((ids.len() - 1) / 2).collect();
                let cut = |c: &Cluster, on: bool| {
                    for a in &minority {
                        for b in ids.iter().filter(|b| !minority.contains(b)) {
                            c.set_link(*a, *b, on);
                        }
                    }
                };
                cut(c, true);
                tokio::time::sleep(hold).await;
                cut(c, false);
            }
            Fault::OneWayFromLeader => {
                c.set_one_way(leader, other, true);
                tokio::time::sleep(hold).await;
                c.set_one_way(leader, other, false);
            }
            Fault::FlapLink => {
                let end = Instant::now() + hold;
                let mut cut = true;
                while Instant::now() < end {
                    c.set_link(leader, other, cut);
                    cut = !cut;
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                c.set_link(leader, other, false);
            }
            Fault::RestartAll => {
                c.kill_all();
                tokio::time::sleep(hold / 2).await;
                c.start_all();
            }
            Fault::RestartSidecar => sidecar.restart().await,
            Fault::RestartSidecarServiceDown => {
                c.kill_all();
                sidecar.restart().await;
                tokio::time::sleep(hold).await;
                c.start_all();
            }
        }
        *counts.entry(fault).or_default() += 1;
    }
    counts
}

/// Undo everything: every node running and thawed, every link up.
pub fn heal(c: &mut Cluster) {
    c.heal_all();
    for id in c.ids() {
        c.freeze(id, false);
    }
    c.start_all();
}
