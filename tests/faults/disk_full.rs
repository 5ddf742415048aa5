//! A full data disk, on real nodes: their data directories on one small
//! tmpfs, which a filler file fills while grants go on. A node whose storage
//! fails must not stay up with a dead Raft core: it exits with status 70,
//! and a node that stays up answers /healthz "ok" only with a working core
//! (it is not restarted, and must take part in everything after). Once the
//! filler is gone, the nodes that exited are restarted, as a supervisor
//! would, and recover from their durable logs: every acknowledged grant is
//! still there, the same on every node, and new grants come above them.
//! Root only (it mounts a tmpfs); fails otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_client::{AcquireOptions, Client};
use fencegate_testkit::{bin, Cluster, Watch};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::time::Instant;

/// What `fencegate server` exits with once its Raft core stopped.
const EXIT_CORE_STOPPED: i32 = 70;

/// How a failed write on the full disk shows in a node's log (strerror(ENOSPC)).
const ENOSPC: &str = "No space left on device";

/// What openraft logs when a node's own Raft core stops (a leader's log also
/// shows its followers' storage errors, which say nothing about its own core).
const CORE_QUIT: &str = "quit RaftCore::main on error";

/// A tmpfs mounted for the test, lazily unmounted when dropped (also when
/// the test panics, so that no mount outlives it).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("running mount");
        assert!(status.success(), "mount -t tmpfs on {}: {status}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// Node `id`'s exit status once it has exited (-1 for a signal), without
/// reaping it: the kit reaps its nodes when it kills or restarts them.
fn exit_status(c: &Cluster, id: u64) -> Option<i32> {
    let pid = Id::Pid(Pid::from_raw(c.pid(id) as i32));
    match waitid(pid, WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT) {
        Ok(WaitStatus::StillAlive) => None,
        Ok(WaitStatus::Exited(_, code)) => Some(code),
        Ok(WaitStatus::Signaled(..)) => Some(-1),
        other => panic!("node {id}: waitid: {other:?}"),
    }
}

/// Whether node `id` has exited; if it has, it did so with 70, for the full disk.
fn stopped_for_the_full_disk(c: &Cluster, id: u64) -> bool {
    let Some(code) = exit_status(c, id) else { return false };
    assert_eq!(code, EXIT_CORE_STOPPED, "node {id}'s exit status");
    let log = c.log_of(id);
    let why = log.lines().rfind(|l| l.contains("the Raft core stopped"));
    assert!(why.is_some_and(|l| l.contains(ENOSPC)), "node {id} exited, not for the full disk:\n{log}");
    true
}

/// Node `id`'s answer to GET /healthz: its status, `None` without one in 1 s.
async fn health(c: &Cluster, id: u64) -> Option<u16> {
    let url = format!("{}/healthz", c.url(id));
    let answer = HttpClient::new(1024).call(hyper::Method::GET, &url, None, Duration::from_secs(1)).await;
    answer.ok().map(|a| a.status.as_u16())
}

/// Write `path` until its file system is full; the bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0xa5u8; 1 << 20];
    let mut written = 0;
    // A 48 MiB tmpfs takes far fewer chunks than this.
    for _ in 0..1000 {
        match f.write(&chunk) {
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => return written,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    panic!("{} did not fill its disk ({written} bytes)", path.display());
}

/// Grant `i`'s key: one key per grant, in key order.
fn key(i: usize) -> String {
    format!("df/{i:06}")
}

/// Acquire and release key `i`; its token if the grant was acknowledged (a
/// grant whose answer never came may or may not have happened).
async fn grant(client: &Client, i: usize) -> Option<u64> {
    // A long holder name: bigger log entries, so the logs need new pages sooner.
    let opts = AcquireOptions::new(Duration::from_secs(30)).holder("h".repeat(128));
    let lease = tokio::time::timeout(Duration::from_secs(10), client.acquire(&key(i), opts)).await.ok()?.ok()?;
    let token = lease.token();
    // Its outcome does not matter: a lease left behind expires.
    let _ = tokio::time::timeout(Duration::from_secs(10), lease.release()).await;
    Some(token)
}

/// Every key's token in node `id`'s own applied state (a watch is answered
/// by the node itself), read up to `last`, the greatest key granted.
async fn tokens_of(c: &Cluster, id: u64, last: &str) -> BTreeMap<String, u64> {
    let mut w = Watch::open(&format!("{}/v1/watch?prefix=df/", c.url(id))).await;
    let mut tokens = BTreeMap::new();
    // The state comes first, one line per key in key order.
    for _ in 0..100_000 {
        let line = w.next().await;
        assert_eq!(line["event"], "state", "node {id}: {line}");
        let key = line["key"].as_str().unwrap().to_string();
        tokens.insert(key.clone(), line["token"].as_u64().unwrap());
        if key == last {
            return tokens;
        }
    }
    panic!("node {id}: no state of {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_nodes_with_70_and_restarted_they_keep_every_grant() {
    assert!(is_root(), "mounting a tmpfs needs root (the fault tier runs as root)");
    // Dropped in reverse: the nodes are killed, the tmpfs unmounted, its
    // mount point removed.
    let mount_point = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(mount_point.path(), "48m");
    // Small snapshots: the nodes recover from a snapshot and the log after it.
    let mut c = Cluster::start(&bin!(), 3, "raft: { snapshot_every: 100 }\n").await;
    // Only the data directories move to the tmpfs; configs and logs stay,
    // as on a server with a data volume. (With its stderr on the full disk
    // too, a node's logging panics the task that logged, as tracing-subscriber
    // reports the failed write with eprintln!: a fault of its own.)
    c.kill_all();
    for id in c.ids() {
        let (dir, moved) = (c.data_dir(id), disk.0.join(format!("data{id}")));
        fencegate_testkit::files::copy_dir(&dir, &moved);
        std::fs::remove_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&moved, &dir).unwrap();
    }
    c.start_all();
    c.wait_for_leader(Duration::from_secs(20)).await;
    let client = c.client();

    let mut acked = BTreeMap::new();
    let before = 50;
    for i in 0..before {
        let token = grant(&client, i).await.expect("a grant before the disk is full");
        acked.insert(key(i), token);
    }
    // On every node's disk before it fills (a follower may lag behind).
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let applied = c.cluster_info(leader).await.unwrap().commit_index;
    for id in c.ids() {
        c.wait_for_applied(id, applied, Duration::from_secs(10)).await;
    }

    // Grants go on in the background while the disk fills and stays full.
    let stop = Arc::new(AtomicBool::new(false));
    let granter = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked = vec![];
            let mut i = before;
            while !stop.load(Ordering::Relaxed) && i < before + 10_000 {
                if let Some(token) = grant(&client, i).await {
                    acked.push((key(i), token));
                }
                i += 1;
            }
            (acked, i)
        })
    };
    let filled = fill(&disk.0.join("filler"));

    // Every node, every 100 ms, until one has exited and 5 s more have
    // passed. One that exits does so with 70, for the full disk. One whose
    // core quit (its log says so) or that does not answer "ok" must exit
    // within 5 s: no node stays up on a dead core, least of all "ok".
    let mut first_exit = None;
    let mut failing_since = BTreeMap::new();
    let mut exited = BTreeSet::new();
    for _ in 0..300 {
        for id in c.ids() {
            if exited.contains(&id) {
                continue;
            }
            if stopped_for_the_full_disk(&c, id) {
                exited.insert(id);
                first_exit.get_or_insert_with(Instant::now);
                failing_since.remove(&id);
                continue;
            }
            let health = health(&c, id).await;
            let core_quit = c.log_of(id).contains(CORE_QUIT);
            if health == Some(200) && !core_quit {
                failing_since.remove(&id);
                continue;
            }
            let since = *failing_since.entry(id).or_insert_with(Instant::now);
            // Asked again: it may have exited since.
            assert!(
                since.elapsed() < Duration::from_secs(5) || exit_status(&c, id).is_some(),
                "node {id} still runs 5 s after it began failing (/healthz: {health:?}, its core quit: {core_quit})"
            );
        }
        if first_exit.is_some_and(|t: Instant| t.elapsed() > Duration::from_secs(5)) && failing_since.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(first_exit.is_some(), "no node stopped with its disk full ({filled} bytes of filler)");
    assert!(failing_since.is_empty(), "nodes neither ok nor exited: {failing_since:?}");
    stop.store(true, Ordering::Relaxed);
    let (during, attempted) = tokio::time::timeout(Duration::from_secs(30), granter).await.unwrap().unwrap();
    let during_acked = during.len();
    acked.extend(during);

    // Space again. As a supervisor would, whatever exits is restarted on its
    // data (a node may exit only now), until all agree on a leader.
    std::fs::remove_file(disk.0.join("filler")).unwrap();
    let mut leaders = BTreeSet::new();
    for _ in 0..300 {
        for id in c.ids() {
            if stopped_for_the_full_disk(&c, id) {
                exited.insert(id);
                c.restart(id);
            }
        }
        leaders.clear();
        for id in c.ids() {
            leaders.insert(c.cluster_info(id).await.and_then(|i| i.leader));
        }
        if leaders.len() == 1 && !leaders.contains(&None) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(leaders.len() == 1 && !leaders.contains(&None), "no leader all agree on after the restarts: {leaders:?}");
    let max_acked = acked.values().copied().max().unwrap();
    let mut after = vec![];
    for i in attempted..attempted + 10 {
        let token = grant(&client, i).await.expect("a grant after the restart");
        assert!(token > max_acked, "token {token} after the restart, not above {max_acked} acknowledged before");
        after.push(token);
    }
    assert!(after.windows(2).all(|w| w[0] < w[1]), "tokens rise: {after:?}");
    eprintln!(
        "filler {filled} bytes; exited with 70: {:?}; grants acknowledged: {before} before, {} of {} while full, {} after",
        exited,
        during_acked,
        attempted - before,
        after.len()
    );

    // Every node, from its own applied state: every acknowledged grant with
    // its token, and the same keys and tokens as every other node.
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let applied = c.cluster_info(leader).await.unwrap().commit_index;
    let last = key(attempted + after.len() - 1);
    let mut states = vec![];
    for id in c.ids() {
        c.wait_for_applied(id, applied, Duration::from_secs(20)).await;
        let tokens = tokens_of(&c, id, &last).await;
        for (k, token) in &acked {
            assert_eq!(tokens.get(k), Some(token), "node {id} lost the acknowledged grant of {k}");
        }
        assert_eq!(exit_status(&c, id), None, "node {id} exited after the recovery");
        assert_eq!(health(&c, id).await, Some(200), "node {id}'s health after the recovery");
        states.push(tokens);
    }
    assert!(states.windows(2).all(|w| w[0] == w[1]), "the nodes' states differ");
}

/// A sidecar's floor store on a full disk: writes that need a new floor get
/// 500 and `/healthz` fails; once space is free the store reopens itself
/// (no restart), `/healthz` is ok again, writes go on, and the floors made
/// durable before are still enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_floor_store_is_reported_and_recovered_from() {
    use fencegate_testkit::routes::{everything_else, table, Route};
    use fencegate_testkit::sidecar::SidecarOptions;
    use fencegate_testkit::{Sidecar, Upstream};
    assert!(is_root(), "mounting a tmpfs needs root (the fault tier runs as root)");
    let dir = tempfile::tempdir().unwrap();
    let _disk = Tmpfs::mount(dir.path(), "8m");
    let up = Upstream::start().await;
    let routes = table(&[
        Route::fenced("observed", "/observed/{rack}", "rack/{rack}", "{ mode: observed }").methods(&["PUT"]),
        everything_else(),
    ]);
    let o = SidecarOptions { yaml: routes, ..Default::default() };
    let sc = Sidecar::start_with(&bin!(), dir.path().join("sc"), &up.url(), o).await;
    let http = HttpClient::new(1 << 16);
    let health = |path: &'static str| {
        let (http, url) = (http.clone(), format!("http://127.0.0.1:{}{path}", sc.metrics_port));
        async move {
            http.call(hyper::Method::GET, &url, None, Duration::from_secs(5)).await.map(|a| a.status.as_u16()).ok()
        }
    };
    assert_eq!(sc.send("PUT", "/observed/first", Some(50), &[]).await.0, 200);
    assert_eq!(health("/healthz").await, Some(200));

    let filler = dir.path().join("filler");
    fill(&filler);
    // Each new key needs a new floor: one commit after another, until the disk refuses one.
    let mut refused = None;
    for i in 0..2000u64 {
        let (status, v) = sc.send("PUT", &format!("/observed/k{i}"), Some(100 + i), &[]).await;
        if status != 200 {
            refused = Some((status, v));
            break;
        }
    }
    let (status, v) = refused.expect("no floor write failed on a full disk");
    assert_eq!((status, v["error"].as_str()), (500, Some("internal")), "{v}");
    assert_eq!(health("/healthz").await, Some(503), "a store that cannot be written is not healthy");
    assert_eq!(health("/readyz").await, Some(503));

    std::fs::remove_file(&filler).unwrap();
    // No restart: the store reopens itself when it is next used (or probed).
    assert_eq!(health("/healthz").await, Some(200), "recovered once space is free");
    assert_eq!(health("/readyz").await, Some(200));
    assert_eq!(sc.send("PUT", "/observed/after", Some(5000), &[]).await.0, 200);
    let (status, v) = sc.send("PUT", "/observed/first", Some(49), &[]).await;
    assert_eq!((status, v["error"].as_str()), (409, Some("stale_token")), "the old floor holds: {v}");
}
