//! Followers forward leader calls to the leader, once.
//!
//! The forwarded request carries `x-fencegate-forwarded-by`; a node that gets
//! such a request and is not the leader answers 503 instead of forwarding
//! again, so a stale view of the leader can never make a loop.
//!
//! Bodies are passed on without being read (but `wait_ms`, for the
//! forwarded call's timeout).

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Request, Response};

use super::error::ApiError;
use super::Node;
use crate::http::{full, Body};
use crate::raft::types::NodeId;

pub(super) const FORWARDED_BY: &str = "x-fencegate-forwarded-by";
/// The identity the forwarding member authenticated; the leader decides
/// rights and ownership with it. Only ever read on the peer plane.
pub(super) const IDENTITY: &str = "x-fencegate-identity";

/// The identity a forwarded request carries.
pub(super) fn identity(headers: &hyper::HeaderMap) -> Result<String, ApiError> {
    headers
        .get(IDENTITY)
        .and_then(|v| v.to_str().ok())
        .filter(|v| crate::auth::identity_ok(v))
        .map(str::to_string)
        .ok_or_else(|| ApiError::BadRequest(format!("a forwarded call needs a valid {IDENTITY}")))
}

pub(super) async fn to_leader(
    node: &Node,
    leader: NodeId,
    parts: &Parts,
    body: Bytes,
    identity: &str,
) -> Result<Response<Body>, ApiError> {
    let Some(peer) = node.peer(leader) else {
        return Err(ApiError::NoLeader(format!("no URL for leader {leader}")));
    };
    // An acquire may wait up to its wait_ms on the leader before proposing.
    let wait = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("wait_ms")?.as_u64())
        .map_or(std::time::Duration::ZERO, std::time::Duration::from_millis)
        .min(node.config.lease.max_wait);
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    // A member added waits on the leader for its catch-up.
    let catch_up = match path.starts_with(fencegate_client::wire::MEMBERS_PATH) {
        true => super::members::CATCH_UP,
        false => std::time::Duration::ZERO,
    };
    let timeout = wait + catch_up + node.config.raft.propose_timeout * 2;
    let mut req = Request::builder().method(parts.method.clone()).uri(format!("{}{path}", peer.url));
    if let Some(ct) = parts.headers.get(CONTENT_TYPE) {
        req = req.header(CONTENT_TYPE, ct);
    }
    let req = req
        .header(FORWARDED_BY, node.id.to_string())
        .header(IDENTITY, identity)
        .body(Full::new(body))
        .map_err(|e| ApiError::Internal(e.to_string()))?;

    let answer = peer
        .http
        .send(req, timeout)
        .await
        .map_err(|e| ApiError::NoLeader(format!("forwarding to leader {leader}: {e}; the outcome is unknown")))?;
    let mut resp = Response::new(full(answer.body));
    *resp.status_mut() = answer.status;
    for name in [CONTENT_TYPE, RETRY_AFTER] {
        if let Some(v) = answer.headers.get(&name) {
            resp.headers_mut().insert(name, v.clone());
        }
    }
    Ok(resp)
}
