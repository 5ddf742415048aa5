//! The engines behind one interface, and the simplest of them: a raw file
//! (appended to, or preallocated: the disk's floor) and redb as fencegate
//! used it for its log (data formats 1–4).
//! raft-log and raft-engine have a file each.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use redb::{Database, TableDefinition};

/// What every engine is asked: make entries durable.
pub trait Store: Send + 'static {
    /// Append `entries` at the consecutive indexes `first..` and return once
    /// they are durable: one commit, so one fsync (or what the engine does
    /// for one), however many entries there are.
    fn commit(&mut self, first: u64, entries: &[Vec<u8>]) -> io::Result<()>;
}

/// The bytes of entry `index`, the same for every engine: about what
/// fencegate's log holds for an entry of one lock command (openraft's JSON
/// of the entry), padded with spaces to `PAYLOAD_BYTES` so that the size
/// does not vary with the index.
pub fn payload(index: u64) -> Vec<u8> {
    let (key, holder, lease) = (index % 1000, index % 64, index.wrapping_mul(7919));
    let request = index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let log_id = format!(r#"{{"leader_id":{{"term":3,"node_id":1}},"index":{index}}}"#);
    let lease = format!(r#""lease":{lease},"request_id":"{request:016x}","now_ms":1764800000000"#);
    let acquire = format!(r#"{{"key":"racks/{key}","holder":"bench-holder-{holder}","ttl_ms":10000,{lease}}}"#);
    let mut bytes = format!(r#"{{"log_id":{log_id},"payload":{{"Normal":{{"commands":[{{"Acquire":{acquire}}}]}}}}}}"#)
        .into_bytes();
    bytes.resize(bytes.len().max(PAYLOAD_BYTES), b' ');
    bytes
}

pub const PAYLOAD_BYTES: usize = 300;

/// A raw file appended to: the entries' bytes written to the end of one
/// file and `fdatasync`ed, no framing, no checksum, no index; the least a
/// log store that grows its file does for an append. On ext4 each of those
/// `fdatasync`s also commits the journal: the file's size changed.
pub struct Raw {
    file: File,
    buf: Vec<u8>,
    /// Preallocated: where the next write goes, in a file of `RECYCLED` bytes.
    at: Option<u64>,
}

/// The size of the preallocated raw file, written over from its start again
/// when full (as raft-engine recycles its log files).
const RECYCLED: u64 = 16 << 20;

impl Raw {
    pub fn open(dir: &Path) -> io::Result<Raw> {
        let file = OpenOptions::new().create(true).append(true).open(dir.join("raw.log"))?;
        Ok(Raw { file, buf: Vec::new(), at: None })
    }

    /// The disk's floor: a file whose blocks were all written (zeros) and
    /// made durable beforehand, so that an append's `fdatasync` has only
    /// the data to flush, no size or extent to journal.
    pub fn preallocated(dir: &Path) -> io::Result<Raw> {
        let mut file = OpenOptions::new().create_new(true).write(true).open(dir.join("raw.log"))?;
        let zeros = vec![0; 1 << 20];
        for _ in 0..RECYCLED >> 20 {
            file.write_all(&zeros)?;
        }
        file.sync_all()?;
        Ok(Raw { file, buf: Vec::new(), at: Some(0) })
    }
}

impl Store for Raw {
    fn commit(&mut self, _first: u64, entries: &[Vec<u8>]) -> io::Result<()> {
        // One write per commit, as a WAL writes a batch.
        self.buf.clear();
        entries.iter().for_each(|e| self.buf.extend_from_slice(e));
        match self.at.as_mut() {
            None => self.file.write_all(&self.buf)?,
            Some(at) => {
                if *at + self.buf.len() as u64 > RECYCLED {
                    *at = 0;
                }
                self.file.write_all_at(&self.buf, *at)?;
                *at += self.buf.len() as u64;
            }
        }
        self.file.sync_data()
    }
}

/// fencegate's log table (data formats 1–4): index → the entry's JSON.
const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("logs");

/// redb as fencegate opened it (a 4 MiB cache) and wrote
/// it: a batch is one write transaction, committed with redb's default
/// `Durability::Immediate` (the commit returns after the fsync).
pub struct Redb {
    db: Database,
}

impl Redb {
    pub fn open(dir: &Path) -> io::Result<Redb> {
        let db = Database::builder().set_cache_size(4 << 20).create(dir.join("raft.redb")).map_err(io::Error::other)?;
        Ok(Redb { db })
    }
}

impl Store for Redb {
    fn commit(&mut self, first: u64, entries: &[Vec<u8>]) -> io::Result<()> {
        let txn = self.db.begin_write().map_err(io::Error::other)?;
        {
            let mut logs = txn.open_table(LOGS).map_err(io::Error::other)?;
            for (index, entry) in (first..).zip(entries) {
                logs.insert(index, entry.as_slice()).map_err(io::Error::other)?;
            }
        }
        txn.commit().map_err(io::Error::other)
    }
}
