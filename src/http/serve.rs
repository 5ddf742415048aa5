//! The one accept loop, used by every listener: the node API, the sidecar
//! (TLS, HTTP/2), the metrics listener and the demo inventory.
//!
//! Each connection runs in its own task; request heads are bounded in size
//! and time (a slowloris cannot hold a connection open forever); a failing
//! `accept` (out of descriptors) backs off instead of spinning. On shutdown
//! the loop stops accepting, asks every connection to finish the requests it
//! has in flight (idle keep-alive connections close at once) and waits for
//! them up to `drain`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::Body;

/// How long a failed `accept` waits before the next: with no descriptors
/// left, accepting again at once would spin a core and flood the log.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How one listener serves its connections.
#[derive(Clone)]
pub struct Listener {
    /// What this listener is, for the logs (`"lock API"`, `"sidecar"`).
    pub name: &'static str,
    /// Longest a client may take to send a request head (or a TLS handshake).
    pub header_timeout: Duration,
    /// Largest request head read (at least 8 KiB: hyper's smallest buffer).
    pub max_header_bytes: usize,
    /// Serve HTTP/2 as well as HTTP/1.1 (told apart by the preface).
    pub http2: bool,
    /// Serve HTTPS with this acceptor.
    pub tls: Option<TlsAcceptor>,
    /// How long shutdown waits for requests in flight.
    pub drain: Duration,
}

impl Listener {
    /// Plain HTTP/1.1 with the default bounds: 10 s and 64 KiB for a request
    /// head, 5 s to drain.
    pub fn http1(name: &'static str) -> Self {
        Listener {
            name,
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 64 << 10,
            http2: false,
            tls: None,
            drain: Duration::from_secs(5),
        }
    }
}

/// Serve `listener` until `shutdown` resolves, then drain. Every request is
/// answered by `handle(request, peer)`.
pub async fn serve<F, Fut>(listener: TcpListener, opts: Listener, shutdown: impl Future<Output = ()>, handle: F)
where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(listener = opts.name, "accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (opts, handle, watcher) = (opts.clone(), handle.clone(), graceful.watcher());
        tokio::spawn(async move {
            let Some(acceptor) = opts.tls.clone() else {
                return connection(stream, peer, &opts, watcher, handle).await;
            };
            // In the connection's own task, so a client that stalls its
            // handshake holds up nobody else; bounded like a slow request head.
            match tokio::time::timeout(opts.header_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => connection(tls, peer, &opts, watcher, handle).await,
                Ok(Err(e)) => tracing::debug!("TLS handshake with {peer}: {e}"),
                Err(_) => tracing::debug!("TLS handshake with {peer}: timed out after {:?}", opts.header_timeout),
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(opts.drain, graceful.shutdown()).await.is_err() {
        tracing::warn!(listener = opts.name, "requests still in flight after {:?}; leaving them", opts.drain);
    }
}

/// One client connection (plain TCP or TLS).
async fn connection<I, F, Fut>(io: I, peer: SocketAddr, opts: &Listener, watcher: Watcher, handle: F)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let answer = handle(req, peer);
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Without a timer hyper's header timeout does nothing.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        .max_buf_size(opts.max_header_bytes);
    builder.http2().timer(TokioTimer::new()).max_header_list_size(opts.max_header_bytes as u32);
    let builder = if opts.http2 { builder } else { builder.http1_only() };
    if let Err(e) = watcher.watch(builder.serve_connection(TokioIo::new(io), service)).await {
        tracing::debug!(listener = opts.name, "connection from {peer}: {e}");
    }
}
