//! Membership changes online, on real processes, while the torture
//! workload (acquires, fenced writes through a sidecar, pauses past the
//! TTL) runs the whole time; its history is checked at the end: no token
//! goes down, no stale write reaches the upstream, no acknowledged grant is
//! lost, no two holders overlap.
//!
//! 3 → 5 voters (two learners caught up and promoted), the leader removed
//! (it hands over first), back to 3, a dead node replaced by a fresh one at
//! a new address, and a removal refused because it would lose quorum.

// `liveness` is the torture suite's own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fencegate_client::wire::{AddMember, ErrorCode, MemberList};
use fencegate_client::{Client, ClientError};
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::verify::checker;
use fencegate_testkit::verify::history::{self, History};
use fencegate_testkit::verify::workload::{self, Workload};
use fencegate_testkit::{bin, Cluster, Upstream};
use tokio::time::Instant;

const NODE_YAML: &str =
    "raft: { heartbeat: 50ms, election_timeout_min: 200ms, election_timeout_max: 400ms, propose_timeout: 2s }\n";

fn voters(list: &MemberList) -> BTreeSet<u64> {
    list.members.iter().filter(|m| m.role == "voter").map(|m| m.id).collect()
}

async fn add(c: &Cluster, client: &Client, id: u64) -> MemberList {
    let add = AddMember { id, peer_url: c.peer_url(id), client_url: Some(c.url(id)), force: false };
    client.add_member(&add).await.unwrap_or_else(|e| panic!("adding node {id}: {e}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn members_change_under_load_without_a_violation() {
    let mut c = Cluster::start(&bin!(), 3, NODE_YAML).await;
    let up = Upstream::start().await;
    let routes = table(&[
        rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]).timeout("5s"),
        everything_else(),
    ]);
    let sc = c.sidecar("sidecar", &up.url(), &routes).await;
    let history = Arc::new(History::new());
    let w = Workload { workers: 4, keys: 3, writes: 3, ttl: Duration::from_millis(1500), pause_probability: 0.1 };
    let until = Instant::now() + Duration::from_secs(40);
    let work = tokio::spawn(workload::run(w, history.clone(), c.client(), sc.url(), 7, "", until));
    // Asked anew at each step: the cluster's nodes change.
    let admin = c.client();

    // 3 -> 5: each new node joins as a learner and votes once caught up.
    let four = c.add_node().await;
    let five = c.add_node().await;
    add(&c, &admin, four).await;
    let list = add(&c, &admin, five).await;
    assert_eq!(voters(&list), BTreeSet::from([1, 2, 3, 4, 5]), "{list:?}");
    assert!(!list.changing);
    // A retried add is answered as the first was.
    assert_eq!(voters(&add(&c, &admin, five).await), BTreeSet::from([1, 2, 3, 4, 5]));

    // Remove the leader: it hands over first, the new leader removes it.
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let list = admin.remove_member(leader, false).await.unwrap();
    assert_ne!(list.leader, leader, "the new leader answered");
    assert!(!voters(&list).contains(&leader), "{list:?}");
    c.drop_node(leader);

    // Back to 3: one more goes. The newest go first: the workload's client
    // and the sidecar know the three founding members only.
    let admin = c.client();
    let list = admin.members().await.unwrap();
    let newest = |list: &MemberList| *voters(list).iter().rev().find(|v| **v != list.leader).unwrap();
    let follower = newest(&list);
    let list = admin.remove_member(follower, false).await.unwrap();
    assert_eq!(voters(&list).len(), 3, "{list:?}");
    c.drop_node(follower);

    // Replace a dead node: it dies, it is removed, a fresh node (a new id
    // at a new address) takes its place.
    let admin = c.client();
    let list = admin.members().await.unwrap();
    let dead = newest(&list);
    c.kill(dead);
    let list = admin.members().await.unwrap();
    assert!(list.members.iter().any(|m| m.id == dead && !m.reachable), "the dead node shows as down: {list:?}");
    let list = admin.remove_member(dead, false).await.unwrap();
    assert_eq!(voters(&list).len(), 2);
    c.drop_node(dead);
    let fresh = c.add_node().await;
    let list = add(&c, &admin, fresh).await;
    assert_eq!(voters(&list).len(), 3, "{list:?}");
    assert!(voters(&list).contains(&fresh));

    // With one of three down, removing another would leave one live voter
    // of the two: refused, and nothing changes.
    let admin = c.client();
    let list = admin.members().await.unwrap();
    let down = newest(&list);
    let keep = *voters(&list).iter().find(|v| **v != list.leader && **v != down).unwrap();
    c.kill(down);
    match admin.remove_member(keep, false).await {
        Err(ClientError::Refused { error: ErrorCode::MembershipRefused, message, .. }) => {
            assert!(message.contains("majority"), "{message}")
        }
        other => panic!("removing a second node of three while one is down: {other:?}"),
    }
    assert_eq!(voters(&admin.members().await.unwrap()), voters(&list), "nothing changed");
    c.start_node(down);

    work.await.unwrap();
    let mut latest = BTreeMap::new();
    for k in 0..w.keys {
        let key = format!("rack/{k}");
        latest.insert(key.clone(), admin.read(&key).await.unwrap().token);
    }
    let applied: BTreeMap<String, Vec<u64>> = (0..w.keys)
        .map(|k| {
            let key = format!("rack/{k}");
            (key.clone(), up.tokens(&workload::path_of(&key)).into_iter().flatten().collect())
        })
        .collect();
    let ops = history.ops();
    let grants = ops.iter().filter(|op| matches!(op.kind, history::Kind::Acquire { .. })).count();
    assert!(grants > 20, "the workload ran: {grants} acquires");
    for report in [
        checker::upstream_order(&applied),
        checker::token_order(&ops),
        checker::durability(&ops, &latest),
        checker::exclusion(&ops),
    ] {
        assert!(report.violations.is_empty(), "{}: {:?}", report.name, report.violations);
    }
}

/// SIGTERM on the leader hands leadership over before the node exits,
/// instead of leaving the others to wait out an election timeout (the
/// defaults: 300-600 ms, and openraft's lease on top).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_on_the_leader_hands_over_first() {
    let mut c = Cluster::start(&bin!(), 3, "").await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let code = c.terminate(leader, Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "a graceful stop exits 0");
    let log = c.log_of(leader);
    assert!(log.contains("leadership handed over"), "{log}");
    // The new leader is in place (how fast, `bench/failover.rs` measures).
    let others: Vec<u64> = c.ids().into_iter().filter(|id| *id != leader).collect();
    let new = c.wait_for_leader_among(&others, Duration::from_secs(5)).await;
    assert_ne!(new, leader);
    let client = c.client();
    let lease = client.acquire("rack/after", fencegate_client::AcquireOptions::new(Duration::from_secs(5)));
    tokio::time::timeout(Duration::from_secs(5), lease).await.unwrap().unwrap();
}

/// A cluster moves its table to the newest rules (DESIGN, "Versions and
/// upgrades") only once every member has answered that it speaks them: with
/// node 3 cut off from its start, nodes 1 and 2 grant under rules 0 and stay
/// there; once 3 is reached, all three move, and the grants made before
/// are still remembered by their request ids.
#[tokio::test(flavor = "multi_thread")]
async fn the_rules_move_only_once_every_member_speaks_them() {
    use fencegate_testkit::cluster::ClusterOptions;
    let o = ClusterOptions { yaml: NODE_YAML.into(), isolated: vec![3], ..Default::default() };
    let c = Cluster::start_with(&bin!(), o).await;
    let leader = c.wait_for_leader_among(&[1, 2], Duration::from_secs(10)).await;
    let http = c.client_options().http_client(1 << 20).unwrap();
    // An acquire with a request id, as a retrying client sends it.
    let acquire = |key: &str, request_id: &str| {
        let url = format!("{}{}{key}", c.url(leader), fencegate_client::wire::LOCKS_PATH);
        let body = serde_json::json!({ "ttl_ms": 30_000, "request_id": request_id });
        let http = http.clone();
        async move {
            let a = http.call(hyper::Method::POST, &url, Some(body.to_string().into_bytes()), Duration::from_secs(5));
            let a = a.await.unwrap();
            assert_eq!(a.status, hyper::StatusCode::OK, "{}", String::from_utf8_lossy(&a.body));
            serde_json::from_slice::<fencegate_client::wire::Granted>(&a.body).unwrap()
        }
    };
    let first = acquire("rack/rules", "before-the-move").await;
    let ended = acquire("rack/ended", "ended-before-the-move").await;
    let url = format!("{}{}{}", c.url(leader), fencegate_client::wire::LEASES_PATH, ended.lease_id);
    let released = http.call(hyper::Method::DELETE, &url, None, Duration::from_secs(5)).await.unwrap();
    assert_eq!(released.status, hyper::StatusCode::OK);
    // Several keeper rounds (every applied entry and every second).
    let until = Instant::now() + Duration::from_secs(3);
    for i in 0.. {
        for id in [1, 2] {
            let info = c.cluster_info(id).await.unwrap();
            assert_eq!(info.rules, 0, "node {id} moved on while node 3 was not heard from");
        }
        if Instant::now() > until {
            break;
        }
        acquire(&format!("rack/churn-{i}"), &format!("churn-{i}")).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.isolate(3, false);
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let mut rules = vec![];
        for id in c.ids() {
            rules.push(c.cluster_info(id).await.map(|i| i.rules));
        }
        if rules.iter().all(|r| *r == Some(2)) {
            break;
        }
        assert!(Instant::now() < until, "not every node moved to rules 2: {rules:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.log_of(leader).contains("every member speaks rules 2"), "{}", c.log_of(leader));
    // Retries of grants made under rules 0 still get them back: of a live
    // lease, and of one that ended (among the last 4,096 that did).
    assert_eq!(acquire("rack/rules", "before-the-move").await, first);
    assert_eq!(acquire("rack/ended", "ended-before-the-move").await, ended);
}

/// Over TLS on both planes: a member added later is certified by the
/// cluster CA as `fencegate-node-4`, and the others accept its certificate
/// once the membership names it.
#[tokio::test(flavor = "multi_thread")]
async fn a_member_added_over_tls_votes_and_serves() {
    use fencegate_testkit::cluster::{ClusterOptions, Security};
    let o = ClusterOptions { yaml: NODE_YAML.into(), security: Some(Security::default()), ..Default::default() };
    let mut c = Cluster::start_with(&bin!(), o).await;
    let four = c.add_node().await;
    let list = add(&c, &c.client(), four).await;
    assert_eq!(voters(&list), BTreeSet::from([1, 2, 3, four]), "{list:?}");
    assert!(list.members.iter().all(|m| m.reachable), "{list:?}");
    // A follower forwards leader calls on the peer plane with its own
    // certificate: the leader takes node 4's now.
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    assert_ne!(leader, four, "a fresh member does not lead yet");
    c.client_of(four).read("rack/tls").await.expect("a read forwarded by node 4");
    // Node 4's vote counts: with 1 and 2 down, 3 and 4 are no majority of
    // four; with 1 back, 1, 3 and 4 are one only with node 4, over TLS.
    c.kill(1);
    c.kill(2);
    let client = c.client_of(four);
    match client.acquire("rack/tls", fencegate_client::AcquireOptions::new(Duration::from_secs(5))).await {
        Err(ClientError::Unavailable(_)) => {} // 2 of 4 voters: no quorum, as it should be
        Ok(l) => panic!("two of four voters granted token {}", l.token()),
        Err(e) => panic!("two of four voters: {e}"),
    }
    c.start_node(1);
    let lease =
        client.acquire("rack/tls", fencegate_client::AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
    assert!(lease.token() > 0);
}

/// The cluster id `client`'s cluster takes within a few seconds of its
/// start (`None` from a build without them).
async fn cluster_id(client: &Client) -> Option<String> {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Some(id) = client.cluster().await.ok().and_then(|c| c.cluster) {
            return Some(id);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Node 4's data directory holds another cluster's history (it was node 4
/// of cluster B): adding it to cluster A is refused before anything is
/// sent to it (`foreign_cluster`, nothing changed), it keeps running, and a
/// Raft RPC that says it is of another cluster is refused by A's nodes
/// before openraft sees it. Without the check, such a node joined, panicked
/// in its log store and flapped A's leadership.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_of_another_cluster_cannot_join() {
    let bin = bin!();
    let mut a = Cluster::start(&bin, 3, NODE_YAML).await;
    let mut b = Cluster::start(&bin, 4, NODE_YAML).await;
    let b_client = b.client();
    let granted = b_client.acquire("rack/b", fencegate_client::AcquireOptions::new(Duration::from_secs(30))).await;
    granted.expect("cluster B grants");
    let (a_id, b_id) = (cluster_id(&a.client()).await, cluster_id(&b_client).await);
    b.wait_for_applied(4, 1, Duration::from_secs(20)).await;
    b.kill_all();

    // A's node 4 starts on a copy of B's node 4's data directory.
    let four = a.add_node().await;
    assert_eq!(four, 4);
    a.kill(four);
    let (from, to) = (b.data_dir(4), a.data_dir(four));
    let _ = std::fs::remove_dir_all(&to);
    fencegate_testkit::files::copy_dir(&from, &to);
    a.start_node(four);
    let add = AddMember { id: four, peer_url: a.peer_url(four), client_url: Some(a.url(four)), force: false };
    let admin = a.client();
    let until = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        match admin.add_member(&add).await {
            // Not up yet: it answers nothing.
            Err(ClientError::Refused { error: ErrorCode::MembershipRefused, .. }) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            other => break other,
        }
    };
    match refused {
        Err(ClientError::Refused { error: ErrorCode::ForeignCluster, message, .. }) => {
            let (a_id, b_id) = (a_id.as_deref().expect("A has an id"), b_id.as_deref().expect("B has an id"));
            assert_ne!(a_id, b_id);
            assert!(message.contains(b_id) && message.contains(a_id), "{message}")
        }
        other => panic!("node 4 of another cluster was not refused: {other:?}"),
    }
    let list = admin.members().await.unwrap();
    assert_eq!(voters(&list), BTreeSet::from([1, 2, 3]), "{list:?}");
    assert!(list.members.iter().all(|m| m.id != four), "added as a learner: {list:?}");
    assert!(a.is_running(four), "node 4 died: {}", a.log_of(four));
    assert!(!a.log_of(four).contains("panicked"), "{}", a.log_of(four));

    // A vote request of B's history, from a member's id, to A's node 1.
    let port: u16 = a.peer_url(1).rsplit(':').next().unwrap().parse().unwrap();
    let b_id = b_id.unwrap();
    let body = r#"{"vote":{"leader_id":{"term":99,"node_id":2},"committed":false},"last_log_id":null}"#;
    let request = format!(
        "POST /raft/vote HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{}: {b_id}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        fencegate_client::wire::CLUSTER_HEADER,
        body.len()
    );
    let answer = fencegate_testkit::http::raw_tcp(port, &request).await;
    assert!(answer.starts_with("HTTP/1.1 409") && answer.contains("foreign_cluster"), "{answer}");
    let term = a.client().cluster().await.unwrap().term;
    assert!(term < 99, "the foreign vote moved the term to {term}");
    // A still serves.
    let lease = a.client().acquire("rack/a", fencegate_client::AcquireOptions::new(Duration::from_secs(5))).await;
    lease.expect("cluster A grants");
}
