//! The sidecar: a reverse proxy in front of an unmodified HTTP API that
//! refuses writes carrying stale fencing tokens.
//!
//! One request's phases, each in its own module:
//!
//! ```text
//! accept ─▶ TLS handshake ─▶ framing & limits (here) ─▶ routes::find ─▶ check::Fencer::check ─▶ forward::Upstream::forward ─▶ answer
//!            (tls only)        400/413                    400/404         409/428/400/503         502/504
//! ```
//!
//! A refused request never reaches the upstream; every refusal is counted in
//! `fencegate_sidecar_rejections_total` and logged with route, key, presented
//! and current token.

pub mod answer;
pub mod check;
pub mod fence;
pub mod floors;
pub mod forward;
pub mod knowledge;
pub mod order;
pub mod routes;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::client::Client;
use crate::config::sidecar::{Limits, SidecarConfig};
use crate::http::{Body, BoxError};
use crate::metrics::SidecarMetrics;
use crate::tls::SidecarTls;
use answer::Answer;
use check::Fencer;
use forward::Upstream;
use knowledge::LockView;
use routes::{MatchError, Routes};

pub struct Sidecar {
    pub config: SidecarConfig,
    routes: Routes,
    /// Route name -> upstream base.
    upstreams: HashMap<String, Uri>,
    default_upstream: Uri,
    pub fencer: Fencer,
    upstream: Upstream,
    /// Present when the listener serves HTTPS (`tls`).
    acceptor: Option<TlsAcceptor>,
    pub registry: Registry,
    metrics: SidecarMetrics,
}

impl Sidecar {
    /// Build everything from a validated config: TLS material, routes, floors
    /// (loaded from `state_dir`), the lock service watch if any route needs it.
    pub fn new(config: SidecarConfig) -> anyhow::Result<Arc<Sidecar>> {
        // TLS files first, before anything is opened or started: a missing or
        // bad file is a configuration error (exit 64) like a bad field.
        let tls = SidecarTls::load(&config)?;
        let acceptor = tls.server.map(|c| TlsAcceptor::from(Arc::new(c)));
        let routes = Routes::build(&config.routes)?;
        let parse = |u: &str| -> anyhow::Result<Uri> { u.parse().with_context(|| format!("upstream {u:?}")) };
        let default_upstream = parse(&config.upstream)?;
        let mut upstreams = HashMap::new();
        for r in routes.iter() {
            if let Some(u) = &r.upstream {
                upstreams.insert(r.name.clone(), parse(u)?);
            }
        }
        let registry = Registry::new();
        let metrics = SidecarMetrics::new(&registry)?;
        let needs_service = routes.iter().any(|r| r.fence.needs_lock_service());
        let view = match (&config.lock_service, needs_service) {
            (Some(ls), true) => {
                let client = Client::new(ls.endpoints.clone())?;
                Some(LockView::start(client, ls.endpoints.clone(), metrics.clone()))
            }
            _ => None,
        };
        let floors = floors::Floors::open(&config.state_dir)?;
        tracing::info!(keys = floors.len(), dir = %config.state_dir.display(), "floors loaded");
        let fencer = Fencer { view, floors, order: Arc::default() };
        Ok(Arc::new(Sidecar {
            config,
            routes,
            upstreams,
            default_upstream,
            fencer,
            upstream: Upstream::new(tls.upstream),
            acceptor,
            registry,
            metrics,
        }))
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let arrived = Instant::now();
        if let Err(a) = self.check_framing(&req) {
            return self.answer("-", None, a);
        }
        let matched = match self.routes.find(req.method(), req.uri().path()) {
            Ok(m) => m,
            Err(e) => {
                let a = match e {
                    MatchError::NoRoute => Answer::NoRoute,
                    MatchError::MalformedPath(m) => Answer::BadRequest { error: "malformed_path", message: m },
                    e @ MatchError::InvalidKey { .. } => {
                        Answer::BadRequest { error: "invalid_key", message: e.to_string() }
                    }
                };
                return self.answer("-", None, a);
            }
        };
        let route = matched.route;
        let name = route.name.as_str();
        let permit = match &matched.key {
            Some(key) => {
                let checked = self.fencer.check(route, key, req.headers(), arrived).await;
                self.metrics.fence_wait.with_label_values(&[name]).observe(arrived.elapsed().as_secs_f64());
                match checked {
                    Ok(p) => p,
                    Err(a) => return self.answer(name, Some(key), a),
                }
            }
            None => None,
        };
        let limit = self.config.limits.max_body;
        let (parts, body) = req.into_parts();
        let body = Limited::new(body, limit as usize).map_err(|e| -> BoxError { e }).boxed();
        let base = self.upstreams.get(name).unwrap_or(&self.default_upstream);
        let started = Instant::now();
        let tls = self.config.tls.is_some();
        let result = self.upstream.forward(base, Request::from_parts(parts, body), peer, tls, route.timeout).await;
        self.metrics.upstream_duration.with_label_values(&[name]).observe(started.elapsed().as_secs_f64());
        match (&result, permit) {
            // The exchange broke after the request may have reached the
            // upstream, which may still apply it: keep higher tokens waiting
            // until the route's timeout, as if it had never answered (S1).
            (Err(Answer::UpstreamFailed(_)), Some(permit)) => {
                let until = started + route.timeout;
                tokio::spawn(async move {
                    tokio::time::sleep_until(until).await;
                    drop(permit);
                });
            }
            // Answered, timed out, or never sent: higher tokens may go.
            (_, permit) => drop(permit),
        }
        match result {
            Ok(resp) => {
                self.metrics.requests.with_label_values(&[name, "forwarded"]).inc();
                resp
            }
            Err(a) => self.answer(name, matched.key.as_deref(), a),
        }
    }

    /// S6: framing that two HTTP implementations could read differently never
    /// reaches the upstream.
    fn check_framing(&self, req: &Request<Incoming>) -> Result<(), Answer> {
        // Methods are case-sensitive in HTTP, but some upstreams upper-case
        // them: `put` must not slip past a route fenced for `PUT`.
        if req.method().as_str().bytes().any(|b| b.is_ascii_lowercase()) {
            return Err(Answer::BadRequest { error: "malformed_method", message: "methods must be upper case".into() });
        }
        let h = req.headers();
        let lengths = h.get_all(CONTENT_LENGTH).iter().count();
        let ambiguous = |m: &str| Answer::BadRequest { error: "ambiguous_framing", message: m.to_string() };
        if lengths > 1 {
            return Err(ambiguous("more than one Content-Length"));
        }
        if lengths == 1 && h.contains_key(TRANSFER_ENCODING) {
            return Err(ambiguous("both Content-Length and Transfer-Encoding"));
        }
        // hyper decodes `chunked` and drops Content-Length next to it; any
        // other coding would reach the upstream undeclared, since
        // Transfer-Encoding is hop-by-hop.
        let codings: Vec<_> = h.get_all(TRANSFER_ENCODING).iter().collect();
        if !codings.is_empty() && (codings.len() > 1 || !codings[0].as_bytes().eq_ignore_ascii_case(b"chunked")) {
            return Err(ambiguous("Transfer-Encoding other than a single `chunked`"));
        }
        if let Some(len) = h.get(CONTENT_LENGTH) {
            let len: u64 =
                len.to_str().ok().and_then(|s| s.parse().ok()).ok_or_else(|| ambiguous("bad Content-Length"))?;
            if len > self.config.limits.max_body {
                return Err(Answer::TooLarge { limit: self.config.limits.max_body });
            }
        }
        Ok(())
    }

    fn answer(&self, route: &str, key: Option<&str>, a: Answer) -> Response<Body> {
        self.metrics.requests.with_label_values(&[route, a.outcome()]).inc();
        match &a {
            Answer::Rejected(r) => {
                self.metrics.rejections.with_label_values(&[route, r.reason.as_str()]).inc();
                let current = r.current.unwrap_or_else(|| self.fencer.current(&r.key));
                tracing::warn!(route, key = %r.key, presented = ?r.token, current, reason = r.reason.as_str(), "rejected");
            }
            other => tracing::info!(route, key = ?key, status = %other.status(), "refused: {other:?}"),
        }
        a.into_response(route)
    }
}

/// Serve the proxy on `listener` (HTTP/1.1 and HTTP/2, over TLS when `tls` is
/// set) until `shutdown`.
pub async fn serve(listener: TcpListener, sidecar: Arc<Sidecar>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let limits = sidecar.config.limits.clone();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => { tracing::warn!("accept: {e}"); continue; }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let sc = sidecar.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let Some(acceptor) = sc.acceptor.clone() else {
                return serve_connection(stream, sc, peer, &limits).await;
            };
            // In the connection's own task, so a client that stalls its
            // handshake holds up nobody else; bounded like a slow request head.
            match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => serve_connection(tls, sc, peer, &limits).await,
                Ok(Err(e)) => tracing::debug!("TLS handshake with {peer}: {e}"),
                Err(_) => tracing::debug!("TLS handshake with {peer}: timed out after {:?}", limits.header_timeout),
            }
        });
    }
}

/// One client connection (plain TCP or TLS), HTTP/1.1 or HTTP/2.
async fn serve_connection<I>(io: I, sc: Arc<Sidecar>, peer: SocketAddr, limits: &Limits)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        // Its own task: if the client goes away, hyper drops this future,
        // but the request (and its ordering permit, S1) must live until the
        // upstream has answered or timed out.
        let task = tokio::spawn(sc.clone().handle(req, peer));
        async move {
            Ok::<_, Infallible>(
                task.await.unwrap_or_else(|e| Answer::Internal(format!("request task failed: {e}")).into_response("-")),
            )
        }
    });
    // `auto` tells the two apart by the HTTP/2 preface, so an ALPN `h2`
    // connection needs nothing special.
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // Without a timer hyper's header timeout does nothing.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes as usize);
    builder.http2().timer(TokioTimer::new()).max_header_list_size(limits.max_header_bytes as u32);
    if let Err(e) = builder.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!("connection from {peer}: {e}");
    }
}

/// Serve `/metrics` (and `/healthz`) on the metrics listener.
pub async fn serve_metrics(listener: TcpListener, registry: Registry, shutdown: impl Future<Output = ()>) {
    crate::http::serve_http1(listener, shutdown, move |req: Request<Incoming>| {
        std::future::ready(crate::metrics::respond(&registry, req.uri().path()))
    })
    .await
}
