//! The sidecar's console (docs/decisions/0011): `/console` on the metrics
//! listener, read-only. The page and its script and style hold no data;
//! `GET /console/state` (the routes, the lock service's view, the floors of
//! the first `FLOORS_SHOWN` keys, idempotency records still pending or of
//! unknown outcome with how to settle them, the latest refusals) and
//! `GET /console/events` (each refusal as it happens, Server-Sent Events)
//! need the admin token, as the admin calls do, and are served only on a
//! loopback `metrics_listen`.
//!
//! Refusals are recorded where they are logged: a ring of the latest
//! `KEPT`, and a broadcast to the open feeds (at most `MAX_FEEDS`; a feed
//! that falls `BACKLOG` behind is told so and skips ahead, never buffered
//! without bound). Nothing is recorded for a forwarded request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::http::{page, Body};
use crate::lock::state::Token;
use crate::sidecar::Sidecar;

/// Refusals kept for the page's first view.
const KEPT: usize = 1000;
/// Feeds open at once, at most.
const MAX_FEEDS: usize = 16;
/// Refusals a feed may fall behind before it skips ahead.
const BACKLOG: usize = 256;
/// Floors shown, at most (by key).
const FLOORS_SHOWN: usize = 500;
/// Idempotency records not settled shown, at most.
const OPEN_SHOWN: usize = 100;
/// A comment line on a quiet feed, so proxies and browsers keep it open.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// One refusal, as the console shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Refusal {
    /// Unix time, milliseconds.
    pub at_ms: u64,
    pub route: String,
    pub key: String,
    /// The token the request presented, if any.
    pub presented: Option<Token>,
    /// The key's latest known token when it was refused.
    pub current: Token,
    pub reason: &'static str,
}

/// The latest refusals, and the open feeds.
pub(crate) struct Refusals {
    kept: Mutex<VecDeque<Refusal>>,
    feeds: broadcast::Sender<Refusal>,
    open: Arc<AtomicUsize>,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            kept: Mutex::new(VecDeque::with_capacity(KEPT)),
            feeds: broadcast::channel(BACKLOG).0,
            open: Arc::default(),
        }
    }
}

impl Refusals {
    pub(crate) fn record(
        &self,
        route: &str,
        key: &str,
        presented: Option<Token>,
        current: Token,
        reason: &'static str,
    ) {
        let at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let refusal = Refusal { at_ms, route: route.to_string(), key: key.to_string(), presented, current, reason };
        {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() == KEPT {
                kept.pop_front();
            }
            kept.push_back(refusal.clone());
        }
        // No feed open: nobody to tell.
        let _ = self.feeds.send(refusal);
    }

    /// The latest first.
    pub(crate) fn latest(&self) -> Vec<Refusal> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).iter().rev().cloned().collect()
    }

    /// A feed of the refusals from now on, as Server-Sent Events; `None`
    /// with `MAX_FEEDS` open.
    fn feed(&self) -> Option<Body> {
        let open = self.open.clone();
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_FEEDS {
            open.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let state = (self.feeds.subscribe(), Closing(open));
        let lines = futures_util::stream::unfold(state, |(mut rx, closing)| async move {
            let line = match tokio::time::timeout(HEARTBEAT, rx.recv()).await {
                Err(_) => ": heartbeat\n\n".to_string(),
                Ok(Ok(r)) => format!("event: refusal\ndata: {}\n\n", serde_json::to_string(&r).ok()?),
                Ok(Err(broadcast::error::RecvError::Lagged(n))) => format!("event: skipped\ndata: {n}\n\n"),
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
            };
            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), (rx, closing)))
        });
        Some(StreamBody::new(lines).map_err(|never| match never {}).boxed())
    }
}

/// Counts a feed closed when its stream is dropped.
struct Closing(Arc<AtomicUsize>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

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
                "/console/events" => match self.refusals.feed() {
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
            "refusals": self.refusals.latest(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_latest_first_and_no_more() {
        let r = Refusals::default();
        for t in 0..(KEPT as u64 + 5) {
            r.record("racks", "rack/1", Some(t), t + 1, "stale_token");
        }
        let latest = r.latest();
        assert_eq!(latest.len(), KEPT);
        assert_eq!((latest[0].presented, latest[KEPT - 1].presented), (Some(KEPT as u64 + 4), Some(5)));
    }

    #[tokio::test]
    async fn feeds_are_bounded_and_counted_closed() {
        let r = Refusals::default();
        let feeds: Vec<_> = (0..MAX_FEEDS).map(|_| r.feed().expect("within the bound")).collect();
        assert!(r.feed().is_none(), "one more than MAX_FEEDS");
        drop(feeds);
        assert!(r.feed().is_some(), "closed feeds free their places");
    }
}
