//! The sidecar's answers of its own (never the upstream's): the rejection
//! table of DESIGN.md plus proxy failures, and the one place that maps them
//! to status codes, JSON bodies, metrics labels and log lines.
//!
//! Every error says who caused it: the downstream client (bad token, bad
//! framing, too large), the lock service (unavailable), the upstream (timeout,
//! failure) or the sidecar itself.

use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::fence::Reason;
use crate::http::{json, Body};
use crate::lock::state::Token;

/// A refused request: the fence said no.
#[derive(Debug, Clone)]
pub struct Rejection {
    pub reason: Reason,
    pub key: String,
    pub token: Option<Token>,
    pub current: Option<Token>,
}

/// Everything the sidecar answers itself.
#[derive(Debug)]
pub enum Answer {
    Rejected(Rejection),
    /// Path not canonical, lock key invalid, ambiguous framing, header trouble.
    BadRequest {
        error: &'static str,
        message: String,
    },
    NoRoute,
    TooLarge {
        limit: u64,
    },
    UpstreamTimeout,
    /// The exchange failed after the request may have reached the upstream.
    UpstreamFailed(String),
    /// No connection: the request never left the sidecar.
    UpstreamUnreachable(String),
    Internal(String),
}

impl Answer {
    pub fn status(&self) -> StatusCode {
        match self {
            Answer::Rejected(r) => match r.reason {
                Reason::StaleToken | Reason::LeaseExpired | Reason::UnknownToken => StatusCode::CONFLICT,
                Reason::MissingToken => StatusCode::PRECONDITION_REQUIRED,
                Reason::MalformedToken => StatusCode::BAD_REQUEST,
                Reason::LockServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            },
            Answer::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Answer::NoRoute => StatusCode::NOT_FOUND,
            Answer::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Answer::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Answer::UpstreamFailed(_) | Answer::UpstreamUnreachable(_) => StatusCode::BAD_GATEWAY,
            Answer::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `outcome` label of `fencegate_sidecar_requests_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Answer::UpstreamTimeout | Answer::UpstreamFailed(_) | Answer::UpstreamUnreachable(_) => "upstream_error",
            _ => "rejected",
        }
    }

    pub fn into_response(self, route: &str) -> Response<Body> {
        let status = self.status();
        let body = match self {
            Answer::Rejected(r) => json!({
                "error": r.reason.as_str(), "route": route, "key": r.key, "token": r.token, "current": r.current,
            }),
            Answer::BadRequest { error, message } => json!({"error": error, "route": route, "message": message}),
            Answer::NoRoute => json!({"error": "no_route", "message": "no route matches this method and path"}),
            Answer::TooLarge { limit } => {
                json!({"error": "body_too_large", "route": route, "message": format!("the body limit is {limit} bytes")})
            }
            Answer::UpstreamTimeout => json!({"error": "upstream_timeout", "route": route}),
            Answer::UpstreamFailed(m) | Answer::UpstreamUnreachable(m) => {
                json!({"error": "upstream_error", "route": route, "message": m})
            }
            Answer::Internal(m) => json!({"error": "internal", "route": route, "message": m}),
        };
        let mut resp = json(status, &body);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}
