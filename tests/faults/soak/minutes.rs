//! The soak's per-minute rows and its verdict: memory and descriptors of
//! every process plateau, and each minute's p99 of quiet operations stays
//! within 2× of the first minute's. (The p99 of operations a fault caught is
//! shown, not judged: it is the fault's length, whichever minute it falls in.)

use super::load::{Counts, Stats};

/// A process's resident memory (MiB) and open descriptors, from /proc.
fn rss_and_fds(pid: u32) -> (f64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    (kib / 1024.0, fds)
}

/// A process the soak watches; one that is restarted by the faults is shown
/// but not judged (a restart resets what a leak would have grown).
pub struct Watched {
    pub name: String,
    pub pid: u32,
    pub restarted: bool,
}

pub struct Sample {
    /// (RSS MiB, open fds), in the order of the watched processes.
    pub processes: Vec<(f64, usize)>,
    pub counts: Counts,
}

impl Sample {
    pub fn take(processes: &[Watched], stats: &Stats) -> Sample {
        Sample { processes: processes.iter().map(|p| rss_and_fds(p.pid)).collect(), counts: stats.take() }
    }
}

pub struct Minute {
    pub n: u64,
    pub faults: usize,
    pub sample: Sample,
}

fn p99_ms(h: &hdrhistogram::Histogram<u64>) -> f64 {
    h.value_at_quantile(0.99) as f64 / 1000.0
}

impl Minute {
    pub fn acquire_p99(&self) -> f64 {
        p99_ms(&self.sample.counts.acquire)
    }

    pub fn write_p99(&self) -> f64 {
        p99_ms(&self.sample.counts.write)
    }

    fn faulted_p99s(&self) -> (f64, f64) {
        (p99_ms(&self.sample.counts.acquire_faulted), p99_ms(&self.sample.counts.write_faulted))
    }

    /// The row of the table.
    pub fn line(&self) -> String {
        let c = &self.sample.counts;
        let procs: Vec<String> = self.sample.processes.iter().map(|(rss, fds)| format!("{rss:.1} / {fds}")).collect();
        let (acquire_faulted, write_faulted) = self.faulted_p99s();
        format!(
            "| {} | {} | {} | {:.1} | {:.1} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} |",
            self.n,
            self.faults,
            c.acquired,
            self.acquire_p99(),
            acquire_faulted,
            c.acquire_errors,
            c.written,
            self.write_p99(),
            write_faulted,
            c.refused,
            c.write_errors,
            c.watch_lines,
            c.watch_reconnects,
            procs.join(" | ")
        )
    }
}

pub struct Report {
    pub table: String,
    pub failures: Vec<String>,
}

/// Latencies below this are noise on a shared 2-core machine; a first
/// minute faster than it would make "2×" a few milliseconds.
const P99_FLOOR_MS: f64 = 20.0;
/// Memory may still settle (allocator arenas, caches filling) by this much
/// past the first half's peak: 10% and 4 MiB.
const RSS_SLACK: (f64, f64) = (1.10, 4.0);
/// Connections come and go with the faults (peer links, pooled clients,
/// watch streams); a leak of one per fault would add 20 a minute.
const FD_SLACK: usize = 16;

pub fn report(processes: &[Watched], rows: &[Minute], seed: u64) -> Report {
    let names: Vec<String> = processes
        .iter()
        .map(|p| if p.restarted { format!("{} (restarted)", p.name) } else { p.name.clone() })
        .collect();
    let mut table = format!(
        "soak (seed {seed}): per minute; p99 in ms of the quiet operations (no fault \
         during them) and of those a fault caught; processes as RSS MiB / open fds\n\n\
         | min | faults | acquires | acquire p99 | (faulted) | acquire errors | writes | write p99 | (faulted) | refused | write errors | watch lines | watch reopens | {} |\n|{}\n",
        names.join(" | "),
        "---|".repeat(13 + names.len())
    );
    for r in rows {
        table.push_str(&r.line());
        table.push('\n');
    }
    let mut failures = vec![];
    let first = &rows[0];
    let (a0, w0) = (first.acquire_p99().max(P99_FLOOR_MS), first.write_p99().max(P99_FLOOR_MS));
    for r in rows {
        if r.acquire_p99() > 2.0 * a0 {
            failures.push(format!("minute {}: acquire p99 {:.1} ms > 2 × {a0:.1}", r.n, r.acquire_p99()));
        }
        if r.write_p99() > 2.0 * w0 {
            failures.push(format!("minute {}: write p99 {:.1} ms > 2 × {w0:.1}", r.n, r.write_p99()));
        }
    }
    // Plateau: the last minute is no higher than the first half's peak (+ slack).
    let half = &rows[..rows.len().div_ceil(2)];
    let last = rows.last().unwrap();
    for (i, p) in processes.iter().enumerate().filter(|(_, p)| !p.restarted) {
        let name = &p.name;
        let peak_rss = half.iter().map(|r| r.sample.processes[i].0).fold(0.0, f64::max);
        let peak_fds = half.iter().map(|r| r.sample.processes[i].1).max().unwrap_or(0);
        let (rss, fds) = last.sample.processes[i];
        if rss > peak_rss * RSS_SLACK.0 + RSS_SLACK.1 {
            failures.push(format!("{name}: RSS {rss:.1} MiB at the end, {peak_rss:.1} at most in the first half"));
        }
        if fds > peak_fds + FD_SLACK {
            failures.push(format!("{name}: {fds} fds at the end, {peak_fds} at most in the first half"));
        }
    }
    Report { table, failures }
}
