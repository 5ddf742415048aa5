//! HTTP load generators over keep-alive HTTP/1.1 connections, one hyper
//! client connection each, latencies in HDR histograms (microseconds).
//!
//! - `closed_loop`: every connection sends its next request as soon as the
//!   previous answer is read (throughput).
//! - `fixed_rate`: requests are due at a constant rate whether or not earlier
//!   ones came back; each latency is measured from when its request was
//!   *due*, so a stall is charged to every request it delays (coordinated
//!   omission corrected, as wrk2 does).
//! - `Connections::exactly`: a given number of requests, closed loop, over
//!   connections opened beforehand (counting what serving alone costs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// Builds the n-th request of a run.
pub type MakeRequest = Arc<dyn Fn(u64) -> hyper::Request<Full<Bytes>> + Send + Sync>;

/// What one load run saw.
pub struct Run {
    pub ok: u64,
    /// Answers other than 2xx, and broken exchanges.
    pub errors: u64,
    pub seconds: f64,
    pub latency_us: Histogram<u64>,
}

impl Run {
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.seconds
    }

    /// Latency at quantile `q` (0..=1), microseconds.
    pub fn us(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).unwrap()
}

async fn connect(port: u16) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    send
}

/// One request and its whole answer; false on a non-2xx or a broken exchange.
/// A connection the server closed between requests (as keep-alive allows)
/// is replaced first, not counted as an error.
async fn exchange(port: u16, send: &mut SendRequest<Full<Bytes>>, req: hyper::Request<Full<Bytes>>) -> bool {
    if send.ready().await.is_err() {
        *send = connect(port).await;
    }
    match send.send_request(req).await {
        Ok(resp) => {
            let ok = resp.status().is_success();
            resp.into_body().collect().await.is_ok() && ok
        }
        Err(_) => false,
    }
}

struct Tally {
    ok: u64,
    errors: u64,
    latency_us: Histogram<u64>,
}

impl Tally {
    fn new() -> Tally {
        Tally { ok: 0, errors: 0, latency_us: histogram() }
    }

    fn record(&mut self, ok: bool, since: Instant) {
        if ok {
            self.ok += 1;
            self.latency_us.saturating_record(since.elapsed().as_micros().max(1) as u64);
        } else {
            self.errors += 1;
        }
    }

    fn merge(tallies: Vec<Tally>, seconds: f64) -> Run {
        let mut run = Run { ok: 0, errors: 0, seconds, latency_us: histogram() };
        for t in tallies {
            run.ok += t.ok;
            run.errors += t.errors;
            run.latency_us.add(&t.latency_us).unwrap();
        }
        run
    }
}

pub async fn closed_loop(port: u16, connections: usize, duration: Duration, make: MakeRequest) -> Run {
    let start = Instant::now();
    let until = start + duration;
    let mut tasks = vec![];
    for c in 0..connections as u64 {
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            let mut send = connect(port).await;
            let mut tally = Tally::new();
            let mut n = c;
            while Instant::now() < until {
                let t = Instant::now();
                let ok = exchange(port, &mut send, make(n)).await;
                tally.record(ok, t);
                n += connections as u64;
            }
            tally
        }));
    }
    let mut tallies = vec![];
    for t in tasks {
        tallies.push(t.await.unwrap());
    }
    Tally::merge(tallies, start.elapsed().as_secs_f64())
}

/// `rate` requests/s for `duration` over `connections` connections. A request
/// waits for a free connection if all are busy; its latency counts from when
/// it was due. Requests still unanswered 10 s after the end are counted as
/// errors.
pub async fn fixed_rate(port: u16, connections: usize, rate: f64, duration: Duration, make: MakeRequest) -> Run {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let due = (rate * duration.as_secs_f64()) as u64;
    // The pacer is a plain thread with a 1 µs timer slack: tokio's timer
    // wheel has 1 ms resolution, which would bunch requests into bursts.
    let pacer = std::thread::spawn(move || {
        let _ = nix::sys::prctl::set_timerslack(1_000);
        let start = Instant::now();
        for n in 0..due {
            let at = start + Duration::from_secs_f64(n as f64 / rate);
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if tx.send((n, at)).is_err() {
                break;
            }
        }
        start
    });
    let mut tasks = vec![];
    for _ in 0..connections {
        let (rx, make) = (rx.clone(), make.clone());
        tasks.push(tokio::spawn(async move {
            let mut send = connect(port).await;
            let mut tally = Tally::new();
            loop {
                let Some((n, at)) = rx.lock().await.recv().await else { break };
                let ok = exchange(port, &mut send, make(n)).await;
                tally.record(ok, at);
            }
            tally
        }));
    }
    let start = tokio::task::spawn_blocking(move || pacer.join().unwrap()).await.unwrap();
    let mut tallies = vec![];
    let grace = tokio::time::Instant::now() + Duration::from_secs(10);
    for mut t in tasks {
        match tokio::time::timeout_at(grace, &mut t).await {
            Ok(tally) => tallies.push(tally.unwrap()),
            // Still stuck after the grace period: stop it, so that it cannot
            // load the next phase.
            Err(_) => t.abort(),
        }
    }
    let mut run = Tally::merge(tallies, start.elapsed().as_secs_f64());
    run.errors = due - run.ok;
    run
}

/// Keep-alive connections opened once and reused by every run on them, so
/// that a run measures serving requests, not opening connections.
pub struct Connections {
    port: u16,
    sends: Vec<SendRequest<Full<Bytes>>>,
}

impl Connections {
    pub async fn open(port: u16, n: usize) -> Connections {
        let mut sends = vec![];
        for _ in 0..n {
            sends.push(connect(port).await);
        }
        Connections { port, sends }
    }

    /// Exactly `n` requests, closed loop, spread over the connections;
    /// requests still unanswered `within` after the start are counted as
    /// errors, and their connections are dropped.
    pub async fn exactly(&mut self, n: u64, within: Duration, make: MakeRequest) -> Run {
        let start = Instant::now();
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let port = self.port;
        let mut tasks = vec![];
        for mut send in self.sends.drain(..) {
            let (next, make) = (next.clone(), make.clone());
            tasks.push(tokio::spawn(async move {
                let mut tally = Tally::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let t = Instant::now();
                    let ok = exchange(port, &mut send, make(i)).await;
                    tally.record(ok, t);
                }
                (send, tally)
            }));
        }
        let deadline = tokio::time::Instant::now() + within;
        let mut tallies = vec![];
        for mut t in tasks {
            match tokio::time::timeout_at(deadline, &mut t).await {
                Ok(done) => {
                    let (send, tally) = done.unwrap();
                    self.sends.push(send);
                    tallies.push(tally);
                }
                Err(_) => t.abort(),
            }
        }
        let mut run = Tally::merge(tallies, start.elapsed().as_secs_f64());
        run.errors = n - run.ok;
        run
    }
}
