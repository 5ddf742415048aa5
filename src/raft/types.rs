//! The openraft type configuration for fencegate.
//!
//! An entry is a batch of commands (`D = Vec<Command>`, one `Outcome` each).
//! A member ([`Member`]) carries the URLs it was added with; entries written
//! before it did read as openraft's `{}` (`EmptyNode`), and each node's own
//! `peers` config then says where the member is.

use crate::lock::state::{Command, Outcome};

openraft::declare_raft_types!(
    /// A Raft entry carries a batch of lock commands (`server::proposer` packs
    /// concurrent proposals into one entry, so one fsync serves them all);
    /// applying it yields one outcome per command.
    /// A member carries the URLs it was added with (`member add`), so a node
    /// added at a new address is reached without editing anyone's config;
    /// the founding members carry their `peers` URLs from the bootstrap.
    pub TypeConfig:
        D = Vec<Command>,
        R = Vec<Outcome>,
        NodeId = u64,
        Node = Member,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

pub type NodeId = u64;
pub(crate) type Raft = openraft::Raft<TypeConfig>;
pub(crate) type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub(crate) type Vote = openraft::Vote<NodeId>;
pub(crate) type StorageError = openraft::StorageError<NodeId>;
pub(crate) type StoredMembership = openraft::StoredMembership<NodeId, Member>;
pub(crate) type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
pub(crate) type Membership = openraft::Membership<NodeId, Member>;

/// Where a member is reached. Both empty in entries written before members
/// carried URLs (they read as `{}`, as openraft's `EmptyNode` wrote them):
/// then each node's own config says.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Its peer plane (`peer_listen`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub peer_url: String,
    /// Its Lock API (`listen`), as clients are told it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_url: String,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.peer_url)
    }
}
pub(crate) type Snapshot = openraft::Snapshot<TypeConfig>;
