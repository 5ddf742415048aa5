//! Everything on one machine, in one process: a 3-node lock cluster (or,
//! with `LockService::Etcd`, a one-member etcd as a child process), the
//! built-in inventory API and the sidecar (`config/dev.yaml`) in front of it.
//! `fencegate dev` runs it on the well-known ports; `fencegate demo` on ports
//! the OS picks, so both can run side by side.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::local_etcd::LocalEtcd;
use super::LockService;
use crate::config::node::{LeaseConfig, NodeConfig, NodeLimits, RaftConfig};
use crate::config::sidecar::{LockServiceConfig, SidecarConfig};
use crate::config::{parse_yaml, ConfigFile};
use crate::inventory::Inventory;
use crate::server::Node;
use crate::sidecar::Sidecar;

/// The sidecar configuration `dev` and `demo` use, addresses filled in at start.
const DEV_SIDECAR: &str = include_str!("../../config/dev.yaml");

/// Where each part listens.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ports {
    pub nodes: [u16; 3],
    /// The nodes' peer planes.
    pub peers: [u16; 3],
    pub inventory: u16,
    pub sidecar: u16,
    pub metrics: u16,
    /// etcd's client and peer ports (`LockService::Etcd`).
    pub etcd: [u16; 2],
}

/// The well-known local ports of docs/DESIGN.md (etcd's own for etcd).
pub(super) const DEV_PORTS: Ports = Ports {
    nodes: [7401, 7402, 7403],
    peers: [7501, 7502, 7503],
    inventory: 9000,
    sidecar: 8080,
    metrics: 9464,
    etcd: [2379, 2380],
};
/// Any free ports.
pub(super) const ANY_PORTS: Ports =
    Ports { nodes: [0; 3], peers: [0; 3], inventory: 0, sidecar: 0, metrics: 0, etcd: [0; 2] };

pub(super) struct Stack {
    pub endpoints: Vec<String>,
    pub inventory_url: String,
    pub sidecar_url: String,
    pub metrics_url: String,
    pub inventory: Arc<Inventory>,
    pub backend: LockService,
    nodes: Vec<Arc<Node>>,
    etcd: Option<LocalEtcd>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

async fn bind(port: u16, what: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let l = crate::http::bind(addr, &format!("the {what}; is `fencegate dev` already running?")).await?;
    let addr = l.local_addr()?;
    Ok((l, addr))
}

/// A fresh members' secret in `data` (mode 0600), so that no other local
/// user can speak Raft to the stack's nodes, though its clients are anonymous.
fn peer_secret(data: &Path) -> anyhow::Result<std::path::PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    crate::durable::create_dir_all(data).with_context(|| format!("creating {}", data.display()))?;
    let path = data.join("peer-secret");
    // Made anew, never rewritten in place: an old file may have another mode.
    let _ = std::fs::remove_file(&path);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(hex::encode(rand::random::<[u8; 32]>()).as_bytes()));
    written.with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

impl Stack {
    /// Bind every port, then start the nodes, the inventory and the sidecar;
    /// returns once the cluster has a leader.
    pub(super) async fn start(ports: Ports, data: &Path, fresh: bool, backend: LockService) -> anyhow::Result<Stack> {
        let mut node_listeners = vec![];
        if backend == LockService::Fencegate {
            for (port, peer_port) in ports.nodes.into_iter().zip(ports.peers) {
                let peer = bind(peer_port, "lock service peer plane").await?;
                node_listeners.push((bind(port, "lock service").await?, peer));
            }
        }
        let (inv_listener, inv_addr) = bind(ports.inventory, "inventory API").await?;
        let (sc_listener, sc_addr) = bind(ports.sidecar, "sidecar").await?;
        let (metrics_listener, metrics_addr) = bind(ports.metrics, "sidecar metrics").await?;
        // Only once every port is ours: a second `dev --fresh` beside a
        // running one fails on its ports without wiping that one's data.
        if fresh && data.exists() {
            std::fs::remove_dir_all(data).with_context(|| format!("removing {}", data.display()))?;
        }

        let url_map = |addr: &dyn Fn(usize) -> SocketAddr| -> BTreeMap<u64, String> {
            (0..node_listeners.len()).map(|i| (i as u64 + 1, format!("http://{}", addr(i)))).collect()
        };
        let clients = url_map(&|i| node_listeners[i].0 .1);
        let peers = url_map(&|i| node_listeners[i].1 .1);
        let etcd = match backend {
            LockService::Etcd => Some(LocalEtcd::start(&data.join("etcd"), ports.etcd[0], ports.etcd[1]).await?),
            LockService::Fencegate => None,
        };
        let endpoints: Vec<String> = match &etcd {
            Some(etcd) => vec![etcd.url.clone()],
            None => clients.values().cloned().collect(),
        };
        let (stop, stopped) = watch::channel(false);
        let until_stopped = move || {
            let mut rx = stopped.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let mut tasks = vec![];
        let mut nodes = vec![];
        let peer_secret = peer_secret(data)?;
        for (i, ((client, addr), (peer, peer_addr))) in node_listeners.into_iter().enumerate() {
            let config = NodeConfig {
                kind: Some(crate::config::Kind::Node),
                id: i as u64 + 1,
                listen: addr,
                peer_listen: peer_addr,
                insecure_peers: false,
                peer_secret_file: Some(peer_secret.clone()),
                insecure_clients: false,
                tls: None,
                auth: Default::default(),
                acl: None,
                data_dir: data.join(format!("node{}", i + 1)),
                peers: peers.clone(),
                clients: clients.clone(),
                lease: LeaseConfig::default(),
                raft: RaftConfig::default(),
                limits: NodeLimits::default(),
            }
            .validate()?;
            let node = Node::start(config).await?;
            let listeners = crate::server::Listeners { client, peer };
            tasks.push(tokio::spawn(crate::server::serve(listeners, node.clone(), until_stopped())));
            nodes.push(node);
        }

        let inventory = Arc::new(Inventory::default());
        tasks.push(tokio::spawn(crate::inventory::serve(inv_listener, inventory.clone(), until_stopped())));

        let mut sc: SidecarConfig = parse_yaml(DEV_SIDECAR)?;
        sc.listen = sc_addr;
        sc.metrics_listen = Some(metrics_addr);
        sc.upstream = format!("http://{inv_addr}");
        sc.lock_service =
            Some(LockServiceConfig { kind: backend.kind(), endpoints: endpoints.clone(), ..Default::default() });
        sc.state_dir = data.join("sidecar");
        let sidecar = Sidecar::new(sc.validate()?)?;
        tasks.push(tokio::spawn(crate::sidecar::serve_metrics(metrics_listener, sidecar.clone(), until_stopped())));
        tasks.push(tokio::spawn(crate::sidecar::serve(sc_listener, sidecar, until_stopped())));

        if backend == LockService::Fencegate {
            let client = fencegate_client::Client::new(endpoints.clone())?;
            client.read("dev/ready").await.context("the lock cluster did not elect a leader")?;
        }
        Ok(Stack {
            endpoints,
            inventory_url: format!("http://{inv_addr}"),
            sidecar_url: format!("http://{sc_addr}"),
            metrics_url: format!("http://{metrics_addr}/metrics"),
            inventory,
            backend,
            nodes,
            etcd,
            stop,
            tasks,
        })
    }

    /// Stop serving and shut the nodes down.
    pub(super) async fn stop(self) {
        for n in &self.nodes {
            n.stop_serving();
        }
        self.stop.send_replace(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
        }
        for n in self.nodes {
            n.shutdown().await;
        }
        if let Some(etcd) = self.etcd {
            etcd.stop().await;
        }
    }
}
