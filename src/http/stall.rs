//! A connection whose peer stops taking what is written to it (a zero TCP
//! window: a client that never reads its answer) is closed once no byte
//! has gone out for `send_timeout`, instead of holding its connection slot,
//! its request task and an upstream connection for ever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pub(super) struct Stalls<I> {
    inner: I,
    within: Duration,
    /// Running while a write or flush waits; made on the first wait.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<I> Stalls<I> {
    pub(super) fn new(inner: I, within: Duration) -> Self {
        Stalls { inner, within, stalled: None }
    }

    /// Ready means progress: the clock stops. Pending starts it (or lets it
    /// run); past `within`, the write fails with `TimedOut`.
    fn watch<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let within = self.within;
                let sleep =
                    self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + within)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the peer took no data for {}", humantime::format_duration(within)),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Stalls<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Stalls<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn a_peer_that_takes_nothing_fails_the_write_after_the_timeout() {
        // A pipe of 64 bytes whose other end never reads.
        let (_reader, writer) = tokio::io::duplex(64);
        let mut w = Stalls::new(writer, Duration::from_millis(100));
        let started = Instant::now();
        let e = w.write_all(&[0u8; 4096]).await.expect_err("it stalled");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(90), "{:?}", started.elapsed());
        // One that reads, however slowly, keeps it going.
        let (mut reader, writer) = tokio::io::duplex(64);
        let mut w = Stalls::new(writer, Duration::from_millis(100));
        let drain = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut got = 0;
            while got < 4096 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                got += tokio::io::AsyncReadExt::read(&mut reader, &mut buf).await.unwrap();
            }
        });
        w.write_all(&[0u8; 4096]).await.expect("slow but steady");
        drain.await.unwrap();
    }
}
