//! Event loops of their own: `n` threads, each running a single-threaded
//! tokio runtime, that connections are handed to round-robin as they are
//! accepted (`serve_on`). A connection, the requests on it and the pooled
//! upstream connections those requests use then stay on one thread: no
//! work stealing, no cross-thread wakeup per request, the way nginx's
//! workers run. Whatever the requests share (floors, permits, the lock
//! service's view) is thread-safe and stays shared: one process is one
//! fencing authority whatever `n` is.
//!
//! `Workers::current` tells a task which loop it runs on, for what each loop
//! keeps of its own (the sidecar's upstream pools, `sidecar::upstream::pool`).

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The most event loops a config may ask for.
pub(crate) const MAX_WORKERS: usize = 256;

thread_local! {
    /// Which event loop this thread runs, if it runs one.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

pub struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropping these ends the loops' threads (and their runtimes, with any
    /// task left on them).
    _stops: Vec<oneshot::Sender<()>>,
}

impl Workers {
    /// Start `n` event loops (1..=`MAX_WORKERS`), named `{name}-{i}`.
    pub fn start(name: &str, n: usize) -> std::io::Result<Workers> {
        assert!((1..=MAX_WORKERS).contains(&n), "the config bounds workers");
        let (mut handles, mut stops) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            let (built, handle) = std::sync::mpsc::sync_channel(1);
            // The runtime is built, run and dropped on its own thread: a
            // runtime dropped where the caller's is running would panic.
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => return drop(built.send(Err(e))),
                };
                let _ = built.send(Ok(runtime.handle().clone()));
                CURRENT.with(|c| c.set(Some(i)));
                // Until the sender is dropped (an error then, by design).
                let _ = runtime.block_on(stopped);
            })?;
            handles.push(handle.recv().expect("the thread answers before it ends")?);
        }
        Ok(Workers { handles, next: AtomicUsize::new(0), _stops: stops })
    }

    /// Run `task` on the next event loop, round-robin.
    pub fn spawn<T>(&self, task: T) -> JoinHandle<T::Output>
    where
        T: Future + Send + 'static,
        T::Output: Send + 'static,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        self.handles[i].spawn(task)
    }

    /// The event loop the calling thread runs (0 on any other thread): an
    /// index for what each loop keeps of its own, such as upstream pools.
    pub fn current() -> usize {
        CURRENT.with(|c| c.get()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_go_round_robin_and_know_their_loop() {
        let workers = Workers::start("test", 3).unwrap();
        let mut seen = vec![];
        for _ in 0..6 {
            let on = workers.spawn(async { (Workers::current(), std::thread::current().name().map(String::from)) });
            seen.push(on.await.unwrap());
        }
        let loops: Vec<usize> = seen.iter().map(|(i, _)| *i).collect();
        assert_eq!(loops, [0, 1, 2, 0, 1, 2]);
        assert_eq!(seen[1].1.as_deref(), Some("test-1"));
        // Not a loop's thread: the first pool.
        assert_eq!(Workers::current(), 0);
    }
}
