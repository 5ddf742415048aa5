//! What a verification run prints: a Markdown table with a column per arm
//! (operations by kind and outcome, faults, violations per check), and the
//! history of a failing arm kept for replay. Shared by the suites that
//! reuse the torture modules (`torture.rs`, `partitions.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::checker::{self, Report, APPLY_MARGIN_MS, MAX_STALENESS_MS};
use super::history::{History, Kind, Op, Outcome};
use super::workload;
use crate::Upstream;

/// One arm of a run: what it did, the faults it saw (`F`: the suite's
/// fault kinds), what the checks found, and the longest cached window
/// measured (`checker::stale_window`).
pub struct Arm<F> {
    pub name: &'static str,
    pub history: Arc<History>,
    pub faults: BTreeMap<F, usize>,
    pub reports: Vec<Report>,
    pub window_ms: Option<f64>,
}

/// Every check of a sidecar arm, once its faults are healed: what reached
/// the upstream (S1/S2, and how late a stale write landed), the grants
/// (order, durability against `latest`, exclusion) and the recovery within
/// `liveness_bound_ms`; the longest stale window measured.
pub fn sidecar_checks(
    history: &History,
    up: &Upstream,
    keys: &[String],
    latest: &BTreeMap<String, u64>,
    recovered: Option<f64>,
    liveness_bound_ms: f64,
) -> (Vec<Report>, Option<f64>) {
    let ops = history.ops();
    let applied_at = workload::applied_at(up, keys, history);
    let (window, window_ms) = checker::stale_window(&ops, &applied_at, MAX_STALENESS_MS + APPLY_MARGIN_MS);
    let reports = vec![
        checker::upstream_order(&workload::applied(up, keys)),
        checker::token_order(&ops),
        checker::durability(&ops, latest),
        checker::exclusion(&ops),
        checker::liveness(recovered, liveness_bound_ms),
        window,
    ];
    (reports, window_ms)
}

/// Where a failing run keeps its histories, and how to replay it.
pub struct Replay<'a> {
    /// The suite's name, the start of each file's name.
    pub suite: &'a str,
    pub seed: u64,
    /// The environment variable that replays the schedule.
    pub seed_var: &'a str,
    /// The directory: the test's `env!("CARGO_TARGET_TMPDIR")`.
    pub dir: &'a str,
}

impl<F: std::fmt::Debug> Arm<F> {
    /// Keep this arm's history as `<dir>/<suite>-<arm>-seed-<seed>.json`;
    /// the line saying where, and how to replay its schedule.
    pub fn keep_history(&self, r: &Replay) -> String {
        let name = self.name.split_whitespace().next().unwrap_or("arm");
        let path = format!("{}/{}-{name}-seed-{}.json", r.dir, r.suite, r.seed);
        std::fs::write(&path, serde_json::to_vec_pretty(&self.history.ops()).unwrap()).unwrap();
        format!("history: {path}; replay the schedule with {}={}", r.seed_var, r.seed)
    }
}

/// What fails a run: any violation in the sidecar arm (its history kept),
/// or a control arm that found no out-of-order write (the checker could not
/// fail).
pub fn failures<F: std::fmt::Debug>(replay: &Replay, with: &Arm<F>, without: &Arm<F>) -> Vec<String> {
    let mut failures = vec![];
    for r in &with.reports {
        for v in r.violations.iter().take(5) {
            failures.push(format!("{}: {v}", r.name));
        }
    }
    if !failures.is_empty() {
        failures.push(with.keep_history(replay));
    }
    if without.reports[0].violations.is_empty() {
        failures.push(format!(
            "the control arm found no out-of-order write: the checker could not fail ({})",
            without.keep_history(replay)
        ));
    }
    failures
}

/// The run's table, a column per arm.
pub fn table<F: std::fmt::Debug>(suite: &str, arms: &[&Arm<F>], seed: u64) -> String {
    let mut t = Columns::new(arms.iter().map(|a| a.name).collect());
    for (i, arm) in arms.iter().enumerate() {
        t.put_arm(i, &arm.history.ops(), &arm.faults, &arm.reports);
        let longest = arm.window_ms.map_or("none".into(), |ms| format!("{ms:.0} ms"));
        let row = format!(
            "stale write applied after a newer grant, longest (max_staleness {MAX_STALENESS_MS:.0} ms + {APPLY_MARGIN_MS:.0} ms margin)"
        );
        t.put(i, row, longest);
    }
    format!("\n{suite} summary (seed {seed})\n\n{}", t.markdown())
}

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
    fn put_arm<F: std::fmt::Debug>(&mut self, arm: usize, ops: &[Op], faults: &BTreeMap<F, usize>, reports: &[Report]) {
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
