//! The two phases every engine goes through: one writer appending one entry
//! at a time, and many writers at once.

use std::io;
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use raft_engine::Engine;

use crate::raft_engine_store;
use crate::stores::{payload, Store};

/// Appends before the one-writer phase's clock starts (file creation, the
/// first transaction's table), not recorded.
const WARMUP: u64 = 20;
/// The one-writer phase stops here even if its appends are not all done.
const ONE_WRITER_LIMIT: Duration = Duration::from_secs(300);
/// A bound on each concurrent writer's appends, besides the phase's time.
const MAX_PER_WRITER: u64 = 1_000_000;
/// Most appends committed together, as fencegate's redb log store did (MAX_BATCH).
const MAX_BATCH: usize = 4096;
/// How long a writer waits for its append to be durable before giving up.
const REPLY_LIMIT: Duration = Duration::from_secs(60);

/// Latencies in µs, 3 significant digits, up to a minute.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

fn micros(d: Duration) -> u64 {
    d.as_micros().try_into().unwrap_or(u64::MAX)
}

/// One writer: `appends` appends of one entry, each durable before the
/// next is made; the latency of each (the engine's call, nothing else).
pub fn one_writer(store: &mut dyn Store, appends: u64) -> Histogram<u64> {
    for index in 1..=WARMUP {
        store.commit(index, &[payload(index)]).expect("a durable append");
    }
    let mut latencies = histogram();
    let start = Instant::now();
    for index in WARMUP + 1..=WARMUP + appends {
        if start.elapsed() > ONE_WRITER_LIMIT {
            eprintln!("  stopped after {} appends: {ONE_WRITER_LIMIT:?} passed", index - WARMUP - 1);
            break;
        }
        let entry = [payload(index)];
        let t = Instant::now();
        store.commit(index, &entry).expect("a durable append");
        latencies.saturating_record(micros(t.elapsed()));
    }
    latencies
}

/// What a concurrent phase measured.
pub struct Concurrent {
    pub appends: u64,
    pub fsyncs: u64,
    pub seconds: f64,
    pub latencies: Histogram<u64>,
}

/// `writers` threads, each appending through `store`'s group commit: a
/// writer thread, as fencegate's redb log store had, takes every append
/// queued while its last commit ran and makes them durable with one
/// `commit`.
pub fn group_commit(store: Box<dyn Store>, writers: usize, seconds: f64) -> Concurrent {
    let (queue, queued) = channel::<SyncSender<io::Result<()>>>();
    let committer = thread::Builder::new().name("log-writer".into()).spawn(move || commit_loop(store, queued)).unwrap();
    let (appends, latencies, seconds) = drive(writers, seconds, |_| {
        let queue = queue.clone();
        let (done, durable) = sync_channel(1);
        move || {
            queue.send(done.clone()).map_err(io::Error::other)?;
            durable.recv_timeout(REPLY_LIMIT).map_err(io::Error::other)?
        }
    });
    // The writers' senders are gone with their threads; this is the last.
    drop(queue);
    let fsyncs = committer.join().unwrap();
    Concurrent { appends, fsyncs, seconds, latencies }
}

/// The writer thread: until every writer has gone, commit what is queued
/// as one batch (at the next indexes), then tell each writer. Returns the
/// batches, i.e. the commits (one fsync each).
fn commit_loop(mut store: Box<dyn Store>, queued: Receiver<SyncSender<io::Result<()>>>) -> u64 {
    let (mut next, mut batches) = (1, 0);
    let (mut waiting, mut entries) = (Vec::new(), Vec::new());
    while let Ok(first) = queued.recv() {
        waiting.push(first);
        while waiting.len() < MAX_BATCH {
            match queued.try_recv() {
                Ok(w) => waiting.push(w),
                Err(_) => break,
            }
        }
        entries.clear();
        entries.extend((next..).take(waiting.len()).map(payload));
        let result = store.commit(next, &entries);
        next += waiting.len() as u64;
        batches += 1;
        for done in waiting.drain(..) {
            let r = result.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
            let _ = done.send(r);
        }
    }
    batches
}

/// `writers` threads, each appending straight into raft-engine, to a Raft
/// group of its own (indexes contiguous per group without a lock between
/// the writers); raft-engine groups their writes itself.
pub fn raft_engine_direct(engine: Arc<Engine>, writers: usize, seconds: f64) -> Concurrent {
    let before = raft_engine_store::fsyncs();
    let (appends, latencies, seconds) = drive(writers, seconds, |w| {
        let (engine, region, mut index) = (engine.clone(), 100 + w as u64, 0);
        move || {
            index += 1;
            raft_engine_store::append(&engine, region, index, &[payload(index)])
        }
    });
    Concurrent { appends, fsyncs: raft_engine_store::fsyncs() - before, seconds, latencies }
}

/// Start `writers` threads together, each calling its `append` (made by
/// `make`) back to back for `seconds` (at most `MAX_PER_WRITER` times).
/// Returns the appends, their latencies and the seconds from the start to
/// the last writer's end.
fn drive<F>(writers: usize, seconds: f64, make: impl Fn(usize) -> F) -> (u64, Histogram<u64>, f64)
where
    F: FnMut() -> io::Result<()> + Send + 'static,
{
    let start_line = Arc::new(Barrier::new(writers + 1));
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let (mut append, start_line) = (make(w), start_line.clone());
            thread::spawn(move || {
                let mut latencies = histogram();
                start_line.wait();
                let until = Instant::now() + Duration::from_secs_f64(seconds);
                let mut n = 0;
                while n < MAX_PER_WRITER && Instant::now() < until {
                    let t = Instant::now();
                    append().expect("a durable append");
                    latencies.saturating_record(micros(t.elapsed()));
                    n += 1;
                }
                (n, latencies, Instant::now())
            })
        })
        .collect();
    start_line.wait();
    let start = Instant::now();
    let (mut appends, mut latencies, mut end) = (0, histogram(), start);
    for t in threads {
        let (n, l, e) = t.join().unwrap();
        appends += n;
        latencies.add(&l).unwrap();
        end = end.max(e);
    }
    (appends, latencies, (end - start).as_secs_f64())
}
