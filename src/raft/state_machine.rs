//! The Raft state machine: applies committed `lock::state` commands to the
//! shared [`Applied`] state, and builds, stores and installs snapshots.
//!
//! The applied state lives in memory; what survives a crash is the last
//! snapshot (`data_dir/snapshot`, `raft::snapshot_file`; in data format 1,
//! the log's redb file) plus the log entries after it, which openraft
//! re-applies once they are known to be committed. Nothing is acknowledged
//! to a client before its entry is committed on a majority's disks.
//!
//! [`Applied`] is the table behind a std `Mutex` plus a `watch` of the
//! applied index (which wakes watch streams and waiting acquires); beside it
//! the `EventLog` ring that watch streams resume from, and the lease clock,
//! the audit log and the metrics, fed each applied event. This is the only
//! caller of `LockState::apply`; snapshots are the table's JSON, and `seed`
//! writes a restored table as the snapshot a new log starts after. Knows no
//! HTTP.

use std::collections::{BTreeMap, VecDeque};
use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{RaftStateMachine, Snapshot as RaftSnapshot};
use openraft::{AnyError, CommittedLeaderId, EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use tokio::sync::watch;
use tokio::time::Instant;

use super::identity::Identity;
use super::log_store::blocking;
use super::snapshot_file::{SnapshotFile, StoredSnapshot};
use super::types::{
    Entry, LogId, Member, Membership, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use super::upgrade::Protocols;
use crate::audit;
use crate::lock::clock::LeaseClock;
use crate::lock::state::{Command, Event, EventKind, LockState, Outcome, RULES};
use crate::metrics::LockMetrics;

/// How many recent events are kept for watchers that reconnect (fewer once
/// compaction passed them: see `EventLog::forget_through`). About 0.3 KB
/// each: 16,384 are some 5 MB of a node's memory, and minutes of history
/// at a steady load (the soak's 1,500 events a minute: 11 minutes), a few
/// seconds at the benchmarks' peak; a watcher that comes back later
/// resyncs from a state dump instead of resuming. (It was 65,536: the
/// soak's nodes kept growing for 44 minutes while it filled.)
pub const EVENT_MEMORY: usize = 16_384;

/// Recent events in log order, so that a watcher can resume after a reconnect.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    events: VecDeque<Event>,
    /// Events at or below this revision may have been forgotten.
    forgotten_through: u64,
}

impl EventLog {
    fn push(&mut self, e: Event) {
        if self.events.len() >= EVENT_MEMORY {
            if let Some(old) = self.events.pop_front() {
                self.forgotten_through = old.rev;
            }
        }
        self.events.push_back(e);
    }

    /// Forget the events at or below `rev`: `Compact` passed them, so they
    /// are a retention old, and the keys they were about may be gone. A
    /// watcher resuming from before them resyncs.
    fn forget_through(&mut self, rev: u64) {
        while self.events.front().is_some_and(|e| e.rev <= rev) {
            self.events.pop_front();
        }
        self.forgotten_through = self.forgotten_through.max(rev);
        if self.events.capacity() > 4 * self.events.len().max(1024) {
            self.events.shrink_to_fit();
        }
    }

    /// Events after revision `rev`, or `None` when some of them are forgotten
    /// and the watcher must resync from the current state.
    pub(crate) fn after(&self, rev: u64) -> Option<impl Iterator<Item = &Event>> {
        // Revisions increase along the ring: find the start by bisection.
        (rev >= self.forgotten_through).then(|| self.events.range(self.events.partition_point(|e| e.rev <= rev)..))
    }
}

/// Everything the node knows from the applied log. Guarded by a std Mutex:
/// critical sections are short and never cross an `.await`.
#[derive(Default)]
pub(crate) struct AppliedState {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub locks: LockState,
    /// Lease deadlines; only meaningful on the leader (see `lock::clock`).
    pub clock: LeaseClock,
    pub events: EventLog,
}

impl AppliedState {
    pub(crate) fn applied_index(&self) -> u64 {
        self.last_applied.map(|l| l.index).unwrap_or(0)
    }
}

/// The applied state, shared between the state machine and the API.
pub(crate) struct Applied {
    state: Mutex<AppliedState>,
    /// The last applied index; wakes watch streams and waiting acquires.
    index: watch::Sender<u64>,
    metrics: LockMetrics,
    /// Told the rules of the applied table: they set the peer protocol.
    protocols: Arc<Protocols>,
    /// Takes the applied table's cluster id, once it has one.
    identity: Arc<Identity>,
}

impl Applied {
    pub(crate) fn lock(&self) -> MutexGuard<'_, AppliedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.index.subscribe()
    }

    /// The table changed (applied commands, or a snapshot installed).
    fn table_changed(&self, locks: &LockState) {
        self.metrics.set_table(locks);
        self.protocols.applied(locks.rules());
        if let Err(e) = self.identity.adopt(locks.cluster()) {
            // The peer checks keep another history out of the log; this is
            // the last word if one got in anyway.
            tracing::error!("the applied table's cluster id: {e}");
        }
    }
}

#[derive(Clone)]
pub(crate) struct StateMachineStore {
    applied: Arc<Applied>,
    snapshots: SnapshotFile,
    /// This node's id, on the audit lines of what it applies.
    node: NodeId,
}

impl StateMachineStore {
    /// Open the state machine, restoring the last stored snapshot if any.
    pub(crate) fn open(
        snapshots: SnapshotFile,
        metrics: LockMetrics,
        protocols: Arc<Protocols>,
        identity: Arc<Identity>,
        node: NodeId,
    ) -> Result<Self, StorageError> {
        let mut state = AppliedState::default();
        if let Some(snap) = snapshots.read()? {
            restore(&mut state, &snap)?;
        }
        let index = watch::Sender::new(state.applied_index());
        let applied = Applied { state: Mutex::new(state), index, metrics, protocols, identity };
        applied.table_changed(&applied.lock().locks);
        Ok(Self { applied: Arc::new(applied), snapshots, node })
    }

    pub(crate) fn applied(&self) -> Arc<Applied> {
        self.applied.clone()
    }
}

/// Make `locks` the state of a restored cluster's first node (`snapshot
/// restore`): its snapshot, at index 1 of a log that starts after it, with
/// `members` as the voters. openraft opens such a data directory as an
/// initialized member whose log is purged up to the snapshot, so the
/// others (started empty) are sent the snapshot once this node leads.
pub(crate) fn seed(
    snapshots: &SnapshotFile,
    locks: &LockState,
    members: BTreeMap<NodeId, Member>,
) -> Result<(), StorageError> {
    let data =
        serde_json::to_vec(locks).map_err(|e| StorageError::IO { source: StorageIOError::write_snapshot(None, &e) })?;
    let log_id = LogId::new(CommittedLeaderId::new(0, 0), 1);
    let membership = Membership::new(vec![members.keys().copied().collect()], members);
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        snapshot_id: format!("restored-{}", locks.revision()),
    };
    snapshots.write(&StoredSnapshot { meta, data })
}

fn restore(state: &mut AppliedState, snap: &StoredSnapshot) -> Result<(), StorageError> {
    let unreadable =
        |e: AnyError| StorageError::IO { source: StorageIOError::read_snapshot(Some(snap.meta.signature()), e) };
    let locks: LockState = serde_json::from_slice(&snap.data).map_err(|e| unreadable(AnyError::new(&e)))?;
    known_rules(locks.rules()).map_err(|e| unreadable(AnyError::new(&e)))?;
    state.locks = locks;
    state.last_applied = snap.meta.last_log_id;
    state.membership = snap.meta.last_membership.clone();
    state.clock = LeaseClock::default();
    state.events = EventLog { events: VecDeque::new(), forgotten_through: state.locks.revision() };
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        // Only the copy is made under the lock and on this thread; encoding
        // megabytes of table (request ids fill it) on a runtime thread
        // stalled the node's Raft core and HTTP tasks long enough for
        // followers to campaign (bench/elections.rs).
        let (locks, last_log_id, last_membership) = {
            let s = self.applied.lock();
            (s.locks.clone(), s.last_applied, s.membership.clone())
        };
        let snapshot_id = last_log_id.map(|l| format!("{}-{}", l.leader_id.term, l.index)).unwrap_or_default();
        let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id };
        let snapshots = self.snapshots.clone();
        let stored_meta = meta.clone();
        let data = blocking(move || {
            let data = serde_json::to_vec(&locks)
                .map_err(|e| StorageError::IO { source: StorageIOError::write_snapshot(None, &e) })?;
            let stored = StoredSnapshot { meta: stored_meta, data };
            snapshots.write(&stored)?;
            Ok(stored.data)
        })
        .await?;
        Ok(RaftSnapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

/// A table or entry of rules this build does not know would be applied
/// wrongly: the node stops instead (`raft::guard` keeps such entries out of
/// the log from peers; this catches a log or snapshot a newer build wrote).
#[derive(Debug, thiserror::Error)]
#[error("rules {0} are newer than this build's ({RULES}): run a build that knows them")]
struct NewerRules(u32);

fn known_rules(rules: u32) -> Result<(), NewerRules> {
    if rules > RULES {
        return Err(NewerRules(rules));
    }
    Ok(())
}

/// Apply one command and feed its event to the clock, the event log and the
/// metrics; a state change's audit record goes to `changes`.
fn apply_one(
    s: &mut AppliedState,
    cmd: &Command,
    now: Instant,
    metrics: &LockMetrics,
    changes: &mut Vec<audit::Change>,
) -> Result<Outcome, NewerRules> {
    if let Command::Rules { version } = cmd {
        known_rules(*version)?;
    }
    // The owner of a lease this command ends, before it is gone.
    let owner = match cmd {
        Command::Release { lease_id, .. } | Command::Expire { lease_id } => {
            s.locks.lease(lease_id).map(|l| l.owner.clone())
        }
        _ => None,
    };
    let (outcome, event) = s.locks.apply(cmd);
    if let Some(e) = &event {
        let (key, token) = (e.key.clone(), e.token);
        let change = match (cmd, owner) {
            (Command::Acquire(a), _) => Some(audit::Change::Grant { owner: a.owner.clone(), key, token }),
            (Command::Release { by, .. }, Some(owner)) if *by != owner && !by.is_empty() => {
                Some(audit::Change::Revoke { by: by.clone(), owner, key, token })
            }
            (Command::Release { .. }, Some(owner)) => Some(audit::Change::Release { owner, key, token }),
            (Command::Expire { .. }, Some(owner)) => Some(audit::Change::Expire { owner, key, token }),
            _ => None,
        };
        changes.extend(change);
    }
    match cmd {
        Command::EndDelay { key, token } => s.clock.delay_ended(key, *token),
        Command::Compact { .. } => s.events.forget_through(s.locks.compacted_below()),
        Command::Rules { version } => {
            tracing::info!("the lock table is applied by rules {} from here on (asked: {version})", s.locks.rules())
        }
        _ => {}
    }
    if let Some(e) = event {
        match e.kind {
            EventKind::Granted { .. } => metrics.grants.inc(),
            EventKind::Released => metrics.releases.inc(),
            EventKind::Expired { .. } => metrics.expirations.inc(),
        }
        s.clock.observe(&e, now);
        s.events.push(e);
    }
    Ok(outcome)
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let s = self.applied.lock();
        Ok((s.last_applied, s.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Outcome>>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let now = Instant::now();
        let metrics = &self.applied.metrics;
        let mut out = Vec::new();
        let mut changes = Vec::new();
        let last = {
            let mut guard = self.applied.lock();
            let s = &mut *guard;
            for entry in entries {
                s.last_applied = Some(entry.log_id);
                let outcomes = match entry.payload {
                    EntryPayload::Blank => vec![],
                    EntryPayload::Membership(m) => {
                        s.membership = StoredMembership::new(Some(entry.log_id), m);
                        vec![]
                    }
                    EntryPayload::Normal(batch) => batch
                        .iter()
                        .map(|cmd| apply_one(s, cmd, now, metrics, &mut changes))
                        .collect::<Result<_, _>>()
                        .map_err(|e| StorageError::IO {
                            source: StorageIOError::apply(entry.log_id, AnyError::new(&e)),
                        })?,
                };
                out.push(outcomes);
            }
            self.applied.table_changed(&s.locks);
            s.applied_index()
        };
        crate::audit::applied(self.node, &changes);
        self.applied.index.send_replace(last);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let stored = StoredSnapshot { meta: meta.clone(), data: snapshot.into_inner() };
        let last = {
            let mut s = self.applied.lock();
            restore(&mut s, &stored)?;
            self.applied.table_changed(&s.locks);
            s.applied_index()
        };
        let snapshots = self.snapshots.clone();
        blocking(move || snapshots.write(&stored)).await?;
        self.applied.index.send_replace(last);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let snapshots = self.snapshots.clone();
        let stored = blocking(move || snapshots.read()).await?;
        Ok(stored.map(|s| RaftSnapshot { meta: s.meta, snapshot: Box::new(Cursor::new(s.data)) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_of_rules_newer_than_the_builds_is_refused() {
        let mut state = AppliedState::default();
        let mut table = serde_json::to_value(LockState::default()).unwrap();
        for (rules, taken) in [(RULES + 1, false), (RULES, true)] {
            table["rules"] = rules.into();
            let snap = StoredSnapshot { meta: SnapshotMeta::default(), data: serde_json::to_vec(&table).unwrap() };
            let r = restore(&mut state, &snap);
            assert_eq!(r.is_ok(), taken, "rules {rules}: {r:?}");
            assert_eq!(state.locks.rules(), if taken { rules } else { 0 }, "a refused table is not taken");
        }
    }
}
