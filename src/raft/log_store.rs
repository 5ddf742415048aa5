//! The Raft log and vote, stored in redb.
//!
//! Every append is one redb write transaction committed with
//! `Durability::Immediate` (fsync) before openraft is told the entries are
//! flushed (L5). openraft hands us all entries that queued up while the
//! previous fsync ran in one `append` call, so under load many proposals share
//! one fsync; `fencegate_raft_log_syncs_total` against
//! `fencegate_raft_log_entries_total` shows the ratio.
//!
//! redb calls block, so each runs on the blocking pool; openraft serialises
//! storage calls, so they never overlap.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::metrics::RaftMetrics;

const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("logs");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE: &str = "vote";
const LAST_PURGED: &str = "last_purged";

#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    metrics: RaftMetrics,
}

/// Any redb error, as an openraft storage error of the given kind.
fn io<E: std::error::Error + 'static>(kind: fn(&E) -> StorageIOError<u64>) -> impl Fn(E) -> StorageError {
    move |e| StorageError::IO { source: kind(&e) }
}

/// Run blocking redb work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f).await.map_err(io(|e: &tokio::task::JoinError| StorageIOError::write(e)))?
}

pub(crate) fn read_meta<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, StorageError> {
    let err = io(|e: &redb::Error| StorageIOError::read(e));
    let txn = db.begin_read().map_err(|e| err(e.into()))?;
    let table = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(err(e.into())),
    };
    let Some(v) = table.get(key).map_err(|e| err(e.into()))? else { return Ok(None) };
    serde_json::from_slice(v.value()).map(Some).map_err(io(|e: &serde_json::Error| StorageIOError::read(e)))
}

pub(crate) fn write_meta<T: Serialize>(db: &Database, key: &str, value: &T) -> Result<(), StorageError> {
    let err = io(|e: &redb::Error| StorageIOError::write(e));
    let bytes = serde_json::to_vec(value).map_err(io(|e: &serde_json::Error| StorageIOError::write(e)))?;
    let txn = db.begin_write().map_err(|e| err(e.into()))?;
    txn.open_table(META).map_err(|e| err(e.into()))?.insert(key, bytes.as_slice()).map_err(|e| err(e.into()))?;
    txn.commit().map_err(|e| err(e.into()))
}

impl LogStore {
    pub fn new(db: Arc<Database>, metrics: RaftMetrics) -> Self {
        Self { db, metrics }
    }

    /// Delete the log entries whose index is in `range`, durably.
    fn delete(&self, range: (Bound<u64>, Bound<u64>)) -> Result<(), StorageError> {
        let err = io(|e: &redb::Error| StorageIOError::write_logs(e));
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        txn.open_table(LOGS).map_err(|e| err(e.into()))?.retain_in(range, |_, _| false).map_err(|e| err(e.into()))?;
        txn.commit().map_err(|e| err(e.into()))
    }

    fn last_entry(&self) -> Result<Option<LogId>, StorageError> {
        let err = io(|e: &redb::Error| StorageIOError::read_logs(e));
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let table = match txn.open_table(LOGS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(e.into())),
        };
        let Some((_, v)) = table.last().map_err(|e| err(e.into()))? else { return Ok(None) };
        let entry: Entry =
            serde_json::from_slice(v.value()).map_err(io(|e: &serde_json::Error| StorageIOError::read_logs(e)))?;
        Ok(Some(entry.log_id))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let db = self.db.clone();
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        blocking(move || {
            let err = io(|e: &redb::Error| StorageIOError::read_logs(e));
            let txn = db.begin_read().map_err(|e| err(e.into()))?;
            let table = match txn.open_table(LOGS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(vec![]),
                Err(e) => return Err(err(e.into())),
            };
            let mut out = Vec::new();
            for row in table.range::<u64>(range).map_err(|e| err(e.into()))? {
                let (_, v) = row.map_err(|e| err(e.into()))?;
                out.push(
                    serde_json::from_slice(v.value())
                        .map_err(io(|e: &serde_json::Error| StorageIOError::read_logs(e)))?,
                );
            }
            Ok(out)
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let this = self.clone();
        blocking(move || {
            let last_purged_log_id: Option<LogId> = read_meta(&this.db, LAST_PURGED)?;
            let last_log_id = this.last_entry()?.or(last_purged_log_id);
            Ok(LogState { last_purged_log_id, last_log_id })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let (db, vote) = (self.db.clone(), *vote);
        blocking(move || write_meta(&db, VOTE, &vote)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let db = self.db.clone();
        blocking(move || read_meta(&db, VOTE)).await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let encode = io(|e: &serde_json::Error| StorageIOError::write_logs(e));
        let rows = entries
            .into_iter()
            .map(|e| Ok((e.log_id.index, serde_json::to_vec(&e).map_err(&encode)?)))
            .collect::<Result<Vec<_>, StorageError>>()?;
        let (db, metrics, n) = (self.db.clone(), self.metrics.clone(), rows.len());
        let result = blocking(move || {
            let err = io(|e: &redb::Error| StorageIOError::write_logs(e));
            let txn = db.begin_write().map_err(|e| err(e.into()))?;
            {
                let mut table = txn.open_table(LOGS).map_err(|e| err(e.into()))?;
                for (index, bytes) in &rows {
                    table.insert(index, bytes.as_slice()).map_err(|e| err(e.into()))?;
                }
            }
            // Durability::Immediate is redb's default: commit returns after fsync.
            txn.commit().map_err(|e| err(e.into()))
        })
        .await;
        if result.is_ok() {
            metrics.log_syncs.inc();
            metrics.log_entries.inc_by(n as u64);
        }
        callback.log_io_completed(result.clone().map_err(std::io::Error::other));
        result
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let this = self.clone();
        blocking(move || this.delete((Bound::Included(log_id.index), Bound::Unbounded))).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let this = self.clone();
        blocking(move || {
            // Record the purge point first: a crash between the two leaves
            // extra entries behind, never a hole.
            write_meta(&this.db, LAST_PURGED, &log_id)?;
            this.delete((Bound::Unbounded, Bound::Included(log_id.index)))
        })
        .await
    }
}
