//! The leader's two batched Raft calls (see `crate::batch`):
//!
//! - **proposals**: openraft 0.9 writes and fsyncs one log entry per
//!   `client_write` and waits for each flush before taking the next, so
//!   batching has to happen above it: one entry carries every command that
//!   queued while the previous entry was being committed. Under load, many
//!   proposals share one fsync on every node (L5); idle, a lone proposal goes
//!   out at once.
//! - **leadership checks**: keepalives and linearizable reads that arrive
//!   while one `ensure_linearizable` round runs share the next round, which
//!   starts after all of them were received (L3 needs exactly that).
//!
//! `pause` refuses both while a leadership handover runs (`members`).
//! Knows nothing of HTTP or of what commands mean.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use thiserror::Error;

use crate::batch::Batcher;
use crate::lock::state::{Command, Outcome};
use crate::raft::types::Raft;

/// Most commands packed into one entry (bounds the size of an entry, and so
/// of an append RPC; see `max_payload_entries` in `server.rs`).
const MAX_BATCH: usize = 256;

#[derive(Debug, Clone, Error)]
pub(crate) enum RaftCallError {
    #[error("this node is not the leader")]
    NotLeader,
    /// Refused before anything was proposed: leadership is being handed over.
    #[error("this node is handing leadership over")]
    HandingOver,
    #[error("{0}")]
    Failed(String),
}

const STOPPED: &str = "shutting down";

pub(crate) struct Proposer {
    writes: Batcher<Command, Result<Outcome, RaftCallError>>,
    checks: Batcher<(), Result<(), RaftCallError>>,
    /// Handovers under way (`pause`): while any is, proposals and
    /// leadership checks are refused as if this node were not the leader,
    /// so the log stops growing under the node taking over.
    paused: Arc<AtomicUsize>,
    /// Batches being proposed now (entries that may still be appended).
    in_flight: Arc<AtomicUsize>,
}

/// Proposals are refused until this is dropped.
pub(crate) struct Paused(Arc<AtomicUsize>);

impl Drop for Paused {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Proposer {
    pub(crate) fn start(raft: Raft) -> Self {
        let r = raft.clone();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let paused: Arc<AtomicUsize> = Arc::default();
        let (busy, held) = (in_flight.clone(), paused.clone());
        let writes = Batcher::start(MAX_BATCH, move |cmds: Vec<Command>| {
            let (raft, n, busy, held) = (r.clone(), cmds.len(), busy.clone(), held.clone());
            async move {
                busy.fetch_add(1, Ordering::SeqCst);
                // Queued before a pause, taken after it: refused too. Either
                // this sees the pause or the handover sees the batch busy.
                if held.load(Ordering::SeqCst) > 0 {
                    busy.fetch_sub(1, Ordering::SeqCst);
                    return vec![Err(RaftCallError::HandingOver); n];
                }
                let written = raft.client_write(cmds).await;
                busy.fetch_sub(1, Ordering::SeqCst);
                match written {
                    Ok(resp) => resp.data.into_iter().map(Ok).collect(),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                        vec![Err(RaftCallError::NotLeader); n]
                    }
                    Err(e) => vec![Err(RaftCallError::Failed(e.to_string())); n],
                }
            }
        });
        let held = paused.clone();
        let checks = Batcher::start(usize::MAX, move |waiters: Vec<()>| {
            let (raft, held) = (raft.clone(), held.clone());
            async move {
                if held.load(Ordering::SeqCst) > 0 {
                    return vec![Err(RaftCallError::HandingOver); waiters.len()];
                }
                let result = match raft.ensure_linearizable().await {
                    Ok(_) => Ok(()),
                    Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => Err(RaftCallError::NotLeader),
                    Err(e) => Err(RaftCallError::Failed(e.to_string())),
                };
                vec![result; waiters.len()]
            }
        });
        Self { writes, checks, paused, in_flight }
    }

    /// Whether no batch is being proposed (with proposals paused: the log
    /// has stopped growing).
    pub(crate) fn idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
    }

    /// Refuse proposals and checks (`HandingOver`) until the guard is dropped.
    pub(crate) fn pause(&self) -> Paused {
        self.paused.fetch_add(1, Ordering::SeqCst);
        Paused(self.paused.clone())
    }

    /// Propose `cmd` and wait until it is committed and applied. Callers bound
    /// the wait themselves; a command whose caller gave up before its batch
    /// went out is dropped, one already proposed may still be applied.
    pub(crate) async fn propose(&self, cmd: Command) -> Result<Outcome, RaftCallError> {
        if self.paused.load(Ordering::SeqCst) > 0 {
            return Err(RaftCallError::HandingOver);
        }
        self.writes.call(cmd).await.unwrap_or(Err(RaftCallError::Failed(STOPPED.into())))
    }

    /// Confirm with a quorum, in a round started after this call, that this
    /// node is leader, and wait until everything committed before is applied.
    pub(crate) async fn confirm_leadership(&self) -> Result<(), RaftCallError> {
        // A check is a heartbeat round: it would renew the followers' view
        // of this leader, which a handover waits to run out.
        if self.paused.load(Ordering::SeqCst) > 0 {
            return Err(RaftCallError::HandingOver);
        }
        self.checks.call(()).await.unwrap_or(Err(RaftCallError::Failed(STOPPED.into())))
    }
}
