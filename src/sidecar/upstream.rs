//! Forwarding to the upstream: a reverse proxy a proxy engineer would sign off.
//!
//! - request and response bodies stream both ways (never buffered);
//! - keep-alive connections kept per event loop (HTTP/1.1 upstream, `pool`),
//!   over TLS for `https://` upstreams: a pooled connection is driven by the
//!   loop that opened it, so a request never borrows another loop's;
//! - hop-by-hop headers (RFC 9110 §7.6.1, plus any named in `Connection`) are
//!   dropped both ways; `X-Forwarded-For` and `Forwarded` are appended
//!   (`http::ClientNames`); `Host`
//!   is passed on as the client sent it (the upstream's own if it sent none);
//!   `X-Fence-Token` is passed on;
//! - the route's timeout bounds the wait for the upstream's response head
//!   (504), a failed connection or exchange is a 502.
//!
//! Knows no fencing: it is only reached with a permit (fenced) or on an
//! unfenced route. A failure says whether anything may have reached the
//! upstream (`pool`'s `Failure::Connect`, nothing sent, vs
//! `Failure::Exchange`): S1's permit is released at once only for the
//! first.

pub(crate) mod pool;

use std::sync::LazyLock;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::header::{
    HeaderName, HeaderValue, CONNECTION, HOST, PROXY_AUTHORIZATION, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use hyper::http::uri::{PathAndQuery, Scheme};
use hyper::{HeaderMap, Request, Response, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

use fencegate_client::wire::Problem;

use crate::http::{error_chain, Body, ClientNames};
use crate::sidecar::answer::Answer;
use crate::sidecar::upstream::pool::{Failure, Pool};

static HOP_BY_HOP: [HeaderName; 8] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
    PROXY_AUTHORIZATION,
];

/// A bit for each length of a name in `HOP_BY_HOP` (all under 64): most
/// names have none of them, and a length is cheaper to test than eight
/// names.
static HOP_BY_HOP_LENGTHS: LazyLock<u64> =
    LazyLock::new(|| HOP_BY_HOP.iter().fold(0, |bits, n| bits | 1 << n.as_str().len()));

fn is_hop_by_hop(name: &HeaderName) -> bool {
    let len = name.as_str().len();
    len < 64 && *HOP_BY_HOP_LENGTHS & (1 << len) != 0 && HOP_BY_HOP.contains(name)
}

pub(crate) struct Upstream {
    pool: Pool,
}

impl Upstream {
    /// `tls` is used for `https://` upstreams; `http://` ones stay plain.
    /// Connections are kept for each of `workers` event loops.
    pub(crate) fn new(tls: rustls::ClientConfig, workers: usize) -> Self {
        Self { pool: Pool::new(connector(tls), workers) }
    }
}

pub(in crate::sidecar) fn connector(tls: rustls::ClientConfig) -> HttpsConnector<HttpConnector> {
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(Duration::from_secs(5)));
    // hyper-rustls hands `https://` URIs to the TCP connector, which
    // refuses any scheme but http unless told otherwise.
    tcp.enforce_http(false);
    HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().wrap_connector(tcp)
}

/// Drop hop-by-hop headers, including those the `Connection` header names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over their few names, instead of
    // a lookup for each of the eight.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

impl Upstream {
    /// Send `req` (its body streaming, bounded by the caller) to `base`.
    pub(crate) async fn forward(
        &self,
        base: &Uri,
        req: Request<Body>,
        client: &ClientNames,
        tls: bool,
        timeout: Duration,
        stall: Duration,
    ) -> Result<Response<Body>, Answer> {
        let (mut parts, body) = req.into_parts();
        // The host the client asked for: its Host, or HTTP/2's authority.
        let host = parts
            .headers
            .get(HOST)
            .cloned()
            .or_else(|| parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()));
        strip_hop_by_hop(&mut parts.headers);
        // HTTP/1.1 needs one: without it, the upstream's own.
        if let Some(h) = host.clone().or_else(|| upstream_host(base)) {
            parts.headers.insert(HOST, h);
        }
        client.name(&mut parts.headers, host.as_ref(), tls);
        // Origin form, the path as the client sent it (shared, not copied
        // or parsed again).
        let path = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = Uri::from(path);
        parts.version = hyper::Version::HTTP_11;

        let resp = match tokio::time::timeout(timeout, self.pool.send(base, Request::from_parts(parts, body))).await {
            Err(_) => return Err(Answer::UpstreamTimeout),
            Ok(Err(Failure::Connect(e))) => return Err(Answer::UpstreamUnreachable(error_chain(&*e))),
            Ok(Err(Failure::Exchange(e))) => {
                return Err(body_failure(&e).unwrap_or_else(|| Answer::UpstreamFailed(error_chain(&e))))
            }
            Ok(Ok(r)) => r,
        };
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        // An upstream that stalls half-way through its answer is cut (the
        // client sees the answer end early) rather than holding the
        // connection for ever.
        let body = crate::http::Deadline::between_frames(body, stall);
        Ok(Response::from_parts(parts, body.boxed()))
    }
}

/// `base`'s authority as an HTTP client names it in `Host`: without the
/// scheme's default port.
fn upstream_host(base: &Uri) -> Option<HeaderValue> {
    let authority = base.authority()?;
    let default = if base.scheme() == Some(&Scheme::HTTPS) { 443 } else { 80 };
    let name = match authority.port_u16() {
        Some(p) if p != default => authority.as_str(),
        _ => authority.host(),
    };
    HeaderValue::from_str(name).ok()
}

/// The client's own body broke the exchange (it came too slowly or grew
/// over the limit): the client's fault, not the upstream's.
fn body_failure(e: &(dyn std::error::Error + 'static)) -> Option<Answer> {
    let mut source = Some(e);
    while let Some(e) = source {
        if let Some(t) = e.downcast_ref::<crate::http::BodyTimedOut>() {
            return Some(Answer::BodyCut { error: Problem::BodyTimeout, message: t.to_string() });
        }
        if e.is::<http_body_util::LengthLimitError>() {
            return Some(Answer::BodyCut { error: Problem::BodyTooLarge, message: e.to_string() });
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_including_those_named_in_connection() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("x-fence-token", "34"),
            ("content-type", "application/json"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-fence-token", "content-type"]);
    }

    /// The scan that skips the removals (by the names' lengths first) must
    /// see every hop-by-hop name, each on its own.
    #[test]
    fn hop_by_hop_headers_go_without_a_connection_header() {
        for name in HOP_BY_HOP.iter().map(HeaderName::as_str) {
            let mut h = HeaderMap::new();
            h.insert(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_static("x"));
            h.insert("x-fence-token", HeaderValue::from_static("34"));
            strip_hop_by_hop(&mut h);
            let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
            assert_eq!(left, vec!["x-fence-token"], "{name}");
        }
    }

    #[test]
    fn without_a_host_from_the_client_the_upstreams_goes_without_its_default_port() {
        let host = |u: &str| upstream_host(&u.parse().unwrap()).unwrap();
        assert_eq!(host("http://api:80"), "api");
        assert_eq!(host("http://api:8080"), "api:8080");
        assert_eq!(host("https://api:443"), "api");
        assert_eq!(host("https://api:80"), "api:80");
        assert_eq!(host("http://[::1]:80"), "[::1]");
    }
}
