//! The lifecycle arms (issue 34): the operator's rare actions in the middle
//! of the workload (holders pausing past their TTL, writes through a
//! sidecar), with the checker watching the whole history:
//!
//! - a backup taken, more grants, the cluster lost, disks and all, and
//!   `snapshot restore` with the lowest `--min-token` the tool takes, the
//!   cluster started again; then a node of another cluster offered to
//!   `member add`. The sidecar runs through all of it.
//! - the control: the same schedule, but the cluster is rebuilt empty
//!   instead of restored (its tokens start again low, as a restore that
//!   re-grants does) and the workload writes straight to the upstream. The
//!   checker must see tokens granted twice and stale writes applied.
//!
//! Checked: no token granted twice, and grant order, over the whole history
//! (L1); the upstream applied each key's writes in token order (S1/S2).
//! Not checked here: durability (a restore forgets what came after its
//! backup, by design; it only promises higher tokens) and exclusion (a
//! holder of the lost cluster still counts its lease valid for its TTL
//! while the new cluster grants the key: the sidecar's floors keep its
//! writes out, which is what `upstream_order` checks).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fencegate_client::wire::{AddMember, ErrorCode};
use fencegate_client::ClientError;
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::{bin, Bin, Cluster, Upstream};
use tokio::time::Instant;

use fencegate_testkit::verify::checker;
use fencegate_testkit::verify::history::History;
use fencegate_testkit::verify::summary::Arm;
use fencegate_testkit::verify::workload::{self, Workload};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Backup,
    /// The cluster lost and restored from the backup.
    Restore,
    /// The control's: the cluster lost and rebuilt empty.
    RebuiltEmpty,
    /// A node of another cluster refused by `member add`.
    ForeignNodeRefused,
    /// ... or not: a violation of its own (L7).
    ForeignNodeAccepted,
}

const NODE_YAML: &str =
    "raft: { heartbeat: 50ms, election_timeout_min: 200ms, election_timeout_max: 400ms, propose_timeout: 2s }\n";

fn workload() -> Workload {
    Workload { workers: 4, keys: 3, writes: 3, ttl: Duration::from_millis(1500), pause_probability: 0.15 }
}

/// `restore`: the arm; `false`: its control.
pub async fn arm(restore: bool, seconds: u64, seed: u64) -> Arm<Fault> {
    let w = workload();
    let bin = bin!();
    let mut c = Cluster::start(&bin, 3, NODE_YAML).await;
    let up = Upstream::start().await;
    let routes = table(&[
        rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]).timeout("5s"),
        everything_else(),
    ]);
    let sc = match restore {
        true => Some(c.sidecar("sidecar", &up.url(), &routes).await),
        false => None,
    };
    let target = sc.as_ref().map_or(up.url(), |s| s.url());
    let history = Arc::new(History::new());
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let work = tokio::spawn(workload::run(w, history.clone(), c.client(), target, seed, "", until));
    let mut faults = BTreeMap::new();
    let mut violations = vec![];
    let at = |fraction: u64| start + Duration::from_secs(seconds) * fraction as u32 / 10;

    tokio::time::sleep_until(at(2)).await;
    let backup = c.dir().join("lifecycle.fgsnap");
    let args = ["snapshot", "save", backup.to_str().unwrap(), "--endpoints", &c.urls().join(",")].map(String::from);
    let out = run(&bin, args.to_vec()).await;
    assert_eq!(out.code, 0, "snapshot save: {}{}", out.stdout, out.stderr);
    *faults.entry(Fault::Backup).or_default() += 1;

    tokio::time::sleep_until(at(4)).await;
    c.kill_all();
    for id in c.ids() {
        std::fs::remove_dir_all(c.data_dir(id)).unwrap();
    }
    if restore {
        let config = c.config_path(1).to_str().unwrap().to_string();
        let args = ["snapshot", "restore", backup.to_str().unwrap(), "--config", &config, "--min-token", "1"];
        let out = run(&bin, args.map(String::from).to_vec()).await;
        assert_eq!(out.code, 0, "snapshot restore: {}{}", out.stdout, out.stderr);
    }
    *faults.entry(if restore { Fault::Restore } else { Fault::RebuiltEmpty }).or_default() += 1;
    c.start_all();

    tokio::time::sleep_until(at(6)).await;
    match foreign_node(&bin, &mut c).await {
        Ok(()) => *faults.entry(Fault::ForeignNodeRefused).or_default() += 1,
        Err(why) => {
            *faults.entry(Fault::ForeignNodeAccepted).or_default() += 1;
            violations.push(why);
        }
    }
    work.await.unwrap();

    let keys: Vec<String> = (0..w.keys).map(|k| format!("rack/{k}")).collect();
    let ops = history.ops();
    let reports = vec![
        checker::token_order(&ops),
        checker::upstream_order(&workload::applied(&up, &keys)),
        checker::Report { name: "a foreign node refused (L7)", violations },
    ];
    let name = if restore { "lifecycle (restore, sidecar)" } else { "control (rebuilt empty, no sidecar)" };
    Arm { name, history, faults, reports, window_ms: None }
}

/// `bin args` off the runtime's threads (it waits for the process).
async fn run(bin: &Bin, args: Vec<String>) -> fencegate_testkit::binary::Output {
    let bin = bin.clone();
    tokio::task::spawn_blocking(move || bin.run(&args, Duration::from_secs(60))).await.unwrap()
}

/// Node 4 of cluster `c` started on the data directory of node 4 of another
/// cluster, and offered to `member add`: `Ok` if it is refused as a node of
/// another cluster, `Err` (a violation) if it is added.
async fn foreign_node(bin: &Bin, c: &mut Cluster) -> Result<(), String> {
    let mut b = Cluster::start(bin, 4, NODE_YAML).await;
    let lease = b.client().acquire("rack/b", fencegate_client::AcquireOptions::new(Duration::from_secs(5))).await;
    lease.map_err(|e| format!("cluster B grants nothing: {e}"))?;
    b.wait_for_applied(4, 1, Duration::from_secs(20)).await;
    b.kill_all();
    let from = b.data_dir(4);
    let id = c.add_node().await;
    c.kill(id);
    let to = c.data_dir(id);
    let _ = std::fs::remove_dir_all(&to);
    fencegate_testkit::files::copy_dir(&from, &to);
    drop(b);
    c.start_node(id);
    let add = AddMember { id, peer_url: c.peer_url(id), client_url: Some(c.url(id)), force: false };
    let answer = tokio::time::timeout(Duration::from_secs(30), c.client().add_member(&add)).await;
    c.drop_node(id);
    match answer {
        Ok(Err(ClientError::Refused { error: ErrorCode::ForeignCluster, .. })) => Ok(()),
        other => Err(format!("node {id}, of another cluster, offered to member add: {other:?}")),
    }
}
