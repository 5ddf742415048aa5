//! TiKV's raft-engine: a `LogBatch` per write, `Engine::write(batch, sync)`.
//! Concurrent writers go through its write barrier, where the first writer
//! in leads a group: it writes every queued batch and fsyncs once for all.
//!
//! Entries go in through its entry API (`add_entries`), the path TiKV's
//! Raft logs take: the bytes are stored in the log files and only their
//! positions in memory (its key-value API would keep every value in its
//! memtables). That API wants protobuf 2 messages; protobuf's own
//! `BytesValue` is one that needs no codegen: its bytes are the entry's
//! index (8 bytes, big-endian, where `MessageExt::index` reads it back),
//! then the payload, so raft-engine stores 8 bytes more per entry than the
//! others, plus the message's 3-byte header.

use std::io;
use std::path::Path;
use std::sync::Arc;

use protobuf::well_known_types::BytesValue;
use raft_engine::{Config, Engine, LogBatch, MessageExt};

use crate::stores::Store;

/// The Raft group of the one-writer phase and of the group-commit path.
const REGION: u64 = 1;

/// Entries as raft-engine's entry API takes them.
#[derive(Clone)]
pub struct Entries;

impl MessageExt for Entries {
    type Entry = BytesValue;

    fn index(e: &BytesValue) -> u64 {
        u64::from_be_bytes(e.value[..8].try_into().expect("an entry starts with its index"))
    }
}

pub fn open(dir: &Path) -> io::Result<Arc<Engine>> {
    // Its defaults otherwise (128 MiB files, allocated ahead by 4 MiB
    // `fallocate`s; lz4 only for batches over 8 KiB, so none here).
    let config = Config { dir: dir.display().to_string(), ..Default::default() };
    Engine::open(config).map(Arc::new).map_err(io::Error::other)
}

/// Append `entries` at `first..` to Raft group `region`, durably.
pub fn append(engine: &Engine, region: u64, first: u64, entries: &[Vec<u8>]) -> io::Result<()> {
    let messages: Vec<BytesValue> = (first..)
        .zip(entries)
        .map(|(index, e)| {
            let mut value = Vec::with_capacity(8 + e.len());
            value.extend_from_slice(&index.to_be_bytes());
            value.extend_from_slice(e);
            BytesValue { value, ..Default::default() }
        })
        .collect();
    // One item: the group's run of entries.
    let mut batch = LogBatch::with_capacity(1);
    batch.add_entries::<Entries>(region, &messages).map_err(io::Error::other)?;
    engine.write(&mut batch, true).map(drop).map_err(io::Error::other)
}

/// fsyncs raft-engine has made in this process, from its metrics (the
/// count of its sync duration histogram, in prometheus' default registry).
pub fn fsyncs() -> u64 {
    prometheus::gather()
        .iter()
        .find(|f| f.get_name() == "raft_engine_sync_log_duration_seconds")
        .and_then(|f| f.get_metric().first())
        .map_or(0, |m| m.get_histogram().get_sample_count())
}

/// The one-writer phase: Raft group `REGION`.
pub struct RaftEngineStore(pub Arc<Engine>);

impl Store for RaftEngineStore {
    fn commit(&mut self, first: u64, entries: &[Vec<u8>]) -> io::Result<()> {
        append(&self.0, REGION, first, entries)
    }
}
