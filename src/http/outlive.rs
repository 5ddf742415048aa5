//! A request's future that outlives its client: polled where it is awaited,
//! and, dropped before it has finished, finished on a task of its own.
//!
//! hyper drops a request's future when its client goes away. Some requests
//! must not end with their client: a fenced write already dispatched holds
//! its ordering permit (S1) until the upstream has answered or the route's
//! timeout has passed. A task per request gave that, at ~2,000 instructions
//! a request (the spawn, the join handle, waking the connection's task from
//! the request's), paid by every request to cover the few whose client
//! leaves; this pays only for those.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub(crate) struct Outlive<F: Future + Send + 'static> {
    /// `None` once finished, and while being polled: a poll that panics
    /// leaves nothing to finish (a future is never polled after it panicked).
    rest: Option<Pin<Box<F>>>,
}

impl<F: Future + Send + 'static> Outlive<F> {
    pub(crate) fn new(future: F) -> Self {
        Outlive { rest: Some(Box::pin(future)) }
    }
}

impl<F: Future + Send + 'static> Future for Outlive<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut rest = self.rest.take().expect("an Outlive polled after it finished");
        match rest.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(out),
            Poll::Pending => {
                self.rest = Some(rest);
                Poll::Pending
            }
        }
    }
}

impl<F: Future + Send + 'static> Drop for Outlive<F> {
    fn drop(&mut self) {
        let Some(rest) = self.rest.take() else { return };
        // A runtime shutting down drops what is spawned on it at once, as
        // it drops its other tasks; outside any runtime there is nothing
        // to finish it on.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn(async move {
                rest.await;
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// Dropped half-way, the future still runs to its end.
    #[tokio::test]
    async fn dropped_unfinished_it_finishes_alone() {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let (started, mut wait) = tokio::sync::oneshot::channel::<()>();
        let mut fut = Box::pin(Outlive::new(async move {
            let _ = started.send(());
            tokio::time::sleep(Duration::from_millis(50)).await;
            d.store(true, Ordering::SeqCst);
        }));
        // Polled once: it has begun and waits on its timer.
        let pending = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await;
        assert!(pending);
        assert!(wait.try_recv().is_ok(), "it began where it was awaited");
        drop(fut);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(done.load(Ordering::SeqCst), "dropped unfinished, it was not finished");
    }

    /// Awaited to its end, it answers where it is awaited.
    #[tokio::test]
    async fn awaited_it_answers() {
        assert_eq!(Outlive::new(async { 7 }).await, 7);
    }

    /// A future that panicked is not polled again: dropping it spawns
    /// nothing.
    #[tokio::test]
    async fn a_panic_leaves_nothing_to_finish() {
        use futures_util::FutureExt;
        let fut = Outlive::new(async {
            tokio::task::yield_now().await;
            panic!("the handler broke");
        });
        let caught = std::panic::AssertUnwindSafe(fut).catch_unwind().await;
        assert!(caught.is_err());
        // Spawned, the broken future would panic again on its task.
        let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
        assert_eq!(tasks, 0, "something was spawned after the panic");
    }
}
