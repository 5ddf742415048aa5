//! Which cluster's history a node holds: the cluster id.
//!
//! A cluster gets its id once, in its replicated table (a committed
//! `Command::Identify`, proposed by its first leader under rules 2; or a
//! restore, which always makes a new one: a restored cluster is another
//! history than the one backed up, however alike they start). Each node
//! keeps the id it holds in its data directory (`raft.redb`'s metadata), so
//! that it knows it before it has applied anything after a restart.
//!
//! Every peer RPC carries the sender's id (`CLUSTER_HEADER`) and every
//! answer the receiver's. A node refuses an RPC of another id, and a
//! sender takes an answer of another id as a failure: two histories never
//! meet in one log. A node without an id yet (an empty one just added, or
//! a data directory of a build before ids) takes the first one a member
//! shows it — every id on the wire is committed — and keeps it for good.
//! The Lock API's answers carry the id too, so that a sidecar can tell "the
//! same history, later" from "another history" (`sidecar::fencing::knowledge`).

use std::sync::{Arc, RwLock};

use hyper::header::HeaderValue;
use redb::Database;

use super::meta::{read_meta, write_meta};
use super::types::StorageError;

/// On every peer RPC and its answer, and on every Lock API answer: the
/// cluster id of the node that sent it (absent: a node without one yet, or
/// a build before ids).
pub(crate) use fencegate_client::wire::CLUSTER_HEADER;

/// The metadata key of the id in `raft.redb`.
const META_KEY: &str = "cluster_id";

/// A new cluster id: 128 bits from the OS-seeded CSPRNG, as 32 hex digits.
pub(crate) fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Whether `id` has the form of a cluster id (what `new_id` makes).
pub(crate) fn valid(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn header(id: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(id).ok()
}

/// Why two nodes may not share a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this node belongs to cluster {mine}, the other to cluster {theirs}: two histories never share a log")]
pub(crate) struct Foreign {
    pub mine: String,
    pub theirs: String,
}

/// The pure rule: two ids are compatible unless both are known and differ.
pub(crate) fn compatible(mine: Option<&str>, theirs: Option<&str>) -> Result<(), Foreign> {
    match (mine, theirs) {
        (Some(m), Some(t)) if m != t => Err(Foreign { mine: m.to_string(), theirs: t.to_string() }),
        _ => Ok(()),
    }
}

/// This node's cluster id, durable in its data directory once known.
pub(crate) struct Identity {
    db: Arc<Database>,
    /// As a header value too: every answer of the node carries it, and a
    /// `HeaderValue` is cloned without copying.
    id: RwLock<Option<(String, HeaderValue)>>,
}

impl Identity {
    /// The id `db` holds, if any.
    pub(crate) fn open(db: Arc<Database>) -> Result<Arc<Self>, StorageError> {
        let id = read_meta::<String>(&db, META_KEY)?.and_then(|id| header(&id).map(|h| (id, h)));
        Ok(Arc::new(Identity { db, id: RwLock::new(id) }))
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.id.read().unwrap_or_else(|p| p.into_inner()).as_ref().map(|(id, _)| id.clone())
    }

    /// The id as the value of `CLUSTER_HEADER`.
    pub(crate) fn header(&self) -> Option<HeaderValue> {
        self.id.read().unwrap_or_else(|p| p.into_inner()).as_ref().map(|(_, h)| h.clone())
    }

    /// Check `theirs` (a peer's, or this node's table's) against this
    /// node's id, taking it if this node has none: written to the data
    /// directory before this returns, so that nothing of that history is
    /// applied by a node that could forget which one it is.
    pub(crate) fn adopt(&self, theirs: Option<&str>) -> Result<(), AdoptError> {
        let Some(theirs) = theirs else { return Ok(()) };
        // The common case (the state machine asks at every apply): checked
        // under the read lock, nothing copied.
        if let Some((mine, _)) = &*self.id.read().unwrap_or_else(|p| p.into_inner()) {
            return compatible(Some(mine), Some(theirs)).map_err(AdoptError::Foreign);
        }
        let Some(value) = header(theirs).filter(|_| valid(theirs)) else {
            return Err(AdoptError::Invalid(theirs.to_string()));
        };
        let mut id = self.id.write().unwrap_or_else(|p| p.into_inner());
        match &*id {
            // Another caller took one meanwhile.
            Some((mine, _)) => compatible(Some(mine), Some(theirs)).map_err(AdoptError::Foreign),
            None => {
                write_meta(&self.db, META_KEY, &theirs).map_err(|e| AdoptError::Storage(e.to_string()))?;
                tracing::info!(cluster = theirs, "this node belongs to cluster {theirs}");
                *id = Some((theirs.to_string(), value));
                Ok(())
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AdoptError {
    #[error("{0}")]
    Foreign(Foreign),
    #[error("{0:?} is not a cluster id")]
    Invalid(String),
    #[error("storing the cluster id: {0}")]
    Storage(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(dir: &std::path::Path) -> Arc<Database> {
        Arc::new(Database::create(dir.join("raft.redb")).unwrap())
    }

    #[test]
    fn only_two_known_ids_that_differ_are_incompatible() {
        assert!(compatible(None, None).is_ok());
        assert!(compatible(Some("a"), None).is_ok(), "an older build sends none");
        assert!(compatible(None, Some("a")).is_ok(), "a node without one yet");
        assert!(compatible(Some("a"), Some("a")).is_ok());
        assert_eq!(compatible(Some("a"), Some("b")), Err(Foreign { mine: "a".into(), theirs: "b".into() }));
    }

    #[test]
    fn an_id_is_taken_once_durably_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (new_id(), new_id());
        assert!(valid(&a) && a != b);
        {
            let id = Identity::open(db(dir.path())).unwrap();
            assert_eq!(id.get(), None);
            id.adopt(None).unwrap();
            assert_eq!(id.adopt(Some("not-an-id")), Err(AdoptError::Invalid("not-an-id".into())));
            assert_eq!(id.get(), None, "a bad id is not taken");
            id.adopt(Some(&a)).unwrap();
            assert!(matches!(id.adopt(Some(&b)), Err(AdoptError::Foreign(_))));
            assert_eq!(id.get().as_deref(), Some(a.as_str()));
        }
        let reopened = Identity::open(db(dir.path())).unwrap();
        assert_eq!(reopened.get().as_deref(), Some(a.as_str()), "kept across a restart");
        assert!(matches!(reopened.adopt(Some(&b)), Err(AdoptError::Foreign(_))));
    }
}
