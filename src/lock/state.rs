//! The replicated lock table: a pure function from (state, command) to
//! (state', outcome, event).
//!
//! Every replica applies the same committed commands in the same order, so this
//! module must be deterministic: it reads no clock, draws no random numbers and
//! does no IO. Anything that depends on time (when a lease is due to expire,
//! when a lock-delay ends) is decided by the leader in `lock::clock` and enters
//! the log as an explicit `Expire` / `EndDelay` command.
//!
//! Every event (grant, release, expiry) takes the next *revision*, a counter
//! that is part of the replicated state, and a grant's fencing token is the
//! revision of its grant event (L1). Every replica applies the same commands
//! in the same order, so they agree on it; it is in the snapshot, so it only
//! ever grows across leader changes, crashes, restarts and snapshots. (Not the
//! Raft log index, as the first design recommended: one log entry carries a batch of
//! commands — see `server::proposer` — so several grants share an index.)
//!
//! Every lease has an *owner*, the identity that acquired it; request ids are
//! remembered per owner, so nobody can fetch another identity's grant by
//! replaying its request id. A key that is neither held nor in lock-delay is
//! dropped by `Compact` once the leader judges it idle long enough; the
//! table then remembers only that every token of an absent key up to
//! `compacted_below` has ended (L1 and the sidecar's checks stay exact: no
//! absent key has a live lease).
//!
//! What else the table holds, all of it replicated and in the snapshot (the
//! table serialises as the snapshot):
//! - request ids, per owner: under rules 1, every live lease's, plus the
//!   last `REQUEST_ID_MEMORY` ended ones, forgotten in the order their leases
//!   ended, so a steady load of acquires leaves the table (and the snapshot)
//!   flat; under rules 0, the last 65,536 of any lease;
//! - the `rules` the table is applied by, moved only by a committed `Rules`
//!   (`raft::upgrade` says when);
//! - live leases per owner (for quotas), and `compacted_below`, raised by
//!   `Compact { through }`, which drops the free keys idle since revision
//!   `through` (never the counter, never a key with a live lease or
//!   lock-delay).
//!
//! Lease ids are random, so they are drawn by the leader's API handler and
//! carried in the command: every replica applies the same thing.
//! [`LockState::admission`] is the one "already granted / free / held"
//! decision: `apply` uses it, and so does the leader's wait loop, to keep
//! proposals that would be refused out of the log (the proptest in
//! `tests.rs` checks that it predicts `apply`). This module knows nothing of
//! HTTP or of how watchers see events.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// A fencing token (defined with the wire protocol): strictly increasing
/// over all grants of all keys.
pub(crate) use fencegate_client::wire::Token;

/// The newest rules of applying commands this build knows. A table starts
/// under rules 0 (what every build before rules were numbered applied) and
/// moves to a newer version only by a committed `Command::Rules`, which the
/// leader proposes once every member has said it speaks them
/// (`raft::upgrade`): replicas of different builds never apply different
/// rules to the same command.
///
/// - 0: the last `LEGACY_REQUEST_ID_MEMORY` request ids of any lease are
///   remembered, oldest grant forgotten first.
/// - 1: the request id of every live lease, and those of the last
///   `REQUEST_ID_MEMORY` leases that ended, oldest end forgotten first.
/// - 2: as 1, and the table carries its cluster's identity, set once by a
///   committed `Identify` (or by a restore, which makes a new one).
pub(crate) const RULES: u32 = 2;

/// Under rules 1: how many request ids of *ended* leases are remembered for
/// deduplicating retries (the request id of a live lease is always
/// remembered, until it ends). A retry comes within its client's acquire
/// call, seconds after the attempt it repeats; the ended ones are kept only
/// so that a retry that comes after its lease ended still gets that grant
/// back rather than a second one. Evicted on applied commands only, so
/// every replica agrees.
pub const REQUEST_ID_MEMORY: usize = 4_096;

/// Under rules 0: how many request ids of any lease are remembered. About
/// 190 bytes of snapshot and 1 KB of each node's memory per acquire: a
/// steady load filled it for an hour.
pub(crate) const LEGACY_REQUEST_ID_MEMORY: usize = 65_536;

/// A replicated command. Entries of the Raft log carry exactly one of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Take `key` if it is free. Never queues: waiting is the leader's job.
    Acquire(AcquireCmd),
    /// A holder gives the lease back, or an admin revokes it: `by` is who
    /// asked (empty in entries written before it was recorded).
    Release {
        lease_id: String,
        #[serde(default)]
        by: String,
    },
    /// The leader saw the lease's deadline pass without a keepalive.
    Expire { lease_id: String },
    /// The leader saw the lock-delay that followed the expiry at `token` pass.
    EndDelay { key: String, token: Token },
    /// Drop every free key whose latest event is at revision `through` or
    /// earlier (the leader proposes it for what went idle a retention ago).
    Compact { through: u64 },
    /// Apply the rules of `version` (at most `RULES`) from the next command
    /// on; never back to older ones. (An older build cannot read this
    /// entry, and refuses it rather than apply it wrongly.)
    Rules { version: u32 },
    /// Give the table its cluster identity, if it has none yet (the first
    /// committed one stays: a later one changes nothing). Proposed by a
    /// leader under rules 2, whose table has none.
    Identify { cluster: String },
}

/// Everything a grant needs, decided by the leader before proposing so that
/// every replica applies the same thing (the lease id is random, so it must be
/// drawn once and carried in the entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireCmd {
    pub key: String,
    /// The identity acquiring: only it (or an admin) may keep the lease alive or release it.
    #[serde(default)]
    pub owner: String,
    pub holder: String,
    pub ttl_ms: u64,
    pub lock_delay_ms: u64,
    pub lease_id: String,
    /// Client-chosen id; a retry with the same id gets the original grant back.
    pub request_id: Option<String>,
}

/// A successful acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub key: String,
    pub token: Token,
    pub lease_id: String,
    pub ttl_ms: u64,
}

/// What applying one command produced, returned to the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Granted(Grant),
    /// The key is taken (or in lock-delay); nothing changed.
    Held {
        key: String,
        holder: Option<String>,
        token: Token,
        lock_delay: bool,
    },
    /// The lease ended by this command (release or expiry).
    Ended {
        key: String,
        token: Token,
    },
    /// The lease named by the command does not exist (any more).
    NoSuchLease,
    /// Nothing to do (blank/membership entry, stale EndDelay).
    Nothing,
}

/// A change to a key, in log order; what the watch stream and the lease clock
/// are fed with. Watchers get it as a `wire::WatchLine`, without the lease id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// This event's revision: unique and increasing; watchers resume from it.
    pub rev: u64,
    pub key: String,
    pub token: Token,
    /// The lease the event is about; used by the lease clock, never sent out.
    pub lease_id: String,
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    Granted { holder: String, ttl_ms: u64 },
    Released,
    Expired { lock_delay_ms: u64 },
}

/// A live lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub key: String,
    pub token: Token,
    #[serde(default)]
    pub owner: String,
    pub holder: String,
    pub ttl_ms: u64,
    pub lock_delay_ms: u64,
    /// The request id of the acquire that granted it, remembered (in
    /// `LockState::requests`) while the lease lives. Absent without one, and
    /// in snapshots written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Per-key state. A key that was ever granted stays in the table so that its
/// latest token can be read back (`GET /v1/locks/{key}` answers it even when free).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyState {
    /// Token of the latest grant of this key.
    pub token: Token,
    /// The live lease, if any.
    pub lease_id: Option<String>,
    /// Set after an expiry with a lock-delay, until the matching `EndDelay`.
    pub delay: Option<Delay>,
    /// Revision of the key's latest event (grant, release, expiry): how
    /// long it has been idle, for `Compact`.
    #[serde(default)]
    pub rev: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delay {
    /// Token of the lease whose expiry started the delay.
    pub token: Token,
    pub ms: u64,
}

/// The whole replicated table. Serialises as the snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockState {
    /// Revision of the latest event; the next grant's token is above it.
    revision: u64,
    keys: BTreeMap<String, KeyState>,
    leases: HashMap<String, Lease>,
    /// The rules commands are applied by (`RULES`); 0 in snapshots written
    /// before they were numbered.
    #[serde(default)]
    rules: u32,
    /// Grants by owner and client request id (`request_key`). Rules 0: the
    /// last `LEGACY_REQUEST_ID_MEMORY` grants'. Rules 1: those of every live
    /// lease, and of the last `REQUEST_ID_MEMORY` leases that ended.
    requests: HashMap<String, Grant>,
    /// The `requests` to forget first. Rules 0: every grant's, in grant
    /// order. Rules 1: those of ended leases, in the order they ended.
    request_order: VecDeque<String>,
    /// Live leases per owner (owners with none are not listed).
    #[serde(default)]
    owned: BTreeMap<String, u64>,
    /// Every token up to this of a key absent from `keys` has ended.
    #[serde(default)]
    compacted_below: u64,
    /// The cluster this table's history belongs to (`raft::identity`):
    /// made once per cluster, and anew by every restore. `None` in tables
    /// written before rules 2 until a committed `Identify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster: Option<String>,
}

/// Request ids are scoped by owner (identities never contain a newline).
fn request_key(owner: &str, request_id: &str) -> String {
    format!("{owner}\n{request_id}")
}

impl LockState {
    /// Apply one committed command.
    pub fn apply(&mut self, cmd: &Command) -> (Outcome, Option<Event>) {
        match cmd {
            Command::Acquire(a) => self.acquire(a),
            Command::Release { lease_id, .. } => self.end(lease_id, false),
            Command::Expire { lease_id } => self.end(lease_id, true),
            Command::EndDelay { key, token } => {
                if let Some(k) = self.keys.get_mut(key) {
                    if k.delay.as_ref().is_some_and(|d| d.token == *token) {
                        k.delay = None;
                    }
                }
                (Outcome::Nothing, None)
            }
            Command::Compact { through } => {
                let through = (*through).min(self.revision);
                self.keys.retain(|_, k| k.lease_id.is_some() || k.delay.is_some() || k.rev > through);
                self.compacted_below = self.compacted_below.max(through);
                (Outcome::Nothing, None)
            }
            Command::Rules { version } => {
                if *version >= 1 && self.rules < 1 {
                    self.move_to_rules_1();
                }
                self.rules = self.rules.max(*version);
                (Outcome::Nothing, None)
            }
            Command::Identify { cluster } => {
                if self.cluster.is_none() {
                    self.cluster = Some(cluster.clone());
                }
                (Outcome::Nothing, None)
            }
        }
    }

    /// The cluster this table's history belongs to, once it has one.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// The rules this table is applied by.
    pub fn rules(&self) -> u32 {
        self.rules
    }

    /// From rules 0 to 1: the remembered request ids of live leases stay,
    /// recorded in their lease (out of the queue: they are queued when
    /// their lease ends), and no other lease records one; of the others,
    /// the last `REQUEST_ID_MEMORY` granted stay, in grant order. (Ids from
    /// before they were scoped by owner, without the `\n`, are dropped:
    /// no acquire can name them.) Walks the queue, in its order, so that
    /// every replica makes the same table.
    fn move_to_rules_1(&mut self) {
        for lease in self.leases.values_mut() {
            lease.request_id = None;
        }
        let mut ended = VecDeque::new();
        for id in std::mem::take(&mut self.request_order) {
            let Some(grant) = self.requests.get(&id) else { continue };
            match (self.leases.get_mut(&grant.lease_id), id.split_once('\n')) {
                (Some(lease), Some((_, r))) => lease.request_id = Some(r.to_string()),
                (None, Some(_)) => ended.push_back(id),
                (_, None) => {
                    self.requests.remove(&id);
                }
            }
        }
        while ended.len() > REQUEST_ID_MEMORY {
            if let Some(old) = ended.pop_front() {
                self.requests.remove(&old);
            }
        }
        self.request_order = ended;
    }

    /// Every token up to this of a key absent from the table has ended
    /// (0: nothing was ever compacted).
    pub fn compacted_below(&self) -> u64 {
        self.compacted_below
    }

    /// Whether `Compact { through }` would drop any key (so that the leader
    /// proposes nothing when it would not).
    pub fn compactable(&self, through: u64) -> bool {
        self.keys.values().any(|k| k.lease_id.is_none() && k.delay.is_none() && k.rev <= through)
    }

    /// Keys in the table (held, in lock-delay, or not compacted yet).
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Live leases `owner` holds.
    pub fn owned_by(&self, owner: &str) -> u64 {
        self.owned.get(owner).copied().unwrap_or(0)
    }

    /// The latest revision (0 before the first event).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// What an acquire of `key` with `request_id` would get if applied now:
    /// the one "already granted / free / held" decision, used by `apply` and
    /// by the leader to keep proposals that would be refused out of the log.
    pub fn admission(&self, key: &str, owner: &str, request_id: Option<&str>) -> Outcome {
        if let Some(grant) = request_id.and_then(|r| self.requests.get(&request_key(owner, r))) {
            return Outcome::Granted(grant.clone());
        }
        match self.keys.get(key) {
            Some(k) if k.lease_id.is_some() || k.delay.is_some() => Outcome::Held {
                key: key.to_string(),
                holder: self.holder_of(key).map(|(_, l)| l.holder.clone()),
                token: k.token,
                lock_delay: k.delay.is_some(),
            },
            // Free: the answer is decided by applying.
            _ => Outcome::Nothing,
        }
    }

    fn acquire(&mut self, a: &AcquireCmd) -> (Outcome, Option<Event>) {
        match self.admission(&a.key, &a.owner, a.request_id.as_deref()) {
            Outcome::Nothing if !self.leases.contains_key(&a.lease_id) => {}
            Outcome::Nothing => {
                // A lease id drawn twice (never in practice: 128 random bits).
                let token = self.keys.get(&a.key).map_or(0, |k| k.token);
                return (Outcome::Held { key: a.key.clone(), holder: None, token, lock_delay: false }, None);
            }
            refused_or_repeated => return (refused_or_repeated, None),
        }
        self.revision += 1;
        let token = self.revision;
        let k = self.keys.entry(a.key.clone()).or_default();
        k.token = token;
        k.rev = token;
        k.lease_id = Some(a.lease_id.clone());
        *self.owned.entry(a.owner.clone()).or_default() += 1;
        let lease = Lease {
            key: a.key.clone(),
            token,
            owner: a.owner.clone(),
            holder: a.holder.clone(),
            ttl_ms: a.ttl_ms,
            lock_delay_ms: a.lock_delay_ms,
            // Under rules 0 a lease records none, as before rules were
            // numbered (`move_to_rules_1` fills them in).
            request_id: a.request_id.clone().filter(|_| self.rules >= 1),
        };
        self.leases.insert(a.lease_id.clone(), lease);
        let grant = Grant { key: a.key.clone(), token, lease_id: a.lease_id.clone(), ttl_ms: a.ttl_ms };
        if let Some(r) = &a.request_id {
            let id = request_key(&a.owner, r);
            if self.rules == 0 {
                self.remember_request(id, grant.clone());
            } else {
                // Remembered as long as the lease lives; queued for
                // forgetting once it ends (`end`).
                self.requests.insert(id, grant.clone());
            }
        }
        let event = Event {
            rev: token,
            key: a.key.clone(),
            token,
            lease_id: a.lease_id.clone(),
            kind: EventKind::Granted { holder: a.holder.clone(), ttl_ms: a.ttl_ms },
        };
        (Outcome::Granted(grant), Some(event))
    }

    /// Rules 0: remember a grant's request id, forgetting the oldest grant's.
    fn remember_request(&mut self, id: String, grant: Grant) {
        if self.request_order.len() >= LEGACY_REQUEST_ID_MEMORY {
            if let Some(old) = self.request_order.pop_front() {
                self.requests.remove(&old);
            }
        }
        self.request_order.push_back(id.clone());
        self.requests.insert(id, grant);
    }

    /// Rules 1: the lease granted for `request_key` ended; its request id is
    /// kept among the last `REQUEST_ID_MEMORY` ended ones. (While it is, an
    /// acquire naming it is a repeat: no live lease can have it too.)
    fn forget_later(&mut self, request_key: String) {
        self.request_order.push_back(request_key);
        while self.request_order.len() > REQUEST_ID_MEMORY {
            if let Some(old) = self.request_order.pop_front() {
                self.requests.remove(&old);
            }
        }
    }

    /// Request ids remembered (of live leases and of recently ended ones).
    pub fn remembered_requests(&self) -> usize {
        self.requests.len()
    }

    fn end(&mut self, lease_id: &str, expired: bool) -> (Outcome, Option<Event>) {
        let Some(lease) = self.leases.remove(lease_id) else {
            return (Outcome::NoSuchLease, None);
        };
        if let Some(n) = self.owned.get_mut(&lease.owner) {
            *n -= 1;
            if *n == 0 {
                self.owned.remove(&lease.owner);
            }
        }
        if let (Some(r), 1..) = (&lease.request_id, self.rules) {
            self.forget_later(request_key(&lease.owner, r));
        }
        let k = self.keys.get_mut(&lease.key).expect("a live lease always has its key entry");
        k.lease_id = None;
        let kind = if expired {
            if lease.lock_delay_ms > 0 {
                k.delay = Some(Delay { token: lease.token, ms: lease.lock_delay_ms });
            }
            EventKind::Expired { lock_delay_ms: lease.lock_delay_ms }
        } else {
            EventKind::Released
        };
        self.revision += 1;
        k.rev = self.revision;
        let event = Event {
            rev: self.revision,
            key: lease.key.clone(),
            token: lease.token,
            lease_id: lease_id.to_string(),
            kind,
        };
        (Outcome::Ended { key: lease.key, token: lease.token }, Some(event))
    }

    pub fn lease(&self, lease_id: &str) -> Option<&Lease> {
        self.leases.get(lease_id)
    }

    pub fn key(&self, key: &str) -> Option<&KeyState> {
        self.keys.get(key)
    }

    /// Holder of the live lease on `key`, if any.
    pub fn holder_of(&self, key: &str) -> Option<(&str, &Lease)> {
        let id = self.keys.get(key)?.lease_id.as_deref()?;
        self.leases.get(id).map(|l| (id, l))
    }

    pub fn leases(&self) -> impl Iterator<Item = (&String, &Lease)> {
        self.leases.iter()
    }

    pub fn keys_with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a String, &'a KeyState)> + 'a {
        self.keys.range(prefix.to_string()..).take_while(move |(k, _)| k.starts_with(prefix))
    }

    /// Keys currently in lock-delay.
    pub fn delays(&self) -> impl Iterator<Item = (&String, &Delay)> {
        self.keys.iter().filter_map(|(k, s)| s.delay.as_ref().map(|d| (k, d)))
    }

    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// The table a cluster restored from this one (a backup) starts with,
    /// the history of cluster `cluster` (a new identity: a restored cluster
    /// is never the same history as the one backed up, however far that
    /// one went on after the backup).
    ///
    /// Its revision is `floor + 1` (at least the backup's own revision +
    /// 1), so every token the restored cluster grants is above `floor`; the
    /// caller picks a `floor` above every token the old cluster may have
    /// granted since the backup (`cli::snapshot`). The `+ 1` is the restore
    /// itself, an event that ends every lease of the old history: no key
    /// is kept (none is held, none is in lock-delay, no request id is
    /// remembered), and `compacted_below` is the restore's revision, so
    /// that a read of any key answers that every token up to it has ended.
    /// A sidecar of any build that still believes a lease of the old
    /// history live learns it ended, from the state dump that no longer
    /// lists the key and from a read; were the keys kept with their old
    /// tokens, a token granted after the backup would sit above them and
    /// look live.
    pub fn restored(&self, floor: u64, cluster: String) -> LockState {
        let revision = floor.max(self.revision) + 1;
        LockState { revision, compacted_below: revision, cluster: Some(cluster), ..LockState::default() }
    }
}

#[cfg(test)]
mod tests;
