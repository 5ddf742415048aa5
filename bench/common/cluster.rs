//! A 3-node `fencegate server` cluster on loopback (fsync on, data on the
//! project's disk), plus other `fencegate` processes such as a sidecar.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fencegate_client::Client;
use tokio::time::Instant;

use super::procs::Proc;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub urls: BTreeMap<u64, String>,
    nodes: BTreeMap<u64, Proc>,
    others: Vec<Proc>,
}

/// The fencegate binary this benchmark was built with.
pub fn fencegate(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencegate"));
    cmd.args(args).env("FENCEGATE_LOG", "warn");
    cmd
}

pub async fn start_cluster() -> Cluster {
    start_cluster_with("").await
}

/// A cluster whose nodes' configs end with `extra_yaml` (a `raft:` section, say).
pub async fn start_cluster_with(extra_yaml: &str) -> Cluster {
    // Data on the project's disk, not tmpfs, so fsync costs what it costs.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let urls: BTreeMap<u64, String> =
        (1..=3).zip(super::free_ports::<3>()).map(|(i, p)| (i, format!("http://127.0.0.1:{p}"))).collect();
    let peers: String = urls.iter().map(|(i, u)| format!("  {i}: {u}\n")).collect();
    for (id, url) in &urls {
        let listen = url.trim_start_matches("http://");
        let yaml = format!(
            "id: {id}\nlisten: {listen}\ndata_dir: {}/data{id}\npeers:\n{peers}{extra_yaml}",
            dir.path().display()
        );
        std::fs::write(dir.path().join(format!("node{id}.yaml")), yaml).unwrap();
    }
    let mut c = Cluster { dir, urls, nodes: BTreeMap::new(), others: vec![] };
    for id in 1..=3 {
        c.start_node(id);
    }
    let client = c.client();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.read("bench/ready").await.is_err() {
        assert!(Instant::now() < deadline, "cluster did not come up; see {}", c.log().display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c
}

impl Cluster {
    pub fn endpoints(&self) -> Vec<String> {
        self.urls.values().cloned().collect()
    }

    pub fn client(&self) -> Client {
        Client::new(self.endpoints()).unwrap()
    }

    /// Where every process's stderr goes.
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("stderr.log")
    }

    /// (Re)start node `id` on its data directory.
    pub fn start_node(&mut self, id: u64) {
        let config = self.dir.path().join(format!("node{id}.yaml"));
        let proc = Proc::spawn(
            &format!("node{id}"),
            &mut fencegate(&["server", "--config", config.to_str().unwrap()]),
            &self.log(),
        );
        self.nodes.insert(id, proc);
    }

    /// SIGKILL node `id`.
    pub fn kill_node(&mut self, id: u64) {
        if let Some(mut p) = self.nodes.remove(&id) {
            p.kill();
        }
    }

    pub fn node(&self, id: u64) -> &Proc {
        &self.nodes[&id]
    }

    /// The leader's id, as the cluster reports it.
    pub async fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(id)) = self.client().cluster().await.map(|c| c.leader) {
                return id;
            }
            assert!(Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Run another `fencegate` process (a sidecar, say) for as long as the cluster.
    pub fn also_run(&mut self, name: &str, args: &[&str]) -> &Proc {
        let proc = Proc::spawn(name, &mut fencegate(args), &self.log());
        self.others.push(proc);
        self.others.last().unwrap()
    }
}
