//! `GET /v1/watch?prefix=P[&after=REV]`: an NDJSON stream of a node's applied
//! lock events.
//!
//! Without `after`, the stream starts with one `{"event":"state",...}` line per
//! matching key (the current state), then follows with `granted`, `released`
//! and `expired` events in log order. Every line carries `rev`, the revision
//! it reflects (each event has its own; a grant's token is its revision); a
//! client that reconnects with `after=<last rev>` gets exactly the events it
//! missed, or, if the node no longer remembers them
//! (or restarted from a snapshot), a `{"event":"resync"}` line followed by the
//! current state again. A `heartbeat` line follows every state dump (so the
//! client knows the dump is complete without waiting for an event), and one
//! every few seconds lets the client notice a dead stream. With
//! `progress=1`, one also follows at once applied events the stream does
//! not show, so that its position keeps up with the revision (opt-in: it
//! tells the watcher when events on keys it cannot see happen). A node that
//! knows no leader ends its streams.
//!
//! A node vouches only for what it has seen: `after` beyond its revision
//! (once it has had `CATCH_UP` to reach it) or `cluster=` naming another
//! cluster's history is answered 409 `position_unknown` with the node's
//! revision and cluster id, never a heartbeat at the watcher's position,
//! which would tell it that nothing happened up to there.
//!
//! Applied `Event`s become `wire::WatchLine`s here; lease ids never leave
//! the node.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fencegate_client::wire::WatchLine;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::Response;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::Node;
use crate::http::{channel_body, Body};
use crate::lock::state::{Event, EventKind};
use crate::raft::identity;
use crate::raft::state_machine::AppliedState;

const HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a watch resuming beyond this node's revision waits for the
/// node to apply it (a follower a moment behind the leader the watcher
/// read from) before it is refused.
const CATCH_UP: Duration = Duration::from_secs(1);
/// A watcher that takes no line for this long (its buffer full) is cut off:
/// a stream nobody reads must not hold the node's memory for ever. It
/// resumes with `after=` when it comes back.
const SLOW_WATCHER: Duration = Duration::from_secs(30);

/// Queue `line` for the watcher; `false` when the stream is over (the
/// watcher went away, or stopped reading).
async fn deliver(tx: &mpsc::Sender<Bytes>, line: Bytes) -> bool {
    matches!(tokio::time::timeout(SLOW_WATCHER, tx.send(line)).await, Ok(Ok(())))
}

/// Which keys a watcher may see (its identity's `watch` right).
pub(super) type Visible = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// A watch's query: the key prefix (empty: every key), the revision to
/// resume after, whether the watcher asked for a heartbeat at once after
/// events it cannot see (`progress=1`), and the cluster whose history
/// `after` is a position in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchParams {
    pub prefix: String,
    pub after: Option<u64>,
    pub progress: bool,
    pub cluster: Option<String>,
}

/// Read `prefix=P[&after=REV][&progress=0|1][&cluster=ID]`, each value
/// percent-decoded once and checked.
pub fn params(query: Option<&str>) -> Result<WatchParams, ApiError> {
    let mut prefix = String::new();
    let mut after = None;
    let mut progress = false;
    let mut cluster = None;
    for pair in crate::percent::query(query) {
        match pair.map_err(ApiError::BadRequest)? {
            ("prefix", p) => prefix = p,
            ("progress", v) => {
                progress = match v.as_str() {
                    "1" => true,
                    "0" => false,
                    other => return Err(ApiError::BadRequest(format!("progress={other:?} is not 0 or 1"))),
                }
            }
            ("cluster", c) => {
                if !identity::valid(&c) {
                    return Err(ApiError::BadRequest(format!("cluster={c:?} is not a cluster id")));
                }
                cluster = Some(c)
            }
            ("after", n) => {
                after = Some(n.parse::<u64>().map_err(|_| ApiError::BadRequest(format!("after={n:?} is not a u64")))?)
            }
            (name, _) => return Err(ApiError::BadRequest(format!("unknown watch parameter {name:?}"))),
        }
    }
    crate::lock::validate::prefix(&prefix)?;
    Ok(WatchParams { prefix, after, progress, cluster })
}

/// Open a stream of `query`'s prefix. `may_open` says whether the watcher
/// may watch anything under it; it then sees only the keys `visible` allows,
/// until the future `ends` makes for the prefix resolves (its credential
/// revoked or its right taken away).
pub(super) async fn stream<E: Future<Output: Send> + Send + 'static>(
    node: Arc<Node>,
    query: Option<&str>,
    may_open: impl FnOnce(&str) -> Result<(), ApiError>,
    visible: Visible,
    ends: impl FnOnce(&str) -> E,
) -> Result<Response<Body>, ApiError> {
    let WatchParams { prefix, after, progress, cluster } = params(query)?;
    may_open(&prefix)?;
    vouch(&node, after, cluster.as_deref()).await?;
    let (tx, rx) = mpsc::channel(256);
    let ends = ends(&prefix);
    tokio::spawn(run(node, prefix, visible, after, progress, tx, ends));
    let mut resp = Response::new(channel_body(rx));
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    Ok(resp)
}

/// `Ok` once this node can stand for a watcher's position: of its own
/// history (or the watcher names none), and at most its revision (waiting
/// up to `CATCH_UP` for it to apply that far). A node never vouches for a
/// revision it has not reached.
async fn vouch(node: &Node, after: Option<u64>, cluster: Option<&str>) -> Result<(), ApiError> {
    let mine = node.identity.get();
    let refuse = |why: String, rev| ApiError::PositionUnknown { why, rev, cluster: mine.clone() };
    if let Err(e) = identity::compatible(mine.as_deref(), cluster) {
        return Err(refuse(format!("the position is of another history: {e}"), node.applied.lock().locks.revision()));
    }
    let Some(after) = after else { return Ok(()) };
    let mut applied = node.applied.subscribe();
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    loop {
        let rev = node.applied.lock().locks.revision();
        if after <= rev {
            return Ok(());
        }
        if !matches!(tokio::time::timeout_at(deadline, applied.changed()).await, Ok(Ok(()))) {
            return Err(refuse(
                format!("after={after} is beyond this node's revision {rev}: it cannot vouch for what it has not seen"),
                rev,
            ));
        }
    }
}

fn line(l: &WatchLine) -> Bytes {
    let mut b = serde_json::to_vec(l).expect("wire types serialise");
    b.push(b'\n');
    Bytes::from(b)
}

/// An applied event as watchers see it (lease ids stay with the holder).
fn event_line(e: &Event) -> WatchLine {
    let (rev, key, token) = (e.rev, e.key.clone(), e.token);
    match &e.kind {
        EventKind::Granted { holder, ttl_ms } => {
            WatchLine::Granted { rev, key, token, holder: holder.clone(), ttl_ms: *ttl_ms }
        }
        EventKind::Released => WatchLine::Released { rev, key, token },
        EventKind::Expired { .. } => WatchLine::Expired { rev, key, token },
    }
}

fn state_lines(s: &AppliedState, prefix: &str, visible: &Visible, out: &mut Vec<Bytes>) {
    let rev = s.locks.revision();
    for (key, k) in s.locks.keys_with_prefix(prefix).filter(|(key, _)| visible(key)) {
        let holder = s.locks.holder_of(key).map(|(_, l)| l.holder.clone());
        out.push(line(&WatchLine::State { key: key.clone(), held: holder.is_some(), token: k.token, holder, rev }));
    }
}

async fn run(
    node: Arc<Node>,
    prefix: String,
    visible: Visible,
    after: Option<u64>,
    progress: bool,
    tx: mpsc::Sender<Bytes>,
    ends: impl Future,
) {
    tokio::pin!(ends);
    let mut applied = node.applied.subscribe();
    let mut cursor = after;
    // Where the stream is complete up to: what a heartbeat reports.
    let mut complete = after.unwrap_or(0);
    loop {
        let mut lines = Vec::new();
        {
            let s = node.applied.lock();
            let resumed = cursor.and_then(|c| s.events.after(c)).map(|events| {
                for e in events.filter(|e| e.key.starts_with(&prefix) && visible(&e.key)) {
                    lines.push(line(&event_line(e)));
                }
            });
            if resumed.is_none() {
                if cursor.is_some() {
                    lines.push(line(&WatchLine::Resync { rev: s.locks.revision() }));
                }
                state_lines(&s, &prefix, &visible, &mut lines);
            }
            // Never backwards: a watcher resuming on a node that lags what it
            // has already seen must not get those events twice.
            let before = complete;
            complete = complete.max(s.locks.revision());
            cursor = Some(complete);
            if resumed.is_none() || (progress && lines.is_empty() && complete > before) {
                // After a dump: it is complete at `complete` (a client would
                // otherwise wait for the next event or heartbeat to know).
                // With `progress`: events it does not see moved the table
                // on; say so at once, so that its position follows the
                // revision (a sidecar proving its knowledge current waits
                // for it).
                lines.push(line(&WatchLine::Heartbeat { rev: complete }));
            }
        }
        for l in lines {
            if !deliver(&tx, l).await {
                return; // the client went away
            }
        }
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            // Shutting down: the watcher resumes on another node.
            () = node.stopped() => return,
            // Revoked: the watcher's next request gets 401 or 403.
            _ = &mut ends => return,
            _ = tokio::time::sleep(HEARTBEAT) => {
                if node.leader().is_none() {
                    // Cut off from the cluster: end the stream so the watcher
                    // moves to a node that still follows the log.
                    return;
                }
                let beat = line(&WatchLine::Heartbeat { rev: complete });
                if !deliver(&tx, beat).await {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::state::{AcquireCmd, Command, LockState};

    #[test]
    fn watch_lines_never_carry_lease_ids() {
        let mut s = LockState::default();
        let cmd = AcquireCmd {
            key: "k".into(),
            owner: "o".into(),
            holder: "h".into(),
            ttl_ms: 1000,
            lock_delay_ms: 0,
            lease_id: "secret-lease".into(),
            request_id: None,
        };
        let (_, ev) = s.apply(&Command::Acquire(cmd));
        let json = String::from_utf8(line(&event_line(&ev.unwrap())).to_vec()).unwrap();
        assert!(!json.contains("secret-lease"), "{json}");
        assert!(json.contains(r#""event":"granted""#), "{json}");
    }

    /// A watcher that stops reading is cut off after `SLOW_WATCHER`, not
    /// kept (with everything queued for it) for ever.
    #[tokio::test(start_paused = true)]
    async fn a_watcher_that_reads_nothing_is_cut_off() {
        let (tx, mut rx) = mpsc::channel(1);
        assert!(deliver(&tx, Bytes::from_static(b"1")).await, "room in the buffer");
        let t = tokio::time::Instant::now();
        assert!(!deliver(&tx, Bytes::from_static(b"2")).await, "the buffer stayed full");
        assert_eq!(t.elapsed(), SLOW_WATCHER);
        rx.recv().await.unwrap();
        assert!(deliver(&tx, Bytes::from_static(b"3")).await, "a reading watcher is served");
    }
}
