//! Peer RPCs over HTTP: each Raft RPC is a JSON POST to `/raft/{append,vote,snapshot}`
//! on the target's URL from this node's `peers` list (served by `server::raft_rpc`).
//!
//! With TLS, each peer has a client of its own that presents this node's
//! certificate and accepts only a server certified as that member
//! (`fencegate-node-<id>`), whatever host its URL names.
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

/// A member as this node reaches it on the peer plane.
#[derive(Clone)]
pub struct Peer {
    /// Its `peer_listen` URL.
    pub url: String,
    /// A pooled client for it (with TLS: checking that it is this member).
    pub http: HttpClient,
}

/// Every member of the `peers` config, this node included (nothing calls itself).
pub type Peers = Arc<BTreeMap<NodeId, Peer>>;

/// The members of `urls`, reached with `tls` (this node's peer-link config)
/// or in plain HTTP; answers above `max_body` are refused.
pub fn peers(urls: &BTreeMap<NodeId, String>, tls: Option<&rustls::ClientConfig>, max_body: usize) -> Peers {
    let peer = |(id, url): (&NodeId, &String)| {
        let http = match tls {
            Some(tls) => HttpClient::https(max_body, tls.clone(), Some(crate::tls::identity::member_name(*id))),
            None => HttpClient::new(max_body),
        };
        (*id, Peer { url: url.clone(), http })
    };
    Arc::new(urls.iter().map(peer).collect())
}

/// Creates one [`PeerClient`] per target.
#[derive(Clone)]
pub struct Network {
    peers: Peers,
}

impl Network {
    pub fn new(peers: Peers) -> Self {
        Self { peers }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> PeerClient {
        PeerClient { target, peer: self.peers.get(&target).cloned() }
    }
}

pub struct PeerClient {
    target: NodeId,
    peer: Option<Peer>,
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
        let Some(peer) = &self.peer else { return Err(unreachable(format!("node {} is not in peers", self.target))) };
        let body = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let answer = peer
            .http
            .call(Method::POST, &format!("{}{path}", peer.url), Some(body), option.hard_ttl())
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
