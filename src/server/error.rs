//! The Lock API's errors, and the one place that maps them to HTTP answers.
//!
//! Each variant has its wire code and its cause (client, lock service or
//! internal), and is answered through `http::refusal`.

use fencegate_client::wire::{self, ErrorCode, HeldBy, NodePosition};
use hyper::header::{HeaderValue, ALLOW};
use hyper::Response;
use thiserror::Error;

use crate::http::{refusal, Body, BodyError, Cause};
use crate::lock::state::Token;
use crate::lock::validate::InvalidInput;

#[derive(Debug, Error)]
pub enum ApiError {
    #[error("{0}")]
    Invalid(#[from] InvalidInput),
    #[error("{0}")]
    Body(#[from] BodyError),
    #[error("{0}")]
    BadRequest(String),
    #[error("the request body did not arrive within {}", humantime::format_duration(*.0))]
    BodyTimeout(std::time::Duration),
    #[error("{0}")]
    Unauthorized(String),
    /// `identity` lacks the right (or the lease is not its own).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("no such endpoint")]
    NotFound,
    /// A known path with another method; the methods it takes, for `Allow`.
    #[error("method not allowed (allowed: {0})")]
    MethodNotAllowed(&'static str),
    #[error("lease not found (released, expired or never granted)")]
    LeaseNotFound,
    #[error("{key} is held")]
    Held { key: String, holder: Option<String>, token: Token, lock_delay: bool },
    /// A membership change refused; nothing changed.
    #[error("{0}")]
    MembershipRefused(String),
    /// No leader known, or this node stopped being leader mid-request.
    #[error("no leader: {0}")]
    NoLeader(String),
    /// No quorum answered in time. The outcome of a write is unknown.
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// A peer of another cluster: refused, nothing applied.
    #[error("{0}")]
    ForeignCluster(String),
    /// A watch's `after` (or `cluster`) names a position this node cannot
    /// vouch for: beyond its revision, or of another history.
    #[error("{why}")]
    PositionUnknown { why: String, rev: u64, cluster: Option<String> },
}

impl ApiError {
    /// The wire code, and who caused the failure.
    fn code(&self) -> (ErrorCode, Cause) {
        match self {
            ApiError::Invalid(_) | ApiError::BadRequest(_) => (ErrorCode::BadRequest, Cause::Client),
            ApiError::Body(BodyError::TooLarge(_)) => (ErrorCode::BodyTooLarge, Cause::Client),
            ApiError::Body(_) => (ErrorCode::BadRequest, Cause::Client),
            ApiError::BodyTimeout(_) => (ErrorCode::RequestTimeout, Cause::Client),
            ApiError::Unauthorized(_) => (ErrorCode::Unauthorized, Cause::Client),
            ApiError::Forbidden(_) => (ErrorCode::Forbidden, Cause::Client),
            ApiError::QuotaExceeded(_) => (ErrorCode::QuotaExceeded, Cause::Client),
            ApiError::NotFound => (ErrorCode::NotFound, Cause::Client),
            ApiError::MethodNotAllowed(_) => (ErrorCode::MethodNotAllowed, Cause::Client),
            ApiError::LeaseNotFound => (ErrorCode::LeaseNotFound, Cause::Client),
            ApiError::Held { .. } => (ErrorCode::Held, Cause::Client),
            ApiError::MembershipRefused(_) => (ErrorCode::MembershipRefused, Cause::Client),
            ApiError::NoLeader(_) => (ErrorCode::NoLeader, Cause::LockService),
            ApiError::Unavailable(_) => (ErrorCode::Unavailable, Cause::LockService),
            ApiError::Internal(_) => (ErrorCode::Internal, Cause::Internal),
            ApiError::PositionUnknown { .. } => (ErrorCode::PositionUnknown, Cause::Client),
            ApiError::ForeignCluster(_) => (ErrorCode::ForeignCluster, Cause::Client),
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let (code, cause) = self.code();
        // RFC 9110: a 405 says which methods the path takes.
        let allow = match &self {
            ApiError::MethodNotAllowed(allow) => Some(HeaderValue::from_static(allow)),
            _ => None,
        };
        let body = match self {
            ApiError::Held { key, holder, token, lock_delay } => {
                let held = Some(HeldBy { key, holder, token, lock_delay });
                wire::ApiError { error: code, message: None, held, position: None }
            }
            ApiError::PositionUnknown { why, rev, cluster } => wire::ApiError {
                error: code,
                message: Some(why),
                held: None,
                position: Some(NodePosition { rev, cluster }),
            },
            other => wire::ApiError { error: code, message: Some(other.to_string()), held: None, position: None },
        };
        let mut resp = refusal(code.status(), cause, &body);
        if let Some(allow) = allow {
            resp.headers_mut().insert(ALLOW, allow);
        }
        resp
    }
}
