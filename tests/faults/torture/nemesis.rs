//! Faults on a seeded schedule: node crashes and restarts, process pauses,
//! partitions through the relays (leader isolated, one-way loss, a flapping
//! link), whole-cluster restarts, a rolling restart (SIGTERM, one node at a
//! time, as the README's runbook does it), membership changes (a node added,
//! removed, replaced by a fresh one at a new address) and sidecar restarts
//! with the lock service up and down, and, when the nodes' data is on
//! power-loss filesystems ([`run_with_power`]), power cuts of a majority.
//! Each fault is held for a while, then healed.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use fencegate_client::wire::AddMember;
use fencegate_client::ClientError;
use fencegate_testkit::powerloss::PowerLossFs;
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
    RollingRestart,
    Membership,
    /// A majority SIGKILLed and what they had not fsync'd dropped
    /// ([`run_with_power`] only).
    PowerCut,
}

const ALL: [Fault; 12] = [
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
    Fault::RollingRestart,
    Fault::Membership,
];

/// Inject faults until `until`; returns how many of each.
// For suites whose nodes are not on power-loss filesystems (`torture.rs`'s
// sidecar arm uses `run_with_power`).
#[allow(dead_code)]
pub async fn run(c: &mut Cluster, sidecar: &mut Sidecar, seed: u64, until: Instant) -> BTreeMap<Fault, usize> {
    run_with_power(c, sidecar, seed, until, None).await
}

/// [`run`], and when `power` holds each node's filesystem, power cuts too
/// (one fault in 8, drawn apart from the others: the schedule of a seed
/// without `power` stays what it was).
pub async fn run_with_power(
    c: &mut Cluster,
    sidecar: &mut Sidecar,
    seed: u64,
    until: Instant,
    power: Option<&BTreeMap<u64, PowerLossFs>>,
) -> BTreeMap<Fault, usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut power_rng = StdRng::seed_from_u64(seed ^ 0x706f776572);
    let mut counts = BTreeMap::new();
    let founding = c.ids();
    while Instant::now() + Duration::from_secs(3) < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(800..1600))).await;
        let mut fault = *ALL.choose(&mut rng).unwrap();
        let hold = Duration::from_millis(rng.random_range(800..2500));
        let leader = c.leader().await.unwrap_or(1);
        // Links run through relays between the founding members only (a
        // node added later is reached at its own address): partitions cut
        // those, and a node the nemesis added is paused instead.
        let others: Vec<u64> = founding.iter().copied().filter(|i| *i != leader).collect();
        let other = *others.choose(&mut rng).unwrap();
        let cuts_links = matches!(
            fault,
            Fault::IsolateLeader | Fault::SplitMinorityWithLeader | Fault::OneWayFromLeader | Fault::FlapLink
        );
        if cuts_links && !founding.contains(&leader) {
            fault = Fault::StopLeader;
        }
        if power.is_some() && power_rng.random_range(0..8) == 0 {
            fault = Fault::PowerCut;
        }
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
                for b in &others {
                    c.set_link(leader, *b, true);
                }
                tokio::time::sleep(hold).await;
                for b in &others {
                    c.set_link(leader, *b, false);
                }
            }
            Fault::SplitMinorityWithLeader => {
                let ids = &founding;
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
            Fault::RollingRestart => {
                for id in c.ids() {
                    c.terminate(id, Duration::from_secs(10)).await;
                    c.start_node(id);
                    caught_up(c, id, Duration::from_secs(10)).await;
                }
            }
            Fault::Membership => membership(c, &founding).await,
            Fault::PowerCut => {
                let power = power.expect("drawn only with filesystems");
                let mut victims: Vec<u64> = power.keys().copied().collect();
                while victims.len() > power.len() / 2 + 1 {
                    victims.remove(power_rng.random_range(0..victims.len()));
                }
                for id in &victims {
                    c.kill(*id);
                }
                for id in &victims {
                    power[id].power_cut();
                }
                tokio::time::sleep(hold / 2).await;
                for id in &victims {
                    c.start_node(*id);
                }
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

/// Until node `id` has applied what the leader had applied when asked, or
/// `within` passed (the next fault comes anyway).
async fn caught_up(c: &Cluster, id: u64, within: Duration) {
    let end = Instant::now() + within;
    while Instant::now() < end {
        let target = match c.leader().await {
            Some(l) => c.cluster_info(l).await.map(|i| i.commit_index),
            None => None,
        };
        let at = c.cluster_info(id).await.map(|i| i.commit_index);
        if matches!((target, at), (Some(t), Some(a)) if a >= t) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Replace the node this nemesis added last, if any, by a fresh one at a
/// new address: `member remove` (the leader hands over first if it is the
/// one), then a new node started and `member add`ed (a learner, a voter once
/// caught up). The founding members stay: the workload's client and the
/// sidecar know only them. A change the cluster refuses, or that does not
/// finish in time, is left for the next one to retry.
async fn membership(c: &mut Cluster, founding: &[u64]) {
    let admin = c.client();
    if let Some(extra) = c.ids().into_iter().find(|id| !founding.contains(id)) {
        match tokio::time::timeout(Duration::from_secs(30), admin.remove_member(extra, false)).await {
            Ok(Ok(_)) => c.drop_node(extra),
            // An add that never finished: it was no member.
            Ok(Err(ClientError::Refused { message, .. })) if message.contains("not a member") => c.drop_node(extra),
            other => {
                eprintln!("nemesis: removing node {extra}: {other:?}");
                return;
            }
        }
    }
    let id = c.add_node().await;
    let add = AddMember { id, peer_url: c.peer_url(id), client_url: Some(c.url(id)), force: false };
    match tokio::time::timeout(Duration::from_secs(30), admin.add_member(&add)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => eprintln!("nemesis: adding node {id}: {e}"),
        Err(_) => eprintln!("nemesis: adding node {id}: not done within 30 s"),
    }
}

/// Undo everything: every node running and thawed, every link up.
pub fn heal(c: &mut Cluster) {
    c.heal_all();
    for id in c.ids() {
        c.freeze(id, false);
    }
    c.start_all();
}
