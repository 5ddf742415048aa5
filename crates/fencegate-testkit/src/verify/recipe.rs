//! The torture workload over locks another lock service's own client holds
//! (`etcdctl lock`, a kazoo `Lock`): workers take real locks on a few lock
//! keys, one client process per lock, write with its token, and now and
//! then pause the process (SIGSTOP) past its lease or session, so that a
//! waiter takes the lock over, then go on writing with the old token, as a
//! paused holder would. Two arms at once on one service, each on its own
//! keys: through the sidecar (0 violations) and a control arm straight to
//! its upstream (which must show out-of-order writes). Seeded, and bounded
//! in time and in locks per worker.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fencegate_client::http::HttpClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::upstream::Upstream;
use crate::verify::checker::{self, APPLY_MARGIN_MS, MAX_STALENESS_MS};
use crate::verify::history::{History, Kind, Op, Outcome};
use crate::verify::summary::{self, Arm};
use crate::verify::workload;
use crate::Proc;

/// A lock client's process, holding or waiting for one lock.
pub trait Holder: Send {
    /// Its token, once it holds the lock.
    fn token(&self) -> Option<u64>;
    fn process(&mut self) -> &mut Proc;
    /// End it, letting go of the lock (or of its wait).
    fn release(&self);
}

/// One arm's shape.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Workload per arm.
    pub seconds: u64,
    /// Locks a worker takes at most: each is a process, and a paused one
    /// holds its lock for a whole lease.
    pub rounds: usize,
    pub workers: usize,
    pub keys: usize,
    pub writes: usize,
    /// How likely a write is preceded by a pause (at most one per lock).
    pub pause: f64,
    /// How long a pause lasts: past the lease or session.
    pub pause_for: Duration,
}

impl Plan {
    /// The lock keys of arm `arm` (`rack/<arm><i>`).
    pub fn keys(&self, arm: &str) -> Vec<String> {
        (0..self.keys).map(|i| format!("rack/{arm}{i}")).collect()
    }
}

/// Every worker of arm `arm` (`s`: the sidecar's, `c`: the control's),
/// writing to `target`; `start(who, key)` starts a client process that
/// takes `key`'s lock.
pub async fn run<H, S>(plan: Plan, start: S, target: String, arm: &'static str, seed: u64, history: Arc<History>)
where
    H: Holder + 'static,
    S: Fn(&str, &str) -> H + Clone + Send + Sync + 'static,
{
    let until = Instant::now() + Duration::from_secs(plan.seconds);
    let mut tasks = vec![];
    for worker in 0..plan.workers {
        let (start, target, history) = (start.clone(), target.clone(), history.clone());
        let mut rng = StdRng::seed_from_u64(seed ^ (worker as u64).wrapping_mul(0x9e37_79b9));
        tasks.push(tokio::spawn(async move {
            let http = HttpClient::new(1 << 20);
            for round in 0..plan.rounds {
                if Instant::now() >= until {
                    break;
                }
                let key = format!("rack/{arm}{}", rng.random_range(0..plan.keys));
                let holder = start(&format!("{arm}-w{worker}-r{round}"), &key);
                let at = Writer { worker, key: &key, target: &target, http: &http, history: &history };
                at.one_round(&plan, holder, &mut rng).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Where one worker's round writes, and records.
struct Writer<'a> {
    worker: usize,
    key: &'a str,
    target: &'a str,
    http: &'a HttpClient,
    history: &'a History,
}

impl Writer<'_> {
    /// Wait for `holder`'s lock, write `plan.writes` times with its token
    /// (pausing it past its lease now and then), release.
    async fn one_round(&self, plan: &Plan, mut holder: impl Holder, rng: &mut StdRng) {
        let (worker, key, history) = (self.worker, self.key, self.history);
        let start = Instant::now();
        let deadline = start + Duration::from_secs(15);
        let token = loop {
            if let Some(token) = holder.token() {
                break token;
            }
            if Instant::now() >= deadline {
                let why = "not held within 15 s".to_string();
                history.record(worker, start, Kind::Acquire { key: key.into(), token: None }, Outcome::Unknown { why });
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        history.record(worker, start, Kind::Acquire { key: key.into(), token: Some(token) }, Outcome::Ok);
        let mut valid_until = None;
        for _ in 0..plan.writes {
            if valid_until.is_none() && rng.random_bool(plan.pause) {
                // Valid at most until the pause began: its keepalives or
                // heartbeats stop, and the service ends its lease.
                valid_until = Some(Instant::now());
                holder.process().freeze(true);
                tokio::time::sleep(plan.pause_for).await;
                holder.process().freeze(false);
            }
            let start = Instant::now();
            let outcome = workload::send_write(self.http, self.target, worker, key, token).await;
            let stale = valid_until.is_some();
            history.record(worker, start, Kind::Write { key: key.into(), token, stale }, outcome);
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
        }
        let end = valid_until.unwrap_or_else(Instant::now);
        history.record(worker, end, Kind::ValidUntil { key: key.into(), token }, Outcome::Ok);
        holder.release();
        let outcome = match holder.process().exit_within(Duration::from_secs(5)).await {
            Some(_) => Outcome::Ok,
            None => Outcome::Unknown { why: format!("{} did not exit within 5 s", holder.process().name) },
        };
        history.record(worker, Instant::now(), Kind::Release { key: key.into(), token }, outcome);
    }
}

/// Both arms of `suite`, run at once (`arm(name, target, history)` runs
/// one), then judged: the sidecar's history (its upstream `up`) must show
/// no violation, the control's (`control_up`) some. `latest`, awaited
/// afterwards, is a token above every grant. Returns the sidecar arm's
/// operations for the suite's own checks.
pub async fn judge<F, A>(
    suite: &Suite,
    plan: &Plan,
    (up, control_up): (&Upstream, &Upstream),
    arm: A,
    latest: impl Future<Output = u64>,
) -> Vec<Op>
where
    A: Fn(&'static str, String, Arc<History>) -> F,
    F: Future<Output = ()>,
{
    let (with, without) = (Arc::new(History::new()), Arc::new(History::new()));
    tokio::join!(arm("s", suite.sidecar_url.clone(), with.clone()), arm("c", control_up.url(), without.clone()));
    // Of durability, only "no acknowledged token refused as unknown"
    // applies: the latest token is above every grant.
    let latest_token = latest.await;
    let latest: BTreeMap<String, u64> = plan.keys("s").into_iter().map(|k| (k, latest_token)).collect();
    let ops = with.ops();
    let (window, window_ms) = checker::stale_window(
        &ops,
        &workload::applied_at(up, &plan.keys("s"), &with),
        MAX_STALENESS_MS + APPLY_MARGIN_MS,
    );
    let reports = vec![
        checker::upstream_order(&workload::applied(up, &plan.keys("s"))),
        checker::token_order(&ops),
        checker::durability(&ops, &latest),
        checker::exclusion(&ops),
        window,
    ];
    let with = Arm { name: suite.arm, history: with, faults: BTreeMap::<&str, usize>::new(), reports, window_ms };
    let (_, control_window) = checker::stale_window(
        &without.ops(),
        &workload::applied_at(control_up, &plan.keys("c"), &without),
        MAX_STALENESS_MS,
    );
    let without = Arm {
        name: "control (no sidecar)",
        reports: vec![checker::upstream_order(&workload::applied(control_up, &plan.keys("c")))],
        history: without,
        faults: BTreeMap::new(),
        window_ms: control_window,
    };
    println!("{}", summary::table(&format!("{} torture", suite.service), &[&with, &without], suite.seed));
    let replay = summary::Replay { suite: suite.name, seed: suite.seed, seed_var: suite.seed_var, dir: suite.dir };
    let failures = summary::failures(&replay, &with, &without);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    let stale_sent = ops.iter().filter(|op| matches!(op.kind, Kind::Write { stale: true, .. })).count();
    assert!(stale_sent > 0, "no holder paused: the run tested nothing");
    ops
}

/// What names one suite's run.
pub struct Suite {
    /// The suite (`etcd-torture`), for the replay file.
    pub name: &'static str,
    /// The lock service, as the summary names it.
    pub service: &'static str,
    /// The sidecar arm, as the summary names it (`sidecar on etcd`).
    pub arm: &'static str,
    pub seed: u64,
    /// The environment variable that replays a seed.
    pub seed_var: &'static str,
    /// Where a failing history is kept.
    pub dir: &'static str,
    pub sidecar_url: String,
}
