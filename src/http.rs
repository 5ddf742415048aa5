//! Small HTTP helpers shared by the lock API, the peer network and the client:
//! one body type, JSON answers, bounded body reads and a pooled client.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;
use tokio::net::TcpListener;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Longest a client may take to send a request head on `serve_http1`'s listeners.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head `serve_http1` reads.
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// Serve HTTP/1.1 on `listener` until `shutdown`: each connection in its own
/// task, request heads bounded in size and time, every request answered by
/// `handle`. (The sidecar's proxy listener, with TLS and HTTP/2, has its own.)
pub async fn serve_http1<F, Fut>(listener: TcpListener, shutdown: impl Future<Output = ()>, handle: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let answer = handle(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            // Without a timer hyper's header timeout does nothing.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
}
/// The body of every response fencegate's servers produce.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e: Infallible| match e {}).boxed()
}

pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let mut bytes = serde_json::to_vec(value).expect("serialising a response cannot fail");
    bytes.push(b'\n');
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

#[derive(Debug, Error)]
pub enum BodyError {
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    #[error("reading body: {0}")]
    Read(BoxError),
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Read at most `limit` bytes of `body`.
pub async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge(limit)),
        Err(e) => Err(BodyError::Read(e)),
    }
}

/// Parse a JSON body; an empty body parses as `{}`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { bytes };
    Ok(serde_json::from_slice(bytes)?)
}

/// An error and all its sources, `outer: inner: innermost` (hyper's errors
/// say little without their sources).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    msg
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("invalid URL {0:?}")]
    Url(String),
    #[error("request to {url} failed: {source}")]
    Transport { url: String, source: BoxError },
    #[error("request to {url} timed out after {timeout:?}")]
    Timeout { url: String, timeout: Duration },
}

/// A buffered HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

/// A pooled HTTP/1.1 client with a per-request deadline. Cheap to clone.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    max_body: usize,
}

impl HttpClient {
    pub fn new(max_body: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        let inner = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        Self { inner, max_body }
    }

    /// Send a request and buffer the whole answer, all within `timeout`.
    pub async fn send(&self, req: Request<Full<Bytes>>, timeout: Duration) -> Result<Answer, ClientError> {
        let url = req.uri().to_string();
        let transport = |source: BoxError| ClientError::Transport { url: url.clone(), source };
        let work = async {
            let resp: Response<Incoming> = self.inner.request(req).await.map_err(|e| transport(e.into()))?;
            let (parts, body) = resp.into_parts();
            let body = read_body(body, self.max_body).await.map_err(|e| transport(e.into()))?;
            Ok(Answer { status: parts.status, headers: parts.headers, body })
        };
        tokio::time::timeout(timeout, work).await.map_err(|_| ClientError::Timeout { url: url.clone(), timeout })?
    }

    /// `method url` with an optional JSON body.
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Answer, ClientError> {
        let mut b = Request::builder().method(method).uri(url);
        if body.is_some() {
            b = b.header(CONTENT_TYPE, "application/json");
        }
        let req = b.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|_| ClientError::Url(url.into()))?;
        self.send(req, timeout).await
    }
}

/// A streamed body fed from a channel (the watch stream's NDJSON lines).
pub fn channel_body(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Body {
    ChannelBody { rx }.boxed()
}

struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx).map(|line| line.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

impl HttpClient {
    /// GET `url` and return the answer with its body still streaming (for
    /// NDJSON streams). `timeout` bounds only the wait for the head.
    pub async fn open(&self, url: &str, timeout: Duration) -> Result<Response<Incoming>, ClientError> {
        let req = Request::get(url).body(Full::new(Bytes::new())).map_err(|_| ClientError::Url(url.into()))?;
        let transport = |source: BoxError| ClientError::Transport { url: url.to_string(), source };
        tokio::time::timeout(timeout, self.inner.request(req))
            .await
            .map_err(|_| ClientError::Timeout { url: url.to_string(), timeout })?
            .map_err(|e| transport(e.into()))
    }
}

/// Reads newline-delimited lines from a streaming body.
pub struct LineReader {
    body: Incoming,
    buf: Vec<u8>,
}

impl LineReader {
    pub fn new(body: Incoming) -> Self {
        Self { body, buf: Vec::new() }
    }

    /// The next complete line (without the newline); `Ok(None)` at the end of
    /// the stream. Lines longer than `max` are an error.
    pub async fn next_line(&mut self, max: usize) -> Result<Option<Vec<u8>>, BoxError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.buf.len() > max {
                return Err(format!("line longer than {max} bytes").into());
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}
