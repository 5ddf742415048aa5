//! Per-key floors: the highest token this sidecar has forwarded for each key,
//! kept in redb under `state_dir` so that a restarted sidecar still refuses
//! what it refused before (S2), even while the lock service is down.
//!
//! A new, higher floor is fsync'd before the first request carrying it is
//! forwarded. Concurrent raises share one write transaction (`crate::batch`).
//!
//! redb refuses every write after an I/O error (a full disk) until the
//! database is reopened: the store then drops it and opens the file again
//! for the next write, so it recovers by itself once the cause is gone.
//! Meanwhile it says it is broken (`/healthz`, `/readyz`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use thiserror::Error;

use crate::batch::Batcher;
use crate::lock::state::Token;

const FLOORS: TableDefinition<&str, u64> = TableDefinition::new("floors");

#[derive(Debug, Clone, Error)]
#[error("floor store: {0}")]
pub struct FloorError(String);

fn err(e: impl std::fmt::Display) -> FloorError {
    FloorError(e.to_string())
}

pub struct Floors {
    /// What is durable (or being made durable right now).
    known: Arc<Mutex<HashMap<String, Token>>>,
    writes: Batcher<(String, Token), Result<(), FloorError>>,
    /// Set by a failed write, cleared by the next one that succeeds.
    broken: Arc<AtomicBool>,
    /// A raise of the last failed write, for `probe` to try again.
    failed: Arc<Mutex<Option<(String, Token)>>>,
}

/// The database, or `None` after an I/O error until it is reopened.
struct Store {
    path: PathBuf,
    db: Mutex<Option<Database>>,
}

impl Store {
    /// One transaction on the open database, reopening it first if an
    /// earlier error closed it; an error closes it again.
    fn write(&self, raises: &[(String, Token)]) -> Result<(), FloorError> {
        let mut db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        if db.is_none() {
            *db = Some(Database::create(&self.path).map_err(|e| err(format!("reopening: {e}")))?);
        }
        let result = write(db.as_ref().expect("opened above"), raises);
        if result.is_err() {
            *db = None;
        }
        result
    }
}

impl Floors {
    /// Open `dir/floors.redb` and load every floor.
    pub fn open(dir: &Path) -> Result<Self, FloorError> {
        std::fs::create_dir_all(dir).map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join("floors.redb");
        let db = Database::create(&path).map_err(err)?;
        let mut known = HashMap::new();
        let txn = db.begin_read().map_err(err)?;
        match txn.open_table(FLOORS) {
            Ok(table) => {
                for row in table.iter().map_err(err)? {
                    let (k, v) = row.map_err(err)?;
                    known.insert(k.value().to_string(), v.value());
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(err(e)),
        }
        drop(txn);
        let store = Arc::new(Store { path, db: Mutex::new(Some(db)) });
        let broken = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let (flag, last) = (broken.clone(), failed.clone());
        let writes = Batcher::start(4096, move |raises: Vec<(String, Token)>| {
            let (store, flag, last) = (store.clone(), flag.clone(), last.clone());
            async move {
                let n = raises.len();
                let first = raises.first().cloned();
                let result =
                    tokio::task::spawn_blocking(move || store.write(&raises)).await.unwrap_or_else(|e| Err(err(e)));
                flag.store(result.is_err(), Ordering::Relaxed);
                *last.lock().unwrap_or_else(|p| p.into_inner()) = if result.is_err() { first } else { None };
                vec![result; n]
            }
        });
        Ok(Self { known: Arc::new(Mutex::new(known)), writes, broken, failed })
    }

    /// Whether the last write failed (new floors cannot be made durable, so
    /// writes that need one get 500 until a write succeeds again).
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Whether the store works again: the last failed write's first raise
    /// is tried again (an empty commit would pass on a full disk while real
    /// ones fail). So a broken store finds out without waiting for a client
    /// write, which a readiness check that took it out of service would
    /// never let through. Raising a floor for a request that got 500 is
    /// conservative: it only refuses tokens below one a client presented.
    pub async fn probe(&self) -> bool {
        let retry = self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match retry {
            None => !self.is_broken(),
            Some((key, token)) => self.raise(&key, token).await.is_ok(),
        }
    }

    pub fn get(&self, key: &str) -> Token {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Make `token` the durable floor of `key` if it is higher; returns once
    /// it is on disk.
    pub async fn raise(&self, key: &str, token: Token) -> Result<(), FloorError> {
        if self.get(key) >= token {
            return Ok(());
        }
        self.writes.call((key.to_string(), token)).await.unwrap_or_else(|| Err(err("floor writer stopped")))?;
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let floor = known.entry(key.to_string()).or_default();
        *floor = (*floor).max(token);
        Ok(())
    }
}

/// One durable transaction for a batch of raises; never lowers a floor.
fn write(db: &Database, raises: &[(String, Token)]) -> Result<(), FloorError> {
    let txn = db.begin_write().map_err(err)?;
    {
        let mut table = txn.open_table(FLOORS).map_err(err)?;
        for (key, token) in raises {
            let current = table.get(key.as_str()).map_err(err)?.map(|v| v.value()).unwrap_or(0);
            if *token > current {
                table.insert(key.as_str(), token).map_err(err)?;
            }
        }
    }
    txn.commit().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn floors_survive_a_restart_and_never_go_down() {
        let dir = tempfile::tempdir().unwrap();
        {
            let f = Floors::open(dir.path()).unwrap();
            f.raise("rack/42", 34).await.unwrap();
            f.raise("rack/42", 33).await.unwrap();
            f.raise("rack/7", 5).await.unwrap();
            assert_eq!(f.get("rack/42"), 34);
        }
        // The writer task closes the database once the store is dropped.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let f = Floors::open(dir.path()).unwrap();
        assert_eq!((f.get("rack/42"), f.get("rack/7"), f.get("other")), (34, 5, 0));
    }
}
