//! The server side of HTTP, shared by every listener fencegate runs (the
//! node API, the sidecar, the metrics listener, the demo inventory): the
//! one accept loop (`serve`), the response body type and JSON answers.
//! The client side lives in `fencegate_client::http`.
//!
//! `refusal` is the one builder of error answers: a JSON body, a
//! `Retry-After` on every 503, and a `Cause` (client, upstream, lock service,
//! internal) saying who caused it.

mod deadline;
mod forwarded;
mod listen;
mod outlive;
pub(crate) mod page;
mod refusals;
mod serve;
mod stall;
mod workers;

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub(crate) use deadline::{BodyTimedOut, Deadline};
pub(crate) use fencegate_client::http::{error_chain, read_body, BodyError, BoxError};
pub(crate) use forwarded::ClientNames;
pub(crate) use listen::{bind, CannotListen};
pub(crate) use outlive::Outlive;
pub(crate) use refusals::RefusalBody;
pub(crate) use serve::{
    serve, serve_live, serve_on, Conn, Listener, LiveListener, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SEND_TIMEOUT, MAX_CONNECTIONS,
};
pub use workers::Workers;
pub(crate) use workers::MAX_WORKERS;

/// The body of every response fencegate's servers produce.
pub(crate) type Body = BoxBody<Bytes, BoxError>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e: Infallible| match e {}).boxed()
}

pub(crate) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let mut bytes = serde_json::to_vec(value).expect("serialising a response cannot fail");
    bytes.push(b'\n');
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Who caused a failure: the metric label and log field of every refusal,
/// so that an operator can tell a misbehaving client from a broken upstream
/// or a sick lock service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The request itself (bad input, stale token, too large).
    Client,
    /// The upstream behind the sidecar (unreachable, timed out, broke).
    Upstream,
    /// The lock service (no leader, no quorum, unreachable).
    LockService,
    /// fencegate itself.
    Internal,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Client => "client",
            Cause::Upstream => "upstream",
            Cause::LockService => "lock_service",
            Cause::Internal => "internal",
        }
    }
}

/// The one place a refusal becomes an HTTP answer: JSON `body` with
/// `status`, and `Retry-After` on every 503 (the caller may try again soon).
pub(crate) fn refusal<T: Serialize>(status: StatusCode, cause: Cause, body: &T) -> Response<Body> {
    let mut resp = json(status, body);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if cause == Cause::Internal {
        tracing::error!(%status, "internal error answered");
    }
    resp
}

/// Parse a JSON object body; an empty body parses as `{}`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { bytes };
    // serde also reads a struct from an array of its fields in order
    // (`[30000]` as a ttl_ms): every body is documented as an object.
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(<serde_json::Error as serde::de::Error>::custom("the body must be a JSON object").into());
    }
    Ok(serde_json::from_slice(bytes)?)
}

/// A streamed body fed from a channel (the watch stream's NDJSON lines).
pub(crate) fn channel_body(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Body {
    ChannelBody { rx }.boxed()
}

struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx).map(|line| line.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}
