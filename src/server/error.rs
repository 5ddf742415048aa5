//! The Lock API's errors, and the one place that maps them to HTTP answers.

use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::json;
use thiserror::Error;

use crate::http::{json, Body, BodyError};
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
    #[error("no such endpoint")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("lease not found (released, expired or never granted)")]
    LeaseNotFound,
    #[error("{key} is held")]
    Held { key: String, holder: Option<String>, token: Token, lock_delay: bool },
    /// No leader known, or this node stopped being leader mid-request.
    #[error("no leader: {0}")]
    NoLeader(String),
    /// No quorum answered in time. The outcome of a write is unknown.
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn into_response(self) -> Response<Body> {
        let message = self.to_string();
        let (status, body) = match self {
            ApiError::Invalid(_) | ApiError::BadRequest(_) => {
                (StatusCode::BAD_REQUEST, json!({"error": "bad_request", "message": message}))
            }
            ApiError::Body(BodyError::TooLarge(_)) => {
                (StatusCode::PAYLOAD_TOO_LARGE, json!({"error": "body_too_large", "message": message}))
            }
            ApiError::Body(_) => (StatusCode::BAD_REQUEST, json!({"error": "bad_request", "message": message})),
            ApiError::NotFound => (StatusCode::NOT_FOUND, json!({"error": "not_found", "message": message})),
            ApiError::MethodNotAllowed => {
                (StatusCode::METHOD_NOT_ALLOWED, json!({"error": "method_not_allowed", "message": message}))
            }
            ApiError::LeaseNotFound => (StatusCode::NOT_FOUND, json!({"error": "lease_not_found", "message": message})),
            ApiError::Held { key, holder, token, lock_delay } => (
                StatusCode::CONFLICT,
                json!({"error": "held", "key": key, "holder": holder, "token": token, "lock_delay": lock_delay}),
            ),
            ApiError::NoLeader(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, json!({"error": "no_leader", "message": message}))
            }
            ApiError::Unavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, json!({"error": "unavailable", "message": message}))
            }
            ApiError::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, json!({"error": "internal", "message": message}))
            }
        };
        let mut resp = json(status, &body);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}
