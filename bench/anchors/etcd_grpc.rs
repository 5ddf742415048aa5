//! etcd through its native gRPC API (the `etcd-client` crate), used the way
//! `etcdctl lock` and Go's `concurrency` package use it: one session per
//! client process — a lease granted once and kept alive on a LeaseKeepAlive
//! stream every ttl/3 — and the v3lock service's `Lock`/`Unlock` with it.
//!
//! One acquire+release pair is two unary RPCs: `Lock(name, lease)` and
//! `Unlock(key)`. The v3lock server runs Go's `concurrency` package on an
//! in-process client for it: `Lock` opens a session on the given lease
//! (orphaned at once: the caller keeps the lease alive) and runs
//! `Mutex.Lock`, one Raft entry (a txn that puts `name/<lease>` attached to
//! the lease if it does not exist, and reads the oldest key under `name/`);
//! `Unlock` is one more (a delete of the key). Uncontended, as every key is here, the
//! header of `Lock`'s answer carries the revision of that put, which is the
//! lock key's create revision: the fencing token. (A waiter would get a
//! later header and read its key's create revision with one more Range.)

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use etcd_client::proto::PbLeaseKeepAliveRequest;
use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper, LockOptions, WatchOptions};
use futures_util::{stream, StreamExt};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio::time::timeout;

use crate::common::holders::{paced, KeepaliveStats, BUILD_CONCURRENCY, LEASES_PER_KEEPER, TTL};
use crate::common::locks::{Backend, Held, LOAD_TIMEOUT};

/// A client process's session on the member at `url`, shared by all its
/// lock calls (clones), as `concurrency.Session` is shared by the mutexes
/// of one process.
#[derive(Clone)]
pub struct EtcdGrpc {
    client: Client,
    lease: i64,
    /// Streams for the keepalives/s measurement (one call in flight on each).
    keepers: Arc<Vec<Mutex<(LeaseKeeper, LeaseKeepAliveStream)>>>,
    next_keeper: Arc<AtomicUsize>,
    session: Arc<JoinSet<()>>,
}

impl EtcdGrpc {
    /// Connect to `url`, grant the session's lease (`ttl`) and keep it alive;
    /// `streams` more keepalive streams for [`Backend::keepalive`].
    pub async fn connect(url: &str, ttl: Duration, streams: usize) -> Result<EtcdGrpc> {
        let client = Client::connect([url], None).await?;
        let lease = client.lease_client().grant(ttl.as_secs() as i64, None).await?.id();
        let mut session = JoinSet::new();
        let (keeper, responses) = client.lease_client().keep_alive(lease).await?;
        session.spawn(keep_session(keeper, responses, ttl / 3));
        let mut keepers = vec![];
        for _ in 0..streams {
            keepers.push(Mutex::new(client.lease_client().keep_alive(lease).await?));
        }
        let (keepers, next_keeper) = (Arc::new(keepers), Arc::default());
        Ok(EtcdGrpc { client, lease, keepers, next_keeper, session: Arc::new(session) })
    }

    /// End the session: revoke its lease (which deletes any key still held).
    pub async fn close(self) {
        drop(self.session);
        let _ = self.client.lease_client().revoke(self.lease).await;
    }
}

/// What the Go client's session does: a keepalive every ttl/3 on one stream.
async fn keep_session(mut keeper: LeaseKeeper, mut responses: LeaseKeepAliveStream, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        keeper.keep_alive().await.expect("session keepalive");
        let answer = responses.message().await.expect("session keepalive").expect("keepalive stream ended");
        assert!(answer.ttl() > 0, "the session's lease is gone");
    }
}

impl Backend for EtcdGrpc {
    /// `ttl` is the session's, set at [`EtcdGrpc::connect`].
    async fn acquire(&self, _url: &str, key: &str, _ttl: Duration, within: Duration) -> Result<Held> {
        let options = LockOptions::new().with_lease(self.lease);
        let answer = timeout(within, self.client.lock_client().lock(key, Some(options))).await??;
        let revision = answer.header().context("no header")?.revision();
        let key = String::from_utf8(answer.key().to_vec())?;
        Ok(Held { token: Some(revision as u64), lease: self.lease.to_string(), key })
    }

    async fn release(&self, _url: &str, held: &Held) -> Result<()> {
        timeout(LOAD_TIMEOUT, self.client.lock_client().unlock(held.key.as_str())).await??;
        Ok(())
    }

    /// One keepalive on the next of the streams, answered before that
    /// stream carries another.
    async fn keepalive(&self, _url: &str, _held: &Held) -> Result<()> {
        let i = self.next_keeper.fetch_add(1, Relaxed) % self.keepers.len();
        let mut guard = self.keepers[i].lock().await;
        let (keeper, responses) = &mut *guard;
        keeper.keep_alive().await?;
        let answer = timeout(LOAD_TIMEOUT, responses.message()).await??.context("keepalive stream ended")?;
        if answer.ttl() <= 0 {
            bail!("lease lost");
        }
        Ok(())
    }
}

/// `n` leases, each holding a v3lock lock on key `{prefix}{i}`, kept alive
/// on LeaseKeepAlive streams (one per `LEASES_PER_KEEPER` leases, each on a
/// connection of its own, every lease every `KEEPALIVE_EVERY`: the load of
/// fencegate's `Holders`), and a watch on `watched` (a prefix) drained as it
/// delivers.
pub struct EtcdLive {
    client: Client,
    leases: Vec<i64>,
    pub stats: Arc<KeepaliveStats>,
    /// Dropping the set stops the keepalives and closes the watch.
    tasks: JoinSet<()>,
}

impl EtcdLive {
    pub async fn start(url: &str, prefix: &str, watched: &str, n: usize) -> Result<EtcdLive> {
        let client = Client::connect([url], None).await?;
        let mut tasks = JoinSet::new();
        let mut watch = client.watch_client().watch(watched, Some(WatchOptions::new().with_prefix())).await?;
        tasks.spawn(async move { while let Ok(Some(_)) = watch.message().await {} });
        let leases: Vec<i64> = stream::iter(0..n)
            .map(|i| {
                let client = client.clone();
                let name = format!("{prefix}{i}");
                async move {
                    let lease = client.lease_client().grant(TTL.as_secs() as i64, None).await?.id();
                    client.lock_client().lock(name, Some(LockOptions::new().with_lease(lease))).await?;
                    anyhow::Ok(lease)
                }
            })
            .buffered(BUILD_CONCURRENCY)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_>>()?;
        let stats = Arc::new(KeepaliveStats::default());
        for ids in leases.chunks(LEASES_PER_KEEPER) {
            let client = Client::connect([url], None).await?;
            let (keeper, responses) = client.lease_client().keep_alive(ids[0]).await?;
            tasks.spawn(keep_many(keeper, ids.to_vec(), stats.clone()));
            tasks.spawn(count_lost(responses, stats.clone()));
        }
        Ok(EtcdLive { client, leases, stats, tasks })
    }

    /// Stop the keepalives and the watch, and revoke every lease, so that
    /// none expires later, in the middle of another measurement.
    pub async fn release_all(mut self) {
        self.tasks.shutdown().await;
        let client = &self.client;
        stream::iter(&self.leases)
            .map(|&id| async move { client.lease_client().revoke(id).await.map(drop) })
            .buffer_unordered(BUILD_CONCURRENCY)
            .for_each(|r| async move { r.expect("revoking a lease") })
            .await;
    }
}

/// Keepalives for all of `ids` on one stream (the one `keeper` opened), as
/// Go's client sends every lease of a process on one stream.
async fn keep_many(keeper: LeaseKeeper, ids: Vec<i64>, stats: Arc<KeepaliveStats>) {
    paced(ids, stats, |&id| {
        let sender = keeper.sender.clone();
        async move { sender.send(PbLeaseKeepAliveRequest { id }).await.err().map(|e| e.to_string()) }
    })
    .await
}

/// Answers for a stream of keepalives: a TTL of 0 is a lease that was lost.
async fn count_lost(mut responses: LeaseKeepAliveStream, stats: Arc<KeepaliveStats>) {
    loop {
        match responses.message().await {
            Ok(Some(answer)) if answer.ttl() > 0 => {}
            Ok(Some(answer)) => stats.failed(&format!("lease {:x} lost", answer.id())),
            Ok(None) => return stats.failed("keepalive stream ended"),
            Err(e) => return stats.failed(&e.to_string()),
        }
    }
}
