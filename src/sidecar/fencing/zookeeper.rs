//! ZooKeeper as the sidecar's lock service (`lock_service.kind: zookeeper`,
//! docs/decisions/0010): who holds a lock that kazoo's `Lock` or Curator's
//! `InterProcessMutex` takes on znode `/KEY`, read through one session
//! (`zookeeper-client`, plain TCP, digest authentication if configured).
//!
//! The holder is the lock znode's child with the lowest sequence number
//! (`contenders`), and its token is that child's `czxid`. A read answers
//! as a fencegate node's does (`wire::LockInfo`): the holder's token, held;
//! or, with no contender left, `compacted_below: Z`, where every grant of
//! the lock created at or before zxid Z has ended (the lock znode's `pzxid`,
//! the zxid of its children's latest change; if the lock znode is gone, the
//! largest `pzxid` of its ancestors, read before it: its deletion changed
//! its parent's children).
//!
//! `read` is linearizable: first a `barrier`, a write that changes nothing
//! (a `multi` of one `check` of `/`, any version), proposed by the leader
//! and committed by a quorum; the session's server answers what follows
//! on the session only after it applied it, so the reads show every write
//! acknowledged before the barrier was sent. ZooKeeper's `sync` would be
//! cheaper, but is not quorum-acknowledged (ZOOKEEPER-1675): a leader cut
//! off from its quorum may answer one until it notices. The barrier costs
//! the ensemble one logged transaction per read.

pub(crate) mod contenders;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use fencegate_client::wire::LockInfo;
use zookeeper_client::{Client, SessionState};

use contenders::{ancestors, first, znode};

/// One read, session set-up included: past it the answer would be too old
/// to vouch for anything (`max_staleness` is at most 10 s, 1 s by default).
pub(crate) const READ: Duration = Duration::from_secs(3);
/// The sidecar's own session: how long ZooKeeper keeps it (and the watches
/// on it) while the sidecar cannot reach any server.
const SESSION: Duration = Duration::from_secs(6);
/// How long connecting to one server may take before the next is tried.
const CONNECT: Duration = Duration::from_secs(1);
/// How long a failed session set-up (a refused password, no server) is not
/// tried again: each caller would otherwise try one of its own.
const RETRY: Duration = Duration::from_secs(1);
/// How many times a read starts over when the holder it found is gone
/// before it could read its czxid (a busy lock).
const HOLDER_TRIES: usize = 3;
/// How many holders' czxids are remembered (a znode's czxid never changes).
const MAX_CREATED: usize = 100_000;

/// The ensemble, the credentials to present, and the session.
pub(crate) struct ZooKeeper {
    /// The connect string: `host:port,host:port`.
    hosts: String,
    /// `user:password`, for the `digest` scheme.
    digest: Option<Vec<u8>>,
    session: Mutex<Session>,
    /// One session set-up at a time.
    connecting: tokio::sync::Mutex<()>,
    /// (lock znode's czxid, child's name) → the child's czxid.
    created: Mutex<HashMap<(i64, String), u64>>,
}

#[derive(Default)]
struct Session {
    client: Option<Client>,
    /// The latest failed set-up, and when.
    failed: Option<(std::time::Instant, String)>,
}

/// What a read of one lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Held by the contender created at this zxid.
    Held(u64),
    /// No contender: every grant created at or before this zxid has ended.
    Free(u64),
}

impl ZooKeeper {
    /// `hosts` as `lock_service.endpoints` lists them (`host:port`); `user`
    /// with its password, for the `digest` scheme.
    pub(crate) fn new(hosts: &[String], user: Option<(String, String)>) -> ZooKeeper {
        ZooKeeper {
            hosts: hosts.join(","),
            digest: user.map(|(name, password)| format!("{name}:{password}").into_bytes()),
            session: Mutex::default(),
            connecting: tokio::sync::Mutex::new(()),
            created: Mutex::default(),
        }
    }

    /// Who holds lock `name` now: a `barrier`, then its children, within
    /// `READ`.
    pub(crate) async fn read(&self, name: &str) -> Result<LockInfo, String> {
        let path = znode(name);
        let read = async {
            let zk = self.client().await?;
            let barrier = barrier(&zk);
            let holder = self.holder(&zk, &path);
            barrier.await?;
            holder.await
        };
        let holder = tokio::time::timeout(READ, read).await.map_err(|_| format!("no answer within {READ:?}"))??;
        Ok(lock_info(name, holder))
    }

    /// Whether the ensemble has a leader: a `sync` of `/` answered.
    pub(crate) async fn healthy(&self) -> Result<(), String> {
        let ask = async {
            let zk = self.client().await?;
            zk.sync("/").await.map_err(|e| format!("sync: {e}"))
        };
        tokio::time::timeout(READ, ask).await.map_err(|_| format!("no answer within {READ:?}"))?
    }

    /// Who holds the lock at `path` as the session's server has it, with no
    /// barrier of its own (a caller's, sent before, covers it).
    pub(crate) async fn holder(&self, zk: &Client, path: &str) -> Result<Holder, String> {
        for _ in 0..HOLDER_TRIES {
            // Sent in this order, answered in it: a lock znode absent after
            // its ancestors were read had every grant up to their pzxid end.
            let above: Vec<_> = ancestors(path).map(|a| zk.check_stat(a)).collect();
            let children = zk.get_children(path);
            let mut ended = 0;
            for stat in above {
                let stat = stat.await.map_err(|e| format!("stat above {path}: {e}"))?;
                ended = ended.max(stat.map_or(0, |s| zxid(s.pzxid)));
            }
            let (children, stat) = match children.await {
                Ok(found) => found,
                Err(zookeeper_client::Error::NoNode) => return Ok(Holder::Free(ended)),
                Err(e) => return Err(format!("children of {path}: {e}")),
            };
            let Some(child) = first(&children) else { return Ok(Holder::Free(zxid(stat.pzxid))) };
            if let Some(created) = self.created(zk, path, stat.czxid, child).await? {
                return Ok(Holder::Held(created));
            }
            // The holder left between the two reads: read the lock again.
        }
        Err(format!("{path}'s holder changed {HOLDER_TRIES} times while it was read"))
    }

    /// The czxid of `path`'s child `child` (`None` if it is gone), once
    /// read, remembered by the lock znode's own czxid: a child of another
    /// life of the lock znode may have the same name.
    async fn created(&self, zk: &Client, path: &str, lock: i64, child: &str) -> Result<Option<u64>, String> {
        let remembered = |created: &mut HashMap<(i64, String), u64>| created.get(&(lock, child.to_string())).copied();
        if let Some(czxid) = remembered(&mut self.created.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(Some(czxid));
        }
        let full = format!("{path}/{child}");
        let Some(stat) = zk.check_stat(&full).await.map_err(|e| format!("stat of {full}: {e}"))? else {
            return Ok(None);
        };
        let mut created = self.created.lock().unwrap_or_else(|p| p.into_inner());
        if created.len() >= MAX_CREATED {
            created.clear();
        }
        created.insert((lock, child.to_string()), zxid(stat.czxid));
        Ok(Some(zxid(stat.czxid)))
    }

    /// The session: the current one while it lives, else a new one (one
    /// set-up at a time, none within `RETRY` of a failed one), caught up
    /// with the leader before use: a new session may reach a server behind
    /// the one the last reached.
    pub(crate) async fn client(&self) -> Result<Client, String> {
        if let Some(zk) = self.live() {
            return Ok(zk);
        }
        let _one = self.connecting.lock().await;
        if let Some(zk) = self.live() {
            return Ok(zk);
        }
        if let Some((at, why)) = &self.session().failed {
            if at.elapsed() < RETRY {
                return Err(why.clone());
            }
        }
        let made = self.connect().await;
        let mut session = self.session();
        match made {
            Ok(zk) => {
                (session.client, session.failed) = (Some(zk.clone()), None);
                Ok(zk)
            }
            Err(why) => {
                session.failed = Some((std::time::Instant::now(), why.clone()));
                Err(why)
            }
        }
    }

    fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current session, unless it has ended (expired, closed, its
    /// authentication refused).
    fn live(&self) -> Option<Client> {
        let session = self.session();
        let zk = session.client.as_ref()?;
        match zk.state() {
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => None,
            _ => Some(zk.clone()),
        }
    }

    async fn connect(&self) -> Result<Client, String> {
        let mut connector = Client::connector()
            .with_session_timeout(SESSION)
            .with_connection_timeout(CONNECT)
            // No server: an error now, not after the session timeout.
            .with_fail_eagerly();
        if let Some(digest) = &self.digest {
            connector = connector.with_auth("digest", digest);
        }
        let hosts = &self.hosts;
        let zk = connector.connect(hosts).await.map_err(|e| format!("no session with ZooKeeper at {hosts}: {e}"))?;
        zk.sync("/").await.map_err(|e| format!("sync of a new session with {hosts}: {e}"))?;
        Ok(zk)
    }
}

/// A write through the leader and a quorum that changes nothing: a `multi`
/// of one `check` of `/`, any version. Sent when called; what the session
/// reads after it shows every write acknowledged before then.
pub(crate) fn barrier(zk: &Client) -> impl std::future::Future<Output = Result<(), String>> + '_ {
    let mut multi = zk.new_multi_writer();
    let checked = multi.add_check_version("/", -1).map(|()| multi.commit());
    async move {
        checked.map_err(|e| format!("barrier: {e}"))?.await.map_err(|e| format!("barrier: {e}"))?;
        Ok(())
    }
}

/// A zxid as a token: zxids are positive (an epoch, then a counter).
fn zxid(z: i64) -> u64 {
    u64::try_from(z).unwrap_or(0)
}

/// `holder` as the lock service's answer for lock `name`.
pub(crate) fn lock_info(name: &str, holder: Holder) -> LockInfo {
    let (held, token, compacted_below) = match holder {
        Holder::Held(token) => (true, token, None),
        Holder::Free(through) => (false, 0, Some(through)),
    };
    LockInfo {
        key: name.to_string(),
        held,
        token,
        holder: None,
        expires_in_ms: None,
        compacted_below,
        // ZooKeeper names no history: one that went back shows as a read
        // below a lock's latest known grant (`knowledge`).
        cluster: None,
    }
}
