//! hyper's own refusals, with a JSON body. hyper answers a request head it
//! cannot parse (differing `Content-Length`s, an unknown
//! `Transfer-Encoding`, obsolete line folding, a head over the size limit,
//! an over-long URI) itself, before any handler runs, with an empty body,
//! and offers no hook to say more. This writer recognises those answers on
//! their way out and writes them with the listener's JSON body instead.
//!
//! It does so only on a connection whose requests have never reached the
//! handler: there, nothing but hyper writes (a refusal of the first request
//! head, or HTTP/2's own frames), so no body a handler streams, however it
//! is spelled, can be taken for a refusal. A refusal of a later request on
//! a keep-alive connection keeps hyper's empty body. It recognises a refusal
//! by its exact form: a status line of 400, 414 or 431 followed directly by
//! `connection: close`, `content-length: 0` and `date`, ending the write.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The JSON body for one of hyper's refusals (by status), if the listener
/// has one; also where the listener counts them.
pub(crate) type RefusalBody = Arc<dyn Fn(u16) -> Option<Vec<u8>> + Send + Sync>;

pub(super) struct Refusals<I> {
    inner: I,
    /// `None`: everything is written as it is.
    body: Option<RefusalBody>,
    /// Set once a request of this connection reached the handler: from
    /// then on, everything is written as it is.
    requested: Arc<AtomicBool>,
    /// A rewritten refusal not yet all written.
    pending: Vec<u8>,
    written: usize,
}

impl<I> Refusals<I> {
    pub(super) fn new(inner: I, body: Option<RefusalBody>, requested: Arc<AtomicBool>) -> Self {
        Refusals { inner, body, requested, pending: Vec::new(), written: 0 }
    }

    /// The body for refusals, while no request has reached the handler.
    fn body(&self) -> Option<&RefusalBody> {
        self.body.as_ref().filter(|_| !self.requested.load(Ordering::Relaxed))
    }
}

/// `(status, date)` if `buf` is exactly one of hyper's refusals.
fn refusal(buf: &[u8]) -> Option<(u16, &[u8])> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    let status: u16 = std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()?;
    if !matches!(status, 400 | 414 | 431) {
        return None;
    }
    let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
    let headers = &rest[line_end..];
    let date = headers.strip_prefix(b"\r\nconnection: close\r\ncontent-length: 0\r\ndate: ")?;
    let date = date.strip_suffix(b"\r\n\r\n")?;
    (date.len() == 29 && !date.contains(&b'\r')).then_some((status, date))
}

/// The refusal written again with `json` as its body.
fn rewritten(buf: &[u8], date: &[u8], json: &[u8]) -> Vec<u8> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n").unwrap_or(buf.len());
    let mut out = Vec::with_capacity(160 + json.len());
    out.extend_from_slice(&buf[..line_end]);
    out.extend_from_slice(b"\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: ");
    out.extend_from_slice(json.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(json);
    out
}

impl<I: AsyncWrite + Unpin> Refusals<I> {
    /// Write what is left of a rewritten refusal.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Refusals<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Refusals<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        let json = match (self.body(), refusal(buf)) {
            (Some(body), Some((status, date))) => body(status).map(|json| rewritten(buf, date, &json)),
            _ => None,
        };
        if let Some(answer) = json {
            self.pending = answer;
            self.written = 0;
            // hyper is told it was all written; the rest goes out on the
            // next write, flush or shutdown.
            let _ = self.drain(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        // A refusal is a head with no body: one slice, hyper's last.
        if self.body().is_some() {
            let mut filled = bufs.iter().filter(|b| !b.is_empty());
            if let (Some(only), None) = (filled.next(), filled.next()) {
                if refusal(only).is_some() {
                    let only: &[u8] = only;
                    return self.poll_write(cx, only);
                }
            }
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &str = "Tue, 01 Dec 2026 13:31:44 GMT";

    #[test]
    fn only_hypers_own_refusals_are_recognised() {
        let own = format!("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n");
        assert_eq!(refusal(own.as_bytes()), Some((400, DATE.as_bytes())));
        let big = own.replace("400 Bad Request", "431 Request Header Fields Too Large");
        assert_eq!(refusal(big.as_bytes()).map(|r| r.0), Some(431));
        for other in [
            // A handler's (or an upstream's) answer: its headers first.
            format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\ndate: {DATE}\r\n\r\n"),
            format!("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\ndate: {DATE}\r\n\r\n{{}}"),
            // Not alone in the write, or another status.
            format!("{own}HTTP/1.1 200 OK\r\n"),
            own.replace("400 Bad Request", "404 Not Found"),
            own.replace("HTTP/1.1", "HTTP/1.0"),
            format!("x{own}"),
        ] {
            assert_eq!(refusal(other.as_bytes()), None, "{other:?}");
        }
    }

    #[tokio::test]
    async fn a_refusal_is_written_with_the_json_body_and_anything_else_as_it_is() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, server) = tokio::io::duplex(16);
        let body: RefusalBody = Arc::new(|status| Some(format!("{{\"status\":{status}}}").into_bytes()));
        let requested = Arc::new(AtomicBool::new(false));
        let mut w = Refusals::new(server, Some(body), requested.clone());
        let own = format!("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n");
        let reader = tokio::spawn(async move {
            let mut out = String::new();
            let mut client = client;
            client.read_to_string(&mut out).await.unwrap();
            out
        });
        w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.unwrap();
        assert_eq!(w.write(own.as_bytes()).await.unwrap(), own.len(), "hyper is told it was written");
        // Once a request reached the handler, the same bytes are a body.
        requested.store(true, Ordering::Relaxed);
        w.write_all(own.as_bytes()).await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        let out = reader.await.unwrap();
        let want = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\nHTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: 14\r\ndate: {DATE}\r\n\r\n{{\"status\":400}}{own}"
        );
        assert_eq!(out, want);
    }
}
