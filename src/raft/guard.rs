//! Sanity checks on the Raft RPCs a node receives, before openraft sees them.
//!
//! openraft trusts its peers: a term near `u64::MAX` makes it panic on
//! overflow at the next election, entries that are not consecutive break its
//! log, and a membership of thousands of nodes or of URLs that are none
//! would be dialled for ever. Whatever arrives
//! on the peer plane is checked here first; a refusal is an error answer and
//! a log line, never a panic. Pure: the caller passes who the members are.
//!
//! These checks bound the damage of a malformed RPC; they do not make a
//! forged one harmless (authenticating peers does that).
//!
//! What is checked: the sender is a member and not this node; terms and
//! indices are below 2^62; log ids lie within the RPC's term; entries are
//! consecutive and their count bounded; commands are valid; a membership
//! has at most 16 nodes, with URLs that are URLs (it may name nodes not
//! known yet: that is how an added member arrives); no entry moves the
//! table to rules newer than this build's. `tests/e2e/attacks.rs` sends such
//! RPCs to a real cluster and fails without this module. Not
//! authentication: that is `server::raft_rpc`'s certificate check, or the
//! peer secret.

use openraft::{EntryPayload, Membership};

use super::types::{Entry, LogId, Member, NodeId, TypeConfig, Vote};
use crate::lock::state::{Command, RULES};
use crate::lock::validate;

/// The largest term or log index accepted: far beyond any real cluster's
/// (2^62 elections), and far enough from `u64::MAX` that nothing overflows.
pub(crate) const MAX_TERM: u64 = 1 << 62;
pub(crate) const MAX_INDEX: u64 = 1 << 62;
/// Entries in one append: the leader sends at most `max_payload_entries`.
pub(crate) const MAX_ENTRIES: usize = 1024;
/// Commands in one entry (`server::proposer` packs at most a few hundred).
pub(crate) const MAX_COMMANDS: usize = 4096;
/// Nodes (voters and learners) in one membership: a cluster has 3 to 5
/// voters, a learner or two while one is added.
pub(crate) const MAX_MEMBERS: usize = 16;
/// The longest member URL.
pub(crate) const MAX_URL: usize = 1024;
/// The largest snapshot offset: a snapshot is the JSON of the lock table.
pub(crate) const MAX_SNAPSHOT_BYTES: u64 = 1 << 32;

/// Who may speak Raft to this node: the configured members, never itself.
pub struct Peers<'a> {
    pub me: NodeId,
    pub members: &'a (dyn Fn(NodeId) -> bool + Sync),
}

impl Peers<'_> {
    fn sender(&self, id: NodeId) -> Result<(), String> {
        if id == self.me {
            return Err(format!("claims to come from this node ({id})"));
        }
        if !(self.members)(id) {
            return Err(format!("claims to come from node {id}, which is not a member"));
        }
        Ok(())
    }
}

fn vote(v: &Vote, peers: &Peers) -> Result<(), String> {
    if v.leader_id.term > MAX_TERM {
        return Err(format!("term {} is beyond {MAX_TERM}", v.leader_id.term));
    }
    peers.sender(v.leader_id.node_id)
}

/// A log id that the RPC's own vote could have produced.
fn log_id(what: &str, l: &LogId, v: &Vote) -> Result<(), String> {
    if l.leader_id.term > v.leader_id.term {
        return Err(format!("{what} has term {} above the RPC's term {}", l.leader_id.term, v.leader_id.term));
    }
    if l.index > MAX_INDEX {
        return Err(format!("{what} has index {} beyond {MAX_INDEX}", l.index));
    }
    // The leader a log id names may be long gone: members change.
    Ok(())
}

/// A membership may name nodes this one does not know yet: that is how a
/// member added by `member add` arrives. It is bounded, and its URLs are
/// URLs.
fn membership(m: &Membership<NodeId, Member>) -> Result<(), String> {
    let n = m.nodes().count();
    if n > MAX_MEMBERS {
        return Err(format!("a membership of {n} nodes (at most {MAX_MEMBERS})"));
    }
    for (id, node) in m.nodes() {
        for url in [&node.peer_url, &node.client_url] {
            let plausible = url.is_empty()
                || (url.len() <= MAX_URL
                    && (url.starts_with("http://") || url.starts_with("https://"))
                    && url.chars().all(|c| c.is_ascii_graphic()));
            if !plausible {
                return Err(format!(
                    "a membership gives node {id} a URL that is none: {:?}",
                    url.chars().take(80).collect::<String>()
                ));
            }
        }
    }
    Ok(())
}

fn commands(cmds: &[Command]) -> Result<(), String> {
    if cmds.len() > MAX_COMMANDS {
        return Err(format!("an entry carries {} commands (at most {MAX_COMMANDS})", cmds.len()));
    }
    for c in cmds {
        let checked = match c {
            Command::Acquire(a) => validate::key(&a.key)
                .and_then(|()| validate::holder(&a.holder))
                // Empty: written before owners existed.
                .and_then(|()| if a.owner.is_empty() { Ok(()) } else { validate::holder(&a.owner) }),
            Command::EndDelay { key, .. } => validate::key(key),
            // `through` is capped at the table's revision when applied.
            Command::Release { .. } | Command::Expire { .. } | Command::Compact { .. } => Ok(()),
            // Rules this build does not know would be applied wrongly: the
            // entry is refused, and this node stays behind until upgraded.
            Command::Rules { version } if *version > RULES => {
                return Err(format!(
                    "an entry moves to rules {version}, newer than this build's ({RULES}): upgrade this node"
                ))
            }
            Command::Rules { .. } => Ok(()),
            Command::Identify { cluster } if !super::identity::valid(cluster) => {
                return Err(format!("an entry identifies the cluster as {cluster:?}, which is no cluster id"))
            }
            Command::Identify { .. } => Ok(()),
        };
        checked.map_err(|e| format!("an entry carries a bad command: {e}"))?;
    }
    Ok(())
}

pub(crate) fn vote_request(rpc: &openraft::raft::VoteRequest<NodeId>, peers: &Peers) -> Result<(), String> {
    vote(&rpc.vote, peers)?;
    rpc.last_log_id.as_ref().map_or(Ok(()), |l| log_id("last_log_id", l, &rpc.vote))
}

pub(crate) fn append_request(
    rpc: &openraft::raft::AppendEntriesRequest<TypeConfig>,
    peers: &Peers,
) -> Result<(), String> {
    vote(&rpc.vote, peers)?;
    if let Some(p) = &rpc.prev_log_id {
        log_id("prev_log_id", p, &rpc.vote)?;
    }
    if let Some(c) = &rpc.leader_commit {
        log_id("leader_commit", c, &rpc.vote)?;
    }
    if rpc.entries.len() > MAX_ENTRIES {
        return Err(format!("{} entries in one append (at most {MAX_ENTRIES})", rpc.entries.len()));
    }
    // Consecutive from just after prev_log_id, terms never going down.
    let mut expected = rpc.prev_log_id.map_or(0, |p| p.index + 1);
    let mut term = rpc.prev_log_id.map_or(0, |p| p.leader_id.term);
    for e in &rpc.entries {
        entry(e, expected, term, &rpc.vote)?;
        expected = e.log_id.index + 1;
        term = e.log_id.leader_id.term;
    }
    Ok(())
}

fn entry(e: &Entry, expected: u64, term: u64, v: &Vote) -> Result<(), String> {
    log_id("an entry", &e.log_id, v)?;
    if e.log_id.index != expected {
        return Err(format!("entry index {} where {expected} comes next", e.log_id.index));
    }
    if e.log_id.leader_id.term < term {
        return Err(format!("entry {} has a term below the one before it", e.log_id.index));
    }
    match &e.payload {
        EntryPayload::Blank => Ok(()),
        EntryPayload::Normal(cmds) => commands(cmds),
        EntryPayload::Membership(m) => membership(m),
    }
}

pub(crate) fn snapshot_request(
    rpc: &openraft::raft::InstallSnapshotRequest<TypeConfig>,
    peers: &Peers,
) -> Result<(), String> {
    vote(&rpc.vote, peers)?;
    if let Some(l) = &rpc.meta.last_log_id {
        log_id("the snapshot's last_log_id", l, &rpc.vote)?;
    }
    membership(rpc.meta.last_membership.membership())?;
    let end = rpc.offset.checked_add(rpc.data.len() as u64);
    if end.is_none_or(|end| end > MAX_SNAPSHOT_BYTES) {
        return Err(format!("a snapshot chunk at offset {} beyond {MAX_SNAPSHOT_BYTES} bytes", rpc.offset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use openraft::raft::{AppendEntriesRequest, VoteRequest};
    use openraft::{CommittedLeaderId, LeaderId};

    use super::*;
    use crate::lock::state::AcquireCmd;

    fn members(id: NodeId) -> bool {
        [1, 2, 3].contains(&id)
    }
    const PEERS: Peers = Peers { me: 1, members: &members };

    fn v(term: u64, node: NodeId) -> Vote {
        Vote { leader_id: LeaderId { term, node_id: node }, committed: true }
    }
    fn lid(term: u64, node: NodeId, index: u64) -> LogId {
        LogId { leader_id: CommittedLeaderId::new(term, node), index }
    }
    fn blank(l: LogId) -> Entry {
        Entry { log_id: l, payload: EntryPayload::Blank }
    }
    fn append(vote: Vote, prev: Option<LogId>, entries: Vec<Entry>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest { vote, prev_log_id: prev, entries, leader_commit: prev }
    }
    fn acquire(key: &str) -> Entry {
        let a = AcquireCmd {
            key: key.into(),
            owner: "o".into(),
            holder: "h".into(),
            ttl_ms: 1000,
            lock_delay_ms: 0,
            lease_id: "l".into(),
            request_id: None,
        };
        Entry { log_id: lid(5, 2, 8), payload: EntryPayload::Normal(vec![Command::Acquire(a)]) }
    }

    #[test]
    fn well_formed_rpcs_pass() {
        let rpc = VoteRequest { vote: v(5, 2), last_log_id: Some(lid(4, 3, 7)) };
        assert_eq!(vote_request(&rpc, &PEERS), Ok(()));
        let rpc = append(v(5, 2), Some(lid(4, 3, 7)), vec![acquire("rack/1"), blank(lid(5, 2, 9))]);
        assert_eq!(append_request(&rpc, &PEERS), Ok(()));
        // A fresh follower's first append: the bootstrap entry has openraft's
        // default log id, which names node 0.
        assert_eq!(append_request(&append(v(1, 2), None, vec![blank(lid(0, 0, 0))]), &PEERS), Ok(()), "a first append");
        assert_eq!(append_request(&append(v(1, 2), Some(lid(0, 0, 0)), vec![]), &PEERS), Ok(()));
    }

    /// Every hostile RPC is refused, each for its own reason.
    #[test]
    fn hostile_rpcs_are_refused() {
        let last = Some(lid(4, 3, 7));
        for (rpc, says) in [
            (VoteRequest { vote: v(u64::MAX, 2), last_log_id: last }, "term"),
            (VoteRequest { vote: v(MAX_TERM + 1, 2), last_log_id: last }, "term"),
            (VoteRequest { vote: v(5, 9), last_log_id: last }, "not a member"),
            (VoteRequest { vote: v(5, 1), last_log_id: last }, "this node"),
            (VoteRequest { vote: v(5, 2), last_log_id: Some(lid(6, 3, 7)) }, "above the RPC's term"),
            (VoteRequest { vote: v(5, 2), last_log_id: Some(lid(4, 3, u64::MAX)) }, "index"),
        ] {
            let e = vote_request(&rpc, &PEERS).unwrap_err();
            assert!(e.contains(says), "{rpc:?}: {e}");
        }
        let mut many_commands = acquire("rack/1");
        if let EntryPayload::Normal(c) = &mut many_commands.payload {
            *c = vec![c[0].clone(); MAX_COMMANDS + 1];
        }
        let crowd = Membership::<NodeId, Member>::new(vec![(1..=MAX_MEMBERS as u64 + 1).collect()], None);
        let bad_url = Member { peer_url: "file:///etc/passwd".into(), ..Default::default() };
        let nodes = std::collections::BTreeMap::from([(1, Member::default()), (2, bad_url)]);
        let odd = Membership::<NodeId, Member>::new(vec![BTreeSet::from([1, 2])], nodes);
        for (rpc, says) in [
            (append(v(u64::MAX, 2), last, vec![]), "term"),
            (append(v(5, 7), last, vec![]), "not a member"),
            (append(v(5, 2), last, vec![blank(lid(5, 2, 9))]), "where 8 comes next"),
            (append(v(5, 2), last, vec![blank(lid(5, 2, 8)), blank(lid(5, 2, 8))]), "where 9 comes next"),
            (append(v(5, 2), last, vec![blank(lid(3, 2, 8))]), "below the one before"),
            (append(v(5, 2), last, vec![blank(lid(6, 2, 8))]), "above the RPC's term"),
            (append(v(5, 2), last, vec![acquire("rack//1")]), "bad command"),
            (append(v(5, 2), last, vec![many_commands]), "commands"),
            (
                append(v(5, 2), last, vec![Entry { log_id: lid(5, 2, 8), payload: EntryPayload::Membership(crowd) }]),
                "17 nodes",
            ),
            (
                append(v(5, 2), last, vec![Entry { log_id: lid(5, 2, 8), payload: EntryPayload::Membership(odd) }]),
                "a URL that is none",
            ),
            (append(v(5, 2), last, (8..8 + MAX_ENTRIES as u64 + 1).map(|i| blank(lid(5, 2, i))).collect()), "entries"),
        ] {
            let e = append_request(&rpc, &PEERS).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
