//! What a verification run prints: a Markdown table with a column per arm
//! (operations by kind and outcome, faults, violations per check), and the
//! history of a failing arm kept for replay. Shared by the suites that
//! reuse the torture modules (`torture.rs`, `partitions.rs`).

use std::collections::BTreeMap;

use super::checker::Report;
use super::history::{Kind, Op, Outcome};

/// A Markdown table: a column per arm, the rows any arm filled in, sorted.
pub struct Columns {
    names: Vec<&'static str>,
    rows: BTreeMap<String, Vec<String>>,
}

impl Columns {
    pub fn new(names: Vec<&'static str>) -> Columns {
        Columns { names, rows: BTreeMap::new() }
    }

    pub fn put(&mut self, arm: usize, row: String, value: String) {
        let n = self.names.len();
        self.rows.entry(row).or_insert_with(|| vec!["".into(); n])[arm] = value;
    }

    /// An arm's operations counted by kind and outcome, its faults and its
    /// violations per check.
    pub fn put_arm<F: std::fmt::Debug>(
        &mut self,
        arm: usize,
        ops: &[Op],
        faults: &BTreeMap<F, usize>,
        reports: &[Report],
    ) {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for op in ops {
            let kind = match &op.kind {
                Kind::Acquire { .. } => "acquire",
                Kind::Write { stale: false, .. } => "write",
                Kind::Write { stale: true, .. } => "write after a pause",
                Kind::Release { .. } => "release",
                Kind::ValidUntil { .. } => continue,
            };
            let outcome = match &op.outcome {
                Outcome::Ok => "ok".to_string(),
                Outcome::Refused { status, error } => format!("refused {status} {error}").trim().to_string(),
                Outcome::Unknown { .. } => "unknown".to_string(),
            };
            *counts.entry(format!("ops: {kind} {outcome}")).or_default() += 1;
        }
        for (k, v) in counts {
            self.put(arm, k, v.to_string());
        }
        for (f, n) in faults {
            self.put(arm, format!("fault: {f:?}"), n.to_string());
        }
        for r in reports {
            self.put(arm, format!("violations: {}", r.name), r.violations.len().to_string());
        }
    }

    pub fn markdown(&self) -> String {
        let mut out = format!("| | {} |\n|---|{}\n", self.names.join(" | "), "---|".repeat(self.names.len()));
        for (row, values) in &self.rows {
            out.push_str(&format!("| {row} | {} |\n", values.join(" | ")));
        }
        out
    }
}

/// Keep a failing arm's history as `target/tmp/<suite>-<arm>-seed-<seed>.json`;
/// the line saying where, and how to replay its schedule (`seed_var`).
pub fn keep_history(suite: &str, arm: &str, ops: &[Op], seed: u64, seed_var: &str) -> String {
    let name = arm.split_whitespace().next().unwrap_or("arm");
    let path = format!("{}/{suite}-{name}-seed-{seed}.json", env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(&path, serde_json::to_vec_pretty(ops).unwrap()).unwrap();
    format!("history: {path}; replay the schedule with {seed_var}={seed}")
}
