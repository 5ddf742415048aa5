//! Server side of the peer network (`raft::network`): decode, check
//! (`raft::guard`, and with TLS that the connection's certificate is the
//! member the RPC claims to come from), hand to openraft, encode its
//! `Result` as JSON.

use hyper::{Response, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::Node;
use crate::http::{json, Body, Conn};
use crate::raft::guard::{self, Peers};
use crate::raft::identity::AdoptError;
use crate::raft::network::PROTOCOL_HEADER;
use crate::raft::types::{NodeId, TypeConfig, Vote};
use crate::raft::upgrade::PROTOCOL;

/// A decoded peer RPC, not yet checked.
#[derive(Debug)]
pub enum PeerRpc {
    Append(openraft::raft::AppendEntriesRequest<TypeConfig>),
    Vote(openraft::raft::VoteRequest<NodeId>),
    Snapshot(openraft::raft::InstallSnapshotRequest<TypeConfig>),
    /// The leader asks this node to campaign (`members::handover`).
    Campaign {
        leader: NodeId,
    },
}

impl PeerRpc {
    /// The vote a Raft RPC carries (its sender and term).
    pub fn vote(&self) -> Option<&Vote> {
        match self {
            PeerRpc::Append(r) => Some(&r.vote),
            PeerRpc::Vote(r) => Some(&r.vote),
            PeerRpc::Snapshot(r) => Some(&r.vote),
            PeerRpc::Campaign { .. } => None,
        }
    }

    /// `raft::guard`'s checks, before openraft sees it.
    pub fn check(&self, peers: &Peers) -> Result<(), String> {
        match self {
            PeerRpc::Append(r) => guard::append_request(r, peers),
            PeerRpc::Vote(r) => guard::vote_request(r, peers),
            PeerRpc::Snapshot(r) => guard::snapshot_request(r, peers),
            PeerRpc::Campaign { .. } => Ok(()),
        }
    }
}

/// The body of `POST /raft/{rpc}`; `NotFound` for an `rpc` that is none.
pub fn decode(rpc: &str, body: &[u8]) -> Result<PeerRpc, ApiError> {
    match rpc {
        "append" => Ok(PeerRpc::Append(json_of(body)?)),
        "vote" => Ok(PeerRpc::Vote(json_of(body)?)),
        "snapshot" => Ok(PeerRpc::Snapshot(json_of(body)?)),
        "campaign" => {
            #[derive(serde::Deserialize)]
            struct Ask {
                leader: NodeId,
            }
            let ask: Ask =
                serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("bad campaign request: {e}")))?;
            Ok(PeerRpc::Campaign { leader: ask.leader })
        }
        _ => Err(ApiError::NotFound),
    }
}

/// `member`: the member the sender proved to be (its certificate, or its
/// proof of the peer secret), if the peer plane authenticates; `cluster`:
/// the cluster id the sender says it belongs to.
pub(super) async fn handle(
    node: &Node,
    rpc: &str,
    body: &[u8],
    member: Option<u64>,
    cluster: Option<&str>,
    conn: &Conn,
) -> Result<Response<Body>, ApiError> {
    let raft = &node.raft;
    let rpc_name = rpc;
    let rpc = decode(rpc, body)?;
    // The sender an RPC claims (the vote's leader or candidate) must be the
    // member its certificate names: node 2 cannot speak as node 3.
    if let Some(sender) = rpc.vote().map(|v| v.leader_id.node_id) {
        if member.is_some_and(|m| m != sender) {
            crate::audit::peer_refused(
                conn.addr,
                &format!("a {rpc_name} claiming member {sender}, which its sender did not prove to be"),
            );
            return Err(ApiError::Forbidden(format!("the sender did not prove to be member {sender}")));
        }
    }
    let members = |id| node.knows(id);
    let peers = Peers { me: node.id, members: &members };
    rpc.check(&peers).map_err(|e| {
        tracing::warn!(rpc = rpc_name, "refused raft rpc: {e}");
        ApiError::BadRequest(format!("refused raft rpc: {e}"))
    })?;
    // Two histories never share a log: a sender of another cluster is
    // refused before openraft sees anything (a node of this one without an
    // id yet takes the sender's, durably, first).
    node.identity.adopt(cluster).map_err(|e| match e {
        AdoptError::Storage(e) => ApiError::Internal(e),
        e => {
            let sender = rpc.vote().map_or("?".into(), |v| v.leader_id.node_id.to_string());
            tracing::error!(rpc = rpc_name, "refused a raft rpc from node {sender}: {e}");
            ApiError::ForeignCluster(format!("refused a {rpc_name} from node {sender}: {e}"))
        }
    })?;
    let mut answer = match rpc {
        PeerRpc::Append(req) => json(StatusCode::OK, &raft.append_entries(req).await),
        PeerRpc::Vote(req) => json(StatusCode::OK, &raft.vote(req).await),
        PeerRpc::Snapshot(req) => json(StatusCode::OK, &raft.install_snapshot(req).await),
        PeerRpc::Campaign { leader } => {
            super::members::campaign(node, leader, member).await?;
            json(StatusCode::OK, &serde_json::json!({ "campaigning": true }))
        }
    };
    // What this build speaks: the leader moves the table to newer rules
    // only once every member has said so (`raft::upgrade`).
    answer.headers_mut().insert(PROTOCOL_HEADER, PROTOCOL.into());
    Ok(answer)
}

fn json_of<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("bad raft rpc: {e}")))
}
