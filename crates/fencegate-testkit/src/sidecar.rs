//! A real `fencegate sidecar` process on free ports, its state kept in a
//! directory across restarts.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::ports::{reserve, Reserved};
use crate::process::{tail, Proc};
use crate::{http, Bin};

pub struct Sidecar {
    pub port: u16,
    pub metrics_port: u16,
    /// Its config, log and `state/` (the floors).
    pub dir: PathBuf,
    /// The config's lines before the test's own (`listen`, `upstream`,
    /// `lock_service`, `state_dir`, `metrics_listen`).
    head: String,
    bin: Bin,
    log_filter: String,
    /// Its two ports, held for its life.
    _reserved: [Reserved; 2],
    proc: Option<Proc>,
}

/// What a sidecar is started with besides its upstream ([`Sidecar::start_with`]).
#[derive(Debug, Clone)]
pub struct SidecarOptions {
    /// The lock service's endpoints (none: no `lock_service` section).
    pub lock_service: Vec<String>,
    /// More of the `lock_service` section (indented lines: `  ca: ...`).
    pub lock_service_yaml: String,
    /// On a secure cluster, the token the sidecar presents
    /// ([`crate::Cluster::sidecar_with`]; default: the kit's own).
    pub lock_token: Option<String>,
    /// The rest of the config: `routes:` and any other sections (`limits`,
    /// `tls`, …).
    pub yaml: String,
    /// `FENCEGATE_LOG` (`info`: one line per refusal).
    pub log_filter: String,
    /// Its `state_dir` (the floors and records) if not `dir/state`: on a
    /// mount of its own, say (`tests/faults/power_loss.rs`).
    pub state_dir: Option<PathBuf>,
}

impl Default for SidecarOptions {
    fn default() -> Self {
        SidecarOptions {
            lock_service: vec![],
            lock_service_yaml: String::new(),
            lock_token: None,
            yaml: String::new(),
            log_filter: "info".into(),
            state_dir: None,
        }
    }
}

impl Sidecar {
    /// A sidecar in `dir` in front of `upstream`, asking the lock service at
    /// `endpoints`, with `yaml` (its routes and any other sections).
    pub async fn start(
        bin: &Bin,
        dir: impl Into<PathBuf>,
        upstream: &str,
        endpoints: &[String],
        yaml: &str,
    ) -> Sidecar {
        let o = SidecarOptions { lock_service: endpoints.to_vec(), yaml: yaml.into(), ..Default::default() };
        Self::start_with(bin, dir, upstream, o).await
    }

    /// Start a sidecar with its config, log and state in `dir`, and wait
    /// until it serves (10 s at most). Its ports are reserved for as long as
    /// it lives, so they are still its own when it restarts.
    pub async fn start_with(bin: &Bin, dir: impl Into<PathBuf>, upstream: &str, o: SidecarOptions) -> Sidecar {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).unwrap();
        let lock_service = if o.lock_service.is_empty() {
            String::new()
        } else {
            format!("lock_service:\n  endpoints: [{}]\n{}", o.lock_service.join(", "), o.lock_service_yaml)
        };
        let reserved = [reserve(), reserve()];
        let (port, metrics_port) = (reserved[0].port, reserved[1].port);
        let head = format!(
            "listen: 127.0.0.1:{port}\nupstream: {upstream}\n{lock_service}state_dir: {}\nmetrics_listen: 127.0.0.1:{metrics_port}\n",
            o.state_dir.unwrap_or_else(|| dir.join("state")).display(),
        );
        std::fs::write(dir.join("sidecar.yaml"), format!("{head}{}", o.yaml)).unwrap();
        let mut s = Sidecar {
            port,
            metrics_port,
            dir,
            head,
            bin: bin.clone(),
            log_filter: o.log_filter,
            _reserved: reserved,
            proc: None,
        };
        if let Err(log) = s.spawn().await {
            panic!("the sidecar exited before serving:\n{log}");
        }
        s
    }

    /// Start the process and wait until it serves; its log if it exits first.
    async fn spawn(&mut self) -> Result<(), String> {
        let logged = self.log().len();
        let mut cmd = self.bin.command(&["sidecar", "--config"]);
        cmd.arg(self.config_path()).env("FENCEGATE_LOG", &self.log_filter);
        let proc = self.proc.insert(Proc::spawn("sidecar", cmd, &self.dir.join("sidecar.log")));
        // The proxy's port is bound before the metrics port, and both before
        // the sidecar opens its state (and writes its admin token): it
        // serves once the metrics port answers (any status).
        let deadline = Instant::now() + Duration::from_secs(10);
        let health = format!("http://127.0.0.1:{}/healthz", self.metrics_port);
        while http::client().call(hyper::Method::GET, &health, None, Duration::from_secs(1)).await.is_err() {
            if proc.exited().is_some() {
                let log = proc.log().get(logged..).unwrap_or_default().to_string();
                self.proc = None;
                return Err(log);
            }
            assert!(Instant::now() < deadline, "the sidecar did not start within 10 s:\n{}", proc.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        self.proc = None;
    }

    /// Send `signal` (SIGTERM: a graceful stop).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(p) = &self.proc {
            p.signal(signal);
        }
    }

    /// Wait for it to exit, SIGKILL after `within`; its exit code.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        self.proc.take()?.exit_within(within).await
    }

    /// Write its config file anew with `yaml` in place of the test's own part
    /// (what it was started with); the process reads it on SIGHUP.
    pub fn rewrite_config(&self, yaml: &str) {
        std::fs::write(self.config_path(), format!("{}{yaml}", self.head)).unwrap();
    }

    /// Its config file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("sidecar.yaml")
    }

    /// SIGKILL, then start again on the same config (and ports) and state.
    pub async fn restart(&mut self) {
        if let Err(log) = self.try_restart().await {
            panic!("the restarted sidecar exited before serving:\n{log}");
        }
    }

    /// [`Sidecar::restart`], or the log of a sidecar that exited before
    /// serving (a state directory it refuses, say).
    pub async fn try_restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn().await
    }

    /// Its stderr, across restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sidecar.log")).unwrap_or_default()
    }

    /// Its `/metrics`.
    pub async fn metrics(&self) -> String {
        http::get_text(&format!("http://127.0.0.1:{}/metrics", self.metrics_port)).await
    }

    /// Until `series` (`name` or `name{labels}`) reads `value` on its `/metrics`.
    pub async fn wait_for_metric(&self, series: &str, value: f64, within: Duration) {
        let what = format!("sidecar metric {series} = {value}");
        crate::wait::until(&what, within, || async { http::metric(&self.metrics().await, series) == Some(value) }).await
    }

    /// Until the sidecar's knowledge of its lock service was last proven
    /// current by a proof sent after `since`: its `cached` routes then know
    /// every change acknowledged before `since`.
    pub async fn wait_for_proof_after(&self, since: std::time::Instant, within: Duration) {
        crate::wait::until("the sidecar's knowledge proven after a point", within, || async {
            // Measured before the scrape, which is later: knowledge younger
            // than this was proven by a proof sent after `since`.
            let elapsed = since.elapsed().as_secs_f64();
            let age = http::metric(&self.metrics().await, "fencegate_sidecar_knowledge_age_seconds");
            age.is_some_and(|age| age < elapsed)
        })
        .await
    }

    /// Send `method path` with an optional token, extra headers and the
    /// usual small JSON body; (status, JSON body or Null).
    pub async fn send(&self, method: &str, path: &str, token: Option<u64>, extra: &[(&str, &str)]) -> (u16, Value) {
        self.send_body(method, path, token, extra, http::DRAINED).await
    }

    /// The same with a body of one's own.
    pub async fn send_body(
        &self,
        method: &str,
        path: &str,
        token: Option<u64>,
        extra: &[(&str, &str)],
        body: impl Into<bytes::Bytes>,
    ) -> (u16, Value) {
        let req = http::request(method, &format!("{}{path}", self.url()), token, extra, body);
        http::send(req, Duration::from_secs(20)).await
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- sidecar in {} (last lines of its log)\n{}", self.dir.display(), tail(&self.log(), 40));
        }
    }
}
