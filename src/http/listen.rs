//! Binding a listener, with an error that names what could not listen
//! where: `cli::exit` gives it its own status (69), distinct from a bad
//! configuration (64). Every process binds all its listeners before it
//! creates anything on disk, so a taken port leaves no state behind.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// A listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what}): {cause}")]
pub(crate) struct CannotListen {
    /// The config field or role, e.g. `listen`, `metrics_listen`.
    pub what: String,
    pub addr: SocketAddr,
    // Not `source`: it is in the message already, and `{:#}` would print it twice.
    cause: std::io::Error,
}

impl CannotListen {
    pub(crate) fn new(what: impl Into<String>, addr: SocketAddr, cause: std::io::Error) -> Self {
        Self { what: what.into(), addr, cause }
    }
}

/// Bind `addr` for `what` (named in the error).
pub(crate) async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, CannotListen> {
    TcpListener::bind(addr).await.map_err(|e| CannotListen::new(what, addr, e))
}
