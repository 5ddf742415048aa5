//! The system under test on a network of its own ([`fencegate_testkit::netns`]):
//! every `fencegate server` in its own namespace and at its own address,
//! the sidecar in another, the worker processes in a third, and the test's
//! own controller (the recording upstream, the checker's reads) in a
//! fourth, which the test's runtime threads enter. Services listen on
//! fixed ports: each namespace has its own.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_client::{Client, ClientOptions, ClusterInfo};
use fencegate_testkit::netns::Lab;
use fencegate_testkit::process::tail;
use fencegate_testkit::{Bin, Proc};
use tokio::time::Instant;

/// The controller's member: the test's runtime and the upstream.
pub const CTL: &str = "ctl";
/// The worker processes' member.
pub const WORKERS: &str = "w";
/// The sidecar's member.
pub const SIDECAR: &str = "sc";

const API_PORT: u16 = 7401;
const PEER_PORT: u16 = 7501;
pub const UPSTREAM_PORT: u16 = 9000;
const SIDECAR_PORT: u16 = 8080;
const SIDECAR_METRICS_PORT: u16 = 9464;

/// Every member of a lab for `nodes` nodes.
pub fn members(nodes: u64) -> Vec<String> {
    [CTL, WORKERS, SIDECAR].iter().map(|s| s.to_string()).chain((1..=nodes).map(node)).collect()
}

/// Node `id`'s member name.
pub fn node(id: u64) -> String {
    format!("n{id}")
}

pub struct Net<'a> {
    pub lab: &'a Lab,
    pub dir: tempfile::TempDir,
    bin: Bin,
    ids: Vec<u64>,
    extra_yaml: String,
    nodes: BTreeMap<u64, Proc>,
    http: HttpClient,
}

impl<'a> Net<'a> {
    /// Start every node in its namespace; returns once they agree on a
    /// leader and a linearizable read succeeds (30 s at most).
    pub async fn start(lab: &'a Lab, bin: &Bin, nodes: u64, extra_yaml: &str) -> Net<'a> {
        let mut net = Net {
            lab,
            dir: tempfile::tempdir().unwrap(),
            bin: bin.clone(),
            ids: (1..=nodes).collect(),
            extra_yaml: extra_yaml.into(),
            nodes: BTreeMap::new(),
            http: HttpClient::new(1 << 20),
        };
        for id in net.ids.clone() {
            net.spawn(id);
        }
        net.ready(Duration::from_secs(30)).await;
        net
    }

    pub fn ids(&self) -> Vec<u64> {
        self.ids.clone()
    }

    pub fn addr(&self, id: u64) -> Ipv4Addr {
        self.lab.addr(&node(id))
    }

    pub fn url(&self, id: u64) -> String {
        format!("http://{}:{API_PORT}", self.addr(id))
    }

    fn peer_url(&self, id: u64) -> String {
        format!("http://{}:{PEER_PORT}", self.addr(id))
    }

    pub fn urls(&self) -> Vec<String> {
        self.ids.iter().map(|id| self.url(*id)).collect()
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node{id}.log"))
    }

    fn spawn(&mut self, id: u64) {
        let peers: String = self.ids.iter().map(|o| format!("  {o}: {}\n", self.peer_url(*o))).collect();
        let clients: String = self.ids.iter().map(|o| format!("  {o}: {}\n", self.url(*o))).collect();
        // Plain HTTP on a private network of the test's own: said in so many words.
        let yaml = format!(
            "id: {id}\nlisten: {a}:{API_PORT}\npeer_listen: {a}:{PEER_PORT}\ninsecure_peers: true\ninsecure_clients: true\n\
             data_dir: {}\npeers:\n{peers}clients:\n{clients}{}",
            self.dir.path().join(format!("data{id}")).display(),
            self.extra_yaml,
            a = self.addr(id),
        );
        let config = self.dir.path().join(format!("node{id}.yaml"));
        std::fs::write(&config, yaml).unwrap();
        let mut cmd = self.lab.command(&node(id), self.bin.path());
        cmd.args(["server", "--config"]).arg(&config).env("FENCEGATE_LOG", "info,openraft=warn");
        self.nodes.insert(id, Proc::spawn(&node(id), cmd, &self.log_path(id)));
    }

    async fn ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        let client = self.client();
        loop {
            for (id, p) in self.nodes.iter_mut() {
                assert!(p.exited().is_none(), "node {id} exited while the cluster started:\n{}", p.log());
            }
            let mut leaders = vec![];
            for id in &self.ids {
                leaders.push(self.cluster_info(*id).await.and_then(|c| c.leader));
            }
            let agreed = matches!(leaders.first(), Some(Some(l)) if leaders.iter().all(|x| *x == Some(*l)));
            if agreed
                && matches!(tokio::time::timeout(Duration::from_secs(2), client.read("rack/ready")).await, Ok(Ok(_)))
            {
                return;
            }
            assert!(Instant::now() < deadline, "cluster not ready within {within:?}: leaders {leaders:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client of every node, from the controller's namespace.
    pub fn client(&self) -> Client {
        Client::with_options(self.urls(), ClientOptions::default()).unwrap()
    }

    /// `GET /v1/cluster` of node `id` itself (1 s at most).
    pub async fn cluster_info(&self, id: u64) -> Option<ClusterInfo> {
        let url = format!("{}/v1/cluster", self.url(id));
        let a = self.http.call(hyper::Method::GET, &url, None, Duration::from_secs(1)).await.ok()?;
        serde_json::from_slice(&a.body).ok()
    }

    /// The leader as the first answering node sees it.
    pub async fn leader(&self) -> Option<u64> {
        for id in &self.ids {
            if let Some(l) = self.cluster_info(*id).await.and_then(|c| c.leader) {
                return Some(l);
            }
        }
        None
    }

    /// A sidecar in its namespace in front of `upstream`, asking every
    /// node, with `routes`; serving when this returns.
    pub async fn sidecar(&self, upstream: &str, routes: &str) -> (Proc, String) {
        let a = self.lab.addr(SIDECAR);
        let dir = self.dir.path().join("sidecar");
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = format!(
            "listen: {a}:{SIDECAR_PORT}\nupstream: {upstream}\nlock_service:\n  endpoints: [{}]\nstate_dir: {}\nmetrics_listen: {a}:{SIDECAR_METRICS_PORT}\n{routes}",
            self.urls().join(", "),
            dir.join("state").display(),
        );
        std::fs::write(dir.join("sidecar.yaml"), yaml).unwrap();
        let mut cmd = self.lab.command(SIDECAR, self.bin.path());
        cmd.args(["sidecar", "--config"]).arg(dir.join("sidecar.yaml")).env("FENCEGATE_LOG", "warn");
        let mut proc = Proc::spawn("sidecar", cmd, &dir.join("sidecar.log"));
        let deadline = Instant::now() + Duration::from_secs(10);
        // The proxy's port is bound before the metrics port.
        while tokio::net::TcpStream::connect((a, SIDECAR_METRICS_PORT)).await.is_err() {
            assert!(proc.exited().is_none(), "the sidecar exited:\n{}", proc.log());
            assert!(Instant::now() < deadline, "the sidecar did not serve within 10 s:\n{}", proc.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (proc, format!("http://{a}:{SIDECAR_PORT}"))
    }
}

impl Drop for Net<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for id in &self.ids {
                let log = std::fs::read_to_string(self.log_path(*id)).unwrap_or_default();
                eprintln!("--- node {id} (last lines)\n{}", tail(&log, 30));
            }
        }
        self.nodes.clear();
    }
}
