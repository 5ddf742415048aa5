//! The idempotency records this sidecar keeps: all of them in memory
//! (bounded by `limits.idempotency_store`), and each made durable in the
//! state store before the request it covers is forwarded (I1). Records
//! expire `retention` after their first request; a full store refuses new
//! keys (503) rather than evicting live ones, and so does a lock key whose
//! records hold its route's `per_lock_key` (429), so that one holder cannot
//! fill the store for every other key.
//!
//! Every change is queued for the disk while the index lock is held, so the
//! disk sees the changes to a key in the order the index made them (a
//! forget never lands after the newer record that replaced it).
//!
//! A pending record holds room for its answer. Expiry is lazy, plus a sweep
//! of at most 500 records per hold of the lock; `resolve` is an operator's
//! settling of an unknown outcome. A journal rewrite's snapshot is taken
//! under the lock as pointers and encoded by the writer thread.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::sidecar::idempotency::sharded::Sharded;
use crate::sidecar::idempotency::{judge, lock_key_of, Record, State, Verdict};
use crate::sidecar::state::{Store, StoreError, When, Write};

/// The journal is written anew once it is over four times what is live
/// plus this.
const REWRITE_SLACK: u64 = 64 << 20;

/// Most records expired in one hold of the index lock: a busy retention
/// expires tens of thousands every sweep (one every five seconds), and
/// every keyed request waits while the lock is held (99,000 at once held it
/// 127 ms; ~1.3 µs a record).
const EXPIRE_AT_ONCE: usize = 500;

/// How long an unreadable record is kept (the longest `retention` allowed).
const MAX_RETENTION_MS: u64 = 30 * 24 * 3600 * 1000;

pub struct Records {
    index: Mutex<Index>,
    store: Arc<Store>,
    max_bytes: u64,
    /// `REWRITE_SLACK` (smaller in tests).
    rewrite_slack: u64,
}

#[derive(Default)]
struct Index {
    /// Sharded, and behind pointers: growing the map rehashes a 256th of it
    /// and moves pointers, not records (a stall under the lock otherwise,
    /// with hundreds of thousands of them), and a snapshot for the journal
    /// copies pointers under the lock, leaving the encoding to the writer.
    records: Sharded<Arc<Record>>,
    /// (expiry, scope) of every record: the sweep takes only what is due,
    /// instead of scanning every record under the lock.
    by_expiry: BTreeSet<(u64, String)>,
    bytes: u64,
    /// The bytes of each lock key's records (its quota's count); a lock
    /// key with none has no entry.
    by_lock_key: HashMap<String, u64>,
}

impl Index {
    fn put(&mut self, scope: &str, record: Record) {
        self.bytes += record.size(scope);
        self.count(scope, record.size(scope), 0);
        let expires = record.expires_ms;
        // A record settled in place: no new key string for the map (every
        // keyed write puts its scope twice, pending and done); the expiry
        // set's entry moves only if the expiry did.
        let old = match self.records.get_mut(scope) {
            Some(slot) => std::mem::replace(slot, Arc::new(record)),
            None => {
                self.records.insert(scope.to_string(), Arc::new(record));
                self.by_expiry.insert((expires, scope.to_string()));
                return;
            }
        };
        self.bytes -= old.size(scope);
        self.count(scope, 0, old.size(scope));
        if old.expires_ms != expires {
            self.by_expiry.remove(&(old.expires_ms, scope.to_string()));
            self.by_expiry.insert((expires, scope.to_string()));
        }
    }

    fn remove(&mut self, scope: &str) -> Option<Record> {
        let old = self.records.remove(scope)?;
        self.bytes -= old.size(scope);
        self.count(scope, 0, old.size(scope));
        self.by_expiry.remove(&(old.expires_ms, scope.to_string()));
        Some(Arc::unwrap_or_clone(old))
    }

    /// `added` bytes more and `removed` fewer under `scope`'s lock key. A
    /// new string only for a lock key that had no records.
    fn count(&mut self, scope: &str, added: u64, removed: u64) {
        let lock_key = lock_key_of(scope);
        match self.by_lock_key.get_mut(lock_key) {
            Some(n) => {
                *n = *n + added - removed;
                if *n == 0 {
                    self.by_lock_key.remove(lock_key);
                }
            }
            None if added > 0 => {
                self.by_lock_key.insert(lock_key.to_string(), added - removed);
            }
            None => {}
        }
    }

    /// The bytes `scope`'s lock key's records hold.
    fn of_lock_key(&self, scope: &str) -> u64 {
        self.by_lock_key.get(lock_key_of(scope)).copied().unwrap_or(0)
    }

    /// The scopes of up to `most` records due by `now_ms`, but those still
    /// in flight.
    fn due(&self, now_ms: u64, most: usize) -> Vec<String> {
        let due = self.by_expiry.iter().take_while(|(at, _)| *at <= now_ms);
        due.filter(|(_, s)| self.records.get(s).is_some_and(|r| r.state != State::Pending))
            .map(|(_, s)| s.clone())
            .take(most)
            .collect()
    }
}

/// Why a key could not be taken.
#[derive(Debug)]
pub enum BeginError {
    /// Taking it would pass `limits.idempotency_store`.
    Full {
        limit: u64,
    },
    /// Taking it would pass its lock key's quota (`per_lock_key`).
    Quota {
        limit: u64,
    },
    Store(StoreError),
}

/// Why an operator's resolution was not applied.
#[derive(Debug, PartialEq, Eq)]
pub enum ResolveError {
    NoSuchKey,
    /// Only an unknown outcome is the operator's to resolve.
    NotUnknown(&'static str),
    Store(String),
}

impl Records {
    /// The records `store` held. One left pending was in flight when the
    /// sidecar stopped: its outcome is unknown. One that cannot be read is
    /// unknown for any request under its key.
    pub fn load(store: Arc<Store>, loaded: Vec<(String, Vec<u8>)>, max_bytes: u64, now_ms: u64) -> Records {
        let mut index = Index::default();
        for (scope, bytes) in loaded {
            match Record::decode(&bytes) {
                Ok(mut r) => {
                    if r.state == State::Pending {
                        r.state = State::Unknown { why: "the sidecar stopped while the request was in flight".into() };
                    }
                    index.put(&scope, r);
                }
                Err(e) => {
                    tracing::error!(scope = %scope.replace('\n', " "), "unreadable idempotency record, kept as unknown: {e}");
                    let why = format!("its record could not be read back ({e})");
                    index.put(&scope, Record::unreadable(why, now_ms, MAX_RETENTION_MS));
                }
            }
        }
        Records { index: Mutex::new(index), store, max_bytes, rewrite_slack: REWRITE_SLACK }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.index().records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index().records.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.index().bytes
    }

    pub fn get(&self, scope: &str) -> Option<Record> {
        self.index().records.get(scope).map(|r| (**r).clone())
    }

    /// At most `limit` records still pending or whose outcome is unknown,
    /// with their scopes: looked for one shard at a time, so that a keyed
    /// request waits at most for a 256th of the search.
    pub fn open(&self, limit: usize) -> Vec<(String, Record)> {
        let mut found = Vec::new();
        for shard in 0..super::sharded::SHARDS {
            let index = self.index();
            let open = index.records.shard_entries(shard).filter(|(_, r)| r.state.is_open());
            found.extend(open.take(limit - found.len()).map(|(scope, r)| (scope.clone(), (**r).clone())));
            if found.len() == limit {
                break;
            }
        }
        found
    }

    /// Judge a request under `scope`; if it is to be forwarded, its pending
    /// `record` is on disk when this returns `Ok(Verdict::Forward)`. Two
    /// requests under one scope are judged one after the other: the second
    /// finds the first's pending record. A new record is refused if it
    /// would take its lock key's records past `quota` bytes, or the store
    /// past its bound.
    pub async fn begin(&self, scope: &str, record: Record, quota: u64) -> Result<Verdict, BeginError> {
        let on_disk = {
            let mut index = self.index();
            // Past its retention a record is gone, whether swept yet or not.
            let existing = index.records.get(scope).map(|r| &**r);
            let live = existing.filter(|r| r.expires_ms > record.created_ms || r.state == State::Pending);
            let verdict = judge(live, &record.fingerprint);
            if verdict != Verdict::Forward {
                return Ok(verdict);
            }
            let replaced = existing.map_or(0, |r| r.size(scope));
            // The store first: full, it is full for every key.
            if index.bytes - replaced + record.size(scope) > self.max_bytes {
                return Err(BeginError::Full { limit: self.max_bytes });
            }
            if index.of_lock_key(scope) - replaced + record.size(scope) > quota {
                return Err(BeginError::Quota { limit: quota });
            }
            let bytes = record.encode();
            index.put(scope, record);
            self.store.queue(Write::Record(scope.to_string(), bytes), When::Now)
        };
        if let Err(e) = on_disk.await {
            // Not on disk, so not forwarded: a retry may try again (while it
            // is pending nothing else changes this key).
            let mut index = self.index();
            index.remove(scope);
            // Not waited for: the pending record may be on disk, or not.
            drop(self.store.queue(Write::Forget(vec![scope.to_string()]), When::Soon));
            return Err(BeginError::Store(e));
        }
        Ok(Verdict::Forward)
    }

    /// The forwarded request's end: `state` (done or unknown), and the
    /// answer's body if it is kept. The record lasts at least until
    /// `expires_ms` (an unknown outcome is kept a whole retention from when
    /// it became unknown). The index has it at once; the returned wait is
    /// for the disk, which I1 does not need: a settle lost in a crash
    /// leaves the pending record, an unknown outcome after the restart.
    pub fn settle(
        &self,
        scope: &str,
        state: State,
        body: Bytes,
        expires_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> {
        use futures_util::future::Either;
        let mut index = self.index();
        let Some(old) = index.records.get(scope) else { return Either::Left(std::future::ready(Ok(()))) };
        {
            let held = old.size(scope);
            let mut r =
                Record { state, body, reserve: 0, expires_ms: old.expires_ms.max(expires_ms), ..(**old).clone() };
            // Past what the pending record held (headers beyond the
            // reserve) and with no room left: kept without the answer.
            if r.size(scope) > held && index.bytes - held + r.size(scope) > self.max_bytes {
                if let State::Done { status, .. } = r.state {
                    r.state = State::Done { status, headers: Vec::new(), kept: false };
                    r.body = Bytes::new();
                }
            }
            let bytes = r.encode();
            index.put(scope, r);
            Either::Right(self.store.queue(Write::Record(scope.to_string(), bytes), When::Soon))
        }
    }

    /// Drop a pending record whose request never left the sidecar.
    pub async fn forget(&self, scope: &str) -> Result<(), StoreError> {
        let on_disk = {
            let mut index = self.index();
            index.remove(scope);
            self.store.queue(Write::Forget(vec![scope.to_string()]), When::Now)
        };
        on_disk.await
    }

    /// Drop every record past its expiry (not one still in flight); how many.
    /// Then, if the journal has grown well past what is live, have it
    /// written anew from the live records.
    pub async fn expire(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut n = 0;
        loop {
            let (expired, on_disk) = {
                let mut index = self.index();
                let due = index.due(now_ms, EXPIRE_AT_ONCE);
                for s in &due {
                    index.remove(s);
                }
                let expired = due.len();
                (expired, (expired > 0).then(|| self.store.queue(Write::Forget(due), When::Soon)))
            };
            n += expired;
            // Waiting for the disk between holds paces the sweep, and lets
            // the requests waiting for the lock in.
            if let Some(w) = on_disk {
                w.await?;
            }
            if expired < EXPIRE_AT_ONCE {
                break;
            }
        }
        let rewrite = {
            let index = self.index();
            let grown = self.store.journal_bytes() > 4 * index.bytes + self.rewrite_slack;
            // Queued under the lock: the snapshot and the queue agree. The
            // records are encoded by the writer, not under the lock.
            grown.then(|| {
                let live = index.records.iter().map(|(s, r)| (s.clone(), r.clone())).collect();
                self.store.queue(Write::Rewrite(Arc::new(live)), When::Now)
            })
        };
        if let Some(w) = rewrite {
            w.await?;
        }
        Ok(n)
    }

    /// An operator's word on an unknown outcome: `Some(status)`, it was
    /// applied (a retry gets `status` with an empty body); `None`, it was
    /// not (the record goes, and the next request with the key is
    /// forwarded).
    pub async fn resolve(&self, scope: &str, applied: Option<u16>) -> Result<Record, ResolveError> {
        let (record, on_disk) = {
            let mut index = self.index();
            let Some(r) = index.records.get(scope) else { return Err(ResolveError::NoSuchKey) };
            if !matches!(r.state, State::Unknown { .. }) {
                return Err(ResolveError::NotUnknown(r.state.name()));
            }
            match applied {
                None => {
                    let r = index.remove(scope).expect("present");
                    (r, self.store.queue(Write::Forget(vec![scope.to_string()]), When::Now))
                }
                Some(status) => {
                    let mut r = (**r).clone();
                    r.state = State::Done { status, headers: Vec::new(), kept: true };
                    r.body = Bytes::new();
                    let bytes = r.encode();
                    index.put(scope, r.clone());
                    (r, self.store.queue(Write::Record(scope.to_string(), bytes), When::Now))
                }
            }
        };
        on_disk.await.map_err(|e| ResolveError::Store(e.to_string()))?;
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No quota: the tests of the store's own bound.
    const ANY: u64 = u64::MAX;

    fn pending(fingerprint: &str, expires_ms: u64) -> Record {
        Record {
            route: "r".into(),
            fingerprint: fingerprint.into(),
            token: 5,
            created_ms: 0,
            expires_ms,
            state: State::Pending,
            body: Bytes::new(),
            reserve: 0,
        }
    }

    fn open(dir: &std::path::Path, max_bytes: u64) -> Records {
        let (store, loaded) = Store::open(dir).unwrap();
        Records::load(Arc::new(store), loaded.records, max_bytes, 0)
    }

    #[tokio::test]
    async fn a_key_is_forwarded_once_then_replayed_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let r = open(dir.path(), 1 << 20);
            assert_eq!(r.begin("rack/1\n5\nk", pending("f", 100), ANY).await.unwrap(), Verdict::Forward);
            assert_eq!(r.begin("rack/1\n5\nk", pending("f", 100), ANY).await.unwrap(), Verdict::InFlight);
            assert_eq!(r.begin("rack/1\n5\nk", pending("g", 100), ANY).await.unwrap(), Verdict::Mismatch);
            let done = State::Done { status: 201, headers: vec![("x-a".into(), b"1".to_vec())], kept: true };
            r.settle("rack/1\n5\nk", done, Bytes::from_static(b"made"), 0).await.unwrap();
            assert_eq!(r.begin("rack/1\n5\nj", pending("f", 100), ANY).await.unwrap(), Verdict::Forward);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let r = open(dir.path(), 1 << 20);
        match r.begin("rack/1\n5\nk", pending("f", 100), ANY).await.unwrap() {
            Verdict::Replay(rec) => assert_eq!((&rec.body[..], rec.token), (&b"made"[..], 5)),
            v => panic!("{v:?}"),
        }
        // Left pending by the process that stopped: unknown, never forwarded again.
        assert!(matches!(r.begin("rack/1\n5\nj", pending("f", 100), ANY).await.unwrap(), Verdict::Unknown(_)));
        // Until an operator says it was not applied.
        assert_eq!(r.resolve("rack/1\n5\nk", None).await.unwrap_err(), ResolveError::NotUnknown("done"));
        r.resolve("rack/1\n5\nj", None).await.unwrap();
        assert_eq!(r.begin("rack/1\n5\nj", pending("f", 100), ANY).await.unwrap(), Verdict::Forward);
    }

    /// A forget racing a new request under the same key: whatever the
    /// order, a request told to go ahead has its record on disk (the
    /// forget is never written after it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forget_never_lands_after_the_record_that_replaced_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut forwarded = vec![];
        {
            let r = Arc::new(open(dir.path(), 1 << 30));
            for i in 0..300 {
                let scope = format!("rack/1\n5\nk{i}");
                assert_eq!(r.begin(&scope, pending("a", u64::MAX), ANY).await.unwrap(), Verdict::Forward);
                let (r1, s1) = (r.clone(), scope.clone());
                let forget = tokio::spawn(async move { r1.forget(&s1).await.unwrap() });
                let (r2, s2) = (r.clone(), scope.clone());
                let retry = tokio::spawn(async move {
                    loop {
                        match r2.begin(&s2, pending("a", u64::MAX), ANY).await.unwrap() {
                            Verdict::InFlight => tokio::task::yield_now().await,
                            v => return v,
                        }
                    }
                });
                forget.await.unwrap();
                if retry.await.unwrap() == Verdict::Forward {
                    forwarded.push(scope);
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let r = open(dir.path(), 1 << 30);
        assert_eq!(forwarded.len(), 300, "every retry went ahead once the first was forgotten");
        let lost: Vec<_> = forwarded.iter().filter(|s| r.get(s).is_none()).collect();
        assert!(lost.is_empty(), "forwarded with no record on disk: {lost:?}");
    }

    /// A journal grown well past what is live is written anew with just the
    /// live records.
    #[tokio::test]
    async fn a_grown_journal_is_written_anew_with_the_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("idempotency.log");
        {
            let mut r = open(dir.path(), 1 << 20);
            r.rewrite_slack = 0;
            for i in 0..20 {
                assert_eq!(
                    r.begin(&format!("rack/1\n5\nk{i}"), pending("f", u64::MAX), ANY).await.unwrap(),
                    Verdict::Forward
                );
            }
            for i in 1..20 {
                r.forget(&format!("rack/1\n5\nk{i}")).await.unwrap();
            }
            // Where its entries end, not the file's length (zeros ahead).
            let grown = r.store.journal_bytes();
            r.expire(0).await.unwrap();
            let rewritten = r.store.journal_bytes();
            assert!(rewritten * 10 < grown, "{grown} bytes, then {rewritten}");
            assert_eq!(std::fs::metadata(&journal).unwrap().len(), rewritten, "the file written anew is its entries");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let r = open(dir.path(), 1 << 20);
        assert_eq!(r.len(), 1);
        assert!(r.get("rack/1\n5\nk0").is_some());
    }

    /// Records a build kept in floors.redb are moved into the journal.
    #[tokio::test]
    async fn records_kept_in_redb_by_an_older_build_are_moved_into_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = pending("f", u64::MAX);
        rec.state = State::Unknown { why: "cut".into() };
        {
            let db = redb::Database::create(dir.path().join("floors.redb")).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let def: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("idempotency");
                let mut t = txn.open_table(def).unwrap();
                t.insert("rack/1\nold", rec.encode().as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        {
            let r = open(dir.path(), 1 << 20);
            assert!(matches!(
                r.begin("rack/1\n5\nold", pending("f", u64::MAX), ANY).await.unwrap(),
                Verdict::Unknown(_)
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let r = open(dir.path(), 1 << 20);
        assert!(r.get("rack/1\n5\nold").is_some(), "kept in the journal");
    }

    /// What cannot be read back stands as an unknown outcome for its key.
    #[tokio::test]
    async fn an_unreadable_record_is_an_unknown_outcome() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, _) = Store::open(dir.path()).unwrap();
            store.write(Write::Record("rack/1\n5\nk".into(), b"\x05\0\0\0{bad}".to_vec())).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let r = open(dir.path(), 1 << 20);
        assert!(matches!(r.begin("rack/1\n5\nk", pending("f", 100), ANY).await.unwrap(), Verdict::Unknown(_)));
    }

    /// A pending record holds room for its answer, so answers cannot grow
    /// the store past its bound; one that would is kept without its body.
    #[tokio::test]
    async fn pending_records_hold_room_for_their_answers() {
        let dir = tempfile::tempdir().unwrap();
        let mut big = pending("f", 100);
        big.reserve = 1000;
        let r = open(dir.path(), big.size("rack/1\n5\nk0") + 500);
        assert_eq!(r.begin("rack/1\n5\nk0", big.clone(), ANY).await.unwrap(), Verdict::Forward);
        assert!(matches!(r.begin("rack/1\n5\nk1", big.clone(), ANY).await, Err(BeginError::Full { .. })), "held");
        let huge = vec![("x-big".to_string(), vec![b'h'; 4000])];
        r.settle("rack/1\n5\nk0", State::Done { status: 200, headers: huge, kept: true }, Bytes::new(), 0)
            .await
            .unwrap();
        let kept = r.get("rack/1\n5\nk0").unwrap();
        assert_eq!(kept.state, State::Done { status: 200, headers: vec![], kept: false });
        assert!(r.bytes() <= big.size("rack/1\n5\nk0") + 500);
    }

    #[tokio::test]
    async fn records_expire_and_a_full_store_refuses_new_keys() {
        let dir = tempfile::tempdir().unwrap();
        let one = pending("f", 100).size("rack/1\n5\nk0");
        let r = open(dir.path(), one * 3);
        for i in 0..3 {
            assert_eq!(r.begin(&format!("rack/1\n5\nk{i}"), pending("f", 100), ANY).await.unwrap(), Verdict::Forward);
        }
        assert!(matches!(r.begin("rack/1\n5\nk3", pending("f", 100), ANY).await, Err(BeginError::Full { .. })));
        assert_eq!(r.len(), 3, "nothing live was evicted");
        r.settle("rack/1\n5\nk0", State::Unknown { why: "cut".into() }, Bytes::new(), 0).await.unwrap();
        assert_eq!(r.expire(99).await.unwrap(), 0, "not yet");
        assert_eq!(r.expire(100).await.unwrap(), 1, "expired, but pending ones stay");
        assert!(r.get("rack/1\n5\nk0").is_none(), "an expired key is gone");
        assert_eq!(r.begin("rack/1\n5\nk3", pending("f", 100), ANY).await.unwrap(), Verdict::Forward, "room again");
    }

    /// One lock key's records take at most its quota: past it, its new
    /// keys are refused, while another lock key's are still taken; a
    /// retry of a key it holds is still judged (replayed, here in flight);
    /// and what expires or is forgotten gives the room back.
    #[tokio::test]
    async fn a_lock_key_past_its_quota_is_refused_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let r = open(dir.path(), 1 << 20);
        let quota = 3 * pending("f", 100).size("rack/1\n5\nk0");
        for i in 0..3 {
            assert_eq!(r.begin(&format!("rack/1\n5\nk{i}"), pending("f", 100), quota).await.unwrap(), Verdict::Forward);
        }
        match r.begin("rack/1\n5\nk3", pending("f", 100), quota).await {
            Err(BeginError::Quota { limit }) => assert_eq!(limit, quota),
            other => panic!("{other:?}"),
        }
        // Another holder of the same lock key counts against the same quota.
        assert!(matches!(r.begin("rack/1\n6\nk0", pending("f", 100), quota).await, Err(BeginError::Quota { .. })));
        assert_eq!(r.begin("rack/2\n5\nk0", pending("f", 100), quota).await.unwrap(), Verdict::Forward, "another key");
        assert_eq!(r.begin("rack/1\n5\nk0", pending("f", 100), quota).await.unwrap(), Verdict::InFlight);
        r.forget("rack/1\n5\nk2").await.unwrap();
        assert_eq!(r.begin("rack/1\n5\nk3", pending("f", 100), quota).await.unwrap(), Verdict::Forward, "room again");
        for i in [0, 1, 3] {
            r.settle(&format!("rack/1\n5\nk{i}"), State::Unknown { why: "cut".into() }, Bytes::new(), 0).await.unwrap();
        }
        assert_eq!(r.expire(100).await.unwrap(), 3);
        assert!(!r.index().by_lock_key.contains_key("rack/1"), "nothing counted for a lock key without records");
        assert_eq!(r.begin("rack/1\n6\nk0", pending("f", 100), quota).await.unwrap(), Verdict::Forward);
    }

    #[tokio::test]
    async fn a_sweep_of_more_than_it_takes_at_once_expires_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let r = open(dir.path(), 1 << 30);
        let n = 2 * EXPIRE_AT_ONCE + 1;
        let scopes: Vec<String> = (0..n).map(|i| format!("rack/1\n5\nk{i}")).collect();
        // At once: they share a few fsyncs.
        let begun = scopes.iter().map(|s| r.begin(s, pending("f", 100), ANY));
        for v in futures_util::future::join_all(begun).await {
            assert_eq!(v.unwrap(), Verdict::Forward);
        }
        let settled = scopes.iter().map(|s| {
            let done = State::Done { status: 200, headers: Vec::new(), kept: true };
            r.settle(s, done, Bytes::new(), 0)
        });
        futures_util::future::join_all(settled).await;
        assert_eq!(r.expire(100).await.unwrap(), n);
        assert_eq!((r.len(), r.bytes()), (0, 0));
    }

    #[tokio::test]
    async fn a_settled_record_expires_by_its_new_expiry_and_its_bytes_go_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let r = open(dir.path(), 1 << 20);
        assert_eq!(r.begin("rack/1\n5\nk", pending("f", 100), ANY).await.unwrap(), Verdict::Forward);
        let done = State::Done { status: 200, headers: vec![("x-a".into(), b"1".to_vec())], kept: true };
        // As in the sidecar: settled a retention after the answer, later
        // than the pending record's expiry.
        r.settle("rack/1\n5\nk", done, Bytes::from_static(b"made"), 200).await.unwrap();
        assert_eq!(r.expire(150).await.unwrap(), 0, "not by the pending record's expiry");
        assert!(matches!(r.get("rack/1\n5\nk").map(|rec| rec.state), Some(State::Done { .. })));
        assert_eq!(r.expire(200).await.unwrap(), 1);
        assert_eq!((r.len(), r.bytes()), (0, 0), "nothing left behind in the index");
    }
}
