//! The recorded history of a torture run: every client operation with its
//! start, end and outcome. A timed-out operation is `Unknown`, never assumed
//! to have failed.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Refused { status: u16, error: String },
    Unknown { why: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Kind {
    /// `token` is set when the grant was acknowledged.
    Acquire {
        key: String,
        token: Option<u64>,
    },
    /// A fenced write carrying `token`; `stale` marks a write by a holder that
    /// had paused past its TTL.
    Write {
        key: String,
        token: u64,
        stale: bool,
    },
    Release {
        key: String,
        token: u64,
    },
    /// The end of a holder's guaranteed validity (release sent, or the L4
    /// deadline when the holder paused): the service must not have granted
    /// the key to anyone else before it.
    ValidUntil {
        key: String,
        token: u64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Op {
    pub worker: usize,
    /// Milliseconds since the start of the run.
    pub start_ms: f64,
    pub end_ms: f64,
    #[serde(flatten)]
    pub kind: Kind,
    #[serde(flatten)]
    pub outcome: Outcome,
}

pub struct History {
    t0: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    pub fn new() -> Self {
        Self { t0: Instant::now(), ops: Mutex::new(vec![]) }
    }

    pub fn ms(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.t0).as_secs_f64() * 1000.0
    }

    pub fn record(&self, worker: usize, start: Instant, kind: Kind, outcome: Outcome) {
        let op = Op { worker, start_ms: self.ms(start), end_ms: self.ms(Instant::now()), kind, outcome };
        self.ops.lock().unwrap().push(op);
    }

    /// Add an operation recorded elsewhere (a worker process stamps its
    /// own on this history's timeline).
    pub fn push(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }
}
