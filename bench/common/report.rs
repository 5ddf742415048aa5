//! Results: medians and spreads over repetitions, the machine they ran on,
//! and the files under bench/results/ (Markdown for people, JSON for plots).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Median and range of one measurement over repetitions.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        assert!(!values.is_empty(), "no repetitions");
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
        Spread { median, min: v[0], max: v[v.len() - 1] }
    }

    /// "median (min–max)" with `digits` decimals.
    pub fn show(&self, digits: usize) -> String {
        if self.min == self.max {
            return format!("{:.digits$}", self.median);
        }
        format!("{:.digits$} ({:.digits$}–{:.digits$})", self.median, self.min, self.max)
    }
}

/// A Markdown table built row by row.
pub struct Table {
    text: String,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        let mut text = format!("| {} |\n|", headers.join(" | "));
        for _ in headers {
            text.push_str("---|");
        }
        text.push('\n');
        Table { text }
    }

    pub fn row(&mut self, cells: &[String]) {
        let _ = writeln!(self.text, "| {} |", cells.join(" | "));
    }

    pub fn markdown(&self) -> &str {
        &self.text
    }
}

/// Bytes in MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The workspace's `bench/results` (benchmarks live in the root package and
/// in `bench/anchors`).
pub fn results_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.ancestors().find(|d| d.join("bench/run").is_file()).expect("no bench/run above the package");
    let dir = root.join("bench/results");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One line describing this machine, for the results' header.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|k| k.parse::<f64>().ok()))
        .map(|kib| kib / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores ({model}), {mem_gib:.0} GiB RAM, Linux {}", kernel.trim())
}

/// Write `<name>.md` (title, machine, date, body) and `<name>.json` (for bench/plot.py).
pub fn write(name: &str, title: &str, markdown: &str, json: serde_json::Value) {
    let dir = results_dir();
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let md = format!("# {title}\n\nRun {date} on {}.\n\n{markdown}", machine());
    std::fs::write(dir.join(format!("{name}.md")), &md).unwrap();
    std::fs::write(dir.join(format!("{name}.json")), serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("\n{md}\nwritten to {}", dir.join(format!("{name}.md")).display());
}
