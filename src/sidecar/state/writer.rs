//! The thread that puts the sidecar's state on disk, a batch at a time: the
//! writes queued while it wrote one batch go out together in the next, in
//! the order they were queued, and every queued write is written (whether
//! anyone still waits for it or not).
//!
//! A thread of its own rather than a task that hands each batch to the
//! blocking pool: every hop between threads is a wakeup, and on a keyed
//! request the wakeups cost more than the `fdatasync` they wait for
//! (`bench/idempotency.rs`).
//!
//! A write is either waited for ([`When::Now`]: the writer starts on it at
//! once) or can wait ([`When::Soon`]: it goes with the next batch, or after
//! `soon` at the latest). The answer of a keyed request is the second kind:
//! its client has it already, so it rides along with the next pending
//! record instead of costing an fsync of its own.
//!
//! The writer is woken only when it would not look at the queue in time by
//! itself (just after a batch it sleeps on its timer); dropping it writes
//! what is queued.

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Somebody waits for it: write it now.
    Now,
    /// Nobody needs it on disk at once: within `soon`.
    Soon,
}

struct Queue<T, R> {
    items: Vec<(T, oneshot::Sender<R>)>,
    /// Whether one of `items` is `When::Now`.
    urgent: bool,
    /// When the oldest of `items` was queued.
    since: Option<Instant>,
    stopping: bool,
    /// How the writer sleeps, if it does: a write is worth a wakeup (a
    /// system call, and a thread switch) only when the writer would not
    /// look at the queue by itself in time.
    asleep: Option<Sleep>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sleep {
    /// Until woken.
    Idle,
    /// Until a time no later than `soon` after anything now queued.
    Timed,
}

type Shared<T, R> = Arc<(Mutex<Queue<T, R>>, Condvar)>;

pub(crate) struct Writer<T, R> {
    shared: Shared<T, R>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T, R>(shared: &Shared<T, R>) -> MutexGuard<'_, Queue<T, R>> {
    shared.0.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Send + 'static, R: Send + 'static> Writer<T, R> {
    /// Start the thread. `write` gets a batch and returns one answer per
    /// write, in order.
    pub(crate) fn start(
        name: &str,
        soon: Duration,
        mut write: impl FnMut(Vec<T>) -> Vec<R> + Send + 'static,
    ) -> std::io::Result<Self> {
        let shared: Shared<T, R> = Arc::new((
            Mutex::new(Queue { items: Vec::new(), urgent: false, since: None, stopping: false, asleep: None }),
            Condvar::new(),
        ));
        let queue = shared.clone();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            while let Some(batch) = next_batch(&queue, soon) {
                let (items, replies): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
                for (reply, answer) in replies.into_iter().zip(write(items)) {
                    let _ = reply.send(answer);
                }
            }
        })?;
        Ok(Writer { shared, thread: Some(thread) })
    }

    /// Queue `item` behind everything queued before it, and return the wait
    /// for its answer (`None` if the thread died). Dropping the wait does
    /// not take the write back.
    pub(crate) fn queue(&self, item: T, when: When) -> impl Future<Output = Option<R>> {
        let (reply, answer) = oneshot::channel();
        let wake = {
            let mut q = lock(&self.shared);
            let first = q.items.is_empty();
            if first {
                q.since = Some(Instant::now());
            }
            q.items.push((item, reply));
            // A writer asleep for good must start its clock on the first
            // write; a `Now` must make it write (once: it takes all that is
            // queued). A writer that is awake looks at the queue before it
            // sleeps again.
            let wake = match q.asleep {
                Some(Sleep::Idle) => first || when == When::Now,
                Some(Sleep::Timed) => when == When::Now && !q.urgent,
                None => false,
            };
            q.urgent |= when == When::Now;
            wake
        };
        if wake {
            self.shared.1.notify_one();
        }
        async move { answer.await.ok() }
    }
}

/// Wait for the next batch: at once if a write in it is waited for, else
/// once the oldest has waited `soon`. `None` once stopping with nothing
/// left to write. With nothing queued it sleeps on a timer for `soon` first
/// (a keyed request's answer, queued right after its pending record was
/// written, then needs no wakeup), and then until woken.
fn next_batch<T, R>(shared: &Shared<T, R>, soon: Duration) -> Option<Vec<(T, oneshot::Sender<R>)>> {
    let mut q = lock(shared);
    let mut idle_since = Instant::now();
    loop {
        if q.items.is_empty() {
            if q.stopping {
                return None;
            }
            let idle = idle_since.elapsed();
            if idle >= soon {
                q.asleep = Some(Sleep::Idle);
                q = shared.1.wait(q).unwrap_or_else(|p| p.into_inner());
                idle_since = Instant::now();
            } else {
                q.asleep = Some(Sleep::Timed);
                q = shared.1.wait_timeout(q, soon - idle).unwrap_or_else(|p| p.into_inner()).0;
            }
            q.asleep = None;
            continue;
        }
        let waited = q.since.map_or(soon, |t| t.elapsed());
        if q.urgent || q.stopping || waited >= soon {
            q.urgent = false;
            q.since = None;
            return Some(std::mem::take(&mut q.items));
        }
        q.asleep = Some(Sleep::Timed);
        q = shared.1.wait_timeout(q, soon - waited).unwrap_or_else(|p| p.into_inner()).0;
        q.asleep = None;
    }
}

impl<T, R> Drop for Writer<T, R> {
    /// What is queued is written, then the thread ends.
    fn drop(&mut self) {
        lock(&self.shared).stopping = true;
        self.shared.1.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// A writer whose batches are reported, each held up until released.
    fn writer(soon: Duration) -> (Writer<u32, u32>, mpsc::Receiver<Vec<u32>>, mpsc::SyncSender<()>) {
        let (batches, seen) = mpsc::channel();
        let (release, gate) = mpsc::sync_channel::<()>(100);
        let w = Writer::start("test-writer", soon, move |items: Vec<u32>| {
            batches.send(items.clone()).unwrap();
            gate.recv().unwrap();
            items.into_iter().map(|i| i * 10).collect()
        })
        .unwrap();
        (w, seen, release)
    }

    #[tokio::test]
    async fn writes_queued_during_a_batch_share_the_next_in_order() {
        let (w, seen, release) = writer(Duration::from_secs(3600));
        let first = w.queue(1, When::Now);
        assert_eq!(seen.recv().unwrap(), vec![1]);
        let rest: Vec<_> = (2..=5).map(|i| w.queue(i, When::Now)).collect();
        release.send(()).unwrap();
        assert_eq!(first.await, Some(10));
        assert_eq!(seen.recv().unwrap(), vec![2, 3, 4, 5], "one batch, in the order queued");
        release.send(()).unwrap();
        for (i, r) in (2..=5).zip(rest) {
            assert_eq!(r.await, Some(i * 10), "each answer to its own write");
        }
    }

    #[tokio::test]
    async fn a_soon_write_waits_for_a_now_one_or_its_time() {
        let (w, seen, release) = writer(Duration::from_millis(300));
        let start = Instant::now();
        let soon = w.queue(1, When::Soon);
        assert!(seen.recv_timeout(Duration::from_millis(100)).is_err(), "not written at once");
        let now = w.queue(2, When::Now);
        assert_eq!(seen.recv().unwrap(), vec![1, 2], "it rides along with a write waited for");
        release.send(()).unwrap();
        assert_eq!((soon.await, now.await), (Some(10), Some(20)));
        assert!(start.elapsed() < Duration::from_millis(300));
        // Alone, within its time.
        let start = Instant::now();
        let alone = w.queue(3, When::Soon);
        assert_eq!(seen.recv().unwrap(), vec![3]);
        assert!(start.elapsed() >= Duration::from_millis(300));
        release.send(()).unwrap();
        assert_eq!(alone.await, Some(30));
    }

    #[tokio::test]
    async fn a_writer_asleep_on_its_timer_or_for_good_still_meets_both_bounds() {
        let soon = Duration::from_millis(200);
        let (w, seen, release) = writer(soon);
        for _ in 0..3 {
            release.send(()).unwrap();
        }
        // Just after a batch the writer sleeps on its timer: a `Now` wakes it.
        w.queue(1, When::Now).await;
        assert_eq!(seen.recv().unwrap(), vec![1]);
        std::thread::sleep(soon / 10);
        let start = Instant::now();
        let now = w.queue(2, When::Now);
        assert_eq!(seen.recv_timeout(soon / 2), Ok(vec![2]), "written at once, not at the timer");
        now.await;
        assert!(start.elapsed() < soon / 2);
        // Idle for longer than `soon`, it sleeps until woken: the first
        // `Soon` write starts its clock.
        std::thread::sleep(soon * 2);
        let start = Instant::now();
        let later = w.queue(3, When::Soon);
        assert_eq!(seen.recv_timeout(soon * 5), Ok(vec![3]), "written within its time");
        later.await;
        assert!(start.elapsed() >= soon && start.elapsed() < soon * 3, "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn a_write_nobody_waits_for_is_written_and_drop_writes_what_is_queued() {
        let (w, seen, release) = writer(Duration::from_secs(3600));
        drop(w.queue(1, When::Now));
        assert_eq!(seen.recv().unwrap(), vec![1], "written though its wait was dropped");
        let later = w.queue(2, When::Soon);
        for _ in 0..2 {
            release.send(()).unwrap();
        }
        drop(w);
        assert_eq!(seen.recv().unwrap(), vec![2], "written on drop, not after `soon`");
        assert_eq!(later.await, Some(20));
    }
}
