//! One fenced request with an `Idempotency-Key`, on a route with
//! `idempotency` (I1): after the fence check, before and after the upstream.
//! Its record is its holder's (`idempotency::scope`): every answer below
//! that tells of a record (a replay, 409, 422) comes from the record of the
//! same lock key, token, key and client identity, never another holder's.
//!
//! ```text
//! fence check ─▶ body read whole ─▶ Records::begin ─┬─ replay / 409 / 422 / 429 / 503 (the upstream sees nothing)
//!                                                   └─ pending record on disk ─▶ forward ─▶ settle
//!                                                         done: answer kept (≤ max_response) and returned
//!                                                         broke after it may have arrived: unknown
//!                                                         never sent: record dropped
//! ```
//!
//! A `Keyed` dropped unsettled becomes unknown.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fencegate_client::wire::Problem;
use http_body_util::BodyExt;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{HeaderMap, Response, StatusCode};

use crate::http::{Body, BoxError};
use crate::metrics::{KeyResult, SidecarMetrics};
use crate::sidecar::answer::Answer;
use crate::sidecar::idempotency::records::{BeginError, Records};
use crate::sidecar::idempotency::{self, Policy, Record, State, Verdict};

/// Room held for an answer's headers while its request is pending (an
/// answer with more is kept without its body if the store has no room).
const HEADER_RESERVE: u64 = 4 << 10;

/// A request being forwarded under its key. Dropped without being settled
/// (its task panicked, say), its outcome becomes unknown: a pending record
/// nobody settles would refuse its key as in flight for ever.
pub struct Keyed {
    scope: String,
    policy: Policy,
    /// The route's timeout: it also bounds reading the upstream's answer.
    timeout: Duration,
    records: Arc<Records>,
    settled: bool,
}

impl Keyed {
    /// A whole retention from now.
    fn retained(&self) -> u64 {
        now_ms().saturating_add(self.policy.retention.as_millis() as u64)
    }
}

impl Drop for Keyed {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let why = "the request ended without its answer being recorded".to_string();
        durably(self.records.settle(&self.scope, State::Unknown { why }, Bytes::new(), self.retained()));
    }
}

/// A settled record's write, not waited for: the answer need not wait for
/// it (see `Records::settle`), and the store's writer writes it whether or
/// not anyone waits, and logs a batch that fails. No task per request.
fn durably(write: impl std::future::Future<Output = Result<(), crate::sidecar::state::StoreError>>) {
    drop(write);
}

/// The request's key, if it has one; refused if it is malformed, or missing
/// where the route requires one.
pub fn key_of(policy: &Policy, headers: &HeaderMap) -> Result<Option<String>, Answer> {
    match idempotency::parse_key(headers) {
        Ok(None) if policy.required => Err(problem(
            Problem::MissingIdempotencyKey,
            "this route requires an Idempotency-Key header on every request".into(),
        )),
        Ok(key) => Ok(key),
        Err(message) => Err(problem(Problem::MalformedIdempotencyKey, message)),
    }
}

fn problem(error: Problem, message: String) -> Answer {
    Answer::Idempotency { error, message }
}

/// Unix milliseconds: when records are made and expire.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What a keyed request gets before the upstream is asked.
pub enum Begun {
    /// Its pending record is on disk: forward it.
    Forward(Keyed),
    /// Answered here: a replay.
    Answered(Response<Body>),
}

/// A keyed request, as its fingerprint and record need it.
pub struct Request<'a> {
    pub route: &'a str,
    pub timeout: Duration,
    pub lock_key: &'a str,
    pub key: &'a str,
    /// The method the upstream will take it as (an allowed override's).
    pub method: &'a str,
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    pub token: u64,
    /// The client's certificate name, over mutual TLS.
    pub identity: Option<&'a str>,
}

pub async fn begin(
    records: &Arc<Records>,
    metrics: &SidecarMetrics,
    policy: Policy,
    r: Request<'_>,
) -> Result<Begun, Answer> {
    let scope = idempotency::scope(r.lock_key, r.token, r.key, r.identity);
    let content_type = r.headers.get(CONTENT_TYPE).map(|v| v.as_bytes());
    let now = now_ms();
    let record = Record {
        route: r.route.to_string(),
        fingerprint: idempotency::fingerprint(r.method, r.path_and_query, content_type, r.body),
        token: r.token,
        created_ms: now,
        expires_ms: now.saturating_add(policy.retention.as_millis() as u64),
        state: State::Pending,
        body: Bytes::new(),
        reserve: policy.max_response + HEADER_RESERVE,
    };
    let count = |result| metrics.keyed(r.route, result);
    let verdict = match records.begin(&scope, record, policy.per_lock_key).await {
        Ok(v) => v,
        Err(BeginError::Quota { limit }) => {
            count(KeyResult::Quota);
            let message = format!(
                "the idempotency records of lock key {:?} hold its quota ({limit} bytes, the route's \
                 idempotency.per_lock_key); a new key under it is taken again once some expire",
                r.lock_key
            );
            return Err(problem(Problem::IdempotencyQuota, message));
        }
        Err(BeginError::Full { limit }) => {
            count(KeyResult::Full);
            let message = format!("the idempotency store is full ({limit} bytes, limits.idempotency_store)");
            return Err(problem(Problem::IdempotencyStoreFull, message));
        }
        Err(BeginError::Store(e)) => return Err(Answer::Internal(e.to_string())),
    };
    metrics.idempotency_records.set(records.len() as i64);
    let known = |rec: &Record| {
        format!("first request at {} ms (unix) with token {}, on route {:?}", rec.created_ms, rec.token, rec.route)
    };
    match verdict {
        Verdict::Forward => {
            let keyed = Keyed { scope, policy, timeout: r.timeout, records: records.clone(), settled: false };
            Ok(Begun::Forward(keyed))
        }
        Verdict::Replay(rec) => {
            count(KeyResult::Replayed);
            let State::Done { status, headers, .. } = &rec.state else { unreachable!("only done records replay") };
            Ok(Begun::Answered(replay_of(*status, headers, rec.body.clone())))
        }
        Verdict::Mismatch => {
            count(KeyResult::Mismatch);
            tracing::warn!(
                route = r.route,
                key = r.lock_key,
                idempotency_key = r.key,
                "idempotency key reused for another request"
            );
            let message = "this Idempotency-Key was used for another request (method, path, type or body differ)";
            Err(problem(Problem::IdempotencyKeyReused, message.into()))
        }
        Verdict::InFlight => {
            count(KeyResult::InFlight);
            Err(problem(Problem::IdempotencyInFlight, "the first request with this key is still in flight".into()))
        }
        Verdict::Unknown(rec) => {
            count(KeyResult::Unknown);
            let why = match &rec.state {
                State::Unknown { why } => why.as_str(),
                _ => "",
            };
            tracing::warn!(
                route = r.route,
                key = r.lock_key,
                idempotency_key = r.key,
                why,
                "retry of an unknown outcome refused"
            );
            let message = format!(
                "the first request with this key may or may not have been applied ({why}; {}); it is not forwarded again until an operator resolves it",
                known(&rec)
            );
            Err(problem(Problem::OutcomeUnknown, message))
        }
        Verdict::NotKept(status) => {
            count(KeyResult::NotKept);
            let message = format!(
                "the first request with this key was answered {status}, with a body too large to keep for replay"
            );
            Err(problem(Problem::ResponseNotKept, message))
        }
    }
}

/// A stored answer, as the upstream gave it (status, headers, body), marked
/// as a replay. The first answer is sent the same way (`finish`), so that a
/// replay is the same bytes but `Date` and the marker: the upstream's
/// reason phrase and HTTP version are not kept, either time.
fn replay_of(status: u16, headers: &[(String, Vec<u8>)], body: Bytes) -> Response<Body> {
    let mut resp = Response::new(crate::http::full(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_bytes(v)) {
            resp.headers_mut().append(k, v);
        }
    }
    resp.headers_mut().insert(idempotency::REPLAYED, HeaderValue::from_static("true"));
    resp
}

/// Settle the record by what the upstream exchange did.
pub async fn finish(
    metrics: &SidecarMetrics,
    route: &str,
    mut keyed: Keyed,
    result: Result<Response<Body>, Answer>,
) -> Result<Response<Body>, Answer> {
    keyed.settled = true;
    let records = keyed.records.clone();
    let count = |result| metrics.keyed(route, result);
    let scope = keyed.scope.clone();
    // An unknown outcome is kept a whole retention from now: the request
    // may still be applied.
    let unknown = |why: String| {
        count(KeyResult::Unknown);
        tracing::warn!(route, scope = %scope.replace('\n', " "), why, "idempotent request's outcome unknown");
        durably(records.settle(&scope, State::Unknown { why }, Bytes::new(), keyed.retained()));
    };
    let resp = match result {
        Ok(resp) => resp,
        Err(a) if a.may_have_reached_upstream() || matches!(a, Answer::UpstreamTimeout) => {
            let why = match &a {
                Answer::UpstreamTimeout => "no answer within the route's timeout".to_string(),
                Answer::UpstreamFailed(m) => format!("the exchange broke: {m}"),
                Answer::BodyCut { message, .. } => format!("the request body was cut: {message}"),
                other => format!("{other:?}"),
            };
            unknown(why);
            return Err(a);
        }
        Err(a) => {
            // Never sent: a retry may go.
            if let Err(e) = records.forget(&scope).await {
                tracing::error!(route, "dropping an unsent request's record: {e}");
            }
            return Err(a);
        }
    };
    let (mut parts, body) = resp.into_parts();
    // The marker is the sidecar's to set.
    parts.headers.remove(idempotency::REPLAYED);
    let status = parts.status.as_u16();
    let headers: Vec<(String, Vec<u8>)> =
        parts.headers.iter().map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec())).collect();
    // The route's timeout bounds the whole answer; its timer is made only
    // if the body is not in already (it nearly always is).
    let body = crate::http::Deadline::new(body, tokio::time::Instant::now(), keyed.timeout);
    let read = collect_up_to(body, keyed.policy.max_response as usize).await;
    let retained = keyed.retained();
    match read {
        Ok((bytes, None)) => {
            // What `replay_of` builds from the record, unmarked, made from
            // the parts at hand (no header parsed again). The store may
            // keep the record without its answer (no room); the client
            // still gets it whole.
            let mut answer = Response::new(crate::http::full(bytes.clone()));
            *answer.status_mut() = parts.status;
            *answer.headers_mut() = parts.headers;
            durably(records.settle(&scope, State::Done { status, headers, kept: true }, bytes, retained));
            count(KeyResult::Stored);
            Ok(answer)
        }
        Ok((prefix, Some(rest))) => {
            let state = State::Done { status, headers, kept: false };
            durably(records.settle(&scope, state, Bytes::new(), retained));
            count(KeyResult::Stored);
            let first = futures_util::stream::once(async move { Ok::<_, BoxError>(hyper::body::Frame::data(prefix)) });
            // The rest streams as forwarded, not bound by the route's timeout.
            let rest = http_body_util::BodyStream::new(rest.into_inner());
            let body = http_body_util::StreamBody::new(futures_util::StreamExt::chain(first, rest));
            Ok(Response::from_parts(parts, body.boxed()))
        }
        Err(e) => {
            unknown(format!("the upstream's answer broke off: {e}"));
            Err(Answer::UpstreamFailed(e))
        }
    }
}

/// The body whole if it is at most `max` bytes; else what was read (just
/// over `max`) and the rest, unread.
async fn collect_up_to(
    mut body: crate::http::Deadline<Body>,
    max: usize,
) -> Result<(Bytes, Option<crate::http::Deadline<Body>>), String> {
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| match e.downcast_ref::<crate::http::BodyTimedOut>() {
            Some(late) => {
                format!("no whole answer within the route's timeout ({})", humantime::format_duration(late.0))
            }
            None => crate::http::error_chain(&*e),
        })?;
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
            if buf.len() > max {
                return Ok((buf.freeze(), Some(body)));
            }
        }
    }
    Ok((buf.freeze(), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer that sends a frame and then nothing is cut at the route's
    /// timeout, and says so.
    #[tokio::test(start_paused = true)]
    async fn an_answer_that_stalls_is_cut_at_the_routes_timeout() {
        let first =
            futures_util::stream::once(async { Ok::<_, BoxError>(hyper::body::Frame::data(Bytes::from("par"))) });
        let stalled = futures_util::StreamExt::chain(first, futures_util::stream::pending());
        let body: Body = http_body_util::StreamBody::new(stalled).boxed();
        let body = crate::http::Deadline::new(body, tokio::time::Instant::now(), Duration::from_secs(5));
        let e = collect_up_to(body, 1 << 20).await.err().expect("cut");
        assert_eq!(e, "no whole answer within the route's timeout (5s)");
    }
}
