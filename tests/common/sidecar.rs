//! A real `fencegate sidecar` process for tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::free_ports;

pub struct SidecarProc {
    pub port: u16,
    pub metrics_port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    yaml: String,
}

impl SidecarProc {
    /// Start a sidecar with `routes_yaml` (the `routes:` section and anything
    /// else), state in `dir` (kept across restarts).
    pub async fn start(dir: PathBuf, upstream: &str, endpoints: &[String], routes_yaml: &str) -> SidecarProc {
        let [port, metrics_port] = free_ports();
        let lock_service = if endpoints.is_empty() {
            String::new()
        } else {
            format!("lock_service:\n  endpoints: [{}]\n", endpoints.join(", "))
        };
        let yaml = format!(
            "listen: 127.0.0.1:{port}\nupstream: {upstream}\n{lock_service}state_dir: {}\nmetrics_listen: 127.0.0.1:{metrics_port}\n{routes_yaml}",
            dir.join("state").display()
        );
        Self::start_yaml(dir, port, metrics_port, yaml).await
    }

    /// Start a sidecar from a whole config, which must listen on `port` and
    /// serve metrics on `metrics_port` (startup is detected there).
    pub async fn start_yaml(dir: PathBuf, port: u16, metrics_port: u16, yaml: String) -> SidecarProc {
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = SidecarProc { port, metrics_port, dir, child: None, yaml };
        s.spawn().await;
        s
    }

    async fn spawn(&mut self) {
        let path = self.dir.join("sidecar.yaml");
        std::fs::write(&path, &self.yaml).unwrap();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("sidecar.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .args(["sidecar", "--config"])
            .arg(&path)
            .env("FENCEGATE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while super::get_json(&format!("http://127.0.0.1:{}/healthz", self.metrics_port)).await.is_none()
            && tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).await.is_err()
        {
            assert!(Instant::now() < deadline, "sidecar did not start: {}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sidecar.log")).unwrap_or_default()
    }

    pub async fn metrics(&self) -> String {
        super::get_text(&format!("http://127.0.0.1:{}/metrics", self.metrics_port)).await
    }

    /// Send `method path` with an optional token and extra headers; returns
    /// (status, JSON body or Null).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<u64>,
        extra: &[(&str, &str)],
    ) -> (u16, serde_json::Value) {
        let http = fencegate_client::http::HttpClient::new(1 << 20);
        let mut b = hyper::Request::builder().method(method).uri(format!("{}{path}", self.url()));
        if let Some(t) = token {
            b = b.header("x-fence-token", t.to_string());
        }
        for (k, v) in extra {
            b = b.header(*k, *v);
        }
        let req = b.body(http_body_util::Full::new(bytes::Bytes::from_static(b"{\"state\":\"drained\"}"))).unwrap();
        let a = http.send(req, Duration::from_secs(20)).await.unwrap();
        (a.status.as_u16(), serde_json::from_slice(&a.body).unwrap_or(serde_json::Value::Null))
    }
}

impl Drop for SidecarProc {
    fn drop(&mut self) {
        self.kill();
    }
}
