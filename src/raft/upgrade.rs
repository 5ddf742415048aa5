//! When a cluster moves to newer rules (`lock::state::RULES`): only once
//! every member runs a build that knows them, so that no replica ever
//! applies a command by other rules than the rest.
//!
//! Every peer RPC carries the protocol its sender speaks now (`1 + rules` of
//! its applied table), and every answer the newest protocol its build
//! speaks (an older build sends none: protocol 1). A node refuses a request
//! of a newer protocol than its build's (`server::api`), so a member of an
//! older build cannot follow a cluster that moved on (it stays behind,
//! refusing, instead of applying a table it would misread). The leader
//! proposes `Command::Rules` when every other member's latest answer said it
//! speaks them; a member that has not answered since its last failed RPC,
//! or since this node began to lead, counts as not saying so.
//!
//! What it cannot see: a member restarted on an older build between two
//! answers, or added in the instant before the entry is proposed. Such a
//! member refuses what it cannot read (the entry, the protocol) and stays
//! behind; it cannot apply the table wrongly. A data directory this build
//! has opened is format 4, which older builds refuse to start on.
//!
//! `Protocols` holds both sides: the protocol this node sends (set by the
//! state machine) and what each member's latest answer said its build
//! speaks (forgotten when an RPC to it fails); `due` is the pure decision
//! the leader's keeper asks.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::types::NodeId;
use crate::lock::state::RULES;

/// The peer protocol a node whose table is applied by `rules` speaks.
pub(crate) fn protocol(rules: u32) -> u32 {
    1 + rules
}

/// The newest protocol this build speaks (and answers with).
pub(crate) const PROTOCOL: u32 = 1 + RULES;

/// What this node speaks, and what its peers said they speak.
#[derive(Debug, Default)]
pub(crate) struct Protocols {
    /// The rules of this node's applied table.
    rules: AtomicU32,
    /// Per member: the protocol its latest answer said its build speaks;
    /// absent after a failed RPC, until it answers again.
    heard: Mutex<HashMap<NodeId, u32>>,
}

impl Protocols {
    /// The state machine applied (or installed) a table of `rules`.
    pub(crate) fn applied(&self, rules: u32) {
        self.rules.store(rules, Ordering::Release);
    }

    /// The protocol this node's RPCs carry now.
    pub(crate) fn speaking(&self) -> u32 {
        protocol(self.rules.load(Ordering::Acquire))
    }

    /// Member `id` answered, saying it speaks `protocol` (1 if it said nothing).
    pub(crate) fn heard(&self, id: NodeId, protocol: u32) {
        self.heard.lock().unwrap_or_else(|p| p.into_inner()).insert(id, protocol);
    }

    /// An RPC to member `id` failed: it may have restarted on another build.
    pub(crate) fn lost(&self, id: NodeId) {
        self.heard.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// This node begins to lead: what members said while it followed (or
    /// led before) may be out of date, so it hears them afresh.
    pub(crate) fn leading(&self) {
        self.heard.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The leader's question: the rules to move the table to, if any.
    pub(crate) fn due(&self, me: NodeId, members: &BTreeSet<NodeId>, rules: u32) -> Option<u32> {
        due(me, members, rules, &self.heard.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// `RULES` if the table (of `rules`) is older and every member but `me`
/// (voters and learners) last said it speaks them.
fn due(me: NodeId, members: &BTreeSet<NodeId>, rules: u32, heard: &HashMap<NodeId, u32>) -> Option<u32> {
    let all_speak = members.iter().filter(|id| **id != me).all(|id| heard.get(id).is_some_and(|p| *p >= PROTOCOL));
    (rules < RULES && all_speak).then_some(RULES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_move_only_when_every_other_member_speaks_them() {
        let members: BTreeSet<NodeId> = [1, 2, 3].into();
        let heard = |h: &[(NodeId, u32)]| h.iter().copied().collect::<HashMap<_, _>>();
        let all_new = heard(&[(2, PROTOCOL), (3, PROTOCOL)]);
        assert_eq!(due(1, &members, 0, &all_new), Some(RULES));
        // Already there: nothing to propose.
        assert_eq!(due(1, &members, RULES, &all_new), None);
        // A member of an older build (it answers without a protocol: 1).
        assert_eq!(due(1, &members, 0, &heard(&[(2, PROTOCOL), (3, 1)])), None);
        // A member not heard from (down, or failed since it answered).
        assert_eq!(due(1, &members, 0, &heard(&[(2, PROTOCOL)])), None);
        // A learner counts as much as a voter: it is in `members`.
        let with_learner: BTreeSet<NodeId> = [1, 2, 3, 4].into();
        assert_eq!(due(1, &with_learner, 0, &all_new), None);
        // A single-node cluster has no one to wait for.
        assert_eq!(due(1, &[1].into(), 0, &HashMap::new()), Some(RULES));
    }

    #[test]
    fn a_failed_rpc_forgets_what_the_member_said() {
        let p = Protocols::default();
        let members: BTreeSet<NodeId> = [1, 2].into();
        p.heard(2, PROTOCOL);
        assert_eq!(p.due(1, &members, 0), Some(RULES));
        p.lost(2);
        assert_eq!(p.due(1, &members, 0), None);
        p.heard(2, PROTOCOL);
        p.leading();
        assert_eq!(p.due(1, &members, 0), None, "a new leader hears every member afresh");
        assert_eq!(p.speaking(), 1);
        p.applied(RULES);
        assert_eq!(p.speaking(), PROTOCOL);
    }
}
