//! What processes under measurement cost as the kernel counts it in /proc
//! (CPU time, resident memory), summed over a process and its descendants
//! (nginx's workers, say). The processes themselves are
//! `fencegate_testkit::Proc`s: killed with their descendants when dropped.

use fencegate_testkit::process::tree;

/// CPU and memory of a process tree at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User + system CPU seconds so far.
    pub cpu_seconds: f64,
    /// Resident memory now, bytes.
    pub rss: u64,
    /// Peak resident memory (VmHWM) of each process, summed, bytes.
    pub peak_rss: u64,
}

/// The kernel reports utime/stime in USER_HZ ticks, which Linux fixes at 100
/// for user space on every architecture we run on.
const USER_HZ: f64 = 100.0;

impl Usage {
    pub fn of_tree(root: u32) -> Usage {
        let mut total = Usage::default();
        for pid in tree(root) {
            if let Some(u) = Usage::of_pid(pid) {
                total.cpu_seconds += u.cpu_seconds;
                total.rss += u.rss;
                total.peak_rss += u.peak_rss;
            }
        }
        total
    }

    /// One process alone (the benchmark itself, without the servers it started).
    pub fn of_pid(pid: u32) -> Option<Usage> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: f64 = rest.get(11)?.parse::<f64>().ok()? + rest.get(12)?.parse::<f64>().ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = |field: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Some(Usage { cpu_seconds: ticks / USER_HZ, rss: kib("VmRSS:") * 1024, peak_rss: kib("VmHWM:") * 1024 })
    }
}
