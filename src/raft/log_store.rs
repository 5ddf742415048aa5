//! The Raft log and vote, stored in redb, with group commit.
//!
//! openraft 0.9 hands the log store one `append` per client write. Each fsync
//! costs far more than the write itself, so appends are queued to a single
//! writer thread that drains everything queued while the previous fsync ran
//! and commits it in one redb write transaction (`Durability::Immediate`, i.e.
//! fsync) — many proposals per fsync under load. openraft is told entries are
//! flushed only after that commit returns (L5).
//!
//! Until then, appended entries are readable from `pending`, as openraft
//! requires. Vote saves, truncations and purges go through the same queue, so
//! every write reaches the disk in the order openraft issued it, and the
//! caller waits for them to be durable.
//!
//! `fencegate_raft_log_syncs_total` against `fencegate_raft_log_entries_total`
//! shows the batching.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{mpsc, Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot;

use super::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::metrics::RaftMetrics;

const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("logs");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE: &str = "vote";
const LAST_PURGED: &str = "last_purged";

/// Most queued operations committed in one transaction.
const MAX_BATCH: usize = 4096;

/// Any error, as an openraft storage error of the given kind.
fn io<E: std::error::Error + 'static>(kind: fn(&E) -> StorageIOError<u64>) -> impl Fn(E) -> StorageError {
    move |e| StorageError::IO { source: kind(&e) }
}

fn write_err(e: impl Into<redb::Error>) -> StorageError {
    StorageError::IO { source: StorageIOError::write_logs(&e.into()) }
}

fn read_err(e: impl Into<redb::Error>) -> StorageError {
    StorageError::IO { source: StorageIOError::read_logs(&e.into()) }
}

/// Run blocking redb work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f).await.map_err(io(|e: &tokio::task::JoinError| StorageIOError::write(e)))?
}

pub(crate) fn read_meta<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, StorageError> {
    let txn = db.begin_read().map_err(read_err)?;
    let table = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let Some(v) = table.get(key).map_err(read_err)? else { return Ok(None) };
    serde_json::from_slice(v.value()).map(Some).map_err(io(|e: &serde_json::Error| StorageIOError::read(e)))
}

fn put_meta<T: Serialize>(txn: &WriteTransaction, key: &str, value: &T) -> Result<(), StorageError> {
    let bytes = serde_json::to_vec(value).map_err(io(|e: &serde_json::Error| StorageIOError::write(e)))?;
    txn.open_table(META).map_err(write_err)?.insert(key, bytes.as_slice()).map_err(write_err)?;
    Ok(())
}

/// One durable write transaction with a single metadata value.
pub(crate) fn write_meta<T: Serialize>(db: &Database, key: &str, value: &T) -> Result<(), StorageError> {
    let txn = db.begin_write().map_err(write_err)?;
    put_meta(&txn, key, value)?;
    txn.commit().map_err(write_err)
}

/// A write for the writer thread.
enum Op {
    Append { rows: Vec<(LogId, Vec<u8>)>, done: LogFlushed<TypeConfig> },
    Vote { vote: Vote, done: oneshot::Sender<Result<(), StorageError>> },
    Truncate { from: u64, done: oneshot::Sender<Result<(), StorageError>> },
    Purge { upto: LogId, done: oneshot::Sender<Result<(), StorageError>> },
}

/// What the writer thread shares with the store. The queue's sender is not
/// in here: when the last `LogStore` clone drops, the thread exits and the
/// database is closed.
struct Shared {
    db: Arc<Database>,
    /// Appended, not yet durable; readable as openraft requires.
    pending: Mutex<BTreeMap<u64, Entry>>,
    metrics: RaftMetrics,
}

#[derive(Clone)]
pub(crate) struct LogStore {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Op>,
}

fn writer_gone() -> StorageError {
    StorageError::IO { source: StorageIOError::write_logs(openraft::AnyError::error("the log writer thread stopped")) }
}

impl LogStore {
    pub(crate) fn new(db: Arc<Database>, metrics: RaftMetrics) -> Self {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared { db, pending: Mutex::new(BTreeMap::new()), metrics });
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("fencegate-log-writer".into())
            .spawn(move || write_loop(&writer, &rx))
            .expect("spawning the log writer thread");
        Self { shared, queue: tx }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.shared.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enqueue(&self, op: Op) -> Result<(), StorageError> {
        self.queue.send(op).map_err(|_| writer_gone())
    }

    /// Queue a write and wait until it is durable.
    async fn write_and_wait(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<(), StorageError>>) -> Op,
    ) -> Result<(), StorageError> {
        let (done, wait) = oneshot::channel();
        self.enqueue(op(done))?;
        wait.await.map_err(|_| writer_gone())?
    }

    fn last_durable(&self) -> Result<Option<LogId>, StorageError> {
        let txn = self.shared.db.begin_read().map_err(read_err)?;
        let table = match txn.open_table(LOGS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(read_err(e)),
        };
        let Some((_, v)) = table.last().map_err(read_err)? else { return Ok(None) };
        let entry: Entry =
            serde_json::from_slice(v.value()).map_err(io(|e: &serde_json::Error| StorageIOError::read_logs(e)))?;
        Ok(Some(entry.log_id))
    }
}

/// The writer thread: take everything queued, commit it as one transaction,
/// then report each operation's result in order.
fn write_loop(shared: &Shared, rx: &mpsc::Receiver<Op>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let result = commit(&shared.db, &batch);
        let mut appended = 0;
        {
            let mut pending = shared.pending.lock().unwrap_or_else(|p| p.into_inner());
            for op in &batch {
                if let Op::Append { rows, .. } = op {
                    appended += rows.len();
                    for (log_id, _) in rows {
                        // A later append at the same index (after a truncate) stays pending.
                        if pending.get(&log_id.index).is_some_and(|e| e.log_id == *log_id) {
                            pending.remove(&log_id.index);
                        }
                    }
                }
            }
        }
        if result.is_ok() {
            shared.metrics.log_syncs.inc();
            shared.metrics.log_entries.inc_by(appended as u64);
        }
        for op in batch {
            let r = result.clone();
            match op {
                Op::Append { done, .. } => done.log_io_completed(r.map_err(std::io::Error::other)),
                Op::Vote { done, .. } | Op::Truncate { done, .. } | Op::Purge { done, .. } => {
                    let _ = done.send(r);
                }
            }
        }
    }
}

fn commit(db: &Database, batch: &[Op]) -> Result<(), StorageError> {
    let txn = db.begin_write().map_err(write_err)?;
    {
        let mut logs = txn.open_table(LOGS).map_err(write_err)?;
        for op in batch {
            match op {
                Op::Append { rows, .. } => {
                    for (log_id, bytes) in rows {
                        logs.insert(log_id.index, bytes.as_slice()).map_err(write_err)?;
                    }
                }
                Op::Vote { vote, .. } => put_meta(&txn, VOTE, vote)?,
                Op::Truncate { from, .. } => {
                    logs.retain_in((Bound::Included(*from), Bound::Unbounded), |_, _| false).map_err(write_err)?
                }
                Op::Purge { upto, .. } => {
                    put_meta(&txn, LAST_PURGED, upto)?;
                    logs.retain_in((Bound::Unbounded, Bound::Included(upto.index)), |_, _| false).map_err(write_err)?
                }
            }
        }
    }
    // Durability::Immediate is redb's default: commit returns after fsync.
    txn.commit().map_err(write_err)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        let this = self.clone();
        blocking(move || {
            let mut out = BTreeMap::new();
            let txn = this.shared.db.begin_read().map_err(read_err)?;
            match txn.open_table(LOGS) {
                Ok(table) => {
                    for row in table.range::<u64>(range).map_err(read_err)? {
                        let (k, v) = row.map_err(read_err)?;
                        let e: Entry = serde_json::from_slice(v.value())
                            .map_err(io(|e: &serde_json::Error| StorageIOError::read_logs(e)))?;
                        out.insert(k.value(), e);
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(read_err(e)),
            }
            // Entries not yet durable are newer than anything on disk.
            for (i, e) in this.pending().range(range) {
                out.insert(*i, e.clone());
            }
            Ok(out.into_values().collect())
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let this = self.clone();
        blocking(move || {
            let last_purged_log_id: Option<LogId> = read_meta(&this.shared.db, LAST_PURGED)?;
            let last_pending = this.pending().values().next_back().map(|e| e.log_id);
            let last_log_id = last_pending.or(this.last_durable()?).or(last_purged_log_id);
            Ok(LogState { last_purged_log_id, last_log_id })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let vote = *vote;
        self.write_and_wait(|done| Op::Vote { vote, done }).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let db = self.shared.db.clone();
        blocking(move || read_meta(&db, VOTE)).await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let encode = io(|e: &serde_json::Error| StorageIOError::write_logs(e));
        let mut rows = Vec::new();
        {
            let mut pending = self.pending();
            for e in entries {
                rows.push((e.log_id, serde_json::to_vec(&e).map_err(&encode)?));
                pending.insert(e.log_id.index, e);
            }
        }
        self.enqueue(Op::Append { rows, done: callback })
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.pending().split_off(&log_id.index);
        self.write_and_wait(|done| Op::Truncate { from: log_id.index, done }).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write_and_wait(|done| Op::Purge { upto: log_id, done }).await
    }
}
