//! A 3-member etcd cluster on loopback, set up like the fencegate cluster of
//! `super::fencegate_cluster`: data on the project's disk, fsync on, the same
//! election timeouts. Spoken to through etcd's JSON gateway (`/v3/...`).

use std::collections::BTreeMap;
use std::process::Command;

use fencegate_testkit::{free_ports, Proc};

pub struct Etcd {
    pub dir: tempfile::TempDir,
    /// Client URLs by member number 1..=3.
    pub urls: BTreeMap<u64, String>,
    peers: BTreeMap<u64, String>,
    members: BTreeMap<u64, Proc>,
}

/// Start the three members; returns at once (wait for a leader before use).
pub fn start_etcd() -> Etcd {
    // Data on the project's disk, not tmpfs, so fsync costs what it costs.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ports = free_ports::<6>();
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let mut e = Etcd {
        dir,
        urls: (1..=3).map(|i| (i, url(ports[i as usize - 1]))).collect(),
        peers: (1..=3).map(|i| (i, url(ports[i as usize + 2]))).collect(),
        members: BTreeMap::new(),
    };
    for id in 1..=3 {
        e.start_member(id);
    }
    e
}

impl Etcd {
    pub fn log(&self) -> std::path::PathBuf {
        self.dir.path().join("stderr.log")
    }

    /// (Re)start member `id` on its data directory (an existing one makes
    /// etcd ignore the --initial-* flags and rejoin).
    pub fn start_member(&mut self, id: u64) {
        let initial: Vec<String> = self.peers.iter().map(|(i, u)| format!("m{i}={u}")).collect();
        let (client, peer) = (&self.urls[&id], &self.peers[&id]);
        let data = self.dir.path().join(format!("m{id}"));
        let mut cmd = Command::new("etcd");
        cmd.arg(format!("--name=m{id}"))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", initial.join(",")))
            .arg("--initial-cluster-state=new")
            .arg("--initial-cluster-token=bench")
            // fencegate: elections after 300–600 ms; etcd draws its timeout
            // from [E, 2E). etcd refuses E < 5 heartbeats, so its heartbeat is
            // 60 ms where fencegate's is 100 ms.
            .arg("--heartbeat-interval=60")
            .arg("--election-timeout=300")
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .arg("--log-level=warn");
        let proc = Proc::spawn(&format!("etcd{id}"), cmd, &self.log());
        self.members.insert(id, proc);
    }

    /// SIGKILL member `id`.
    pub fn kill_member(&mut self, id: u64) {
        self.members.remove(&id);
    }

    pub fn member_pid(&self, id: u64) -> u32 {
        self.members[&id].pid()
    }
}

/// Standard base64 with padding, as the JSON gateway wants keys and values.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}
