//! A cluster of real `fencegate server` processes on loopback: killed with
//! SIGKILL (no shutdown, nothing flushed beyond what was fsync'd), paused
//! with SIGSTOP, restarted on the same data. Each node has a client port
//! and a peer-plane port; in tests every peer link (Raft, and the leader
//! calls followers forward) goes through a [`Relay`] that can be cut one
//! way or both; benchmarks connect the nodes directly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_client::tls::TlsFiles;
use fencegate_client::{Client, ClientOptions, ClusterInfo};
use tokio::time::Instant;

use crate::ports::{reserve, Reserved};
use crate::process::{tail, Proc};
use crate::relay::Relay;
use crate::sidecar::SidecarOptions;
use crate::tls::Pki;
use crate::{http, wait, Bin, Sidecar};

/// The identity the kit itself uses on a secure cluster: admin of every key.
pub const KIT_IDENTITY: &str = "testkit";
const KIT_TOKEN: &str = "testkit-admin-token";

pub struct Cluster {
    dir: tempfile::TempDir,
    bin: Bin,
    urls: BTreeMap<u64, String>,
    /// Each node's peer-plane URL.
    peer_urls: BTreeMap<u64, String>,
    /// The nodes' ports, held for the cluster's life.
    _reserved: Vec<Reserved>,
    /// (from, to) -> the relay carrying from's requests to `to`; empty without relays.
    relays: BTreeMap<(u64, u64), Relay>,
    nodes: BTreeMap<u64, Proc>,
    /// The highest id any node of this cluster had: an added node gets a
    /// fresh one (and a fresh data directory), also after `drop_node`.
    last_id: u64,
    /// The nodes' `auth` and `acl` sections on a secure cluster.
    security_yaml: String,
    /// Appended to every node's config ([`ClusterOptions::yaml`]).
    extra_yaml: String,
    /// [`ClusterOptions::data_roots`].
    data_roots: BTreeMap<u64, PathBuf>,
    log_filter: String,
    /// The cluster CA and member certificates, on a secure cluster.
    pki: Option<Pki>,
    /// The members' shared secret, on a secure cluster in plain HTTP.
    peer_secret: Option<PathBuf>,
    /// How the kit reaches the nodes (TLS and its admin token when secure).
    options: ClientOptions,
    http: HttpClient,
}

/// A secure cluster ([`ClusterOptions::security`]): HTTPS with member
/// certificates on both planes, clients authenticated by token or
/// certificate, and an ACL. Or, with `plain`, plain HTTP on loopback:
/// clients by token, members by a shared secret (`peer_secret_file`).
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// Plain HTTP, the members proving a shared secret instead of
    /// certificates ([`Cluster::peer_secret_file`]); no client certificates.
    pub plain: bool,
    /// ACL rules (YAML list items, `  - identity: ...`) besides the kit's
    /// own ([`KIT_IDENTITY`], admin of every key).
    pub acl: String,
    /// Bearer tokens as (identity, token); the nodes get their hashes.
    pub tokens: Vec<(String, String)>,
}

impl Security {
    /// Plain HTTP, two reading identities: `ops` (token `ops-token`) may
    /// read and watch `rack/` only, `all` (`all-token`) every key.
    pub fn rack_and_every_key() -> Security {
        Security {
            plain: true,
            acl: r#"
  - { identity: ops, prefixes: ["rack/"], rights: [read, watch] }
  - { identity: all, prefixes: [""], rights: [read, watch] }
"#
            .into(),
            tokens: vec![("ops".into(), "ops-token".into()), ("all".into(), "all-token".into())],
        }
    }
}

/// Why a cluster did not come up.
enum Startup {
    Exited(u64),
    NotReady(String),
}

/// How a cluster is started ([`Cluster::start_with`]); the default is what
/// tests use: 3 nodes, peer links through relays, data in the system's
/// temporary directory, logs at `info,openraft=warn`.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub nodes: u64,
    /// Appended to every node's config (a `raft:` section, say).
    pub yaml: String,
    /// Peer links through cuttable relays, or direct (benchmarks: nothing
    /// between the nodes but the kernel).
    pub relays: bool,
    /// Where the data goes instead of the system's temporary directory
    /// (benchmarks: the project's disk, so that fsync costs what it costs).
    pub data_in: Option<PathBuf>,
    /// `FENCEGATE_LOG` of the nodes.
    pub log_filter: String,
    /// Node id -> a directory its data directory goes under (its own
    /// mount, say: `tests/faults/power_loss.rs`); a node not listed keeps its data
    /// with the configs. Configs and logs never go there.
    pub data_roots: BTreeMap<u64, PathBuf>,
    /// TLS, authentication and an ACL; `None`: plain HTTP, everyone anonymous.
    pub security: Option<Security>,
    /// Nodes whose peer links are cut before they start (`isolate`); the
    /// cluster is ready once the others are.
    pub isolated: Vec<u64>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 3,
            yaml: String::new(),
            relays: true,
            data_in: None,
            log_filter: "info,openraft=warn".into(),
            data_roots: BTreeMap::new(),
            security: None,
            isolated: Vec::new(),
        }
    }
}

impl Cluster {
    /// Start `n` nodes with relays; `extra_yaml` is appended to every node's config.
    pub async fn start(bin: &Bin, n: u64, extra_yaml: &str) -> Cluster {
        Self::start_with(bin, ClusterOptions { nodes: n, yaml: extra_yaml.into(), ..Default::default() }).await
    }

    /// Start every node of `bin`; returns once they agree on a leader and it
    /// has committed its first entry (20 s at most), or fails at once with
    /// the logs if a node exits meanwhile.
    pub async fn start_with(bin: &Bin, o: ClusterOptions) -> Cluster {
        let mut c = Self::spawn_all(bin, &o).await;
        match c.ready(&o.isolated, Duration::from_secs(20)).await {
            Ok(()) => c,
            Err(Startup::Exited(id)) => panic!("node {id} exited while the cluster started"),
            Err(Startup::NotReady(why)) => panic!("cluster not ready within 20 s: {why}"),
        }
    }

    async fn spawn_all(bin: &Bin, o: &ClusterOptions) -> Cluster {
        let n = o.nodes;
        let dir = match &o.data_in {
            Some(d) => tempfile::tempdir_in(d),
            None => tempfile::tempdir(),
        }
        .unwrap();
        // Reserved for the cluster's life: no relay (of this cluster or of a
        // test running beside it) is handed a node's port, also while the
        // node is down.
        let reserved: Vec<Reserved> = (0..2 * n).map(|_| reserve()).collect();
        let (ports, peer_ports): (Vec<u16>, Vec<u16>) = reserved.chunks(2).map(|r| (r[0].port, r[1].port)).unzip();
        let scheme = if o.security.as_ref().is_some_and(|s| !s.plain) { "https" } else { "http" };
        let url = |p: &u16| format!("{scheme}://127.0.0.1:{p}");
        let urls: BTreeMap<u64, String> = (1..=n).zip(ports.iter().map(url)).collect();
        let peer_urls: BTreeMap<u64, String> = (1..=n).zip(peer_ports.iter().map(url)).collect();
        let mut relays = BTreeMap::new();
        if o.relays {
            for from in 1..=n {
                for to in (1..=n).filter(|to| *to != from) {
                    relays.insert((from, to), Relay::start(peer_ports[to as usize - 1]).await);
                }
            }
        }
        let (pki, options, security_yaml) = match &o.security {
            None => (None, ClientOptions::default(), String::new()),
            Some(sec) => secure(dir.path(), sec),
        };
        let peer_secret = o.security.as_ref().filter(|s| s.plain).map(|_| peer_secret(dir.path()));
        let http = options.http_client(8 << 20).unwrap();
        let mut c = Cluster {
            dir,
            bin: bin.clone(),
            urls,
            peer_urls,
            _reserved: reserved,
            relays,
            nodes: BTreeMap::new(),
            last_id: n,
            security_yaml,
            extra_yaml: o.yaml.clone(),
            data_roots: o.data_roots.clone(),
            log_filter: o.log_filter.clone(),
            pki,
            peer_secret,
            options,
            http,
        };
        for id in &o.isolated {
            c.isolate(*id, true);
        }
        c.start_all();
        c
    }

    /// Until every node but the `isolated` agrees on a leader and a
    /// linearizable read succeeds (the leader has committed its first
    /// entry), and, with none isolated, every node has applied the move off
    /// rules 0 that a cluster of one build makes at its start (DESIGN,
    /// "Rules"; one entry, to the newest rules), so that it does not land
    /// in the middle of what a test counts; or until a node exits.
    async fn ready(&mut self, isolated: &[u64], within: Duration) -> Result<(), Startup> {
        let deadline = Instant::now() + within;
        let client = self.client();
        let ids: Vec<u64> = self.ids().into_iter().filter(|id| !isolated.contains(id)).collect();
        loop {
            for (id, p) in self.nodes.iter_mut() {
                if p.exited().is_some() {
                    return Err(Startup::Exited(*id));
                }
            }
            let mut leaders = vec![];
            for id in &ids {
                leaders.push(self.cluster_info(*id).await.and_then(|c| c.leader));
            }
            let agreed = matches!(leaders.first(), Some(Some(l)) if leaders.iter().all(|x| *x == Some(*l)));
            let last = if !agreed {
                format!("leaders as the nodes see them: {leaders:?}")
            } else {
                match tokio::time::timeout(Duration::from_secs(2), client.read("testkit/ready")).await {
                    Ok(Ok(_)) if !isolated.is_empty() => return Ok(()),
                    Ok(Ok(_)) => {
                        let mut rules = vec![];
                        for id in &ids {
                            rules.push(self.cluster_info(*id).await.map(|c| c.rules));
                        }
                        if rules.iter().all(|r| r.is_some_and(|r| r > 0)) {
                            return Ok(());
                        }
                        format!("rules as the nodes see them: {rules:?}")
                    }
                    Ok(Err(e)) => format!("read: {e}"),
                    Err(_) => "read: no answer in 2 s".into(),
                }
            };
            if Instant::now() > deadline {
                return Err(Startup::NotReady(last));
            }
            tokio::time::sleep(wait::POLL).await;
        }
    }

    /// Where the configs, data directories and logs are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn bin(&self) -> &Bin {
        &self.bin
    }

    pub fn url(&self, id: u64) -> String {
        self.urls[&id].clone()
    }

    /// Node `id`'s peer-plane URL (Raft RPCs; forwarded leader calls).
    pub fn peer_url(&self, id: u64) -> String {
        self.peer_urls[&id].clone()
    }

    /// Node `id`'s API port (to put a relay of one's own in front of it, say).
    pub fn port(&self, id: u64) -> u16 {
        self.urls[&id].rsplit(':').next().and_then(|p| p.parse().ok()).unwrap()
    }

    /// Every node's URL, by id.
    pub fn urls(&self) -> Vec<String> {
        self.urls.values().cloned().collect()
    }

    pub fn url_map(&self) -> &BTreeMap<u64, String> {
        &self.urls
    }

    pub fn ids(&self) -> Vec<u64> {
        self.urls.keys().copied().collect()
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.data_roots.get(&id).map_or(self.dir(), |r| r.as_path()).join(format!("data{id}"))
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.dir().join(format!("node{id}.log"))
    }

    /// Node `id`'s stderr, across restarts.
    pub fn log_of(&self, id: u64) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }

    fn spawn(&mut self, id: u64) {
        if let Some(pki) = &self.pki {
            pki.member(id);
        }
        let config = self.write_config(id);
        let mut cmd = self.bin.command(&["server", "--config"]);
        cmd.arg(&config).env("FENCEGATE_LOG", &self.log_filter);
        let proc = Proc::spawn(&format!("node{id}"), cmd, &self.log_path(id));
        self.nodes.insert(id, proc);
    }

    /// Node `id`'s config file.
    pub fn config_path(&self, id: u64) -> PathBuf {
        self.dir().join(format!("node{id}.yaml"))
    }

    /// Write node `id`'s config file (with its member certificate's files,
    /// as they are); its path.
    fn write_config(&self, id: u64) -> PathBuf {
        let peers: String = self
            .ids()
            .into_iter()
            .map(|other| {
                let url = match self.relays.get(&(id, other)) {
                    Some(r) if self.pki.is_some() => r.url().replace("http://", "https://"),
                    Some(r) => r.url(),
                    None => self.peer_url(other),
                };
                format!("  {other}: {url}\n")
            })
            .collect();
        let clients: String = self.urls.iter().map(|(other, url)| format!("  {other}: {url}\n")).collect();
        let tls = match &self.pki {
            None => String::new(),
            Some(pki) => {
                let (cert, key) = pki.member_files(id);
                let ca = pki.ca.display();
                format!("tls:\n  cert: {}\n  key: {}\n  ca: {ca}\n  client_ca: {ca}\n", cert.display(), key.display())
            }
        };
        let tls = match &self.peer_secret {
            Some(file) => format!("peer_secret_file: {}\n", file.display()),
            None => tls,
        };
        let addr = |url: &str| url.rsplit("://").next().unwrap().to_string();
        let yaml = format!(
            "id: {id}\nlisten: {}\npeer_listen: {}\ndata_dir: {}\npeers:\n{peers}clients:\n{clients}{tls}{}{}",
            addr(&self.urls[&id]),
            addr(&self.peer_urls[&id]),
            self.data_dir(id).display(),
            self.security_yaml,
            self.extra_yaml
        );
        let config = self.config_path(id);
        std::fs::write(&config, yaml).unwrap();
        config
    }

    /// Rewrite every node's config file with `acl` in place of the ACL
    /// rules of [`Security::acl`] (the kit's own rule stays), and with
    /// `yaml` appended instead of [`ClusterOptions::yaml`]; running nodes
    /// read it on SIGHUP ([`Cluster::signal`]).
    pub fn rewrite_configs(&mut self, acl: &str, yaml: &str) {
        let tokens_file = self.dir().join("tokens.yaml");
        self.security_yaml = security_sections(&tokens_file, acl);
        self.extra_yaml = yaml.to_string();
        for id in self.ids() {
            self.write_config(id);
        }
    }

    /// Send `signal` to node `id`, if it runs (SIGHUP: reload its config).
    pub fn signal(&self, id: u64, signal: nix::sys::signal::Signal) {
        if let Some(p) = self.nodes.get(&id) {
            p.signal(signal);
        }
    }

    /// SIGKILL node `id` (no-op if it is not running).
    pub fn kill(&mut self, id: u64) {
        self.nodes.remove(&id);
    }

    /// SIGTERM node `id` (a graceful stop: a leader hands over first) and
    /// wait for it to exit, SIGKILL after `within`; its exit code.
    pub async fn terminate(&mut self, id: u64, within: Duration) -> Option<i32> {
        let mut proc = self.nodes.remove(&id)?;
        proc.signal(nix::sys::signal::Signal::SIGTERM);
        proc.exit_within(within).await // dropped after: SIGKILL if still running
    }

    /// SIGKILL every node.
    pub fn kill_all(&mut self) {
        self.nodes.clear();
    }

    /// SIGKILL node `id` and start it again on the same data.
    pub fn restart(&mut self, id: u64) {
        self.kill(id);
        self.spawn(id);
    }

    /// Start node `id` if it is not running.
    pub fn start_node(&mut self, id: u64) {
        if !self.nodes.contains_key(&id) {
            self.spawn(id);
        }
    }

    /// Start a node that is not a member yet, with an id no node of this
    /// cluster had (so an empty data directory), on ports of
    /// its own, its `peers` listing every node (through relays if the
    /// cluster has them); the others reach it at [`Cluster::peer_url`] once
    /// it is added (`member add`). Its id.
    pub async fn add_node(&mut self) -> u64 {
        self.last_id += 1;
        let id = self.last_id;
        let (client, peer) = (reserve(), reserve());
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        self.urls.insert(id, format!("{scheme}://127.0.0.1:{}", client.port));
        self.peer_urls.insert(id, format!("{scheme}://127.0.0.1:{}", peer.port));
        if !self.relays.is_empty() {
            for other in self.ids().into_iter().filter(|o| *o != id) {
                let to = self.peer_urls[&other].rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
                self.relays.insert((id, other), Relay::start(to).await);
            }
        }
        self._reserved.extend([client, peer]);
        self.spawn(id);
        id
    }

    /// SIGKILL node `id` and forget it: a member removed for good.
    pub fn drop_node(&mut self, id: u64) {
        self.kill(id);
        self.urls.remove(&id);
        self.peer_urls.remove(&id);
        self.relays.retain(|(from, to), _| *from != id && *to != id);
    }

    /// Start every node that is not running.
    pub fn start_all(&mut self) {
        for id in self.ids() {
            self.start_node(id);
        }
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.nodes.contains_key(&id)
    }

    /// Node `id`'s pid (it must be running).
    pub fn pid(&self, id: u64) -> u32 {
        self.nodes[&id].pid()
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) node `id`.
    pub fn freeze(&self, id: u64, frozen: bool) {
        if let Some(p) = self.nodes.get(&id) {
            p.freeze(frozen);
        }
    }

    fn relay(&self, from: u64, to: u64) -> &Relay {
        self.relays.get(&(from, to)).unwrap_or_else(|| panic!("no relay {from} -> {to}: started without relays?"))
    }

    /// Cut (or heal) only the direction `from` -> `to`: `from`'s requests to
    /// `to` are lost, `to` still reaches `from`.
    pub fn set_one_way(&self, from: u64, to: u64, cut: bool) {
        self.relay(from, to).set_cut(cut);
    }

    /// Cut (or heal) both directions between `a` and `b`.
    pub fn set_link(&self, a: u64, b: u64, cut: bool) {
        self.set_one_way(a, b, cut);
        self.set_one_way(b, a, cut);
    }

    /// Cut `id` off from every other node (clients can still reach it).
    pub fn isolate(&self, id: u64, cut: bool) {
        for other in self.ids().into_iter().filter(|o| *o != id) {
            self.set_link(id, other, cut);
        }
    }

    /// Heal every link.
    pub fn heal_all(&self) {
        for r in self.relays.values() {
            r.set_cut(false);
        }
    }

    /// A client of every node (on a secure cluster: the kit's own, an admin).
    pub fn client(&self) -> Client {
        Client::with_options(self.urls(), self.options.clone()).unwrap()
    }

    /// A client that can only talk to node `id` (which forwards leader calls).
    /// The seed's picture on `key` through `sc` (which fences `path` with
    /// lock key `key`): A's lease lapses unreleased, B takes the lock and
    /// writes; A's late write is refused (409). A's and B's tokens.
    pub async fn stale_write(&self, sc: &crate::Sidecar, key: &str, path: &str) -> (u64, u64) {
        use fencegate_client::AcquireOptions;
        let a = self.client().acquire(key, AcquireOptions::new(Duration::from_millis(500))).await.unwrap();
        let ta = a.token();
        drop(a);
        let waits = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
        let tb = self.client().acquire(key, waits).await.unwrap().token();
        assert_eq!(sc.send("PUT", path, Some(tb), &[]).await.0, 200, "B's write");
        assert_eq!(sc.send("PUT", path, Some(ta), &[]).await.0, 409, "A's stale write");
        (ta, tb)
    }

    pub fn client_of(&self, id: u64) -> Client {
        Client::with_options(vec![self.url(id)], self.options.clone()).unwrap()
    }

    /// The kit's client options (TLS, its admin token), for clients of one's own.
    pub fn client_options(&self) -> ClientOptions {
        self.options.clone()
    }

    /// A client of every node presenting `token` (secure clusters).
    pub fn client_with_token(&self, token: &str) -> Client {
        let options = ClientOptions { token: Some(token.into()), ..self.options.clone() };
        Client::with_options(self.urls(), options).unwrap()
    }

    /// A client of every node presenting a certificate naming `identity`
    /// (secure clusters), and no token.
    pub fn client_with_cert(&self, identity: &str) -> Client {
        let pki = self.pki.as_ref().expect("a secure cluster");
        let (cert, key) = pki.client_cert(identity);
        let files = TlsFiles { ca: pki.ca.clone(), cert: Some(cert), key: Some(key) };
        let tls = files.client_config(["ca", "cert", "key"]).unwrap();
        let options = ClientOptions { tls: Some(tls), token: None, ..self.options.clone() };
        Client::with_options(self.urls(), options).unwrap()
    }

    /// The cluster's CA and member certificates (secure clusters).
    /// The members' shared secret's file, on a secure cluster in plain HTTP
    /// (mode 0600; a test may rotate it and SIGHUP the nodes).
    pub fn peer_secret_file(&self) -> Option<&Path> {
        self.peer_secret.as_deref()
    }

    pub fn pki(&self) -> Option<&Pki> {
        self.pki.as_ref()
    }

    /// A watch of node `id`'s own applied state (`query`: `prefix=...`), as the kit.
    pub async fn watch(&self, id: u64, query: &str) -> crate::Watch {
        let url = format!("{}/v1/watch?{query}", self.url(id));
        crate::Watch::try_open_with(&self.http, &url, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("watch {url}: {e}"))
    }

    /// GET `path` of node `id` as the kit (2 s at most); the answer's body.
    pub async fn get(&self, id: u64, path: &str) -> Option<bytes::Bytes> {
        let url = format!("{}{path}", self.url(id));
        let a = self.http.call(hyper::Method::GET, &url, None, Duration::from_secs(2)).await.ok()?;
        Some(a.body)
    }

    /// `GET /v1/cluster` of node `id` itself, `None` if it does not answer.
    pub async fn cluster_info(&self, id: u64) -> Option<ClusterInfo> {
        serde_json::from_slice(&self.get(id, "/v1/cluster").await?).ok()
    }

    /// The leader as the first answering running node sees it.
    pub async fn leader(&self) -> Option<u64> {
        for id in self.nodes.keys() {
            if let Some(l) = self.cluster_info(*id).await.and_then(|c| c.leader) {
                return Some(l);
            }
        }
        None
    }

    /// Until the given nodes agree on a leader among them; returns it.
    pub async fn wait_for_leader_among(&self, nodes: &[u64], within: Duration) -> u64 {
        let what = format!("a leader all of {nodes:?} agree on");
        wait::until_ok(&what, within, || async {
            let mut leaders = vec![];
            for id in nodes {
                leaders.push(self.cluster_info(*id).await.and_then(|c| c.leader));
            }
            match leaders.first() {
                Some(Some(l)) if nodes.contains(l) && leaders.iter().all(|x| *x == Some(*l)) => Ok(*l),
                _ => Err(leaders),
            }
        })
        .await
    }

    /// Until the running nodes agree on a leader; returns it.
    pub async fn wait_for_leader(&self, within: Duration) -> u64 {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        self.wait_for_leader_among(&ids, within).await
    }

    /// Until node `id` has itself *applied* up to `index` (its own
    /// `/v1/cluster` `commit_index`, which is its applied index; reads it
    /// would forward to the leader say nothing about that); its info then.
    pub async fn wait_for_applied(&self, id: u64, index: u64, within: Duration) -> ClusterInfo {
        let what = format!("node {id} applying up to index {index}");
        wait::until_ok(&what, within, || async {
            match self.cluster_info(id).await {
                Some(info) if info.commit_index >= index => Ok(info),
                other => Err(other.map(|i| i.commit_index)),
            }
        })
        .await
    }

    /// Until `n` acquires are parked waiting for their keys, over all
    /// running nodes (`fencegate_lock_waiters`): the signal that a waiter
    /// has joined its queue.
    pub async fn wait_for_waiters(&self, n: u64, within: Duration) {
        wait::until_ok(&format!("{n} waiting acquires"), within, || async {
            let mut total = 0.0;
            for id in self.nodes.keys() {
                let text = self.get(*id, "/metrics").await.unwrap_or_default();
                total += http::metric(&String::from_utf8_lossy(&text), "fencegate_lock_waiters").unwrap_or(0.0);
            }
            if total as u64 == n {
                Ok(())
            } else {
                Err(total)
            }
        })
        .await
    }

    /// A sidecar in `dir()/name` asking this cluster, in front of `upstream`,
    /// with `yaml` (its routes and any other sections).
    pub async fn sidecar(&self, name: &str, upstream: &str, yaml: &str) -> Sidecar {
        let o = SidecarOptions { lock_service: self.urls(), yaml: yaml.into(), ..Default::default() };
        self.sidecar_with(name, upstream, o).await
    }

    /// A sidecar as [`Cluster::sidecar`] with `o` (its `lock_service` is
    /// set to this cluster; on a secure one, with the CA and a token for
    /// `o.identity`, which must be one of [`Security::tokens`]).
    pub async fn sidecar_with(&self, name: &str, upstream: &str, mut o: SidecarOptions) -> Sidecar {
        o.lock_service = self.urls();
        if let Some(pki) = &self.pki {
            let token = o.lock_token.take().unwrap_or_else(|| KIT_TOKEN.into());
            let token_file = self.dir().join(format!("{name}.token"));
            std::fs::write(&token_file, format!("{token}\n")).unwrap();
            o.lock_service_yaml = format!("  ca: {}\n  token_file: {}\n", pki.ca.display(), token_file.display());
        }
        Sidecar::start_with(&self.bin, self.dir().join(name), upstream, o).await
    }
}

/// The PKI (none when `plain`), the kit's client options and the nodes'
/// security sections (TLS is per node: see `spawn`) of a secure cluster in `dir`.
fn secure(dir: &Path, sec: &Security) -> (Option<Pki>, ClientOptions, String) {
    let tokens_file = dir.join("tokens.yaml");
    let kit = (KIT_IDENTITY.to_string(), KIT_TOKEN.to_string());
    let lines: String = sec
        .tokens
        .iter()
        .chain([&kit])
        .map(|(identity, token)| format!("{identity:?}: {}\n", crate::tls::token_hash(token)))
        .collect();
    std::fs::write(&tokens_file, lines).unwrap();
    let yaml = security_sections(&tokens_file, &sec.acl);
    if sec.plain {
        return (None, ClientOptions { token: Some(KIT_TOKEN.into()), ..ClientOptions::default() }, yaml);
    }
    let pki = Pki::new(&dir.join("pki"), "cluster");
    let tls = TlsFiles { ca: pki.ca.clone(), cert: None, key: None }.client_config(["ca", "cert", "key"]).unwrap();
    let options = ClientOptions { tls: Some(tls), token: Some(KIT_TOKEN.into()), ..ClientOptions::default() };
    (Some(pki), options, yaml)
}

/// A members' shared secret in `dir`, readable by its owner only.
fn peer_secret(dir: &Path) -> PathBuf {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).unwrap();
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join("peer-secret");
    std::fs::write(&path, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// The `auth` and `acl` sections of a secure cluster's nodes: the kit's
/// own rule, then `acl`.
fn security_sections(tokens_file: &Path, acl: &str) -> String {
    format!(
        "auth:\n  tokens_file: {}\nacl:\n  - {{ identity: {KIT_IDENTITY}, prefixes: [\"\"], rights: [admin] }}\n{acl}",
        tokens_file.display(),
    )
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for id in self.ids() {
                eprintln!(
                    "--- node {id} (last lines of {})\n{}",
                    self.log_path(id).display(),
                    tail(&self.log_of(id), 40)
                );
            }
        }
        // Killed before their directory goes (SIGKILL also ends a stopped process).
        self.nodes.clear();
    }
}
