//! `fencegate inventory --listen ADDR`: the demo's legacy inventory API on
//! its own, for a container behind a sidecar (`dev` and `demo` run it built
//! in). It checks no tokens: that is the point of it.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::inventory::Inventory;

pub(super) async fn run(listen: SocketAddr) -> anyhow::Result<i32> {
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    tracing::info!(listen = %listener.local_addr()?, "inventory API serving (legacy: it checks no tokens)");
    crate::inventory::serve(listener, Arc::new(Inventory::default()), super::server::shutdown_signal()).await;
    Ok(0)
}
