//! The `fencegate` binary under test.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the `fencegate` binary is; cheap to clone. Make one with
/// [`bin!()`](crate::bin!) in a test or benchmark of the root package.
#[derive(Debug, Clone)]
pub struct Bin {
    path: Arc<PathBuf>,
}

/// How a run of the binary ended.
#[derive(Debug)]
pub struct Output {
    /// The exit status; -1 if a signal ended it.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Bin {
    pub fn new(path: impl Into<PathBuf>) -> Bin {
        Bin { path: Arc::new(path.into()) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A command running `fencegate args…`.
    pub fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(self.path());
        cmd.args(args);
        cmd
    }

    /// The same for tokio (killed when dropped).
    pub fn tokio_command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(self.path());
        cmd.args(args).kill_on_drop(true);
        cmd
    }

    /// Run `fencegate args…`, which must exit on its own within `within`
    /// (otherwise it is killed and the test fails), with stdin closed.
    pub fn run<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(&self, args: &[S], within: Duration) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {} {args:?}: {e}", self.path().display()));
        // Read both pipes while it runs, so that a chatty child cannot block.
        let drain = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = r.read_to_end(&mut buf);
                String::from_utf8_lossy(&buf).into_owned()
            })
        };
        let out = drain(Box::new(child.stdout.take().unwrap()));
        let err = drain(Box::new(child.stderr.take().unwrap()));
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "fencegate {args:?} did not exit within {within:?}\nstdout: {}\nstderr: {}",
                    out.join().unwrap(),
                    err.join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Output { code: status.code().unwrap_or(-1), stdout: out.join().unwrap(), stderr: err.join().unwrap() }
    }
}
