//! The node's console (docs/decisions/0011): `/ui` on the client API
//! listener, read-only. The page and its script hold no data and are served
//! to anyone; the script reads `GET /v1/cluster`, `GET /v1/locks?prefix=`
//! and `GET /v1/watch?prefix=` with the browser's own credentials (a client
//! certificate, or a bearer token the operator gives the tab), so it
//! authenticates as the API does and shows an identity only the keys its
//! ACL lets it read and watch. Without authentication configured it is as
//! open as the API.

use hyper::{Method, Response};

use super::error::ApiError;

use crate::http::page::{self, Page};
use crate::http::Body;

/// Where the console is.
const BASE: &str = "/ui";

const PAGE: Page = Page { html: include_str!("ui/index.html"), script: include_str!("ui/app.js") };

/// Whether `path` is the console's.
pub(super) fn under(path: &str) -> bool {
    path.strip_prefix(BASE).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The answer to `method path` under the console: an asset, or a refusal
/// under the same policy.
pub(super) fn answer(method: &Method, path: &str) -> Response<Body> {
    let refused = match (method == Method::GET, page::asset(BASE, &PAGE, path)) {
        (true, Some(asset)) => return asset,
        (true, None) => ApiError::NotFound,
        (false, _) => ApiError::MethodNotAllowed("GET"),
    };
    page::secured(refused.into_response())
}
