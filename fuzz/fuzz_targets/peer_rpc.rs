//! What a node decodes on its peer plane: the bodies of `POST /raft/{rpc}`
//! (`inputs::peer_rpc`: append, vote, snapshot, campaign) and `raft::guard`'s
//! checks on them (`PeerRpc::check`, as node 1 of members 1 to 3); the
//! answers a node decodes from its peers (`raft::network`); and a snapshot's
//! data, the JSON of the lock table a follower installs.
//!
//! Input: a line naming what (`append`, `vote`, `snapshot`, `campaign`,
//! `append-answer`, `vote-answer`, `snapshot-answer`, `snapshot-data`), then
//! the body.
//!
//! Beyond not panicking: the commands of an append the guard lets through
//! are applied to a lock table (as every replica's state machine will),
//! which must not panic either, and whose revision never goes back.
#![no_main]

use fencegate::fuzzing::{
    inputs::{peer_rpc, ApiError, PeerRpc},
    LockState, NodeId, Peers,
};
use libfuzzer_sys::fuzz_target;
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{AppendEntriesResponse, InstallSnapshotResponse, VoteResponse};
use openraft::EntryPayload;

fuzz_target!(|data: &[u8]| {
    let (what, body) = match data.iter().position(|&b| b == b'\n') {
        Some(n) => (&data[..n], &data[n + 1..]),
        None => return,
    };
    match what {
        b"append-answer" => {
            let _ = serde_json::from_slice::<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>>(body);
        }
        b"vote-answer" => {
            let _ = serde_json::from_slice::<Result<VoteResponse<NodeId>, RaftError<NodeId>>>(body);
        }
        b"snapshot-answer" => {
            let _ = serde_json::from_slice::<
                Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
            >(body);
        }
        b"snapshot-data" => {
            if let Ok(table) = serde_json::from_slice::<LockState>(body) {
                let _ = (table.revision(), table.compacted_below(), table.key_count());
            }
        }
        rpc => {
            let Ok(rpc) = std::str::from_utf8(rpc) else { return };
            let rpc = match peer_rpc(rpc, body) {
                Ok(rpc) => rpc,
                Err(ApiError::NotFound | ApiError::BadRequest(_)) => return,
                Err(e) => panic!("a peer RPC refused as {e:?}"),
            };
            let _ = rpc.vote();
            let members = |id: NodeId| (1..=3).contains(&id);
            if rpc.check(&Peers { me: 1, members: &members }).is_err() {
                return;
            }
            if let PeerRpc::Append(req) = rpc {
                let mut table = LockState::default();
                for entry in &req.entries {
                    if let EntryPayload::Normal(commands) = &entry.payload {
                        for command in commands {
                            let before = table.revision();
                            let _ = table.apply(command);
                            assert!(table.revision() >= before);
                        }
                    }
                }
            }
        }
    }
});
