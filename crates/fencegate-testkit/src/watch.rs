//! The lock service's NDJSON watch stream, read line by line. A node answers
//! a watch from its *own* applied state (it is not forwarded to the leader),
//! which makes it the way to see what one node has applied.

use std::time::Duration;

use fencegate_client::http::{HttpClient, LineReader};
use serde_json::Value;
use tokio::time::Instant;

/// How long [`Watch::next`] waits for a line.
pub const LINE_WITHIN: Duration = Duration::from_secs(10);

pub struct Watch {
    url: String,
    lines: LineReader,
}

impl Watch {
    /// Open `url` (`…/v1/watch?…`); fails the test unless it answers 200 within 5 s.
    pub async fn open(url: &str) -> Watch {
        match Self::try_open(url, Duration::from_secs(5)).await {
            Ok(w) => w,
            Err(e) => panic!("watch {url}: {e}"),
        }
    }

    /// Open `url`, or say why not within `within`.
    pub async fn try_open(url: &str, within: Duration) -> Result<Watch, String> {
        Self::try_open_with(&HttpClient::new(1 << 20), url, within).await
    }

    /// Open `url` with `http` (TLS, a token: [`crate::Cluster::client_options`]).
    pub async fn try_open_with(http: &HttpClient, url: &str, within: Duration) -> Result<Watch, String> {
        let resp = http.open(url, within).await.map_err(|e| e.to_string())?;
        if resp.status() != 200 {
            return Err(format!("status {}", resp.status()));
        }
        Ok(Watch { url: url.to_string(), lines: LineReader::new(resp.into_body()) })
    }

    /// The next line as JSON (fails the test after [`LINE_WITHIN`]).
    pub async fn next(&mut self) -> Value {
        match self.next_within(LINE_WITHIN).await {
            Some(v) => v,
            None => panic!("watch {}: no line within {LINE_WITHIN:?}", self.url),
        }
    }

    /// The next line as JSON, `None` if none came within `within`; fails the
    /// test if the stream breaks or a line is not JSON.
    pub async fn next_within(&mut self, within: Duration) -> Option<Value> {
        let line = tokio::time::timeout(within, self.lines.next_line(1 << 20)).await.ok()?;
        let line = line.unwrap_or_else(|e| panic!("watch {}: {e}", self.url));
        let line = line.unwrap_or_else(|| panic!("watch {}: the stream ended", self.url));
        Some(serde_json::from_slice(&line).unwrap_or_else(|e| panic!("watch {}: {e}", self.url)))
    }

    /// Read lines until the stream ends, for `within` at most: `Ok` once it
    /// ended, `Err` with every line read if it had not by then.
    pub async fn ends_within(&mut self, within: Duration) -> Result<(), Vec<Value>> {
        let deadline = Instant::now() + within;
        let mut seen = vec![];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.lines.next_line(1 << 20)).await {
                Err(_) => return Err(seen),
                Ok(Ok(None)) => return Ok(()),
                Ok(Ok(Some(line))) => seen.push(serde_json::from_slice(&line).unwrap_or(Value::Null)),
                Ok(Err(e)) => panic!("watch {}: {e}", self.url),
            }
        }
    }

    /// The next line that is not a heartbeat (fails the test after [`LINE_WITHIN`]).
    pub async fn next_event(&mut self) -> Value {
        match self.until(LINE_WITHIN, |v| v["event"] != "heartbeat").await {
            Ok(v) => v,
            Err(seen) => panic!("watch {}: no event within {LINE_WITHIN:?}, only {seen:?}", self.url),
        }
    }

    /// Read lines until one satisfies `pred`, for `within` at most; that
    /// line, or `Err` with every line read.
    pub async fn until(&mut self, within: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value, Vec<Value>> {
        let deadline = Instant::now() + within;
        let mut seen = vec![];
        while let Some(v) = self.next_within(deadline.saturating_duration_since(Instant::now())).await {
            if pred(&v) {
                return Ok(v);
            }
            seen.push(v);
        }
        Err(seen)
    }
}
