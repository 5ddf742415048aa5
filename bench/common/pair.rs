//! Two sidecars (or more) side by side in one run, the same kind of load on
//! each, interleaved per repetition (the order rotates, so each goes first
//! in turn; with two, which goes first alternates) so that drift hits all
//! alike: closed-loop throughput, then latency at a fixed rate.

use std::time::Duration;

use super::load::{self, MakeRequest};
use super::report::{Spread, Table};

/// One run's settings (from BENCH_SECONDS, BENCH_REPS, BENCH_CONNECTIONS, BENCH_RATE).
pub struct Settings {
    pub seconds: Duration,
    pub reps: usize,
    pub connections: usize,
    pub rate: u64,
}

impl Settings {
    pub fn from_env() -> Settings {
        Settings {
            seconds: Duration::from_secs(super::env_or("BENCH_SECONDS", 5)),
            reps: super::env_or("BENCH_REPS", 3),
            connections: super::env_or("BENCH_CONNECTIONS", 32),
            rate: super::env_or("BENCH_RATE", 5000),
        }
    }
}

/// Per sidecar (`N` of them), per repetition.
pub struct Pair<const N: usize> {
    pub names: [&'static str; N],
    pub rps: [Vec<f64>; N],
    pub p50: [Vec<f64>; N],
    pub p99: [Vec<f64>; N],
}

/// Warm each up, then `s.reps` repetitions of both phases on each, in an
/// order that rotates by one per repetition.
pub async fn compare<const N: usize>(
    names: [&'static str; N],
    ports: [u16; N],
    makes: [MakeRequest; N],
    s: &Settings,
) -> Pair<N> {
    for i in 0..N {
        let run = load::closed_loop(ports[i], 4, Duration::from_secs(1), makes[i].clone()).await;
        assert!(run.ok > 0 && run.errors == 0, "warm-up failed {}: {} errors", names[i], run.errors);
    }
    let none = || std::array::from_fn(|_| vec![]);
    let mut p = Pair { names, rps: none(), p50: none(), p99: none() };
    for rep in 1..=s.reps {
        for i in (0..N).map(|k| (rep - 1 + k) % N) {
            eprintln!("rep {rep}/{}: {}", s.reps, names[i]);
            let run = load::closed_loop(ports[i], s.connections, s.seconds, makes[i].clone()).await;
            assert_eq!(run.errors, 0, "{}", names[i]);
            p.rps[i].push(run.rate());
            let run = load::fixed_rate(ports[i], s.connections, s.rate as f64, s.seconds, makes[i].clone()).await;
            p.p50[i].push(run.us(0.5));
            p.p99[i].push(run.us(0.99));
        }
    }
    p
}

impl<const N: usize> Pair<N> {
    /// Second ÷ first: by the ratio of medians, and per repetition.
    pub fn ratios(&self) -> (f64, Vec<f64>) {
        self.ratios_to_first(1)
    }

    /// Throughput of sidecar `i` ÷ the first's: by the ratio of medians,
    /// and per repetition.
    pub fn ratios_to_first(&self, i: usize) -> (f64, Vec<f64>) {
        let med = |v: &[f64]| Spread::of(v).median;
        let per_rep = self.rps[i].iter().zip(&self.rps[0]).map(|(a, b)| a / b).collect();
        (med(&self.rps[i]) / med(&self.rps[0]), per_rep)
    }

    /// p99 at the fixed rate of sidecar `i` ÷ the first's (ratio of medians).
    pub fn p99_to_first(&self, i: usize) -> f64 {
        Spread::of(&self.p99[i]).median / Spread::of(&self.p99[0]).median
    }

    pub fn table(&self, rate: u64) -> String {
        let mut t =
            Table::new(&["sidecar", "closed loop req/s", &format!("p50 µs @{rate}/s"), &format!("p99 µs @{rate}/s")]);
        for i in 0..N {
            let row = [
                self.names[i].to_string(),
                Spread::of(&self.rps[i]).show(0),
                Spread::of(&self.p50[i]).show(0),
                Spread::of(&self.p99[i]).show(0),
            ];
            t.row(&row);
        }
        t.markdown().to_string()
    }

    /// The numbers per sidecar, and `ratio`, `per_rep`: the second's
    /// throughput ÷ the first's (`ratios`).
    pub fn json(&self) -> serde_json::Value {
        let (ratio, per_rep) = self.ratios();
        let (rps, p50, p99) = (&self.rps[..], &self.p50[..], &self.p99[..]);
        serde_json::json!({ "rps": rps, "p50_us": p50, "p99_us": p99, "ratio": ratio, "per_rep": per_rep })
    }
}
