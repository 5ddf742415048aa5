//! Shared by the benchmarks: a 3-node `fencegate server` cluster (and other
//! `fencegate` processes) on loopback, killed when dropped.
#![allow(dead_code)] // each benchmark uses a part

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fencegate::client::Client;
use tokio::time::Instant;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub urls: BTreeMap<u64, String>,
    children: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `N` distinct free ports (all held until every one is chosen).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> =
        (0..N).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

pub async fn start_cluster() -> Cluster {
    // Data on the project's disk, not tmpfs, so fsync costs what it costs.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let urls: BTreeMap<u64, String> =
        (1..=3).zip(free_ports::<3>()).map(|(i, p)| (i, format!("http://127.0.0.1:{p}"))).collect();
    let peers: String = urls.iter().map(|(i, u)| format!("  {i}: {u}\n")).collect();
    let mut children = vec![];
    for (id, url) in &urls {
        let path = dir.path().join(format!("node{id}.yaml"));
        let listen = url.trim_start_matches("http://");
        let yaml = format!("id: {id}\nlisten: {listen}\ndata_dir: {}/data{id}\npeers:\n{peers}", dir.path().display());
        std::fs::write(&path, yaml).unwrap();
        children.push(spawn(&["server", "--config", path.to_str().unwrap()]));
    }
    let c = Cluster { dir, urls, children };
    let client = Client::new(c.urls.values().cloned().collect()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.read("bench/ready").await.is_err() {
        assert!(Instant::now() < deadline, "cluster did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c
}

impl Cluster {
    pub fn endpoints(&self) -> Vec<String> {
        self.urls.values().cloned().collect()
    }

    /// Run another `fencegate` process (a sidecar, say) for as long as the cluster.
    pub fn also_run(&mut self, args: &[&str]) {
        self.children.push(spawn(args));
    }
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args(args)
        .env("FENCEGATE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}
