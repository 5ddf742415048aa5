//! Child processes that cannot outlive their test: killed (SIGKILL, with
//! their descendants) and reaped when dropped, and killed by the kernel when
//! the test process itself dies, however it dies.

use std::collections::HashMap;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    pub name: String,
    child: Child,
    log: PathBuf,
    /// Once reaped its pid may be reused: no more signals.
    reaped: bool,
}

type Job = (Command, mpsc::Sender<io::Result<Child>>);

/// Children are forked by one thread that lives as long as the process, with
/// `PR_SET_PDEATHSIG`: the kernel sends the signal when the *thread* that
/// forked a child ends, so forking from a test's own (short-lived) threads
/// would kill children early, while this thread ends only with the process.
fn spawner() -> &'static Mutex<mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: the hook only makes one system call (prctl),
                    // which is async-signal-safe, and allocates nothing.
                    unsafe {
                        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL)).map_err(io::Error::from));
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .unwrap();
        Mutex::new(tx)
    })
}

impl Proc {
    /// Start `cmd` with stdin closed, stdout discarded and stderr appended to
    /// `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{name}: cannot open log {}: {e}", log.display()));
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(err);
        let program = cmd.get_program().to_owned();
        let (tx, rx) = mpsc::channel();
        spawner().lock().unwrap().send((cmd, tx)).unwrap();
        let child = rx.recv().unwrap().unwrap_or_else(|e| panic!("cannot start {name} ({program:?}): {e}"));
        Proc { name: name.to_string(), child, log: log.to_path_buf(), reaped: false }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send `signal` to the process (unless it has been reaped: an exited
    /// child that was not waited for keeps its pid).
    pub fn signal(&self, signal: Signal) {
        if !self.reaped {
            let _ = kill(Pid::from_raw(self.pid() as i32), signal);
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    pub fn freeze(&self, frozen: bool) {
        self.signal(if frozen { Signal::SIGSTOP } else { Signal::SIGCONT });
    }

    /// Its exit status if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        self.reaped |= status.is_some();
        status
    }

    /// Its exit code once it exits within `within` (`None`: it did not, or
    /// a signal ended it).
    pub async fn exit_within(&mut self, within: std::time::Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return status.code();
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        None
    }

    /// SIGKILL it and its descendants (descendants first: nginx's workers
    /// outlive a killed master and keep its port), and reap it; the kill has
    /// happened when this returns.
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        // Only while it is ours and unreaped: once reaped its pid may be reused.
        if let Ok(None) = self.child.try_wait() {
            for pid in tree(self.pid()).into_iter().skip(1) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }

    /// Where its stderr goes.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Its stderr so far (shared with whatever else logs to the same file).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `root` and every live descendant, root first.
pub fn tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The fields after the command name, which is in parentheses and may hold spaces.
        let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
        if let Some(ppid) = ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    // Bounded even if pid reuse between reads of /proc made a loop.
    while i < out.len() && out.len() < 100_000 {
        out.extend(children.get(&out[i]).into_iter().flatten());
        i += 1;
    }
    out
}
