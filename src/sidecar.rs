//! The sidecar: a reverse proxy in front of an unmodified HTTP API that
//! refuses writes carrying stale fencing tokens.
//!
//! One request's phases, each in its own module:
//!
//! ```text
//! accept ─▶ TLS handshake ─▶ framing & limits (head) ─▶ routing::find ─▶ fencing::Fencer::check ─▶ upstream::Upstream::forward ─▶ answer
//!            (tls only)        400/413                    400/404         409/428/400/503         502/504
//! ```
//!
//! A refused request never reaches the upstream; every refusal is counted in
//! `fencegate_sidecar_rejections_total` (route `-` before a route is
//! chosen), and a fence refusal is logged with route, key, presented and
//! current token.
//!
//! In full, `Sidecar::handle`'s phases: `route` (framing and disguise
//! checks; method overrides are refused, or taken by `find_overridden`
//! where a route allows them; `routing`) → `check` (`fencing`) →
//! `take_body` (a fenced body of unannounced length, or a keyed one, read
//! whole; `idempotency::exchange` begun) → `send` (`fencing` again,
//! `upstream`) → `idempotency::exchange` finished → `answer`, all from
//! `SidecarSettings` (`settings`), through the one accept loop (HTTP/1.1
//! and HTTP/2, TLS).
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
pub(crate) mod console;
pub(crate) mod fencing;
pub(crate) mod head;
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
use hyper::header::CONTENT_LENGTH;
use hyper::{HeaderMap, Request, Response};
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::config::sidecar::LockServiceKind;
use crate::http::{Body, BoxError, Listener, LiveListener, Workers};
use crate::metrics::{Outcome, RouteMeters, SidecarMetrics};
use crate::tls::SidecarTls;
use answer::{Answer, Phase};
use fencing::knowledge::LockView;
use fencing::{Cleared, Fencer};
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
    /// What happened to each key, for the console (and its open feeds).
    timeline: Arc<console::Timeline>,
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
        let timeline = Arc::new(console::Timeline::default());
        let view = match (&settings.lock_service, tls.lock_service, needs_service) {
            (Some(service), Some(options), true) if service.kind == LockServiceKind::Etcd => {
                let http = options.http_client(fencing::etcd::MAX_ANSWER)?;
                let user = service.user.clone().zip(tls.lock_service_password);
                let user = user.map(|(name, password)| fencing::etcd::User::new(name, password));
                let etcd = fencing::etcd::Etcd::new(service.endpoints.clone(), http, user);
                let followed = fencing::followed(&settings.routes);
                Some(LockView::start_etcd(etcd, metrics.clone(), service.max_staleness, followed, timeline.clone()))
            }
            (Some(service), _, true) if service.kind == LockServiceKind::ZooKeeper => {
                let user = service.user.clone().zip(tls.lock_service_password);
                let zk = fencing::zookeeper::ZooKeeper::new(&service.endpoints, user);
                let followed = fencing::followed(&settings.routes);
                Some(LockView::start_zookeeper(zk, metrics.clone(), service.max_staleness, followed, timeline.clone()))
            }
            (Some(service), Some(options), true) => {
                let client = Client::with_options(service.endpoints.clone(), options)?;
                let followed = fencing::followed(&settings.routes);
                Some(LockView::start(client, metrics.clone(), service.max_staleness, followed, timeline.clone()))
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
        let fencer = Fencer { view, floors, order: Arc::default(), timeline: timeline.clone() };
        let listener = Arc::new(ArcSwap::from_pointee(listener_options(&settings, acceptor, &metrics)));
        let workers = Workers::start("sidecar", settings.workers)?;
        let upstream = Upstream::new(tls.upstream, settings.workers);
        let sidecar = Sidecar {
            live: ArcSwap::from_pointee(Live::new(settings, upstream, &metrics)),
            workers,
            listener,
            longest_timeout: Mutex::default(),
            fencer,
            store,
            records,
            admin_token,
            timeline,
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
    /// route ──────▶ check ─────────▶ take_body ─────────▶ send ───────────▶ keep the answer
    /// framing,      S2–S7, an S1     stream it, or read   decide again      the idempotency
    /// overrides,    permit           it whole and begin   (S3), forward,    record's answer
    /// route, key    (`Fencer`)       its record (I1)      free the permit   (`exchange`)
    /// ```
    ///
    /// The phases borrow the request's head (`parts`) rather than take the
    /// request: handed from one future to the next by value, it cost the
    /// cached path 1.45 % more instructions per request (`bench/instructions.rs`).
    async fn handle(self: Arc<Self>, req: Request<Incoming>, conn: crate::http::Conn) -> Response<Body> {
        let arrived = Instant::now();
        // Read once: this request finishes on the config it started with.
        let live = self.live();
        let routed = match route(&live, &req, arrived) {
            Ok(routed) => routed,
            Err(a) => return self.answer("-", None, a),
        };
        let (name, key) = (routed.matched.route.name.as_str(), routed.matched.key.as_deref());
        let meters = &live.meters[routed.matched.index];
        let cleared = match self.check(&routed, meters, req.headers()).await {
            Ok(cleared) => cleared,
            Err(a) => return self.answer(name, key, a),
        };
        let (mut parts, body) = req.into_parts();
        let (body, keyed) = match self.take_body(&live, &routed, &mut parts, body, &conn).await {
            Ok(Taken::Send(body, keyed)) => (body, keyed),
            Ok(Taken::Replayed(resp)) => return resp,
            Err(a) => return self.answer(name, key, a),
        };
        let req = Request::from_parts(parts, body);
        let result = self.send(&live, routed.matched.route, meters, cleared, req, &conn.client).await;
        let result = match keyed {
            // Boxed, as `begin` is: the keyed path's futures are large, and
            // every request's future would otherwise carry their room.
            Some(k) => Box::pin(idempotency::exchange::finish(&self.metrics, name, k, result)).await,
            None => result,
        };
        match result {
            Ok(resp) => {
                meters.forwarded.inc();
                resp
            }
            Err(a) => self.answer(name, key, a),
        }
    }

    /// The check phase: a fenced request's token against what is known
    /// (S2–S7), then its place in the order (an S1 permit); `None` for a
    /// request forwarded unfenced. How long it took is observed either way.
    async fn check<'m>(
        &self,
        routed: &'m Routed<'_>,
        meters: &RouteMeters,
        headers: &HeaderMap,
    ) -> Result<Option<Cleared<'m>>, Answer> {
        let (route, Some(key)) = (routed.matched.route, &routed.matched.key) else { return Ok(None) };
        let checked = self.fencer.check(route, key, headers, routed.arrived).await;
        meters.fence_wait.observe(routed.arrived.elapsed().as_secs_f64());
        checked
    }

    /// The body phase. A fenced write of unannounced length (chunked, or
    /// HTTP/2 without Content-Length) is read whole first: one over the
    /// limit is refused before the upstream sees any of it, never cut off
    /// half-way through a write the upstream may apply. So is a request
    /// with an idempotency key: its fingerprint covers the body, and its
    /// record is begun here (I1), or its answer replayed. Any other body
    /// streams, within `max_body`.
    async fn take_body(
        &self,
        live: &Live,
        routed: &Routed<'_>,
        parts: &mut hyper::http::request::Parts,
        body: Incoming,
        conn: &crate::http::Conn,
    ) -> Result<Taken, Answer> {
        let route = routed.matched.route;
        let limits = &live.settings.limits;
        let keyed = match (route.idempotency, &routed.matched.key) {
            (Some(policy), Some(lock_key)) => {
                idempotency::exchange::key_of(&policy, &parts.headers)?.map(|key| (policy, lock_key, key))
            }
            _ => None,
        };
        let body = crate::http::Deadline::new(body, routed.arrived, limits.body_timeout);
        if keyed.is_none() && (routed.matched.key.is_none() || parts.headers.contains_key(CONTENT_LENGTH)) {
            let streamed = Limited::new(body, limits.max_body as usize).map_err(|e| -> BoxError { e }).boxed();
            return Ok(Taken::Send(streamed, None));
        }
        let bytes = read_whole(body, route, limits.max_body).await?;
        let mut begun = None;
        if let Some((policy, lock_key, key)) = &keyed {
            let request = idempotency::exchange::Request {
                route: &route.name,
                timeout: route.timeout,
                lock_key,
                key,
                // What the upstream takes it as: two overrides are two requests.
                method: routed.overridden.as_ref().unwrap_or(&parts.method).as_str(),
                path_and_query: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
                headers: &parts.headers,
                body: &bytes,
                token: fencing::decision::parse_token(&parts.headers).ok().flatten().unwrap_or(0),
                // Named once per connection, and only for keyed requests.
                identity: conn
                    .leaf()
                    .and_then(|cert| conn.named.get_or_init(|| crate::tls::identity::client_name(cert)).as_deref()),
            };
            match Box::pin(idempotency::exchange::begin(&self.records, &self.metrics, *policy, request)).await? {
                idempotency::exchange::Begun::Forward(k) => begun = Some(k),
                idempotency::exchange::Begun::Answered(resp) => {
                    self.metrics.request(&route.name, Outcome::Replayed);
                    return Ok(Taken::Replayed(resp));
                }
            }
        }
        parts.headers.insert(CONTENT_LENGTH, bytes.len().into());
        Ok(Taken::Send(http_body_util::Full::new(bytes).map_err(|e| -> BoxError { match e {} }).boxed(), begun))
    }

    /// The send phase: decided again here (S3), after the floor's fsync, a
    /// buffered body and an idempotency record, which may take longer than
    /// the knowledge the check stood on stays vouched for (`max_staleness`);
    /// then forwarded, and the S1 permit freed once the upstream can no
    /// longer apply the write.
    async fn send(
        &self,
        live: &Live,
        route: &routing::Route,
        meters: &RouteMeters,
        mut cleared: Option<Cleared<'_>>,
        req: Request<Body>,
        client: &crate::http::ClientNames,
    ) -> Result<Response<Body>, Answer> {
        if let Some(c) = &mut cleared {
            self.fencer.dispatch(c).await?;
        }
        let started = Instant::now();
        let tls = live.settings.tls.is_some();
        let send_timeout = live.settings.limits.send_timeout;
        let result = live.upstream.forward(&route.upstream, req, client, tls, route.timeout, send_timeout).await;
        meters.upstream_duration.observe(started.elapsed().as_secs_f64());
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
        result
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
                let reason = r.reason.as_str();
                let refused = console::Happened::Refused { route: route.into(), presented: r.token, current, reason };
                self.timeline.record(&r.key, refused);
            }
            other => {
                tracing::info!(route, key, status = %other.status(), cause = other.cause().as_str(), "refused: {other}")
            }
        }
        a.into_response(route)
    }
}

/// A routed request: its route and lock key, the method an allowed override
/// makes it, and when it arrived (the check's and the body's deadlines
/// count from then).
struct Routed<'a> {
    matched: routing::Matched<'a>,
    overridden: Option<hyper::Method>,
    arrived: Instant,
}

/// What the body phase hands on.
enum Taken {
    /// The body to send, and the idempotency record begun for it.
    Send(Body, Option<idempotency::exchange::Keyed>),
    /// A keyed request answered from its record: nothing is sent.
    Replayed(Response<Body>),
}

/// The route phase: the request's framing, its method overrides, and the
/// route (and lock key) it takes; refused here, nothing was asked or read.
fn route<'a>(live: &'a Live, req: &Request<Incoming>, arrived: Instant) -> Result<Routed<'a>, Answer> {
    let routes = &live.settings.routes;
    let overridden = head::check(req.method(), req.headers(), req.uri().query(), live.settings.limits.max_body)?;
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
    Ok(Routed { matched, overridden, arrived })
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

/// Serve the proxy on `listener` (HTTP/1.1 and HTTP/2, over TLS when `tls` is
/// set) until `shutdown`, then drain.
pub(crate) async fn serve(listener: TcpListener, sidecar: Arc<Sidecar>, shutdown: impl Future<Output = ()>) {
    let order = sidecar.fencer.order.clone();
    let (opts, kept) = (sidecar.listener.clone(), sidecar.clone());
    let workers = Some(&kept.workers);
    crate::http::serve_on(listener, opts, workers, shutdown, move |req, conn: crate::http::Conn| {
        // If the client goes away, hyper drops this future, but the request
        // (and its ordering permit, S1) must live until the upstream has
        // answered or timed out: dropped unfinished, it finishes alone.
        let answer = std::panic::AssertUnwindSafe(crate::http::Outlive::new(sidecar.clone().handle(req, conn)));
        let sc = sidecar.clone();
        async move {
            futures_util::FutureExt::catch_unwind(answer).await.unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                sc.answer("-", None, Answer::Internal(format!("the request's handler panicked: {what}")))
            })
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
            let path = req.uri().path();
            if let Some(action) = path.strip_prefix("/admin/idempotency/") {
                let action = action.to_string();
                return sidecar.admin(&action, req).await;
            }
            match path == "/console" || path.starts_with("/console/") {
                true => sidecar.console(&req).await,
                false => sidecar.probe(path).await,
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
            self.metrics.fence_barrier_waiting.set(self.fencer.order.waiting() as i64);
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
