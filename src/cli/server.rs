//! `fencegate server --config node.yaml`

use std::path::Path;

use crate::config::node::NodeConfig;
use crate::config::ConfigFile;
use crate::server::{serve, Listeners, Node};

pub async fn run(path: &Path) -> anyhow::Result<i32> {
    exit_on_panic();
    // Validate everything before binding anything.
    let config = NodeConfig::load(path)?;
    let listeners = Listeners::bind(&config).await?;
    let node = Node::start(config).await?;
    let (client, peer) = (listeners.client.local_addr()?, listeners.peer.local_addr()?);
    tracing::info!(id = node.id, listen = %client, peer_listen = %peer, "fencegate node serving");
    let stopping = {
        let node = node.clone();
        async move {
            shutdown_signal().await;
            tracing::info!("shutting down: draining requests in flight (a second signal exits at once)");
            crate::server::members::step_down(&node).await;
            node.stop_serving();
        }
    };
    tokio::select! {
        () = serve(listeners, node.clone(), stopping) => {}
        // A node whose Raft core stopped (a panic, a storage error such as a
        // full disk) cannot serve: exit so that a supervisor restarts it,
        // which recovers from the durable log once the cause is gone.
        reason = node.core_stopped() => {
            tracing::error!("the Raft core stopped: {reason}; exiting");
            return Ok(EXIT_CORE_STOPPED);
        }
    }
    node.shutdown().await;
    Ok(0)
}

/// Exit status when the Raft core stopped (EX_SOFTWARE).
pub const EXIT_CORE_STOPPED: i32 = 70;

/// A panic anywhere in a node is fatal: a task that died (a request
/// batcher, a replication stream) would leave a node that looks alive and
/// refuses everything. Exit as a stopped core does, for the supervisor to
/// restart the node from its durable log.
fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        tracing::error!("panic: {info}; exiting");
        std::process::exit(EXIT_CORE_STOPPED);
    }));
}

/// Ctrl-C or SIGTERM. From then on, a second one exits at once.
pub async fn shutdown_signal() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("fencegate: second signal, exiting without draining");
        std::process::exit(130);
    });
}
