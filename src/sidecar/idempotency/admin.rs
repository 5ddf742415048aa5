//! The admin calls on idempotency records, on the metrics listener:
//! `POST /admin/idempotency/show` and `/resolve` (what `fencegate
//! idempotency` sends), and the token they need.
//!
//! A record is named by its holder (lock key, token, key, client identity).
//! The token lives in `state_dir/admin-token`.

use hyper::body::Incoming;
use hyper::{Request, Response};

use crate::http::Body;
use crate::sidecar::idempotency::{self, records};
use crate::sidecar::Sidecar;

/// The admin token in `dir/admin-token`, made (random, 256 bits, mode 0600)
/// on first start.
pub fn token(dir: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("admin-token");
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => anyhow::bail!("{} is empty: delete it to have a new token made", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("reading {}: {e}", path.display()),
    }
    let token = format!("fga_{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>());
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    f.write_all(format!("{token}\n").as_bytes())?;
    f.sync_all()?;
    crate::durable::sync_dir(dir)?;
    Ok(token)
}

/// An admin call's body: which record (a record is its holder's: the
/// lock key, the token, the key, and the client's certificate name where
/// the sidecar takes client certificates), and for `resolve`, the verdict.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordCall {
    lock_key: String,
    token: u64,
    key: String,
    #[serde(default)]
    identity: Option<String>,
    #[serde(default)]
    applied: Option<u16>,
}

impl Sidecar {
    /// Why `req` may not see what only the admin may (the admin calls, the
    /// console's data), if it may not: it must carry the bearer token of
    /// `state_dir/admin-token`, and the metrics listener be on loopback
    /// (the token travels in clear text).
    pub(in crate::sidecar) fn admin_refusal(&self, req: &Request<Incoming>) -> Option<Response<Body>> {
        use hyper::StatusCode;
        let refuse = |status, message: &str| {
            crate::http::refusal(status, crate::http::Cause::Client, &serde_json::json!({ "error": message }))
        };
        if !self.live().settings.metrics_listen.is_some_and(|a| a.ip().is_loopback()) {
            return Some(refuse(StatusCode::FORBIDDEN, "admin calls are served only on a loopback metrics_listen"));
        }
        let presented = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(crate::auth::token_hash);
        if presented != Some(self.admin_token) {
            let message = "admin calls need `Authorization: Bearer` with the token in state_dir/admin-token";
            return Some(refuse(StatusCode::UNAUTHORIZED, message));
        }
        None
    }

    /// `POST /admin/idempotency/show` and `/resolve` (JSON `RecordCall`):
    /// only with the bearer token of `state_dir/admin-token`, only when the
    /// metrics listener is on loopback (the token travels in clear text),
    /// and never from a browser (an `Origin` header: a page cannot forge
    /// the token, but the refusal costs nothing).
    pub(in crate::sidecar) async fn admin(&self, action: &str, req: Request<Incoming>) -> Response<Body> {
        use hyper::StatusCode;
        let refuse = |status, message: String| {
            crate::http::refusal(status, crate::http::Cause::Client, &serde_json::json!({ "error": message }))
        };
        if req.headers().contains_key(hyper::header::ORIGIN) {
            return refuse(StatusCode::FORBIDDEN, "admin calls are not taken from browsers".into());
        }
        if let Some(refusal) = self.admin_refusal(&req) {
            return refusal;
        }
        if req.method() != hyper::Method::POST {
            return refuse(StatusCode::METHOD_NOT_ALLOWED, "POST a JSON body".into());
        }
        let call: RecordCall = match crate::http::read_body(req.into_body(), 64 << 10).await {
            Ok(bytes) => match crate::http::parse_json(&bytes) {
                Ok(c) => c,
                Err(e) => return refuse(StatusCode::BAD_REQUEST, e.to_string()),
            },
            Err(e) => return refuse(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let scope = idempotency::scope(&call.lock_key, call.token, &call.key, call.identity.as_deref());
        let record = match action {
            "show" => self.records.get(&scope).ok_or(records::ResolveError::NoSuchKey),
            "resolve" => {
                let applied = call.applied.filter(|s| (200..=599).contains(s));
                if call.applied.is_some() && applied.is_none() {
                    return refuse(StatusCode::BAD_REQUEST, "applied must be an HTTP status, 200 to 599".into());
                }
                let resolved = self.records.resolve(&scope, applied).await;
                if resolved.is_ok() {
                    let routes = resolved.as_ref().map(|r| r.route.clone()).unwrap_or_default();
                    self.metrics.keyed(&routes, crate::metrics::KeyResult::Resolved);
                    tracing::warn!(
                        lock_key = call.lock_key,
                        key = call.key,
                        ?applied,
                        "unknown outcome resolved by an operator"
                    );
                }
                resolved
            }
            other => return refuse(StatusCode::NOT_FOUND, format!("no admin call {other:?} (show, resolve)")),
        };
        match record {
            Ok(r) => {
                let status = match &r.state {
                    idempotency::State::Done { status, .. } => Some(*status),
                    _ => None,
                };
                let gone = action == "resolve" && call.applied.is_none();
                let state = if gone { "forgotten" } else { r.state.name() };
                crate::http::json(
                    StatusCode::OK,
                    &serde_json::json!({
                        "route": r.route, "state": state, "token": r.token, "status": status,
                        "created_ms": r.created_ms, "expires_ms": r.expires_ms,
                        "why": match &r.state { idempotency::State::Unknown { why } => Some(why.as_str()), _ => None },
                    }),
                )
            }
            Err(records::ResolveError::NoSuchKey) => refuse(StatusCode::NOT_FOUND, "no record for this key".into()),
            Err(records::ResolveError::NotUnknown(state)) => {
                refuse(StatusCode::CONFLICT, format!("the record is {state}: only an unknown outcome is resolved"))
            }
            Err(records::ResolveError::Store(e)) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e),
        }
    }
}
