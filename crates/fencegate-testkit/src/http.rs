//! HTTP as a test speaks it: JSON answers, raw requests with any method or
//! header, and raw bytes on a fresh TCP connection for what a well-behaved
//! client would never send.

use std::time::Duration;

use bytes::Bytes;
use fencegate_client::http::{HttpClient, Reply};
use http_body_util::Full;
use serde_json::Value;

/// The body of every fenced write the tests and benchmarks send.
pub const DRAINED: &[u8] = b"{\"state\":\"drained\"}";

pub(crate) fn client() -> HttpClient {
    HttpClient::new(8 << 20)
}

/// GET a URL and parse its JSON, `None` on any failure (2 s at most).
pub async fn get_json(url: &str) -> Option<Value> {
    let a = client().call(hyper::Method::GET, url, None, Duration::from_secs(2)).await.ok()?;
    serde_json::from_slice(&a.body).ok()
}

/// GET a URL's body as text (2 s at most).
pub async fn get_text(url: &str) -> String {
    let a = client()
        .call(hyper::Method::GET, url, None, Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    String::from_utf8_lossy(&a.body).into_owned()
}

/// Send `method url` with an optional JSON body; the whole answer (10 s at most).
pub async fn raw_answer(method: &str, url: &str, body: Option<&str>) -> Reply {
    let m = hyper::Method::from_bytes(method.as_bytes()).unwrap();
    client()
        .call(m, url, body.map(|b| b.as_bytes().to_vec()), Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// Send `method url` with an optional JSON body; (status, JSON body or Null).
pub async fn raw(method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
    status_and_json(raw_answer(method, url, body).await)
}

/// A request with an optional `X-Fence-Token` and extra headers.
pub fn request(
    method: &str,
    url: &str,
    token: Option<u64>,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> hyper::Request<Full<Bytes>> {
    let mut b = hyper::Request::builder().method(method).uri(url);
    if let Some(t) = token {
        b = b.header(fencegate_client::TOKEN_HEADER, t.to_string());
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body.into())).unwrap()
}

/// `PUT {uri}` with `token` and a small JSON body, as an inventory client
/// fencing a rack write would send it (`uri` may be a bare path, for a
/// connection of one's own).
pub fn fenced_put(uri: impl AsRef<str>, token: u64) -> hyper::Request<Full<Bytes>> {
    request("PUT", uri.as_ref(), Some(token), &[("host", "inventory")], Bytes::from_static(DRAINED))
}

/// Send `req`; (status, JSON body or Null) within `within`.
pub async fn send(req: hyper::Request<Full<Bytes>>, within: Duration) -> (u16, Value) {
    let what = format!("{} {}", req.method(), req.uri());
    status_and_json(client().send(req, within).await.unwrap_or_else(|e| panic!("{what}: {e}")))
}

/// The same, `Err` when no answer came within `within` (a client that
/// gives up).
pub async fn try_send(req: hyper::Request<Full<Bytes>>, within: Duration) -> Result<(u16, Value), String> {
    client().send(req, within).await.map(status_and_json).map_err(|e| e.to_string())
}

fn status_and_json(a: Reply) -> (u16, Value) {
    (a.status.as_u16(), serde_json::from_slice(&a.body).unwrap_or(Value::Null))
}

/// Write `request` as raw bytes on a fresh connection to 127.0.0.1:`port`
/// and return what comes back in the first read ("" if the server closed
/// without a word, or said nothing within 5 s).
pub async fn raw_tcp(port: u16, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
    let mut s = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .unwrap_or_else(|_| panic!("no connection to port {port} within 5 s"))
        .unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap_or(Ok(0)).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The value of the first sample of a Prometheus text exposition whose line
/// starts with `series` (`name` or `name{labels}`), e.g. for a wait on a metric.
pub fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Every series of the family `name` in a Prometheus text exposition, as
/// `name{labels}` (or `name`), without their values.
pub fn series_of(exposition: &str, name: &str) -> std::collections::BTreeSet<String> {
    let of_family = |l: &&str| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' ']));
    exposition.lines().filter(of_family).filter_map(|l| Some(l.rsplit_once(' ')?.0.to_string())).collect()
}
