//! Group commit for proposals: packs the commands that arrive while one Raft
//! entry is being committed into the next entry.
//!
//! openraft 0.9 writes (and fsyncs) one log entry per `client_write` and waits
//! for each flush before taking the next, so batching has to happen above it:
//! one task proposes one entry at a time, carrying every command that queued
//! up meanwhile. Under load, many proposals share one fsync on every node (L5);
//! idle, a lone proposal goes out at once.

use openraft::error::{ClientWriteError, RaftError};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

use crate::lock::state::{Command, Outcome};
use crate::raft::types::Raft;

/// Most commands packed into one entry.
const MAX_BATCH: usize = 1024;

#[derive(Debug, Clone, Error)]
pub enum ProposeError {
    #[error("this node is not the leader")]
    NotLeader,
    #[error("{0}")]
    Failed(String),
}

struct Pending {
    cmd: Command,
    reply: oneshot::Sender<Result<Outcome, ProposeError>>,
}

pub struct Proposer {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Proposer {
    pub fn start(raft: Raft) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx));
        Self { tx }
    }

    /// Propose `cmd` and wait until it is committed and applied. Callers bound
    /// the wait themselves; a command whose caller gave up before its batch
    /// went out is dropped, one already proposed may still be applied.
    pub async fn propose(&self, cmd: Command) -> Result<Outcome, ProposeError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Pending { cmd, reply }).map_err(|_| ProposeError::Failed("shutting down".into()))?;
        rx.await.map_err(|_| ProposeError::Failed("shutting down".into()))?
    }
}

async fn run(raft: Raft, mut rx: mpsc::UnboundedReceiver<Pending>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let cmds = batch.iter().map(|p| p.cmd.clone()).collect();
        match raft.client_write(cmds).await {
            Ok(resp) => {
                for (p, outcome) in batch.into_iter().zip(resp.data) {
                    let _ = p.reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                let err = match e {
                    RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => ProposeError::NotLeader,
                    other => ProposeError::Failed(other.to_string()),
                };
                for p in batch {
                    let _ = p.reply.send(Err(err.clone()));
                }
            }
        }
    }
}
