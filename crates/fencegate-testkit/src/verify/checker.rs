//! Reads a history and reports each invariant separately. Every check is a
//! plain function of the recorded data, so a failing run can be re-checked
//! from its history file.

use std::collections::BTreeMap;

use super::history::{Kind, Op, Outcome};

/// The sidecar's `lock_service.max_staleness` (its default): how long after
/// a newer grant completed an older token's write may still be dispatched.
pub const MAX_STALENESS_MS: f64 = 1000.0;

/// What the checker allows on top of `MAX_STALENESS_MS`: it measures when
/// the upstream *applied* a write, which follows the sidecar's last decision
/// by the request's transfer, the upstream's reading of the small body and
/// the scheduling of both on a loaded 2-core runner. Not part of the bound
/// the sidecar promises (to dispatch); a sidecar that ignored the bound
/// would exceed it by seconds (the stream is blind until its 12 s silence).
pub const APPLY_MARGIN_MS: f64 = 250.0;

pub struct Report {
    pub name: &'static str,
    pub violations: Vec<String>,
}

/// (1) S1/S2 at the upstream: each key's tokens never decrease, in the order
/// the writes took effect.
pub fn upstream_order(applied: &BTreeMap<String, Vec<u64>>) -> Report {
    let mut violations = vec![];
    for (key, tokens) in applied {
        for (i, pair) in tokens.windows(2).enumerate() {
            if pair[1] < pair[0] {
                violations.push(format!("{key}: write #{} carried {} after {}", i + 1, pair[1], pair[0]));
            }
        }
    }
    Report { name: "upstream token order (S1/S2)", violations }
}

fn grants(ops: &[Op]) -> Vec<(&Op, &str, u64)> {
    ops.iter()
        .filter_map(|op| match (&op.kind, &op.outcome) {
            (Kind::Acquire { key, token: Some(t) }, Outcome::Ok) => Some((op, key.as_str(), *t)),
            _ => None,
        })
        .collect()
}

/// (2) L1: a grant that completed before another began has a lower token;
/// no token is granted twice.
pub fn token_order(ops: &[Op]) -> Report {
    let g = grants(ops);
    let mut violations = vec![];
    let mut seen = BTreeMap::new();
    for (op, key, t) in &g {
        if let Some(other) = seen.insert(*t, *key) {
            violations.push(format!("token {t} granted twice ({other} and {key})"));
        }
        let _ = op;
    }
    for (a, ka, ta) in &g {
        for (b, kb, tb) in &g {
            if a.end_ms < b.start_ms && ta >= tb {
                violations.push(format!("{ka}@{ta} completed before {kb}@{tb} began, yet its token is not lower"));
            }
        }
    }
    Report { name: "grant token order (L1)", violations }
}

/// (3) No acknowledged grant is lost: after healing, every key's latest token
/// is at least every grant acknowledged for it; and the sidecar, which checks
/// tokens it does not know with a linearizable read, never calls an
/// acknowledged token `unknown_token` (the service forgot it, or read stale).
pub fn durability(ops: &[Op], latest: &BTreeMap<String, u64>) -> Report {
    let mut violations = vec![];
    let acknowledged: std::collections::BTreeSet<(&str, u64)> =
        grants(ops).into_iter().map(|(_, k, t)| (k, t)).collect();
    for op in ops {
        if let (Kind::Write { key, token, .. }, Outcome::Refused { error, .. }) = (&op.kind, &op.outcome) {
            if error == "unknown_token" && acknowledged.contains(&(key.as_str(), *token)) {
                violations.push(format!(
                    "{key}: acknowledged token {token} was refused as unknown_token at {:.0} ms",
                    op.start_ms
                ));
            }
        }
    }
    for (_, key, t) in grants(ops) {
        let now = latest.get(key).copied().unwrap_or(0);
        if now < t {
            violations.push(format!("{key}: acknowledged grant {t} but the service's latest token is {now}"));
        }
    }
    Report { name: "acknowledged grants survive (L5)", violations }
}

/// (4) L2/L3 as the holders saw them: the service never granted a key to the
/// next holder while the previous one's guaranteed validity (L4, up to its
/// release or its deadline) had not ended.
pub fn exclusion(ops: &[Op]) -> Report {
    let valid_until: BTreeMap<u64, f64> = ops
        .iter()
        .filter_map(|op| match &op.kind {
            Kind::ValidUntil { token, .. } => Some((*token, op.start_ms)),
            _ => None,
        })
        .collect();
    let mut by_key: BTreeMap<&str, Vec<(u64, f64)>> = BTreeMap::new();
    for (op, key, t) in grants(ops) {
        by_key.entry(key).or_default().push((t, op.end_ms));
    }
    let mut violations = vec![];
    for (key, mut gs) in by_key {
        gs.sort_by_key(|(t, _)| *t);
        for pair in gs.windows(2) {
            let ((a, _), (b, b_acked)) = (pair[0], pair[1]);
            if let Some(until) = valid_until.get(&a) {
                if b_acked < *until {
                    violations.push(format!(
                        "{key}: token {b} was granted (acknowledged at {b_acked:.0} ms) while holder {a} was still guaranteed valid until {until:.0} ms"
                    ));
                }
            }
        }
    }
    Report { name: "exclusion and no early expiry (L2/L3)", violations }
}

/// (5) Liveness: once faults heal, acquires succeed again within `bound_ms`.
pub fn liveness(recovered_ms: Option<f64>, bound_ms: f64) -> Report {
    let violations = match recovered_ms {
        Some(ms) if ms <= bound_ms => vec![],
        Some(ms) => vec![format!("first acquire after healing took {ms:.0} ms (bound {bound_ms:.0} ms)")],
        None => vec![format!("no acquire succeeded within {bound_ms:.0} ms of healing")],
    };
    Report { name: "liveness after healing", violations }
}

/// (6) The cached window: for every write the upstream applied with a token
/// older than a grant of the same key that had already *completed* (been
/// acknowledged to its client), how long after that completion it was
/// applied. `applied` is each key's `(token, applied_ms)` on the history's
/// clock. A `cached` route keeps it below `max_staleness` (`bound_ms`); with
/// `bound_ms` 0 any such write is a violation (what a `linearizable` route
/// promises for writes sent after the grant completed). Also answers the
/// longest window seen (`None`: no such write).
pub fn stale_window(ops: &[Op], applied: &BTreeMap<String, Vec<(u64, f64)>>, bound_ms: f64) -> (Report, Option<f64>) {
    let mut completed: BTreeMap<&str, Vec<(u64, f64)>> = BTreeMap::new();
    for (op, key, t) in grants(ops) {
        completed.entry(key).or_default().push((t, op.end_ms));
    }
    let (mut violations, mut longest) = (vec![], None::<f64>);
    for (key, writes) in applied {
        let Some(gs) = completed.get(key.as_str()) else { continue };
        for &(token, at) in writes {
            // The first newer grant to complete before this write was applied.
            let newer = gs.iter().filter(|(t, end)| *t > token && *end < at).min_by(|a, b| a.1.total_cmp(&b.1));
            let Some(&(t, end)) = newer else { continue };
            let window = at - end;
            longest = Some(longest.map_or(window, |l| l.max(window)));
            if window >= bound_ms {
                violations.push(format!(
                    "{key}: a write with token {token} was applied at {at:.0} ms, {window:.0} ms after grant {t} completed (bound {bound_ms:.0} ms)"
                ));
            }
        }
    }
    (Report { name: "cached window below max_staleness", violations }, longest)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Each check, on a hand-made history that breaks it, must report it.
    #[test]
    fn the_checker_reports_each_kind_of_violation() {
        let op =
            |start_ms: f64, end_ms: f64, kind: Kind| Op { worker: 0, start_ms, end_ms, kind, outcome: Outcome::Ok };
        let grant = |key: &str, t: u64| Kind::Acquire { key: key.into(), token: Some(t) };
        // Token 5 completed before token 4 began.
        let ops = vec![op(0.0, 10.0, grant("rack/a", 5)), op(20.0, 30.0, grant("rack/b", 4))];
        assert_eq!(token_order(&ops).violations.len(), 1);
        // The same token twice.
        let ops = vec![op(0.0, 10.0, grant("rack/a", 5)), op(0.0, 10.0, grant("rack/b", 5))];
        assert!(!token_order(&ops).violations.is_empty());
        // A grant the service forgot.
        let latest = BTreeMap::from([("rack/a".to_string(), 4)]);
        assert_eq!(durability(&[op(0.0, 1.0, grant("rack/a", 5))], &latest).violations.len(), 1);
        // An acknowledged token the sidecar was told was never granted.
        let refused = Op {
            worker: 0,
            start_ms: 50.0,
            end_ms: 60.0,
            kind: Kind::Write { key: "rack/a".into(), token: 5, stale: true },
            outcome: Outcome::Refused { status: 409, error: "unknown_token".into() },
        };
        let latest = BTreeMap::from([("rack/a".to_string(), 9)]);
        assert_eq!(durability(&[op(0.0, 1.0, grant("rack/a", 5)), refused], &latest).violations.len(), 1);
        // Token 6 granted while 5 was still guaranteed valid.
        let ops = vec![
            op(0.0, 10.0, grant("rack/a", 5)),
            op(500.0, 500.0, Kind::ValidUntil { key: "rack/a".into(), token: 5 }),
            op(100.0, 400.0, grant("rack/a", 6)),
        ];
        assert_eq!(exclusion(&ops).violations.len(), 1);
        let ok = vec![ops[0].clone(), ops[1].clone(), op(450.0, 600.0, grant("rack/a", 6))];
        assert!(exclusion(&ok).violations.is_empty());
        // Writes applied out of order.
        let applied = BTreeMap::from([("rack/a".to_string(), vec![3, 5, 4])]);
        assert_eq!(upstream_order(&applied).violations.len(), 1);
        // An older token's write applied 300 ms after a newer grant completed:
        // over a 250 ms bound; any at all on a linearizable route (bound 0).
        let ops = vec![op(0.0, 10.0, grant("rack/a", 5)), op(100.0, 200.0, grant("rack/a", 7))];
        let applied = BTreeMap::from([("rack/a".to_string(), vec![(5, 50.0), (5, 300.0), (5, 500.0), (7, 510.0)])]);
        let (report, longest) = stale_window(&ops, &applied, 250.0);
        assert_eq!((report.violations.len(), longest), (1, Some(300.0)));
        let within = BTreeMap::from([("rack/a".to_string(), vec![(5, 50.0), (5, 300.0), (7, 510.0)])]);
        assert_eq!(stale_window(&ops, &within, 250.0).0.violations.len(), 0);
        assert_eq!(stale_window(&ops, &within, 0.0).0.violations.len(), 1);
        let none = BTreeMap::from([("rack/a".to_string(), vec![(5, 50.0), (7, 510.0)])]);
        let (report, longest) = stale_window(&ops, &none, 0.0);
        assert!(report.violations.is_empty() && longest.is_none(), "a write before the newer grant completed");
        assert_eq!(liveness(None, 1000.0).violations.len(), 1);
        assert!(liveness(Some(200.0), 1000.0).violations.is_empty());
    }
}
