//! The lock service node: opens storage, starts Raft, runs the lease keeper and
//! serves the Lock API (`listen`) and the peer plane (`peer_listen`).
//!
//! `Node::start` + `serve(listeners, node, shutdown)` is the whole lifecycle, so
//! tests can run a real node on `127.0.0.1:0` exactly as `fencegate server` does.
//!
//! `Node::start` checks the data directory's `DATA_FORMAT`, opens storage,
//! starts Raft, bootstraps on first start and starts the lease keeper;
//! `serve` drains both planes together. `restore` builds a restored
//! cluster's first node's data directory (only the smallest id of `peers`,
//! only into an empty `data_dir`). [`inputs`] re-exports, as the handlers
//! call them, the decoders of what the node reads from the network (`call`,
//! `acquire_params`, `watch_params`, `member_of`, `peer_rpc` with
//! `PeerRpc::check`) for `fuzz/`: the fuzzer has no second path.

mod api;
pub(crate) mod credentials;
mod error;
mod forward;
mod keeper;
pub(crate) mod members;
mod openapi;
mod proposer;
mod raft_rpc;
mod reload;
mod table;
mod ui;
mod waitlist;
mod watch;

/// What the node decodes from the network before a handler acts on it, as
/// the handlers call it: the peer RPCs, a leader call's method and path, an
/// acquire's body, a watch's query, a member to add. `fuzz/` feeds these.
pub mod inputs {
    pub use super::api::{acquire_params, call, AcquireParams, Call};
    pub use super::error::ApiError;
    pub use super::members::member_of;
    pub use super::raft_rpc::{decode as peer_rpc, PeerRpc};
    pub use super::watch::{params as watch_params, WatchParams};
}

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use prometheus::{IntCounterVec, Registry};
use redb::Database;
use tokio::net::TcpListener;

use crate::auth::Acl;
use crate::config::node::NodeConfig;
use crate::http::LiveListener;
use crate::lock::state::LockState;
use crate::metrics::{LockMetrics, RaftMetrics};
use crate::raft::identity::Identity;
use crate::raft::log_store::{LogStore, LOG_DIR};
use crate::raft::meta::{read_meta, write_meta};
use crate::raft::network::{Directory, Network, Peer};
use crate::raft::snapshot_file::SnapshotFile;
use crate::raft::state_machine::{Applied, StateMachineStore};
use crate::raft::types::{Member, NodeId, Raft};
use crate::raft::upgrade::Protocols;
use crate::tls::NodeTls;
use fencegate_client::wire::{self, ClusterInfo};

/// redb's page cache.
const REDB_CACHE: usize = 4 << 20;

/// Largest body a peer or client may send (a Raft append batch is the largest).
const MAX_PEER_BODY: usize = 64 << 20;

/// A running lock service node. Cheap to share (`Arc`).
pub(crate) struct Node {
    pub id: NodeId,
    /// The config the node started with. A reload replaces only the TLS
    /// material and the ACL (`reload.rs`); the rest takes a restart.
    pub config: NodeConfig,
    pub raft: Raft,
    pub applied: Arc<Applied>,
    /// Where the other members are reached.
    pub directory: Arc<Directory>,
    /// The cluster id this node's history belongs to, once it has one.
    pub identity: Arc<Identity>,
    credentials: Arc<credentials::Credentials>,
    /// Without TLS, the members' shared secret every peer-plane request
    /// must prove (`peer_secret_file`); a reload replaces it (rotation).
    peer_secrets: Option<ArcSwap<crate::auth::PeerSecrets>>,
    /// Read once per check; a reload replaces it.
    acl: ArcSwap<Acl>,
    /// Whether both planes serve TLS (`tls`), for the process's life.
    pub(crate) tls: bool,
    /// The listeners' options, with their TLS acceptors: a reload replaces
    /// them for new connections.
    client_plane: LiveListener,
    peer_plane: LiveListener,
    pub registry: Registry,
    /// `fencegate_config_reloads_total{result}`.
    pub reloads: IntCounterVec,
    pub lock_metrics: LockMetrics,
    pub raft_metrics: RaftMetrics,
    pub(crate) proposer: proposer::Proposer,
    waitlist: waitlist::WaitList,
    /// The term whose leadership the lease clock was reset for (0: none yet).
    /// Keepalives wait for it: before the reset, deadlines may be stale.
    clock_term: std::sync::atomic::AtomicU64,
    /// Set when the node stops serving: watch streams end (watchers resume
    /// elsewhere) and parked acquires are answered 503, so that the drain of
    /// the listener is not held up by requests that never finish.
    stopping: tokio::sync::watch::Sender<bool>,
}

impl Node {
    /// Open (or create) the node's data, start Raft, bootstrap the cluster from
    /// `peers` on first start, and start the lease keeper.
    pub(crate) async fn start(config: NodeConfig) -> anyhow::Result<Arc<Node>> {
        // Files named by the config first: a bad one is a configuration error (exit 64).
        let tls = NodeTls::load(&config)?;
        let credentials = credentials::Credentials::load(&config)?;
        let peer_secrets = credentials::peer_secrets(&config)?;
        let db = open_data_dir(&config)?;

        let registry = Registry::new();
        let lock_metrics = LockMetrics::new(&registry)?;
        let raft_metrics = RaftMetrics::new(&registry)?;
        let reloads = crate::metrics::config_reloads(&registry, "fencegate_config_reloads_total")?;
        crate::metrics::process(&registry)?;
        let log_dir = config.data_dir.join(LOG_DIR);
        let log_store =
            LogStore::open(&log_dir, raft_metrics.clone()).with_context(|| format!("opening {}", log_dir.display()))?;
        let snapshots = SnapshotFile::new(config.data_dir.clone(), db.clone());
        let protocols = Arc::new(Protocols::default());
        let identity = Identity::open(db.clone())?;
        let stored = identity.get();
        let sm =
            StateMachineStore::open(snapshots, lock_metrics.clone(), protocols.clone(), identity.clone(), config.id)?;
        let applied = sm.applied();
        if let Err(e) = crate::raft::identity::compatible(stored.as_deref(), applied.lock().locks.cluster()) {
            anyhow::bail!("{}: its snapshot is of another cluster than its log: {e}", config.data_dir.display());
        }

        let r = &config.raft;
        let raft_config = openraft::Config {
            cluster_name: "fencegate".into(),
            heartbeat_interval: r.heartbeat.as_millis() as u64,
            election_timeout_min: r.election_timeout_min.as_millis() as u64,
            election_timeout_max: r.election_timeout_max.as_millis() as u64,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(r.snapshot_every),
            // Keep some entries behind the snapshot so a briefly lagging
            // follower catches up from the log instead of a full snapshot.
            max_in_snapshot_log_to_keep: (r.snapshot_every / 2).min(1000),
            // openraft bounds each append RPC by the heartbeat interval; with
            // up to `proposer::MAX_BATCH` commands per entry, 32 entries keep a
            // catch-up append around a couple of MB at worst.
            max_payload_entries: 32,
            ..Default::default()
        }
        .validate()?;
        let peer_links = tls.as_ref().map(|t| &t.peer_links);
        let directory = Directory::new(config.peers.clone(), peer_links, MAX_PEER_BODY, protocols, identity.clone());
        if let Some(secrets) = &peer_secrets {
            directory.set_proof(secrets.proof(config.id));
        }
        let network = Network::new(directory.clone());
        let raft = Raft::new(config.id, Arc::new(raft_config), network, log_store, sm).await?;

        if !raft.is_initialized().await? && should_bootstrap(config.id, &directory).await {
            if let Err(e) = raft.initialize(founding_members(&config)).await {
                tracing::info!("not bootstrapping: {e}");
            }
        }

        let waitlist = waitlist::WaitList::new(lock_metrics.waiters.clone());
        credentials.keep_fresh();
        let (client_plane, peer_plane) = plane_options(&config, tls.as_ref());
        let node = Arc::new(Node {
            id: config.id,
            acl: ArcSwap::from_pointee(config.acl()),
            credentials,
            peer_secrets: peer_secrets.map(ArcSwap::from_pointee),
            tls: tls.is_some(),
            client_plane: Arc::new(ArcSwap::from_pointee(client_plane)),
            peer_plane: Arc::new(ArcSwap::from_pointee(peer_plane)),
            config,
            proposer: proposer::Proposer::start(raft.clone()),
            raft,
            applied,
            directory,
            identity,
            registry,
            reloads,
            lock_metrics,
            raft_metrics,
            waitlist,
            clock_term: std::sync::atomic::AtomicU64::new(0),
            stopping: tokio::sync::watch::Sender::new(false),
        });
        tokio::spawn(keeper::run(node.clone()));
        Ok(node)
    }

    /// The current leader, if this node knows one.
    pub(crate) fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Why a lock call cannot be served here now (`/readyz`), if it cannot:
    /// no leader known; or this node leads but no quorum has acknowledged
    /// it for longer than a follower waits before it campaigns (an openraft
    /// leader cut off from its majority does not step down, and its calls
    /// would only hang until `propose_timeout`).
    pub(crate) fn unready(&self) -> Option<String> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        match m.current_leader {
            None => return Some("this node knows no leader yet".into()),
            Some(leader) if leader != self.id => return None,
            Some(_) => {}
        }
        let limit = 2 * self.config.raft.election_timeout_max.as_millis() as u64;
        match m.millis_since_quorum_ack {
            Some(ms) if ms <= limit => None,
            Some(ms) => Some(format!("this node leads, but no quorum has acknowledged it for {ms} ms")),
            None => Some("this node leads, but no quorum has acknowledged it yet".into()),
        }
    }

    pub(crate) fn members(&self) -> BTreeSet<NodeId> {
        self.applied.lock().membership.membership().voter_ids().collect()
    }

    /// Member `id`'s entry in the membership as this node knows it (the
    /// latest in its log, committed or not), if it has one.
    pub(crate) fn member(&self, id: NodeId) -> Option<Member> {
        self.raft.metrics().borrow().membership_config.membership().get_node(&id).cloned()
    }

    /// Whether `id` may speak to this node as a member: one of the `peers`
    /// config, or of the membership (voter or learner).
    pub(crate) fn knows(&self, id: NodeId) -> bool {
        self.directory.config.contains_key(&id) || self.member(id).is_some()
    }

    /// Every member this node knows of, itself included.
    pub(crate) fn known(&self) -> BTreeSet<NodeId> {
        let metrics = self.raft.metrics().borrow().membership_config.clone();
        let listed = metrics.membership().nodes().map(|(id, _)| *id);
        self.directory.config.keys().copied().chain(listed).collect()
    }

    /// How this node reaches member `id` on the peer plane.
    pub(crate) fn peer(&self, id: NodeId) -> Option<Peer> {
        self.directory.peer(id, self.member(id).as_ref())
    }

    /// Stop serving long-lived requests: watch streams end and waiting
    /// acquires get 503. Call before draining the listener.
    pub(crate) fn stop_serving(&self) {
        self.stopping.send_replace(true);
    }

    /// Why the Raft core stopped (a panic, a storage error), if it did. A
    /// node whose core stopped must not report itself healthy.
    pub(crate) fn core_error(&self) -> Option<String> {
        self.raft.metrics().borrow().running_state.as_ref().err().map(|e| e.to_string())
    }

    /// Resolves with the reason once the Raft core has stopped.
    pub(crate) async fn core_stopped(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            if let Some(e) = self.core_error() {
                return e;
            }
            if metrics.changed().await.is_err() {
                return self.core_error().unwrap_or_else(|| "the Raft core ended".into());
            }
        }
    }

    /// Resolves once `stop_serving` was called.
    async fn stopped(&self) {
        let _ = self.stopping.subscribe().wait_for(|s| *s).await;
    }

    /// Stop Raft; in-flight requests fail.
    pub(crate) async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("raft shutdown: {e}");
        }
    }
}

/// The members a new cluster starts with: every node of `peers`, with the
/// URLs the config gives.
fn founding_members(config: &NodeConfig) -> BTreeMap<NodeId, Member> {
    let member = |(id, url): (&NodeId, &String)| {
        let client_url = config.clients.get(id).cloned().unwrap_or_default();
        (*id, Member { peer_url: url.clone(), client_url })
    };
    config.peers.iter().map(member).collect()
}

/// Build the data directory of `config`'s node as the first node of a
/// cluster restored from a backup whose table is `locks` (already
/// `LockState::restored`): only the node with the smallest id of `peers`,
/// so that it starts initialized and no other node ever bootstraps an
/// empty cluster beside it; the others start with empty data directories.
/// Refuses a data directory that already holds a node's data. The
/// database file it wrote.
pub(crate) fn restore(config: &NodeConfig, locks: &LockState) -> anyhow::Result<std::path::PathBuf> {
    let first = config.peers.keys().next().copied();
    if first != Some(config.id) {
        anyhow::bail!(
            "restore into the node with the smallest id of `peers` ({}), not node {}: it starts the restored \
             cluster, and the others start with empty data directories",
            first.map_or("none".into(), |f| f.to_string()),
            config.id
        );
    }
    let path = config.data_dir.join(META_FILE);
    if path.exists() {
        anyhow::bail!("{} exists: a restore builds a new node's data; give it an empty data_dir", path.display());
    }
    let db = open_data_dir(config)?;
    Identity::open(db.clone())?.adopt(locks.cluster())?;
    let snapshots = SnapshotFile::new(config.data_dir.clone(), db);
    crate::raft::state_machine::seed(&snapshots, locks, founding_members(config))?;
    Ok(path)
}

/// The metadata's database in `data_dir` (before format 5, the log's too).
const META_FILE: &str = "raft.redb";

/// Open (or create) `config`'s data directory: the metadata's database,
/// checked to be this node's and of a format this build reads, and the log
/// moved to this format's place if it was older.
fn open_data_dir(config: &NodeConfig) -> anyhow::Result<Arc<Database>> {
    crate::durable::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data_dir {}", config.data_dir.display()))?;
    crate::private::tighten(&config.data_dir)
        .with_context(|| format!("tightening data_dir {}", config.data_dir.display()))?;
    let path = config.data_dir.join(META_FILE);
    let snapshot = SnapshotFile::path_in(&config.data_dir);
    let log = config.data_dir.join(LOG_DIR);
    if let Some(orphan) = [&snapshot, &log].into_iter().find(|p| !path.exists() && p.exists()) {
        // Half a wiped directory: a snapshot or log without the node id and
        // format that went with them (or, before format 5, the vote) would
        // start a node that may have forgotten whom it voted for.
        anyhow::bail!(
            "{} exists without {}: wipe the whole data_dir (or restore the database)",
            orphan.display(),
            path.display()
        );
    }
    // redb caches up to 1 GiB by default; the log is written once and read
    // back only by lagging followers, so a small cache costs little and
    // keeps the node's memory bounded by what it holds.
    let db = Database::builder().set_cache_size(REDB_CACHE).create(&path);
    let db = Arc::new(db.with_context(|| format!("opening {}", path.display()))?);
    // redb syncs the file, not its name: without this a power cut soon
    // after a node's first start takes its log and vote with it.
    crate::durable::sync_dir(&config.data_dir).with_context(|| format!("syncing {}", config.data_dir.display()))?;
    check_node_id(&db, config.id)?;
    check_format(&db, &config.data_dir)?;
    Ok(db)
}

/// Only the node with the smallest id bootstraps a new cluster, and only if
/// no peer already belongs to one: a node whose data was wiped must rejoin,
/// not found a second cluster under the same ids. The others wait to be
/// contacted by the leader.
async fn should_bootstrap(id: NodeId, directory: &Directory) -> bool {
    if directory.config.keys().next() != Some(&id) {
        return false;
    }
    for peer in directory.config.keys().copied().filter(|p| *p != id) {
        let Some(Peer { url, http }) = directory.peer(peer, None) else { continue };
        let answer = http
            .call(
                hyper::Method::GET,
                &format!("{url}{}", wire::CLUSTER_PATH),
                None,
                std::time::Duration::from_millis(500),
            )
            .await;
        // No answer: the peer is not up yet, so it cannot be in a cluster
        // of its own. An answer that is not a cluster view fails safe: a
        // second cluster under the same ids would break every guarantee.
        let Ok(answer) = answer else { continue };
        match serde_json::from_slice::<ClusterInfo>(&answer.body) {
            // A restored node has a snapshot before its first election.
            Ok(c) if c.term == 0 && c.leader.is_none() && c.snapshot_index.is_none() => {}
            Ok(_) => {
                tracing::info!(peer, "not bootstrapping: a peer already belongs to a cluster");
                return false;
            }
            Err(e) => {
                tracing::warn!(peer, status = %answer.status, "not bootstrapping: {url} answered something else: {e}");
                return false;
            }
        }
    }
    true
}

/// The data directory's format (the metadata in `raft.redb`, the log, the
/// `snapshot` file): what this build writes, and the newest it reads.
/// Bumped when a change would make an older build misread the files; a
/// directory from before formats were numbered is format 1.
/// Format 2 keeps snapshots in their own file (`raft::snapshot_file`): a
/// build of format 1 would miss them and read a stale one. Format 3's
/// table may be applied by rules 1 (`lock::state::RULES`): a build of
/// format 2 would read such a snapshot as rules 0, silently, and apply what
/// follows differently from the rest of its cluster.
/// Format 4 holds the cluster id (`raft::identity`, in the metadata and the
/// snapshot's table): a build of format 3 would drop it and take another
/// cluster's peers for its own.
/// Format 5 keeps the log and the vote in an append-only WAL in `log/`
/// (`raft::log_store`), no longer in `raft.redb`: a build of format 4 would
/// find an empty log and no vote, and vote twice in a term.
pub(crate) const DATA_FORMAT: u32 = 5;

/// Refuse a data directory a newer build wrote, instead of misreading it;
/// bring an older one to this format before anything reads it (its log
/// moved, `raft::log_upgrade`; its other files are read as they are:
/// format 1's snapshot from the database).
fn check_format(db: &Database, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let path = data_dir.join(META_FILE);
    match read_meta::<u32>(db, "format")? {
        Some(v) if v > DATA_FORMAT => anyhow::bail!(
            "{} was written by a newer fencegate (data format {v}; this build reads formats up to {DATA_FORMAT}): \
             run a build that reads it (an upgrade is rolled forward, not back)",
            path.display()
        ),
        Some(DATA_FORMAT) => {
            let log = data_dir.join(LOG_DIR);
            if !log.is_dir() {
                // The vote is in there: starting without it could vote twice in a term.
                anyhow::bail!(
                    "{} is missing (the log and the vote of format {DATA_FORMAT}): wipe the whole data_dir \
                               (or restore the directory)",
                    log.display()
                );
            }
            Ok(())
        }
        old => {
            let moved = crate::raft::log_upgrade::move_log(db, data_dir, DATA_FORMAT)?;
            if let Some(v) = old {
                tracing::info!(path = %path.display(), entries = moved, "data format {v} upgraded to {DATA_FORMAT}");
            }
            Ok(())
        }
    }
}

/// Refuse a data directory that belongs to another node id: two nodes sharing
/// one log would break every Raft guarantee.
fn check_node_id(db: &Database, id: NodeId) -> anyhow::Result<()> {
    match read_meta::<NodeId>(db, "node_id")? {
        Some(stored) if stored != id => {
            anyhow::bail!("data_dir belongs to node {stored}, but this config says id {id}")
        }
        Some(_) => Ok(()),
        None => Ok(write_meta(db, "node_id", &id)?),
    }
}

/// The node's two listeners: the client API on `listen`, the peer plane on
/// `peer_listen`. Never one for both: Raft RPCs are not part of the client API.
pub(crate) struct Listeners {
    pub client: TcpListener,
    pub peer: TcpListener,
}

impl Listeners {
    /// Bind both addresses of `config`.
    pub(crate) async fn bind(config: &NodeConfig) -> Result<Listeners, crate::http::CannotListen> {
        let client = crate::http::bind(config.listen, "listen").await?;
        let peer = crate::http::bind(config.peer_listen, "peer_listen").await?;
        Ok(Listeners { client, peer })
    }
}

/// Serve the Lock API and the peer plane until `shutdown` resolves, then
/// drain the requests in flight on both.
pub(crate) async fn serve(listeners: Listeners, node: Arc<Node>, shutdown: impl Future<Output = ()>) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (client_node, peer_node) = (node.clone(), node.clone());
    let client_opts = node.client_plane.clone();
    let client =
        crate::http::serve_live(listeners.client, client_opts, until_stopped(stopped.clone()), move |req, conn| {
            api::handle(client_node.clone(), api::Plane::Client, req, conn)
        });
    let peer_opts = node.peer_plane.clone();
    let peer = crate::http::serve_live(listeners.peer, peer_opts, until_stopped(stopped), move |req, conn| {
        api::handle(peer_node.clone(), api::Plane::Peer, req, conn)
    });
    let trigger = async move {
        shutdown.await;
        stop.send_replace(true);
    };
    tokio::join!(client, peer, trigger);
}

/// The options of the client plane and of the peer plane under `config`,
/// serving `tls` if the node has it.
fn plane_options(config: &NodeConfig, tls: Option<&NodeTls>) -> (crate::http::Listener, crate::http::Listener) {
    let opts = |name, tls: Option<&rustls::ServerConfig>| crate::http::Listener {
        header_timeout: config.limits.header_timeout,
        max_connections: config.limits.max_connections,
        tls: tls.map(|c| tokio_rustls::TlsAcceptor::from(Arc::new(c.clone()))),
        ..crate::http::Listener::http1(name)
    };
    (opts("lock API", tls.map(|t| &t.client_plane)), opts("peer plane", tls.map(|t| &t.peer_plane)))
}

#[cfg(test)]
mod tests;
