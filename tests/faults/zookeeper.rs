//! The sidecar in front of a lock kazoo's `Lock` recipe takes
//! (`lock_service.kind: zookeeper`, docs/decisions/0010): a real 3-server
//! ZooKeeper ensemble (Debian's `zookeeper`), real kazoo holders (PyPI), a
//! real sidecar process. The token is the czxid of the holder's znode,
//! which the holder reads after it got the lock.

mod torture;

use std::path::Path;
use std::time::Duration;

use fencegate_testkit::http::metric;
use fencegate_testkit::routes::{rack_writes, table};
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::zookeeper::{Holder, ZooKeeper, SESSION_TIMEOUT_S};
use fencegate_testkit::{bin, wait, Sidecar, Upstream};

use crate::lock_services::error_of;

/// A route that reads ZooKeeper per request (`sync`, then the children).
const LINEARIZABLE: &str = "{ mode: strict, consistency: linearizable }";
/// A route that trusts what the sidecar follows of ZooKeeper: the locks
/// under `/rack` read after a `sync` every third of `max_staleness` (10 s
/// in `setup`), a persistent watch between them.
const CACHED: &str = "{ mode: strict, consistency: cached }";

/// The ensemble, an upstream and a sidecar fencing `/racks/{rack}` with
/// lock key `rack/{rack}` (znode `/rack/42`) against it, with `fence`.
async fn setup(dir: &Path, fence: &str) -> (ZooKeeper, Upstream, Sidecar) {
    let zk = ZooKeeper::start(dir);
    zk.ready().await;
    let up = Upstream::start().await;
    let sc = sidecar(&zk, &up, &dir.join("sc"), "  max_staleness: 10s\n", fence).await;
    (zk, up, sc)
}

/// A sidecar in `dir` fencing `/racks/{rack}` against `zk` with `fence`,
/// with `more` lines of `lock_service`.
async fn sidecar(zk: &ZooKeeper, up: &Upstream, dir: &Path, more: &str, fence: &str) -> Sidecar {
    let o = SidecarOptions {
        lock_service: zk.hosts().split(',').map(str::to_string).collect(),
        lock_service_yaml: format!("  kind: zookeeper\n{more}"),
        yaml: table(&[rack_writes(fence)]),
        ..Default::default()
    };
    Sidecar::start_with(&bin!(), dir, &up.url(), o).await
}

/// The czxid of `lock`'s contender `node`, as ZooKeeper has it.
async fn czxid(zk: &ZooKeeper, lock: &str, node: &str) -> u64 {
    zk.kazoo(&format!("print(zk.exists('{lock}/{node}').czxid)")).await.trim().parse().unwrap()
}

/// Until `lock` has `n` contenders: their names, queue order.
async fn contenders(zk: &ZooKeeper, lock: &str, n: usize) -> Vec<String> {
    let what = format!("{n} contenders for {lock}");
    wait::until_ok(&what, Duration::from_secs(SESSION_TIMEOUT_S * 10), || async move {
        let children = zk.children(lock).await;
        if children.len() == n {
            Ok(children)
        } else {
            Err(format!("{children:?}"))
        }
    })
    .await
}

/// Until `token`'s write to `path` is refused for `reason` (within
/// `within`; the refusals before it are fine, a forward is not).
async fn refused(sc: &Sidecar, path: &str, token: u64, reason: &str, within: Duration) {
    wait::until_ok(&format!("{token} refused for {reason}"), within, || async {
        let (status, v) = sc.send("PUT", path, Some(token), &[]).await;
        match (status, error_of(&v)) {
            (_, got) if got == reason => Ok(()),
            (200, _) => panic!("{token} forwarded to {path}"),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// The seed's picture on ZooKeeper: A holds `/rack/42` and writes; B
/// queues behind it (its znode's czxid is no token yet); A pauses past its
/// session (SIGSTOP), ZooKeeper deletes its znode, B holds and writes; A's
/// late write is refused, before and after it runs again. The sequence
/// number of a contender is no token either, and a holder whose znode an
/// operator deleted holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_zookeeper_session_is_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (zk, up, sc) = setup(dir.path(), LINEARIZABLE).await;
    let a = Holder::start(&zk, dir.path(), "a", "/rack/42");
    let ta = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/42", Some(ta), &[]).await.0, 200, "A's write");

    let b = Holder::start(&zk, dir.path(), "b", "/rack/42");
    let queued = contenders(&zk, "/rack/42", 2).await;
    let waiting = czxid(&zk, "/rack/42", &queued[1]).await;
    assert!(waiting > ta && b.held().is_none(), "B waits behind A");
    let (status, v) = sc.send("PUT", "/racks/42", Some(waiting), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "unknown_token"), "a waiter holds nothing: {v}");
    assert_eq!(sc.send("PUT", "/racks/42", Some(ta), &[]).await.0, 200, "A's second write");

    a.proc.freeze(true);
    let tb = b.token().await;
    assert_eq!(tb, waiting, "B's token is the znode it waited with");
    let (status, v) = sc.send("PUT", "/racks/42", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(tb)), "{v}");
    assert_eq!(sc.send("PUT", "/racks/42", Some(tb), &[]).await.0, 200, "B's write");
    a.proc.freeze(false);
    let (status, v) = sc.send("PUT", "/racks/42", Some(ta), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "stale_token"), "A, running again: {v}");
    let sequence = u64::from(queued[1][queued[1].len() - 10..].parse::<u32>().unwrap());
    let (status, v) = sc.send("PUT", "/racks/42", Some(sequence), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "stale_token"), "a sequence number is no token: {v}");
    // An operator deletes B's znode by hand: B holds nothing from then on.
    zk.kazoo(&format!("zk.delete('/rack/42/{}')", queued[1])).await;
    let (status, v) = sc.send("PUT", "/racks/42", Some(tb), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "lease_expired"), "B's znode deleted by hand: {v}");
    assert_eq!(up.tokens("/racks/42"), vec![Some(ta), Some(ta), Some(tb)]);
}

/// A cached route learns of B from the watch, at once: A's write is
/// refused without a read for want of proof; a released lock refuses B's
/// token as ended. With the ensemble gone nothing is forwarded, and a
/// sidecar restarted then keeps its floors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_route_follows_zookeeper_and_refuses_a_paused_holder() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (mut zk, up, mut sc) = setup(dir.path(), CACHED).await;
    let a = Holder::start(&zk, dir.path(), "a", "/rack/9");
    let ta = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/9", Some(ta), &[]).await.0, 200, "A's write");
    let b = Holder::start(&zk, dir.path(), "b", "/rack/9");
    contenders(&zk, "/rack/9", 2).await;
    a.proc.freeze(true);
    let tb = b.token().await;
    // The watch's read of /rack/9 lands within milliseconds of B's hold;
    // the next proof is up to 3.3 s away.
    wait::until_ok("A refused", Duration::from_secs(2), || async {
        let (status, v) = sc.send("PUT", "/racks/9", Some(ta), &[]).await;
        match (status, error_of(&v), v["current"].as_u64()) {
            (409, "stale_token", Some(current)) if current == tb => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(sc.send("PUT", "/racks/9", Some(tb), &[]).await.0, 200, "B's write");
    a.proc.freeze(false);
    b.release();
    contenders(&zk, "/rack/9", 0).await;
    refused(&sc, "/racks/9", tb, "lease_expired", Duration::from_secs(2)).await;
    let stale = r#"fencegate_sidecar_stale_knowledge_reads_total{route="rack-writes"}"#;
    assert_eq!(metric(&sc.metrics().await, stale), Some(0.0), "no read for want of proof");
    assert_eq!(up.tokens("/racks/9"), vec![Some(ta), Some(tb)]);

    for id in 1..=3 {
        zk.kill_server(id);
    }
    crate::lock_services::floors_outlive_the_service(&mut sc, &up, "/racks/9", (ta, tb)).await;
}

/// An ensemble restored from a backup taken before A's lock: its zxids go
/// back, and B, the restored history's holder, gets a czxid below A's.
/// Neither is forwarded, on either kind of route: refused as ended and as
/// below the floor at once, and once a read of the lock (a cached route's
/// next proof) answers below its latest known grant, which is another
/// history (ZooKeeper names none), as `lock_service_behind_floor`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_zookeeper_whose_zxids_went_back_forwards_neither_holder() {
    for fence in [LINEARIZABLE, CACHED] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let (mut zk, up, sc) = setup(dir.path(), fence).await;
        let backup = dir.path().join("backup");
        zk.backup(&backup);
        zk.ready().await;
        // Its session lost with the servers, the sidecar refuses until it
        // has a new one.
        sc.wait_for_metric("fencegate_sidecar_lock_service_up", 1.0, Duration::from_secs(30)).await;
        // Writes after the backup: the restored history's next zxids fall
        // below A's.
        zk.kazoo("[zk.create('/other-', ephemeral=True, sequence=True) for _ in range(20)]").await;
        let a = Holder::start(&zk, dir.path(), "a", "/rack/5");
        let ta = a.token().await;
        assert_eq!(sc.send("PUT", "/racks/5", Some(ta), &[]).await.0, 200, "A's write");
        // Let go, and known to have let go: a cached route trusts what it
        // last proved for `max_staleness` (10 s here) while the ensemble is
        // down.
        a.release();
        contenders(&zk, "/rack/5", 0).await;
        if fence == CACHED {
            // The watch's read of the release may come well after kazoo
            // saw it (on a loaded machine, queued behind the follower's
            // other reads, a proof's logged barrier among them), and a
            // write meanwhile is forwarded, as the cached window allows.
            // A proof sent after the release knows of it.
            sc.wait_for_proof_after(std::time::Instant::now(), Duration::from_secs(15)).await;
        }
        refused(&sc, "/racks/5", ta, "lease_expired", Duration::from_secs(2)).await;
        zk.restore(&backup);
        zk.ready().await;
        let b = Holder::start(&zk, dir.path(), "b", "/rack/5");
        let tb = b.token().await;
        assert!(tb < ta, "the restored zxids went back: {tb} < {ta}");
        // The sidecar's session is of the history left behind: the
        // servers refuse it (it saw zxids they have not), and it takes a new
        // one once it expires (6 s), refusing everything meanwhile.
        sc.wait_for_metric("fencegate_sidecar_lock_service_up", 1.0, Duration::from_secs(30)).await;
        // Below the floor, or ended: refused on what is known, unread. A
        // cached route may already have read the restored lock (its
        // session's return has every lock read again): then it refuses it
        // as behind the floor.
        for token in [ta, tb] {
            let (status, v) = sc.send("PUT", "/racks/5", Some(token), &[]).await;
            let behind = (status, error_of(&v)) == (503, "lock_service_behind_floor");
            assert!(status == 409 || (fence == CACHED && behind), "{fence}: {status} {v}");
        }
        if fence == CACHED {
            // The next proof reads the lock: another history, and neither
            // holder's token is above the floor.
            sc.wait_for_metric("fencegate_sidecar_lock_service_history_changes_total", 1.0, Duration::from_secs(30))
                .await;
            for token in [ta, tb] {
                refused(&sc, "/racks/5", token, "lock_service_behind_floor", Duration::from_secs(2)).await;
            }
        }
        assert_eq!(up.tokens("/racks/5"), vec![Some(ta)]);
    }
}

/// Locks whose znodes only their user may read (kazoo with digest
/// credentials): the sidecar reads them as that user, its password from a
/// file; with a wrong password it reads nothing and forwards nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_reads_zookeeper_as_a_digest_user() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let zk = ZooKeeper::start(dir.path());
    zk.ready().await;
    let up = Upstream::start().await;
    let a = Holder::start_as(&zk, dir.path(), "a", "/rack/5", Some("fence:s3cret"));
    let ta = a.token().await;
    for (who, password, status, error) in
        [("right", "s3cret", 200, ""), ("wrong", "guess", 503, "lock_service_unavailable")]
    {
        let file = dir.path().join(format!("{who}.password"));
        std::fs::write(&file, format!("{password}\n")).unwrap();
        let more = format!("  user: fence\n  password_file: {}\n", file.display());
        let sc = sidecar(&zk, &up, &dir.path().join(who), &more, LINEARIZABLE).await;
        let (got, v) = sc.send("PUT", "/racks/5", Some(ta), &[]).await;
        assert_eq!((got, error_of(&v)), (status, error), "{who} password: {v}");
    }
    assert_eq!(up.tokens("/racks/5"), vec![Some(ta)]);
}

/// A running sidecar reloaded (SIGHUP) from `linearizable` to `cached`
/// routes follows ZooKeeper at once: its watch tells of B, and A's late
/// write is refused without a read for want of proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_cached_routes_follows_zookeeper_from_then_on() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (zk, up, sc) = setup(dir.path(), LINEARIZABLE).await;
    sc.rewrite_config(&table(&[rack_writes(CACHED)]));
    sc.signal(nix::sys::signal::Signal::SIGHUP);
    let applied = r#"fencegate_sidecar_config_reloads_total{result="applied"}"#;
    sc.wait_for_metric(applied, 1.0, Duration::from_secs(10)).await;
    let a = Holder::start(&zk, dir.path(), "a", "/rack/14");
    let ta = a.token().await;
    assert_eq!(sc.send("PUT", "/racks/14", Some(ta), &[]).await.0, 200, "A's write");
    let b = Holder::start(&zk, dir.path(), "b", "/rack/14");
    contenders(&zk, "/rack/14", 2).await;
    a.release();
    let tb = b.token().await;
    refused(&sc, "/racks/14", ta, "stale_token", Duration::from_secs(2)).await;
    assert_eq!(sc.send("PUT", "/racks/14", Some(tb), &[]).await.0, 200, "B's write");
    let stale = r#"fencegate_sidecar_stale_knowledge_reads_total{route="rack-writes"}"#;
    assert_eq!(metric(&sc.metrics().await, stale), Some(0.0), "no read for want of proof");
    assert_eq!(up.tokens("/racks/14"), vec![Some(ta), Some(tb)]);
}
