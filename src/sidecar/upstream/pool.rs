//! Keep-alive connections to the upstreams, kept per event loop.
//!
//! A connection is opened for a request on one loop, driven by a task on
//! that loop, and handed only to that loop's requests again: a request never
//! waits for another thread (`http/workers.rs`), and looking a connection up
//! is a scan of a short list behind a lock that, in practice, one thread
//! takes. hyper-util's general-purpose pool (hashing per checkout and per
//! return, waiters, its boxed futures moved about) cost ~8,000 instructions
//! a request here (callgrind, `bench/JOURNAL.md`, §1 round three).
//!
//! - A connection goes back to its loop's list once its response's body has
//!   ended. One whose response was dropped half-read is closed, as hyper
//!   does with an HTTP/1 exchange cut short: its stream is not at a message
//!   boundary.
//! - It is handed out again only when hyper says it is ready: an upstream
//!   may answer before it has read the whole request body, and the
//!   connection then goes on writing that body for a while.
//! - One idle for `IDLE` or more, or closed by the upstream, is dropped when
//!   its list is next looked at.
//! - A request a pooled connection could not take (the upstream closed it in
//!   between: nothing was written) is sent once more, on a new connection.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::http::uri::{Authority, Scheme};
use hyper::{Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

use crate::http::{Body, BoxError, Workers};

/// How long a connection may sit unused before it is closed.
const IDLE: Duration = Duration::from_secs(60);

/// Idle connections kept per loop, all upstreams together; a connection
/// coming back to a full list is closed.
const MAX_IDLE: usize = 1024;

pub(crate) struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// One list per event loop (`Workers::current`), most recently used last.
    loops: Vec<Arc<Mutex<Vec<Idle>>>>,
}

/// Where a connection goes: scheme and authority of the upstream's URI.
#[derive(PartialEq, Eq)]
struct Origin {
    scheme: Option<Scheme>,
    authority: Option<Authority>,
}

impl Origin {
    fn of(uri: &Uri) -> Self {
        Origin { scheme: uri.scheme().cloned(), authority: uri.authority().cloned() }
    }

    /// The same bytes: an `Authority`'s own `==` ignores case, byte by byte
    /// (~140 instructions a request). Two spellings of one host are then
    /// two origins, each with connections of its own: nothing is shared
    /// that should not be.
    fn is(&self, uri: &Uri) -> bool {
        self.scheme.as_ref() == uri.scheme()
            && self.authority.as_ref().map(Authority::as_str) == uri.authority().map(Authority::as_str)
    }
}

struct Conn {
    origin: Origin,
    send: SendRequest<Body>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// Why a request got no response.
pub(crate) enum Failure {
    /// No connection could be made: nothing was sent.
    Connect(BoxError),
    /// The exchange broke; the request may have reached the upstream.
    Exchange(hyper::Error),
}

impl Pool {
    /// `loops` lists, one per event loop.
    pub(crate) fn new(connector: HttpsConnector<HttpConnector>, loops: usize) -> Self {
        Pool { connector, loops: (0..loops.max(1)).map(|_| Arc::default()).collect() }
    }

    /// Send `req` (its URI in origin form, its `Host` set) to `base`'s
    /// scheme and authority, on a kept connection if there is one.
    pub(crate) async fn send(&self, base: &Uri, req: Request<Body>) -> Result<Response<Returning>, Failure> {
        let list = &self.loops[Workers::current() % self.loops.len()];
        let mut req = req;
        if let Some(mut conn) = take(list, base) {
            // An error: it closed since `take` looked, unused.
            if conn.send.ready().await.is_ok() {
                match conn.send.try_send_request(req).await {
                    Ok(resp) => return Ok(returning(list, conn, resp)),
                    Err(mut e) => match e.take_message() {
                        Some(unsent) => req = unsent,
                        None => return Err(Failure::Exchange(e.into_error())),
                    },
                }
            }
        }
        // Boxed: a connection (a TLS handshake) is a large future, and rare;
        // inline, every request's future would carry (and move) its room.
        let mut conn = Box::pin(self.connect(base)).await.map_err(Failure::Connect)?;
        match conn.send.try_send_request(req).await {
            Ok(resp) => Ok(returning(list, conn, resp)),
            Err(mut e) => match e.take_message() {
                // Closed before it took the request: nothing was sent.
                Some(_) => Err(Failure::Connect(e.into_error().into())),
                None => Err(Failure::Exchange(e.into_error())),
            },
        }
    }

    async fn connect(&self, base: &Uri) -> Result<Conn, BoxError> {
        let io = self.connector.clone().call(base.clone()).await?;
        let (mut send, connection) = http1::Builder::new().writev(false).handshake(io).await?;
        // Driven on this loop; it ends when the connection closes.
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("upstream connection: {e}");
            }
        });
        send.ready().await?;
        Ok(Conn { origin: Origin::of(base), send })
    }
}

/// The most recently returned connection to `base`'s origin that is ready
/// for a request, if any. One still busy (writing a request body its
/// upstream answered early) is left for later; closed ones met on the way,
/// and all past `IDLE`, are dropped.
fn take(list: &Mutex<Vec<Idle>>, base: &Uri) -> Option<Conn> {
    let mut idle = list.lock().unwrap_or_else(|p| p.into_inner());
    prune(&mut idle);
    let mut at = idle.len();
    while at > 0 {
        at -= 1;
        let send = &idle[at].conn.send;
        if send.is_closed() {
            idle.remove(at);
        } else if send.is_ready() && idle[at].conn.origin.is(base) {
            return Some(idle.remove(at).conn);
        }
    }
    None
}

/// Drop the connections idle for `IDLE` or more: oldest first, a prefix.
fn prune(idle: &mut Vec<Idle>) {
    let now = Instant::now();
    let stale = idle.iter().take_while(|i| now.duration_since(i.since) >= IDLE).count();
    idle.drain(..stale);
}

fn returning(list: &Arc<Mutex<Vec<Idle>>>, conn: Conn, resp: Response<Incoming>) -> Response<Returning> {
    resp.map(|body| {
        let mut r = Returning { body, conn: Some(conn), list: list.clone() };
        // An empty body (a 204, a HEAD's answer) may never be read at all.
        if r.body.is_end_stream() {
            r.give_back();
        }
        r
    })
}

/// A response's body that gives its connection back when it has ended.
pub(crate) struct Returning {
    body: Incoming,
    conn: Option<Conn>,
    list: Arc<Mutex<Vec<Idle>>>,
}

impl Returning {
    fn give_back(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let mut idle = self.list.lock().unwrap_or_else(|p| p.into_inner());
        prune(&mut idle);
        if idle.len() < MAX_IDLE {
            idle.push(Idle { conn, since: Instant::now() });
        }
    }
}

impl hyper::body::Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            // A reader may stop at `is_end_stream` without asking again.
            Poll::Ready(Some(Ok(_))) if self.body.is_end_stream() => self.give_back(),
            Poll::Ready(None) => self.give_back(),
            // A broken body leaves its connection to close.
            Poll::Ready(Some(Err(_))) => drop(self.conn.take()),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::{BodyExt, Empty, Full};
    use hyper_util::rt::TokioIo;

    use super::*;

    /// A listener on loopback that counts the connections it accepted and
    /// hands each to `serve`.
    async fn listen<F, Fut>(serve: F) -> (Uri, Arc<AtomicUsize>)
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream));
            }
        });
        (uri, accepted)
    }

    /// An upstream that answers `/empty` with a 204, `/close` with
    /// `Connection: close`, and anything else with 64 KiB.
    async fn upstream() -> (Uri, Arc<AtomicUsize>) {
        listen(|stream| async move {
            let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                let mut resp = Response::new(Full::new(Bytes::from(vec![b'x'; 64 * 1024])));
                match req.uri().path() {
                    "/empty" => {
                        *resp.status_mut() = hyper::StatusCode::NO_CONTENT;
                        *resp.body_mut() = Full::new(Bytes::new());
                    }
                    "/close" => drop(resp.headers_mut().insert("connection", "close".parse().unwrap())),
                    _ => {}
                }
                Ok::<_, std::convert::Infallible>(resp)
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        })
        .await
    }

    fn pool() -> Pool {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        Pool::new(crate::sidecar::upstream::connector(tls), 1)
    }

    fn get(uri: &Uri, path: &'static str) -> Request<Body> {
        let host = uri.authority().unwrap().as_str();
        let body = Empty::new().map_err(|e| -> BoxError { match e {} }).boxed();
        Request::builder().uri(path).header("host", host).body(body).unwrap()
    }

    async fn send(pool: &Pool, uri: &Uri, path: &'static str) -> Response<Returning> {
        match pool.send(uri, get(uri, path)).await {
            Ok(r) => r,
            Err(Failure::Connect(e)) => panic!("connect: {e}"),
            Err(Failure::Exchange(e)) => panic!("exchange: {e}"),
        }
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_answer_was_read_whole() {
        let (uri, accepted) = upstream().await;
        let pool = pool();
        for _ in 0..3 {
            let body = send(&pool, &uri, "/").await.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body.len(), 64 * 1024);
        }
        // An empty answer is never read, and gives its connection back too.
        for _ in 0..2 {
            assert_eq!(send(&pool, &uri, "/empty").await.status(), 204);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_half_read_answer_closes_its_connection() {
        let (uri, accepted) = upstream().await;
        let pool = pool();
        let mut first = send(&pool, &uri, "/").await.into_body();
        first.frame().await.unwrap().unwrap();
        drop(first);
        let body = send(&pool, &uri, "/").await.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 64 * 1024);
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "the half-read connection was not reused");
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closes_is_replaced_without_an_error() {
        let (uri, accepted) = upstream().await;
        let pool = pool();
        for _ in 0..3 {
            send(&pool, &uri, "/close").await.into_body().collect().await.unwrap();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_connection_idle_too_long_is_closed_not_used() {
        let (uri, accepted) = upstream().await;
        let pool = pool();
        send(&pool, &uri, "/empty").await;
        pool.loops[0].lock().unwrap()[0].since -= IDLE;
        send(&pool, &uri, "/empty").await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.loops[0].lock().unwrap().len(), 1, "the stale one is gone, the new one kept");
    }

    #[tokio::test]
    async fn an_unreachable_upstream_is_a_connect_failure() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let uri: Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        assert!(matches!(pool().send(&uri, get(&uri, "/")).await, Err(Failure::Connect(_))));
    }

    /// S1 goes by this: a request a kept connection took, whose exchange
    /// then broke, may have been applied. It is an `Exchange` failure (the
    /// permit is held), and it is not sent again on a new connection.
    #[tokio::test]
    async fn a_request_taken_then_cut_is_an_exchange_failure_and_never_resent() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (uri, accepted) = listen(|mut stream| async move {
            // The first request is answered; the second read, then cut.
            let _ = stream.read(&mut [0; 4096]).await;
            let _ = stream.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
            let _ = stream.read(&mut [0; 4096]).await;
        })
        .await;
        let pool = pool();
        assert_eq!(send(&pool, &uri, "/").await.status(), 204);
        assert!(matches!(pool.send(&uri, get(&uri, "/")).await, Err(Failure::Exchange(_))));
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "the cut request was sent again");
    }

    /// An upstream that answers before it has read the request's body (a
    /// 413, say) leaves its connection busy writing that body: the next
    /// request must not wait behind it.
    #[tokio::test]
    async fn a_connection_still_writing_a_body_is_not_handed_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (uri, accepted) = listen(|mut stream| async move {
            let _ = stream.read(&mut [0; 4096]).await;
            let _ = stream.write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n").await;
            // Open, reading nothing more.
            std::future::pending::<()>().await;
        })
        .await;
        let pool = pool();
        let endless =
            http_body_util::StreamBody::new(futures_util::stream::pending::<Result<Frame<Bytes>, BoxError>>());
        let host = uri.authority().unwrap().as_str();
        let req = Request::builder().method("PUT").uri("/").header("host", host).body(endless.boxed()).unwrap();
        let Ok(first) = pool.send(&uri, req).await else { panic!("the first request failed") };
        assert_eq!(first.status(), 413);
        let second = tokio::time::timeout(Duration::from_secs(5), send(&pool, &uri, "/")).await;
        assert_eq!(second.expect("the second request waited behind the first's body").status(), 413);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
