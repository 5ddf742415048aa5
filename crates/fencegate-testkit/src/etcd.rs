//! A 3-member etcd cluster on loopback (Debian's `etcd-server`), set up like
//! the fencegate cluster of the tests and benches: data on disk, fsync on,
//! the same election timeouts. The lock-service tests fence its
//! `etcdctl lock` locks; the benches compare against it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{free_ports, Proc};

pub struct Etcd {
    pub dir: tempfile::TempDir,
    /// More flags for every member (`--auth-token-ttl=1`).
    args: Vec<String>,
    /// With TLS toward clients: the CA, and a client certificate and key
    /// it signed, which `etcdctl` presents.
    tls: Option<[PathBuf; 3]>,
    /// Client URLs by member number 1..=3.
    pub urls: BTreeMap<u64, String>,
    peers: BTreeMap<u64, String>,
    members: BTreeMap<u64, Proc>,
}

impl Etcd {
    /// Start the three members with their data under `parent`; returns at
    /// once (`ready` waits for a leader).
    pub fn start(parent: &Path) -> Etcd {
        Self::start_with(parent, &[])
    }

    /// The same, every member with `args` too.
    pub fn start_with(parent: &Path, args: &[&str]) -> Etcd {
        Self::start_full(parent, args, None)
    }

    /// The same, serving clients over TLS with `pki`'s server certificate
    /// and requiring a client certificate it signed; `etcdctl` presents
    /// one of its own.
    pub fn start_tls(parent: &Path, pki: &crate::tls::Pki) -> Etcd {
        let (cert, key) = pki.client_cert("etcdctl");
        let mut args = vec![
            format!("--cert-file={}", pki.cert.display()),
            format!("--key-file={}", pki.key.display()),
            format!("--trusted-ca-file={}", pki.ca.display()),
        ];
        args.push("--client-cert-auth".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::start_full(parent, &args, Some([pki.ca.clone(), cert, key]))
    }

    fn start_full(parent: &Path, args: &[&str], tls: Option<[PathBuf; 3]>) -> Etcd {
        let dir = tempfile::tempdir_in(parent).unwrap();
        let ports = free_ports::<6>();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut e = Etcd {
            dir,
            args: args.iter().map(|a| a.to_string()).collect(),
            tls,
            urls: (1..=3).map(|i| (i, format!("{scheme}://127.0.0.1:{}", ports[i as usize - 1]))).collect(),
            peers: (1..=3).map(|i| (i, format!("http://127.0.0.1:{}", ports[i as usize + 2]))).collect(),
            members: BTreeMap::new(),
        };
        for id in 1..=3 {
            e.start_member(id);
        }
        e
    }

    pub fn log(&self) -> PathBuf {
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
            .arg("--initial-cluster-token=fencegate-test")
            // fencegate: elections after 300–600 ms; etcd draws its timeout
            // from [E, 2E). etcd refuses E < 5 heartbeats, so its heartbeat is
            // 60 ms where fencegate's is 100 ms.
            .arg("--heartbeat-interval=60")
            .arg("--election-timeout=300")
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .arg("--log-level=warn")
            .args(&self.args);
        let proc = Proc::spawn(&format!("etcd{id}"), cmd, &self.log());
        self.members.insert(id, proc);
    }

    /// `etcdctl snapshot save` from member 1 into `file`.
    pub fn snapshot(&self, file: &Path) {
        let mut save = self.etcdctl();
        save.env_remove("ETCDCTL_ENDPOINTS").args(["--endpoints", &self.urls[&1], "snapshot", "save"]).arg(file);
        let out = save.output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    /// What an operator does after losing the cluster: every member killed,
    /// its data replaced by `etcdctl snapshot restore` of `file` with the
    /// cluster's own flags (so the cluster keeps its id while its revisions
    /// go back), and started again; returns at once (`ready` waits).
    pub fn restore(&mut self, file: &Path) {
        let initial: Vec<String> = self.peers.iter().map(|(i, u)| format!("m{i}={u}")).collect();
        for id in 1..=3 {
            self.kill_member(id);
        }
        for id in 1..=3 {
            let data = self.dir.path().join(format!("m{id}"));
            std::fs::remove_dir_all(&data).unwrap();
            let mut restore = self.etcdctl();
            restore.arg("snapshot").arg("restore").arg(file);
            restore
                .arg(format!("--name=m{id}"))
                .arg(format!("--data-dir={}", data.display()))
                .arg(format!("--initial-cluster={}", initial.join(",")))
                .arg("--initial-cluster-token=fencegate-test")
                .arg(format!("--initial-advertise-peer-urls={}", self.peers[&id]));
            let out = restore.output().unwrap();
            assert!(out.status.success(), "{out:?}");
        }
        for id in 1..=3 {
            self.start_member(id);
        }
    }

    /// SIGKILL member `id`.
    pub fn kill_member(&mut self, id: u64) {
        self.members.remove(&id);
    }

    pub fn member_pid(&self, id: u64) -> u32 {
        self.members[&id].pid()
    }

    /// The client URLs, comma-separated, as `etcdctl --endpoints` takes them.
    pub fn endpoints(&self) -> String {
        self.urls.values().cloned().collect::<Vec<_>>().join(",")
    }

    /// `etcdctl` (Debian's `etcd-client`) against this cluster, v3 API.
    pub fn etcdctl(&self) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3").env("ETCDCTL_ENDPOINTS", self.endpoints());
        if let Some([ca, cert, key]) = &self.tls {
            cmd.env("ETCDCTL_CACERT", ca).env("ETCDCTL_CERT", cert).env("ETCDCTL_KEY", key);
        }
        cmd
    }

    /// Until every member is healthy (`etcdctl endpoint health`: it has a
    /// leader and answers a read); within 30 s, else a panic with the
    /// members' log.
    pub async fn ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for url in self.urls.values() {
            loop {
                let mut health = self.etcdctl();
                health.env_remove("ETCDCTL_ENDPOINTS");
                health.args(["--dial-timeout=1s", "--command-timeout=2s", "endpoint", "health", "--endpoints", url]);
                let out = tokio::task::spawn_blocking(move || health.output()).await.unwrap().unwrap();
                if out.status.success() {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    let log = std::fs::read_to_string(self.log()).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(20).collect();
                    panic!("etcd {url} not healthy within 30 s: {out:?}\n{}", tail.join("\n"));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// `etcdctl lock`'s lease, in seconds: a holder killed or paused is gone
/// this long after.
pub const LOCK_TTL_S: u64 = 2;

/// A holder: `etcdctl lock NAME` running a command that writes what it was
/// given (`ETCD_LOCK_KEY`'s fields, `ETCD_LOCK_REV`) under `dir/who`, then
/// holds the lock until killed, or until its command is ended (`release`).
pub struct Holder {
    pub proc: Proc,
    /// Where its command writes what it was given.
    pub files: PathBuf,
}

impl Holder {
    /// `etcdctl lock --ttl=LOCK_TTL_S NAME`, its files under `dir/who`.
    pub fn start(etcd: &Etcd, dir: &Path, who: &str, name: &str) -> Holder {
        Self::start_as(etcd, dir, who, name, None)
    }

    /// The same as etcd user `user` (`name:password`).
    pub fn start_as(etcd: &Etcd, dir: &Path, who: &str, name: &str, user: Option<&str>) -> Holder {
        let files = dir.join(who);
        std::fs::create_dir_all(&files).unwrap();
        let script = format!(
            r#"etcdctl get "$ETCD_LOCK_KEY" -w fields > {f}/fields.tmp && echo "$ETCD_LOCK_REV" > {f}/rev && echo $$ > {f}/pid && mv {f}/fields.tmp {f}/fields && exec sleep 600"#,
            f = files.display()
        );
        let mut cmd = etcd.etcdctl();
        if let Some(user) = user {
            cmd.env("ETCDCTL_USER", user);
        }
        cmd.args(["lock", &format!("--ttl={LOCK_TTL_S}"), name, "--", "sh", "-c", &script]);
        let proc = Proc::spawn(&format!("etcdctl-lock-{who}"), cmd, &dir.join(format!("{who}.log")));
        Holder { proc, files }
    }

    /// Until the lock is held: the holder key's create revision (the token)
    /// and `ETCD_LOCK_REV`.
    pub async fn token(&self) -> (u64, u64) {
        let fields = self.files.join("fields");
        crate::wait::until("the lock held", Duration::from_secs(30), || {
            let exists = fields.exists();
            async move { exists }
        })
        .await;
        self.held().unwrap()
    }

    /// The token and `ETCD_LOCK_REV`, once the command has written them.
    pub fn held(&self) -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(self.files.join("fields")).ok()?;
        let line = text.lines().find(|l| l.contains("\"CreateRevision\"")).unwrap_or_else(|| panic!("{text}"));
        let created = line.rsplit(':').next().unwrap().trim().parse().unwrap();
        let rev = std::fs::read_to_string(self.files.join("rev")).unwrap().trim().parse().unwrap();
        Some((created, rev))
    }

    /// End the command (SIGTERM to it): `etcdctl lock` then releases the
    /// lock, if it still holds it, and exits.
    pub fn release(&self) {
        let pid = std::fs::read_to_string(self.files.join("pid")).unwrap();
        let pid = nix::unistd::Pid::from_raw(pid.trim().parse().unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
}

impl crate::verify::recipe::Holder for Holder {
    fn token(&self) -> Option<u64> {
        self.held().map(|(token, _)| token)
    }

    fn process(&mut self) -> &mut Proc {
        &mut self.proc
    }

    fn release(&self) {
        Holder::release(self)
    }
}
