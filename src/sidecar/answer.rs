//! The sidecar's answers of its own (never the upstream's): the rejection
//! table of docs/DESIGN.md plus proxy failures, and the one place that maps
//! them to status codes, `wire` bodies, metric labels and who caused them.
//!
//! Every error says who caused it: the downstream client (bad token, bad
//! framing, too large), the lock service (unavailable), the upstream (timeout,
//! failure) or the sidecar itself.
//!
//! `refusals(phase)`: the reasons a refusal before a route (route `-`) or on
//! one can have, taken from the wire enums, so that the metrics start every
//! one of them at 0.

use fencegate_client::wire::{self, Problem, ProblemBody, Reason, Token};
use hyper::{Response, StatusCode};

use crate::http::{refusal, Body, Cause};
use crate::metrics::Outcome;

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
            Answer::Rejected(r)
                if matches!(r.reason, Reason::LockServiceUnavailable | Reason::LockServiceBehindFloor) =>
            {
                Cause::LockService
            }
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
    pub fn outcome(&self) -> Outcome {
        match self.cause() {
            Cause::Upstream => Outcome::UpstreamError,
            Cause::Internal => Outcome::Internal,
            Cause::Client | Cause::LockService => Outcome::Rejected,
        }
    }

    /// The `reason` label of `fencegate_sidecar_rejections_total` (the
    /// answer's `error`) if this is a refusal: every answer with outcome
    /// `rejected` is counted there.
    pub fn reason(&self) -> Option<&'static str> {
        if self.outcome() != Outcome::Rejected {
            return None;
        }
        Some(match self {
            Answer::Rejected(r) => r.reason.as_str(),
            Answer::BadRequest { error, .. } | Answer::BodyCut { error, .. } | Answer::Idempotency { error, .. } => {
                error.as_str()
            }
            Answer::NoRoute => Problem::NoRoute.as_str(),
            Answer::TooLarge { .. } => Problem::BodyTooLarge.as_str(),
            Answer::UpstreamTimeout
            | Answer::UpstreamFailed(_)
            | Answer::UpstreamUnreachable(_)
            | Answer::Internal(_) => return None,
        })
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
        let code = error.as_str();
        match message {
            Some(m) => write!(f, "{code}: {m}"),
            None => f.write_str(code),
        }
    }
}

/// When in a request's life a refusal is given: before a route is chosen
/// (counted under route `-`), or on a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Unrouted,
    Routed,
}

/// Whether a refusal with this `error` can be given in `phase`; never for
/// the answers that are not refusals (the upstream's or the sidecar's own
/// failures). Every variant is placed here, so a new one is placed too.
fn refused_in(p: Problem, phase: Phase) -> bool {
    use Phase::*;
    match p {
        // Framing, method, disguise and path checks, the route table,
        // and the HTTP parser's own refusals (`refusals.rs`).
        Problem::MalformedPath
        | Problem::InvalidKey
        | Problem::MalformedMethod
        | Problem::InvalidParam
        | Problem::UnfencedWrite
        | Problem::DisguisedRequest
        | Problem::NoRoute
        | Problem::MalformedRequest
        | Problem::HeadersTooLarge
        | Problem::UriTooLong => phase == Unrouted,
        // The announced length is judged before routing, a body read on a
        // route after.
        Problem::AmbiguousFraming | Problem::BodyTooLarge => true,
        Problem::BodyTimeout
        | Problem::MalformedIdempotencyKey
        | Problem::MissingIdempotencyKey
        | Problem::IdempotencyKeyReused
        | Problem::IdempotencyInFlight
        | Problem::OutcomeUnknown
        | Problem::ResponseNotKept
        | Problem::IdempotencyQuota => phase == Routed,
        Problem::UpstreamTimeout | Problem::UpstreamError | Problem::IdempotencyStoreFull | Problem::Internal => false,
    }
}

/// Every `reason` a refusal in `phase` can be counted with: the fence's
/// reasons (on a route) and the other refusals, from the wire enums.
pub(crate) fn refusals(phase: Phase) -> impl Iterator<Item = &'static str> {
    let fence = Reason::ALL.into_iter().filter(move |_| phase == Phase::Routed).map(Reason::as_str);
    fence.chain(Problem::ALL.into_iter().filter(move |p| refused_in(*p, phase)).map(Problem::as_str))
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
            (
                rejected(Reason::LockServiceBehindFloor),
                503,
                "rejected",
                Cause::LockService,
                "lock_service_behind_floor",
            ),
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
                (answer.status().as_u16(), answer.outcome().as_str(), answer.cause()),
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

    /// Every refusal the sidecar can give is counted under a `reason` that
    /// was at 0 from the start, and nothing else is counted as one.
    #[test]
    fn every_refusal_reason_starts_at_zero() {
        use std::collections::BTreeSet;
        let routed: BTreeSet<_> = refusals(Phase::Routed).collect();
        let unrouted: BTreeSet<_> = refusals(Phase::Unrouted).collect();
        let status_of = |name: &str| {
            let fence = Reason::ALL.into_iter().find(|r| r.as_str() == name).map(Reason::status);
            fence.or_else(|| Problem::ALL.into_iter().find(|p| p.as_str() == name).map(Problem::status)).unwrap()
        };
        let mut answers: Vec<Answer> = Reason::ALL.into_iter().map(rejected).collect();
        // Every 4xx problem is a refusal, in whichever answer carries it; the
        // 5xx ones come only in the answers of the upstream's or the
        // sidecar's failures, below.
        for error in Problem::ALL.into_iter().filter(|p| p.status().is_client_error()) {
            let message = String::new();
            answers.push(Answer::BadRequest { error, message: message.clone() });
            answers.push(Answer::BodyCut { error, message: message.clone() });
            answers.push(Answer::Idempotency { error, message });
        }
        answers.extend([
            Answer::NoRoute,
            Answer::TooLarge { limit: 1 },
            Answer::UpstreamTimeout,
            Answer::UpstreamFailed("x".into()),
            Answer::UpstreamUnreachable("x".into()),
            Answer::Internal("x".into()),
        ]);
        for a in &answers {
            match a.reason() {
                Some(reason) => {
                    assert_eq!(a.outcome(), Outcome::Rejected, "{a:?}");
                    assert!(routed.contains(reason) || unrouted.contains(reason), "{a:?} counted from nothing");
                    assert_eq!(a.status(), status_of(reason), "{a:?}: its reason is its error");
                }
                None => assert_ne!(a.outcome(), Outcome::Rejected, "{a:?} is a refusal without a reason"),
            }
        }
        // The fence's reasons need a route; the route table's refusals come before one.
        for reason in Reason::ALL {
            assert!(routed.contains(reason.as_str()) && !unrouted.contains(reason.as_str()));
        }
        for p in [Problem::MalformedPath, Problem::NoRoute, Problem::MalformedRequest, Problem::HeadersTooLarge] {
            assert!(unrouted.contains(p.as_str()) && !routed.contains(p.as_str()), "{p:?}");
        }
        for p in [Problem::UpstreamError, Problem::Internal, Problem::IdempotencyStoreFull] {
            assert!(!unrouted.contains(p.as_str()) && !routed.contains(p.as_str()), "{p:?} is no refusal");
        }
    }
}
