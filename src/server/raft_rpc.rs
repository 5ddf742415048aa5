//! Server side of the peer network (`raft::network`): decode, hand to
//! openraft, encode its `Result` as JSON.

use hyper::{Response, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::Node;
use crate::http::{json, Body};

pub async fn handle(node: &Node, rpc: &str, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let raft = &node.raft;
    match rpc {
        "append" => Ok(json(StatusCode::OK, &raft.append_entries(decode(body)?).await)),
        "vote" => Ok(json(StatusCode::OK, &raft.vote(decode(body)?).await)),
        "snapshot" => Ok(json(StatusCode::OK, &raft.install_snapshot(decode(body)?).await)),
        _ => Err(ApiError::NotFound),
    }
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("bad raft rpc: {e}")))
}
