//! What the sidecar knows about keys from the lock service: the latest grant
//! of each key and whether its lease is live.
//!
//! Kept fresh by one watch stream over all keys (resumed by revision after a
//! reconnect, resynced from the state lines when it cannot resume), and by
//! linearizable reads when a check needs one (a token above anything known,
//! or a `linearizable` route). Concurrent reads of one key are coalesced; a
//! request only joins a read that started after it arrived, so the answer
//! reflects every grant that completed before the request (S3, S5).
//!
//! Knowledge only moves forward: the latest token never decreases, and once
//! the lease of the latest token is known to have ended, it stays ended.
//!
//! How current the knowledge is, is proven by probes (`freshness`): every
//! third of `max_staleness` the leader's revision is read linearizably; the
//! knowledge is current as of a probe's send time once the stream has
//! delivered everything up to the revision it answered. `cached` routes
//! trust it alone only until `max_staleness` after the latest proof.
//!
//! The service forgets idle keys (compaction). A key it no longer has is
//! ended: a read says so with `compacted_below`, and a state dump (at the
//! start of a stream, or after a resync) that does not list a known key
//! says so too. That needs the `watch` right on every key the routes use; a
//! key only reads told of is trusted only as long as its latest read
//! (`freshness::key_trusted`).
//!
//! All of it is of one history: the lock service's cluster id, which every
//! answer names. An answer of another history, to a request sent after the
//! knowledge's history was adopted, replaces the knowledge (a restore made
//! a new cluster): every key's knowledge, the position and the proofs are
//! dropped and the stream starts over from a state dump; the floors stay,
//! and a key whose new token is below its floor is refused until it passes
//! it (`decision::decide`). Answers of the history left behind are not learnt.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use fencegate_client::backoff::Backoff;
use fencegate_client::http::{HttpClient, LineReader};
use fencegate_client::wire::{self, Token, WatchLine};
use fencegate_client::Client;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::SidecarMetrics;
use crate::sidecar::console::{Happened, Timeline};
use crate::sidecar::fencing::decision::Knowledge;
use crate::sidecar::fencing::etcd::Etcd;
use crate::sidecar::fencing::freshness::{self, Freshness};
use crate::sidecar::fencing::zookeeper::ZooKeeper;

mod etcd;
mod zookeeper;

/// A watch stream silent for this long is considered dead (the lock service
/// sends a heartbeat every 5 s).
const STREAM_SILENCE: Duration = Duration::from_secs(12);
const MAX_LINE: usize = 64 << 10;
/// How often a quiet stream is checked for being behind the probes.
const BEHIND_TICK: Duration = Duration::from_millis(100);

/// What is known of one key from the lock service.
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    latest: Token,
    live: bool,
    /// `live` was cleared only by a state dump that did not list the key.
    presumed_ended: bool,
    /// The watch stream has told of the key (a state line or an event): the
    /// probes' proof covers it. A key only reads told of (one this sidecar
    /// may read but not watch) is vouched for by its latest read alone.
    watched: bool,
    /// When the latest read of the key that answered was sent.
    read_at: Option<Instant>,
    /// When `latest` was learnt: a read sent after it that answers less is
    /// of another history (`LockView::learn_read`).
    learnt_at: Option<Instant>,
    /// Every grant of the key up to this has ended (the service had no
    /// entry for it then): a source that lags another cannot make one of
    /// them live again.
    ended_through: Token,
}

impl Known {
    /// What the console's timeline tells of: the latest grant, and whether
    /// its lease is live.
    fn view(&self) -> (Token, bool) {
        (self.latest, self.live)
    }

    fn merge(&mut self, token: Token, held: bool) {
        let held = held && token > self.ended_through;
        if token > self.latest {
            (self.latest, self.live, self.presumed_ended) = (token, held, false);
        } else if token == self.latest {
            self.live &= held;
            self.presumed_ended &= held;
        }
    }

    /// A linearizable read: the truth now. Only it may undo a presumption
    /// (a watch line may come from a lagging node).
    fn merge_read(&mut self, token: Token, held: bool) {
        if token == self.latest && held && token > self.ended_through && self.presumed_ended {
            (self.live, self.presumed_ended) = (true, false);
        }
        self.merge(token, held);
    }

    /// The service has no entry for the key: every grant of it up to
    /// `ended_through` has ended.
    fn merge_absent(&mut self, ended_through: Token) {
        if self.latest <= ended_through {
            (self.live, self.presumed_ended) = (false, false);
        }
        self.ended_through = self.ended_through.max(ended_through);
    }
}

/// A read's outcome: every grant of the key up to this token has ended
/// (`wire::LockInfo::ended_through`), or why it failed.
type ReadResult = Result<Token, String>;

/// A read in flight: when it started, and its result once done.
struct InflightRead {
    started: Instant,
    done: watch::Receiver<Option<ReadResult>>,
}

pub(crate) struct LockView {
    keys: DashMap<String, Known>,
    /// The highest `compacted_below` a read returned.
    compacted_below: std::sync::atomic::AtomicU64,
    source: Source,
    up: AtomicBool,
    metrics: SidecarMetrics,
    reads: Mutex<HashMap<String, InflightRead>>,
    /// Reads that failed: a line a while, with the cause (the request only
    /// says `lock_service_unavailable`).
    read_failures: Mutex<crate::log_limit::Window>,
    freshness: Mutex<Freshness>,
    max_staleness: Duration,
    started: Instant,
    /// Whether some route is `cached` (only they use the proof): no probes
    /// otherwise. Set again by a reload.
    probing: AtomicBool,
    /// The prefixes of the `cached` routes' lock keys (etcd follows only
    /// them; fencegate's watch covers every key).
    followed: Mutex<Vec<String>>,
    /// Wakes etcd's or ZooKeeper's follower when `followed` changed (a
    /// reload), so that the new prefixes are watched and proven now, not at
    /// its next tick.
    refollow: tokio::sync::Notify,
    /// The history (cluster id) the knowledge is of. Held while an answer
    /// is learnt, so that a change of history cannot slip in between the
    /// check and the learning.
    history: Mutex<History>,
    /// Told each change of a key's latest grant or its lease's end.
    timeline: Arc<Timeline>,
}

/// The lock service's history the knowledge is of.
#[derive(Debug, Default)]
struct History {
    /// `None` until an answer names one (a node of a build before cluster
    /// ids names none).
    cluster: Option<String>,
    /// When it was adopted: an answer of another one to a request sent
    /// before this is from the history left behind.
    since: Option<Instant>,
    /// etcd: per followed prefix, the revision of the latest list of it
    /// learnt. A lock under it with no knowledge had no key then: a watch
    /// that tells of it later cannot make a grant up to there live.
    listed: HashMap<String, u64>,
}

impl LockView {
    /// Start watching the lock service behind `client`, whose endpoints are
    /// also used for the stream, and probing it (while some route is
    /// `cached`: `followed` holds its prefix) so that `cached` routes may
    /// trust the stream for `max_staleness` after each proof.
    pub(crate) fn start(
        client: Client,
        metrics: SidecarMetrics,
        max_staleness: Duration,
        followed: Vec<String>,
        timeline: Arc<Timeline>,
    ) -> Arc<Self> {
        let endpoints = client.endpoints().to_vec();
        // The stream's own client: same TLS and token, but lines, not bodies, are bounded.
        let http = client.options().http_client(MAX_LINE).expect("the client was built from these options");
        let view = Self::new(Source::Fencegate(client.clone()), metrics, max_staleness, followed, timeline);
        tokio::spawn(watch_forever(Arc::downgrade(&view), endpoints, http));
        tokio::spawn(probe_forever(Arc::downgrade(&view), client));
        view
    }

    /// Follow the locks `etcdctl lock` takes in `etcd` (decision 0010): the
    /// keys under each of `followed` listed every third of `max_staleness`
    /// (the proof) and watched in between; other keys read per request.
    /// The service is up while a member reports itself healthy.
    pub(crate) fn start_etcd(
        etcd: Etcd,
        metrics: SidecarMetrics,
        max_staleness: Duration,
        followed: Vec<String>,
        timeline: Arc<Timeline>,
    ) -> Arc<Self> {
        let view = Self::new(Source::Etcd(Arc::new(etcd)), metrics, max_staleness, followed, timeline);
        tokio::spawn(up_forever(Arc::downgrade(&view)));
        tokio::spawn(etcd::follow_forever(Arc::downgrade(&view)));
        view
    }

    /// Follow the locks kazoo's and Curator's recipes take in ZooKeeper
    /// (decision 0010): the locks under each of `followed` read after a
    /// quorum barrier every third of `max_staleness` (the proof), and a
    /// lock read again when a watch says it changed; other locks read per
    /// request (a barrier, then the lock's children). The service is up
    /// while a `sync` is answered.
    pub(crate) fn start_zookeeper(
        zk: ZooKeeper,
        metrics: SidecarMetrics,
        max_staleness: Duration,
        followed: Vec<String>,
        timeline: Arc<Timeline>,
    ) -> Arc<Self> {
        let view = Self::new(Source::ZooKeeper(Arc::new(zk)), metrics, max_staleness, followed, timeline);
        tokio::spawn(up_forever(Arc::downgrade(&view)));
        tokio::spawn(zookeeper::follow_forever(Arc::downgrade(&view)));
        view
    }

    fn new(
        source: Source,
        metrics: SidecarMetrics,
        max_staleness: Duration,
        followed: Vec<String>,
        timeline: Arc<Timeline>,
    ) -> Arc<Self> {
        Arc::new(Self {
            keys: DashMap::new(),
            compacted_below: Default::default(),
            source,
            up: AtomicBool::new(false),
            metrics,
            reads: Mutex::new(HashMap::new()),
            read_failures: Mutex::new(crate::log_limit::Window::new(crate::log_limit::EVERY)),
            freshness: Mutex::default(),
            max_staleness,
            started: Instant::now(),
            probing: AtomicBool::new(!followed.is_empty()),
            followed: Mutex::new(followed),
            refollow: tokio::sync::Notify::new(),
            history: Mutex::default(),
            timeline,
        })
    }

    /// Probe (or stop probing), and follow these prefixes, as routes that
    /// trust the watch come and go. A proof of other prefixes vouches for
    /// none of the keys learnt under the old ones.
    pub(crate) fn set_followed(&self, followed: Vec<String>) {
        self.probing.store(!followed.is_empty(), Ordering::Relaxed);
        let mut mine = self.followed.lock().unwrap_or_else(|p| p.into_inner());
        if *mine != followed && matches!(self.source, Source::Etcd(_) | Source::ZooKeeper(_)) {
            *self.freshness() = Freshness::default();
            self.keys.iter_mut().for_each(|mut k| k.watched = false);
            self.refollow.notify_one();
        }
        *mine = followed;
    }

    /// The prefixes followed now.
    fn followed(&self) -> Vec<String> {
        self.followed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Why the stream should be dropped for another endpoint's: a probe's
    /// revision it has not reached for `behind_patience` (its node lags the
    /// leader, or lost it and streams nothing).
    fn behind(&self, now: Instant) -> Option<String> {
        let patience = freshness::behind_patience(self.max_staleness);
        let f = self.freshness();
        freshness::behind(f.oldest_waiting(), now, patience)
            .then(|| format!("the stream has not reached revision {} (a probe's) within {patience:?}", f.awaited()))
    }

    fn freshness(&self) -> std::sync::MutexGuard<'_, Freshness> {
        self.freshness.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is known of `key` (`floor` left for the caller), and whether a
    /// route may still decide from it at `now` without asking the lock
    /// service: the watch's knowledge, proven current less than
    /// `max_staleness` ago, if the stream has told of the key (or of none:
    /// nothing granted is then known); a read of the key sent that
    /// recently, if not. One lookup, for the request path.
    pub(crate) fn look(&self, key: &str, now: Instant) -> (Knowledge, bool) {
        let proven = self.freshness().proven();
        let compacted_below = self.compacted_below.load(Ordering::Relaxed);
        let (known, watched, read_at) = match self.keys.get(key) {
            Some(k) => {
                let known = Knowledge {
                    latest: k.latest,
                    live: k.live,
                    known: true,
                    presumed_ended: k.presumed_ended,
                    compacted_below,
                    floor: 0,
                };
                (known, k.watched, k.read_at)
            }
            None => (Knowledge { compacted_below, ..Knowledge::default() }, true, None),
        };
        (known, freshness::key_trusted(watched, proven, read_at, now, self.max_staleness))
    }

    /// Whether a read of one key that started at `read_at` still vouches for
    /// that key at `now`.
    pub(crate) fn read_trusted(&self, read_at: Instant, now: Instant) -> bool {
        freshness::trusted(Some(read_at), now, self.max_staleness)
    }

    /// How long ago the knowledge was last proven current at `now` (since
    /// the start, before any proof).
    pub(crate) fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.freshness().proven().unwrap_or(self.started))
    }

    /// A `cached` route on `route` read the lock service because its
    /// knowledge was older than `max_staleness`.
    pub(crate) fn count_stale(&self, route: &str) {
        self.metrics.stale_knowledge_reads.with_label_values(&[route]).inc();
    }

    /// The stream has delivered everything up to `rev`.
    fn delivered(&self, rev: u64) {
        self.freshness().delivered(rev);
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        self.metrics.lock_service_up.set(up as i64);
    }

    /// Check that an answer of `cluster`'s history, to a request sent at
    /// `sent`, may be learnt, and hold the history while it is: `None` if
    /// it may not (of the history left behind). An answer of another
    /// history asked after the current one was adopted replaces it first.
    fn of_history(&self, cluster: Option<&str>, sent: Instant) -> Option<std::sync::MutexGuard<'_, History>> {
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let Some(theirs) = cluster else { return Some(h) };
        match h.cluster.as_deref() {
            Some(mine) if mine == theirs => return Some(h),
            Some(_) if h.since.is_some_and(|since| sent < since) => return None,
            Some(mine) => {
                let why = format!("the lock service answers as cluster {theirs}, not {mine}");
                self.start_over(&mut h, &why);
            }
            None => tracing::info!(cluster = theirs, "the lock service is cluster {theirs}"),
        }
        (h.cluster, h.since) = (Some(theirs.to_string()), Some(Instant::now()));
        Some(h)
    }

    /// Another history: drop what was known of every key (the floors stay,
    /// and refuse a key whose new tokens are below them), and learn no
    /// answer to a request sent before now.
    fn start_over(&self, h: &mut History, why: &str) {
        tracing::error!(
            "{why}: another history (a restore?); dropping what was known of every key and starting over \
             from its state (floors kept)"
        );
        self.metrics.history_changes.inc();
        self.timeline.record("", Happened::NewHistory { why: why.to_string() });
        self.keys.clear();
        self.compacted_below.store(0, Ordering::Relaxed);
        *self.freshness() = Freshness::default();
        h.since = Some(Instant::now());
        h.listed.clear();
    }

    /// The cluster id the knowledge is of, if known.
    fn cluster(&self) -> Option<String> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).cluster.clone()
    }

    /// The watch: nothing is held under `key` as of revision `through`.
    fn learn_absent(&self, key: &str, through: Token) {
        if let Some(mut k) = self.keys.get_mut(key) {
            let before = k.view();
            k.merge_absent(through);
            k.watched = true;
            self.timeline.learnt(key, before, k.view(), false);
        }
    }

    /// What the watch says of `key`. `ended_before` holds for a key not
    /// known yet: every grant of it up to there has ended.
    fn learn(&self, key: &str, token: Token, held: bool, ended_before: Token) {
        if token == 0 {
            // Never granted: nothing to remember (and nothing for a client
            // inventing paths to make the sidecar remember).
            return;
        }
        let mut k = self
            .keys
            .entry(key.to_string())
            .or_insert_with(|| Known { ended_through: ended_before, ..Known::default() });
        if token > k.latest {
            k.learnt_at = Some(Instant::now());
        }
        let before = k.view();
        k.merge(token, held);
        k.watched = true;
        self.timeline.learnt(key, before, k.view(), false);
    }

    /// What a linearizable read of `key`, sent at `sent`, said; `false` if
    /// it is of the history left behind (nothing learnt).
    fn learn_read(&self, key: &str, info: &wire::LockInfo, sent: Instant) -> bool {
        let Some(mut history) = self.of_history(info.cluster.as_deref(), sent) else { return false };
        self.learn_read_in(&mut history, key, info, sent);
        true
    }

    /// [`LockView::learn_read`] of the history `history` holds.
    fn learn_read_in(&self, history: &mut History, key: &str, info: &wire::LockInfo, sent: Instant) {
        // Within one history a key's latest grant never goes back. A read
        // sent after the latest was learnt that answers less (a lower holder,
        // or nothing up to a revision below it) is of another history under
        // the same name: an etcd snapshot restored with the same flags keeps
        // its cluster id while its revisions go back.
        let went_back = self.keys.get(key).is_some_and(|k| {
            let below = match info.compacted_below {
                Some(below) if info.token == 0 => below,
                _ => info.token,
            };
            (info.token != 0 || info.compacted_below.is_some())
                && below < k.latest
                && k.learnt_at.is_some_and(|at| sent > at)
        });
        if went_back {
            self.start_over(history, &format!("a read of {key} answered below its latest known grant"));
        }
        let mut k = match info.compacted_below {
            // Forgotten by the service: only what we knew can have ended.
            Some(below) if info.token == 0 => {
                self.compacted_below.fetch_max(below, Ordering::Relaxed);
                let Some(mut k) = self.keys.get_mut(key) else { return };
                let before = k.view();
                k.merge_absent(below);
                self.timeline.learnt(key, before, k.view(), false);
                k
            }
            _ if info.token == 0 => return,
            _ => {
                let mut k = self.keys.entry(key.to_string()).or_default();
                if info.token > k.latest {
                    k.learnt_at = Some(Instant::now());
                }
                let before = k.view();
                k.merge_read(info.token, info.held);
                self.timeline.learnt(key, before, k.view(), false);
                k
            }
        };
        k.read_at = k.read_at.max(Some(sent));
    }

    /// A complete state dump of the table at revision `rev` listed only
    /// `listed`: every other key granted by then has been forgotten, so its
    /// lease has ended. (One granted later, learnt by a read meanwhile, is
    /// not judged by the dump.)
    fn forgotten_unless(&self, listed: &std::collections::HashSet<String>, rev: u64) {
        for mut k in self.keys.iter_mut() {
            if k.latest <= rev && k.live && !listed.contains(k.key()) {
                let known = k.value_mut();
                (known.live, known.presumed_ended) = (false, true);
                self.timeline.learnt(k.key(), (k.latest, true), k.view(), true);
            }
        }
    }

    /// Read `key` linearizably with a read that started no earlier than
    /// `arrived`, sharing one with concurrent callers when possible: every
    /// grant of it up to the token returned has ended. What is known may
    /// learn an older answer after this one (a slower member, a watch
    /// behind it), which can make such a grant look live again; the caller
    /// ends it (`Knowledge::ended_through`).
    pub(crate) async fn read(self: &Arc<Self>, key: &str, arrived: Instant) -> Result<Token, String> {
        let mut rx = {
            let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
            match reads.get(key) {
                Some(r) if r.started >= arrived => r.done.clone(),
                _ => {
                    let (tx, rx) = watch::channel(None);
                    let started = Instant::now();
                    reads.insert(key.to_string(), InflightRead { started, done: rx.clone() });
                    // Finish the read even if this caller goes away, so the
                    // callers that joined it get their answer.
                    let (source, key, view) = (self.source.clone(), key.to_string(), Arc::downgrade(self));
                    tokio::spawn(async move {
                        let mut outcome = source.read(&key).await;
                        let Some(v) = view.upgrade() else { return };
                        if let Ok(info) = &outcome {
                            if !v.learn_read(&key, info, started) {
                                // Decided on it, a request would mix two histories.
                                outcome = Err("answered of the lock service's history left behind".into());
                            }
                        }
                        if let Err(e) = &outcome {
                            let mut failures = v.read_failures.lock().unwrap_or_else(|p| p.into_inner());
                            if let Some(more) = failures.hit(std::time::Instant::now()) {
                                tracing::warn!(key, "reading the lock service failed: {e}{more}");
                            }
                        }
                        {
                            // Only this read's entry: a newer one may have replaced it.
                            let mut reads = v.reads.lock().unwrap_or_else(|p| p.into_inner());
                            if reads.get(&key).is_some_and(|r| r.started == started) {
                                reads.remove(&key);
                            }
                        }
                        tx.send_replace(Some(outcome.map(|info| ended_through(&info))));
                    });
                    rx
                }
            }
        };
        let done = rx.wait_for(Option::is_some).await.map_err(|_| "read abandoned".to_string())?;
        done.clone().expect("waited for Some")
    }
}

/// etcd and ZooKeeper: one watch task per followed prefix: the ones of
/// prefixes no longer followed, or ended, are dropped; `start` one for each
/// followed prefix without.
fn watch_each(
    watches: &mut HashMap<String, tokio::task::JoinHandle<()>>,
    prefixes: &[String],
    start: impl Fn(String) -> tokio::task::JoinHandle<()>,
) {
    watches.retain(|p, w| {
        let keep = prefixes.contains(p) && !w.is_finished();
        if !keep {
            w.abort();
        }
        keep
    });
    for p in prefixes {
        watches.entry(p.clone()).or_insert_with(|| start(p.clone()));
    }
}

/// Every grant of the key up to this has ended, by `info`: those before
/// its holder's; or, free, its latest grant and everything up to
/// `compacted_below`.
fn ended_through(info: &wire::LockInfo) -> Token {
    match info.held {
        true => info.token.saturating_sub(1),
        false => info.token.max(info.compacted_below.unwrap_or(0)),
    }
}

/// A 409 to a watch: the node cannot vouch for `after`. If it is of
/// another history (a restore), that history replaces the knowledge's and
/// the stream starts over from the state; if of the same, the node is
/// behind: the next endpoint is tried.
async fn position_unknown(
    view: &LockView,
    resp: hyper::Response<hyper::body::Incoming>,
    after: &mut Option<u64>,
    sent: Instant,
) -> String {
    use http_body_util::BodyExt;
    let body = http_body_util::Limited::new(resp.into_body(), MAX_LINE).collect().await;
    let refusal = body.ok().and_then(|b| serde_json::from_slice::<wire::ApiError>(&b.to_bytes()).ok());
    let Some(at) = refusal.and_then(|r| r.position) else {
        return "the watch answered 409 without a position".into();
    };
    let before = view.cluster();
    if view.of_history(at.cluster.as_deref(), sent).is_some() && view.cluster() != before {
        *after = None;
        return format!("the lock service is another history now (cluster {:?}): starting over", at.cluster);
    }
    format!("the node is at revision {}, behind this stream's position {after:?}: trying another", at.rev)
}

/// Where the knowledge comes from.
#[derive(Clone)]
enum Source {
    /// fencegate's lock service: a watch stream, probes, reads.
    Fencegate(Client),
    /// etcd (`etcdctl lock`): reads.
    Etcd(Arc<Etcd>),
    /// ZooKeeper (kazoo's and Curator's locks): reads.
    ZooKeeper(Arc<ZooKeeper>),
}

impl Source {
    /// Who holds `key` now, read linearizably.
    async fn read(&self, key: &str) -> Result<wire::LockInfo, String> {
        match self {
            Source::Fencegate(client) => client.read(key).await.map_err(|e| e.to_string()),
            Source::Etcd(etcd) => etcd.read(key).await,
            Source::ZooKeeper(zk) => zk.read(key).await,
        }
    }

    /// etcd and ZooKeeper: whether the service has a leader now (some etcd
    /// member reports itself healthy; a ZooKeeper `sync` is answered).
    /// fencegate's is up while its watch stream is.
    async fn healthy(&self) -> Option<Result<(), String>> {
        match self {
            Source::Fencegate(_) => None,
            Source::Etcd(etcd) => Some(etcd.healthy().await),
            Source::ZooKeeper(zk) => Some(zk.healthy().await),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Source::Fencegate(_) => "fencegate",
            Source::Etcd(_) => "etcd",
            Source::ZooKeeper(_) => "ZooKeeper",
        }
    }
}

/// While the view lives, mark etcd or ZooKeeper up while it has a leader
/// (`Source::healthy`), asked every second.
async fn up_forever(view: std::sync::Weak<LockView>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = crate::log_limit::Window::new(crate::log_limit::EVERY);
    loop {
        tick.tick().await;
        let Some(source) = view.upgrade().map(|v| v.source.clone()) else { return };
        let Some(answer) = source.healthy().await else { return };
        let Some(v) = view.upgrade() else { return };
        v.set_up(answer.is_ok());
        if let Err(e) = answer {
            if let Some(more) = failures.hit(std::time::Instant::now()) {
                tracing::warn!("{}: {e}{more}", source.name());
            }
        }
    }
}

/// Keep one watch stream open, rotating through the endpoints, until the view
/// is dropped.
async fn watch_forever(view: std::sync::Weak<LockView>, endpoints: Vec<String>, http: HttpClient) {
    let mut after: Option<u64> = None;
    // Jittered, so that the sidecars of one failed node do not all reconnect
    // in the same instant; reset once a stream delivered something.
    let mut backoff =
        Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).with_floor(Duration::from_millis(20));
    // A lock service that stays down fails every attempt: one line per
    // interval, not one per attempt.
    let mut failures = crate::log_limit::Window::new(crate::log_limit::EVERY);
    // `progress=1` keeps the stream's position up with the revision (what
    // the probes' proof waits for); a node older than it answers 400, and
    // is watched without it (the proof then waits for its heartbeats).
    let mut progress = true;
    for endpoint in endpoints.iter().cycle() {
        let Some(v) = view.upgrade() else { return };
        let mut delivered = 0u64;
        match follow(&v, &http, endpoint, &mut after, &mut progress, &mut delivered).await {
            Ok(()) => tracing::info!(%endpoint, "watch stream ended; reconnecting"),
            Err(e) => {
                if let Some(more) = failures.hit(std::time::Instant::now()) {
                    tracing::warn!(%endpoint, "watch stream: {e}{more}");
                }
            }
        }
        v.set_up(false);
        drop(v);
        if delivered > 0 {
            // That stream worked: a fresh failure starts from short delays,
            // and is logged at once.
            backoff.reset();
            failures.reset();
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Prove the knowledge current, every third of `max_staleness`: read the
/// leader's revision (linearizably), noting when the probe was *sent*. Each
/// probe runs on its own, so that a slow one does not delay the next, with
/// the client's own deadlines and failover (a probe cut short would stay on
/// an endpoint that black-holes it); at most `PROBES` at once.
async fn probe_forever(view: std::sync::Weak<LockView>, client: Client) {
    const PROBES: usize = 4;
    let Some(v) = view.upgrade() else { return };
    let (every, max_staleness) = (v.max_staleness / 3, v.max_staleness);
    drop(v);
    // A probe that fails fails every third of `max_staleness`: one line per
    // interval, naming the cause (403: no `watch` right; 404: a node
    // without `GET /v1/revision`; TLS), not one per probe.
    let failures = Arc::new(Mutex::new(crate::log_limit::Window::new(crate::log_limit::EVERY)));
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(v) = view.upgrade() else { return };
        v.metrics.knowledge_age.set(v.age(Instant::now()).as_secs_f64());
        let probing = v.probing.load(Ordering::Relaxed);
        drop(v);
        if !probing {
            continue;
        }
        if in_flight.fetch_add(1, Ordering::AcqRel) >= PROBES {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (view, client, in_flight, failures) = (view.clone(), client.clone(), in_flight.clone(), failures.clone());
        tokio::spawn(async move {
            let sent = Instant::now();
            let answer = client.revision().await;
            in_flight.fetch_sub(1, Ordering::AcqRel);
            let Some(v) = view.upgrade() else { return };
            // Not cut short (the client's failover needs its own deadlines),
            // but an answer `max_staleness` or more after the send proves
            // nothing still usable: counted as a failure.
            let failed = match answer {
                Ok(r) if freshness::trusted(Some(sent), Instant::now(), max_staleness) => {
                    // Of the history left behind: proves nothing of this one.
                    let Some(_history) = v.of_history(r.cluster.as_deref(), sent) else { return };
                    v.freshness().answered(sent, r.rev);
                    return;
                }
                Ok(_) => format!("answered {:?} after it was sent", sent.elapsed()),
                Err(e) => e.to_string(),
            };
            v.metrics.freshness_probe_failures.inc();
            let more = failures.lock().unwrap_or_else(|p| p.into_inner()).hit(std::time::Instant::now());
            if let Some(more) = more {
                tracing::warn!("freshness probe (GET /v1/revision) failed: {failed}{more}");
            }
        });
    }
}

/// Follow one stream from `endpoint`, resuming after revision `after`;
/// `delivered` counts its lines.
async fn follow(
    view: &LockView,
    http: &HttpClient,
    endpoint: &str,
    after: &mut Option<u64>,
    progress: &mut bool,
    delivered: &mut u64,
) -> Result<(), String> {
    let mut url = format!("{endpoint}{}?prefix=", wire::WATCH_PATH);
    if let Some(rev) = after {
        url.push_str(&format!("&after={rev}"));
        // A position is one of this history's: a node of another refuses it.
        if let Some(cluster) = view.cluster() {
            url.push_str(&format!("&cluster={cluster}"));
        }
    }
    if *progress {
        url.push_str("&progress=1");
    }
    let connected = Instant::now();
    let resp = http.open(&url, Duration::from_secs(3)).await.map_err(|e| e.to_string())?;
    if resp.status() == hyper::StatusCode::BAD_REQUEST && *progress {
        *progress = false;
        return Err(format!("{url} answered 400 (a node without progress=1?); watching without it"));
    }
    if resp.status() == hyper::StatusCode::CONFLICT {
        return Err(position_unknown(view, resp, after, connected).await);
    }
    if !resp.status().is_success() {
        return Err(format!("{url} answered {}", resp.status()));
    }
    // The history this stream is of; checked again at every line, since
    // another answer may show a newer one meanwhile.
    let cluster = resp.headers().get(wire::CLUSTER_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
    if view.of_history(cluster.as_deref(), connected).is_none() {
        return Err(format!("{endpoint} is a node of the lock service's history left behind"));
    }
    let mut lines = LineReader::new(resp.into_body());
    // The keys of a state dump in progress, and the revision it reflects:
    // one comes first without `after`, and after a `resync` line.
    let mut dump = after.is_none().then(|| (std::collections::HashSet::new(), None));
    loop {
        let line = {
            // Not cancelled between ticks (a line half read stays read).
            let next = lines.next_line(MAX_LINE);
            tokio::pin!(next);
            let silent_until = Instant::now() + STREAM_SILENCE;
            loop {
                tokio::select! {
                    line = &mut next => break line.map_err(|e| e.to_string())?,
                    () = tokio::time::sleep(BEHIND_TICK) => {
                        let now = Instant::now();
                        if now >= silent_until {
                            return Err(format!("no line for {STREAM_SILENCE:?}"));
                        }
                        if let Some(why) = view.behind(now) {
                            return Err(why);
                        }
                    }
                }
            }
        };
        let Some(line) = line else { return Ok(()) };
        let l: WatchLine = serde_json::from_slice(&line).map_err(|e| format!("bad watch line: {e}"))?;
        let Some(_history) = view.of_history(cluster.as_deref(), connected) else {
            *after = None;
            return Err("the lock service's history changed under the stream: starting over".into());
        };
        match (&l, &mut dump) {
            (WatchLine::State { key, rev, .. }, Some((listed, at))) => {
                listed.insert(key.clone());
                *at = Some(*rev);
            }
            (WatchLine::Resync { .. }, _) => dump = Some(Default::default()),
            // The first line after a dump: the dump is complete. An empty
            // one reflects the table just before this line's event (or at
            // this heartbeat).
            (_, Some((listed, at))) => {
                let at = at.or(match l {
                    WatchLine::Heartbeat { rev } => Some(rev),
                    WatchLine::Granted { rev, .. }
                    | WatchLine::Released { rev, .. }
                    | WatchLine::Expired { rev, .. } => Some(rev.saturating_sub(1)),
                    _ => None,
                });
                if let Some(at) = at {
                    view.forgotten_unless(listed, at);
                    view.delivered(at);
                }
                dump = None;
            }
            _ => {}
        }
        // Resume only from a point the stream is complete up to: an event,
        // or a heartbeat (sent after everything before it). Not from a state
        // line: a stream cut in the middle of the state dump must resync.
        match l {
            WatchLine::State { key, token, held, .. } => view.learn(&key, token, held, 0),
            WatchLine::Granted { key, token, rev, .. } => {
                view.learn(&key, token, true, 0);
                *after = Some(rev);
                view.delivered(rev);
            }
            WatchLine::Released { key, token, rev } | WatchLine::Expired { key, token, rev } => {
                view.learn(&key, token, false, 0);
                *after = Some(rev);
                view.delivered(rev);
            }
            WatchLine::Heartbeat { rev } => {
                *after = Some(rev);
                view.delivered(rev);
            }
            WatchLine::Resync { .. } | WatchLine::Unknown => {}
        }
        *delivered += 1;
        view.set_up(true);
        // A node behind its leader may stream lines (heartbeats of its old
        // revision) that never reach what the probes answered.
        if let Some(why) = view.behind(Instant::now()) {
            return Err(why);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::AtomicUsize;

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;

    use super::*;

    /// A view of the stand-in node at `url`, proofs every 250 ms.
    fn watching(url: &str, metrics: SidecarMetrics, followed: Vec<String>) -> Arc<LockView> {
        LockView::start(
            Client::new(vec![url.to_string()]).unwrap(),
            metrics,
            Duration::from_millis(250),
            followed,
            Arc::default(),
        )
    }

    fn known(view: &LockView, key: &str) -> Knowledge {
        view.look(key, Instant::now()).0
    }

    fn trusted(view: &LockView, key: &str, now: Instant) -> bool {
        view.look(key, now).1
    }

    /// An answer older than a read, learnt after it: `key` held by `token`.
    pub(in crate::sidecar) fn learnt_late(view: &LockView, key: &str, token: Token) {
        view.learn(key, token, true, 0);
    }

    /// A stand-in lock service that answers key reads slowly and counts them.
    pub(in crate::sidecar) async fn slow_reads(reads: Arc<AtomicUsize>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let reads = reads.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                        let reads = reads.clone();
                        async move {
                            let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                            if req.uri().path() == "/v1/locks/rack/1" {
                                reads.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(150)).await;
                                let body =
                                    r#"{"key":"rack/1","held":true,"token":34,"holder":"b","expires_in_ms":1000}"#;
                                resp = hyper::Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                            } else {
                                *resp.status_mut() = hyper::StatusCode::NOT_FOUND;
                            }
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        url
    }

    /// A stand-in node of a build before `progress=1`: its watch answers
    /// 400 to the parameter, and without it streams one key's state and a
    /// heartbeat (then ends). Counts the watches opened with and without it.
    async fn a_node_without_progress(with: Arc<AtomicUsize>, without: Arc<AtomicUsize>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (with, without) = (with.clone(), without.clone());
                let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let watch = req.uri().path() == wire::WATCH_PATH;
                    let progress = req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "progress=1"));
                    let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                    match (watch, progress) {
                        (true, true) => {
                            with.fetch_add(1, Ordering::SeqCst);
                            *resp.status_mut() = hyper::StatusCode::BAD_REQUEST;
                        }
                        (true, false) => {
                            without.fetch_add(1, Ordering::SeqCst);
                            let body = concat!(
                                r#"{"event":"state","key":"rack/1","held":true,"token":34,"holder":"b","rev":40}"#,
                                "\n",
                                r#"{"event":"heartbeat","rev":40}"#,
                                "\n"
                            );
                            resp = hyper::Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        }
                        (false, _) => *resp.status_mut() = hyper::StatusCode::NOT_FOUND,
                    }
                    async move { Ok::<_, Infallible>(resp) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        url
    }

    /// A node that refuses `progress=1` (400) is watched without it from
    /// then on: asked once, and what it streams is learnt.
    #[tokio::test]
    async fn a_node_that_refuses_progress_is_watched_without_it() {
        let (with, without) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let url = a_node_without_progress(with.clone(), without.clone()).await;
        let metrics = SidecarMetrics::new(&prometheus::Registry::new()).unwrap();
        let view = watching(&url, metrics, vec!["rack/".into()]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while without.load(Ordering::SeqCst) < 2 {
            assert!(Instant::now() < deadline, "no watch without progress=1");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(with.load(Ordering::SeqCst), 1, "asked with progress=1 once, not at every reconnect");
        let k = known(&view, "rack/1");
        assert!(k.known && k.live && k.latest == 34, "{k:?}");
    }

    #[tokio::test]
    async fn concurrent_reads_share_one_round_started_after_they_arrived() {
        let count = Arc::new(AtomicUsize::new(0));
        let url = slow_reads(count.clone()).await;
        let metrics = SidecarMetrics::new(&prometheus::Registry::new()).unwrap();
        let view = watching(&url, metrics, vec!["rack/".into()]);
        let arrived = Instant::now();
        let readers: Vec<_> = (0..10)
            .map(|_| {
                let v = view.clone();
                tokio::spawn(async move { v.read("rack/1", arrived).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Arrives while that read is in flight: it must not join it (the
        // read started before it arrived), so a second read goes out.
        let v = view.clone();
        let late = tokio::spawn(async move { v.read("rack/1", Instant::now()).await });
        for r in readers {
            r.await.unwrap().unwrap();
        }
        late.await.unwrap().unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 2, "10 concurrent callers share one read; the late one gets its own");
        assert_eq!(known(&view, "rack/1"), Knowledge { latest: 34, live: true, known: true, ..Default::default() });
    }

    /// Keys a complete dump at revision 40 does not list were forgotten by
    /// the service: ended. One granted after the dump is not judged by it.
    #[tokio::test]
    async fn a_state_dump_ends_the_keys_it_no_longer_lists() {
        let metrics = SidecarMetrics::new(&prometheus::Registry::new()).unwrap();
        let url = slow_reads(Arc::default()).await;
        let view = watching(&url, metrics, vec!["rack/".into()]);
        for (key, token) in [("rack/gone", 30), ("rack/listed", 35), ("rack/later", 45)] {
            view.learn(key, token, true, 0);
        }
        let listed = ["rack/listed".to_string()].into_iter().collect();
        view.forgotten_unless(&listed, 40);
        assert!(!known(&view, "rack/gone").live && known(&view, "rack/gone").presumed_ended, "forgotten, so ended");
        assert!(known(&view, "rack/listed").live);
        assert!(known(&view, "rack/later").live, "granted after the dump");
        let info = |token, compacted_below| wire::LockInfo {
            key: "rack/listed".into(),
            held: false,
            token,
            holder: None,
            expires_in_ms: None,
            compacted_below,
            cluster: None,
        };
        view.learn_read("rack/listed", &info(0, Some(36)), Instant::now());
        assert!(!known(&view, "rack/listed").live, "read as forgotten: ended");
        assert_eq!(known(&view, "rack/other").compacted_below, 36);
        // A presumption is undone by a read that finds the lease live (a key
        // the sidecar may read but not watch), a read's end is final.
        let gone = wire::LockInfo { key: "rack/gone".into(), held: true, token: 30, ..info(30, None) };
        view.learn_read("rack/gone", &gone, Instant::now());
        assert!(known(&view, "rack/gone").live);
        view.learn("rack/gone", 30, true, 0);
        view.learn_read("rack/listed", &wire::LockInfo { held: true, ..info(35, None) }, Instant::now());
        assert!(!known(&view, "rack/listed").live, "an end a read saw stays");
    }

    /// A key the stream never told of (readable, not watchable) is trusted
    /// only until its read's send time plus `max_staleness`, however fresh
    /// the probes' proof; a key the stream told of, and one nobody knows,
    /// as long as the proof.
    #[tokio::test]
    async fn a_key_only_reads_told_of_is_trusted_no_longer_than_its_read() {
        let metrics = SidecarMetrics::new(&prometheus::Registry::new()).unwrap();
        let url = slow_reads(Arc::default()).await;
        let view = watching(&url, metrics, vec![]);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        view.freshness().answered(t0, 0);
        view.learn("rack/watched", 5, true, 0);
        let info = wire::LockInfo {
            key: "rack/read".into(),
            held: true,
            token: 7,
            holder: None,
            expires_in_ms: None,
            compacted_below: None,
            cluster: None,
        };
        view.learn_read("rack/read", &info, t0);
        assert!(trusted(&view, "rack/watched", t0 + ms(100)) && trusted(&view, "rack/read", t0 + ms(100)));
        view.freshness().answered(t0 + ms(300), 0);
        assert!(trusted(&view, "rack/watched", t0 + ms(400)));
        assert!(trusted(&view, "rack/unknown", t0 + ms(400)));
        assert!(!trusted(&view, "rack/read", t0 + ms(400)), "its read is 400 ms old");
        view.learn_read("rack/read", &info, t0 + ms(350));
        assert!(trusted(&view, "rack/read", t0 + ms(400)));
    }

    /// A read sent after a key's latest grant was learnt that answers less
    /// (a lower holder, or nothing up to below it) is another history with
    /// the same name (an etcd snapshot restored with the same flags): every
    /// key's knowledge is dropped, as for a new cluster id. A late answer to
    /// a read sent before is not.
    #[tokio::test]
    async fn a_read_below_what_is_known_is_another_history() {
        let metrics = SidecarMetrics::new(&prometheus::Registry::new()).unwrap();
        let url = slow_reads(Arc::default()).await;
        let view = watching(&url, metrics, vec![]);
        let info = |token, compacted_below| wire::LockInfo {
            key: "rack/1".into(),
            held: token != 0,
            token,
            holder: None,
            expires_in_ms: None,
            compacted_below,
            cluster: Some("c".into()),
        };
        let before = Instant::now();
        view.learn("rack/1", 34, true, 0);
        view.learn("rack/2", 50, true, 0);
        assert!(view.learn_read("rack/1", &info(20, None), before), "a late answer is learnt");
        assert_eq!((known(&view, "rack/1").latest, view.metrics.history_changes.get()), (34, 0));
        assert!(view.learn_read("rack/1", &info(20, None), Instant::now()));
        assert_eq!(view.metrics.history_changes.get(), 1, "a lower holder, read after");
        assert_eq!((known(&view, "rack/1").latest, known(&view, "rack/2").known), (20, false));
        view.learn("rack/2", 50, true, 0);
        assert!(view.learn_read("rack/2", &info(0, Some(40)), Instant::now()));
        assert_eq!(view.metrics.history_changes.get(), 2, "nothing up to 40, read after 50 was learnt");
        assert!(view.learn_read("rack/2", &info(0, Some(60)), Instant::now()));
        assert_eq!(view.metrics.history_changes.get(), 2, "ended up to 60: the same history");
    }

    #[test]
    fn a_forgotten_key_has_ended_up_to_the_watermark() {
        let mut k = Known::default();
        k.merge(34, true);
        k.merge_absent(30);
        assert!(k.live, "a watermark below the latest grant says nothing of it");
        k.merge_absent(40);
        assert_eq!((k.latest, k.live), (34, false));
    }

    #[test]
    fn knowledge_only_moves_forward() {
        let mut k = Known::default();
        k.merge(33, true);
        k.merge(34, true);
        k.merge(33, true);
        assert_eq!((k.latest, k.live), (34, true), "an older grant never lowers the latest");
        k.merge(34, false);
        k.merge(34, true);
        assert_eq!((k.latest, k.live), (34, false), "an ended lease never comes back to life");
        k.merge(35, true);
        assert_eq!((k.latest, k.live), (35, true));
    }

    /// etcd's list and watch lag one another: a grant that ended before a
    /// revision the lock had no key at stays ended when a source behind
    /// that revision tells of it afterwards, read or watch.
    #[test]
    fn a_grant_ended_through_a_revision_is_not_made_live_by_a_lagging_source() {
        let mut k = Known::default();
        k.merge(9, true);
        k.merge_absent(20);
        k.merge(12, true);
        assert_eq!((k.latest, k.live), (12, false), "created at 12, gone by 20");
        k.merge_read(12, true);
        assert!(!k.live);
        k.merge(21, true);
        assert_eq!((k.latest, k.live), (21, true), "a later grant is live");
    }
}
