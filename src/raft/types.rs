//! The openraft type configuration for fencegate.

use crate::lock::state::{Command, Outcome};

openraft::declare_raft_types!(
    /// A Raft entry carries a batch of lock commands (`server::proposer` packs
    /// concurrent proposals into one entry, so one fsync serves them all);
    /// applying it yields one outcome per command.
    /// Nodes carry no address: peers are resolved from each node's own config
    /// (`peers`), so membership stays identical on every node.
    pub TypeConfig:
        D = Vec<Command>,
        R = Vec<Outcome>,
        NodeId = u64,
        Node = openraft::EmptyNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::EmptyNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::EmptyNode>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
