//! Data format 5 moved the Raft log and the vote out of `raft.redb` (formats
//! 1–4: a `logs` table and two metadata values) into the append-only WAL of
//! `raft::log_store`, in `data_dir/log/`. A data directory of an older
//! format is moved at its first start, before anything reads it:
//!
//! 1. the entries, the vote and the purge point are copied into a new WAL in
//!    `log.new/`, and synced;
//! 2. `log.new/` is renamed `log/`, and `data_dir` synced;
//! 3. one redb transaction drops the old log and vote and marks the new
//!    format.
//!
//! A crash anywhere leaves either an older format with its log intact, and
//! a `log.new/` or `log/` that is half a move (removed, and the move made
//! again from the start), or the new format with the whole WAL. A build of
//! format 4 refuses the moved directory (`server::check_format`).

use std::path::Path;

use anyhow::Context;
use raft_log::api::raft_log_writer::RaftLogWriter;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

#[cfg(test)]
use super::log_store::Key;
use super::log_store::{key, open_wal, StoredVote, LOG_DIR};
use super::meta::{put_meta, read_meta, write_err, META};
use super::types::{Entry, LogId, Vote};

/// Where formats 1–4 kept the log: index → the entry's JSON.
const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("logs");
/// And the vote and the purge point, in the metadata.
const VOTE: &str = "vote";
const LAST_PURGED: &str = "last_purged";

/// Entries handed to the WAL's worker at a time: bounds the memory a long
/// log takes while it is copied.
const COPY_BATCH: usize = 1024;

/// Move the log and vote of `db` (a data directory of a format before 5)
/// into `data_dir/log/`, then mark the directory `format`. Returns how
/// many entries were moved.
pub(crate) fn move_log(db: &Database, data_dir: &Path, format: u32) -> anyhow::Result<u64> {
    let (new, dir) = (data_dir.join(format!("{LOG_DIR}.new")), data_dir.join(LOG_DIR));
    for half in [&new, &dir] {
        if half.exists() {
            tracing::warn!(path = %half.display(), "removing half a move of the Raft log (a start interrupted)");
            std::fs::remove_dir_all(half).with_context(|| format!("removing {}", half.display()))?;
        }
    }
    let moved = copy(db, &new).with_context(|| format!("copying the Raft log into {}", new.display()))?;
    std::fs::rename(&new, &dir).with_context(|| format!("renaming {} to {}", new.display(), dir.display()))?;
    crate::durable::sync_dir(data_dir).with_context(|| format!("syncing {}", data_dir.display()))?;

    let txn = db.begin_write().map_err(write_err)?;
    txn.delete_table(LOGS).map_err(write_err)?;
    {
        let mut meta = txn.open_table(META).map_err(write_err)?;
        for gone in [VOTE, LAST_PURGED] {
            meta.remove(gone).map_err(write_err)?;
        }
    }
    put_meta(&txn, "format", &format)?;
    txn.commit().map_err(write_err)?;
    Ok(moved)
}

/// Write the old log into a new WAL in `to`, synced, and close it.
fn copy(db: &Database, to: &Path) -> anyhow::Result<u64> {
    crate::durable::create_dir_all(to)?;
    let mut wal = open_wal(to)?;
    if let Some(purged) = read_meta::<LogId>(db, LAST_PURGED)? {
        wal.purge(key(&purged))?;
    }
    if let Some(vote) = read_meta::<Vote>(db, VOTE)? {
        wal.save_vote(StoredVote(vote))?;
    }
    let txn = db.begin_read()?;
    let mut moved = 0;
    match txn.open_table(LOGS) {
        Ok(logs) => {
            let mut batch = Vec::with_capacity(COPY_BATCH);
            for row in logs.iter()? {
                let (index, bytes) = row?;
                let entry: Entry = serde_json::from_slice(bytes.value())
                    .with_context(|| format!("reading entry {} of the old log", index.value()))?;
                batch.push((key(&entry.log_id), bytes.value().to_vec()));
                if batch.len() == COPY_BATCH {
                    moved += batch.len() as u64;
                    wal.append(std::mem::take(&mut batch))?;
                    wal.flush(false, None)?;
                }
            }
            moved += batch.len() as u64;
            wal.append(batch)?;
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(e.into()),
    }
    wal.flush(true, None)?;
    // Returns once the worker wrote and synced all of it (or with its error).
    wal.wait_worker_idle()?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::meta::write_meta;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64) -> Entry {
        Entry { log_id: LogId::new(CommittedLeaderId::new(term, 1), index), payload: EntryPayload::Blank }
    }

    /// A data directory of format 4: entries 6–9 after a purge at 5, a vote.
    fn old_dir(dir: &Path) -> Database {
        let db = Database::create(dir.join("raft.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut logs = txn.open_table(LOGS).unwrap();
            for i in 6..10 {
                logs.insert(i, serde_json::to_vec(&entry(2, i)).unwrap().as_slice()).unwrap();
            }
        }
        put_meta(&txn, LAST_PURGED, &LogId::new(CommittedLeaderId::new(1, 1), 5)).unwrap();
        put_meta(&txn, VOTE, &Vote::new_committed(2, 1)).unwrap();
        put_meta(&txn, "format", &4u32).unwrap();
        txn.commit().unwrap();
        db
    }

    fn wal_state(dir: &Path) -> (Option<Key>, Option<Key>, Option<Vote>, Vec<u64>) {
        let wal = open_wal(dir).unwrap();
        let s = wal.log_state();
        let indexes = wal.read(0, u64::MAX).map(|r| r.unwrap().0 .1).collect();
        (s.purged().copied(), s.last().copied(), s.vote().map(|v| v.0), indexes)
    }

    #[test]
    fn the_log_the_vote_and_the_purge_point_move_and_the_old_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = old_dir(dir.path());
        assert_eq!(move_log(&db, dir.path(), 5).unwrap(), 4);
        let (purged, last, vote, indexes) = wal_state(&dir.path().join(LOG_DIR));
        assert_eq!((purged, last, vote), (Some(((1, 1), 5)), Some(((2, 1), 9)), Some(Vote::new_committed(2, 1))));
        assert_eq!(indexes, vec![6, 7, 8, 9]);
        assert_eq!(read_meta::<u32>(&db, "format").unwrap(), Some(5));
        assert_eq!(read_meta::<Vote>(&db, VOTE).unwrap(), None, "no second vote left behind");
        let txn = db.begin_read().unwrap();
        assert!(matches!(txn.open_table(LOGS), Err(redb::TableError::TableDoesNotExist(_))));
        assert!(!dir.path().join("log.new").exists());
    }

    #[test]
    fn a_move_interrupted_at_any_step_is_made_again_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let db = old_dir(dir.path());
        // Step 1 cut short: a WAL in `log.new/` with a stray entry.
        let mut stray = open_wal(&{
            let p = dir.path().join("log.new");
            std::fs::create_dir(&p).unwrap();
            p
        })
        .unwrap();
        stray.append([(((7, 1), 1), b"{}".to_vec())]).unwrap();
        drop(stray);
        // Step 2 done, step 3 not: `log/` beside format 4 (an empty WAL here).
        drop(open_wal(&{
            let p = dir.path().join(LOG_DIR);
            std::fs::create_dir(&p).unwrap();
            p
        }));
        assert_eq!(move_log(&db, dir.path(), 5).unwrap(), 4);
        let (purged, last, _, indexes) = wal_state(&dir.path().join(LOG_DIR));
        assert_eq!((purged, last, indexes), (Some(((1, 1), 5)), Some(((2, 1), 9)), vec![6, 7, 8, 9]));
    }

    #[test]
    fn a_directory_without_a_log_moves_an_empty_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("raft.redb")).unwrap();
        write_meta(&db, "node_id", &1u64).unwrap();
        assert_eq!(move_log(&db, dir.path(), 5).unwrap(), 0);
        assert_eq!(wal_state(&dir.path().join(LOG_DIR)), (None, None, None, vec![]));
    }
}
