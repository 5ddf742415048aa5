//! The demo's *legacy inventory API*: racks with a state, and no idea what a
//! fencing token is. It applies every write it receives, in the order it
//! receives them, and lists them at `GET /writes` so that a person (or a
//! test) can see exactly what a paused holder's late write did.
//!
//! `PUT /racks/{id}` `{"state": "..."}` → 200 `{"rack","state"}`;
//! `GET /racks/{id}`, `GET /racks`, `GET /writes`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::json;
use tokio::net::TcpListener;

use crate::http::{json, Body};

const MAX_BODY: usize = 64 << 10;

/// One applied write.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Write {
    pub seq: u64,
    pub rack: String,
    pub state: String,
    /// The `X-Fence-Token` the write carried, recorded but never checked.
    pub token: Option<String>,
}

#[derive(Default)]
pub(crate) struct Inventory {
    inner: Mutex<(BTreeMap<String, String>, Vec<Write>)>,
}

impl Inventory {
    pub(crate) fn writes(&self) -> Vec<Write> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    pub(crate) fn state_of(&self, rack: &str) -> Option<String> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.get(rack).cloned()
    }

    fn apply(&self, rack: &str, state: String, token: Option<String>) -> Write {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let seq = inner.1.len() as u64 + 1;
        inner.0.insert(rack.to_string(), state.clone());
        let w = Write { seq, rack: rack.to_string(), state, token };
        inner.1.push(w.clone());
        w
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let rack = path.strip_prefix("/racks/").filter(|r| !r.is_empty() && !r.contains('/'));
        match (req.method().clone(), path.as_str(), rack) {
            (Method::GET, "/writes", _) => json(StatusCode::OK, &self.writes()),
            (Method::GET, "/racks", _) => {
                let racks = self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.clone();
                json(StatusCode::OK, &racks)
            }
            (Method::GET, _, Some(rack)) => match self.state_of(rack) {
                Some(state) => json(StatusCode::OK, &json!({"rack": rack, "state": state})),
                None => json(StatusCode::NOT_FOUND, &json!({"error": "no such rack"})),
            },
            (Method::PUT, _, Some(rack)) => {
                let rack = rack.to_string();
                let token =
                    req.headers().get(fencegate_client::TOKEN_HEADER).and_then(|v| v.to_str().ok()).map(String::from);
                let body = match crate::http::read_body(req.into_body(), MAX_BODY).await {
                    Ok(b) => b,
                    Err(e) => return json(StatusCode::BAD_REQUEST, &json!({"error": e.to_string()})),
                };
                let state = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v.get("state")?.as_str().map(String::from));
                match state {
                    Some(state) => {
                        let w = self.apply(&rack, state, token);
                        json(StatusCode::OK, &json!({"rack": w.rack, "state": w.state, "seq": w.seq}))
                    }
                    None => json(StatusCode::BAD_REQUEST, &json!({"error": "body must be {\"state\": \"...\"}"})),
                }
            }
            _ => json(StatusCode::NOT_FOUND, &json!({"error": "not found"})),
        }
    }
}

/// Serve the inventory on `listener` until `shutdown`.
pub(crate) async fn serve(listener: TcpListener, inventory: Arc<Inventory>, shutdown: impl Future<Output = ()>) {
    let opts = crate::http::Listener::http1("inventory");
    crate::http::serve(listener, opts, shutdown, move |req, _| {
        let inv = inventory.clone();
        async move { inv.handle(req).await }
    })
    .await
}
