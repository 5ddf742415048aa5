//! Where a node keeps its latest Raft snapshot: `data_dir/snapshot`, a file
//! of its own (from data format 2) beside the log's database, not in it. In the
//! database, writing megabytes of table held redb's single write lock, and
//! with it every log append, for long enough that followers campaigned
//! (`bench/elections.rs`: elections under load at each of the first
//! snapshots).
//!
//! The file is one line of JSON (the snapshot's Raft metadata and the
//! table's length), then the table. It is written as a temporary file,
//! synced, renamed over the old one and the directory synced: a crash
//! leaves the old snapshot or the new one, never half of one. A data
//! directory of format 1 has its snapshot in the database's metadata; it is
//! read from there until this node writes its first snapshot file.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use openraft::{AnyError, StorageIOError};
use redb::Database;
use serde::{Deserialize, Serialize};

use super::meta::read_meta;
use super::types::{SnapshotMeta, StorageError};

/// Format 1's key in the database's metadata.
const LEGACY_KEY: &str = "snapshot";
const FILE: &str = "snapshot";

/// A snapshot as stored: Raft's metadata and the encoded table.
pub(crate) struct StoredSnapshot {
    pub meta: SnapshotMeta,
    pub data: Vec<u8>,
}

/// Format 1's encoding (the table as a JSON array of bytes).
#[derive(Deserialize)]
struct Legacy {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// The file's first line.
#[derive(Serialize, Deserialize)]
struct Header {
    meta: SnapshotMeta,
    bytes: u64,
}

#[derive(Clone)]
pub(crate) struct SnapshotFile {
    dir: PathBuf,
    db: Arc<Database>,
}

fn io_error(what: String) -> StorageError {
    StorageError::IO { source: StorageIOError::read_snapshot(None, AnyError::error(what)) }
}

impl SnapshotFile {
    /// The snapshot of the node whose data directory is `dir` and log database `db`.
    pub(crate) fn new(dir: PathBuf, db: Arc<Database>) -> SnapshotFile {
        SnapshotFile { dir, db }
    }

    /// Where the snapshot of the data directory `dir` is.
    pub(crate) fn path_in(dir: &std::path::Path) -> PathBuf {
        dir.join(FILE)
    }

    /// The latest snapshot: the file, else (format 1) the database's.
    pub(crate) fn read(&self) -> Result<Option<StoredSnapshot>, StorageError> {
        let path = Self::path_in(&self.dir);
        let mut bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let legacy: Option<Legacy> = read_meta(&self.db, LEGACY_KEY)?;
                return Ok(legacy.map(|l| StoredSnapshot { meta: l.meta, data: l.data }));
            }
            Err(e) => return Err(io_error(format!("reading {}: {e}", path.display()))),
        };
        let newline = bytes.iter().position(|b| *b == b'\n');
        let header = newline.and_then(|n| serde_json::from_slice::<Header>(&bytes[..n]).ok().map(|h| (n, h)));
        match header {
            Some((n, h)) if (bytes.len() - n - 1) as u64 == h.bytes => {
                Ok(Some(StoredSnapshot { meta: h.meta, data: bytes.split_off(n + 1) }))
            }
            _ => Err(io_error(format!("{} is not a whole snapshot", path.display()))),
        }
    }

    /// Replace the latest snapshot with `s`, durably.
    pub(crate) fn write(&self, s: &StoredSnapshot) -> Result<(), StorageError> {
        let fail = |what: &str, e: std::io::Error| StorageError::IO {
            source: StorageIOError::write_snapshot(None, AnyError::error(format!("{what}: {e}"))),
        };
        let header = Header { meta: s.meta.clone(), bytes: s.data.len() as u64 };
        let mut line = serde_json::to_vec(&header).expect("snapshot metadata serialises");
        line.push(b'\n');
        let partial = self.dir.join(format!("{FILE}.partial"));
        let mut f = std::fs::File::create(&partial).map_err(|e| fail("creating the snapshot file", e))?;
        f.write_all(&line)
            .and_then(|()| f.write_all(&s.data))
            .and_then(|()| f.sync_all())
            .map_err(|e| fail("writing the snapshot file", e))?;
        std::fs::rename(&partial, self.dir.join(FILE)).map_err(|e| fail("renaming the snapshot file", e))?;
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| fail("syncing the data directory", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::meta::write_meta;

    fn meta(id: &str) -> SnapshotMeta {
        SnapshotMeta { snapshot_id: id.into(), ..Default::default() }
    }

    #[test]
    fn format_1s_snapshot_is_read_until_a_file_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("raft.redb")).unwrap());
        let file = SnapshotFile::new(dir.path().to_path_buf(), db.clone());
        assert!(file.read().unwrap().is_none());
        // As format 1 stored it: the table as a JSON array, in the metadata.
        let legacy = serde_json::json!({ "meta": meta("old"), "data": b"{\"old\":1}".to_vec() });
        write_meta(&db, LEGACY_KEY, &legacy).unwrap();
        let old = file.read().unwrap().unwrap();
        assert_eq!((old.meta.snapshot_id.as_str(), old.data.as_slice()), ("old", &b"{\"old\":1}"[..]));
        file.write(&StoredSnapshot { meta: meta("new"), data: b"{\"new\":2}\n".to_vec() }).unwrap();
        let new = file.read().unwrap().unwrap();
        assert_eq!((new.meta.snapshot_id.as_str(), new.data.as_slice()), ("new", &b"{\"new\":2}\n"[..]));
        assert!(!dir.path().join("snapshot.partial").exists());
    }

    #[test]
    fn a_cut_or_foreign_file_is_refused_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("raft.redb")).unwrap());
        let file = SnapshotFile::new(dir.path().to_path_buf(), db);
        file.write(&StoredSnapshot { meta: meta("s"), data: vec![b'x'; 100] }).unwrap();
        let bytes = std::fs::read(dir.path().join(FILE)).unwrap();
        for bad in [&bytes[..bytes.len() - 1], &b"not a snapshot"[..], &[][..]] {
            std::fs::write(dir.path().join(FILE), bad).unwrap();
            assert!(file.read().is_err(), "{:?} was taken", String::from_utf8_lossy(bad));
        }
    }
}
