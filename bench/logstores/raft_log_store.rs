//! raft-log (openraft's author's chunked WAL): records are encoded into
//! memory by `append`, and `flush` hands them to its flush worker thread,
//! which writes them (one `writev`) and `fdatasync`s, then calls back.

use std::io;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use raft_log::api::raft_log_writer::RaftLogWriter;
use raft_log::{Config, RaftLog};

use crate::stores::Store;

/// The term of every entry: the leader does not change in a benchmark.
const TERM: u64 = 3;

/// How long a flush may take before the benchmark gives up on it.
const FLUSH_LIMIT: Duration = Duration::from_secs(60);

/// The types of a log like fencegate's: log ids and votes as (term, index)
/// and (term, node), payloads the entries' bytes (fencegate's log ids also
/// carry the leader's node: 8 bytes more per record).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Types;

impl raft_log::Types for Types {
    /// (term, index)
    type LogId = (u64, u64);
    type LogPayload = Vec<u8>;
    /// (term, voted for)
    type Vote = (u64, u64);
    type Callback = SyncSender<io::Result<()>>;
    type UserData = ();

    fn log_index(log_id: &Self::LogId) -> u64 {
        log_id.1
    }

    fn payload_size(payload: &Self::LogPayload) -> u64 {
        payload.len() as u64
    }
}

pub struct RaftLogStore {
    log: RaftLog<Types>,
    flushed: (SyncSender<io::Result<()>>, Receiver<io::Result<()>>),
}

impl RaftLogStore {
    pub fn open(dir: &Path) -> io::Result<RaftLogStore> {
        // As fencegate configures it from data format 5 (src/raft/log_store.rs):
        // 8 MiB chunks (a purge frees whole chunks), a cache of 4096 entries
        // or 4 MiB.
        let mut config = Config::new(dir.display());
        config.wal.chunk_max_size = Some(8 << 20);
        config.log_cache_max_items = Some(4096);
        config.log_cache_capacity = Some(4 << 20);
        // Its flush worker would otherwise wait up to 1 ms for more requests
        // before every fsync: the batching is ours (the writer thread), so
        // that every engine batches alike.
        config.wal.flush_batch_wait = Some(Duration::ZERO);
        let mut store = RaftLogStore { log: RaftLog::open(Arc::new(config))?, flushed: sync_channel(1) };
        // A log starts with its vote, as a node's does; not measured.
        store.log.save_vote((TERM, 1))?;
        store.flush()?;
        Ok(store)
    }

    /// Write and fsync everything appended so far; return when it is durable.
    fn flush(&mut self) -> io::Result<()> {
        self.log.flush(true, Some(self.flushed.0.clone()))?;
        self.flushed.1.recv_timeout(FLUSH_LIMIT).map_err(io::Error::other)?
    }
}

impl Store for RaftLogStore {
    fn commit(&mut self, first: u64, entries: &[Vec<u8>]) -> io::Result<()> {
        self.log.append((first..).zip(entries).map(|(index, e)| ((TERM, index), e.clone())))?;
        self.flush()
    }
}
