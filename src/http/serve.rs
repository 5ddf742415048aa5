//! The one accept loop, used by every listener: the node API, the sidecar
//! (TLS, HTTP/2), the metrics listener and the demo inventory.
//!
//! Each connection runs in its own task; request heads are bounded in size
//! and time (a slowloris cannot hold a connection open forever); a failing
//! `accept` (out of descriptors) backs off instead of spinning. On shutdown
//! the loop stops accepting, asks every connection to finish the requests it
//! has in flight (idle keep-alive connections close at once) and waits for
//! them up to `drain`. A listener's options may be swapped while it serves
//! (`serve_live`, a reload): each connection takes those current when it is
//! accepted, and the drain those current at shutdown.
//!
//! Details that matter:
//! - a connection with nothing in flight is closed after the header timeout,
//!   before its first request and between requests (hyper does it for
//!   HTTP/1.1, `Activity` for HTTP/2, which counts a request in flight until
//!   its answer's body is dropped);
//! - at most `max_connections` at once: a semaphore of slots, each held until
//!   its connection closes; the drain waits for all slots back, up to its
//!   deadline (5 s on a node, whose watch streams and parked acquires end
//!   first; `limits.drain_timeout` on the sidecar, which then waits for its
//!   ordering permits up to its longest route timeout);
//! - `accept` failures are backed off only when out of descriptors or memory,
//!   with one warning a second;
//! - `serve_on` hands each accepted connection to one of a `Workers`' event
//!   loops (the sidecar), socket and all: it is taken off the accepting
//!   runtime's reactor and registered with the loop's, so that its readiness
//!   does not cross threads (a wakeup per request otherwise). A connection
//!   left open past the drain deadline then lives as long as its loop.
//!
//! Knows no routes and no API.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::TlsAcceptor;

use super::forwarded::ClientNames;
use super::workers::Workers;
use super::Body;

/// The defaults every listener starts from (the configs' `limits` too).
pub(crate) const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// The largest `max_connections` a config may ask for.
pub(crate) const MAX_CONNECTIONS: usize = 1_000_000;

/// How long a peer may take no data from a connection before it is closed.
pub(crate) const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// How long `accept` waits after running out of descriptors or memory.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How one listener serves its connections.
#[derive(Clone)]
pub(crate) struct Listener {
    /// What this listener is, for the logs (`"lock API"`, `"sidecar"`).
    pub name: &'static str,
    /// Longest a client may take to send a request head (or a TLS handshake).
    pub header_timeout: Duration,
    /// Largest request head read (at least 8 KiB: hyper's smallest buffer).
    pub max_header_bytes: usize,
    /// Serve HTTP/2 as well as HTTP/1.1 (told apart by the preface).
    pub http2: bool,
    /// Serve HTTPS with this acceptor.
    pub tls: Option<TlsAcceptor>,
    /// How long shutdown waits for requests in flight.
    pub drain: Duration,
    /// Connections served at once; the loop stops accepting at the limit
    /// (new ones wait in the kernel's backlog).
    pub max_connections: usize,
    /// The JSON body of hyper's own refusals (`refusals.rs`); `None`: hyper's
    /// empty one.
    pub refusal_body: Option<super::RefusalBody>,
    /// A connection whose peer takes no data for this long is closed
    /// (`stall.rs`).
    pub send_timeout: Duration,
}

impl Listener {
    /// Plain HTTP/1.1 with the default bounds: 10 s and 64 KiB for a request
    /// head, 5 s to drain.
    pub(crate) fn http1(name: &'static str) -> Self {
        Listener {
            name,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_header_bytes: 64 << 10,
            http2: false,
            tls: None,
            drain: Duration::from_secs(5),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            refusal_body: None,
            send_timeout: DEFAULT_SEND_TIMEOUT,
        }
    }
}

/// Who a request came from: the connection's address and, over TLS, the
/// certificate chain the client presented (verified in the handshake).
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    pub addr: SocketAddr,
    /// How a proxy names this client (`addr`'s IP) to the server behind:
    /// worked out once per connection, as formatting costs.
    pub client: Arc<ClientNames>,
    /// Leaf first; `None` over plain TCP or when the client sent none.
    pub certs: Option<Arc<[CertificateDer<'static>]>>,
    /// What the handler made of `certs`, kept for the connection's later
    /// requests (parsing a certificate per request costs throughput).
    pub named: Arc<std::sync::OnceLock<Option<String>>>,
}

impl Conn {
    fn new(addr: SocketAddr, certs: Option<Arc<[CertificateDer<'static>]>>) -> Self {
        Conn { addr, client: Arc::new(ClientNames::new(addr.ip())), certs, named: Arc::default() }
    }

    /// The client's certificate, if it presented one.
    pub(crate) fn leaf(&self) -> Option<&CertificateDer<'static>> {
        self.certs.as_deref().and_then(<[_]>::first)
    }
}

/// A listener's options that a reload may replace: new connections take
/// the current ones (`max_connections` excepted: it is the first one's).
pub(crate) type LiveListener = Arc<ArcSwap<Listener>>;

/// Serve `listener` until `shutdown` resolves, then drain. Every request is
/// answered by `handle(request, conn)`.
pub(crate) async fn serve<F, Fut>(listener: TcpListener, opts: Listener, shutdown: impl Future<Output = ()>, handle: F)
where
    F: Fn(Request<Incoming>, Conn) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    serve_live(listener, Arc::new(ArcSwap::from_pointee(opts)), shutdown, handle).await
}

/// `serve` with options that may be swapped while it runs.
pub(crate) async fn serve_live<F, Fut>(
    listener: TcpListener,
    live: LiveListener,
    shutdown: impl Future<Output = ()>,
    handle: F,
) where
    F: Fn(Request<Incoming>, Conn) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    serve_on(listener, live, None, shutdown, handle).await
}

/// A connection accepted here, on its way to the runtime that serves it.
enum Handoff {
    Here(TcpStream),
    /// Taken off this runtime's reactor, to be registered with the event
    /// loop's: left here, every readiness of the socket would be seen by
    /// this runtime's thread and passed on to the loop with a wakeup, a
    /// system call and a thread switch per request.
    Moving(std::io::Result<std::net::TcpStream>),
}

impl Handoff {
    /// The connection, on the runtime this is called on.
    fn arrive(self) -> std::io::Result<TcpStream> {
        match self {
            Handoff::Here(s) => Ok(s),
            Handoff::Moving(s) => TcpStream::from_std(s?),
        }
    }
}

/// `serve_live` with each connection served on one of `workers`' event
/// loops (on the calling runtime if `None`); accepting stays here.
pub(crate) async fn serve_on<F, Fut>(
    listener: TcpListener,
    live: LiveListener,
    workers: Option<&Workers>,
    shutdown: impl Future<Output = ()>,
    handle: F,
) where
    F: Fn(Request<Incoming>, Conn) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    // Every connection holds a slot until it has closed: the drain below is
    // over when all slots are back.
    let max_connections = live.load().max_connections;
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    // Accepting, and handing connections to event loops, fail alike when
    // descriptors or memory run out: one rate-limited log for both.
    let errors = Arc::new(std::sync::Mutex::new(RateLimitedLog::default()));
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors or memory: accepting again at once
                    // would fail again, spinning a core. Other errors are the
                    // pending connection's own (it was reset): go on.
                    let exhausted = matches!(
                        e.raw_os_error(),
                        Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOBUFS | nix::libc::ENOMEM)
                    );
                    errors.lock().unwrap_or_else(|p| p.into_inner()).warn(live.load().name, "accept", &e);
                    if exhausted {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let stream = match workers {
            Some(_) => Handoff::Moving(stream.into_std()),
            None => Handoff::Here(stream),
        };
        let (opts, handle, stopping, errors) = (live.load_full(), handle.clone(), stopping.clone(), errors.clone());
        let served = async move {
            let _slot = slot;
            let stream = match stream.arrive() {
                Ok(s) => s,
                // Only this process's limits fail it (epoll's, memory).
                Err(e) => {
                    let what = "handing a connection to its event loop";
                    return errors.lock().unwrap_or_else(|p| p.into_inner()).warn(opts.name, what, &e);
                }
            };
            let Some(acceptor) = opts.tls.clone() else {
                let conn = Conn::new(peer, None);
                return connection(stream, conn, &opts, stopping, handle).await;
            };
            // In the connection's own task, so a client that stalls its
            // handshake holds up nobody else; bounded like a slow request head.
            match tokio::time::timeout(opts.header_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let certs = tls.get_ref().1.peer_certificates().map(|c| c.to_vec().into());
                    connection(tls, Conn::new(peer, certs), &opts, stopping, handle).await
                }
                Ok(Err(e)) => tracing::debug!("TLS handshake with {peer}: {e}"),
                Err(_) => tracing::debug!("TLS handshake with {peer}: timed out after {:?}", opts.header_timeout),
            }
        };
        match workers {
            Some(w) => drop(w.spawn(served)),
            None => drop(tokio::spawn(served)),
        }
    }
    drop(listener);
    stop.send_replace(true);
    let opts = live.load_full();
    let all = u32::try_from(max_connections).expect("max_connections is bounded by MAX_CONNECTIONS");
    if tokio::time::timeout(opts.drain, slots.acquire_many(all)).await.is_err() {
        tracing::warn!(listener = opts.name, "requests still in flight after {:?}; leaving them", opts.drain);
    }
}

/// At most one `accept` warning a second, with a count of those left out
/// (out of descriptors, accept fails as fast as it is called).
#[derive(Default)]
struct RateLimitedLog {
    last: Option<tokio::time::Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    fn warn(&mut self, listener: &str, what: &str, e: &std::io::Error) {
        let now = tokio::time::Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(listener, suppressed = self.suppressed, "{what}: {e}");
        self.last = Some(now);
        self.suppressed = 0;
    }
}

/// One client connection (plain TCP or TLS). It is closed once it has been
/// idle for `header_timeout`: before its first request (nothing sent, one
/// byte, a partial or complete HTTP/2 preface: hyper waits for those without
/// a timeout of its own) and between requests (hyper bounds that for
/// HTTP/1.1 itself, not for HTTP/2). A peer that takes no data for
/// `send_timeout` is dropped; an HTTP/2 peer that stops answering PINGs too.
/// On shutdown, or idle, it finishes what is in flight and closes.
async fn connection<I, F, Fut>(io: I, conn: Conn, opts: &Listener, mut stopping: Stopping, handle: F)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>, Conn) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let peer = conn.addr;
    let activity = Arc::new(Activity::new());
    let tracked = activity.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let busy = tracked.begin(req.version());
        let answer = handle(req, conn.clone());
        async move {
            let resp = answer.await;
            // Busy until hyper has written the whole answer and dropped its body.
            Ok::<_, Infallible>(resp.map(|body| Tracked { body, _busy: busy }))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Without a timer hyper's header timeout does nothing.
    builder
        .http1()
        .timer(TokioTimer::new())
        .writev(false)
        .header_read_timeout(opts.header_timeout)
        .max_buf_size(opts.max_header_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(opts.max_header_bytes as u32)
        .keep_alive_interval(opts.header_timeout)
        .keep_alive_timeout(opts.header_timeout);
    let builder = if opts.http2 { builder } else { builder.http1_only() };
    let io = super::stall::Stalls::new(io, opts.send_timeout);
    let io = super::refusals::Refusals::new(io, opts.refusal_body.clone(), activity.requested.clone());
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(listener = opts.name, "connection from {peer}: {e}");
                }
                return;
            }
            () = activity.idle(opts.header_timeout), if !closing => {
                if !activity.ever() {
                    // Nothing to finish: drop it.
                    tracing::debug!(listener = opts.name, "{peer} sent no request within {:?}", opts.header_timeout);
                    return;
                }
                tracing::debug!(listener = opts.name, "{peer} idle for {:?}: closing", opts.header_timeout);
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = stopping.wait_for(|s| *s), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            // A client that does not take part in HTTP/2's graceful close
            // (never answers its PING) is not waited for once nothing has
            // been in flight for the drain; a request in flight is.
            () = activity.idle(opts.drain), if closing => return,
        }
    }
}

type Stopping = tokio::sync::watch::Receiver<bool>;

/// What a connection is doing: requests in flight (until their answer's body
/// is dropped), and when the last one began or ended. Only HTTP/2 requests
/// are counted: once an HTTP/1.1 request has come, hyper's header timeout
/// bounds the idling between requests, and the count would only cost time.
struct Activity {
    opened: tokio::time::Instant,
    busy: AtomicUsize,
    /// Milliseconds from `opened` to the last begin or end; `u64::MAX`
    /// before the first request.
    last: AtomicU64,
    /// An HTTP/1.1 request has come: hyper bounds the idling.
    http1: AtomicBool,
    /// A request of any version has reached the handler.
    requested: Arc<AtomicBool>,
    /// Told when `http1` is set, so that `idle` stops its timer at once:
    /// a timer left pending is polled on every wake of the connection (3
    /// times a request, ~1 % of a proxied request's instructions).
    http1_came: tokio::sync::Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            opened: tokio::time::Instant::now(),
            busy: AtomicUsize::new(0),
            last: AtomicU64::new(u64::MAX),
            http1: AtomicBool::new(false),
            requested: Arc::new(AtomicBool::new(false)),
            http1_came: tokio::sync::Notify::new(),
        }
    }

    fn touch(&self) {
        self.last.store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn begin(self: &Arc<Self>, version: hyper::Version) -> Option<Busy> {
        if !self.requested.load(Ordering::Relaxed) {
            self.requested.store(true, Ordering::Relaxed);
        }
        if version != hyper::Version::HTTP_2 {
            if !self.http1.load(Ordering::Relaxed) {
                self.http1.store(true, Ordering::Relaxed);
                self.http1_came.notify_waiters();
            }
            return None;
        }
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.touch();
        Some(Busy(self.clone()))
    }

    fn ever(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }

    /// Resolves once nothing has been in flight for `limit` (never on an
    /// HTTP/1.1 connection that has had a request: hyper's to bound).
    async fn idle(&self, limit: Duration) {
        loop {
            // Registered before `http1` is read: a request that comes after
            // the read wakes it.
            let http1_came = self.http1_came.notified();
            tokio::pin!(http1_came);
            http1_came.as_mut().enable();
            if self.http1.load(Ordering::Relaxed) {
                return std::future::pending().await;
            }
            let last = match self.last.load(Ordering::Relaxed) {
                u64::MAX => self.opened,
                ms => self.opened + Duration::from_millis(ms),
            };
            if tokio::time::Instant::now() < last + limit {
                tokio::select! {
                    () = tokio::time::sleep_until(last + limit) => {}
                    () = http1_came => {}
                }
            } else if self.busy.load(Ordering::Relaxed) == 0 {
                return;
            } else {
                // The request's end moves `last`: look again then.
                tokio::time::sleep(limit).await;
            }
        }
    }
}

/// A request in flight on its connection.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body, keeping its request counted as in flight.
struct Tracked {
    body: Body,
    _busy: Option<Busy>,
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = super::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use fencegate_client::http::HttpClient;
    use hyper::Method;
    use tokio::sync::{oneshot, Notify};

    use super::*;

    /// A connection's idle timer stops as soon as an HTTP/1.1 request
    /// has come (hyper bounds the idling from then on), not when it next
    /// fires: left pending, it was polled on every wake of the connection,
    /// ~1 % of a proxied request's instructions for its first
    /// `header_timeout`.
    #[tokio::test(start_paused = true)]
    async fn an_http1_request_stops_the_idle_timer_at_once() {
        struct Wakes(std::sync::atomic::AtomicUsize);
        impl futures_util::task::ArcWake for Wakes {
            fn wake_by_ref(w: &Arc<Self>) {
                w.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let activity = Arc::new(Activity::new());
        let wakes = Arc::new(Wakes(0.into()));
        let waker = futures_util::task::waker(wakes.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let idle = activity.idle(Duration::from_secs(3600));
        tokio::pin!(idle);
        assert!(idle.as_mut().poll(&mut cx).is_pending());
        assert!(activity.begin(hyper::Version::HTTP_11).is_none());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken by the request, not by the timer an hour later");
        assert!(idle.as_mut().poll(&mut cx).is_pending(), "and idle no more");
    }

    struct SlowServer {
        url: String,
        /// Told when a request reaches the handler.
        arrived: Arc<Notify>,
        /// Set when the handler has finished its answer.
        answered: Arc<AtomicBool>,
        stop: oneshot::Sender<()>,
        server: tokio::task::JoinHandle<()>,
    }

    /// A listener whose handler answers after `delay`.
    async fn slow_server(delay: Duration, drain: Duration) -> SlowServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (arrived, answered) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let (stop, stopped) = oneshot::channel::<()>();
        let opts = Listener { drain, ..Listener::http1("test") };
        let (signal, done) = (arrived.clone(), answered.clone());
        let server = tokio::spawn(serve(
            listener,
            opts,
            async move {
                let _ = stopped.await;
            },
            move |_req, _peer| {
                signal.notify_one();
                let done = done.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    done.store(true, Ordering::SeqCst);
                    Response::new(crate::http::full("done"))
                }
            },
        ));
        SlowServer { url, arrived, answered, stop, server }
    }

    /// A connection served on an event loop of `Workers` is that loop's to
    /// read: it is answered while the runtime that accepted it is blocked
    /// (left on the accepting runtime's reactor, it would wait for it).
    #[tokio::test(flavor = "current_thread")]
    async fn a_handed_over_connection_is_served_while_the_accepting_runtime_is_blocked() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let workers = Arc::new(Workers::start("test-loop", 1).unwrap());
        let live = Arc::new(ArcSwap::from_pointee(Listener::http1("test")));
        tokio::spawn(async move {
            let answer = |_req, _conn| async { Response::new(crate::http::full("ok")) };
            serve_on(listener, live, Some(&workers), std::future::pending(), answer).await
        });
        let (first, answered) = std::sync::mpsc::channel();
        let (block, blocked) = std::sync::mpsc::channel();
        let client = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut ask = || {
                s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
                let (mut got, mut buf) = (Vec::new(), [0u8; 1024]);
                while !got.ends_with(b"\r\n\r\nok") {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0, "closed");
                    got.extend_from_slice(&buf[..n]);
                }
            };
            ask();
            first.send(()).unwrap();
            // Once told, the accepting runtime polls nothing more.
            blocked.recv().unwrap();
            let t = std::time::Instant::now();
            ask();
            t.elapsed()
        });
        while answered.try_recv().is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // This runtime, which accepted the connection, now runs nothing.
        block.send(()).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        // Running again (without the fix, this is when the request is read).
        while !client.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = client.join().unwrap();
        assert!(took < Duration::from_secs(1), "the second request waited for the accepting runtime: {took:?}");
    }

    #[tokio::test]
    async fn shutdown_drains_requests_in_flight_and_refuses_new_connections() {
        let s = slow_server(Duration::from_millis(300), Duration::from_secs(5)).await;
        let url = s.url.clone();
        let in_flight =
            tokio::spawn(
                async move { HttpClient::new(1024).call(Method::GET, &url, None, Duration::from_secs(5)).await },
            );
        s.arrived.notified().await;
        s.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(2), s.server).await.expect("serve returns once drained").unwrap();
        // A process exits when `serve` returns: it must not return first.
        assert!(s.answered.load(Ordering::SeqCst), "serve returned before the request in flight was answered");
        let answer = in_flight.await.unwrap().expect("the request in flight is answered, not cut");
        assert_eq!(&answer.body[..], b"done");
        let fresh = HttpClient::new(1024);
        assert!(fresh.call(Method::GET, &s.url, None, Duration::from_secs(1)).await.is_err(), "no longer accepting");
    }

    #[tokio::test]
    async fn the_drain_is_bounded_by_its_deadline() {
        let s = slow_server(Duration::from_secs(30), Duration::from_millis(200)).await;
        let url = s.url.clone();
        tokio::spawn(async move { HttpClient::new(1024).call(Method::GET, &url, None, Duration::from_secs(60)).await });
        s.arrived.notified().await;
        let t = tokio::time::Instant::now();
        s.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(2), s.server).await.expect("serve gives up after the drain").unwrap();
        assert!(t.elapsed() >= Duration::from_millis(200), "it waited for the drain deadline");
        assert!(!s.answered.load(Ordering::SeqCst));
    }

    /// With HTTP/2 on, hyper waits for the first bytes, and HTTP/2 for the
    /// first request, without a timeout of its own; a connection that sends
    /// no complete request must still be dropped.
    #[tokio::test]
    async fn a_silent_connection_is_dropped_after_the_header_timeout_with_http2_on() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let opts = Listener { http2: true, header_timeout: Duration::from_millis(200), ..Listener::http1("test") };
        tokio::spawn(serve(listener, opts, std::future::pending(), |_req, _peer| async {
            Response::new(crate::http::full("x"))
        }));
        // Nothing; one byte; half the HTTP/2 preface; all of it (and its
        // SETTINGS) but no request: none of them is a request.
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
        for sent in [&b""[..], b"G", &preface[..12], preface] {
            let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
            silent.write_all(sent).await.unwrap();
            let mut buf = [0u8; 256];
            let closed = tokio::time::timeout(Duration::from_secs(2), async {
                loop {
                    match silent.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {} // the server's SETTINGS
                    }
                }
            })
            .await;
            assert!(closed.is_ok(), "still open after 2 s, having sent {sent:?}");
        }
    }

    /// HTTP/2 has no idle timeout of hyper's: a connection that goes quiet
    /// after its answers is closed after the header timeout, and one whose
    /// request takes longer than that is not cut.
    #[tokio::test]
    async fn an_idle_http2_connection_is_closed_and_a_slow_answer_is_not_cut() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let opts = Listener { http2: true, header_timeout: Duration::from_millis(200), ..Listener::http1("test") };
        tokio::spawn(serve(listener, opts, std::future::pending(), |_req, _peer| async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            Response::new(crate::http::full("slow"))
        }));
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
        let conn = tokio::spawn(conn);
        let req = Request::get(format!("http://{addr}/")).body(http_body_util::Empty::<bytes::Bytes>::new()).unwrap();
        let resp = send.send_request(req).await.expect("a request slower than the timeout is answered");
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
        assert_eq!(&body[..], b"slow");
        let answered = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(3), conn)
            .await
            .expect("idle HTTP/2 connection still open")
            .unwrap()
            .ok();
        let idle = answered.elapsed();
        assert!(idle >= Duration::from_millis(150), "closed after {idle:?}, before the timeout");
    }

    /// At the connection limit the loop stops accepting: the next client
    /// waits until a connection closes.
    #[tokio::test]
    async fn connections_beyond_the_limit_wait_for_a_free_slot() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let opts = Listener { max_connections: 1, ..Listener::http1("test") };
        tokio::spawn(serve(listener, opts, std::future::pending(), |_req, _peer| async {
            Response::new(crate::http::full("x"))
        }));
        // A connection that sends nothing holds the only slot.
        let holder = tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await.unwrap();
        let u = url.clone();
        let waiting =
            tokio::spawn(
                async move { HttpClient::new(1024).call(Method::GET, &u, None, Duration::from_secs(5)).await },
            );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "served beyond the limit");
        drop(holder);
        let answer = waiting.await.unwrap().expect("served once the slot is free");
        assert_eq!(&answer.body[..], b"x");
    }
}
