//! Writes through a fencegate sidecar that are applied once however often
//! they are retried (docs/DESIGN.md, I1): each carries the lease's fencing
//! token and an `Idempotency-Key` derived from the caller's operation id.
//! A key answers only the holder that sent it (I2): the same key under a
//! later lease (a re-run of the job) is a new write, applied again.
//!
//! ```no_run
//! # async fn demo(lease: &fencegate_client::Lease) -> Result<(), fencegate_client::http::HttpError> {
//! use std::time::Duration;
//! use fencegate_client::http::HttpClient;
//! use fencegate_client::idempotency::{self, Write};
//!
//! let operation = idempotency::operation_id(); // or the job's own id
//! let http = HttpClient::new(1 << 20);
//! let write = Write::new("PUT", "http://127.0.0.1:8080/racks/42", lease.token(), &operation, "drain")
//!     .body(r#"{"state":"drained"}"#);
//! // Retried on timeouts and broken connections with the same key: applied once.
//! let reply = write.send(&http, 5, Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```
//!
//! A write is retried with the same key on timeouts, broken connections and
//! `idempotency_in_flight`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode};

use crate::backoff::Backoff;
use crate::http::{HttpClient, HttpError, Reply};
use crate::wire::{Token, TOKEN_HEADER};

/// The request header the sidecar reads.
pub const HEADER: &str = "Idempotency-Key";
/// Set on an answer the sidecar replayed from its store.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// A fresh operation id (128 random bits, hex), for an operation that has no
/// id of its own. Keep it for as long as the operation may be retried: a
/// new id makes new keys.
pub fn operation_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The key of one step of an operation: the same (operation, step) always
/// gives the same key, in any process; different steps or operations give
/// different keys. 32 hex characters.
pub fn key(operation_id: &str, step: &str) -> String {
    // FNV-1a over both, length-prefixed, twice with different offsets: a
    // key needs to be stable and unlikely to collide, not secret.
    let mut out = String::with_capacity(32);
    for offset in [0xcbf2_9ce4_8422_2325u64, 0x8422_2325_cbf2_9ce4] {
        let mut h = offset;
        for part in [operation_id.as_bytes(), step.as_bytes()] {
            for b in (part.len() as u64).to_le_bytes().iter().chain(part) {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// One fenced, idempotent write.
#[derive(Debug, Clone)]
pub struct Write {
    method: hyper::Method,
    url: String,
    token: Token,
    key: String,
    body: Bytes,
}

impl Write {
    /// `method url` under `token`, keyed by (`operation_id`, `step`).
    /// Panics on a `method` that is not an HTTP token (a typo).
    pub fn new(method: &str, url: &str, token: Token, operation_id: &str, step: &str) -> Write {
        let method = hyper::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        Write { method, url: url.to_string(), token, key: key(operation_id, step), body: Bytes::new() }
    }

    /// The request body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Write {
        self.body = body.into();
        self
    }

    /// The key it is sent with.
    pub fn key(&self) -> &str {
        &self.key
    }

    fn request(&self) -> Result<Request<Full<Bytes>>, HttpError> {
        Request::builder()
            .method(self.method.clone())
            .uri(&self.url)
            .header(TOKEN_HEADER, self.token.to_string())
            .header(HEADER, &self.key)
            .body(Full::new(self.body.clone()))
            .map_err(|_| HttpError::Url(self.url.clone()))
    }

    /// Send it until it is answered, at most `attempts` times, each within
    /// `timeout`: a timeout, a broken connection, and `409
    /// idempotency_in_flight` (the first attempt still running) are retried
    /// with the same key. Any other answer is returned, `409
    /// outcome_unknown` included: that one needs a person.
    pub async fn send(&self, http: &HttpClient, attempts: u32, timeout: Duration) -> Result<Reply, HttpError> {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut last = None;
        for _ in 0..attempts.max(1) {
            match http.send(self.request()?, timeout).await {
                Ok(r) if r.status == StatusCode::CONFLICT && in_flight(&r) => last = Some(Ok(r)),
                Ok(r) => return Ok(r),
                Err(e @ HttpError::Url(_)) => return Err(e),
                Err(e) => last = Some(Err(e)),
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
        last.expect("at least one attempt")
    }
}

fn in_flight(r: &Reply) -> bool {
    serde_json::from_slice::<serde_json::Value>(&r.body).is_ok_and(|v| v["error"] == "idempotency_in_flight")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_distinct() {
        let k = key("job-7", "drain");
        assert_eq!(k, key("job-7", "drain"));
        assert_eq!(k.len(), 32);
        assert!(k.bytes().all(|b| b.is_ascii_hexdigit()));
        for other in [key("job-7", "undrain"), key("job-8", "drain"), key("job-7d", "rain"), key("", "job-7drain")] {
            assert_ne!(k, other);
        }
        assert_ne!(operation_id(), operation_id());
    }
}
