//! Test harness: real `fencegate server` processes on loopback, connected to
//! each other through relays that a test can cut, killed with SIGKILL and
//! restarted on the same data.
#![allow(dead_code)] // each test file uses a different part of the harness

pub mod relay;
pub mod sidecar;
pub mod tls;
pub mod upstream;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fencegate_client::{Client, ClientOptions, ClusterInfo};
use relay::Relay;
use serde_json::Value;
use tokio::time::Instant;

pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct ports the OS had free: all are held open until every one is
/// chosen, so one call never returns the same port twice.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> =
        (0..N).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub ports: BTreeMap<u64, u16>,
    /// (from, to) -> relay carrying from's requests to `to`.
    relays: BTreeMap<(u64, u64), Relay>,
    children: BTreeMap<u64, Child>,
    extra_yaml: String,
}

impl Cluster {
    /// Start `n` nodes; `extra_yaml` is appended to every node's config.
    pub async fn start(n: u64, extra_yaml: &str) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        // Hold the nodes' ports while the relays bind theirs, so that no
        // relay can be handed a port a node is about to listen on (a relay
        // there would loop a node's RPCs back to itself).
        let held: Vec<std::net::TcpListener> =
            (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let ports: BTreeMap<u64, u16> = (1..=n).zip(held.iter().map(|l| l.local_addr().unwrap().port())).collect();
        let mut relays = BTreeMap::new();
        for from in 1..=n {
            for to in 1..=n {
                if from != to {
                    relays.insert((from, to), Relay::start(ports[&to]).await);
                }
            }
        }
        drop(held);
        let mut c = Cluster { dir, ports, relays, children: BTreeMap::new(), extra_yaml: extra_yaml.to_string() };
        for i in 1..=n {
            c.spawn(i);
        }
        c.wait_for_leader(Duration::from_secs(20)).await;
        // A linearizable read returns once the leader has committed its first entry.
        if let Err(e) = c.client().read("harness/ready").await {
            let logs: Vec<String> = c.ids().iter().map(|i| format!("--- node {i}\n{}", c.log_of(*i))).collect();
            panic!("cluster not ready: {e}\n{}", logs.join("\n"));
        }
        c
    }

    pub fn url(&self, id: u64) -> String {
        format!("http://127.0.0.1:{}", self.ports[&id])
    }

    pub fn urls(&self) -> Vec<String> {
        self.ports.keys().map(|i| self.url(*i)).collect()
    }

    pub fn ids(&self) -> Vec<u64> {
        self.ports.keys().copied().collect()
    }

    fn config_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node{id}.yaml"))
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("data{id}"))
    }

    fn spawn(&mut self, id: u64) {
        let mut peers = String::new();
        for other in self.ids() {
            let port = if other == id { self.ports[&id] } else { self.relays[&(id, other)].port };
            peers.push_str(&format!("  {other}: http://127.0.0.1:{port}\n"));
        }
        let yaml = format!(
            "id: {id}\nlisten: 127.0.0.1:{}\ndata_dir: {}\npeers:\n{peers}{}",
            self.ports[&id],
            self.data_dir(id).display(),
            self.extra_yaml
        );
        std::fs::write(self.config_path(id), yaml).unwrap();
        let log = std::fs::File::create(self.dir.path().join(format!("node{id}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .args(["server", "--config"])
            .arg(self.config_path(id))
            .env("FENCEGATE_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.insert(id, child);
    }

    /// SIGKILL: no shutdown, no flush beyond what was fsync'd.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.children.remove(&id) {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub fn restart(&mut self, id: u64) {
        self.kill(id);
        self.spawn(id);
    }

    /// Start a node that was killed (no-op if it runs).
    pub fn start_node(&mut self, id: u64) {
        if !self.children.contains_key(&id) {
            self.spawn(id);
        }
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.children.contains_key(&id)
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) a node's process.
    pub fn freeze(&self, id: u64, frozen: bool) {
        if let Some(c) = self.children.get(&id) {
            let signal = if frozen { nix::sys::signal::Signal::SIGSTOP } else { nix::sys::signal::Signal::SIGCONT };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), signal);
        }
    }

    /// Cut (or heal) only the direction `from` -> `to`: `from`'s requests to
    /// `to` are lost, `to` still reaches `from`.
    pub fn set_one_way(&self, from: u64, to: u64, cut: bool) {
        self.relays[&(from, to)].set_cut(cut);
    }

    /// Heal every link.
    pub fn heal_all(&self) {
        for r in self.relays.values() {
            r.set_cut(false);
        }
    }

    /// The leader as the first answering running node sees it.
    pub async fn leader(&self) -> Option<u64> {
        for id in self.children.keys() {
            if let Some(l) = self.cluster_info(*id).await.and_then(|c| c.leader) {
                return Some(l);
            }
        }
        None
    }

    /// Cut (or heal) both directions between `a` and `b`.
    pub fn set_link(&self, a: u64, b: u64, cut: bool) {
        self.relays[&(a, b)].set_cut(cut);
        self.relays[&(b, a)].set_cut(cut);
    }

    /// Cut `id` off from every other node (clients can still reach it).
    pub fn isolate(&self, id: u64, cut: bool) {
        for other in self.ids() {
            if other != id {
                self.set_link(id, other, cut);
            }
        }
    }

    pub fn client(&self) -> Client {
        Client::new(self.urls()).unwrap()
    }

    /// A client that can only talk to node `id`.
    pub fn client_of(&self, id: u64) -> Client {
        Client::with_options(vec![self.url(id)], ClientOptions::default()).unwrap()
    }

    pub async fn cluster_info(&self, id: u64) -> Option<ClusterInfo> {
        let v = get_json(&format!("{}/v1/cluster", self.url(id))).await?;
        serde_json::from_value(v).ok()
    }

    /// Wait until the given nodes agree on a leader among them; returns it.
    pub async fn wait_for_leader_among(&self, nodes: &[u64], within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let mut leaders = vec![];
            for id in nodes {
                leaders.push(self.cluster_info(*id).await.and_then(|c| c.leader));
            }
            if let Some(Some(l)) = leaders.first() {
                if nodes.contains(l) && leaders.iter().all(|x| *x == Some(*l)) {
                    return *l;
                }
            }
            assert!(Instant::now() < deadline, "no leader among {nodes:?} within {within:?}: {leaders:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_for_leader(&self, within: Duration) -> u64 {
        let ids: Vec<u64> = self.children.keys().copied().collect();
        self.wait_for_leader_among(&ids, within).await
    }

    pub fn log_of(&self, id: u64) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("node{id}.log"))).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.children) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// GET a URL and parse its JSON, `None` on any failure.
pub async fn get_json(url: &str) -> Option<Value> {
    let http = fencegate_client::http::HttpClient::new(1 << 20);
    let a = http.call(hyper::Method::GET, url, None, Duration::from_secs(2)).await.ok()?;
    serde_json::from_slice(&a.body).ok()
}

/// Send a raw request and return the whole answer.
pub async fn raw_answer(method: &str, url: &str, body: Option<&str>) -> fencegate_client::http::Reply {
    let http = fencegate_client::http::HttpClient::new(1 << 20);
    let m = hyper::Method::from_bytes(method.as_bytes()).unwrap();
    http.call(m, url, body.map(|b| b.as_bytes().to_vec()), Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// Send a raw request; returns (status, JSON body or Null).
pub async fn raw(method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
    let a = raw_answer(method, url, body).await;
    (a.status.as_u16(), serde_json::from_slice(&a.body).unwrap_or(Value::Null))
}

pub async fn get_text(url: &str) -> String {
    let http = fencegate_client::http::HttpClient::new(8 << 20);
    let a = http.call(hyper::Method::GET, url, None, Duration::from_secs(2)).await.unwrap();
    String::from_utf8_lossy(&a.body).into_owned()
}

/// An NDJSON watch stream, read line by line.
pub struct Watch {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

impl Watch {
    pub async fn open(url: &str) -> Watch {
        let stream =
            tokio::net::TcpStream::connect(url.trim_start_matches("http://").split('/').next().unwrap()).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::get(url)
            .header("host", "localhost")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        Watch { body: resp.into_body(), buf: vec![] }
    }

    /// The next line as JSON (fails the test after 10 s).
    pub async fn next(&mut self) -> Value {
        use http_body_util::BodyExt;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return serde_json::from_slice(&line).unwrap();
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await.expect("watch: no line in 10 s");
            let frame = frame.expect("watch stream ended").unwrap();
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}
