//! Peer RPCs over HTTP: each Raft RPC is a JSON POST to `/raft/{append,vote,snapshot}`
//! on the target's URL from this node's `peers` list (served by `server::raft_rpc`).
//!
//! A transport failure or timeout is reported to openraft as `Unreachable`, so
//! it backs off instead of hammering a dead peer; an error the peer's Raft
//! returned comes back as a `RemoteError`.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::{Method, StatusCode};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::EmptyNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::types::{NodeId, TypeConfig};
use fencegate_client::http::HttpClient;

pub const APPEND_PATH: &str = "/raft/append";
pub const VOTE_PATH: &str = "/raft/vote";
pub const SNAPSHOT_PATH: &str = "/raft/snapshot";

/// Creates one [`PeerClient`] per target; all share a pooled HTTP client.
#[derive(Clone)]
pub struct Network {
    peers: Arc<BTreeMap<NodeId, String>>,
    http: HttpClient,
}

impl Network {
    pub fn new(peers: Arc<BTreeMap<NodeId, String>>, http: HttpClient) -> Self {
        Self { peers, http }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> PeerClient {
        PeerClient { target, url: self.peers.get(&target).cloned(), http: self.http.clone() }
    }
}

pub struct PeerClient {
    target: NodeId,
    url: Option<String>,
    http: HttpClient,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PeerError(String);

impl PeerClient {
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, EmptyNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let unreachable = |msg: String| RPCError::Unreachable(Unreachable::new(&PeerError(msg)));
        let Some(base) = &self.url else { return Err(unreachable(format!("node {} is not in peers", self.target))) };
        let body = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let answer = self
            .http
            .call(Method::POST, &format!("{base}{path}"), Some(body), option.hard_ttl())
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if answer.status != StatusCode::OK {
            return Err(unreachable(format!("{path} answered {}", answer.status)));
        }
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&answer.body).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        self.call(APPEND_PATH, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call(SNAPSHOT_PATH, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        self.call(VOTE_PATH, &rpc, &option).await
    }
}
