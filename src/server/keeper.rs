//! The lease keeper: one task per node that, while the node is leader,
//! proposes `Expire` / `EndDelay` when the lease clock says they are due,
//! `Compact` for keys idle longer than `limits.idle_key_retention`, `Rules`
//! once every member speaks newer ones, and keeps the Raft gauges current.
//!
//! On becoming leader it first commits an empty entry of its own and waits
//! until its state machine has applied everything before it, then resets the
//! clock so every lease gets a full TTL from now (L3), and only then marks
//! the node ready: keepalives and linearizable reads wait for that, and only
//! then does it expire anything.
//!
//! Why the fresh entry (`Node::clock_term`): openraft 0.9 can restore a
//! leader after a restart without a new entry, and without a persisted
//! commit index its read barrier could sit below entries acknowledged before
//! the crash (`tests/e2e/lock_service.rs`
//! `whole_cluster_restart_continues_tokens_above_the_last` fails without
//! it). Compaction samples the revision over time; a new leader starts
//! sampling afresh, so compaction is late, never early. The keeper serves
//! no requests.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use tokio::time::Instant;

use std::collections::VecDeque;

use super::Node;
use crate::lock::clock;
use crate::lock::state::{Command, RULES};
use crate::raft::identity;

/// Longest sleep between checks, so gauges stay fresh on an idle node.
const IDLE: Duration = Duration::from_secs(1);

pub(super) async fn run(node: Arc<Node>) {
    let mut metrics = node.raft.metrics();
    let mut applied = node.applied.subscribe();
    let mut ready_term: Option<u64> = None;
    // At most one round of expiry proposals in flight: a leader cut off from
    // its quorum must not pile up proposals that can never commit.
    let mut in_flight: Option<tokio::task::JoinHandle<()>> = None;
    let mut idle_keys = IdleKeys::default();
    loop {
        let m = metrics.borrow_and_update().clone();
        if m.running_state.is_err() {
            return;
        }
        let gauges = &node.raft_metrics;
        gauges.term.set(m.current_term as i64);
        gauges.is_leader.set((m.state == ServerState::Leader) as i64);
        gauges.commit_index.set(m.last_applied.map(|l| l.index).unwrap_or(0) as i64);

        if m.state != ServerState::Leader {
            ready_term = None;
            idle_keys = IdleKeys::default();
            node.clock_term.store(0, Ordering::Release);
        } else if ready_term != Some(m.current_term) {
            // openraft 0.9 can restore a leader from its persisted vote after
            // a restart without appending an entry of the new term, and does
            // not persist the commit index: its read barrier could then sit
            // below entries it acknowledged before the crash. An entry of our
            // own, committed and applied, puts everything before it in the
            // state machine; `ensure_linearizable` then confirms leadership.
            let timeout = node.config.raft.propose_timeout;
            let confirmed = tokio::time::timeout(timeout, async {
                node.raft.client_write(Vec::new()).await.map_err(|e| e.to_string())?;
                node.raft.ensure_linearizable().await.map_err(|e| e.to_string())
            })
            .await;
            if !matches!(confirmed, Ok(Ok(_))) {
                tokio::time::sleep(node.config.raft.heartbeat).await;
                continue;
            }
            let mut guard = node.applied.lock();
            let s = &mut *guard;
            s.clock.reset(&s.locks, Instant::now());
            ready_term = Some(m.current_term);
            node.clock_term.store(m.current_term, Ordering::Release);
            node.directory.protocols.leading();
            tracing::info!(term = m.current_term, leases = s.locks.lease_count(), "leader: lease clock reset");
        }

        let now = Instant::now();
        let mut wake = now + IDLE;
        let idle = in_flight.as_ref().is_none_or(|t| t.is_finished());
        if ready_term.is_some() && idle {
            let (mut due, next) = {
                let mut s = node.applied.lock();
                let due = s.clock.due(now);
                (due, s.clock.next_deadline())
            };
            if let Some(through) = idle_keys.compact_through(&node, now) {
                due.push(Command::Compact { through });
            }
            if let Some(version) = rules_due(&node) {
                tracing::info!("every member speaks rules {version}: proposing them");
                due.push(Command::Rules { version });
            }
            due.extend(identify_due(&node));
            if !due.is_empty() {
                // If a proposal is lost the clock re-arms it (`clock::RETRY`);
                // a lost compaction is proposed again at the next sample.
                let (n, timeout) = (node.clone(), node.config.raft.propose_timeout);
                in_flight = Some(tokio::spawn(async move {
                    let proposals = due.into_iter().map(|cmd| n.proposer.propose(cmd));
                    if tokio::time::timeout(timeout, futures_util::future::join_all(proposals)).await.is_err() {
                        tracing::debug!("expiry proposals not committed within {timeout:?}");
                    }
                }));
            }
            wake = next.map_or(wake, |n| n.min(wake));
        } else if !idle {
            wake = wake.min(now + clock::RETRY);
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = applied.changed() => {}
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Newer rules for the table, once every member (voters and learners of the
/// latest membership, committed or not) has said it speaks them
/// (`raft::upgrade`).
fn rules_due(node: &Node) -> Option<u32> {
    let rules = node.applied.lock().locks.rules();
    if rules >= RULES {
        // Moved already: the keeper wakes at every applied entry.
        return None;
    }
    let members = node.raft.metrics().borrow().membership_config.membership().nodes().map(|(id, _)| *id).collect();
    node.directory.protocols.due(node.id, &members, rules)
}

/// A cluster id for a table that has none, under rules that carry one
/// (`raft::identity`): the first committed stays.
fn identify_due(node: &Node) -> Option<Command> {
    let locks = &node.applied.lock().locks;
    (locks.rules() >= 2 && locks.cluster().is_none()).then(|| Command::Identify { cluster: identity::new_id() })
}

/// What the table's revision was at times past, sampled by this leader: a
/// key whose latest event is at or below the revision of a retention ago has
/// been idle at least that long. A new leader starts sampling afresh, so it
/// compacts nothing until it has led for a whole retention (late, never early).
#[derive(Default)]
struct IdleKeys {
    samples: VecDeque<(Instant, u64)>,
    /// The last `through` proposed.
    proposed: u64,
}

impl IdleKeys {
    /// Sample the revision (eight times per retention), and say what to
    /// compact, if anything is newly old enough.
    fn compact_through(&mut self, node: &Node, now: Instant) -> Option<u64> {
        let retention = node.config.limits.idle_key_retention;
        let s = node.applied.lock();
        if self.samples.back().is_none_or(|(t, _)| now.duration_since(*t) >= retention / 8) {
            self.samples.push_back((now, s.locks.revision()));
        }
        let cutoff = now.checked_sub(retention)?;
        let mut through = None;
        while let Some((t, rev)) = self.samples.front().copied() {
            if t > cutoff {
                break;
            }
            through = Some(rev);
            self.samples.pop_front();
        }
        let through = through.filter(|t| *t > self.proposed)?;
        self.proposed = through;
        s.locks.compactable(through).then_some(through)
    }
}
