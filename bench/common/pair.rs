//! Two sidecars side by side in one run, the same kind of load on each,
//! interleaved per repetition (which goes first alternates) so that drift
//! hits both alike: closed-loop throughput, then latency at a fixed rate.

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

/// Per sidecar, per repetition.
pub struct Pair {
    pub names: [&'static str; 2],
    pub rps: [Vec<f64>; 2],
    pub p50: [Vec<f64>; 2],
    pub p99: [Vec<f64>; 2],
}

/// Warm both up, then `s.reps` repetitions of both phases on each.
pub async fn compare(names: [&'static str; 2], ports: [u16; 2], makes: [MakeRequest; 2], s: &Settings) -> Pair {
    for i in 0..2 {
        let run = load::closed_loop(ports[i], 4, Duration::from_secs(1), makes[i].clone()).await;
        assert!(run.ok > 0 && run.errors == 0, "warm-up failed {}: {} errors", names[i], run.errors);
    }
    let mut p = Pair { names, rps: [vec![], vec![]], p50: [vec![], vec![]], p99: [vec![], vec![]] };
    for rep in 1..=s.reps {
        for i in if rep % 2 == 0 { [1, 0] } else { [0, 1] } {
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

impl Pair {
    /// Second ÷ first: by the ratio of medians, and per repetition.
    pub fn ratios(&self) -> (f64, Vec<f64>) {
        let med = |v: &[f64]| Spread::of(v).median;
        let per_rep = self.rps[1].iter().zip(&self.rps[0]).map(|(a, b)| a / b).collect();
        (med(&self.rps[1]) / med(&self.rps[0]), per_rep)
    }

    pub fn table(&self, rate: u64) -> String {
        let mut t =
            Table::new(&["sidecar", "closed loop req/s", &format!("p50 µs @{rate}/s"), &format!("p99 µs @{rate}/s")]);
        for i in 0..2 {
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

    pub fn json(&self) -> serde_json::Value {
        let (ratio, per_rep) = self.ratios();
        serde_json::json!({ "rps": self.rps, "p50_us": self.p50, "p99_us": self.p99, "ratio": ratio, "per_rep": per_rep })
    }
}
