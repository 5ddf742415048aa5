//! The sidecar's answers of its own (never the upstream's): the rejection
//! table of docs/DESIGN.md plus proxy failures, and the one place that maps
//! them to status codes, `wire` bodies, metric labels and who caused them.
//!
//! Every error says who caused it: the downstream client (bad token, bad
//! framing, too large), the lock service (unavailable), the upstream (timeout,
//! failure) or the sidecar itself.

use fencegate_client::wire::{self, Problem, ProblemBody, Reason, Token};
use hyper::{Response, StatusCode};

use crate::http::{refusal, Body, Cause};

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
        error: Problem,
        message: String,
    },
    NoRoute,
    TooLarge {
        limit: u64,
    },
    UpstreamTimeout,
    /// The exchange failed after the request may have reached the upstream.
    UpstreamFailed(String),
    /// The client's body failed (too slow, over the limit) after the
    /// request head and part of it reached the upstream.
    BodyCut {
        error: Problem,
        message: String,
    },
    /// What the idempotency record of the request's key says (I1).
    Idempotency {
        error: Problem,
        message: String,
    },
    /// No connection: the request never left the sidecar.
    UpstreamUnreachable(String),
    Internal(String),
}

impl Answer {
    /// Whether the upstream may have received (and so may apply) what was
    /// sent: then S1 keeps higher tokens waiting as if it had not answered.
    pub fn may_have_reached_upstream(&self) -> bool {
        matches!(self, Answer::UpstreamFailed(_) | Answer::BodyCut { .. })
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Answer::Rejected(r) => r.reason.status(),
            Answer::BadRequest { error, .. } | Answer::BodyCut { error, .. } | Answer::Idempotency { error, .. } => {
                error.status()
            }
            Answer::NoRoute => Problem::NoRoute.status(),
            Answer::TooLarge { .. } => Problem::BodyTooLarge.status(),
            Answer::UpstreamTimeout => Problem::UpstreamTimeout.status(),
            Answer::UpstreamFailed(_) | Answer::UpstreamUnreachable(_) => Problem::UpstreamError.status(),
            Answer::Internal(_) => Problem::Internal.status(),
        }
    }

    /// Who caused it.
    pub fn cause(&self) -> Cause {
        match self {
            Answer::Rejected(r) if r.reason == Reason::LockServiceUnavailable => Cause::LockService,
            Answer::Idempotency { error: Problem::IdempotencyStoreFull, .. } => Cause::Internal,
            Answer::Rejected(_)
            | Answer::BadRequest { .. }
            | Answer::BodyCut { .. }
            | Answer::Idempotency { .. }
            | Answer::NoRoute
            | Answer::TooLarge { .. } => Cause::Client,
            Answer::UpstreamTimeout | Answer::UpstreamFailed(_) | Answer::UpstreamUnreachable(_) => Cause::Upstream,
            Answer::Internal(_) => Cause::Internal,
        }
    }

    /// The `outcome` label of `fencegate_sidecar_requests_total`: the
    /// sidecar's own failures are `internal`, not refusals.
    pub fn outcome(&self) -> &'static str {
        match self.cause() {
            Cause::Upstream => "upstream_error",
            Cause::Internal => "internal",
            Cause::Client | Cause::LockService => "rejected",
        }
    }

    /// The `error` and `message` of the body of an answer that is not a rejection.
    fn problem(&self) -> Option<(Problem, Option<String>)> {
        Some(match self {
            Answer::Rejected(_) => return None,
            Answer::BadRequest { error, message }
            | Answer::BodyCut { error, message }
            | Answer::Idempotency { error, message } => (*error, Some(message.clone())),
            Answer::NoRoute => (Problem::NoRoute, Some("no route matches this method and path".into())),
            Answer::TooLarge { limit } => (Problem::BodyTooLarge, Some(format!("the body limit is {limit} bytes"))),
            Answer::UpstreamTimeout => (Problem::UpstreamTimeout, None),
            Answer::UpstreamFailed(m) | Answer::UpstreamUnreachable(m) => (Problem::UpstreamError, Some(m.clone())),
            Answer::Internal(m) => (Problem::Internal, Some(m.clone())),
        })
    }

    pub fn into_response(self, route: &str) -> Response<Body> {
        let (status, cause) = (self.status(), self.cause());
        let Some((error, message)) = self.problem() else {
            let Answer::Rejected(r) = self else { unreachable!("only rejections have no problem") };
            let body = wire::Rejection {
                error: r.reason,
                route: route.to_string(),
                key: r.key,
                token: r.token,
                current: r.current,
            };
            return refusal(status, cause, &body);
        };
        let route = (error != Problem::NoRoute).then(|| route.to_string());
        refusal(status, cause, &ProblemBody { error, route, message })
    }
}

/// For a log line: the body's `error` code, and its message.
impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some((error, message)) = self.problem() else {
            let Answer::Rejected(r) = self else { unreachable!("only rejections have no problem") };
            return f.write_str(r.reason.as_str());
        };
        let code = serde_json::to_value(error).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        match message {
            Some(m) => write!(f, "{code}: {m}"),
            None => f.write_str(&code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(reason: Reason) -> Answer {
        Answer::Rejected(Rejection { reason, key: "rack/1".into(), token: Some(3), current: Some(4) })
    }

    /// S1: a fenced request that may have reached the upstream keeps higher
    /// tokens waiting until its route's timeout; one that provably did not
    /// (or whose timeout has passed) lets them go.
    #[test]
    fn answers_say_whether_the_upstream_may_have_the_request() {
        let cut = Answer::BodyCut { error: Problem::BodyTimeout, message: "m".into() };
        for a in [Answer::UpstreamFailed("x".into()), cut] {
            assert!(a.may_have_reached_upstream(), "{a:?}");
        }
        for a in [
            Answer::UpstreamUnreachable("x".into()),
            Answer::UpstreamTimeout,
            Answer::TooLarge { limit: 1 },
            Answer::BadRequest { error: Problem::BodyTimeout, message: "m".into() },
            Answer::Internal("x".into()),
        ] {
            assert!(!a.may_have_reached_upstream(), "{a:?}");
        }
    }

    /// Each answer's status, `outcome` label, cause and body `error`.
    #[test]
    fn every_answer_has_one_status_outcome_and_cause() {
        let bad = |error| Answer::BadRequest { error, message: "m".into() };
        for (answer, status, outcome, cause, error) in [
            (rejected(Reason::StaleToken), 409, "rejected", Cause::Client, "stale_token"),
            (rejected(Reason::MissingToken), 428, "rejected", Cause::Client, "missing_token"),
            (rejected(Reason::MalformedToken), 400, "rejected", Cause::Client, "malformed_token"),
            (rejected(Reason::LockServiceUnavailable), 503, "rejected", Cause::LockService, "lock_service_unavailable"),
            (bad(Problem::MalformedPath), 400, "rejected", Cause::Client, "malformed_path"),
            (bad(Problem::AmbiguousFraming), 400, "rejected", Cause::Client, "ambiguous_framing"),
            (
                Answer::BodyCut { error: Problem::BodyTimeout, message: "m".into() },
                408,
                "rejected",
                Cause::Client,
                "body_timeout",
            ),
            (
                Answer::Idempotency { error: Problem::OutcomeUnknown, message: "m".into() },
                409,
                "rejected",
                Cause::Client,
                "outcome_unknown",
            ),
            (
                Answer::Idempotency { error: Problem::IdempotencyStoreFull, message: "m".into() },
                503,
                "internal",
                Cause::Internal,
                "idempotency_store_full",
            ),
            (Answer::NoRoute, 404, "rejected", Cause::Client, "no_route"),
            (Answer::TooLarge { limit: 9 }, 413, "rejected", Cause::Client, "body_too_large"),
            (Answer::UpstreamTimeout, 504, "upstream_error", Cause::Upstream, "upstream_timeout"),
            (Answer::UpstreamFailed("x".into()), 502, "upstream_error", Cause::Upstream, "upstream_error"),
            (Answer::UpstreamUnreachable("x".into()), 502, "upstream_error", Cause::Upstream, "upstream_error"),
            (Answer::Internal("x".into()), 500, "internal", Cause::Internal, "internal"),
        ] {
            assert_eq!(
                (answer.status().as_u16(), answer.outcome(), answer.cause()),
                (status, outcome, cause),
                "{answer:?}"
            );
            let line = answer.to_string();
            assert!(line.starts_with(error) && !line.contains('{'), "{line}");
            let resp = answer.into_response("r");
            assert_eq!(resp.status().as_u16(), status);
            assert_eq!(
                resp.headers().contains_key(hyper::header::RETRY_AFTER),
                status == 503,
                "Retry-After on 503 only"
            );
            let body = futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(resp.into_body()))
                .unwrap()
                .unwrap()
                .to_bytes();
            let parsed: wire::SidecarAnswer = serde_json::from_slice(&body).unwrap();
            let code = match parsed {
                wire::SidecarAnswer::Rejected(r) => r.error.as_str().to_string(),
                wire::SidecarAnswer::Problem(p) => serde_json::to_value(p.error).unwrap().as_str().unwrap().to_string(),
            };
            assert_eq!(code, error);
        }
    }
}
