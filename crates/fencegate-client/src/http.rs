//! The HTTP client underneath: one pooled HTTP/1.1 client (plain, or HTTPS
//! with a [`rustls::ClientConfig`]) with a deadline on every request, an
//! optional bearer token on every request, bounded body reads, and a reader
//! for NDJSON streams. The lock service's peer network and the sidecar use
//! it too.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_rustls::builderstates::WantsProtocols1;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::ServerName;
use thiserror::Error;

/// The boxed error of bodies and transports.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a body could not be read (or decoded).
#[derive(Debug, Error)]
pub enum BodyError {
    /// The body exceeded the limit, in bytes.
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    /// The body stream failed.
    #[error("reading body: {0}")]
    Read(BoxError),
    /// The body was not the expected JSON.
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

/// Why one HTTP exchange failed.
#[derive(Debug, Error)]
pub enum HttpError {
    /// The URL could not be made into a request.
    #[error("invalid URL `{0}`")]
    Url(String),
    /// Connecting, sending, or reading the answer failed (including a body
    /// over the client's limit). Nothing says whether the server acted on it.
    #[error("request to {url} failed: {}", error_chain(&**cause))]
    Transport {
        /// The request's URL.
        url: String,
        /// The underlying error, shown with its sources (hyper's say little
        /// without them). Not this error's `source`: the message has it all,
        /// and a chain printed again would repeat it.
        cause: BoxError,
    },
    /// No complete answer within the deadline.
    #[error("request to {url} timed out after {}", humantime::format_duration(*timeout))]
    Timeout {
        /// The request's URL.
        url: String,
        /// The deadline that passed.
        timeout: Duration,
    },
}

/// A buffered HTTP answer.
#[derive(Debug)]
pub struct Reply {
    /// The response status.
    pub status: StatusCode,
    /// The response headers.
    pub headers: hyper::HeaderMap,
    /// The whole body, within the client's `max_body`.
    pub body: Bytes,
}

/// A pooled HTTP/1.1 client with a per-request deadline. Cheap to clone;
/// clones share the pool.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    max_body: usize,
    /// `Authorization` sent with every request that has none of its own.
    bearer: Option<HeaderValue>,
}

/// Why [`HttpClient::with_bearer`] refused a token.
#[derive(Debug, Error)]
#[error("a bearer token must be 1 to 4096 visible ASCII characters")]
pub struct BadToken;

impl HttpClient {
    /// A plain `http://` client that refuses answers with bodies above
    /// `max_body` bytes (`https://` URLs fail: nothing is trusted).
    pub fn new(max_body: usize) -> Self {
        let no_roots = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports TLS 1.2 and 1.3")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        Self::build(max_body, HttpsConnectorBuilder::new().with_tls_config(no_roots).https_or_http())
    }

    /// An `https://`-only client with `tls`. With `server_name`, every
    /// server must present a certificate for that name whatever the URL's
    /// host (a peer is checked to be the member it is configured as).
    pub fn https(max_body: usize, tls: rustls::ClientConfig, server_name: Option<ServerName<'static>>) -> Self {
        let builder = HttpsConnectorBuilder::new().with_tls_config(tls).https_only();
        match server_name {
            Some(name) => Self::build(max_body, builder.with_server_name_resolver(FixedServerNameResolver::new(name))),
            None => Self::build(max_body, builder),
        }
    }

    fn build(max_body: usize, tls: HttpsConnectorBuilder<WantsProtocols1>) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        // A stream that sends nothing for long (an etcd watch of a quiet
        // prefix) still learns within ~25 s that its peer is gone.
        tcp.set_keepalive(Some(Duration::from_secs(10)));
        tcp.set_keepalive_interval(Some(Duration::from_secs(5)));
        tcp.set_keepalive_retries(Some(3));
        tcp.set_connect_timeout(Some(Duration::from_secs(2)));
        // hyper-rustls hands `https://` URIs to the TCP connector, which
        // refuses them unless told not to.
        tcp.enforce_http(false);
        let connector = tls.enable_http1().wrap_connector(tcp);
        let inner = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        Self { inner, max_body, bearer: None }
    }

    /// This client, sending `Authorization: Bearer <token>` with every request.
    pub fn with_bearer(mut self, token: &str) -> Result<Self, BadToken> {
        if token.is_empty() || token.len() > 4096 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(BadToken);
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| BadToken)?;
        value.set_sensitive(true);
        self.bearer = Some(value);
        Ok(self)
    }

    fn authorise<B>(&self, req: &mut Request<B>) {
        if let Some(v) = &self.bearer {
            req.headers_mut().entry(AUTHORIZATION).or_insert_with(|| v.clone());
        }
    }

    /// Send a request and buffer the whole answer, all within `timeout`.
    pub async fn send(&self, mut req: Request<Full<Bytes>>, timeout: Duration) -> Result<Reply, HttpError> {
        self.authorise(&mut req);
        let url = req.uri().to_string();
        let transport = |cause: BoxError| HttpError::Transport { url: url.clone(), cause };
        let work = async {
            let resp: Response<Incoming> = self.inner.request(req).await.map_err(|e| transport(e.into()))?;
            let (parts, body) = resp.into_parts();
            let body = read_body(body, self.max_body).await.map_err(|e| transport(e.into()))?;
            Ok(Reply { status: parts.status, headers: parts.headers, body })
        };
        tokio::time::timeout(timeout, work).await.map_err(|_| HttpError::Timeout { url: url.clone(), timeout })?
    }

    /// `method url` with an optional JSON body (sent with
    /// `Content-Type: application/json`), buffered as by [`HttpClient::send`].
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Reply, HttpError> {
        let mut b = Request::builder().method(method).uri(url);
        if body.is_some() {
            b = b.header(CONTENT_TYPE, "application/json");
        }
        let req = b.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|_| HttpError::Url(url.into()))?;
        self.send(req, timeout).await
    }

    /// GET `url` and return the answer with its body still streaming (for
    /// NDJSON streams). `timeout` bounds only the wait for the head.
    pub async fn open(&self, url: &str, timeout: Duration) -> Result<Response<Incoming>, HttpError> {
        let req = Request::get(url).body(Full::new(Bytes::new())).map_err(|_| HttpError::Url(url.into()))?;
        self.stream(req, timeout).await
    }

    /// Send `req` and return the answer with its body still streaming.
    /// `timeout` bounds only the wait for the head.
    pub async fn stream(
        &self,
        mut req: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, HttpError> {
        self.authorise(&mut req);
        let url = req.uri().to_string();
        let transport = |cause: BoxError| HttpError::Transport { url: url.clone(), cause };
        tokio::time::timeout(timeout, self.inner.request(req))
            .await
            .map_err(|_| HttpError::Timeout { url: url.clone(), timeout })?
            .map_err(|e| transport(e.into()))
    }
}

/// Reads newline-delimited lines from a streaming body.
pub struct LineReader<B = Incoming> {
    body: B,
    buf: Vec<u8>,
}

impl<B> LineReader<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// A reader over `body`.
    pub fn new(body: B) -> Self {
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
                    if let Ok(data) = frame.map_err(Into::into)?.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}
