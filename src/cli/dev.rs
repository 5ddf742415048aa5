//! `fencegate dev`: the embedded default — a 3-node lock cluster in one
//! process on the well-known local ports 7401–7403.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::client::Client;
use crate::config::node::{LeaseConfig, NodeConfig, RaftConfig};
use crate::server::{serve, Node};

pub const DEV_NODES: [(u64, u16); 3] = [(1, 7401), (2, 7402), (3, 7403)];

pub async fn run(data: &Path, fresh: bool) -> anyhow::Result<i32> {
    if fresh && data.exists() {
        std::fs::remove_dir_all(data).with_context(|| format!("removing {}", data.display()))?;
    }
    let peers: BTreeMap<u64, String> =
        DEV_NODES.iter().map(|(id, port)| (*id, format!("http://127.0.0.1:{port}"))).collect();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut nodes = vec![];
    let mut servers = vec![];
    for (id, port) in DEV_NODES {
        let config = NodeConfig {
            id,
            listen: ([127, 0, 0, 1], port).into(),
            data_dir: data.join(format!("node{id}")),
            peers: peers.clone(),
            lease: LeaseConfig::default(),
            raft: RaftConfig::default(),
        };
        config.validate()?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {} (is another `fencegate dev` running?)", config.listen))?;
        let node = Node::start(config).await?;
        let mut stop = stop_rx.clone();
        servers.push(tokio::spawn(serve(listener, node.clone(), async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
        nodes.push(node);
    }
    let client = Client::new(peers.values().cloned().collect())?;
    client.read("dev/ready").await.context("the dev cluster did not elect a leader")?;
    print_banner(data);

    super::server::shutdown_signal().await;
    eprintln!("\nstopping …");
    stop_tx.send_replace(true);
    for s in servers {
        let _ = tokio::time::timeout(Duration::from_secs(2), s).await;
    }
    for n in nodes {
        n.shutdown().await;
    }
    Ok(0)
}

fn print_banner(data: &Path) {
    let data: PathBuf = data.to_path_buf();
    println!(
        "fencegate dev is running
  lock service  http://127.0.0.1:7401  http://127.0.0.1:7402  http://127.0.0.1:7403
  data          {} (kept between runs; --fresh wipes it)

try, in another terminal:
  fencegate status
  curl -s -XPOST localhost:7401/v1/locks/rack/42 -d '{{\"ttl_ms\":30000,\"holder\":\"me\"}}'
  fencegate status rack/42
  curl -sN 'localhost:7401/v1/watch?prefix=rack/'

Ctrl-C stops everything.",
        data.display()
    );
}
