//! Peer RPCs over HTTP: each Raft RPC is a JSON POST to `/raft/{append,vote,snapshot}`
//! on the target's peer URL (served by `server::raft_rpc`): the one this
//! node's `peers` config gives, else the one its membership entry carries
//! (a member added by `member add`).
//!
//! With TLS, each peer has a client of its own that presents this node's
//! certificate and accepts only a server certified as that member
//! (`fencegate-node-<id>`), whatever host its URL names. A reload replaces
//! that TLS config (`Directory::set_tls`); every RPC looks its client up,
//! so the next one uses it.
//!
//! Every RPC carries this node's cluster id and every answer is checked for
//! the peer's (`raft::identity`): a member of another cluster is a failure,
//! logged like any other, never an answer openraft takes.
//!
//! Without TLS, a node with a `peer_secret_file` sends its proof of the
//! members' secret (`auth::PeerSecrets`) with every request to a member:
//! each client is made here (`set_proof`), so Raft, forwarded calls,
//! probes and the bootstrap check all carry it.
//!
//! A transport failure is reported to openraft as `Unreachable`, so it backs
//! off (500 ms) instead of hammering a dead peer. A timeout is not: openraft
//! bounds an append by the heartbeat interval, and a leader that stalls for
//! one (an fsync, a busy core) would otherwise stop sending to every
//! follower for 500 ms, past the 350 ms after which they campaign
//! (`bench/elections.rs` counted such elections). It is a `Network` error:
//! the next heartbeat tries again. An error the peer's Raft returned comes
//! back as a `RemoteError`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use hyper::StatusCode;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::identity::{self, Identity, CLUSTER_HEADER};
use super::types::{Member, NodeId, TypeConfig};
use super::upgrade::Protocols;
use crate::log_limit::Window;
use fencegate_client::http::{HttpClient, HttpError};

/// The peer protocol (`raft::upgrade`), on every peer RPC and its answer: a
/// node refuses a newer one than its build's (`server::api`), instead of
/// misreading it. A request or answer without it is from a build before
/// protocols were numbered: protocol 1.
pub(crate) const PROTOCOL_HEADER: &str = "x-fencegate-peer-protocol";

pub(crate) const APPEND_PATH: &str = "/raft/append";
pub(crate) const VOTE_PATH: &str = "/raft/vote";
pub(crate) const SNAPSHOT_PATH: &str = "/raft/snapshot";

/// A member as this node reaches it on the peer plane.
#[derive(Clone)]
pub(crate) struct Peer {
    /// Its `peer_listen` URL.
    pub url: String,
    /// A pooled client for it (with TLS: checking that it is this member).
    pub http: HttpClient,
}

/// Where members are reached: a pooled client per (member, URL), made on
/// first use.
pub(crate) struct Directory {
    /// The `peers` config: the founding members, and where a member whose
    /// entry carries no URL is reached.
    pub config: BTreeMap<NodeId, String>,
    max_body: usize,
    links: Mutex<Links>,
    /// Per member whose RPCs fail: one log line per interval, not one per
    /// heartbeat or vote (a peer not started yet, or down).
    failing: Mutex<HashMap<NodeId, Window>>,
    /// What this node speaks and what its peers answered they speak.
    pub protocols: Arc<Protocols>,
    /// This node's cluster id: on every RPC, and checked on every answer.
    pub identity: Arc<Identity>,
}

/// The peer-link TLS config, this node's proof of the peer secret, and
/// the clients made with them.
struct Links {
    tls: Option<rustls::ClientConfig>,
    proof: Option<String>,
    clients: HashMap<(NodeId, String), HttpClient>,
}

impl Directory {
    /// Members reached with `tls` (this node's peer-link config) or in
    /// plain HTTP; answers above `max_body` are refused.
    pub(crate) fn new(
        config: BTreeMap<NodeId, String>,
        tls: Option<&rustls::ClientConfig>,
        max_body: usize,
        protocols: Arc<Protocols>,
        identity: Arc<Identity>,
    ) -> Arc<Self> {
        let links = Links { tls: tls.cloned(), proof: None, clients: HashMap::new() };
        let failing = Mutex::default();
        Arc::new(Directory { config, max_body, links: Mutex::new(links), failing, protocols, identity })
    }

    /// Reach members with `tls` from now on: the clients made with the old
    /// config are dropped (connections in use finish their exchange).
    pub(crate) fn set_tls(&self, tls: rustls::ClientConfig) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links.tls = Some(tls);
        links.clients.clear();
    }

    /// Send `proof` (`auth::PeerSecrets::proof`) with every request to a
    /// member from now on; as `set_tls`, the old clients are dropped.
    pub(crate) fn set_proof(&self, proof: String) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links.proof = Some(proof);
        links.clients.clear();
    }

    /// An RPC to member `id` failed: log it, at most once per interval.
    fn note_failure(&self, id: NodeId, path: &str, error: &str) {
        self.protocols.lost(id);
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let window = failing.entry(id).or_insert_with(|| Window::new(crate::log_limit::EVERY));
        if let Some(more) = window.hit(std::time::Instant::now()) {
            tracing::warn!(peer = id, "{path} to node {id} failed: {error}{more}");
        }
    }

    /// An RPC to member `id` was answered, by a build of `protocol`: its
    /// next failure is logged at once.
    fn note_answer(&self, id: NodeId, protocol: u32) {
        self.protocols.heard(id, protocol);
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if failing.remove(&id).is_some() {
            tracing::info!(peer = id, "node {id} answers again");
        }
    }

    /// Member `id`, at the URL this node's config gives it, else the one
    /// its entry carries. The config comes first: it says how this node
    /// reaches a founding member (the entry carries how the bootstrapping
    /// node did); a member added later is in no config.
    pub(crate) fn peer(&self, id: NodeId, member: Option<&Member>) -> Option<Peer> {
        let listed = member.map(|m| m.peer_url.as_str()).filter(|u| !u.is_empty());
        let url = self.config.get(&id).map(String::as_str).or(listed)?;
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let Links { tls, proof, clients } = &mut *links;
        let http = clients.entry((id, url.to_string())).or_insert_with(|| {
            let http = match tls {
                Some(tls) => HttpClient::https(self.max_body, tls.clone(), Some(crate::tls::identity::member_name(id))),
                None => HttpClient::new(self.max_body),
            };
            match proof {
                Some(proof) => http.with_bearer(proof).expect("a proof is visible ASCII"),
                None => http,
            }
        });
        Some(Peer { url: url.to_string(), http: http.clone() })
    }
}

/// Creates one [`PeerClient`] per target.
#[derive(Clone)]
pub(crate) struct Network {
    directory: Arc<Directory>,
}

impl Network {
    pub(crate) fn new(directory: Arc<Directory>) -> Self {
        Self { directory }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, member: &Member) -> PeerClient {
        PeerClient { target, member: member.clone(), directory: self.directory.clone() }
    }
}

/// openraft keeps one per target for as long as it replicates to it: the
/// peer is looked up per RPC, so that reloaded TLS applies to the next one.
pub(crate) struct PeerClient {
    target: NodeId,
    member: Member,
    directory: Arc<Directory>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PeerError(String);

impl PeerClient {
    /// One RPC. A failure to reach the peer is logged here, at most once
    /// per interval per peer (openraft's own lines about it are off by
    /// default, `cli::logging`).
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Member, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        match self.exchange(path, req, option).await {
            Ok((protocol, result)) => {
                self.directory.note_answer(self.target, protocol);
                result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Err(Failure::Unreachable(msg)) => {
                self.directory.note_failure(self.target, path, &msg);
                Err(RPCError::Unreachable(Unreachable::new(&PeerError(msg))))
            }
            Err(Failure::Network(msg)) => {
                self.directory.note_failure(self.target, path, &msg);
                Err(RPCError::Network(NetworkError::new(&PeerError(msg))))
            }
        }
    }

    /// The exchange itself: the protocol the peer's build speaks and its
    /// Raft answer, or why there is none.
    async fn exchange<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<(u32, Result<Resp, RaftError<NodeId, E>>), Failure>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(peer) = self.directory.peer(self.target, Some(&self.member)) else {
            return Err(Failure::Unreachable(format!("no URL for node {}", self.target)));
        };
        let body = serde_json::to_vec(req).map_err(|e| Failure::Network(e.to_string()))?;
        let url = format!("{}{path}", peer.url);
        let mine = self.directory.identity.header();
        let mut req = hyper::Request::post(&url)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(PROTOCOL_HEADER, self.directory.protocols.speaking());
        if let Some(id) = &mine {
            req = req.header(CLUSTER_HEADER, id);
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .map_err(|e| Failure::Unreachable(format!("{url}: {e}")))?;
        let answer = peer.http.send(req, option.hard_ttl()).await.map_err(|e| match e {
            HttpError::Timeout { .. } => Failure::Network(e.to_string()),
            _ => Failure::Unreachable(e.to_string()),
        })?;
        if answer.status != StatusCode::OK {
            let why = String::from_utf8_lossy(&answer.body[..answer.body.len().min(512)]).into_owned();
            return Err(Failure::Unreachable(format!("{path} answered {}: {why}", answer.status)));
        }
        // A member of another cluster (an older build that checks nothing,
        // or a node that took another id first) is not one of ours.
        let theirs = answer.headers.get(CLUSTER_HEADER).and_then(|v| v.to_str().ok());
        identity::compatible(mine.as_ref().and_then(|m| m.to_str().ok()), theirs)
            .map_err(|e| Failure::Unreachable(format!("node {} refused as a member: {e}", self.target)))?;
        let protocol = answer.headers.get(PROTOCOL_HEADER).and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1);
        let result = serde_json::from_slice(&answer.body).map_err(|e| Failure::Network(format!("{url}: {e}")))?;
        Ok((protocol, result))
    }
}

/// Why a peer RPC got no Raft answer: openraft backs off after `Unreachable`,
/// and retries at the next heartbeat after `Network` (the module's doc).
enum Failure {
    Unreachable(String),
    Network(String),
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.call(APPEND_PATH, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call(SNAPSHOT_PATH, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.call(VOTE_PATH, &rpc, &option).await
    }
}
