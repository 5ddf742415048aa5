//! `fencegate server --config node.yaml`

use std::path::Path;

use crate::config::node::NodeConfig;
use crate::config::{ConfigError, ConfigFile};
use crate::metrics::{RELOAD_APPLIED, RELOAD_REFUSED};
use crate::server::{serve, Listeners, Node};

pub(super) async fn run(path: &Path) -> anyhow::Result<i32> {
    exit_on_panic();
    // Validate everything before binding anything.
    let config = NodeConfig::load(path)?;
    let hangups = Hangups::install();
    let listeners = Listeners::bind(&config).await?;
    let node = Node::start(config).await?;
    let (client, peer) = (listeners.client.local_addr()?, listeners.peer.local_addr()?);
    tracing::info!(id = node.id, listen = %client, peer_listen = %peer, "fencegate node serving");
    let stopping = {
        let node = node.clone();
        async move {
            hangups.until_shutdown(path, &node.reloads, |p| node.reload(p)).await;
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
pub(super) const EXIT_CORE_STOPPED: i32 = 70;

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

/// SIGHUP asks a running process to reload its config file. Installed
/// before anything is bound, so that no SIGHUP ends the process (its default).
pub(super) struct Hangups(tokio::signal::unix::Signal);

impl Hangups {
    pub(super) fn install() -> Hangups {
        let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        Hangups(hup.expect("installing SIGHUP handler"))
    }

    /// Until Ctrl-C or SIGTERM; on every SIGHUP meanwhile, `reload(path)`,
    /// counted in `reloads` and logged: one line, an error naming the file
    /// and the problem if the reload was refused (the running config stays).
    pub(super) async fn until_shutdown(
        mut self,
        path: &Path,
        reloads: &prometheus::IntCounterVec,
        reload: impl Fn(&Path) -> Result<(), ConfigError>,
    ) {
        let stop = shutdown_signal();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = self.0.recv() => match reload(path) {
                    Ok(()) => {
                        reloads.with_label_values(&[RELOAD_APPLIED]).inc();
                        tracing::info!(path = %path.display(), "config reloaded");
                    }
                    Err(e) => {
                        reloads.with_label_values(&[RELOAD_REFUSED]).inc();
                        tracing::error!(path = %path.display(), "config not reloaded, the running one stays: {e}");
                    }
                },
            }
        }
    }
}

/// Ctrl-C or SIGTERM. From then on, a second one exits at once.
pub(super) async fn shutdown_signal() {
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
