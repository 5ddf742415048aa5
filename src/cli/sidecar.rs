//! `fencegate sidecar --config sidecar.yaml`

use std::path::Path;

use tokio::sync::watch;

use super::server::Hangups;
use crate::config::sidecar::SidecarConfig;
use crate::config::ConfigFile;
use crate::http::bind;
use crate::sidecar::{serve, serve_metrics, Sidecar};

pub(super) async fn run(path: &Path) -> anyhow::Result<i32> {
    // Validate everything, TLS files included, before binding anything (a
    // bad file: exit 64); bind every listener before anything is created
    // under state_dir (a taken port: exit 69, no state left behind).
    let config = SidecarConfig::load(path)?;
    let tls = config.load_tls()?;
    let hangups = Hangups::install();
    let listener = bind(config.listen, "listen").await?;
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(bind(addr, "metrics_listen").await?),
        None => None,
    };
    let sidecar = Sidecar::with_tls(config, tls)?;
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
