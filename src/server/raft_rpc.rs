//! Server side of the peer network (`raft::network`): decode, check
//! (`raft::guard`), hand to openraft, encode its `Result` as JSON.

use hyper::{Response, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::Node;
use crate::http::{json, Body};
use crate::raft::guard::{self, Peers};

pub async fn handle(node: &Node, rpc: &str, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let raft = &node.raft;
    let members = |id| node.peers.contains_key(&id);
    let peers = Peers { me: node.id, members: &members };
    let refuse = |e: String| {
        tracing::warn!(rpc, "refused raft rpc: {e}");
        ApiError::BadRequest(format!("refused raft rpc: {e}"))
    };
    match rpc {
        "append" => {
            let req = decode(body)?;
            guard::append_request(&req, &peers).map_err(refuse)?;
            Ok(json(StatusCode::OK, &raft.append_entries(req).await))
        }
        "vote" => {
            let req = decode(body)?;
            guard::vote_request(&req, &peers).map_err(refuse)?;
            Ok(json(StatusCode::OK, &raft.vote(req).await))
        }
        "snapshot" => {
            let req = decode(body)?;
            guard::snapshot_request(&req, &peers).map_err(refuse)?;
            Ok(json(StatusCode::OK, &raft.install_snapshot(req).await))
        }
        _ => Err(ApiError::NotFound),
    }
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("bad raft rpc: {e}")))
}
