//! A one-member etcd on this machine for `fencegate demo --lock-service
//! etcd`: Debian's `etcd` (or any on PATH) started as a child process on
//! loopback, its data and log in a directory of the caller's, stopped with
//! the command (and killed with it, should the command die).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

/// How long a fresh member may take to elect itself.
const READY: Duration = Duration::from_secs(20);

pub(super) struct LocalEtcd {
    pub url: String,
    child: Child,
    log: PathBuf,
}

impl LocalEtcd {
    /// Start `etcd` with its data in `dir`, serving clients on
    /// `client_port` and its peer plane on `peer_port` (0: a free one);
    /// returns once it has a leader.
    pub(super) async fn start(dir: &Path, client_port: u16, peer_port: u16) -> anyhow::Result<LocalEtcd> {
        crate::durable::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (client, peer) = (free(client_port)?, free(peer_port)?);
        let (url, peer_url) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
        let log = dir.join("etcd.log");
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "fencegate-demo", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("fencegate-demo={peer_url}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .kill_on_drop(true);
        // SAFETY: one system call (prctl), async-signal-safe, no allocation:
        // etcd dies with this process rather than outlive it.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Some(nix::sys::signal::Signal::SIGKILL)).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                anyhow::anyhow!(
                    "--lock-service etcd starts `etcd`, which is not on PATH (Debian: apt install etcd-server)"
                )
            }
            _ => anyhow::anyhow!("starting etcd: {e}"),
        })?;
        let mut etcd = LocalEtcd { url, child, log };
        etcd.ready().await?;
        Ok(etcd)
    }

    /// Until `/health` says it has a leader, within `READY`.
    async fn ready(&mut self) -> anyhow::Result<()> {
        let http = fencegate_client::http::HttpClient::new(1 << 10);
        let health = format!("{}/health", self.url);
        let deadline = tokio::time::Instant::now() + READY;
        loop {
            // Ours only while it runs: a port taken meanwhile is another's.
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("etcd exited ({status}): {}", self.log_tail());
            }
            if let Ok(r) = http.call(hyper::Method::GET, &health, None, Duration::from_secs(1)).await {
                if r.status.is_success()
                    && r.body.windows(6).any(|w| w == b"\"true\"")
                    && self.child.try_wait()?.is_none()
                {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("etcd had no leader within {READY:?}: {}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        format!(
            "{} (the last lines of {})",
            lines.into_iter().rev().collect::<Vec<_>>().join(" / "),
            self.log.display()
        )
    }

    /// SIGTERM, SIGKILL after 5 s.
    pub(super) async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

/// `port` if it is free now (an etcd already there would answer for ours),
/// or one the OS had free a moment ago; etcd binds it itself.
fn free(port: u16) -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", port))
        .with_context(|| format!("port {port} is taken (another etcd?): stop it, or run with --free-ports"))?;
    Ok(l.local_addr()?.port())
}
