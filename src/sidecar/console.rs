//! The sidecar's console (docs/decisions/0011): `/console` on the metrics
//! listener, read-only. The page and its script and style hold no data;
//! `GET /console/state` (the routes, the lock service's view, the floors of
//! the first `FLOORS_SHOWN` keys, idempotency records still pending or of
//! unknown outcome with how to settle them, the latest of the timeline) and
//! `GET /console/events` (each event of the timeline as it happens,
//! Server-Sent Events)
//! need the admin token, as the admin calls do, and are served only on a
//! loopback `metrics_listen`.
//!
//! What happened to each key (`timeline`: grants and ends as learnt,
//! first forwards, refusals) is recorded off the forwarding path; nothing
//! for each forwarded request.

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};

use crate::http::{page, Body};
use crate::sidecar::Sidecar;

mod timeline;

pub(crate) use timeline::{Happened, Timeline};

/// Floors shown, at most (by key).
const FLOORS_SHOWN: usize = 500;
/// Idempotency records not settled shown, at most.
const OPEN_SHOWN: usize = 100;
impl Sidecar {
    /// `GET /console…` on the metrics listener.
    pub(in crate::sidecar) async fn console(&self, req: &Request<Incoming>) -> Response<Body> {
        const PAGE: page::Page =
            page::Page { html: include_str!("console/index.html"), script: include_str!("console/app.js") };
        let path = req.uri().path();
        if req.method() != hyper::Method::GET {
            return page::secured(refuse(StatusCode::METHOD_NOT_ALLOWED, "the console only reads: GET"));
        }
        if let Some(asset) = page::asset("/console", &PAGE, path) {
            return asset;
        }
        let response = match self.admin_refusal(req) {
            Some(refusal) => refusal,
            None => match path {
                "/console/state" => self.console_state(),
                "/console/events" => match self.timeline.feed() {
                    Some(body) => with_type(Response::new(body), "text/event-stream"),
                    None => refuse(StatusCode::SERVICE_UNAVAILABLE, "too many console feeds open"),
                },
                _ => refuse(StatusCode::NOT_FOUND, "not_found"),
            },
        };
        page::secured(response)
    }

    /// The routes, the lock service's view, the latest refusals.
    fn console_state(&self) -> Response<Body> {
        let live = self.live();
        let routes: Vec<_> = live
            .settings
            .routes
            .iter()
            .map(|r| serde_json::json!({ "name": r.name, "path": r.path(), "lock_key": r.lock_key(), "fence": fence(&r.fence) }))
            .collect();
        let service = live.settings.lock_service.as_ref().map(|s| {
            let view = self.fencer.view.as_ref();
            serde_json::json!({
                "kind": format!("{:?}", s.kind).to_lowercase(),
                "endpoints": s.endpoints,
                "max_staleness_ms": s.max_staleness.as_millis() as u64,
                "up": view.is_some_and(|v| v.is_up()),
                "knowledge_age_ms": view.map(|v| v.age(tokio::time::Instant::now()).as_millis() as u64),
            })
        });
        let (floors, keys) = self.fencer.floors.first(FLOORS_SHOWN);
        let floors: Vec<_> =
            floors.into_iter().map(|(key, token)| serde_json::json!({ "key": key, "floor": token })).collect();
        let open: Vec<_> =
            self.records.open(OPEN_SHOWN).into_iter().map(|(scope, r)| open_record(&scope, &r)).collect();
        let body = serde_json::json!({
            "routes": routes,
            "lock_service": service,
            "floors": { "keys": keys, "first": floors },
            "idempotency_open": open,
            "timeline": self.timeline.latest(),
        });
        let mut resp = Response::new(crate::http::full(body.to_string()));
        resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        resp
    }
}

/// An idempotency record not settled, and what settles it: a pending one
/// settles itself when its request ends; an unknown outcome waits for the
/// operator (`fencegate idempotency resolve`, docs/reference/cli.md).
fn open_record(scope: &str, r: &crate::sidecar::idempotency::Record) -> serde_json::Value {
    let mut parts = scope.splitn(4, '\n');
    let (lock_key, token, key) = (parts.next(), parts.next(), parts.next());
    let identity = parts.next();
    let (state, why, resolve) = match &r.state {
        crate::sidecar::idempotency::State::Unknown { why } => {
            let mut command = format!(
                "fencegate idempotency resolve --sidecar URL --token-file STATE_DIR/admin-token --lock-key {} \
                 --fence-token {} --key {}",
                lock_key.unwrap_or_default(),
                token.unwrap_or_default(),
                key.unwrap_or_default()
            );
            if let Some(identity) = identity {
                command.push_str(&format!(" --identity {identity}"));
            }
            command.push_str(" (--applied STATUS | --not-applied)");
            ("unknown", Some(why.as_str()), Some(command))
        }
        _ => ("pending", None, None),
    };
    serde_json::json!({
        "lock_key": lock_key, "token": token, "key": key, "identity": identity, "route": r.route,
        "created_ms": r.created_ms, "state": state, "why": why, "resolve": resolve,
    })
}

/// A route's fence as the console names it.
fn fence(f: &crate::config::sidecar::Fence) -> String {
    match f {
        crate::config::sidecar::Fence::Off => "off".into(),
        crate::config::sidecar::Fence::On { mode, consistency } => {
            format!("{}, {}", format!("{mode:?}").to_lowercase(), format!("{consistency:?}").to_lowercase())
        }
    }
}

fn refuse(status: StatusCode, message: &str) -> Response<Body> {
    crate::http::refusal(status, crate::http::Cause::Client, &serde_json::json!({ "error": message }))
}

fn with_type(mut resp: Response<Body>, kind: &'static str) -> Response<Body> {
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    resp
}
