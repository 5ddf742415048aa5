//! The sidecar's durable state under `state_dir`: the per-key floors (S2)
//! in redb (`floors.redb`) and the idempotency records (I1) in an
//! append-only journal (`idempotency.log`, `journal.rs`). One thread writes
//! both (`writer.rs`): the writes queued while the previous batch was
//! written go out together (one append and `fdatasync` for the records, one
//! redb commit for the floors), in the order they were queued, and each
//! call's wait ends once its write is on disk.
//!
//! redb refuses every write after an I/O error (a full disk) until the
//! database is reopened: the store then drops it and opens the file again
//! for the next write, and the journal is reopened at the end of what is
//! valid, so both recover by themselves once the cause is gone. Meanwhile
//! the store says it is broken (`/healthz`, `/readyz`).
//!
//! State format 5. A state directory of format 4 has its records' scopes
//! taken as their holders' at open (`idempotency::upgrade_scope`) and the
//! journal written anew. `probe` retries what failed (a floor raise, or a
//! probe row and journal entry) to tell when the store works again.

pub(crate) mod floors;
pub(crate) mod journal;
pub(crate) mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use thiserror::Error;

use crate::lock::state::Token;
use crate::sidecar::idempotency::Record;
use crate::sidecar::state::journal::{Change, Journal};
pub(crate) use crate::sidecar::state::writer::When;
use crate::sidecar::state::writer::Writer;

/// How long a write nobody waits for (`When::Soon`: a keyed request's
/// answer) may stay off the disk, waiting for one that somebody does. A
/// crash within it costs a replay, not I1: the record is then unknown.
const SOON: std::time::Duration = std::time::Duration::from_millis(5);

const FLOORS: TableDefinition<&str, u64> = TableDefinition::new("floors");
/// Where records were kept before the journal: moved into it at start.
const OLD_RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("idempotency");
/// One row a health probe rewrites, to find out whether writes work again.
const PROBE: TableDefinition<&str, u64> = TableDefinition::new("probe");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The state directory's format (floors in `floors.redb`, the journal's
/// entries): what this build writes and the newest it reads. A directory
/// from before formats were numbered is format 1. Format 2 stores an
/// answer's header values as strings where they are UTF-8, which a
/// format-1 build would read as unreadable records (unknown outcomes); it
/// reads format 1's arrays. Format 3 writes records as binary fields
/// instead of JSON (`record_bytes.rs`), which older builds would read as
/// unreadable records too; it reads both JSON formats. Format 4's journal
/// has a header and salted batch entries (`journal.rs`), which a format-3
/// build would take for a torn tail and cut away; it reads the journals of
/// formats 1 to 3 and writes them anew. Format 5 keys a record by its
/// holder (`idempotency::scope`: lock key, token, key, client identity),
/// where format 4 keyed it by lock key and key alone, so that a format-4
/// build would find no record for a retry; it takes the older scopes
/// under their records' tokens and writes the journal anew
/// (`upgrade_scopes`).
pub(crate) const STATE_FORMAT: u64 = 5;

#[derive(Debug, Clone, Error)]
#[error("state store: {0}")]
pub struct StoreError(String);

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// One durable change.
#[derive(Debug, Clone)]
pub enum Write {
    /// Raise a key's floor (never lowers one).
    Floor(String, Token),
    /// Put an idempotency record (its scope, its encoding).
    Record(String, Vec<u8>),
    /// Drop idempotency records.
    Forget(Vec<String>),
    /// Write the records' journal anew from these (every live record, as of
    /// when this was queued).
    Rewrite(Arc<Vec<(String, Arc<Record>)>>),
    /// Rewrite the probe row (`probe`).
    Probe,
}

/// What the file held when it was opened.
#[derive(Debug, Default)]
pub struct Loaded {
    pub floors: HashMap<String, Token>,
    pub records: Vec<(String, Vec<u8>)>,
}

pub struct Store {
    writes: Writer<Write, Result<(), StoreError>>,
    /// The journal's length, for `Records` to decide when to rewrite it.
    journal_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Set by a failed write, cleared by the next one that succeeds.
    broken: Arc<AtomicBool>,
    /// What `probe` tries after a failed batch: its first floor raise, else
    /// the probe row.
    failed: Arc<Mutex<Option<Write>>>,
}

/// What the writer thread owns: the database, or `None` after an I/O error
/// until it is reopened; the journal, and whether an error left it to be
/// reopened.
struct File {
    path: PathBuf,
    db: Option<Database>,
    journal: Journal,
    journal_broken: bool,
    journal_bytes: Arc<std::sync::atomic::AtomicU64>,
}

impl File {
    /// One batch: the records' changes to the journal, in order (a rewrite
    /// supersedes the changes queued before it), then one transaction on the
    /// database for the floors, reopening either first if an earlier error
    /// closed it.
    fn write(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.journal(writes)?;
        if !writes.iter().any(|w| matches!(w, Write::Floor(..) | Write::Probe)) {
            return Ok(());
        }
        if self.db.is_none() {
            self.db = Some(Database::create(&self.path).map_err(|e| err(format!("reopening: {e}")))?);
        }
        let result = commit(self.db.as_ref().expect("opened above"), writes);
        if result.is_err() {
            self.db = None;
        }
        result
    }

    fn journal(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let journal = &mut self.journal;
        if self.journal_broken {
            journal.reopen().map_err(|e| err(format!("reopening the journal: {e}")))?;
            self.journal_broken = false;
        }
        let mut changes = Vec::new();
        let mut result = Ok(());
        for w in writes {
            match w {
                Write::Record(scope, bytes) => changes.push(Change::Put(scope, bytes)),
                Write::Forget(scopes) => changes.extend(scopes.iter().map(|s| Change::Forget(s))),
                Write::Rewrite(live) => {
                    changes.clear();
                    result = journal.rewrite(live.iter().map(|(scope, r)| (scope.as_str(), r.encode())));
                    if result.is_err() {
                        break;
                    }
                }
                // The probe finds out whether the journal takes writes too
                // (an entry that forgets nothing).
                Write::Probe => changes.push(Change::Forget("")),
                Write::Floor(..) => {}
            }
        }
        let result = result.and_then(|()| journal.append(&changes));
        self.journal_bytes.store(journal.bytes, Ordering::Relaxed);
        if result.is_err() {
            self.journal_broken = true;
        }
        result.map_err(|e| err(format!("journal: {e}")))
    }
}

impl Store {
    /// Open (or create) `dir/floors.redb` and `dir/idempotency.log`, and
    /// load everything in them.
    pub fn open(dir: &Path) -> Result<(Store, Loaded), StoreError> {
        // Synced into its parent: the journal's open syncs the entries in it.
        crate::durable::create_dir_all(dir).map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
        crate::private::tighten(dir).map_err(|e| err(format!("tightening {}: {e}", dir.display())))?;
        let path = dir.join("floors.redb");
        let db = Database::create(&path).map_err(err)?;
        check_format(&db, dir)?;
        let mut loaded = load(&db)?;
        let (mut journal, records) = Journal::open(dir).map_err(|e| err(format!("the idempotency journal: {e}")))?;
        loaded.records = records;
        migrate(&db, &mut journal, &mut loaded.records)?;
        upgrade_scopes(&mut journal, &mut loaded.records)?;
        let journal_bytes = Arc::new(std::sync::atomic::AtomicU64::new(journal.bytes));
        let mut file =
            File { path, db: Some(db), journal, journal_broken: false, journal_bytes: journal_bytes.clone() };
        let broken = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let (flag, last) = (broken.clone(), failed.clone());
        let writes = Writer::start("fencegate-store", SOON, move |batch: Vec<Write>| {
            let n = batch.len();
            // A raise is safe to redo; a record put or forget is not (a
            // newer one for the same key may have been queued since).
            let retry = batch.iter().find(|w| matches!(w, Write::Floor(..))).cloned().unwrap_or(Write::Probe);
            let result = file.write(&batch);
            if let Err(e) = &result {
                // Said here once per batch: some of its writes nobody waits
                // for (a keyed request's answer: its pending record stays,
                // an unknown outcome after a restart).
                tracing::error!(writes = n, "a batch of the state store was not written: {e}");
            }
            flag.store(result.is_err(), Ordering::Relaxed);
            *last.lock().unwrap_or_else(|p| p.into_inner()) = if result.is_err() { Some(retry) } else { None };
            vec![result; n]
        })
        .map_err(|e| err(format!("starting the writer thread: {e}")))?;
        Ok((Store { writes, journal_bytes, broken, failed }, loaded))
    }

    /// Make `write` durable; returns once it is on disk.
    pub async fn write(&self, write: Write) -> Result<(), StoreError> {
        self.queue(write, When::Now).await
    }

    /// Queue `write` now, behind everything queued before it (writes reach
    /// the disk in that order), and return the wait for it to be on disk.
    /// It is written whether or not anyone waits.
    pub fn queue(&self, write: Write, when: When) -> impl std::future::Future<Output = Result<(), StoreError>> {
        let pending = self.writes.queue(write, when);
        async move { pending.await.unwrap_or_else(|| Err(err("writer stopped"))) }
    }

    /// The records' journal's length in bytes.
    pub fn journal_bytes(&self) -> u64 {
        self.journal_bytes.load(Ordering::Relaxed)
    }

    /// Whether the last write failed (writes that need the store get 500
    /// until a write succeeds again).
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Whether the store works again: the last failed batch's first floor
    /// raise is tried again, or the probe row rewritten (an empty commit
    /// would pass on a full disk while real ones fail). So a broken store
    /// finds out without waiting for a client write, which a readiness check
    /// that took it out of service would never let through. Redoing a raise
    /// is safe: it only refuses tokens below one a client presented.
    pub async fn probe(&self) -> bool {
        let retry = self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match retry {
            None => !self.is_broken(),
            Some(w) => self.write(w).await.is_ok(),
        }
    }
}

/// Records of a build that kept them in redb: appended to a journal that has
/// none yet and made durable, then the table goes (a crash in between
/// leaves both; the journal is then not empty, and the table just goes).
fn migrate(db: &Database, journal: &mut Journal, records: &mut Vec<(String, Vec<u8>)>) -> Result<(), StoreError> {
    let old: Vec<(String, Vec<u8>)> = {
        let txn = db.begin_read().map_err(err)?;
        match txn.open_table(OLD_RECORDS) {
            Ok(table) => table
                .iter()
                .map_err(err)?
                .map(|row| row.map(|(k, v)| (k.value().to_string(), v.value().to_vec())).map_err(err))
                .collect::<Result<_, _>>()?,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(err(e)),
        }
    };
    if journal.is_empty() && !old.is_empty() {
        let changes: Vec<Change<'_>> = old.iter().map(|(s, b)| Change::Put(s, b)).collect();
        journal.append(&changes).map_err(|e| err(format!("moving records into the journal: {e}")))?;
        tracing::info!(records = old.len(), "idempotency records moved from floors.redb into the journal");
        records.extend(old);
    }
    let txn = db.begin_write().map_err(err)?;
    txn.delete_table(OLD_RECORDS).map_err(err)?;
    txn.commit().map_err(err)
}

/// Records under a scope of state formats 1 to 4 (`lock_key\nkey`) are
/// taken as their first request's holder's (the token the record keeps),
/// and the journal is written anew with the new scopes before anything
/// else is written: a forget under a new scope would not undo a put under
/// the old one. A crash before the rewrite leaves the old scopes, which
/// the next start reads as such (a scope says which format it is). A
/// record that cannot be read keeps its scope: whose it was is lost, and
/// no request matches it; it goes at its expiry, as any.
fn upgrade_scopes(journal: &mut Journal, records: &mut [(String, Vec<u8>)]) -> Result<(), StoreError> {
    let mut upgraded = 0;
    for (scope, bytes) in records.iter_mut() {
        let Ok(record) = Record::decode(bytes) else { continue };
        if let Some(new) = crate::sidecar::idempotency::upgrade_scope(scope, record.token) {
            *scope = new;
            upgraded += 1;
        }
    }
    if upgraded == 0 {
        return Ok(());
    }
    journal
        .rewrite(records.iter().map(|(s, b)| (s.as_str(), b.as_slice())))
        .map_err(|e| err(format!("writing the idempotency journal with its records' holders: {e}")))?;
    tracing::info!(records = upgraded, "idempotency records of an older build now keyed by their holders");
    Ok(())
}

/// Refuse a state directory a newer build wrote, instead of misreading it.
fn check_format(db: &Database, dir: &Path) -> Result<(), StoreError> {
    let found = {
        let txn = db.begin_read().map_err(err)?;
        match txn.open_table(META) {
            Ok(t) => t.get("format").map_err(err)?.map(|v| v.value()),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(err(e)),
        }
    };
    match found {
        Some(v) if v > STATE_FORMAT => Err(err(format!(
            "{} was written by a newer fencegate (state format {v}; this build reads formats up to {STATE_FORMAT})",
            dir.display()
        ))),
        Some(STATE_FORMAT) => Ok(()),
        // Unnumbered or older: this build's from now on, so that an older
        // build refuses it instead of misreading what this one writes.
        _ => {
            let txn = db.begin_write().map_err(err)?;
            txn.open_table(META).map_err(err)?.insert("format", STATE_FORMAT).map_err(err)?;
            txn.commit().map_err(err)
        }
    }
}

fn load(db: &Database) -> Result<Loaded, StoreError> {
    let mut loaded = Loaded::default();
    let txn = db.begin_read().map_err(err)?;
    match txn.open_table(FLOORS) {
        Ok(table) => {
            for row in table.iter().map_err(err)? {
                let (k, v) = row.map_err(err)?;
                loaded.floors.insert(k.value().to_string(), v.value());
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(err(e)),
    }
    Ok(loaded)
}

/// One durable transaction for a batch.
fn commit(db: &Database, writes: &[Write]) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(err)?;
    {
        let mut floors = txn.open_table(FLOORS).map_err(err)?;
        let mut probe = txn.open_table(PROBE).map_err(err)?;
        for w in writes {
            match w {
                Write::Floor(key, token) => {
                    let current = floors.get(key.as_str()).map_err(err)?.map(|v| v.value()).unwrap_or(0);
                    if *token > current {
                        floors.insert(key.as_str(), token).map_err(err)?;
                    }
                }
                Write::Record(..) | Write::Forget(..) | Write::Rewrite(..) => {} // the journal's
                Write::Probe => {
                    let n = probe.get("probe").map_err(err)?.map_or(0, |v| v.value());
                    probe.insert("probe", n.wrapping_add(1)).map_err(err)?;
                }
            }
        }
    }
    txn.commit().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_format(dir: &Path, format: u64) {
        let db = Database::create(dir.join("floors.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert("format", format).unwrap();
        txn.commit().unwrap();
    }

    fn format(dir: &Path) -> Option<u64> {
        let db = Database::create(dir.join("floors.redb")).unwrap();
        let txn = db.begin_read().unwrap();
        let v = txn.open_table(META).unwrap().get("format").unwrap().map(|v| v.value());
        v
    }

    #[tokio::test]
    async fn a_state_dir_of_a_newer_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        set_format(dir.path(), STATE_FORMAT + 1);
        let e = Store::open(dir.path()).err().expect("refused");
        assert!(e.to_string().contains("written by a newer fencegate"), "{e}");
    }

    /// A state directory a format-4 build wrote (`tests/fixtures/sidecar-state-format-4`):
    /// records keyed `lock_key\nkey`, A's answer (token 29, with a cookie)
    /// under `rack/1\ndrain-7`, an unknown outcome under `rack/2\nop-9`
    /// (token 4), and a record put and forgotten. Each is now its first
    /// request's holder's: A's retry is still replayed, B's request (token
    /// 33) with A's key is a new one; the journal is written anew with the
    /// new scopes (a forget under them would not undo a put under the old).
    #[tokio::test]
    async fn a_format_4_state_dir_has_its_records_keyed_by_their_holders() {
        use crate::sidecar::idempotency::{fingerprint, Record, State, Verdict};
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sidecar-state-format-4");
        let dir = tempfile::tempdir().unwrap();
        for f in ["floors.redb", "idempotency.log"] {
            std::fs::copy(fixture.join(f), dir.path().join(f)).unwrap();
        }
        assert_eq!(format(dir.path()), Some(4));
        let (store, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.floors.get("rack/1"), Some(&29));
        let mut scopes: Vec<&str> = loaded.records.iter().map(|(s, _)| s.as_str()).collect();
        scopes.sort();
        assert_eq!(scopes, ["rack/1\n29\ndrain-7", "rack/2\n4\nop-9"]);
        let records = crate::sidecar::idempotency::records::Records::load(Arc::new(store), loaded.records, 1 << 20, 0);
        let request = |token| Record {
            route: "rack-writes".into(),
            fingerprint: fingerprint("PUT", "/racks/1", None, b"{}"),
            token,
            created_ms: 1_700_000_000_001,
            expires_ms: u64::MAX,
            state: State::Pending,
            body: bytes::Bytes::new(),
            reserve: 0,
        };
        match records.begin("rack/1\n29\ndrain-7", request(29), u64::MAX).await.unwrap() {
            Verdict::Replay(r) => assert_eq!(&r.body[..], b"{\"by\":\"A\"}"),
            v => panic!("A's retry: {v:?}"),
        }
        assert_eq!(records.begin("rack/1\n33\ndrain-7", request(33), u64::MAX).await.unwrap(), Verdict::Forward);
        assert!(matches!(records.get("rack/2\n4\nop-9").map(|r| r.state), Some(State::Unknown { .. })));
        drop(records);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let (_, on_disk) = Journal::open(dir.path()).unwrap();
        let mut scopes: Vec<&str> = on_disk.iter().map(|(s, _)| s.as_str()).collect();
        scopes.sort();
        assert_eq!(scopes, ["rack/1\n29\ndrain-7", "rack/1\n33\ndrain-7", "rack/2\n4\nop-9"], "written anew");
        assert_eq!(format(dir.path()), Some(STATE_FORMAT));
    }

    #[tokio::test]
    async fn an_older_state_dir_is_opened_and_marked_this_builds() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        assert_eq!(format(dir.path()), Some(STATE_FORMAT), "a new directory");
        set_format(dir.path(), 1);
        drop(Store::open(dir.path()).unwrap());
        assert_eq!(format(dir.path()), Some(STATE_FORMAT), "format 1, marked at its first start");
    }
}
