//! Online membership changes, on the leader: `GET /v1/members` lists,
//! `POST /v1/members` adds, `DELETE /v1/members/{id}` removes; and the
//! leadership handover that removing the leader and a graceful stop use.
//!
//! A node is added as a learner, and made a voter (openraft's joint
//! consensus) only once it holds the leader's log. A change is refused
//! (`409 membership_refused`) if the voters after it would not have a live
//! majority — counting the leader, the voters that answer it now, and a new
//! member once it has caught up — unless forced: e.g. removing a second
//! node of three while one is down. Members carry their URLs in the
//! membership, so no other node's config changes.
//!
//! Handover: openraft 0.9 has no transfer call, and a node refuses votes
//! while it has heard from a leader within `election_timeout_max`. But the
//! leader's own vote only dates from its election, so it grants one to an
//! up-to-date candidate: the leader stops proposing and heartbeating, waits
//! for a voter to hold its whole log, and asks it to campaign (`POST
//! /raft/campaign`). In a cluster of three that vote is a majority at once;
//! with five, the candidate (or another voter) wins once the others' view
//! of the old leader has run out (within `election_timeout_max`).

use std::collections::BTreeSet;
use std::time::Duration;

use fencegate_client::wire::{AddMember, ClusterInfo, MemberList, MemberState};
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;
use tokio::time::Instant;

use super::error::ApiError;
use super::Node;
use crate::raft::types::{Member, Membership, NodeId};

/// The longest a new member may take to catch up before it is promoted.
pub(crate) const CATCH_UP: Duration = Duration::from_secs(120);
/// How long a member has to answer the leader's liveness probe.
const PROBE: Duration = Duration::from_millis(800);
/// How long `member add` waits for a node to add to answer at all.
const STARTING: Duration = Duration::from_secs(10);
/// How long a handover may take: a target catching up, then its election.
const HANDOVER: Duration = Duration::from_secs(3);

pub(crate) const CAMPAIGN_PATH: &str = "/raft/campaign";

/// The members, as the leader sees them: roles, URLs, how far each has
/// replicated, and whether it answers.
pub(crate) async fn list(node: &Node) -> MemberList {
    let m = node.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership().clone();
    let live = live(node, &membership).await;
    let replicated = m.replication.clone().unwrap_or_default();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let state = |id: NodeId, role: &str| {
        let entry = membership.get_node(&id).cloned().unwrap_or_default();
        let peer = node.peer(id).map(|p| p.url).unwrap_or_default();
        let client_url =
            Some(entry.client_url).filter(|u| !u.is_empty()).or_else(|| node.config.clients.get(&id).cloned());
        let matched = match id == node.id {
            true => m.last_log_index,
            false => replicated.get(&id).and_then(|l| l.map(|l| l.index)),
        };
        MemberState {
            id,
            role: role.into(),
            peer_url: peer,
            client_url,
            matched_index: matched,
            reachable: live.contains(&id),
        }
    };
    let mut members: Vec<MemberState> = voters.iter().map(|id| state(*id, "voter")).collect();
    members.extend(membership.learner_ids().map(|id| state(id, "learner")));
    MemberList {
        leader: node.id,
        last_log_index: m.last_log_index.unwrap_or(0),
        changing: membership.get_joint_config().len() > 1,
        members,
    }
}

/// The members that answer the leader now (itself included): each asked
/// for `/v1/cluster` on its peer plane, all at once, within `PROBE`.
async fn live(node: &Node, membership: &Membership) -> BTreeSet<NodeId> {
    let probes = membership.nodes().map(|(id, _)| *id).filter(|id| *id != node.id).map(|id| async move {
        let peer = node.peer(id)?;
        let url = format!("{}{}", peer.url, fencegate_client::wire::CLUSTER_PATH);
        let answer = peer.http.call(hyper::Method::GET, &url, None, PROBE).await.ok()?;
        serde_json::from_slice::<ClusterInfo>(&answer.body).ok().filter(|c| c.id == id).map(|_| id)
    });
    let mut live: BTreeSet<NodeId> = futures_util::future::join_all(probes).await.into_iter().flatten().collect();
    live.insert(node.id);
    live
}

/// Refuse unless a majority of `voters` is live (or the change is forced).
fn quorum(voters: &BTreeSet<NodeId>, live: &BTreeSet<NodeId>, force: bool, change: &str) -> Result<(), ApiError> {
    let have = voters.intersection(live).count();
    let need = voters.len() / 2 + 1;
    if have >= need || force {
        return Ok(());
    }
    let down: Vec<String> = voters.difference(live).map(|id| id.to_string()).collect();
    Err(ApiError::MembershipRefused(format!(
        "{change} would leave voters {voters:?} with {have} live of the {need} a majority needs (not answering: {}); \
         bring them back first, or force it",
        down.join(", ")
    )))
}

fn refused(e: RaftError<NodeId, ClientWriteError<NodeId, Member>>) -> ApiError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
            ApiError::NoLeader("this node stopped being the leader; retry".into())
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => match c {
            ChangeMembershipError::InProgress(_) => {
                ApiError::MembershipRefused("another membership change is in progress; retry when it is done".into())
            }
            other => ApiError::MembershipRefused(other.to_string()),
        },
        other => ApiError::Unavailable(format!("{other}; the change may or may not have been made: list the members")),
    }
}

/// The member an add names (its URLs parsed, `https://` with `tls`), as
/// the membership will carry it; a node id of 0 or a URL that is none is
/// refused.
pub fn member_of(add: &AddMember, tls: bool) -> Result<Member, ApiError> {
    if add.id == 0 {
        return Err(ApiError::BadRequest("node ids start at 1".into()));
    }
    let peer_url =
        crate::config::endpoint_url("peer_url", &add.peer_url, tls).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let client_url = match &add.client_url {
        Some(u) => crate::config::endpoint_url("client_url", u, tls)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?
            .to_string(),
        None => String::new(),
    };
    Ok(Member {
        peer_url: peer_url.to_string().trim_end_matches('/').to_string(),
        client_url: client_url.trim_end_matches('/').to_string(),
    })
}

pub(crate) async fn add(node: &Node, add: AddMember) -> Result<MemberList, ApiError> {
    let member = member_of(&add, node.tls)?;
    let membership = node.raft.metrics().borrow().membership_config.membership().clone();
    let mut voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    if voters.contains(&add.id) {
        // A retry of an add that went through is answered as it was.
        if membership.get_node(&add.id) == Some(&member) {
            return Ok(list(node).await);
        }
        return Err(ApiError::MembershipRefused(format!("node {} is already a voter (remove it first)", add.id)));
    }
    voters.insert(add.id);
    let mut live = live(node, &membership).await;
    live.insert(add.id); // it only becomes a voter once caught up
    quorum(&voters, &live, add.force, &format!("adding node {}", add.id))?;
    same_history(node, add.id, &member).await?;

    tracing::info!(id = add.id, url = %member.peer_url, "adding a member: a learner until it has caught up");
    node.raft.add_learner(add.id, member, false).await.map_err(refused)?;
    caught_up(node, add.id, CATCH_UP)
        .await
        .map_err(|e| ApiError::Unavailable(format!("{e}; it stays a learner: add it again to retry, or remove it")))?;
    tracing::info!(id = add.id, "the new member has caught up: making it a voter");
    node.raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([add.id])), false).await.map_err(refused)?;
    Ok(list(node).await)
}

/// Refuse to add node `id` unless it answers at `member`'s peer URL as that
/// node and holds no other history: no cluster id but this one, and no log
/// at all if it has none (a data directory of another cluster, or of a
/// build before cluster ids). Asked before the learner is added, so that
/// nothing of this cluster is sent to it, and nothing of its log is ever
/// taken for this cluster's.
async fn same_history(node: &Node, id: NodeId, member: &Member) -> Result<(), ApiError> {
    let refused = |why: String| ApiError::ForeignCluster(format!("not adding node {id}: {why}"));
    let Some(peer) = node.directory.peer(id, Some(member)) else { return Err(refused("no peer URL for it".into())) };
    let url = format!("{}{}", peer.url, fencegate_client::wire::CLUSTER_PATH);
    // A node started a moment ago may not listen yet.
    let deadline = Instant::now() + STARTING;
    let answer = loop {
        match peer.http.call(hyper::Method::GET, &url, None, PROBE).await {
            Ok(answer) => break answer,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => {
                return Err(ApiError::MembershipRefused(format!(
                    "node {id} does not answer at {url} ({e}): start it first, so that its history can be checked"
                )))
            }
        }
    };
    let info: ClusterInfo = serde_json::from_slice(&answer.body)
        .map_err(|e| refused(format!("{url} answered {} with no cluster view: {e}", answer.status)))?;
    if info.id != id {
        return Err(refused(format!("{url} is node {}", info.id)));
    }
    let mine = node.identity.get();
    crate::raft::identity::compatible(mine.as_deref(), info.cluster.as_deref()).map_err(|e| refused(e.to_string()))?;
    let holds_a_log = info.term > 0 || info.last_log_index > 0 || info.snapshot_index.is_some();
    if info.cluster.is_none() && holds_a_log {
        return Err(refused(format!(
            "its data directory holds a log (term {}, last index {}) with no cluster id: another cluster's, or \
             an older build's; give it an empty data_dir",
            info.term, info.last_log_index
        )));
    }
    Ok(())
}

/// Wait until member `id` holds the leader's log as of now.
async fn caught_up(node: &Node, id: NodeId, within: Duration) -> Result<(), String> {
    let target = node.raft.metrics().borrow().last_log_index;
    let deadline = Instant::now() + within;
    let mut metrics = node.raft.metrics();
    let mut reported = Instant::now();
    loop {
        let matched =
            metrics.borrow().replication.as_ref().and_then(|r| r.get(&id).cloned().flatten()).map(|l| l.index);
        if matched >= target {
            return Ok(());
        }
        if reported.elapsed() >= Duration::from_secs(5) {
            tracing::info!(id, ?matched, ?target, "new member catching up");
            reported = Instant::now();
        }
        match tokio::time::timeout_at(deadline, metrics.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err("the Raft core stopped".into()),
            Err(_) => {
                return Err(format!(
                    "node {id} did not catch up within {within:?} (it holds up to {matched:?} of {target:?})"
                ))
            }
        }
    }
}

pub(crate) async fn remove(node: &Node, id: NodeId, force: bool) -> Result<Removal, ApiError> {
    let membership = node.raft.metrics().borrow().membership_config.membership().clone();
    if membership.get_node(&id).is_none() {
        return Err(ApiError::MembershipRefused(format!("node {id} is not a member")));
    }
    let mut voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    if !voters.remove(&id) {
        tracing::info!(id, "removing a learner");
        node.raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await.map_err(refused)?;
        return Ok(Removal::Done(list(node).await));
    }
    if voters.is_empty() {
        return Err(ApiError::MembershipRefused(format!("node {id} is the only voter")));
    }
    let live = live(node, &membership).await;
    quorum(&voters, &live, force, &format!("removing node {id}"))?;
    if id == node.id {
        // The new leader makes the change: it is the one that stays.
        let to = handover(node, &live).await.map_err(ApiError::NoLeader)?;
        return Ok(Removal::HandedOver(to));
    }
    tracing::info!(id, "removing a voter");
    node.raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await.map_err(refused)?;
    Ok(Removal::Done(list(node).await))
}

pub(crate) enum Removal {
    Done(MemberList),
    /// This node was the one to remove: it handed leadership to this one,
    /// which is to be asked again.
    HandedOver(NodeId),
}

/// Hand leadership to a live voter that holds this node's whole log; the
/// new leader's id. Proposals are refused meanwhile (clients retry), so the
/// log stops growing under the target.
pub(crate) async fn handover(node: &Node, live: &BTreeSet<NodeId>) -> Result<NodeId, String> {
    let _paused = node.proposer.pause();
    // Without heartbeats the other voters' view of this leader runs out
    // within `election_timeout_max`, after which they vote too (a cluster
    // of five needs their votes). Back on whatever happens: a leader that
    // stays one must heartbeat.
    node.raft.runtime_config().heartbeat(false);
    let _beat = Heartbeat(&node.raft);
    let deadline = Instant::now() + HANDOVER;
    let result = async {
        // A batch proposed before the pause may still append an entry: the
        // target must hold that one too, or the old leader refuses its vote.
        while !node.proposer.idle() {
            if Instant::now() >= deadline {
                return Err("proposals still in flight".to_string());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut metrics = node.raft.metrics();
        let target = loop {
            let m = metrics.borrow().clone();
            if m.current_leader != Some(node.id) {
                return Err("this node is not the leader".to_string());
            }
            let voters: Vec<NodeId> =
                m.membership_config.membership().voter_ids().filter(|v| *v != node.id && live.contains(v)).collect();
            if voters.is_empty() {
                return Err("no other live voter to hand over to".to_string());
            }
            let replicated = m.replication.clone().unwrap_or_default();
            let matched = |v: &NodeId| replicated.get(v).cloned().flatten().map(|l| l.index);
            if let Some(v) = voters.into_iter().filter(|v| matched(v) >= m.last_log_index).max_by_key(matched) {
                break v;
            }
            if tokio::time::timeout_at(deadline, metrics.changed()).await.is_err() {
                return Err(format!("no live voter caught up within {HANDOVER:?}"));
            }
        };
        let peer = node.peer(target).ok_or_else(|| format!("no URL for node {target}"))?;
        let body = serde_json::to_vec(&serde_json::json!({ "leader": node.id })).expect("json");
        let asked =
            peer.http.call(hyper::Method::POST, &format!("{}{CAMPAIGN_PATH}", peer.url), Some(body), PROBE).await;
        match asked {
            Ok(a) if a.status.is_success() => {}
            Ok(a) => return Err(format!("node {target} refused to campaign: {}", String::from_utf8_lossy(&a.body))),
            Err(e) => return Err(format!("asking node {target} to campaign: {e}")),
        }
        let term = metrics.borrow().current_term;
        loop {
            let (leader, now) = (metrics.borrow().current_leader, metrics.borrow().current_term);
            if let Some(l) = leader.filter(|l| *l != node.id) {
                return Ok(l);
            }
            if leader == Some(node.id) && now > term {
                return Err(format!("node {target} did not win; this node was elected again"));
            }
            if tokio::time::timeout_at(deadline, metrics.changed()).await.is_err() {
                return Err(format!("node {target} was asked to campaign but no new leader within {HANDOVER:?}"));
            }
        }
    }
    .await;
    match &result {
        Ok(to) => tracing::info!(to, "leadership handed over"),
        Err(e) => tracing::warn!("handover failed: {e}"),
    }
    result
}

/// Turns the heartbeat back on when dropped.
struct Heartbeat<'a>(&'a crate::raft::types::Raft);

impl Drop for Heartbeat<'_> {
    fn drop(&mut self) {
        self.0.runtime_config().heartbeat(true);
    }
}

/// A member's request to campaign (`POST /raft/campaign`): only the
/// current leader may ask (with TLS, the one its certificate names).
pub(crate) async fn campaign(node: &Node, leader: NodeId, member: Option<NodeId>) -> Result<(), ApiError> {
    let from = member.unwrap_or(leader);
    if member.is_some_and(|m| m != leader) || node.leader() != Some(from) {
        return Err(ApiError::Forbidden(format!("only the current leader may ask for a campaign, not node {from}")));
    }
    tracing::info!(from, "campaigning: the leader hands over");
    node.raft.trigger().elect().await.map_err(|e| ApiError::Unavailable(e.to_string()))
}

/// A graceful stop: a leader hands over first, so that the cluster does not
/// wait out an election timeout for it (best effort: logged if it fails).
pub(crate) async fn step_down(node: &Node) {
    if node.leader() != Some(node.id) {
        return;
    }
    let membership = node.raft.metrics().borrow().membership_config.membership().clone();
    let live = live(node, &membership).await;
    let _ = handover(node, &live).await;
}
