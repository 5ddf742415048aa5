//! One task that serves requests in batches: everything that queued while the
//! previous batch ran goes into the next one.
//!
//! Used on the leader to pack proposals into one Raft entry (one fsync for all
//! of them) and to confirm leadership once for many concurrent keepalives and
//! reads (the sidecar's disk has a thread of its own: `sidecar::state::writer`). In each, a
//! request is served by a round that *started after it arrived*, which is what
//! makes the sharing safe.

use std::future::Future;

use tokio::sync::{mpsc, oneshot};

struct Request<T, R> {
    item: T,
    reply: oneshot::Sender<R>,
}

pub(crate) struct Batcher<T, R> {
    tx: mpsc::UnboundedSender<Request<T, R>>,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Spawn the serving task. `serve` gets up to `max` items and must return
    /// one answer per item, in order.
    pub(crate) fn start<F, Fut>(max: usize, mut serve: F) -> Self
    where
        F: FnMut(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<R>> + Send,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<Request<T, R>>();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < max {
                    match rx.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
                // Callers that gave up (timed out) are not served.
                batch.retain(|r| !r.reply.is_closed());
                if batch.is_empty() {
                    continue;
                }
                let (items, replies): (Vec<T>, Vec<_>) = batch.into_iter().map(|r| (r.item, r.reply)).unzip();
                for (reply, answer) in replies.into_iter().zip(serve(items).await) {
                    let _ = reply.send(answer);
                }
            }
        });
        Self { tx }
    }

    /// Queue `item` and wait for its answer; `None` if the task has stopped.
    pub(crate) async fn call(&self, item: T) -> Option<R> {
        self.queue(item).await
    }

    /// Queue `item` now (items are served in the order they were queued),
    /// and return the wait for its answer: a caller can queue under a lock
    /// and wait after releasing it.
    pub(crate) fn queue(&self, item: T) -> impl Future<Output = Option<R>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.tx.send(Request { item, reply }).is_ok();
        async move {
            if !sent {
                return None;
            }
            rx.await.ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn requests_that_arrive_during_a_round_share_the_next_one() {
        let rounds = Arc::new(AtomicUsize::new(0));
        let r = rounds.clone();
        let b = Arc::new(Batcher::start(100, move |items: Vec<u32>| {
            r.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                items.into_iter().map(|i| i * 2).collect()
            }
        }));
        let first = tokio::spawn({
            let b = b.clone();
            async move { b.call(1).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await; // round 1 is running
        let rest: Vec<_> = (2..=20)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.call(i).await })
            })
            .collect();
        assert_eq!(first.await.unwrap(), Some(2));
        for (i, h) in (2..=20).zip(rest) {
            assert_eq!(h.await.unwrap(), Some(i * 2), "answers go back to their own callers");
        }
        assert_eq!(rounds.load(Ordering::SeqCst), 2, "19 requests queued behind round 1 share round 2");
    }
}
