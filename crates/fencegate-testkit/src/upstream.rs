//! The upstream behind a sidecar: a "legacy API" that checks no tokens at
//! all. It applies every request it receives and, when recording, keeps
//! each one (method, path, token, body, headers) in the order the writes
//! *take effect*: after the body is read and after the `x-test-delay-ms`
//! processing time it was asked to take. It counts (and, when recording,
//! keeps) arrivals too, the moment a request head is in, so that a test can
//! wait for "the slow write has reached the upstream" instead of sleeping.
//!
//! Benchmarks run it counting only, on a thread and runtime of its own so
//! that its cost stays apart from the load generator's.
//!
//! Each arrival and write is stamped (`Seen::at`) with when it arrived or
//! took effect on the test process's clock; `start_at` listens on a given
//! address, in whatever network namespace the calling thread is in.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

/// Asks the upstream to take this long (milliseconds) before a request takes effect.
pub const DELAY_HEADER: &str = "x-test-delay-ms";
/// Each value of this request header, `name: value`, is a header of the
/// answer (in order, repeated names kept): an upstream with more to say
/// than `Content-Length`.
pub const ANSWER_HEADER: &str = "x-test-answer-header";

/// A request the upstream received: as it arrived (`body` still empty, not
/// read yet), or as it took effect.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub token: Option<u64>,
    pub headers: hyper::HeaderMap,
    pub body: String,
    /// When it arrived (in `arrivals`) or took effect (in `seen`), on the
    /// test process's monotonic clock: the upstream runs in-process, so a
    /// test can set it against its own instants.
    pub at: std::time::Instant,
}

/// What the upstream keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// Every arrival and every applied request (tests).
    All,
    /// Counts only (benchmarks: nothing grows with the load).
    CountOnly,
}

struct State {
    recording: Recording,
    arrivals: Mutex<Vec<Seen>>,
    seen: Mutex<Vec<Seen>>,
    arrived: watch::Sender<usize>,
    applied: watch::Sender<usize>,
}

enum Stop {
    Task(tokio::task::JoinHandle<()>),
    Thread(Option<oneshot::Sender<()>>),
}

pub struct Upstream {
    pub port: u16,
    /// The address it listens on (127.0.0.1 but for [`Upstream::start_at`]).
    ip: std::net::IpAddr,
    state: Arc<State>,
    stop: Stop,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        match &mut self.stop {
            Stop::Task(t) => t.abort(),
            Stop::Thread(tx) => {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
        }
    }
}

fn state(recording: Recording) -> Arc<State> {
    Arc::new(State {
        recording,
        arrivals: Mutex::default(),
        seen: Mutex::default(),
        arrived: watch::Sender::new(0),
        applied: watch::Sender::new(0),
    })
}

impl Upstream {
    /// A recording upstream served by the caller's runtime.
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = state(Recording::All);
        let task = tokio::spawn(serve(listener, state.clone()));
        Upstream { port, ip: [127, 0, 0, 1].into(), state, stop: Stop::Task(task) }
    }

    /// A recording upstream on `addr`, served by the caller's runtime. The
    /// socket is made on the calling thread: in a network namespace the
    /// thread entered, it listens there.
    pub async fn start_at(addr: std::net::SocketAddr) -> Upstream {
        let listener = TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("upstream on {addr}: {e}"));
        let local = listener.local_addr().unwrap();
        let state = state(Recording::All);
        let task = tokio::spawn(serve(listener, state.clone()));
        Upstream { port: local.port(), ip: local.ip(), state, stop: Stop::Task(task) }
    }

    /// An upstream on a thread with a single-threaded runtime of its own
    /// (until dropped): its cost stays apart from the caller's, and it
    /// outlives the caller's runtime (for fixtures shared between tests).
    pub fn start_on_own_thread(recording: Recording) -> Upstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let state = state(recording);
        let (tx, rx) = oneshot::channel();
        let s = state.clone();
        std::thread::Builder::new()
            .name(format!("upstream-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).unwrap();
                    tokio::select! {
                        _ = serve(listener, s) => {}
                        _ = rx => {}
                    }
                });
            })
            .unwrap();
        Upstream { port, ip: [127, 0, 0, 1].into(), state, stop: Stop::Thread(Some(tx)) }
    }

    pub fn url(&self) -> String {
        format!("http://{}:{}", self.ip, self.port)
    }

    /// Every request that took effect, in that order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Every request head that arrived, in that order (bodies empty).
    pub fn arrivals(&self) -> Vec<Seen> {
        self.state.arrivals.lock().unwrap().clone()
    }

    /// Tokens of the writes (not GETs) applied to `path`, in the order they took effect.
    pub fn tokens(&self, path: &str) -> Vec<Option<u64>> {
        self.seen().into_iter().filter(|s| s.path == path && s.method != "GET").map(|s| s.token).collect()
    }

    /// How many request heads arrived so far.
    pub fn arrived(&self) -> usize {
        *self.state.arrived.borrow()
    }

    /// How many requests took effect so far.
    pub fn applied(&self) -> usize {
        *self.state.applied.borrow()
    }

    /// Until at least `n` request heads have arrived (fails the test after `within`).
    pub async fn wait_for_arrivals(&self, n: usize, within: Duration) {
        wait_count(&self.state.arrived, n, within, "arrived").await
    }

    /// Until at least `n` requests have taken effect (fails the test after `within`).
    pub async fn wait_for_applied(&self, n: usize, within: Duration) {
        wait_count(&self.state.applied, n, within, "taken effect").await
    }

    /// Until a request head matching `pred` has arrived; that arrival (fails
    /// the test after `within`). Recording upstreams only.
    pub async fn wait_for_arrival(&self, within: Duration, pred: impl Fn(&Seen) -> bool) -> Seen {
        assert_eq!(self.state.recording, Recording::All, "a counting upstream keeps no arrivals");
        let mut rx = self.state.arrived.subscribe();
        let found = tokio::time::timeout(within, async {
            loop {
                if let Some(a) = self.state.arrivals.lock().unwrap().iter().find(|a| pred(a)) {
                    return a.clone();
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!("no matching request reached the upstream within {within:?}: {:?}", self.arrivals())
        })
    }
}

async fn wait_count(counter: &watch::Sender<usize>, n: usize, within: Duration, what: &str) {
    let mut rx = counter.subscribe();
    if tokio::time::timeout(within, rx.wait_for(|c| *c >= n)).await.is_err() {
        panic!("upstream: {} requests {what} within {within:?}, not {n}", *counter.borrow());
    }
}

async fn serve(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(apply(state, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

fn header<T: std::str::FromStr>(headers: &hyper::HeaderMap, name: &str) -> Option<T> {
    headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

async fn apply(state: Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let record = state.recording == Recording::All;
    let delay: Option<u64> = header(&parts.headers, DELAY_HEADER);
    let answer_headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)> = parts
        .headers
        .get_all(ANSWER_HEADER)
        .iter()
        .filter_map(|v| {
            let (name, value) = v.to_str().ok()?.split_once(':')?;
            Some((name.trim().parse().ok()?, value.trim().parse().ok()?))
        })
        .collect();
    let mut seen = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        token: header(&parts.headers, fencegate_client::TOKEN_HEADER),
        headers: if record { parts.headers } else { hyper::HeaderMap::new() },
        body: String::new(),
        at: std::time::Instant::now(),
    };
    {
        // Counted under the lock, so that the count never runs ahead of the list.
        let mut arrivals = state.arrivals.lock().unwrap();
        if record {
            arrivals.push(seen.clone());
        }
        state.arrived.send_modify(|n| *n += 1);
    }
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let take_effect = move || {
        // Counted under the lock: the answer's index is the request's place in `seen`.
        let mut applied = state.seen.lock().unwrap();
        if record {
            seen.body = String::from_utf8_lossy(&body).into_owned();
            seen.at = std::time::Instant::now();
            applied.push(seen);
        }
        let mut index = 0;
        state.applied.send_modify(|n| {
            index = *n;
            *n += 1;
        });
        index
    };
    let index = match delay {
        // Like a real service, once a request is in, it is processed to the
        // end even if the connection it came on goes away.
        Some(ms) => tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            take_effect()
        })
        .await
        .unwrap(),
        None => take_effect(),
    };
    let mut answer = Response::new(Full::new(Bytes::from(format!("{{\"applied\":{index}}}"))));
    for (name, value) in answer_headers {
        answer.headers_mut().append(name, value);
    }
    answer
}
