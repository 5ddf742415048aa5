//! The sidecar in front of a lock `etcdctl lock` takes (`lock_service.kind:
//! etcd`, docs/decisions/0010): a real 3-member etcd (Debian's
//! `etcd-server`), real `etcdctl lock` holders (`etcd-client`), a real
//! sidecar process. The token is the holder key's `create_revision`, which
//! the holder's command reads with `etcdctl get "$ETCD_LOCK_KEY" -w fields`.

mod torture;

use std::path::Path;
use std::time::Duration;

use fencegate_testkit::etcd::{Etcd, Holder, LOCK_TTL_S};
use fencegate_testkit::http::metric;
use fencegate_testkit::routes::{rack_writes, table};
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::{bin, wait, Proc, Sidecar, Upstream};
use nix::sys::signal::Signal;

use crate::lock_services::error_of;

/// A route that reads etcd per request.
const LINEARIZABLE: &str = "{ mode: strict, consistency: linearizable }";
/// A route that trusts what the sidecar follows of etcd: a list of `rack/`
/// every third of `max_staleness` (10 s in `setup`), a watch between them.
const CACHED: &str = "{ mode: strict, consistency: cached }";

/// The cluster, an upstream and a sidecar fencing `/racks/{rack}` with
/// lock key `rack/{rack}` against etcd, with `fence`.
async fn setup(dir: &Path, fence: &str) -> (Etcd, Upstream, Sidecar) {
    let etcd = Etcd::start(dir);
    etcd.ready().await;
    let up = Upstream::start().await;
    let sc = sidecar_with(&etcd, &up, &dir.join("sc"), "  max_staleness: 10s\n", fence).await;
    (etcd, up, sc)
}

/// A sidecar in `dir` fencing `/racks/{rack}` against `etcd`, reading it
/// per request, with `more` lines of `lock_service`.
async fn sidecar(etcd: &Etcd, up: &Upstream, dir: &Path, more: &str) -> Sidecar {
    sidecar_with(etcd, up, dir, more, LINEARIZABLE).await
}

async fn sidecar_with(etcd: &Etcd, up: &Upstream, dir: &Path, more: &str, fence: &str) -> Sidecar {
    let o = SidecarOptions {
        lock_service: etcd.urls.values().cloned().collect(),
        lock_service_yaml: format!("  kind: etcd\n{more}"),
        yaml: table(&[rack_writes(fence)]),
        ..Default::default()
    };
    Sidecar::start_with(&bin!(), dir, &up.url(), o).await
}

/// The create revisions of the keys under `prefix`, as etcd lists them
/// (`etcdctl get --prefix -w fields`), lowest first.
fn create_revisions(etcd: &Etcd, prefix: &str) -> Vec<u64> {
    let out = etcd.etcdctl().args(["get", "--prefix", "-w", "fields", prefix]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut revs: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("\"CreateRevision\""))
        .map(|l| l.rsplit(':').next().unwrap().trim().parse().unwrap())
        .collect();
    revs.sort();
    revs
}

/// The seed's picture on etcd: A holds `rack/42` and writes; A stops (its
/// lease runs out, as a paused holder's would); B, waiting, gets the lock
/// and writes; A's late write is refused. B's `ETCD_LOCK_REV`, above its
/// key's create revision on a contended acquire, is not a token, and a
/// holder whose key an operator deleted holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_lost_its_etcd_lock_is_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (etcd, up, sc) = setup(dir.path(), LINEARIZABLE).await;
    let a = Holder::start(&etcd, dir.path(), "a", "rack/42");
    let (ta, rev_a) = a.token().await;
    assert_eq!(ta, rev_a, "uncontended, ETCD_LOCK_REV is the key's create revision");
    assert_eq!(sc.send("PUT", "/racks/42", Some(ta), &[]).await.0, 200, "A's write");

    let b = Holder::start(&etcd, dir.path(), "b", "rack/42");
    // B's key is in, waiting behind A's: its revision is not a token yet.
    wait::until("B waiting", Duration::from_secs(10), || {
        let n = create_revisions(&etcd, "rack/42/").len();
        async move { n == 2 }
    })
    .await;
    assert!(!b.files.join("fields").exists(), "B must wait for A");
    // A still holds: its writes go through; B's key, created later, holds
    // nothing yet.
    let waiting = create_revisions(&etcd, "rack/42/")[1];
    assert_eq!(sc.send("PUT", "/racks/42", Some(ta), &[]).await.0, 200, "A's second write");
    let (status, v) = sc.send("PUT", "/racks/42", Some(waiting), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "unknown_token"), "{v}");
    drop(a);
    let (tb, rev_b) = b.token().await;
    assert!(tb > ta, "{tb} > {ta}");

    let (status, v) = sc.send("PUT", "/racks/42", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(tb)), "{v}");
    assert_eq!(sc.send("PUT", "/racks/42", Some(tb), &[]).await.0, 200, "B's write");
    assert!(rev_b > tb, "contended, ETCD_LOCK_REV ({rev_b}) is above the key's create revision ({tb})");
    let (status, v) = sc.send("PUT", "/racks/42", Some(rev_b), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "unknown_token"), "{v}");
    assert_eq!(tb, waiting, "B's token is the key it waited with");
    // An operator deletes B's key by hand: B holds nothing from then on.
    let out = etcd.etcdctl().args(["del", "--prefix", "rack/42/"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let (status, v) = sc.send("PUT", "/racks/42", Some(tb), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "lease_expired"), "B's key deleted by hand: {v}");
    assert_eq!(up.tokens("/racks/42"), vec![Some(ta), Some(ta), Some(tb)]);
}

/// Nobody holds the lock once the holder's lease ended: its token is
/// refused as ended. With etcd unreachable, nothing is forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_etcd_lease_and_an_unreachable_etcd_forward_nothing() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (mut etcd, up, sc) = setup(dir.path(), LINEARIZABLE).await;
    let a = Holder::start(&etcd, dir.path(), "a", "rack/7");
    let (ta, _) = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/7", Some(ta), &[]).await.0, 200);
    drop(a);
    // The lease runs out by etcd's clock, `--ttl` after the holder stopped.
    wait::until("the lease ended", Duration::from_secs(LOCK_TTL_S * 10), || {
        let none = create_revisions(&etcd, "rack/7/").is_empty();
        async move { none }
    })
    .await;
    let (status, v) = sc.send("PUT", "/racks/7", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "lease_expired"), "{v}");
    let (status, v) = sc.send("PUT", "/racks/7", Some(ta + 1_000_000), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "unknown_token"), "{v}");
    for id in 1..=3 {
        etcd.kill_member(id);
    }
    // What needs etcd's word is refused; a refusal on what is known stands.
    let (status, v) = sc.send("PUT", "/racks/8", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (503, "lock_service_unavailable"), "{v}");
    let (status, v) = sc.send("PUT", "/racks/7", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "lease_expired"), "{v}");
    sc.wait_for_metric("fencegate_sidecar_lock_service_up", 0.0, Duration::from_secs(10)).await;
    assert_eq!(up.tokens("/racks/7"), vec![Some(ta)]);
}

/// With etcd's authentication on, the sidecar reads as a user of its own
/// (read on the locks' prefix only), its password from a file, and buys a
/// new token when etcd's (one second long here) has expired. A wrong
/// password forwards nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_reads_etcd_as_a_user_with_its_password() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let etcd = Etcd::start_with(dir.path(), &["--auth-token-ttl=1"]);
    etcd.ready().await;
    for args in [
        &["user", "add", "root:root-pw"][..],
        &["auth", "enable"],
        &["--user", "root:root-pw", "user", "add", "fence:fence-pw"],
        &["--user", "root:root-pw", "role", "add", "fence-read"],
        &["--user", "root:root-pw", "role", "grant-permission", "--prefix=true", "fence-read", "read", "rack/"],
        &["--user", "root:root-pw", "user", "grant-role", "fence", "fence-read"],
    ] {
        let out = etcd.etcdctl().args(args).output().unwrap();
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    }
    let up = Upstream::start().await;
    std::fs::write(dir.path().join("password"), "fence-pw\n").unwrap();
    std::fs::write(dir.path().join("wrong"), "guess\n").unwrap();
    let user = |file: &str| format!("  user: fence\n  password_file: {}\n", dir.path().join(file).display());
    let sc = sidecar(&etcd, &up, &dir.path().join("sc"), &user("password")).await;
    let wrong = sidecar(&etcd, &up, &dir.path().join("wrong-sc"), &user("wrong")).await;

    let a = Holder::start_as(&etcd, dir.path(), "a", "rack/1", Some("root:root-pw"));
    let (ta, _) = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/1", Some(ta), &[]).await.0, 200);
    // Past the token's TTL: refused with 401, bought again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(sc.send("PUT", "/racks/1", Some(ta), &[]).await.0, 200, "after the token expired");
    assert!(sc.log().contains("buying another"), "the token was bought again: {}", sc.log());
    let (status, v) = wrong.send("PUT", "/racks/1", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (503, "lock_service_unavailable"), "{v}");
    assert!(wrong.log().contains("authentication failed"), "{}", wrong.log());
    assert_eq!(up.tokens("/racks/1"), vec![Some(ta), Some(ta)]);
}

/// etcd serving clients over TLS and requiring client certificates: the
/// sidecar trusts only `lock_service.ca` and presents `cert` and `key`;
/// without a certificate it is refused, and forwards nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_reaches_etcd_over_tls_with_a_client_certificate() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let pki = fencegate_testkit::tls::Pki::new(&dir.path().join("pki"), "etcd");
    let etcd = Etcd::start_tls(dir.path(), &pki);
    etcd.ready().await;
    let up = Upstream::start().await;
    let (cert, key) = pki.client_cert("fence");
    let tls = format!("  ca: {}\n  cert: {}\n  key: {}\n", pki.ca.display(), cert.display(), key.display());
    let sc = sidecar(&etcd, &up, &dir.path().join("sc"), &tls).await;
    let bare = sidecar(&etcd, &up, &dir.path().join("bare"), &format!("  ca: {}\n", pki.ca.display())).await;

    let a = Holder::start(&etcd, dir.path(), "a", "rack/3");
    let (ta, _) = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/3", Some(ta), &[]).await.0, 200);
    let (status, v) = bare.send("PUT", "/racks/3", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (503, "lock_service_unavailable"), "{v}");
    assert_eq!(up.tokens("/racks/3"), vec![Some(ta)]);
}

/// An operator restores an etcd snapshot taken before A's lock, with the
/// cluster's own flags: etcd keeps its cluster id while its revisions go
/// back, and B's new lock gets a token below A's. Neither A's write (its
/// lock is not in the restored history) nor B's (below the key's floor) is
/// forwarded: the sidecar fails closed (S7) without being restarted,
/// whether it reads etcd per request or follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_etcd_whose_revisions_went_back_forwards_neither_holder() {
    for fence in [LINEARIZABLE, CACHED] {
        restored_etcd_forwards_neither_holder(fence).await;
    }
}

async fn restored_etcd_forwards_neither_holder(fence: &str) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (mut etcd, up, sc) = setup(dir.path(), fence).await;
    let snapshot = dir.path().join("snapshot.db");
    etcd.snapshot(&snapshot);
    // A write after the snapshot: the restored history's next revisions
    // fall below A's. (Had A's lock been the first write after it, B's
    // would get A's very revision: see DESIGN, "Residual windows".)
    let out = etcd.etcdctl().args(["put", "other", "x"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let a = Holder::start(&etcd, dir.path(), "a", "rack/5");
    let (ta, _) = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/5", Some(ta), &[]).await.0, 200, "A's write");
    drop(a);
    etcd.restore(&snapshot);
    etcd.ready().await;
    let b = Holder::start(&etcd, dir.path(), "b", "rack/5");
    let (tb, _) = b.token().await;
    assert!(tb < ta, "the restored revisions went back: {tb} < {ta}");
    for (who, token) in [("A", ta), ("B", tb)] {
        let (status, v) = sc.send("PUT", "/racks/5", Some(token), &[]).await;
        assert_eq!((status, error_of(&v)), (503, "lock_service_behind_floor"), "{fence}: {who}: {v}");
    }
    assert_eq!(up.tokens("/racks/5"), vec![Some(ta)]);
    sc.wait_for_metric("fencegate_sidecar_lock_service_history_changes_total", 1.0, Duration::from_secs(5)).await;
}

/// A `cached` route on etcd: with `max_staleness` 10 s the sidecar lists
/// `rack/` every 3.3 s, so what it learns within a moment it learns from
/// its watch. A is paused (SIGSTOP of its `etcdctl lock`) past its lease:
/// its write is refused as ended; B gets the lock: A's write is refused as
/// stale and B's forwarded, none of them after a read for want of proof.
/// With etcd gone, nothing more is forwarded, and a sidecar restarted then
/// keeps its floors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_route_follows_etcd_and_refuses_a_paused_holder() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (mut etcd, up, mut sc) = setup(dir.path(), CACHED).await;
    let a = Holder::start(&etcd, dir.path(), "a", "rack/9");
    let (ta, _) = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/9", Some(ta), &[]).await.0, 200, "A's write");
    a.proc.signal(Signal::SIGSTOP);
    wait::until("A's lease ended", Duration::from_secs(LOCK_TTL_S * 10), || {
        let none = create_revisions(&etcd, "rack/9/").is_empty();
        async move { none }
    })
    .await;
    let (status, v) = sc.send("PUT", "/racks/9", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "lease_expired"), "{v}");
    let b = Holder::start(&etcd, dir.path(), "b", "rack/9");
    let (tb, _) = b.token().await;
    let (status, v) = sc.send("PUT", "/racks/9", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(tb)), "{v}");
    assert_eq!(sc.send("PUT", "/racks/9", Some(tb), &[]).await.0, 200, "B's write");
    a.proc.signal(Signal::SIGCONT);
    let (status, v) = sc.send("PUT", "/racks/9", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "stale_token"), "A, running again: {v}");
    let stale = r#"fencegate_sidecar_stale_knowledge_reads_total{route="rack-writes"}"#;
    assert_eq!(metric(&sc.metrics().await, stale), Some(0.0), "no read for want of proof");
    assert_eq!(up.tokens("/racks/9"), vec![Some(ta), Some(tb)]);

    for id in 1..=3 {
        etcd.kill_member(id);
    }
    crate::lock_services::floors_outlive_the_service(&mut sc, &up, "/racks/9", (ta, tb)).await;
}

/// `fencegate lock --lock-service etcd` takes the lock `etcdctl lock`
/// takes, by the same recipe: CMD gets the key's create revision as
/// FENCE_TOKEN (the sidecar forwards it), an `etcdctl lock` of the same
/// name waits behind it, and when fencegate lock is paused past the lease
/// (SIGSTOP) the waiter takes over and CMD is stopped at once on resume
/// (76), its old token refused. A CMD that ends releases the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencegate_lock_on_etcd_queues_with_etcdctl_and_stops_its_command_on_loss() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (etcd, up, sc) = setup(dir.path(), CACHED).await;
    let file = dir.path().join("token");
    let script = format!("echo $FENCE_TOKEN > {f}.tmp && mv {f}.tmp {f} && exec sleep 600", f = file.display());
    let lock = |name: &str, script: &str| {
        let args = ["lock", "--lock-service", "etcd", "--endpoints", &etcd.endpoints(), "--ttl", "2s", name];
        let mut cmd = bin!().command(&args);
        cmd.args(["--", "sh", "-c", script]);
        cmd
    };
    let mut a = Proc::spawn("fencegate-lock-a", lock("rack/11", &script), &dir.path().join("a.log"));
    wait::until("A holds rack/11", Duration::from_secs(20), || {
        let held = file.exists();
        async move { held }
    })
    .await;
    let ta: u64 = std::fs::read_to_string(&file).unwrap().trim().parse().unwrap();
    assert_eq!(create_revisions(&etcd, "rack/11/"), vec![ta], "FENCE_TOKEN is the key's create revision");
    assert_eq!(sc.send("PUT", "/racks/11", Some(ta), &[]).await.0, 200, "A's write");

    let b = Holder::start(&etcd, dir.path(), "b", "rack/11");
    wait::until("B waiting", Duration::from_secs(10), || {
        let n = create_revisions(&etcd, "rack/11/").len();
        async move { n == 2 }
    })
    .await;
    assert!(b.held().is_none(), "etcdctl lock waits behind fencegate lock");
    a.signal(Signal::SIGSTOP);
    let (tb, _) = b.token().await;
    assert!(tb > ta);
    a.signal(Signal::SIGCONT);
    assert_eq!(a.exit_within(Duration::from_secs(10)).await, Some(76), "lost: {}", a.log());
    let (status, v) = sc.send("PUT", "/racks/11", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "stale_token"), "{v}");
    assert_eq!(up.tokens("/racks/11"), vec![Some(ta)]);

    // A CMD that ends: its status, and the lock free at once (no TTL).
    let out = lock("rack/12", "exit 3").output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(create_revisions(&etcd, "rack/12/").is_empty(), "released on CMD's exit");
}

/// `fencegate demo --lock-service etcd`: the pause problem on a one-member
/// etcd the command starts (`etcd` from PATH) — A's stale write refused
/// through the sidecar, landing without it — and no etcd left behind.
#[test]
fn the_demo_runs_on_an_etcd_it_starts() {
    let out = bin!().run(&["demo", "--lock-service", "etcd"], Duration::from_secs(60));
    let text = &out.stdout;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(text.contains("starting a one-member etcd"), "{text}");
    assert!(text.contains("409 stale_token, upstream never sees it"), "{text}");
    assert!(text.contains("rack 43 is \"flashed-by-A\""), "{text}");
    let demo_etcd = std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        cmdline.windows(14).any(|w| w == b"fencegate-demo") && cmdline.starts_with(b"etcd")
    });
    assert!(!demo_etcd, "the demo's etcd outlived it");
}

/// A `fencegate lock --lock-service etcd` waiting behind an `etcdctl lock`
/// is paused (SIGSTOP) past its lease: its key goes with the lease, the
/// holder leaves, a later `etcdctl lock` takes the lock. Resumed, the
/// waiter finds nothing ahead of its gone key, and must not run CMD: it
/// checks that its key and lease are still its own (69, CMD never ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_etcd_waiter_whose_key_is_gone_does_not_run_its_command() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let etcd = Etcd::start(dir.path());
    etcd.ready().await;
    let a = Holder::start(&etcd, dir.path(), "a", "rack/13");
    a.token().await;
    let ran = dir.path().join("ran");
    let args = ["lock", "--lock-service", "etcd", "--endpoints", &etcd.endpoints(), "--ttl", "2s", "--wait", "60s"];
    let mut cmd = bin!().command(&args);
    cmd.args(["rack/13", "--", "touch"]).arg(&ran);
    let mut b = Proc::spawn("fencegate-lock-b", cmd, &dir.path().join("b.log"));
    wait::until("B waiting", Duration::from_secs(10), || {
        let n = create_revisions(&etcd, "rack/13/").len();
        async move { n == 2 }
    })
    .await;
    b.signal(Signal::SIGSTOP);
    wait::until("B's lease ended, its key with it", Duration::from_secs(LOCK_TTL_S * 10), || {
        let n = create_revisions(&etcd, "rack/13/").len();
        async move { n == 1 }
    })
    .await;
    a.release();
    let c = Holder::start(&etcd, dir.path(), "c", "rack/13");
    c.token().await;
    b.signal(Signal::SIGCONT);
    assert_eq!(b.exit_within(Duration::from_secs(10)).await, Some(69), "{}", b.log());
    assert!(!ran.exists(), "B ran its command while C held the lock");
    assert!(b.log().contains("lost while waiting"), "{}", b.log());
}

/// `fencegate dev --lock-service etcd --free-ports`: its banner names the
/// etcd it started; a lock taken there with `fencegate lock --lock-service
/// etcd` writes through its sidecar, the banner's stale token is refused,
/// and Ctrl-C stops it and its etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_runs_on_an_etcd_it_starts() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut child = bin!()
        .tokio_command(&["dev", "--lock-service", "etcd", "--free-ports", "--data"])
        .arg(dir.path().join("data"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut etcd, mut sidecar, mut replayed) = (None, None, false);
    let read = async {
        // The banner is a few dozen lines; a bound in case it never completes.
        for _ in 0..100 {
            let Some(line) = lines.next_line().await.unwrap() else { break };
            let url = || line.split_whitespace().nth(1).map(str::to_string);
            if line.starts_with("  etcd ") {
                etcd = url();
            } else if line.starts_with("  sidecar ") {
                sidecar = url();
            }
            replayed |= line.contains("then 200 replayed, the same answer; the inventory applied it 1 time");
            if line.starts_with("Ctrl-C stops everything") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read).await.expect("no banner within 60 s");
    let (etcd, sidecar) = (etcd.expect("the banner names etcd"), sidecar.expect("the banner names the sidecar"));
    assert!(replayed, "the banner's retried write");
    let file = dir.path().join("token");
    let script = format!("echo $FENCE_TOKEN > {}", file.display());
    let out = bin!()
        .command(&["lock", "--lock-service", "etcd", "--endpoints", &etcd, "rack/42", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let token: u64 = std::fs::read_to_string(&file).unwrap().trim().parse().unwrap();
    let put = |t| fencegate_testkit::http::fenced_put(format!("{sidecar}/racks/42"), t);
    let (status, v) = fencegate_testkit::http::send(put(token), Duration::from_secs(5)).await;
    assert_eq!(status, 409, "released: {v}");
    assert_eq!(error_of(&v), "lease_expired", "{v}");
    let (status, v) = fencegate_testkit::http::send(put(1), Duration::from_secs(5)).await;
    assert_eq!((status, error_of(&v)), (409, "stale_token"), "the banner's stale write: {v}");
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    let port = etcd.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "dev's etcd outlived it");
}

/// A reload (SIGHUP) that makes the route `cached` has the running sidecar
/// follow etcd from then on: a new holder is learnt from the watch (A's
/// write refused at once, `max_staleness` at 10 s), the list proves the
/// new prefix (no read for want of proof), and nothing stale is forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_cached_routes_follows_etcd_from_then_on() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (etcd, up, sc) = setup(dir.path(), LINEARIZABLE).await;
    sc.rewrite_config(&table(&[rack_writes(CACHED)]));
    sc.signal(Signal::SIGHUP);
    let applied = r#"fencegate_sidecar_config_reloads_total{result="applied"}"#;
    sc.wait_for_metric(applied, 1.0, Duration::from_secs(10)).await;
    let a = Holder::start(&etcd, dir.path(), "a", "rack/14");
    let (ta, _) = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/14", Some(ta), &[]).await.0, 200, "A's write");
    let b = Holder::start(&etcd, dir.path(), "b", "rack/14");
    wait::until("B waiting", Duration::from_secs(10), || {
        let n = create_revisions(&etcd, "rack/14/").len();
        async move { n == 2 }
    })
    .await;
    drop(a);
    let (tb, _) = b.token().await;
    let (status, v) = sc.send("PUT", "/racks/14", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(tb)), "{v}");
    assert_eq!(sc.send("PUT", "/racks/14", Some(tb), &[]).await.0, 200, "B's write");
    let stale = r#"fencegate_sidecar_stale_knowledge_reads_total{route="rack-writes"}"#;
    assert_eq!(metric(&sc.metrics().await, stale), Some(0.0), "no read for want of proof");
    assert_eq!(up.tokens("/racks/14"), vec![Some(ta), Some(tb)]);
}
