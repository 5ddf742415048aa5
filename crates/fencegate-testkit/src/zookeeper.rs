//! A 3-server ZooKeeper ensemble on loopback (Debian's `zookeeper`, run
//! directly with `java`), set up for the lock-service tests: data on disk,
//! fsync on, sessions that expire within seconds; and [`Holder`]s, lock
//! holders written as applications write them, with the Python client kazoo
//! and its Lock recipe, whose fencing token is the czxid of their lock
//! znode (docs/decisions/0010). `.ci/lockservices` installs both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::files::copy_dir;
use crate::ports::{reserve, Reserved};
use crate::process::tail;
use crate::Proc;

/// The session timeout the holders ask for, in seconds: a holder killed or
/// paused loses its session, and so its lock, about this long after its
/// last heartbeat (ZooKeeper expires sessions on its ticks).
pub const SESSION_TIMEOUT_S: u64 = 2;

/// Debian's `libzookeeper-java`; its manifest's Class-Path names the jars it
/// needs.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// The server logs through slf4j, which without a binding logs nothing:
/// log4j 1.2 (both jars come with the package's dependencies).
const LOGGING_JARS: [&str; 2] = ["/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"];

const LOG4J_PROPERTIES: &str = include_str!("zookeeper/log4j.properties");
const HOLDER_PY: &str = include_str!("zookeeper/holder.py");

/// What `kazoo()` runs before a test's code: `zk`, a client connected to
/// the hosts in argv[1], authenticated by the digest in argv[2] if given.
const KAZOO_PRELUDE: &str = r#"import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1], auth_data=[("digest", sys.argv[2])] if len(sys.argv) > 2 else None)
zk.start(timeout=30)
"#;

pub struct ZooKeeper {
    pub dir: tempfile::TempDir,
    /// Client ports by server id 1..=3.
    pub clients: BTreeMap<u64, u16>,
    /// The digest superuser's password, if the ensemble has one.
    superuser: Option<String>,
    /// Held for the ensemble's life (ZooKeeper binds them with
    /// SO_REUSEADDR): a restarted server gets its ports back, and no other
    /// test is handed them meanwhile.
    _ports: Vec<Reserved>,
    /// Behind a lock so that `ready` may start a server again.
    servers: std::sync::Mutex<BTreeMap<u64, Proc>>,
}

impl ZooKeeper {
    /// Start the three servers with their data under `parent`; returns at
    /// once (`ready` waits for a leader).
    pub fn start(parent: &Path) -> ZooKeeper {
        Self::start_full(parent, None)
    }

    /// The same, with a digest superuser `super:PASSWORD`, who may do
    /// anything to any znode whatever its ACL; `kazoo` runs as it.
    pub fn start_with_superuser(parent: &Path, password: &str) -> ZooKeeper {
        Self::start_full(parent, Some(password))
    }

    fn start_full(parent: &Path, superuser: Option<&str>) -> ZooKeeper {
        assert!(
            Path::new(ZOOKEEPER_JAR).exists(),
            "{ZOOKEEPER_JAR} missing: Debian's zookeeper is not installed (`bash .ci/lockservices` installs it)"
        );
        let dir = tempfile::tempdir_in(parent).unwrap();
        // Per server: client, quorum (the leader's, to its followers), election.
        let ports: Vec<Reserved> = (0..9).map(|_| reserve()).collect();
        let port = |id: u64, kind: usize| ports[(id as usize - 1) * 3 + kind].port;
        let members: String =
            (1..=3).map(|id| format!("server.{id}=127.0.0.1:{}:{}\n", port(id, 1), port(id, 2))).collect();
        for id in 1..=3 {
            write_server_files(dir.path(), id, port(id, 0), &members);
        }
        std::fs::write(dir.path().join("log4j.properties"), LOG4J_PROPERTIES).unwrap();
        let mut zk = ZooKeeper {
            dir,
            clients: (1..=3).map(|id| (id, port(id, 0))).collect(),
            superuser: superuser.map(str::to_string),
            _ports: ports,
            servers: Default::default(),
        };
        for id in 1..=3 {
            zk.start_server(id);
        }
        zk
    }

    /// The servers' stderr, one file for the three; each line names its
    /// server (`zk2`).
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("stderr.log")
    }

    /// (Re)start server `id` on its data directory.
    pub fn start_server(&mut self, id: u64) {
        let proc = self.spawn(id);
        self.servers.get_mut().unwrap().insert(id, proc);
    }

    fn spawn(&self, id: u64) -> Proc {
        let mut cmd = Command::new("java");
        // Three JVMs share the machine (two cores in CI) with the tests: a
        // small heap, one GC thread, and only the quick JIT (ZooKeeper's
        // throughput does not matter here, its start-up time does).
        cmd.args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"])
            .arg(format!("-Dlog4j.configuration=file:{}", self.dir.path().join("log4j.properties").display()))
            .arg(format!("-Dfencegate.zk.id={id}"));
        if let Some(password) = &self.superuser {
            cmd.arg(format!("-Dzookeeper.DigestAuthenticationProvider.superDigest={}", super_digest(password)));
        }
        let classpath: Vec<&str> = [ZOOKEEPER_JAR].into_iter().chain(LOGGING_JARS).collect();
        cmd.arg("-cp")
            .arg(classpath.join(":"))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(self.dir.path().join(format!("zk{id}.cfg")));
        Proc::spawn(&format!("zk{id}"), cmd, &self.log())
    }

    /// SIGKILL server `id`.
    pub fn kill_server(&mut self, id: u64) {
        self.servers.get_mut().unwrap().remove(&id);
    }

    /// What an operator backs up: every server stopped (SIGKILL), its data
    /// directory copied under `to`, and started again; returns at once
    /// (`ready` waits).
    pub fn backup(&mut self, to: &Path) {
        self.with_servers_stopped(|data, id| copy_dir(&data, &to.join(format!("zk{id}"))));
    }

    /// What an operator does after losing the ensemble: every server
    /// stopped, its data directory replaced by `backup`'s copy, and started
    /// again (it keeps its ports and ids; its zxids go back to the
    /// backup's); returns at once (`ready` waits).
    pub fn restore(&mut self, from: &Path) {
        self.with_servers_stopped(|data, id| {
            std::fs::remove_dir_all(&data).unwrap();
            copy_dir(&from.join(format!("zk{id}")), &data);
        });
    }

    fn with_servers_stopped(&mut self, each: impl Fn(PathBuf, u64)) {
        for id in 1..=3 {
            self.kill_server(id);
        }
        for id in 1..=3 {
            each(self.dir.path().join(format!("zk{id}")), id);
        }
        for id in 1..=3 {
            self.start_server(id);
        }
    }

    pub fn server_pid(&self, id: u64) -> u32 {
        self.servers.lock().unwrap()[&id].pid()
    }

    /// The connect string: every server's client address, comma-separated.
    pub fn hosts(&self) -> String {
        self.clients.values().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// Server `id`'s role (`leader`, `follower`) by the `srvr` command on
    /// its client port; `None` while it does not serve (down, electing,
    /// syncing with the leader).
    pub async fn mode(&self, id: u64) -> Option<String> {
        let answer = four_letter_word(self.clients[&id], "srvr").await?;
        answer.lines().find_map(|l| l.strip_prefix("Mode: ")).map(str::to_string)
    }

    /// The server that leads, if one does.
    pub async fn leader(&self) -> Option<u64> {
        for id in self.ids() {
            if self.mode(id).await.as_deref() == Some("leader") {
                return Some(id);
            }
        }
        None
    }

    /// The servers started (and not killed since).
    fn ids(&self) -> Vec<u64> {
        self.servers.lock().unwrap().keys().copied().collect()
    }

    /// Until every running server serves and one of them leads; within
    /// 60 s, else a panic with the servers' log.
    ///
    /// A server that exits because it cannot load its data is emptied and
    /// started again, once per call, as its operator would: it then syncs
    /// from the others. ZooKeeper 3.8.0 killed at the wrong moment (a
    /// backup's SIGKILL) was seen to leave a data directory it could not
    /// start from, twice in CI and once in about 90 runs of the restore test
    /// on a loaded machine: a transaction log file created, and no header
    /// written in it yet (ZOOKEEPER-2332, fixed after 3.8.0). The tests are
    /// about the sidecar, not that.
    pub async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut emptied = vec![];
        loop {
            let mut modes = BTreeMap::new();
            for id in self.ids() {
                self.start_again_if_it_could_not_load(id, &mut emptied);
                modes.insert(id, self.mode(id).await);
            }
            let serving = modes.values().all(Option::is_some);
            if serving && modes.values().any(|m| m.as_deref() == Some("leader")) {
                return;
            }
            if Instant::now() > deadline {
                // The lagging servers' own lines (a stack trace's too): why
                // they did not join.
                let log = std::fs::read_to_string(self.log()).unwrap_or_default();
                let lagging: Vec<u64> = modes.iter().filter(|(_, m)| m.is_none()).map(|(&id, _)| id).collect();
                let theirs = lines_of(&log, &lagging);
                panic!("ZooKeeper not ready within 60 s (servers' modes: {modes:?})\n{}", tail(&theirs, 60));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `ready`'s remedy for a server that exited (its lines are printed);
    /// a panic if it exited for another reason or was emptied already.
    fn start_again_if_it_could_not_load(&self, id: u64, emptied: &mut Vec<u64>) {
        let Some(status) = self.servers.lock().unwrap().get_mut(&id).and_then(Proc::exited) else { return };
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let theirs = lines_of(&log, &[id]);
        let last = last_start(&theirs);
        // Its error comes before two stack traces: looked for in all it
        // wrote since it started, shown by the end.
        let lines = tail(last, 60);
        if emptied.contains(&id) || !last.contains("Unable to load database on disk") {
            panic!("ZooKeeper server zk{id} exited ({status})\n{lines}");
        }
        eprintln!(
            "zk{id} could not load its data ({status}); emptied and started again to sync from the others:\n{lines}"
        );
        std::fs::remove_dir_all(self.dir.path().join(format!("zk{id}")).join("version-2")).unwrap();
        emptied.push(id);
        let proc = self.spawn(id);
        self.servers.lock().unwrap().insert(id, proc);
    }

    /// Run Python `code` with `zk` a started kazoo client of this ensemble
    /// (authenticated as `super` if the ensemble has a superuser); its
    /// stdout. A failing script is a panic with its stderr.
    pub async fn kazoo(&self, code: &str) -> String {
        let mut cmd = Command::new(python());
        // Closing the session at the end deletes its ephemeral znodes at
        // once rather than when the session expires.
        cmd.arg("-c").arg(format!("{KAZOO_PRELUDE}{code}\nzk.stop()\n")).arg(self.hosts());
        if let Some(password) = &self.superuser {
            cmd.arg(format!("super:{password}"));
        }
        let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kazoo script failed ({}):\n{code}\n{stderr}", out.status);
        String::from_utf8(out.stdout).unwrap()
    }

    /// The children of znode `path`, by their last 10 characters: a lock's
    /// contenders in the order they queued, its holder first.
    pub async fn children(&self, path: &str) -> Vec<String> {
        // A JSON string is a Python string literal.
        let path = serde_json::to_string(path).unwrap();
        let code = format!("import json\nprint(json.dumps(sorted(zk.get_children({path}), key=lambda c: c[-10:])))");
        serde_json::from_str(&self.kazoo(&code).await).unwrap()
    }
}

/// The lines of the servers' shared log written by the servers `ids`: a
/// line names its server after its time (`12:00:00,000 zk2 …`), and a line
/// that names none (a stack trace's) is its predecessor's server's.
fn lines_of(log: &str, ids: &[u64]) -> String {
    let mut server = None;
    let mut kept = vec![];
    for line in log.lines() {
        let named = line.split(' ').nth(1).and_then(|w| w.strip_prefix("zk")).and_then(|id| id.parse::<u64>().ok());
        server = named.or(server);
        if server.is_some_and(|id| ids.contains(&id)) {
            kept.push(line);
        }
    }
    kept.join("\n")
}

/// What one server's lines (`lines_of`) say since its last start.
fn last_start(lines: &str) -> &str {
    lines.rfind("QuorumPeerConfig: Reading configuration from").map_or(lines, |i| &lines[i..])
}

/// Server `id`'s data directory (with its `myid`) and its configuration.
fn write_server_files(dir: &Path, id: u64, client_port: u16, members: &str) {
    let data = dir.join(format!("zk{id}"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("myid"), format!("{id}\n")).unwrap();
    // tickTime 500 ms: sessions may be as short as 2 ticks, so the holders'
    // 2 s fits, and ZooKeeper expires them on ticks (within 0.5 s of due).
    // initLimit: 10 s for a cold JVM to join and sync; syncLimit: a
    // follower silent for 2.5 s is dropped (and a leader without a quorum
    // that long steps down). forceSync is left on (fsync per write).
    // maxClientCnxns=0: every client comes from 127.0.0.1, and the default
    // limit of 60 per address counts them all. The AdminServer would take
    // a port of its own; the four-letter commands answer on the client port
    // instead (readiness asks `srvr`; `cons`, `mntr` help a failing test).
    let config = format!(
        "tickTime=500\ninitLimit=20\nsyncLimit=5\n\
         dataDir={}\nclientPort={client_port}\nclientPortAddress=127.0.0.1\n\
         maxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=*\n{members}",
        data.display()
    );
    std::fs::write(dir.join(format!("zk{id}.cfg")), config).unwrap();
}

/// The answer to four-letter command `word` on 127.0.0.1:`port`, if one
/// came within 2 s.
async fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(word.as_bytes()).await.ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        Some(answer)
    };
    tokio::time::timeout(Duration::from_secs(2), ask).await.ok().flatten()
}

/// The Python with kazoo: `FENCEGATE_KAZOO_PYTHON` (a path), else the gate's
/// virtualenv, where `.ci/lockservices` installs it.
fn python() -> PathBuf {
    let python = std::env::var_os("FENCEGATE_KAZOO_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ci-venv/bin/python"));
    assert!(
        python.exists(),
        "no Python with kazoo at {}: run `bash .ci/lockservices` at the workspace root (it installs kazoo into \
         target/ci-venv), or set FENCEGATE_KAZOO_PYTHON to a Python that has it",
        python.display()
    );
    python
}

/// The superDigest of user `super` with `password` (kazoo computes it as
/// ZooKeeper does).
fn super_digest(password: &str) -> String {
    let code = "import sys\nfrom kazoo.security import make_digest_acl_credential as d\nprint(d('super', sys.argv[1]))";
    let out = Command::new(python()).args(["-c", code, password]).output().unwrap();
    assert!(out.status.success(), "digest of super's password: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A holder: kazoo's Lock recipe on a lock path (`holder.py`), which writes
/// what it holds under `dir/who` once it holds the lock, then holds it until
/// SIGTERM (`release`), or until its session expires (killed, or paused
/// longer than `SESSION_TIMEOUT_S`).
pub struct Holder {
    pub proc: Proc,
    /// Where it writes what it holds.
    pub files: PathBuf,
}

/// What a holder writes once it holds the lock.
#[derive(serde::Deserialize)]
struct Held {
    node: String,
    token: u64,
}

impl Holder {
    /// Contend for the lock at `lock_path` (a znode whose children are the
    /// contenders), its files under `dir/who`, its log `dir/who.log`.
    pub fn start(zk: &ZooKeeper, dir: &Path, who: &str, lock_path: &str) -> Holder {
        Self::start_as(zk, dir, who, lock_path, None)
    }

    /// The same, authenticated by digest as `user` (`name:password`), its
    /// znodes (the lock's parents too, if it creates them) readable and
    /// writable by that user only.
    pub fn start_as(zk: &ZooKeeper, dir: &Path, who: &str, lock_path: &str, user: Option<&str>) -> Holder {
        let files = dir.join(who);
        std::fs::create_dir_all(&files).unwrap();
        let script = files.join("holder.py");
        std::fs::write(&script, HOLDER_PY).unwrap();
        let mut cmd = Command::new(python());
        cmd.arg(&script)
            .args([zk.hosts().as_str(), lock_path, who])
            .arg(&files)
            .arg(SESSION_TIMEOUT_S.to_string())
            .args(user);
        let proc = Proc::spawn(&format!("kazoo-lock-{who}"), cmd, &dir.join(format!("{who}.log")));
        Holder { proc, files }
    }

    /// Until it holds the lock (within 30 s, else a panic with its log):
    /// its token.
    pub async fn token(&self) -> u64 {
        let what = format!("{} holding the lock", self.proc.name);
        crate::wait::until_ok(&what, Duration::from_secs(30), || {
            let held = self.held().ok_or_else(|| tail(&self.proc.log(), 10));
            async move { held }
        })
        .await
    }

    /// Its token, once it has held the lock. A holder whose session expired
    /// (while paused) still says it holds: it believes it does, which is
    /// what fencing is for.
    pub fn held(&self) -> Option<u64> {
        self.read().map(|h| h.token)
    }

    /// Its lock znode's name (as `ZooKeeper::children` lists it), once it
    /// has held the lock.
    pub fn node(&self) -> Option<String> {
        self.read().map(|h| h.node)
    }

    fn read(&self) -> Option<Held> {
        let text = std::fs::read_to_string(self.files.join("held")).ok()?;
        Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", self.proc.name)))
    }

    /// SIGTERM: it releases the lock (or ends its wait) and exits.
    pub fn release(&self) {
        self.proc.signal(Signal::SIGTERM);
    }
}

impl crate::verify::recipe::Holder for Holder {
    fn token(&self) -> Option<u64> {
        self.held()
    }

    fn process(&mut self) -> &mut Proc {
        &mut self.proc
    }

    fn release(&self) {
        Holder::release(self)
    }
}

/// Needs Debian's zookeeper and kazoo (`.ci/lockservices`): the fault tier.
#[cfg(all(test, feature = "faults"))]
mod tests {
    use super::*;

    const LOCK: &str = "/locks/rack-42";

    #[test]
    fn a_servers_lines_are_its_own_and_its_stack_traces() {
        let log = "12:00:00,000 zk1 INFO  [main] QuorumPeer: LOOKING\n\
                   12:00:00,001 zk2 ERROR [main] QuorumPeer: Unable to load database on disk\n\
                   java.io.IOException: The current epoch, 1, is older than the last zxid, 8589934593\n\
                   \tat org.apache.zookeeper.server.quorum.QuorumPeer.loadDataBase(QuorumPeer.java:1)\n\
                   12:00:00,002 zk3 INFO  [main] QuorumPeer: LEADING";
        let two = lines_of(log, &[2]);
        assert!(two.starts_with("12:00:00,001 zk2 ERROR") && two.ends_with("(QuorumPeer.java:1)"), "{two}");
        assert_eq!(two.lines().count(), 3);
        assert_eq!(lines_of(log, &[1, 3]).lines().count(), 2);
    }

    /// What the lock-service tests rely on: a holder paused for longer than
    /// its session (SESSION_TIMEOUT_S + 2 s) has lost the lock to the next
    /// waiter, whose token is higher, while the paused one still believes
    /// it holds; and a release frees the lock.
    #[tokio::test]
    async fn a_holder_paused_past_its_session_loses_the_lock_to_the_next_waiter() {
        let tmp = tempfile::tempdir().unwrap();
        let zk = ZooKeeper::start(tmp.path());
        zk.ready().await;
        let first = Holder::start(&zk, tmp.path(), "first", LOCK);
        let token = first.token().await;
        let mut second = Holder::start(&zk, tmp.path(), "second", LOCK);
        crate::wait::until("the second holder queued", Duration::from_secs(30), || async {
            zk.children(LOCK).await.len() == 2
        })
        .await;
        assert_eq!(zk.children(LOCK).await[0], first.node().unwrap());
        assert_eq!(second.held(), None);

        first.proc.freeze(true);
        let paused = Instant::now();
        let next = second.token().await;
        let after = paused.elapsed();
        eprintln!("the second holder held {after:?} after the first was paused");
        assert!(next > token, "{next} after {token}");
        assert!(after < Duration::from_secs(SESSION_TIMEOUT_S + 2), "{after:?}");
        assert_eq!(zk.children(LOCK).await, [second.node().unwrap()]);
        assert_eq!(first.held(), Some(token));
        first.proc.freeze(false);

        second.release();
        assert_eq!(second.proc.exit_within(Duration::from_secs(10)).await, Some(0));
        assert_eq!(zk.children(LOCK).await, Vec::<String>::new());
    }

    /// A server whose data cannot be loaded exits at start; `ready` empties
    /// it, it syncs from the others and serves what they hold. Here, as in
    /// CI: its newest transaction log file created, and killed before the
    /// file's header was written (ZOOKEEPER-2332, fixed after 3.8.0).
    #[tokio::test]
    async fn a_server_that_cannot_load_its_data_is_emptied_and_syncs_again() {
        let tmp = tempfile::tempdir().unwrap();
        let mut zk = ZooKeeper::start(tmp.path());
        zk.ready().await;
        zk.kazoo("zk.create('/kept', b'v')").await;
        zk.with_servers_stopped(|data, id| {
            if id == 2 {
                std::fs::write(data.join("version-2").join("log.7fffffff00000001"), "").unwrap();
            }
        });
        zk.ready().await;
        let log = std::fs::read_to_string(zk.log()).unwrap();
        assert!(lines_of(&log, &[2]).contains("java.io.EOFException"), "zk2 did not refuse its data");
        for id in 1..=3 {
            assert!(zk.mode(id).await.is_some(), "zk{id} serves");
        }
        assert_eq!(zk.kazoo("print(zk.get('/kept')[0].decode())").await.trim(), "v");
    }

    /// A server killed and restarted on its data rejoins, and the ensemble
    /// serves throughout with the other two.
    #[tokio::test]
    async fn a_killed_server_restarts_on_its_data() {
        let tmp = tempfile::tempdir().unwrap();
        let mut zk = ZooKeeper::start_with_superuser(tmp.path(), "test");
        zk.ready().await;
        let holder = Holder::start_as(&zk, tmp.path(), "owner", LOCK, Some("owner:pw"));
        let token = holder.token().await;
        let leader = zk.leader().await.unwrap();
        zk.kill_server(leader);
        zk.ready().await;
        zk.start_server(leader);
        zk.ready().await;
        // The superuser reads what only its owner may: the holder's znode,
        // its ACL the owner's digest.
        let acl = zk.kazoo(&format!("print(zk.get_acls('{LOCK}/{}')[0][0].id.scheme)", holder.node().unwrap())).await;
        assert_eq!(acl.trim(), "digest");
        assert_eq!(holder.held(), Some(token));
    }
}
