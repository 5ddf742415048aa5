//! What happened to each lock key, as the console draws it (the seed's
//! sequence diagram, from live data): the lock service's grants and ends as
//! the sidecar learns them, the first write forwarded with each token (its
//! floor raised), and every refusal.
//!
//! Each is recorded where it already happens off the forwarding path: a
//! refusal where it is logged, a forward where the floor is raised (once
//! per token, after an fsync; a refusal by the last check before sending
//! would follow it), a grant or an end where the knowledge changes (an end
//! may be presumed: a state dump that no longer lists the key). Two rings
//! keep the latest `KEPT` refusals and the latest `KEPT` of the rest, so
//! that refusals a client provokes cannot push the lock service's story
//! out; each event is numbered (`seq`) and broadcast to the open feeds (at
//! most `MAX_FEEDS`; a feed that falls `BACKLOG` behind is told so and
//! skips ahead, never buffered without bound).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::http::Body;
use crate::lock::state::Token;

/// Events kept for the page's first view, per ring.
const KEPT: usize = 1000;
/// Feeds open at once, at most.
const MAX_FEEDS: usize = 16;
/// Events a feed may fall behind before it skips ahead.
const BACKLOG: usize = 256;
/// A comment line on a quiet feed, so proxies and browsers keep it open.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// One thing that happened to a lock key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Entry {
    /// Its place among all events since the sidecar started.
    pub seq: u64,
    /// Unix time, milliseconds.
    pub at_ms: u64,
    pub key: String,
    #[serde(flatten)]
    pub what: Happened,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum Happened {
    /// The lock service granted `token`, as the sidecar learnt it.
    Granted { token: Token },
    /// The lease of `token`, the key's latest grant, is over (released,
    /// expired, or the key forgotten), as the sidecar learnt it; or, where
    /// `presumed`, as a state dump implied (a read may show it live).
    Ended { token: Token, presumed: bool },
    /// A read showed the lease of `token` live after all (an end presumed).
    Live { token: Token },
    /// The lock service's history changed (a restore): what was known of
    /// every key dropped, the floors kept. Of no one key (`key` empty).
    NewHistory { why: String },
    /// The first write with `token` was forwarded: the floor rose to it.
    Forwarded { token: Token },
    /// A write was refused.
    Refused {
        route: String,
        /// The token the request presented, if any.
        presented: Option<Token>,
        /// The key's latest known token when it was refused.
        current: Token,
        reason: &'static str,
    },
}

impl Happened {
    fn name(&self) -> &'static str {
        match self {
            Happened::Granted { .. } => "granted",
            Happened::Ended { .. } => "ended",
            Happened::Live { .. } => "live",
            Happened::NewHistory { .. } => "new_history",
            Happened::Forwarded { .. } => "forwarded",
            Happened::Refused { .. } => "refused",
        }
    }
}

/// The latest events, and the open feeds.
pub(crate) struct Timeline {
    /// The refusals, and the rest; the next `seq`, taken under either.
    kept: Mutex<Rings>,
    feeds: broadcast::Sender<Entry>,
    open: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Rings {
    refusals: VecDeque<Entry>,
    rest: VecDeque<Entry>,
    next: u64,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline { kept: Mutex::default(), feeds: broadcast::channel(BACKLOG).0, open: Arc::default() }
    }
}

impl Timeline {
    pub(crate) fn record(&self, key: &str, what: Happened) {
        let at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let entry = {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            let entry = Entry { seq: kept.next, at_ms, key: key.to_string(), what };
            kept.next += 1;
            let ring = match entry.what {
                Happened::Refused { .. } => &mut kept.refusals,
                _ => &mut kept.rest,
            };
            if ring.len() == KEPT {
                ring.pop_front();
            }
            ring.push_back(entry.clone());
            entry
        };
        // No feed open: nobody to tell.
        let _ = self.feeds.send(entry);
    }

    /// What the lock service's view of `key` became, told by the knowledge
    /// as it changes: its latest grant (`latest`, before and after) and
    /// whether that grant's lease is live; `presumed` when an end is only
    /// implied.
    pub(crate) fn learnt(&self, key: &str, before: (Token, bool), after: (Token, bool), presumed: bool) {
        let ((was, was_live), (now, live)) = (before, after);
        // One holder at a time: a later grant ended the live one before it.
        if now > was && was_live {
            self.record(key, Happened::Ended { token: was, presumed: false });
        }
        if now > was {
            self.record(key, Happened::Granted { token: now });
        }
        if !live && (now > was || was_live) {
            self.record(key, Happened::Ended { token: now, presumed });
        }
        if now == was && !was_live && live {
            self.record(key, Happened::Live { token: now });
        }
    }

    /// The latest first, both rings.
    pub(crate) fn latest(&self) -> Vec<Entry> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<Entry> = kept.refusals.iter().chain(&kept.rest).cloned().collect();
        drop(kept);
        all.sort_unstable_by_key(|e| std::cmp::Reverse(e.seq));
        all
    }

    /// A feed of the events from now on, as Server-Sent Events named by
    /// their kind; `None` with `MAX_FEEDS` open.
    pub(super) fn feed(&self) -> Option<Body> {
        let open = self.open.clone();
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_FEEDS {
            open.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let state = (self.feeds.subscribe(), Closing(open));
        let lines = futures_util::stream::unfold(state, |(mut rx, closing)| async move {
            let line = match tokio::time::timeout(HEARTBEAT, rx.recv()).await {
                Err(_) => ": heartbeat\n\n".to_string(),
                Ok(Ok(e)) => format!("event: {}\ndata: {}\n\n", e.what.name(), serde_json::to_string(&e).ok()?),
                Ok(Err(broadcast::error::RecvError::Lagged(n))) => format!("event: skipped\ndata: {n}\n\n"),
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
            };
            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), (rx, closing)))
        });
        Some(StreamBody::new(lines).map_err(|never| match never {}).boxed())
    }
}

/// Counts a feed closed when its stream is dropped.
struct Closing(Arc<AtomicUsize>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(t: Token) -> Happened {
        Happened::Refused { route: "racks".into(), presented: Some(t), current: t + 1, reason: "stale_token" }
    }

    /// Each ring keeps its latest `KEPT`: refusals a client provokes do
    /// not push the lock service's story out.
    #[test]
    fn the_rings_keep_the_latest_first_and_no_more() {
        let r = Timeline::default();
        r.record("rack/1", Happened::Granted { token: 1 });
        for t in 0..(KEPT as u64 + 5) {
            r.record("rack/1", refused(t));
        }
        let latest = r.latest();
        assert_eq!(latest.len(), KEPT + 1);
        assert_eq!((&latest[0].what, &latest[KEPT - 1].what), (&refused(KEPT as u64 + 4), &refused(5)));
        assert_eq!((latest[KEPT].seq, &latest[KEPT].what), (0, &Happened::Granted { token: 1 }), "the grant stays");
        assert!(latest.windows(2).all(|w| w[0].seq > w[1].seq), "latest first");
    }

    #[tokio::test]
    async fn feeds_are_bounded_and_counted_closed() {
        let r = Timeline::default();
        let feeds: Vec<_> = (0..MAX_FEEDS).map(|_| r.feed().expect("within the bound")).collect();
        assert!(r.feed().is_none(), "one more than MAX_FEEDS");
        drop(feeds);
        assert!(r.feed().is_some(), "closed feeds free their places");
    }

    /// The seed's sequence as the knowledge tells it: A's grant, its end,
    /// B's grant; a grant learnt already ended is both; a grant learnt while
    /// the one before was live ends it; an end only presumed says so, and
    /// a read that finds the lease live after all says that; what did not
    /// change the view is nothing.
    #[test]
    fn the_knowledge_tells_grants_and_ends_once() {
        let t = Timeline::default();
        t.learnt("rack/42", (0, false), (33, true), false);
        t.learnt("rack/42", (33, true), (33, true), false);
        t.learnt("rack/42", (33, true), (33, false), false);
        t.learnt("rack/42", (33, false), (33, false), false);
        t.learnt("rack/42", (33, false), (34, true), false);
        t.learnt("rack/7", (0, false), (5, false), false);
        t.learnt("rack/7", (5, false), (6, true), false);
        t.learnt("rack/7", (6, true), (8, true), false);
        t.learnt("rack/7", (8, true), (8, false), true);
        t.learnt("rack/7", (8, false), (8, true), false);
        let told: Vec<_> = t.latest().into_iter().rev().map(|e| (e.key, e.what)).collect();
        let g = |token| Happened::Granted { token };
        let e = |token| Happened::Ended { token, presumed: false };
        let key = |k: &str| k.to_string();
        assert_eq!(
            told,
            [
                (key("rack/42"), g(33)),
                (key("rack/42"), e(33)),
                (key("rack/42"), g(34)),
                (key("rack/7"), g(5)),
                (key("rack/7"), e(5)),
                (key("rack/7"), g(6)),
                (key("rack/7"), e(6)),
                (key("rack/7"), g(8)),
                (key("rack/7"), Happened::Ended { token: 8, presumed: true }),
                (key("rack/7"), Happened::Live { token: 8 }),
            ]
        );
    }
}
