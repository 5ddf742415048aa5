//! Processes under measurement: spawned, killed when dropped, and what they
//! cost as the kernel counts it in /proc (CPU time, resident memory), summed
//! over the process and its descendants (nginx's workers, say).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    pub name: String,
    child: Child,
}

impl Proc {
    /// Start `cmd` with stdout discarded and stderr to `log` (appended).
    pub fn spawn(name: &str, cmd: &mut Command, log: &std::path::Path) -> Proc {
        let err = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({:?}): {e}", cmd.get_program()));
        Proc { name: name.to_string(), child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL it and its descendants, and reap it; the time of the kill is
    /// when this returns. Descendants first: nginx's workers outlive a
    /// killed master and would keep serving its port.
    pub fn kill(&mut self) {
        // Only while it is ours and unreaped: once reaped its pid may be reused.
        if let Ok(None) = self.child.try_wait() {
            for pid in tree(self.pid()).into_iter().skip(1) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn usage(&self) -> Usage {
        Usage::of_tree(self.pid())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

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

    fn of_pid(pid: u32) -> Option<Usage> {
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

/// `root` and every live descendant.
fn tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
        if let Some(ppid) = ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        out.extend(children.get(&out[i]).into_iter().flatten());
        i += 1;
    }
    out
}
