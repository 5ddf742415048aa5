//! The Raft log and vote, in an append-only write-ahead log (`raft-log`:
//! chunk files of checksummed records, one `fdatasync` per flush), with
//! group commit.
//!
//! Every change (an append, a vote, a truncation, a purge) goes into the
//! WAL's buffer on the caller's thread, in the order openraft issues them,
//! and is readable at once (the WAL keeps in memory what is not durable yet,
//! as openraft requires). One `flush` makes everything buffered durable.
//! While a flush is being synced, the changes that come meanwhile wait
//! together and are flushed as one the moment it completes: many proposals
//! per fsync under load, and no wait at all for a lone client (the WAL's own
//! batching, which waits 1 ms for company, is off). openraft is told entries
//! are flushed only from that flush's completion (L5); a vote, truncation or
//! purge returns only once durable.
//!
//! It replaced a redb table (data formats 1–4) whose every commit rewrote
//! a B-tree's path, seven page writes and an fsync per append (decision
//! 0012, bench/README §11); `raft::log_upgrade` moves such a log here.
//!
//! `fencegate_raft_log_syncs_total` against `fencegate_raft_log_entries_total`
//! shows the batching.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{CommittedLeaderId, OptionalSend, RaftLogReader, StorageIOError};
use raft_log::api::raft_log_writer::RaftLogWriter;
use raft_log::codeq::{Decode, Encode};
use raft_log::{Callback, RaftLog, Types};
use tokio::sync::oneshot;

use super::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::metrics::RaftMetrics;

/// The log's directory in `data_dir` (data format 5 on).
pub(crate) const LOG_DIR: &str = "log";

/// A chunk file's size: the purge after a snapshot frees whole chunks, so
/// this bounds what the log keeps on disk beyond `snapshot_every` entries.
const CHUNK_BYTES: usize = 8 << 20;
/// Entries read back from memory rather than disk (the apply of what was
/// just appended, a follower a little behind); what is not durable yet is
/// always kept. As small as redb's page cache was: a node's memory stays
/// bounded by what it holds (tests/e2e/compaction.rs).
const CACHE_ENTRIES: usize = 4096;
const CACHE_BYTES: usize = 4 << 20;
/// The buffer that replays a chunk at start (the WAL's default is 64 MiB).
const REPLAY_BUFFER: usize = 1 << 20;

/// How the log's records are typed on disk: a log id is `((term, leader),
/// index)` (ordered as openraft orders them), an entry its JSON (as formats
/// 1–4 stored it), a vote openraft's.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Records;

impl Types for Records {
    type LogId = Key;
    type LogPayload = Vec<u8>;
    type Vote = StoredVote;
    type Callback = Flushed;
    type UserData = ();

    fn log_index(log_id: &Key) -> u64 {
        log_id.1
    }

    fn payload_size(payload: &Vec<u8>) -> u64 {
        payload.len() as u64
    }
}

/// openraft's vote, ordered as openraft orders votes: the WAL refuses to
/// store one that goes back, and openraft only saves one that does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredVote(pub Vote);

impl PartialOrd for StoredVote {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(&other.0)
    }
}

impl Encode for StoredVote {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        serde_json::to_vec(&self.0).map_err(io::Error::other)?.encode(w)
    }
}

impl Decode for StoredVote {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        let bytes = Vec::<u8>::decode(r)?;
        serde_json::from_slice(&bytes).map(StoredVote).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// A log id as the WAL keys it: openraft 0.9's leader ids (without
/// `single-term-leader`) are a term and a node, and its log ids compare by
/// both, then the index, as these tuples do.
pub(crate) type Key = ((u64, u64), u64);

pub(crate) fn key(log_id: &LogId) -> Key {
    ((log_id.leader_id.term, log_id.leader_id.node_id), log_id.index)
}

fn log_id(((term, node), index): Key) -> LogId {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

/// Open (or create) the WAL in `dir`, as this store configures it.
pub(crate) fn open_wal(dir: &Path) -> io::Result<RaftLog<Records>> {
    let mut config = raft_log::Config::new(dir.display());
    config.log_cache_max_items = Some(CACHE_ENTRIES);
    config.log_cache_capacity = Some(CACHE_BYTES);
    config.wal.chunk_max_size = Some(CHUNK_BYTES);
    config.wal.read_buffer_size = Some(REPLAY_BUFFER);
    // Group commit is ours (`flush`, below): the worker syncs what it is handed at once.
    config.wal.flush_batch_wait = Some(std::time::Duration::ZERO);
    // At most two flushes are queued at a time (one syncing, one next), so
    // no bound on queued bytes is needed; one would block the worker's own
    // callback when it hands over the next flush.
    config.wal.flush_queue_max_bytes = Some(usize::MAX / 2);
    RaftLog::open(Arc::new(config))
}

fn write_failed(e: io::Error) -> StorageError {
    StorageError::IO { source: StorageIOError::write_logs(&e) }
}

fn read_failed(e: io::Error) -> StorageError {
    StorageError::IO { source: StorageIOError::read_logs(&e) }
}

fn writer_gone() -> StorageError {
    StorageError::IO { source: StorageIOError::write_logs(openraft::AnyError::error("the log's flush stopped")) }
}

/// Run blocking storage work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    let joined = tokio::task::spawn_blocking(f).await;
    joined.map_err(|e| StorageError::IO { source: StorageIOError::write(&e) })?
}

/// Someone waiting for changes to be durable.
enum Waiter {
    Appended { entries: u64, done: LogFlushed<TypeConfig> },
    Other(oneshot::Sender<Result<(), StorageError>>),
}

impl Waiter {
    fn complete(self, result: &io::Result<()>) {
        let copy = || result.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
        match self {
            Waiter::Appended { done, .. } => done.log_io_completed(copy()),
            Waiter::Other(done) => {
                let _ = done.send(copy().map_err(write_failed));
            }
        }
    }
}

/// The WAL and the group commit around it.
struct Wal {
    log: RaftLog<Records>,
    /// A flush is being synced; changes made meanwhile wait in `next`.
    syncing: bool,
    next: Vec<Waiter>,
}

struct Shared {
    wal: Mutex<Wal>,
    metrics: RaftMetrics,
}

impl Shared {
    fn wal(&self) -> MutexGuard<'_, Wal> {
        self.wal.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Wait for what is buffered (with the changes already made) to be durable:
/// flushed now if nothing is syncing, else with the next flush.
fn flush(shared: &Arc<Shared>, mut wal: MutexGuard<'_, Wal>, waiter: Waiter) {
    wal.next.push(waiter);
    if !wal.syncing {
        start_flush(Arc::downgrade(shared), &mut wal);
    }
}

/// Hand every waiting change to the WAL's worker as one synced flush.
fn start_flush(shared: Weak<Shared>, wal: &mut Wal) {
    let waiters = std::mem::take(&mut wal.next);
    wal.syncing = true;
    let flushed = Flushed { waiters, shared };
    // On an error the callback is dropped, which tells its waiters; the
    // next change tries again (and fails the same way if the worker is gone).
    if let Err(e) = wal.log.flush(true, Some(flushed)) {
        tracing::error!("the Raft log's flush failed: {e}");
        wal.syncing = false;
    }
}

/// One flush's completion, called on the WAL's worker thread once its
/// `fdatasync` returned: tells its waiters, then starts the next flush if
/// changes came meanwhile. Holds the store weakly: the store's last owner
/// must not be this thread, whose WAL it would join on drop.
pub(crate) struct Flushed {
    waiters: Vec<Waiter>,
    shared: Weak<Shared>,
}

impl Callback for Flushed {
    fn send(mut self, result: io::Result<()>) {
        let waiters = std::mem::take(&mut self.waiters);
        if let Some(shared) = self.shared.upgrade() {
            if result.is_ok() {
                let entries =
                    waiters.iter().map(|w| if let Waiter::Appended { entries, .. } = w { *entries } else { 0 });
                shared.metrics.log_syncs.inc();
                shared.metrics.log_entries.inc_by(entries.sum());
            }
            {
                let mut wal = shared.wal();
                wal.syncing = false;
                if !wal.next.is_empty() {
                    start_flush(Arc::downgrade(&shared), &mut wal);
                }
            }
            // Dropped elsewhere if this was the last owner: its drop joins this thread.
            if let Some(last) = Arc::into_inner(shared) {
                std::thread::spawn(move || drop(last));
            }
        }
        // Told last, once this thread holds the store no more: a waiter
        // that then drops the store closes the WAL itself, at once.
        waiters.into_iter().for_each(|w| w.complete(&result));
    }
}

impl Drop for Flushed {
    /// Never called back (the worker stopped): its waiters are told so.
    fn drop(&mut self) {
        let gone = Err(io::Error::other("the log's flush stopped before it completed"));
        std::mem::take(&mut self.waiters).into_iter().for_each(|w| w.complete(&gone));
    }
}

#[derive(Clone)]
pub(crate) struct LogStore {
    shared: Arc<Shared>,
}

impl LogStore {
    /// Open the log in `dir` (created, and synced into its parent, if new).
    pub(crate) fn open(dir: &Path, metrics: RaftMetrics) -> io::Result<Self> {
        crate::durable::create_dir_all(dir)?;
        let log = open_wal(dir)?;
        let wal = Mutex::new(Wal { log, syncing: false, next: Vec::new() });
        Ok(Self { shared: Arc::new(Shared { wal, metrics }) })
    }

    /// Make a change to the WAL, then wait until it is durable.
    async fn change_and_wait(
        &self,
        change: impl FnOnce(&mut RaftLog<Records>) -> io::Result<()>,
    ) -> Result<(), StorageError> {
        let (done, wait) = oneshot::channel();
        {
            let mut wal = self.shared.wal();
            change(&mut wal.log).map_err(write_failed)?;
            flush(&self.shared, wal, Waiter::Other(done));
        }
        wait.await.map_err(|_| writer_gone())?
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let from = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        let shared = self.shared.clone();
        // A read not in the cache is a `pread`: off the async threads.
        blocking(move || {
            let wal = shared.wal();
            let decode = |p: &[u8]| serde_json::from_slice::<Entry>(p).map_err(|e| read_failed(io::Error::other(e)));
            wal.log.read(from, to).map(|r| decode(&r.map_err(read_failed)?.1)).collect()
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let wal = self.shared.wal();
        let state = wal.log.log_state();
        // A purge past the last entry (a snapshot installed) moves `last` to it.
        Ok(LogState {
            last_purged_log_id: state.purged().copied().map(log_id),
            last_log_id: state.last().copied().map(log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let vote = StoredVote(*vote);
        self.change_and_wait(|log| log.save_vote(vote).map(drop)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.shared.wal().log.log_state().vote().map(|v| v.0))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut records = Vec::new();
        for e in entries {
            records.push((key(&e.log_id), serde_json::to_vec(&e).map_err(|e| write_failed(io::Error::other(e)))?));
        }
        let mut wal = self.shared.wal();
        let appended = records.len() as u64;
        wal.log.append(records).map_err(write_failed)?;
        flush(&self.shared, wal, Waiter::Appended { entries: appended, done: callback });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.change_and_wait(|log| {
            // Nothing at or after the index: nothing to remove.
            if log.log_state().last().is_some_and(|last| last.1 >= log_id.index) {
                log.truncate(log_id.index)?;
            }
            Ok(())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // The chunks it frees are unlinked by the worker after this flush's sync.
        self.change_and_wait(|log| log.purge(key(&log_id)).map(drop)).await
    }
}

#[cfg(test)]
mod tests;
