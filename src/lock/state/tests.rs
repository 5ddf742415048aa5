//! Unit and property tests of the lock table together with the lease clock,
//! driven by a simulated leader on a fake clock.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::*;
use crate::lock::clock::LeaseClock;

fn acquire(key: &str, lease: &str, ttl_ms: u64, delay_ms: u64, req: Option<&str>) -> Command {
    Command::Acquire(AcquireCmd {
        key: key.into(),
        owner: "owner".into(),
        holder: format!("holder-of-{key}"),
        ttl_ms,
        lock_delay_ms: delay_ms,
        lease_id: lease.into(),
        request_id: req.map(Into::into),
    })
}

fn granted(o: &Outcome) -> Option<&Grant> {
    match o {
        Outcome::Granted(g) => Some(g),
        _ => None,
    }
}

#[test]
fn grant_hold_release_regrant() {
    let mut s = LockState::default();
    let (o, ev) = s.apply(&acquire("rack/42", "L1", 1000, 0, None));
    assert_eq!(granted(&o).unwrap().token, 1, "the first grant's token is revision 1");
    assert_eq!(ev.unwrap().rev, 1);
    let (o, ev) = s.apply(&acquire("rack/42", "L2", 1000, 0, None));
    let holder = Some("holder-of-rack/42".into());
    assert_eq!(o, Outcome::Held { key: "rack/42".into(), holder, token: 1, lock_delay: false });
    assert!(ev.is_none());
    let (o, ev) = s.apply(&Command::Release { lease_id: "L1".into(), by: "owner".into() });
    assert_eq!(o, Outcome::Ended { key: "rack/42".into(), token: 1 });
    assert_eq!(ev.unwrap().rev, 2, "a release takes a revision too");
    let (o, _) = s.apply(&Command::Release { lease_id: "L1".into(), by: "owner".into() });
    assert_eq!(o, Outcome::NoSuchLease);
    let (o, _) = s.apply(&acquire("rack/42", "L3", 1000, 0, None));
    assert_eq!(granted(&o).unwrap().token, 3);
    assert_eq!(s.key("rack/42").unwrap().token, 3);
    assert_eq!(s.revision(), 3);
}

#[test]
fn retried_request_id_returns_the_original_grant() {
    let mut s = LockState::default();
    let (first, _) = s.apply(&acquire("k", "L1", 1000, 0, Some("req-1")));
    // A retry after a lost response carries a fresh lease id but the same request id.
    let (again, ev) = s.apply(&acquire("k", "L9", 1000, 0, Some("req-1")));
    assert_eq!(first, again);
    assert!(ev.is_none(), "a retry must not grant twice");
    assert_eq!(s.lease_count(), 1);
}

fn release(lease: &str) -> Command {
    Command::Release { lease_id: lease.into(), by: "owner".into() }
}

/// `n` acquire+release cycles on 4 keys, each with a request id of its own
/// (what the client library sends), numbered from `from`.
fn cycles(s: &mut LockState, from: usize, n: usize) {
    for i in from..from + n {
        let lease = format!("{i:032x}");
        let (o, _) = s.apply(&acquire(&format!("soak/k{}", i % 4), &lease, 3000, 0, Some(&format!("{:032x}", i + 1))));
        assert!(granted(&o).is_some());
        s.apply(&release(&lease));
    }
}

/// A table under the newest rules, as a cluster of this build has it once
/// its leader proposed them.
fn current() -> LockState {
    let mut s = LockState::default();
    s.apply(&Command::Rules { version: RULES });
    s
}

#[test]
fn under_rules_0_the_last_65536_request_ids_of_any_lease_are_remembered() {
    let mut s = LockState::default();
    assert_eq!(s.rules(), 0);
    cycles(&mut s, 0, LEGACY_REQUEST_ID_MEMORY + 10);
    assert_eq!(s.requests.len(), LEGACY_REQUEST_ID_MEMORY);
    assert_eq!(s.request_order.len(), LEGACY_REQUEST_ID_MEMORY);
    assert!(!s.requests.contains_key(&request_key("owner", &format!("{:032x}", 10))));
    assert!(s.requests.contains_key(&request_key("owner", &format!("{:032x}", 11))));
    // What a build before rules were numbered wrote (and `rules: 0`, which
    // such a build ignores): no request id in a lease.
    s.apply(&acquire("live", "LIVE", 60_000, 0, Some("live")));
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["rules"], 0);
    assert!(json["leases"]["LIVE"].get("request_id").is_none());
}

#[test]
fn request_id_memory_is_bounded() {
    let mut s = current();
    cycles(&mut s, 0, 2 * REQUEST_ID_MEMORY + 10);
    assert_eq!(s.requests.len(), REQUEST_ID_MEMORY);
    assert_eq!(s.request_order.len(), REQUEST_ID_MEMORY);
    assert!(!s.requests.contains_key(&request_key("owner", &format!("{:032x}", 1))));
}

#[test]
fn a_steady_load_on_a_few_keys_leaves_the_snapshot_flat() {
    // The soak's pattern: acquire+release on a few keys, a fresh request id
    // per acquire. Under rules 0 the snapshot grew by ~190 bytes per
    // acquire (3.8 MB after 20,000) and the nodes' memory with it.
    let mut s = current();
    cycles(&mut s, 0, 5_000);
    let early = serde_json::to_vec(&s).unwrap().len();
    cycles(&mut s, 5_000, 15_000);
    let late = serde_json::to_vec(&s).unwrap().len();
    assert!(late <= early + early / 10, "the snapshot grew from {early} to {late} bytes");
    assert!(late < 1 << 20, "{late} bytes of snapshot for 4 keys");
    assert!(s.remembered_requests() <= REQUEST_ID_MEMORY);
}

#[test]
fn a_live_lease_keeps_its_request_id_however_many_end_after_it() {
    let mut s = current();
    let (first, _) = s.apply(&acquire("long", "LIVE", 60_000, 0, Some("live")));
    cycles(&mut s, 0, 2 * REQUEST_ID_MEMORY);
    let (again, ev) = s.apply(&acquire("long", "OTHER", 60_000, 0, Some("live")));
    assert_eq!(first, again, "a retry of a live lease's acquire gets it back");
    assert!(ev.is_none());
    assert_eq!(s.remembered_requests(), REQUEST_ID_MEMORY + 1);
    // Once it ends, it is remembered among the recently ended ones.
    s.apply(&release("LIVE"));
    let (ended, ev) = s.apply(&acquire("long", "OTHER", 60_000, 0, Some("live")));
    assert_eq!(first, ended, "a retry after the lease ended still gets the original grant");
    assert!(ev.is_none());
    cycles(&mut s, 1 << 20, REQUEST_ID_MEMORY);
    let (later, ev) = s.apply(&acquire("long", "OTHER", 60_000, 0, Some("live")));
    assert!(ev.is_some() && later != first, "forgotten {} ends later: {later:?}", REQUEST_ID_MEMORY);
}

#[test]
fn a_forgotten_request_id_granted_anew_is_remembered_for_its_new_lease() {
    let mut s = current();
    s.apply(&acquire("a", "L1", 60_000, 0, Some("again")));
    s.apply(&release("L1"));
    // Forgotten among the ended ones, then granted anew under the same id.
    cycles(&mut s, 0, REQUEST_ID_MEMORY);
    let (second, ev) = s.apply(&acquire("a", "L2", 60_000, 0, Some("again")));
    assert!(ev.is_some());
    s.apply(&release("L2"));
    let (_, ev) = s.apply(&acquire("a", "L3", 60_000, 0, Some("again")));
    assert!(ev.is_none(), "L2's grant is remembered after it ended");
    // L2's place in the queue is the oldest of the last 4,096 ended.
    cycles(&mut s, 1 << 20, REQUEST_ID_MEMORY - 1);
    let (o, ev) = s.apply(&acquire("a", "L4", 60_000, 0, Some("again")));
    assert_eq!((o, ev), (second, None));
}

#[test]
fn moving_move_to_rules_1_keeps_live_leases_ids_and_the_last_ended_ones() {
    // A table of rules 0 (as an older build leaves it): 10,000 grants with a
    // request id each, the last one live, every one in the queue.
    let mut s = LockState::default();
    cycles(&mut s, 0, 9_999);
    let (live, _) = s.apply(&acquire("live", "LIVE", 60_000, 0, Some("live")));
    assert_eq!(s.remembered_requests(), 10_000);
    assert!(s.lease("LIVE").unwrap().request_id.is_none());
    s.apply(&Command::Rules { version: 1 });
    assert_eq!(s.rules(), 1);
    // The live lease's id now rides in its lease, out of the queue; of the
    // ended ones, the last 4,096 granted stay.
    assert_eq!(s.lease("LIVE").unwrap().request_id.as_deref(), Some("live"));
    assert_eq!(s.request_order.len(), REQUEST_ID_MEMORY);
    assert_eq!(s.remembered_requests(), REQUEST_ID_MEMORY + 1);
    assert!(!s.requests.contains_key(&request_key("owner", &format!("{:032x}", 9_999 - REQUEST_ID_MEMORY))));
    assert!(s.requests.contains_key(&request_key("owner", &format!("{:032x}", 9_999 - REQUEST_ID_MEMORY + 1))));
    let (again, ev) = s.apply(&acquire("live", "OTHER", 60_000, 0, Some("live")));
    assert_eq!((&live, ev), (&again, None));
    // Again, or back to 0: nothing changes.
    let before = s.clone();
    s.apply(&Command::Rules { version: 1 });
    s.apply(&Command::Rules { version: 0 });
    assert_eq!(s, before);
    // The live lease is queued when it ends, and the queue stays bounded.
    s.apply(&release("LIVE"));
    assert_eq!(s.request_order.len(), REQUEST_ID_MEMORY);
    assert_eq!(s.request_order.back().map(String::as_str), Some(request_key("owner", "live").as_str()));
}

#[test]
fn the_move_to_rules_1_rebuilds_the_leases_request_ids_from_the_queue_alone() {
    // A table whose leases carry request ids the queue does not (the
    // unreleased build that kept them per lease without rules wrote such
    // tables), and an id from before ids were scoped by owner.
    let mut s = LockState::default();
    s.apply(&acquire("a", "LA", 60_000, 0, Some("ra")));
    s.apply(&acquire("b", "LB", 60_000, 0, None));
    let mut v = serde_json::to_value(&s).unwrap();
    v["leases"]["LB"]["request_id"] = "stale".into();
    v["requests"]["unscoped"] = serde_json::json!({"key": "b", "token": 2, "lease_id": "LB", "ttl_ms": 60000});
    v["request_order"].as_array_mut().unwrap().insert(0, "unscoped".into());
    let mut s: LockState = serde_json::from_value(v).unwrap();
    s.apply(&Command::Rules { version: 1 });
    assert_eq!(s.lease("LA").unwrap().request_id.as_deref(), Some("ra"));
    assert_eq!(s.lease("LB").unwrap().request_id, None, "no remembered request names LB");
    assert_eq!(s.remembered_requests(), 1, "the unscoped id is dropped");
    assert!(s.request_order.is_empty(), "live leases' ids are queued when they end");
    s.apply(&release("LB"));
    assert!(s.request_order.is_empty(), "LB had no request id to queue");
}

#[test]
fn a_snapshot_from_before_rules_were_numbered_loads_as_rules_0() {
    let mut s = LockState::default();
    s.apply(&acquire("k", "L1", 1000, 0, Some("r1")));
    let mut v = serde_json::to_value(&s).unwrap();
    v.as_object_mut().unwrap().remove("rules");
    let old: LockState = serde_json::from_value(v).unwrap();
    assert_eq!(old, s);
    assert_eq!(old.rules(), 0);
}

#[test]
fn expiry_with_lock_delay_blocks_until_end_delay() {
    let mut s = LockState::default();
    s.apply(&acquire("k", "L1", 1000, 5000, None));
    let (_, ev) = s.apply(&Command::Expire { lease_id: "L1".into() });
    assert_eq!(ev.unwrap().kind, EventKind::Expired { lock_delay_ms: 5000 });
    let (o, _) = s.apply(&acquire("k", "L2", 1000, 0, None));
    assert!(matches!(o, Outcome::Held { lock_delay: true, holder: None, .. }), "{o:?}");
    // An EndDelay for another expiry does nothing.
    s.apply(&Command::EndDelay { key: "k".into(), token: 99 });
    assert!(granted(&s.apply(&acquire("k", "L2", 1000, 0, None)).0).is_none());
    s.apply(&Command::EndDelay { key: "k".into(), token: 1 });
    assert_eq!(granted(&s.apply(&acquire("k", "L2", 1000, 0, None)).0).unwrap().token, 3);
}

#[test]
fn release_never_starts_a_lock_delay() {
    let mut s = LockState::default();
    s.apply(&acquire("k", "L1", 1000, 5000, None));
    s.apply(&Command::Release { lease_id: "L1".into(), by: "owner".into() });
    assert!(granted(&s.apply(&acquire("k", "L2", 1000, 0, None)).0).is_some());
}

#[test]
fn clock_expires_on_time_and_keepalive_extends() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut s = LockState::default();
    let mut c = LeaseClock::default();
    let (_, ev) = s.apply(&acquire("k", "L1", 1000, 0, None));
    c.observe(&ev.unwrap(), t0);
    assert!(c.due(ms(999)).is_empty());
    assert!(c.keepalive(&s, "L1", ms(900)));
    assert!(c.due(ms(1500)).is_empty(), "keepalive at 900 moves the deadline to 1900");
    assert_eq!(c.due(ms(1900)), vec![Command::Expire { lease_id: "L1".into() }]);
    assert!(!c.keepalive(&s, "L1", ms(1901)), "no keepalive once the expiry is on its way");
    // The proposal was lost: the clock proposes it again.
    assert!(c.due(ms(2000)).is_empty());
    assert_eq!(c.due(ms(1900) + crate::lock::clock::RETRY), vec![Command::Expire { lease_id: "L1".into() }]);
}

#[test]
fn reset_gives_every_lease_a_full_ttl() {
    let t0 = Instant::now();
    let mut s = LockState::default();
    s.apply(&acquire("a", "L1", 1000, 0, None));
    s.apply(&acquire("b", "L2", 3000, 0, None));
    let mut c = LeaseClock::default();
    let later = t0 + Duration::from_secs(10);
    c.reset(&s, later);
    assert_eq!(c.next_deadline(), Some(later + Duration::from_millis(1000)));
    assert!(c.due(later + Duration::from_millis(999)).is_empty());
    assert_eq!(c.due(later + Duration::from_millis(1000)), vec![Command::Expire { lease_id: "L1".into() }]);
    c.observe(&s.apply(&Command::Expire { lease_id: "L1".into() }).1.unwrap(), later);
    assert_eq!(c.next_deadline(), Some(later + Duration::from_millis(3000)));
}

#[test]
fn snapshot_round_trips() {
    let mut s = LockState::default();
    s.apply(&acquire("a", "L1", 1000, 100, Some("r1")));
    s.apply(&acquire("b", "L2", 1000, 0, None));
    s.apply(&Command::Expire { lease_id: "L1".into() });
    let bytes = serde_json::to_vec(&s).unwrap();
    let back: LockState = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(s, back);
}

#[test]
fn a_restored_table_has_no_live_lease_and_grants_above_the_floor() {
    let mut s = LockState::default();
    s.apply(&acquire("held", "L1", 1000, 0, Some("r1")));
    s.apply(&acquire("delayed", "L2", 1000, 5000, None));
    s.apply(&Command::Expire { lease_id: "L2".into() });
    s.apply(&acquire("free", "L3", 1000, 0, None));
    s.apply(&Command::Release { lease_id: "L3".into(), by: "owner".into() });
    s.apply(&Command::Identify { cluster: "old".into() });
    let mut r = s.restored(100, "new".into());
    assert_eq!(r.revision(), 101, "the restore takes a revision of its own above the floor");
    assert_eq!(r.cluster(), Some("new"), "a restored cluster is another history");
    assert_eq!(r.lease_count(), 0);
    assert!(r.lease("L1").is_none() && r.delays().next().is_none());
    assert_eq!(r.owned_by("owner"), 0);
    // No key of the old history is kept: every token up to the restore
    // reads as ended, including those granted after the backup (which a
    // kept key's older token would sit below).
    assert_eq!(r.key_count(), 0);
    assert_eq!(r.compacted_below(), 101);
    // The request id of the backup's grant names a lease that is gone: a
    // retry with it is a new acquire, above the floor.
    for (key, lease, req) in [("held", "L4", Some("r1")), ("delayed", "L5", None), ("free", "L6", None)] {
        let (o, _) = r.apply(&acquire(key, lease, 1000, 0, req));
        assert!(granted(&o).is_some_and(|g| g.token > 100), "{key}: {o:?}");
    }
    // A floor below the backup's revision still moves past the backup.
    assert_eq!(s.restored(0, "x".into()).revision(), s.revision() + 1);
}

#[test]
fn a_table_is_identified_once() {
    let mut s = LockState::default();
    assert_eq!(s.cluster(), None);
    s.apply(&Command::Identify { cluster: "a".into() });
    s.apply(&Command::Identify { cluster: "b".into() });
    assert_eq!(s.cluster(), Some("a"), "the first committed identity stays");
    let back: LockState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(back.cluster(), Some("a"), "the identity is in the snapshot");
    let legacy = serde_json::to_string(&LockState::default()).unwrap();
    assert!(!legacy.contains("cluster"), "a table without one serialises as before: {legacy}");
}

/// One step of the simulated leader.
#[derive(Debug, Clone)]
enum Step {
    Acquire {
        key: u8,
        ttl: u64,
        delay: u64,
        retry_of: Option<u8>,
    },
    Keepalive(u8),
    Release(u8),
    Advance(u64),
    /// Leader change: the new leader resets its clock.
    NewLeader,
    /// The leader moves the table to the newest rules.
    Rules,
    /// The replica starts over from a snapshot of the table.
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..4, prop_oneof![Just(100u64), Just(500), Just(2000)], prop_oneof![Just(0u64), Just(300)],
              proptest::option::of(0u8..8))
            .prop_map(|(key, ttl, delay, retry_of)| Step::Acquire { key, ttl, delay, retry_of }),
        2 => (0u8..16).prop_map(Step::Keepalive),
        1 => (0u8..16).prop_map(Step::Release),
        3 => (1u64..700).prop_map(Step::Advance),
        1 => Just(Step::NewLeader),
        1 => Just(Step::Rules),
        1 => Just(Step::Snapshot),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// L1, L2, L3 and L6 over random histories, checked against a model kept
    /// by the test itself from what was acknowledged, not from the state;
    /// and a replica that applies the same commands, restarting from
    /// snapshots, stays equal to the table (under either rules).
    #[test]
    fn invariants_hold_over_random_histories(steps in proptest::collection::vec(step(), 1..120)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut s = LockState::default();
        let replica = std::cell::RefCell::new(LockState::default());
        let mut c = LeaseClock::default();
        let mut last_token = 0u64;
        let mut leases: Vec<String> = vec![];
        // lease id -> (key, ttl, latest acknowledged time)
        let mut acked: HashMap<String, (String, u64, Instant)> = HashMap::new();
        // key -> time before which it must not be re-granted (L6)
        let mut blocked_until: HashMap<String, Instant> = HashMap::new();
        let mut requests: HashMap<u8, Grant> = HashMap::new();

        let apply = |s: &mut LockState, c: &mut LeaseClock, now: Instant, cmd: Command| {
            replica.borrow_mut().apply(&cmd);
            let (o, events) = s.apply(&cmd);
            if let Some(e) = &events {
                c.observe(e, now);
            }
            if let Command::EndDelay { key, token } = &cmd {
                c.delay_ended(key, *token);
            }
            (o, events)
        };

        for st in steps {
            match st {
                Step::Acquire { key, ttl, delay, retry_of } => {
                    let lease_id = format!("L{}", leases.len());
                    let req = retry_of.map(|r| format!("req{r}"));
                    // The leader decides whether to propose from `admission`:
                    // it must predict exactly what applying will answer.
                    let predicted = s.admission(&format!("k{key}"), "owner", req.as_deref());
                    let (o, events) = apply(&mut s, &mut c, now, acquire(&format!("k{key}"), &lease_id, ttl, delay, req.as_deref()));
                    match &predicted {
                        Outcome::Nothing => prop_assert!(events.is_some(), "admitted as free, then {:?}", o),
                        other => prop_assert_eq!(other, &o, "admission disagrees with apply"),
                    }
                    if let Outcome::Granted(g) = &o {
                        if let Some(r) = retry_of {
                            if let Some(orig) = requests.get(&r) {
                                prop_assert_eq!(orig, g, "a retried request id must get its original grant");
                                prop_assert!(events.is_none());
                                continue;
                            }
                            requests.insert(r, g.clone());
                        }
                        // L1: strictly above every earlier grant.
                        prop_assert!(g.token > last_token, "token {} not above {}", g.token, last_token);
                        last_token = g.token;
                        // L6: not inside a lock-delay.
                        if let Some(until) = blocked_until.get(&g.key) {
                            prop_assert!(now >= *until, "{} re-granted during its lock-delay", g.key);
                        }
                        acked.insert(g.lease_id.clone(), (g.key.clone(), ttl, now));
                        leases.push(g.lease_id.clone());
                    }
                }
                Step::Keepalive(i) => {
                    if let Some(id) = leases.get(i as usize) {
                        if c.keepalive(&s, id, now) {
                            acked.get_mut(id).unwrap().2 = now;
                        }
                    }
                }
                Step::Release(i) => {
                    if let Some(id) = leases.get(i as usize).cloned() {
                        apply(&mut s, &mut c, now, Command::Release { lease_id: id.clone(), by: "owner".into() });
                        acked.remove(&id);
                    }
                }
                Step::Advance(ms) => {
                    now += Duration::from_millis(ms);
                    for cmd in c.due(now) {
                        let (o, events) = apply(&mut s, &mut c, now, cmd.clone());
                        if let (Command::Expire { lease_id }, Outcome::Ended { key, .. }) = (&cmd, &o) {
                            let (_, ttl, last) = acked.remove(lease_id).unwrap();
                            // L3: never before ttl after the latest acknowledgement.
                            prop_assert!(now >= last + Duration::from_millis(ttl), "{lease_id} expired early");
                            if let Some(e) = &events {
                                if let EventKind::Expired { lock_delay_ms } = e.kind {
                                    blocked_until.insert(key.clone(), now + Duration::from_millis(lock_delay_ms));
                                }
                            }
                        }
                    }
                }
                Step::NewLeader => c.reset(&s, now),
                Step::Rules => {
                    apply(&mut s, &mut c, now, Command::Rules { version: RULES });
                }
                Step::Snapshot => {
                    *replica.borrow_mut() = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
                }
            }
            prop_assert_eq!(&*replica.borrow(), &s, "the replica differs from the table");
            // L2: at most one live lease per key, and the key table agrees.
            let mut per_key: HashMap<&str, usize> = HashMap::new();
            for (id, l) in s.leases() {
                *per_key.entry(&l.key).or_default() += 1;
                prop_assert_eq!(s.key(&l.key).unwrap().lease_id.as_deref(), Some(id.as_str()));
            }
            prop_assert!(per_key.values().all(|n| *n == 1));
        }
    }
}
