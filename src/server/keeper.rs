//! The lease keeper: one task per node that, while the node is leader,
//! proposes `Expire` / `EndDelay` when the lease clock says they are due, and
//! keeps the Raft gauges current.
//!
//! On becoming leader it first waits until its state machine has applied
//! everything committed by earlier leaders (`ensure_linearizable`), then resets
//! the clock so every lease gets a full TTL from now (L3). Only then does it
//! expire anything.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use tokio::time::Instant;

use super::Node;

/// Longest sleep between checks, so gauges stay fresh on an idle node.
const IDLE: Duration = Duration::from_secs(1);

pub async fn run(node: Arc<Node>) {
    let mut metrics = node.raft.metrics();
    let mut applied = node.applied.subscribe();
    let mut ready_term: Option<u64> = None;
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
        } else if ready_term != Some(m.current_term) {
            let confirmed =
                tokio::time::timeout(node.config.raft.propose_timeout, node.raft.ensure_linearizable()).await;
            if !matches!(confirmed, Ok(Ok(_))) {
                tokio::time::sleep(node.config.raft.heartbeat).await;
                continue;
            }
            let mut guard = node.applied.lock();
            let s = &mut *guard;
            s.clock.reset(&s.locks, Instant::now());
            ready_term = Some(m.current_term);
            tracing::info!(term = m.current_term, leases = s.locks.lease_count(), "leader: lease clock reset");
        }

        let now = Instant::now();
        let mut wake = now + IDLE;
        if ready_term.is_some() {
            let (due, next) = {
                let mut s = node.applied.lock();
                let due = s.clock.due(now);
                (due, s.clock.next_deadline())
            };
            for cmd in due {
                // Fire and forget: if the proposal is lost the clock re-arms it.
                let (node, timeout) = (node.clone(), node.config.raft.propose_timeout);
                tokio::spawn(async move {
                    if let Ok(Err(e)) = tokio::time::timeout(timeout, node.proposer.propose(cmd)).await {
                        tracing::debug!("expiry proposal failed: {e}");
                    }
                });
            }
            wake = next.map_or(wake, |n| n.min(wake));
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = applied.changed() => {}
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}
