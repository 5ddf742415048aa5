//! `fencegate sidecar --config sidecar.yaml`

use std::path::Path;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::server::Hangups;
use crate::config::sidecar::SidecarConfig;
use crate::config::ConfigFile;
use crate::sidecar::{serve, serve_metrics, Sidecar};

pub async fn run(path: &Path) -> anyhow::Result<i32> {
    // Validate everything, TLS files included, before binding anything.
    let config = SidecarConfig::load(path)?;
    let hangups = Hangups::install();
    let (listen, metrics_listen) = (config.listen, config.metrics_listen);
    let sidecar = Sidecar::new(config)?;
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let metrics_listener = match metrics_listen {
        Some(addr) => Some(TcpListener::bind(addr).await.with_context(|| format!("binding metrics_listen {addr}"))?),
        None => None,
    };
    let (stop, stopped) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    if let Some(l) = metrics_listener {
        tracing::info!(listen = %l.local_addr()?, "sidecar metrics");
        tokio::spawn(serve_metrics(l, sidecar.clone(), wait(stopped.clone())));
    }
    let live = sidecar.live();
    let (upstream, tls) = (&live.settings.upstream, live.settings.tls.is_some());
    tracing::info!(listen = %listener.local_addr()?, %upstream, tls, "fencegate sidecar serving");
    let proxy = tokio::spawn(serve(listener, sidecar.clone(), wait(stopped)));
    hangups.until_shutdown(path, &sidecar.metrics.config_reloads, |p| sidecar.reload(p)).await;
    tracing::info!("shutting down");
    stop.send_replace(true);
    let _ = proxy.await;
    Ok(0)
}
