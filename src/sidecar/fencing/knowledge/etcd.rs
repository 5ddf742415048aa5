//! Following etcd (`lock_service.kind: etcd`, docs/decisions/0010): whether
//! it is up, the proof, and the watches.
//!
//! - **Up** while some member reports itself healthy (it has a leader):
//!   `knowledge::up_forever`.
//! - **The proof** is a list: every third of `max_staleness`, the keys
//!   under every followed prefix, in one linearizable transaction sent at
//!   `sent`. What it shows is the whole state of those locks at its
//!   revision, which is at least every change acknowledged before `sent`:
//!   learnt as a read of each lock it names (and of each known lock under
//!   the prefixes, absent from it), it proves the knowledge current as of
//!   `sent`. No stream position needs proving: etcd 3.4's progress
//!   notifications are not ordered with a watch's events.
//! - **The watches**, one per prefix (a list, then a watch from the
//!   revision after it; again from a list when etcd ends it, e.g. on
//!   compaction), only make the knowledge newer between proofs: a new
//!   holder's token is known within milliseconds, so an old holder's
//!   writes are refused before the next list. They prove nothing.
//!
//! Either source may lag the other; what each teaches is merged so that
//! knowledge only moves forward (`Known::ended_through`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fencegate_client::http::LineReader;
use fencegate_client::wire::LockInfo;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{LockView, Source};
use crate::log_limit::{Window, EVERY};
use crate::sidecar::fencing::etcd::mirror::Mirror;
use crate::sidecar::fencing::etcd::{watch_line, Etcd, Listing, WatchLine, MAX_KEYS};
use crate::sidecar::fencing::freshness;

/// The longest watch line read (etcd sends a revision's changes in one).
const MAX_WATCH_LINE: usize = 16 << 20;

fn etcd_of(view: &Weak<LockView>) -> Option<Arc<Etcd>> {
    match &view.upgrade()?.source {
        Source::Etcd(etcd) => Some(etcd.clone()),
        Source::Fencegate(_) | Source::ZooKeeper(_) => None,
    }
}

/// While the view lives: a watch per followed prefix, and the proof every
/// third of `max_staleness`, one list at a time (a slow one delays the
/// next; the proof ages meanwhile and `cached` routes read).
pub(super) async fn follow_forever(view: Weak<LockView>) {
    let Some(max_staleness) = view.upgrade().map(|v| v.max_staleness) else { return };
    let mut tick = tokio::time::interval(max_staleness / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watches: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut failures = Window::new(EVERY);
    let stop = |watches: &mut HashMap<String, JoinHandle<()>>| watches.drain().for_each(|(_, w)| w.abort());
    loop {
        {
            let Some(v) = view.upgrade() else { return stop(&mut watches) };
            // A reload's new prefixes are followed at once.
            tokio::select! {
                _ = tick.tick() => {}
                () = v.refollow.notified() => {}
            }
        }
        let Some(v) = view.upgrade() else { return stop(&mut watches) };
        v.metrics.knowledge_age.set(v.age(Instant::now()).as_secs_f64());
        let prefixes = v.followed();
        drop(v);
        super::watch_each(&mut watches, &prefixes, |p| tokio::spawn(watch_forever(view.clone(), p)));
        if prefixes.is_empty() {
            continue;
        }
        let Some(etcd) = etcd_of(&view) else { return stop(&mut watches) };
        let sent = Instant::now();
        let listing = etcd.list(&prefixes).await;
        let Some(v) = view.upgrade() else { return stop(&mut watches) };
        let failed = match listing {
            // Answered `max_staleness` or more after it was sent, it would
            // prove nothing still usable.
            Ok(l) if freshness::trusted(Some(sent), Instant::now(), max_staleness) => {
                // A proof of these prefixes only, none of the ones a reload
                // set meanwhile (`set_followed` holds the same lock).
                let followed = v.followed.lock().unwrap_or_else(|p| p.into_inner());
                if v.learn_listing(&prefixes, &l, sent) && *followed == prefixes {
                    let mut f = v.freshness();
                    f.answered(sent, l.revision);
                    f.delivered(l.revision);
                }
                continue;
            }
            Ok(_) => format!("answered {:?} after it was sent", sent.elapsed()),
            Err(e) => e,
        };
        v.metrics.freshness_probe_failures.inc();
        if let Some(more) = failures.hit(std::time::Instant::now()) {
            tracing::warn!("listing etcd's followed prefixes failed: {failed}{more}");
        }
    }
}

/// Whether every key of lock `name` is under `prefix` (so a list or watch
/// of the prefix sees all of them): `name/` starts with it. A lock above
/// the prefix (`locks` for `locks/job-`) has keys elsewhere too.
fn under(name: &str, prefix: &str) -> bool {
    format!("{name}/").starts_with(prefix)
}

impl LockView {
    /// What a list of `prefixes`, sent at `sent`, shows: each lock under
    /// them a key of it belongs to held by its least create revision, and
    /// each known lock under them it shows no key of ended through its
    /// revision. All of it under the history's lock, so that a watch line
    /// learnt meanwhile sees either none of it or all of it (`listed`).
    /// `false` if it is of the history left behind.
    fn learn_listing(&self, prefixes: &[String], listing: &Listing, sent: Instant) -> bool {
        let Some(mut history) = self.of_history(Some(&listing.cluster), sent) else { return false };
        let mirror = Mirror::new(listing.keys.iter().cloned());
        let followed = |name: &str| prefixes.iter().any(|p| under(name, p));
        let mut locks: HashSet<String> = mirror.locks().filter(|l| followed(l)).map(str::to_string).collect();
        locks.extend(self.keys.iter().map(|k| k.key().clone()).filter(|k| followed(k)));
        for lock in locks {
            let holder = mirror.holder(&lock);
            let info = LockInfo {
                key: lock.clone(),
                held: holder.is_some(),
                token: holder.unwrap_or(0),
                holder: None,
                expires_in_ms: None,
                compacted_below: holder.is_none().then_some(listing.revision),
                cluster: Some(listing.cluster.clone()),
            };
            self.learn_read_in(&mut history, &lock, &info, sent);
        }
        for p in prefixes {
            let at = history.listed.entry(p.clone()).or_default();
            *at = (*at).max(listing.revision);
        }
        true
    }
}

/// Keep a watch of `prefix` open until the view is dropped (or the prefix
/// no longer followed: `follow_forever` aborts this task).
async fn watch_forever(view: Weak<LockView>, prefix: String) {
    let mut backoff = fencegate_client::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
        .with_floor(Duration::from_millis(20));
    let mut failures = Window::new(EVERY);
    loop {
        let Some(etcd) = etcd_of(&view) else { return };
        let mut changes = 0u64;
        match follow(&view, &etcd, &prefix, &mut changes).await {
            Ok(()) => tracing::debug!(prefix, "etcd's watch ended; listing again"),
            Err(e) => {
                if let Some(more) = failures.hit(std::time::Instant::now()) {
                    tracing::warn!(prefix, "etcd watch: {e}{more}");
                }
            }
        }
        if changes > 0 {
            backoff.reset();
            failures.reset();
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// List `prefix`, learn it, and follow its changes from the next revision
/// on: each line's changes applied to the list's keys, then each lock they
/// touched learnt as the keys now say. `changes` counts what was applied.
async fn follow(view: &Weak<LockView>, etcd: &Etcd, prefix: &str, changes: &mut u64) -> Result<(), String> {
    let gone = || "the sidecar is stopping".to_string();
    let sent = Instant::now();
    let listing = etcd.list(&[prefix.to_string()]).await?;
    if !view.upgrade().ok_or_else(gone)?.learn_listing(&[prefix.to_string()], &listing, sent) {
        return Err("listed a history left behind".into());
    }
    let mut mirror = Mirror::new(listing.keys);
    let resp = etcd.watch(prefix, listing.revision + 1).await?;
    let mut lines = LineReader::new(resp.into_body());
    while let Some(line) = lines.next_line(MAX_WATCH_LINE).await.map_err(|e| e.to_string())? {
        let (cluster, batch) = match watch_line(&line)? {
            WatchLine::Canceled { why, .. } => return Err(format!("etcd ended the watch: {why}")),
            WatchLine::Events { cluster, changes } => (cluster, changes),
        };
        let Some(last) = batch.last().map(|c| c.revision) else { continue };
        let v = view.upgrade().ok_or_else(gone)?;
        let Some(history) = v.of_history(Some(&cluster), sent) else {
            return Err("the watch is of a history left behind".into());
        };
        // The whole line first: a revision's changes come together, and a
        // lock is judged by the keys after all of them. Only the locks whose
        // keys are all under the prefix: this watch sees no others whole.
        let mut touched = HashSet::new();
        for change in &batch {
            touched.extend(mirror.apply(change, |name| v.keys.contains_key(name)));
        }
        // A lock not known yet had no key at the prefix's latest list.
        let listed = history.listed.get(prefix).copied().unwrap_or(0);
        for lock in touched.into_iter().filter(|l| under(l, prefix)) {
            match mirror.holder(&lock) {
                Some(token) => v.learn(&lock, token, true, listed),
                None => v.learn_absent(&lock, last),
            }
        }
        drop(history);
        if mirror.len() > MAX_KEYS {
            return Err(format!("more than {MAX_KEYS} keys under {prefix:?}: too many to follow"));
        }
        *changes += batch.len() as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use fencegate_client::http::HttpClient;
    use http_body_util::combinators::UnsyncBoxBody;
    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::{Frame, Incoming};
    use hyper_util::rt::TokioIo;
    use tokio::sync::Notify;

    use super::*;
    use crate::metrics::SidecarMetrics;

    const HEADER: &str = r#""header":{"cluster_id":"1","revision":"10"}"#;

    /// A stand-in gateway: a list of nothing at revision 10; a watch that
    /// says it was created, tells `opened`, waits for `go`, then sends the
    /// put of `job/7/abc` at revision 12 and ends.
    async fn lagging_gateway(opened: Arc<Notify>, go: Arc<Notify>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (opened, go) = (opened.clone(), go.clone());
                let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let (opened, go) = (opened.clone(), go.clone());
                    async move {
                        let resp: hyper::Response<UnsyncBoxBody<Bytes, Infallible>> = if req.uri().path() == "/v3/watch"
                        {
                            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
                            tokio::spawn(async move {
                                let created = format!("{{\"result\":{{{HEADER},\"created\":true}}}}\n");
                                let _ = tx.send(Ok(Frame::data(Bytes::from(created)))).await;
                                opened.notify_one();
                                go.notified().await;
                                let put = format!(
                                    "{{\"result\":{{{HEADER},\"events\":[{{\"kv\":{{\"key\":\"{}\",\"create_revision\":\"12\",\"mod_revision\":\"12\"}}}}]}}}}\n",
                                    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "job/7/abc")
                                );
                                let _ = tx.send(Ok(Frame::data(Bytes::from(put)))).await;
                            });
                            let frames =
                                futures_util::stream::unfold(rx, |mut rx| async move { Some((rx.recv().await?, rx)) });
                            hyper::Response::new(StreamBody::new(frames).boxed_unsync())
                        } else {
                            let listed = format!(
                                "{{{HEADER},\"succeeded\":true,\"responses\":[{{\"response_range\":{{\"header\":{{}}}}}}]}}"
                            );
                            hyper::Response::new(Full::new(Bytes::from(listed)).boxed_unsync())
                        };
                        Ok::<_, Infallible>(resp)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        url
    }

    /// A lock a list at revision 14 showed no key of, told of afterwards by
    /// a watch still behind that list (its key created at 12, gone by 14),
    /// is not live: `job/7`'s old holder is not forwarded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lock_a_list_showed_free_is_not_made_live_by_a_watch_behind_it() {
        let (opened, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let url = lagging_gateway(opened.clone(), go.clone()).await;
        let etcd = Arc::new(Etcd::new(vec![url], HttpClient::new(1 << 20), None));
        let metrics = SidecarMetrics::new(&prometheus::Registry::new()).unwrap();
        let prefix = "job/".to_string();
        let view = LockView::new(
            Source::Etcd(etcd.clone()),
            metrics,
            Duration::from_secs(1),
            vec![prefix.clone()],
            Arc::default(),
        );
        let weak = Arc::downgrade(&view);
        let follower = tokio::spawn(async move { follow(&weak, &etcd, "job/", &mut 0).await });
        opened.notified().await;
        let listing = Listing { cluster: "etcd:1".into(), revision: 14, keys: vec![] };
        assert!(view.learn_listing(&[prefix], &listing, Instant::now()));
        go.notify_one();
        follower.await.unwrap().unwrap();
        let (known, _) = view.look("job/7", Instant::now());
        assert_eq!((known.latest, known.live), (12, false), "created at 12, gone by the list at 14");
    }

    #[test]
    fn a_lock_is_followed_whole_only_under_its_prefix() {
        assert!(under("rack/42", "rack/"));
        assert!(under("items", "items/"));
        assert!(under("rack", "rack/"));
        assert!(!under("locks", "locks/job-"), "locks/<lease> is not under locks/job-");
        assert!(under("locks/job-7", "locks/job-"));
    }
}
