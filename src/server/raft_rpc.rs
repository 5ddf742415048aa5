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

/// `member`: with TLS, the member the connection's certificate names.
pub async fn handle(
    node: &Node,
    rpc: &str,
    body: &[u8],
    member: Option<u64>,
    conn: &Conn,
) -> Result<Response<Body>, ApiError> {
    let raft = &node.raft;
    // The sender an RPC claims (the vote's leader or candidate) must be the
    // member its certificate names: node 2 cannot speak as node 3.
    let certified = |vote: &openraft::Vote<crate::raft::types::NodeId>| {
        let sender = vote.leader_id.node_id;
        if member.is_none_or(|m| m == sender) {
            return Ok(());
        }
        crate::audit::peer_refused(
            conn.addr,
            &format!("a {rpc} claiming member {sender}, whose certificate it is not"),
        );
        Err(ApiError::Forbidden(format!("the client certificate does not name member {sender}")))
    };
    let members = |id| node.knows(id);
    let peers = Peers { me: node.id, members: &members };
    let refuse = |e: String| {
        tracing::warn!(rpc, "refused raft rpc: {e}");
        ApiError::BadRequest(format!("refused raft rpc: {e}"))
    };
    match rpc {
        "append" => {
            let req: openraft::raft::AppendEntriesRequest<_> = decode(body)?;
            certified(&req.vote)?;
            guard::append_request(&req, &peers).map_err(refuse)?;
            Ok(json(StatusCode::OK, &raft.append_entries(req).await))
        }
        "vote" => {
            let req: openraft::raft::VoteRequest<_> = decode(body)?;
            certified(&req.vote)?;
            guard::vote_request(&req, &peers).map_err(refuse)?;
            Ok(json(StatusCode::OK, &raft.vote(req).await))
        }
        "snapshot" => {
            let req: openraft::raft::InstallSnapshotRequest<_> = decode(body)?;
            certified(&req.vote)?;
            guard::snapshot_request(&req, &peers).map_err(refuse)?;
            Ok(json(StatusCode::OK, &raft.install_snapshot(req).await))
        }
        "campaign" => {
            super::members::campaign(node, body, member).await?;
            Ok(json(StatusCode::OK, &serde_json::json!({ "campaigning": true })))
        }
        _ => Err(ApiError::NotFound),
    }
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("bad raft rpc: {e}")))
}
