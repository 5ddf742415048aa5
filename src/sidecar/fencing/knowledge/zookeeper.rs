//! Following ZooKeeper (`lock_service.kind: zookeeper`, docs/decisions/0010)
//! for `cached` routes: the proof, and the watches.
//!
//! - **The proof**: every third of `max_staleness`, a quorum `barrier`,
//!   then every lock under every followed prefix read (each one's
//!   children, its holder's czxid). Each read is answered after the
//!   barrier, so it shows at least every change acknowledged before
//!   `sent`: learnt as a read of each lock, it proves the knowledge
//!   current as of `sent`.
//! - **The watches**, one persistent recursive watch per prefix's parent
//!   znode, only make the knowledge newer between proofs: a change under a
//!   lock has that lock read again at once, so an old holder's writes are
//!   refused before the next proof. They prove nothing. A watch re-added
//!   after its session lost its server may have missed events
//!   (ZOOKEEPER-4698): every lock under its prefix is read again.
//!
//! Everything is read and learnt by one task, in order, on one session
//! (a new session is synced before use): a read learnt is never older
//! than one learnt before it, so a watch's read cannot undo a proof's.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Weak};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use zookeeper_client::{AddWatchMode, Client, EventType, SessionState};

use super::{LockView, Source};
use crate::log_limit::{Window, EVERY};
use crate::sidecar::fencing::freshness;
use crate::sidecar::fencing::zookeeper::contenders::{sequence, znode};
use crate::sidecar::fencing::zookeeper::{barrier, lock_info, Holder, ZooKeeper, READ};

/// How many locks one prefix may hold: past it, its proof fails and its
/// `cached` routes read per request (and the log says why).
const MAX_LOCKS: usize = 10_000;
/// Changes waiting to be read, at most: a watch that gets ahead of the
/// reads waits for them.
const BACKLOG: usize = 1024;

/// What a watch asks the follower to read again.
enum Touched {
    /// One lock (its key).
    Lock(String),
    /// Every lock under a prefix: its watch was (re)added.
    Prefix(String),
}

fn zookeeper_of(view: &Weak<LockView>) -> Option<Arc<ZooKeeper>> {
    match &view.upgrade()?.source {
        Source::ZooKeeper(zk) => Some(zk.clone()),
        Source::Fencegate(_) | Source::Etcd(_) => None,
    }
}

/// While the view lives: a watch per followed prefix, the proof every third
/// of `max_staleness`, and each lock a watch says changed read again.
pub(super) async fn follow_forever(view: Weak<LockView>) {
    let Some(max_staleness) = view.upgrade().map(|v| v.max_staleness) else { return };
    let mut tick = tokio::time::interval(max_staleness / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (touched, mut changes) = mpsc::channel(BACKLOG);
    let mut watches: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut failures = Window::new(EVERY);
    loop {
        let change = {
            let Some(v) = view.upgrade() else { break };
            tokio::select! {
                _ = tick.tick() => None,
                () = v.refollow.notified() => None,
                Some(change) = changes.recv() => Some(change),
            }
        };
        let (Some(v), Some(zk)) = (view.upgrade(), zookeeper_of(&view)) else { break };
        let prefixes = v.followed();
        if let Some(change) = change {
            // Bounded, as the proof: a session that hangs must not stop them.
            if let Err(e) = within(read_again(&v, &zk, change, &prefixes)).await {
                log(&mut failures, &e);
            }
            continue;
        }
        v.metrics.knowledge_age.set(v.age(Instant::now()).as_secs_f64());
        super::watch_each(&mut watches, &prefixes, |p| tokio::spawn(watch_forever(view.clone(), p, touched.clone())));
        if prefixes.is_empty() {
            continue;
        }
        if let Err(e) = within(prove_current(&v, &zk, &prefixes)).await {
            v.metrics.freshness_probe_failures.inc();
            log(&mut failures, &format!("proving what is known of ZooKeeper's locks current failed: {e}"));
        }
    }
    watches.drain().for_each(|(_, w)| w.abort());
}

fn log(failures: &mut Window, e: &str) {
    if let Some(more) = failures.hit(std::time::Instant::now()) {
        tracing::warn!("ZooKeeper: {e}{more}");
    }
}

/// `work`, given up after `READ` (with `max_staleness` at most 10 s, an
/// answer later than that proves nothing a route may still use).
async fn within<T>(work: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(READ, work).await.map_err(|_| format!("no answer within {READ:?}"))?
}

/// What a watch told of: the lock it named, or every lock under a prefix
/// still followed, read and learnt as newer knowledge (no proof).
async fn read_again(v: &LockView, zk: &ZooKeeper, change: Touched, prefixes: &[String]) -> Result<(), String> {
    let locks = match change {
        Touched::Lock(lock) => vec![lock],
        Touched::Prefix(p) if prefixes.contains(&p) => list(v, zk, &p).await?,
        Touched::Prefix(_) => vec![],
    };
    for (lock, holder) in read_all(zk, &locks).await? {
        v.learn_watched(&lock, holder);
    }
    Ok(())
}

/// The proof: a `barrier`, then every lock under `prefixes` read and learnt
/// as reads sent at `sent`, if all of it was answered within
/// `max_staleness`.
async fn prove_current(v: &LockView, zk: &ZooKeeper, prefixes: &[String]) -> Result<(), String> {
    let sent = Instant::now();
    let client = zk.client().await?;
    barrier(&client).await?;
    let mut locks = BTreeSet::new();
    for p in prefixes {
        locks.extend(list(v, zk, p).await?);
    }
    let read = read_all(zk, &locks.into_iter().collect::<Vec<_>>()).await?;
    if !freshness::trusted(Some(sent), Instant::now(), v.max_staleness) {
        return Err(format!("answered {:?} after it was sent", sent.elapsed()));
    }
    // A proof of these prefixes only, none of the ones a reload set
    // meanwhile (`set_followed` holds the same lock).
    let followed = v.followed.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut history) = v.of_history(None, sent) else { return Ok(()) };
    for (lock, holder) in &read {
        v.learn_read_in(&mut history, lock, &lock_info(lock, *holder), sent);
    }
    drop(history);
    if *followed == prefixes {
        v.freshness().answered(sent, 0);
    }
    Ok(())
}

/// The locks under `prefix` (lock keys): the children of its parent znode
/// whose names start with the rest of it and are no contenders (a
/// sequence number ends those), the parent itself when nothing follows
/// its `/` (`rack/` is `rack/{rack}`'s prefix, and `locks/db/` that of the
/// one lock `locks/db`), and every lock known under it.
async fn list(v: &LockView, zk: &ZooKeeper, prefix: &str) -> Result<Vec<String>, String> {
    let mut locks: BTreeSet<String> = v.keys.iter().map(|k| k.key().clone()).filter(|k| under(k, prefix)).collect();
    let (parent, start) = parent_of(prefix)?;
    if start.is_empty() {
        locks.insert(parent.to_string());
    }
    let client = zk.client().await?;
    let children = match client.list_children(&znode(parent)).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => vec![],
        Err(e) => return Err(format!("children of {}: {e}", znode(parent))),
    };
    if children.len() > MAX_LOCKS {
        return Err(format!("more than {MAX_LOCKS} znodes under {prefix:?}: too many to follow"));
    }
    let named = |c: &String| c.starts_with(start) && sequence(c).is_none();
    locks.extend(children.iter().filter(|c| named(c)).map(|c| format!("{parent}/{c}")));
    Ok(locks.into_iter().collect())
}

/// The key of the znode `prefix`'s locks are children of (the one a watch
/// follows), and the text their names start with.
fn parent_of(prefix: &str) -> Result<(&str, &str), String> {
    prefix
        .rsplit_once('/')
        .filter(|(parent, _)| !parent.is_empty())
        .ok_or_else(|| format!("{prefix:?} has no parent znode"))
}

/// Who holds each of `locks`, asked together on the session.
async fn read_all(zk: &ZooKeeper, locks: &[String]) -> Result<Vec<(String, Holder)>, String> {
    let client = zk.client().await?;
    let reads =
        locks.iter().map(|lock| async { Ok::<_, String>((lock.clone(), zk.holder(&client, &znode(lock)).await?)) });
    futures_util::future::try_join_all(reads).await
}

/// Whether lock `key` is under `prefix` (a watch of its parent znode sees
/// its changes): `key/` starts with it.
fn under(key: &str, prefix: &str) -> bool {
    format!("{key}/").starts_with(prefix)
}

/// The lock a change of znode `path` under `prefix` concerns: the lock its
/// parent is, for a contender (a name ending in a sequence number); else
/// the znode itself.
fn lock_of(path: &str, prefix: &str) -> Option<String> {
    let key = path.strip_prefix('/')?;
    let lock = match key.rsplit_once('/') {
        Some((lock, name)) if sequence(name).is_some() => lock,
        _ => key,
    };
    under(lock, prefix).then(|| lock.to_string())
}

impl LockView {
    /// What a read a watch asked for showed: newer than what is known,
    /// proving nothing.
    fn learn_watched(&self, lock: &str, holder: Holder) {
        match holder {
            // Every grant before this holder's has ended: its contender
            // was created after theirs, and theirs are gone.
            Holder::Held(token) => self.learn(lock, token, true, token.saturating_sub(1)),
            Holder::Free(through) => self.learn_absent(lock, through),
        }
    }
}

/// Keep a watch of `prefix`'s parent znode until the view is dropped (or
/// the prefix no longer followed: `follow_forever` aborts this task),
/// telling the follower which lock each change concerns.
async fn watch_forever(view: Weak<LockView>, prefix: String, touched: mpsc::Sender<Touched>) {
    let mut backoff = fencegate_client::backoff::Backoff::new(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(2),
    )
    .with_floor(std::time::Duration::from_millis(20));
    let mut failures = Window::new(EVERY);
    loop {
        let Some(zk) = zookeeper_of(&view) else { return };
        let mut changes = 0u64;
        if let Err(e) = watch(&zk, &prefix, &touched, &mut changes).await {
            if let Some(more) = failures.hit(std::time::Instant::now()) {
                tracing::warn!(prefix, "ZooKeeper watch: {e}{more}");
            }
        }
        if changes > 0 {
            backoff.reset();
            failures.reset();
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Add a persistent recursive watch of `prefix`'s parent znode, have every
/// lock under it read, then tell of each change, until its session ends.
async fn watch(zk: &ZooKeeper, prefix: &str, touched: &mpsc::Sender<Touched>, changes: &mut u64) -> Result<(), String> {
    let gone = || "the sidecar is stopping".to_string();
    let parent = znode(parent_of(prefix)?.0);
    let client: Client = zk.client().await?;
    let mut watcher = client.watch(&parent, AddWatchMode::PersistentRecursive).await.map_err(|e| e.to_string())?;
    touched.send(Touched::Prefix(prefix.to_string())).await.map_err(|_| gone())?;
    loop {
        let event = watcher.changed().await;
        match event.event_type {
            EventType::Session => match event.session_state {
                SessionState::SyncConnected => {
                    // Back on a server: what happened meanwhile may not
                    // have been told (ZOOKEEPER-4698).
                    touched.send(Touched::Prefix(prefix.to_string())).await.map_err(|_| gone())?;
                }
                SessionState::Disconnected | SessionState::ConnectedReadOnly => {}
                ended => return Err(format!("the session ended ({ended:?})")),
            },
            _ => {
                if let Some(lock) = lock_of(&event.path, prefix) {
                    touched.send(Touched::Lock(lock)).await.map_err(|_| gone())?;
                    *changes += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_concerns_the_lock_it_is_under() {
        let p = "locks/rack-";
        assert_eq!(lock_of("/locks/rack-42/x__lock__0000000003", p).as_deref(), Some("locks/rack-42"));
        assert_eq!(lock_of("/locks/rack-42", p).as_deref(), Some("locks/rack-42"));
        assert_eq!(lock_of("/locks/db", p), None);
        assert_eq!(lock_of("/locks", p), None);
        // `rack/{rack}`'s prefix: the locks are /rack's children.
        let p = "rack/";
        assert_eq!(lock_of("/rack/s0", p).as_deref(), Some("rack/s0"));
        assert_eq!(lock_of("/rack/s0/_c_1-lock-0000000001", p).as_deref(), Some("rack/s0"));
        // `locks/db`'s: the lock is the parent itself.
        let one = "locks/db/";
        assert_eq!(lock_of("/locks/db/_c_1-lock-0000000001", one).as_deref(), Some("locks/db"));
        assert_eq!(lock_of("/locks/db", one).as_deref(), Some("locks/db"));
        assert_eq!(lock_of("/locks/dbx", one), None);
        assert_eq!(parent_of("rack/"), Ok(("rack", "")));
        assert_eq!(parent_of("locks/rack-"), Ok(("locks", "rack-")));
        assert!(parent_of("rack-").is_err() && parent_of("/x").is_err());
    }
}
