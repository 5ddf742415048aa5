//! The sidecar: a reverse proxy in front of an unmodified HTTP API that
//! refuses writes carrying stale fencing tokens.
//!
//! One request's phases, each in its own module:
//!
//! ```text
//! accept ─▶ TLS handshake ─▶ framing & limits (here) ─▶ routing::find ─▶ fencing::Fencer::check ─▶ upstream::Upstream::forward ─▶ answer
//!            (tls only)        400/413                    400/404         409/428/400/503         502/504
//! ```
//!
//! A refused request never reaches the upstream; every refusal is counted in
//! `fencegate_sidecar_rejections_total` (route `-` before a route is
//! chosen), and a fence refusal is logged with route, key, presented and
//! current token.
//!
//! In full (`Sidecar::handle`): framing and disguise checks (method
//! overrides are refused, or taken by `find_overridden` where a route allows
//! them) → `routing` → `fencing` → a fenced body of unannounced length, or a
//! keyed one, read whole → `idempotency::exchange` before → `upstream` →
//! `idempotency::exchange` after → `answer`, all from `SidecarSettings`
//! (`settings`), through the one accept loop (HTTP/1.1 and HTTP/2, TLS).
//! The metrics listener serves `/healthz`, `/readyz` and the admin calls on
//! idempotency records (`idempotency::admin`).
//!
//! The rooms: `routing` (which route, which lock key), `fencing` (the token
//! check, the barrier, what the lock service said), `idempotency` (keys,
//! records, their exchange), `state` (floors and records on disk),
//! `upstream` (forwarding, the connection pool); `settings` and `reload` are
//! the only ones that know the config file. Lower-case methods
//! are refused (400 `malformed_method`), so that `put` cannot slip past a
//! route fenced for `PUT`.

pub(crate) mod answer;
pub(crate) mod fencing;
pub mod idempotency;
pub(crate) mod reload;
pub(crate) mod routing;
pub(crate) mod settings;
pub(crate) mod state;
pub(crate) mod upstream;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use fencegate_client::wire::Problem;
use fencegate_client::Client;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{Request, Response};
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::http::{Body, BoxError, Listener, LiveListener, Workers};
use crate::metrics::{Outcome, SidecarMetrics};
use crate::tls::SidecarTls;
use answer::{Answer, Phase};
use fencing::knowledge::LockView;
use fencing::Fencer;
use reload::Live;
use routing::MatchError;
use settings::SidecarSettings;
use upstream::Upstream;

pub(crate) struct Sidecar {
    /// Routes, upstreams, limits: what a reload replaces (`reload.rs`). Each
    /// request reads it once.
    live: ArcSwap<Live>,
    /// The proxy listener's options (its TLS acceptor, header bounds, the
    /// drain), replaced with `live`; new connections take the current ones.
    listener: LiveListener,
    /// The longest route timeout of every config served so far: a request
    /// of an older config may still hold its permit that long.
    longest_timeout: Mutex<Duration>,
    /// The event loops connections are served on (`workers`; restart-only).
    workers: Workers,
    /// Floors, the lock service's view and the S1 permits, kept across reloads.
    pub fencer: Fencer,
    /// Floors and idempotency records on disk.
    store: Arc<state::Store>,
    records: Arc<idempotency::records::Records>,
    /// SHA-256 of the bearer token admin calls must carry (`state_dir/admin-token`).
    admin_token: [u8; 32],
    pub registry: Registry,
    pub metrics: SidecarMetrics,
}

impl Sidecar {
    /// Build everything from a validated config: TLS material, floors
    /// (loaded from `state_dir`), the lock service watch if any route needs it.
    pub(crate) fn new(settings: SidecarSettings) -> anyhow::Result<Arc<Sidecar>> {
        // TLS files first, before anything is opened or started: a missing or
        // bad file is a configuration error (exit 64) like a bad field.
        let tls = settings.load_tls()?;
        Self::with_tls(settings, tls)
    }

    /// [`Sidecar::new`] with the TLS material of `settings` already loaded
    /// (`fencegate sidecar` loads it before binding its listeners, and
    /// binds them before this creates anything under `state_dir`).
    pub(crate) fn with_tls(settings: SidecarSettings, tls: SidecarTls) -> anyhow::Result<Arc<Sidecar>> {
        let acceptor = tls.server.map(|c| TlsAcceptor::from(Arc::new(c)));
        let registry = Registry::new();
        let metrics = SidecarMetrics::new(&registry)?;
        crate::metrics::process(&registry)?;
        start_at_zero(&metrics, &settings);
        let needs_service = settings.routes.iter().any(|r| r.fence.needs_lock_service());
        let view = match (&settings.lock_service, tls.lock_service, needs_service) {
            (Some(service), Some(options), true) => {
                let client = Client::with_options(service.endpoints.clone(), options)?;
                let probing = settings.routes.iter().any(|r| r.fence.trusts_the_watch());
                Some(LockView::start(client, metrics.clone(), service.max_staleness, probing))
            }
            _ => None,
        };
        let (store, loaded) = state::Store::open(&settings.state_dir)?;
        let store = Arc::new(store);
        let floors = state::floors::Floors::new(store.clone(), loaded.floors);
        let records = Arc::new(idempotency::records::Records::load(
            store.clone(),
            loaded.records,
            settings.limits.idempotency_store,
            idempotency::exchange::now_ms(),
        ));
        let dir = settings.state_dir.display();
        tracing::info!(keys = floors.len(), idempotency_records = records.len(), %dir, "state loaded");
        metrics.idempotency_records.set(records.len() as i64);
        // Always: a reload may add a route with idempotency.
        tokio::spawn(sweep(Arc::downgrade(&records), metrics.clone()));
        let admin_token = crate::auth::token_hash(&idempotency::admin::token(&settings.state_dir)?);
        let fencer = Fencer { view, floors, order: Arc::default() };
        let listener = Arc::new(ArcSwap::from_pointee(listener_options(&settings, acceptor, &metrics)));
        let workers = Workers::start("sidecar", settings.workers)?;
        let upstream = Upstream::new(tls.upstream, settings.workers);
        let sidecar = Sidecar {
            live: ArcSwap::from_pointee(Live { settings, upstream }),
            workers,
            listener,
            longest_timeout: Mutex::default(),
            fencer,
            store,
            records,
            admin_token,
            registry,
            metrics,
        };
        sidecar.note_route_timeouts(&sidecar.live().settings);
        Ok(Arc::new(sidecar))
    }

    /// Remember the longest route timeout of `settings` for the shutdown wait.
    fn note_route_timeouts(&self, settings: &SidecarSettings) {
        let longest = settings.routes.iter().map(|r| r.timeout).max().unwrap_or_default();
        let mut kept = self.longest_timeout.lock().expect("never poisoned");
        *kept = (*kept).max(longest);
    }

    /// One request, phase by phase; every refusal is an [`Answer`]
    /// (`answer.rs` maps it to a status, a body and metric labels):
    ///
    /// ```text
    /// route ──▶ fence check ──▶ take the body ──▶ send ──▶ keep the answer
    /// framing,   S2–S7, an S1     stream it, or read    decide again    the idempotency
    /// overrides, permit           it whole and begin    (S3), forward,  record's answer
    /// route, key (`Fencer`)       its record (I1)       free the permit (`exchange`)
    /// ```
    ///
    /// The phases after the route are written out here rather than as
    /// `async fn`s of their own, which hand the request and its body from
    /// one future to the next: split so, the cached path measured 1.45 %
    /// more instructions per request than before the split, written out
    /// 0.5–0.8 % (`bench/instructions.rs`, one repetition per run, which
    /// vary by about 0.7 %).
    async fn handle(self: Arc<Self>, req: Request<Incoming>, conn: crate::http::Conn) -> Response<Body> {
        let arrived = Instant::now();
        // Read once: this request finishes on the config it started with.
        let live = self.live();
        let limits = &live.settings.limits;
        let (matched, overridden) = match route(&live, &req) {
            Ok(found) => found,
            Err(a) => return self.answer("-", None, a),
        };
        let route = matched.route;
        let name = route.name.as_str();
        let mut cleared = match &matched.key {
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
        let (mut parts, body) = req.into_parts();
        let idempotency_key = match (&route.idempotency, &matched.key) {
            (Some(policy), Some(key)) => match idempotency::exchange::key_of(policy, &parts.headers) {
                Ok(k) => k,
                Err(a) => return self.answer(name, Some(key), a),
            },
            _ => None,
        };
        let body = crate::http::Deadline::new(body, arrived, limits.body_timeout);
        let mut keyed = None;
        let body =
            if idempotency_key.is_some() || (matched.key.is_some() && !parts.headers.contains_key(CONTENT_LENGTH)) {
                // A fenced write of unannounced length (chunked, or HTTP/2
                // without Content-Length) is read whole first: one over the
                // limit is refused before the upstream sees any of it, never
                // cut off half-way through a write the upstream may apply. So is
                // a request with an idempotency key: its fingerprint covers it.
                let bytes = match read_whole(body, route, limits.max_body).await {
                    Ok(b) => b,
                    Err(a) => return self.answer(name, matched.key.as_deref(), a),
                };
                if let (Some(key), Some(policy), Some(lock_key)) = (&idempotency_key, route.idempotency, &matched.key) {
                    let request = idempotency::exchange::Request {
                        route: name,
                        timeout: route.timeout,
                        lock_key,
                        key,
                        // What the upstream takes it as: two overrides are two requests.
                        method: overridden.as_ref().unwrap_or(&parts.method).as_str(),
                        path_and_query: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
                        headers: &parts.headers,
                        body: &bytes,
                        token: fencing::decision::parse_token(&parts.headers).ok().flatten().unwrap_or(0),
                        // Named once per connection, and only for keyed requests.
                        identity: conn.leaf().and_then(|cert| {
                            conn.named.get_or_init(|| crate::tls::identity::client_name(cert)).as_deref()
                        }),
                    };
                    match idempotency::exchange::begin(&self.records, &self.metrics, policy, request).await {
                        Ok(idempotency::exchange::Begun::Forward(k)) => keyed = Some(k),
                        Ok(idempotency::exchange::Begun::Answered(resp)) => {
                            self.metrics.request(name, Outcome::Replayed);
                            return resp;
                        }
                        Err(a) => return self.answer(name, Some(lock_key), a),
                    }
                }
                parts.headers.insert(CONTENT_LENGTH, bytes.len().into());
                http_body_util::Full::new(bytes).map_err(|e| -> BoxError { match e {} }).boxed()
            } else {
                Limited::new(body, limits.max_body as usize).map_err(|e| -> BoxError { e }).boxed()
            };
        // Decided again here, after the floor's fsync, a buffered body and
        // an idempotency record: those may take longer than the knowledge
        // the check stood on stays vouched for (`max_staleness`).
        let dispatched = match &mut cleared {
            Some(c) => self.fencer.dispatch(c).await,
            None => Ok(()),
        };
        let started = Instant::now();
        let tls = live.settings.tls.is_some();
        let req = Request::from_parts(parts, body);
        let result = match dispatched {
            Ok(()) => {
                let r = live
                    .upstream
                    .forward(&route.upstream, req, &conn.ip, tls, route.timeout, limits.send_timeout)
                    .await;
                self.metrics.upstream_duration.with_label_values(&[name]).observe(started.elapsed().as_secs_f64());
                r
            }
            Err(a) => Err(a),
        };
        match (&result, cleared.map(|c| c.permit)) {
            // The exchange broke after the request may have reached the
            // upstream, which may still apply it: keep higher tokens waiting
            // until the route's timeout, as if it had never answered (S1).
            (Err(a), Some(permit)) if a.may_have_reached_upstream() => {
                let until = started + route.timeout;
                tokio::spawn(async move {
                    tokio::time::sleep_until(until).await;
                    drop(permit);
                });
            }
            // Answered, timed out, or never sent: higher tokens may go.
            (_, permit) => drop(permit),
        }
        let result = match keyed {
            Some(k) => idempotency::exchange::finish(&self.metrics, name, k, result).await,
            None => result,
        };
        match result {
            Ok(resp) => {
                self.metrics.request(name, Outcome::Forwarded);
                resp
            }
            Err(a) => self.answer(name, matched.key.as_deref(), a),
        }
    }

    fn answer(&self, route: &str, key: Option<&str>, a: Answer) -> Response<Body> {
        match a.reason() {
            Some(reason) => self.metrics.refusal(route, reason),
            None => self.metrics.request(route, a.outcome()),
        }
        match &a {
            Answer::Rejected(r) => {
                let current = r.current.unwrap_or_else(|| self.fencer.current(&r.key));
                tracing::warn!(route, key = %r.key, presented = r.token, current, reason = r.reason.as_str(), "rejected");
            }
            other => {
                tracing::info!(route, key, status = %other.status(), cause = other.cause().as_str(), "refused: {other}")
            }
        }
        a.into_response(route)
    }
}

/// The route phase: the request's framing, its method overrides, and the
/// route (and lock key) it takes; refused here, nothing was asked or read.
fn route<'a>(live: &'a Live, req: &Request<Incoming>) -> Result<(routing::Matched<'a>, Option<hyper::Method>), Answer> {
    let routes = &live.settings.routes;
    check_framing(req, live.settings.limits.max_body)?;
    let overridden = method_override(req.headers(), req.uri().query())
        .map_err(|message| Answer::BadRequest { error: Problem::DisguisedRequest, message })?;
    let found = match &overridden {
        None => routes.find(req.method(), req.uri().path()),
        Some(effective) => routes.find_overridden(req.method(), effective, req.uri().path()),
    };
    let matched = found.map_err(|e| match e {
        MatchError::NoRoute => Answer::NoRoute,
        MatchError::MalformedPath(m) => Answer::BadRequest { error: Problem::MalformedPath, message: m },
        e @ MatchError::InvalidKey { .. } => Answer::BadRequest { error: Problem::InvalidKey, message: e.to_string() },
        e @ MatchError::BadParam { .. } => Answer::BadRequest { error: Problem::InvalidParam, message: e.to_string() },
        e @ MatchError::UnfencedWrite { .. } => {
            Answer::BadRequest { error: Problem::UnfencedWrite, message: e.to_string() }
        }
        e @ MatchError::MethodOverride { .. } => {
            Answer::BadRequest { error: Problem::DisguisedRequest, message: e.to_string() }
        }
    })?;
    Ok((matched, overridden))
}

/// The whole body, within `limit` (`max_body`), `limits.body_timeout` (its
/// `Deadline`) and the route's timeout.
async fn read_whole(
    body: crate::http::Deadline<Incoming>,
    route: &routing::Route,
    limit: u64,
) -> Result<bytes::Bytes, Answer> {
    match tokio::time::timeout(route.timeout, crate::http::read_body(body, limit as usize)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(crate::http::BodyError::TooLarge(_))) => Err(Answer::TooLarge { limit }),
        Ok(Err(crate::http::BodyError::Read(e))) if e.is::<crate::http::BodyTimedOut>() => {
            Err(Answer::BadRequest { error: Problem::BodyTimeout, message: e.to_string() })
        }
        Ok(Err(e)) => Err(Answer::BadRequest { error: Problem::AmbiguousFraming, message: e.to_string() }),
        Err(_) => {
            let message = format!(
                "the body did not arrive within the route's timeout ({})",
                humantime::format_duration(route.timeout)
            );
            Err(Answer::BadRequest { error: Problem::BodyTimeout, message })
        }
    }
}

/// S6: framing that two HTTP implementations could read differently never
/// reaches the upstream.
fn check_framing(req: &Request<Incoming>, max_body: u64) -> Result<(), Answer> {
    // Methods are case-sensitive in HTTP, but some upstreams upper-case
    // them: `put` must not slip past a route fenced for `PUT`.
    if req.method().as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(Answer::BadRequest {
            error: Problem::MalformedMethod,
            message: "methods must be upper case".into(),
        });
    }
    let h = req.headers();
    if let Some(why) = disguise(h) {
        return Err(Answer::BadRequest { error: Problem::DisguisedRequest, message: why });
    }
    let lengths = h.get_all(CONTENT_LENGTH).iter().count();
    let ambiguous = |m: &str| Answer::BadRequest { error: Problem::AmbiguousFraming, message: m.to_string() };
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
        let len: u64 = len.to_str().ok().and_then(|s| s.parse().ok()).ok_or_else(|| ambiguous("bad Content-Length"))?;
        if len > max_body {
            return Err(Answer::TooLarge { limit: max_body });
        }
    }
    Ok(())
}

/// Serve the proxy on `listener` (HTTP/1.1 and HTTP/2, over TLS when `tls` is
/// set) until `shutdown`, then drain.
pub(crate) async fn serve(listener: TcpListener, sidecar: Arc<Sidecar>, shutdown: impl Future<Output = ()>) {
    let order = sidecar.fencer.order.clone();
    let (opts, kept) = (sidecar.listener.clone(), sidecar.clone());
    let workers = Some(&kept.workers);
    crate::http::serve_on(listener, opts, workers, shutdown, move |req, conn: crate::http::Conn| {
        // Its own task: if the client goes away, hyper drops this future,
        // but the request (and its ordering permit, S1) must live until the
        // upstream has answered or timed out.
        // Boxed: the task then moves a pointer, not the whole (large)
        // future, each time tokio moves its stage (five times a request).
        let task = tokio::spawn(Box::pin(sidecar.clone().handle(req, conn)));
        let sc = sidecar.clone();
        async move {
            task.await.unwrap_or_else(|e| sc.answer("-", None, Answer::Internal(format!("request task failed: {e}"))))
        }
    })
    .await;
    let longest = *kept.longest_timeout.lock().expect("never poisoned");
    // Requests dispatched upstream hold ordering permits until the upstream
    // answers or their route times out, even past a broken exchange: wait
    // for them, so that no higher token can be dispatched (by a restarted
    // sidecar) while an older write may still be applied.
    if order.busy_keys() > 0 {
        tracing::info!(
            keys = order.busy_keys(),
            "waiting for fenced requests in flight (at most {})",
            humantime::format_duration(longest)
        );
    }
    if tokio::time::timeout(longest, order.idle()).await.is_err() {
        tracing::warn!("fenced requests still in flight after {}; exiting anyway", humantime::format_duration(longest));
    }
}

/// Headers by which frameworks and proxies take a request for another path
/// (or, set by a proxy in front, another method) than the one routed (IIS
/// URL rewrite, Symfony, nginx setups): refused on every route.
static REWRITES: [HeaderName; 4] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-original-method"),
    HeaderName::from_static("x-override-url"),
];

/// Headers by which method-override middleware (Express, Rails, Spring,
/// ASP.NET) takes a request for another method; and the `_method` query
/// parameter. Taken only on routes that allow them (`find_overridden`).
static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The method a request asks the upstream to take it as, if it asks (by
/// header or `_method`, upper-cased as middleware does); `Err` if it asks
/// for two, or for something that is not a method.
fn method_override(h: &hyper::HeaderMap, query: Option<&str>) -> Result<Option<hyper::Method>, String> {
    let headers = METHOD_OVERRIDES.iter().flat_map(|n| h.get_all(n).iter().map(|v| v.as_bytes()));
    let params = query.into_iter().flat_map(|q| q.split('&')).filter_map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        k.eq_ignore_ascii_case("_method").then_some(v.as_bytes())
    });
    let mut asked: Option<Vec<u8>> = None;
    for value in headers.chain(params) {
        let value = value.trim_ascii().to_ascii_uppercase();
        match &asked {
            Some(first) if *first != value => return Err("the request asks for two method overrides".into()),
            _ => asked = Some(value),
        }
    }
    match asked {
        None => Ok(None),
        Some(m) => hyper::Method::from_bytes(&m)
            .map(Some)
            .map_err(|_| format!("method override {:?} is not a method", String::from_utf8_lossy(&m))),
    }
}

/// Why a request may reach the upstream as another path than the one
/// routed, if it may: the route (and the fence) would then judge the wrong
/// request. Also a `Connection` header naming `X-Fence-Token`, which would
/// have the token checked here and dropped before the upstream.
fn disguise(h: &hyper::HeaderMap) -> Option<String> {
    if let Some(name) = REWRITES.iter().find(|n| h.contains_key(*n)) {
        return Some(format!("{name} would make the upstream take this request as another one"));
    }
    let named = h.get_all(hyper::header::CONNECTION).iter().flat_map(|v| v.as_bytes().split(|b| *b == b','));
    for name in named {
        if name.trim_ascii().eq_ignore_ascii_case(fencegate_client::TOKEN_HEADER.as_bytes()) {
            return Some("Connection names X-Fence-Token: the upstream would not get the token checked here".into());
        }
    }
    None
}

/// Drop expired idempotency records every few seconds, for as long as the
/// sidecar lives.
async fn sweep(records: std::sync::Weak<idempotency::records::Records>, metrics: SidecarMetrics) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        every.tick().await;
        let Some(records) = records.upgrade() else { return };
        match records.expire(idempotency::exchange::now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(expired = n, left = records.len(), "idempotency records expired"),
            Err(e) => tracing::warn!("expiring idempotency records: {e}"),
        }
        metrics.idempotency_records.set(records.len() as i64);
    }
}

/// Every series the routes of `settings` (and route `-`, for refusals
/// before a route is chosen) can count, at 0: at start-up and for the
/// routes a reload brings.
fn start_at_zero(metrics: &SidecarMetrics, settings: &SidecarSettings) {
    metrics.start_at_zero("-", answer::refusals(Phase::Unrouted), false);
    for r in settings.routes.iter() {
        metrics.start_at_zero(&r.name, answer::refusals(Phase::Routed), r.idempotency.is_some());
        if r.fence.needs_lock_service() {
            metrics.stale_knowledge_reads.with_label_values(&[&r.name]);
        }
    }
}

/// The JSON body of hyper's own refusals of a request head, counted like the
/// sidecar's own (route `-`, outcome `rejected`, reason its `error`).
fn refusal_body(metrics: SidecarMetrics, max_header_bytes: u64) -> crate::http::RefusalBody {
    Arc::new(move |status| {
        let (error, message) = match status {
            400 => (
                Problem::MalformedRequest,
                "the request head is malformed or its framing ambiguous (differing Content-Lengths, an unknown \
                 Transfer-Encoding, line folding, a malformed header line)"
                    .to_string(),
            ),
            431 => (Problem::HeadersTooLarge, format!("the request head is over {max_header_bytes} bytes")),
            414 => (Problem::UriTooLong, "the request target is too long".to_string()),
            _ => return None,
        };
        metrics.refusal("-", error.as_str());
        let body = fencegate_client::wire::ProblemBody { error, route: Some("-".into()), message: Some(message) };
        let mut json = serde_json::to_vec(&body).ok()?;
        json.push(b'\n');
        Some(json)
    })
}

/// The proxy listener's options under `settings`, serving HTTPS with
/// `acceptor` if there is one.
fn listener_options(settings: &SidecarSettings, acceptor: Option<TlsAcceptor>, metrics: &SidecarMetrics) -> Listener {
    let limits = &settings.limits;
    Listener {
        name: "sidecar",
        header_timeout: limits.header_timeout,
        max_header_bytes: limits.max_header_bytes as usize,
        http2: true,
        tls: acceptor,
        // For answers to reach their clients; what S1 needs is waited for
        // after it (`serve`).
        drain: limits.drain_timeout,
        max_connections: limits.max_connections,
        refusal_body: Some(refusal_body(metrics.clone(), limits.max_header_bytes)),
        send_timeout: limits.send_timeout,
    }
}

/// Serve the metrics listener: `/metrics`; `/healthz` (liveness: 503 while
/// the floor store cannot be written, which a restart may cure); `/readyz`
/// (readiness: 503 unless the sidecar can fence now: the floor store
/// writable and, if a route needs it, the watch of the lock service live).
pub(crate) async fn serve_metrics(listener: TcpListener, sidecar: Arc<Sidecar>, shutdown: impl Future<Output = ()>) {
    let opts = crate::http::Listener::http1("metrics");
    crate::http::serve(listener, opts, shutdown, move |req: Request<Incoming>, _| {
        let sidecar = sidecar.clone();
        async move {
            match req.uri().path().strip_prefix("/admin/idempotency/") {
                Some(action) => {
                    let action = action.to_string();
                    sidecar.admin(&action, req).await
                }
                None => sidecar.probe(req.uri().path()).await,
            }
        }
    })
    .await
}

impl Sidecar {
    async fn probe(&self, path: &str) -> Response<Body> {
        if path == "/metrics" {
            if let Some(view) = &self.fencer.view {
                self.metrics.knowledge_age.set(view.age(tokio::time::Instant::now()).as_secs_f64());
            }
            return crate::metrics::exposition(&self.registry);
        }
        if path != "/healthz" && path != "/readyz" {
            let body = serde_json::json!({"error": "not_found"});
            return crate::http::refusal(hyper::StatusCode::NOT_FOUND, crate::http::Cause::Client, &body);
        }
        let watch_down = self.fencer.view.as_ref().is_some_and(|v| !v.is_up());
        let trouble = if self.store.is_broken() && !self.store.probe().await {
            Some("the floor store cannot be written")
        } else if path == "/readyz" && watch_down {
            Some("the lock service watch is down")
        } else {
            None
        };
        match trouble {
            None => Response::new(crate::http::full("ok\n")),
            Some(why) => {
                let mut resp = Response::new(crate::http::full(format!("{why}\n")));
                *resp.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                resp
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hyper::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> hyper::HeaderMap {
        let mut h = hyper::HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn requests_in_disguise_are_named() {
        for pairs in [
            vec![("X-Original-URL", "/racks/42")],
            vec![("X-Rewrite-URL", "/racks/42")],
            vec![("x-original-method", "PUT")],
            vec![("Connection", "close, X-Fence-Token")],
            vec![("Connection", "keep-alive"), ("Connection", " x-fence-token ")],
        ] {
            assert!(disguise(&headers(&pairs)).is_some(), "{pairs:?}");
        }
        for pairs in [vec![("Connection", "close"), ("X-Fence-Token", "7")], vec![("X-Forwarded-For", "10.0.0.1")]] {
            assert!(disguise(&headers(&pairs)).is_none(), "{pairs:?}");
        }
    }

    #[test]
    fn method_overrides_are_read_as_middleware_reads_them() {
        use hyper::Method;
        for (pairs, query, want) in [
            (vec![("X-HTTP-Method-Override", "PUT")], None, Ok(Some(Method::PUT))),
            (vec![("x-http-method", "delete")], None, Ok(Some(Method::DELETE))),
            (vec![("X-Method-Override", " patch ")], None, Ok(Some(Method::PATCH))),
            (vec![], Some("a=1&_METHOD=put"), Ok(Some(Method::PUT))),
            (vec![("X-HTTP-Method-Override", "PUT")], Some("_method=PUT"), Ok(Some(Method::PUT))),
            (vec![], Some("method=PUT&x_method=1"), Ok(None)),
            (vec![], None, Ok(None)),
        ] {
            assert_eq!(method_override(&headers(&pairs), query), want, "{pairs:?} {query:?}");
        }
        for (pairs, query) in [
            (vec![("X-HTTP-Method-Override", "PUT"), ("X-HTTP-Method-Override", "DELETE")], None),
            (vec![("X-HTTP-Method-Override", "PUT")], Some("_method=DELETE")),
            (vec![], Some("_method=P(T")),
            (vec![], Some("_method")),
        ] {
            assert!(method_override(&headers(&pairs), query).is_err(), "{pairs:?} {query:?}");
        }
    }
}
