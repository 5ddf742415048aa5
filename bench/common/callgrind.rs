//! Instructions executed by a server, counted by valgrind's callgrind: the
//! server runs under it from its start (through a wrapper script, so that
//! whatever starts the server needs no change), and the benchmark zeroes the
//! counters before the window it measures and dumps them after, with
//! `callgrind_control` (which reaches the running process through vgdb).
//! Counts cover all the process's threads; each dump holds what ran since
//! the previous zero or dump, and stays on disk for `callgrind_annotate`.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A script that runs a program under callgrind, and where its dumps go.
pub struct Wrapped {
    /// Run this in place of the program, with the program's arguments.
    pub script: PathBuf,
    /// Dumps are `<out>.1`, `<out>.2`, … in the order they were asked for.
    out: PathBuf,
}

/// Write `dir/<name>-callgrind`, which runs `program` and its arguments
/// under callgrind, dumps to `dir/<name>.callgrind.<n>`.
pub fn wrap(dir: &Path, name: &str, program: &Path) -> Wrapped {
    use std::os::unix::fs::PermissionsExt;
    let out = dir.join(format!("{name}.callgrind"));
    let script = dir.join(format!("{name}-callgrind"));
    // `exec`: the pid the benchmark gets is the one callgrind runs as.
    let text = format!(
        "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={} {} \"$@\"\n",
        out.display(),
        program.display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    Wrapped { script, out }
}

impl Wrapped {
    /// The counters of the process that runs the script, as `pid`.
    pub fn counter(&self, pid: u32) -> Counter {
        Counter { pid, out: self.out.clone(), dumps: 0 }
    }
}

/// The counters of one process under callgrind.
pub struct Counter {
    pid: u32,
    out: PathBuf,
    dumps: usize,
}

/// One dump: its file and the instructions (Ir) it counted.
pub struct Dump {
    pub path: PathBuf,
    pub instructions: u64,
}

impl Counter {
    /// Start counting from zero.
    pub async fn zero(&self) {
        self.control(&["--zero".to_string()]).await;
    }

    /// Dump what was counted since the last zero or dump (`label` goes in
    /// the file), and read its total.
    pub async fn dump(&mut self, label: &str) -> Dump {
        // callgrind_control hands the command to a shell: a plain word.
        let label: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let said = self.control(&[format!("--dump={label}")]).await;
        self.dumps += 1;
        let path = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("no dump {}: {e}; callgrind_control said: {said}", path.display()));
        // `totals:` is the sum of the dump's cost lines (one event, Ir).
        let instructions = text
            .lines()
            .find_map(|l| l.strip_prefix("totals:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no totals in {}", path.display()));
        Dump { path, instructions }
    }

    /// `callgrind_control ARGS PID`, which answers once the process has
    /// carried the command out; bounded in time. It says "OK" even when
    /// vgdb failed (on its stderr), so the caller checks the effect.
    async fn control(&self, args: &[String]) -> String {
        let mut cmd = tokio::process::Command::new("callgrind_control");
        cmd.args(args).arg(self.pid.to_string()).kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .unwrap_or_else(|_| panic!("callgrind_control {args:?} {}: no answer within 60 s", self.pid))
            .expect("callgrind_control (Debian's valgrind)");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "callgrind_control {args:?} {}: {said}", self.pid);
        said
    }
}

/// A copy of `dump` that Debian 12's `callgrind_annotate` (3.19) reads
/// right: it counts the cost of a call whose count is 0 (a call entered
/// before the counters were zeroed, such as `main`'s or a thread's, which
/// hold everything) as the caller's own, so that one function seems to cost
/// all. The copy says such calls happened once. Returns the copy's path.
pub fn for_annotate(dump: &Path) -> PathBuf {
    let text = std::fs::read_to_string(dump).unwrap();
    let fixed: Vec<String> = text
        .lines()
        .map(|l| match l.strip_prefix("calls=0 ") {
            Some(rest) => format!("calls=1 {rest}"),
            None => l.to_string(),
        })
        .collect();
    let path = PathBuf::from(format!("{}.annotate", dump.display()));
    std::fs::write(&path, fixed.join("\n") + "\n").unwrap();
    path
}

/// The `n` functions with the most instructions of their own (self cost) in
/// a dump (its copy by [`for_annotate`]), by `callgrind_annotate`:
/// (instructions, function).
pub fn top_self(copy: &Path, n: usize) -> Vec<(u64, String)> {
    let out = std::process::Command::new("callgrind_annotate")
        .arg("--inclusive=no")
        .arg(copy)
        .output()
        .expect("callgrind_annotate (Debian's valgrind)");
    // The rows follow the `Ir  file:function` header's underline:
    // `1,234,567 (12.34%)  file:function [object]`. A function's inlined
    // code is listed under the inlined code's file: summed here.
    let mut by_function: std::collections::HashMap<String, u64> = Default::default();
    for row in String::from_utf8_lossy(&out.stdout).lines().skip_while(|l| !l.contains("file:function")).skip(2) {
        let parsed = row.trim().split_once(' ').and_then(|(count, rest)| {
            let place = rest.split_once(")  ")?.1;
            let function = place.split_once(':')?.1;
            let function = function.rsplit_once(" [").map_or(function, |(f, _)| f);
            Some((count.replace(',', "").parse::<u64>().ok()?, function.trim().to_string()))
        });
        let Some((count, function)) = parsed else { break };
        *by_function.entry(function).or_default() += count;
    }
    let mut top: Vec<(u64, String)> = by_function.into_iter().map(|(f, c)| (c, f)).collect();
    top.sort_by(|a, b| b.cmp(a));
    top.truncate(n);
    top
}
