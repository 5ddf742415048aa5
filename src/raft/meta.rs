//! The data directory's metadata: small values in `raft.redb`'s `meta`
//! table (the data format, the node id, the cluster id; in formats 1–4 the
//! log and the vote too, which `raft::log_upgrade` moves out). Written
//! rarely, each value in its own durable transaction.

use openraft::StorageIOError;
use redb::{Database, ReadableDatabase, TableDefinition, WriteTransaction};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::types::StorageError;

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

pub(crate) fn write_err(e: impl Into<redb::Error>) -> StorageError {
    StorageError::IO { source: StorageIOError::write(&e.into()) }
}

pub(crate) fn read_err(e: impl Into<redb::Error>) -> StorageError {
    StorageError::IO { source: StorageIOError::read(&e.into()) }
}

fn decode_err(e: serde_json::Error) -> StorageError {
    StorageError::IO { source: StorageIOError::read(&e) }
}

pub(crate) fn read_meta<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, StorageError> {
    let txn = db.begin_read().map_err(read_err)?;
    let table = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let Some(v) = table.get(key).map_err(read_err)? else { return Ok(None) };
    serde_json::from_slice(v.value()).map(Some).map_err(decode_err)
}

pub(crate) fn put_meta<T: Serialize>(txn: &WriteTransaction, key: &str, value: &T) -> Result<(), StorageError> {
    let bytes = serde_json::to_vec(value).map_err(|e| StorageError::IO { source: StorageIOError::write(&e) })?;
    txn.open_table(META).map_err(write_err)?.insert(key, bytes.as_slice()).map_err(write_err)?;
    Ok(())
}

/// One durable write transaction with a single metadata value.
pub(crate) fn write_meta<T: Serialize>(db: &Database, key: &str, value: &T) -> Result<(), StorageError> {
    let txn = db.begin_write().map_err(write_err)?;
    put_meta(&txn, key, value)?;
    // Durability::Immediate is redb's default: commit returns after fsync.
    txn.commit().map_err(write_err)
}
