//! A body that must arrive whole by a deadline (a request body: a client
//! that trickles one byte a minute cannot hold a connection, a request task
//! and an upstream connection open for ever), or that must keep coming (an
//! upstream's answer: one that stalls half-way is cut).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::BoxError;

/// The body's error once its deadline has passed.
#[derive(Debug)]
pub(crate) struct BodyTimedOut(pub Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the body did not arrive within {}", humantime::format_duration(self.0))
    }
}

impl std::error::Error for BodyTimedOut {}

pub(crate) struct Deadline<B> {
    inner: B,
    /// `None`: a bound on each wait for a frame (counted from when the wait
    /// began, or the last frame after one), not on the whole.
    at: Option<Instant>,
    within: Duration,
    /// Made on the first wait only: most bodies are empty or already in.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> Deadline<B> {
    /// `inner` must be whole `within` from `start` (the request's arrival).
    pub(crate) fn new(inner: B, start: Instant, within: Duration) -> Self {
        Deadline { inner, at: Some(start + within), within, sleep: None }
    }

    /// `inner` must yield a frame at least every `within`.
    pub(crate) fn between_frames(inner: B, within: Duration) -> Self {
        Deadline { inner, at: None, within, sleep: None }
    }

    /// The body, without this deadline.
    pub(crate) fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            // No clock read unless a wait happened before.
            if let (None, Some(sleep)) = (this.at, &mut this.sleep) {
                sleep.as_mut().reset(Instant::now() + this.within);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let (at, within) = (this.at, this.within);
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at.unwrap_or_else(|| Instant::now() + within))));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.within))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// One frame, then `rest` (nothing more for ever, or the end).
    fn trickle(rest_ends: bool) -> impl Body<Data = Bytes, Error = BoxError> + Unpin {
        use futures_util::StreamExt;
        let first = futures_util::stream::iter([Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"part")))]);
        let rest =
            if rest_ends { futures_util::stream::empty().boxed() } else { futures_util::stream::pending().boxed() };
        http_body_util::StreamBody::new(first.chain(rest))
    }

    #[tokio::test]
    async fn a_body_that_is_not_whole_by_its_deadline_fails() {
        let body = Deadline::new(trickle(false), Instant::now(), Duration::from_millis(100));
        let started = Instant::now();
        let e = body.collect().await.expect_err("the deadline passed");
        assert!(e.is::<BodyTimedOut>(), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(90), "{:?}", started.elapsed());
        // Between frames: a stall is cut, a steady trickle is not.
        let body = Deadline::between_frames(trickle(false), Duration::from_millis(100));
        assert!(body.collect().await.expect_err("stalled").is::<BodyTimedOut>());
        // One that is whole in time is read as it is.
        let body = Deadline::new(trickle(true), Instant::now(), Duration::from_secs(5));
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"part");
    }
}
