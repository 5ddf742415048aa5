//! The soak's load: workers that acquire (the library keeps the lease alive
//! while they hold it), write through the sidecar with their token and
//! release; and watch streams that reconnect whenever a fault ends them.
//! Everything lands in [`Stats`], which the sampler empties once a minute.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencegate_client::http::{HttpClient, LineReader};
use fencegate_client::{AcquireOptions, Client};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

const WORKERS: usize = 8;
const WATCHERS: usize = 2;

/// One minute's numbers (latencies in µs). An operation that overlapped a
/// fault (or the 2 s after it was healed) is in the `*_faulted` histogram;
/// the others are quiet: a leak or a growing structure slows those, while
/// the faulted ones are as slow as the fault that caught them.
pub struct Counts {
    pub acquire: Histogram<u64>,
    pub write: Histogram<u64>,
    pub acquire_faulted: Histogram<u64>,
    pub write_faulted: Histogram<u64>,
    pub acquired: u64,
    pub acquire_errors: u64,
    pub written: u64,
    /// Writes the sidecar refused (409/503: a lease lost to a fault, or no
    /// verdict while the service was unreachable): answers, not failures.
    pub refused: u64,
    /// Writes with no answer or a 5xx other than 503.
    pub write_errors: u64,
    pub watch_lines: u64,
    pub watch_reconnects: u64,
}

impl Default for Counts {
    fn default() -> Counts {
        let h = || Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
        Counts {
            acquire: h(),
            write: h(),
            acquire_faulted: h(),
            write_faulted: h(),
            acquired: 0,
            acquire_errors: 0,
            written: 0,
            refused: 0,
            write_errors: 0,
            watch_lines: 0,
            watch_reconnects: 0,
        }
    }
}

#[derive(Default)]
pub struct Stats {
    counts: Mutex<Counts>,
    /// Set by the nemesis from a fault's start until it settled.
    disturbed: AtomicBool,
    /// Bumped at each fault's start.
    faults: AtomicU64,
}

/// When an operation began, to tell afterwards whether a fault touched it.
#[derive(Clone, Copy)]
pub struct Began {
    at: Instant,
    faults: u64,
    disturbed: bool,
}

impl Stats {
    fn with(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.counts.lock().unwrap())
    }

    /// This minute's numbers; the next minute starts from zero.
    pub fn take(&self) -> Counts {
        std::mem::take(&mut self.counts.lock().unwrap())
    }

    pub fn fault_started(&self) {
        self.faults.fetch_add(1, Ordering::SeqCst);
        self.disturbed.store(true, Ordering::SeqCst);
    }

    pub fn fault_settled(&self) {
        self.disturbed.store(false, Ordering::SeqCst);
    }

    fn begin(&self) -> Began {
        Began {
            at: Instant::now(),
            faults: self.faults.load(Ordering::SeqCst),
            disturbed: self.disturbed.load(Ordering::SeqCst),
        }
    }

    /// The operation's latency (µs) and whether it was quiet throughout.
    fn end(&self, b: Began) -> (u64, bool) {
        let quiet =
            !b.disturbed && !self.disturbed.load(Ordering::SeqCst) && self.faults.load(Ordering::SeqCst) == b.faults;
        ((b.at.elapsed().as_micros() as u64).clamp(1, 60_000_000), quiet)
    }
}

pub async fn run(client: Client, nodes: Vec<String>, sidecar: String, stats: Arc<Stats>, seed: u64, until: Instant) {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let (client, sidecar, stats) = (client.clone(), sidecar.clone(), stats.clone());
        tasks.spawn(worker(w, client, sidecar, stats, seed, until));
    }
    for w in 0..WATCHERS {
        // Nodes 1 and 2 are never killed (only paused or cut off).
        tasks.spawn(watcher(nodes[w % 2].clone(), stats.clone(), until));
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// Keys of its own, so an acquire's latency is the service's, not a wait
/// for another worker.
async fn worker(w: usize, client: Client, sidecar: String, stats: Arc<Stats>, seed: u64, until: Instant) {
    let mut rng = StdRng::seed_from_u64(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9));
    let http = HttpClient::new(1 << 16);
    while Instant::now() < until {
        let key = format!("rack/soak-{w}-{}", rng.random_range(0..4));
        let start = stats.begin();
        let opts = AcquireOptions::new(Duration::from_secs(3)).wait(Duration::from_secs(5));
        let lease = match tokio::time::timeout(Duration::from_secs(15), client.acquire(&key, opts)).await {
            Ok(Ok(lease)) => lease,
            _ => {
                stats.with(|s| s.acquire_errors += 1);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (us, quiet) = stats.end(start);
        stats.with(|s| {
            s.acquired += 1;
            let _ = if quiet { s.acquire.record(us) } else { s.acquire_faulted.record(us) };
        });
        // Now and then hold past the TTL: the library's keepalives carry it.
        let hold = if rng.random_bool(0.1) { Duration::from_secs(4) } else { Duration::ZERO };
        let hold_until = Instant::now() + hold;
        for _ in 0..5 {
            if !lease.is_valid() {
                break;
            }
            write(&http, &sidecar, &key, lease.token(), &stats).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
        }
        tokio::time::sleep_until(hold_until).await;
        let _ = tokio::time::timeout(Duration::from_secs(10), lease.release()).await;
    }
}

async fn write(http: &HttpClient, sidecar: &str, key: &str, token: u64, stats: &Stats) {
    let start = stats.begin();
    let req = hyper::Request::put(format!("{sidecar}/racks/{}", key.trim_start_matches("rack/")))
        .header("x-fence-token", token.to_string())
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{\"state\":\"soak\"}")))
        .unwrap();
    let answer = http.send(req, Duration::from_secs(10)).await;
    let (us, quiet) = stats.end(start);
    stats.with(|s| match answer {
        Ok(a) if a.status == 200 => {
            s.written += 1;
            let _ = if quiet { s.write.record(us) } else { s.write_faulted.record(us) };
        }
        Ok(a) if a.status == 409 || a.status == 503 => s.refused += 1,
        _ => s.write_errors += 1,
    });
}

/// A watch of every rack key, reopened (after 200 ms) whenever it ends.
async fn watcher(node: String, stats: Arc<Stats>, until: Instant) {
    let http = HttpClient::new(1 << 20);
    let url = format!("{node}/v1/watch?prefix=rack/");
    while Instant::now() < until {
        if let Ok(resp) = http.open(&url, Duration::from_secs(5)).await {
            if resp.status() == 200 {
                let mut lines = LineReader::new(resp.into_body());
                let read = async {
                    while let Ok(Some(_)) = lines.next_line(1 << 20).await {
                        stats.with(|s| s.watch_lines += 1);
                    }
                };
                let _ = tokio::time::timeout_at(until, read).await;
            }
        }
        stats.with(|s| s.watch_reconnects += 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
