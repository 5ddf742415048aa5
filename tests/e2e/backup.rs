//! Backup and restore on real processes: `fencegate snapshot save` from a
//! running cluster, more grants the backup does not know of, the cluster
//! lost, `fencegate snapshot restore` into an empty node, the cluster built
//! again. Every token granted after the restore is above every token
//! granted before it (after the backup too), with the lowest `--min-token`
//! the tool takes; no lease of the backup is live, nor one granted after
//! it; the restored cluster is another history (cluster id); a sidecar
//! that fenced the old cluster refuses the old holders and forwards the new
//! one; a corrupt or unfit backup is refused and writes nothing.

use std::path::Path;
use std::time::Duration;

use fencegate_client::{AcquireOptions, Client};
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::{bin, http, wait, Bin, Cluster, Sidecar, Upstream};

const RUN: Duration = Duration::from_secs(60);

async fn grant(client: &Client, key: &str) -> u64 {
    let lease = client.acquire(key, AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
    let token = lease.token();
    lease.release().await.unwrap();
    token
}

fn snapshot(bin: &Bin, args: &[&str]) -> fencegate_testkit::binary::Output {
    let mut all = vec!["snapshot"];
    all.extend_from_slice(args);
    bin.run(&all, RUN)
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Three nodes and a sidecar with a strict, cached route for `PUT /racks/{id}`.
async fn fenced_cluster(bin: &Bin) -> (Cluster, Upstream, Sidecar) {
    let c = Cluster::start(bin, 3, "").await;
    let up = Upstream::start().await;
    let routes = table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]), everything_else()]);
    let sc = c.sidecar("sidecar", &up.url(), &routes).await;
    (c, up, sc)
}

/// The whole cluster lost, disks and all.
fn lose(c: &mut Cluster) {
    c.kill_all();
    for id in c.ids() {
        std::fs::remove_dir_all(c.data_dir(id)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restored_cluster_grants_above_every_earlier_token_and_no_lease_of_the_backup() {
    let bin = bin!();
    let (mut c, _up, sc) = fenced_cluster(&bin).await;
    let client = c.client();

    let mut before = Vec::new();
    for i in 0..5 {
        before.push(grant(&client, &format!("rack/{i}")).await);
    }
    before.push(grant(&client, "rack/z1").await);
    // Held across the backup (30 s: it would still be live at the restore).
    let held = client.acquire("rack/held", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    assert_eq!(sc.send("PUT", "/racks/held", Some(held.token()), &[]).await.0, 200);
    let old_cluster = client.cluster().await.unwrap().cluster;

    let file = c.dir().join("backup.fgsnap");
    let endpoints = c.urls().join(",");
    let out = snapshot(&bin, &["save", path(&file), "--endpoints", &endpoints]);
    assert_eq!(out.code, 0, "save: {}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("1 leases"), "{}", out.stdout);
    let out = snapshot(&bin, &["inspect", path(&file)]);
    assert_eq!(out.code, 0, "inspect: {}{}", out.stdout, out.stderr);

    // Granted after the backup: it does not know these. rack/z1 is in the
    // backup with an older token, and its holder since writes through the
    // sidecar (its floor is that token).
    for i in 0..5 {
        before.push(grant(&client, &format!("rack/after-{i}")).await);
    }
    let z1 = client.acquire("rack/z1", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    before.push(z1.token());
    assert_eq!(sc.send("PUT", "/racks/z1", Some(z1.token()), &[]).await.0, 200);
    let highest = *before.iter().max().unwrap();
    let revision: u64 = http::metric(&http::get_text(&format!("{}/metrics", c.url(1))).await, "fencegate_lock_revision")
        .expect("the revision gauge") as u64;
    assert!(revision >= highest, "the gauge ({revision}) covers every token ({highest})");

    // The cluster is lost, disks and all.
    lose(&mut c);
    let first = c.dir().join("node1.yaml");
    let (first, second) = (path(&first), c.dir().join("node2.yaml"));
    let nothing_written = |c: &Cluster| assert!(!c.data_dir(1).exists() && !c.data_dir(2).exists());

    // Refused, each writing nothing: a corrupt file, a node that is not
    // the first, a floor JSON parsers cannot read exactly.
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 0x20;
    let corrupt = c.dir().join("corrupt.fgsnap");
    std::fs::write(&corrupt, &bytes).unwrap();
    let out = snapshot(&bin, &["restore", path(&corrupt), "--config", first]);
    assert!(out.code != 0 && out.stderr.contains("checksum mismatch"), "corrupt: {}{}", out.stdout, out.stderr);
    nothing_written(&c);
    let out = snapshot(&bin, &["restore", path(&file), "--config", path(&second)]);
    assert!(out.code != 0 && out.stderr.contains("smallest id"), "second node: {}", out.stderr);
    let out = snapshot(&bin, &["restore", path(&file), "--config", first, "--min-token", &(1u64 << 53).to_string()]);
    assert!(out.code != 0 && out.stderr.contains("2^53"), "a floor above 2^53: {}", out.stderr);
    nothing_written(&c);

    // The restore, into node 1, with the lowest floor the tool takes: the
    // operator does not know what was granted after the backup, and need
    // not. Nodes 2 and 3 start empty.
    let out = snapshot(&bin, &["restore", path(&file), "--config", first, "--min-token", "1"]);
    assert_eq!(out.code, 0, "restore: {}{}", out.stdout, out.stderr);
    let out = snapshot(&bin, &["restore", path(&file), "--config", first]);
    assert!(out.code != 0 && out.stderr.contains("exists"), "a second restore over it: {}", out.stderr);
    c.start_all();
    c.wait_for_leader(Duration::from_secs(20)).await;
    let client = c.client();

    // No key of the old history is held; every token up to the restore
    // reads as ended; the lease held at the backup is unknown.
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match client.read("rack/0").await {
                Ok(info) => return info,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .expect("the restored cluster serves reads");
    assert!(!read.held && read.compacted_below.is_some_and(|b| b > highest), "{read:?}");
    assert!(old_cluster.is_some() && read.cluster.is_some(), "clusters have ids: {old_cluster:?}, {read:?}");
    assert_ne!(read.cluster, old_cluster, "a restored cluster is another history");
    for key in ["rack/held", "rack/z1"] {
        let info = client.read(key).await.unwrap();
        assert!(!info.held, "a lease of the old history is live again: {info:?}");
    }
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let keepalive = format!("{}/v1/leases/{}/keepalive", c.url(leader), held.lease_id());
    assert_eq!(http::raw("POST", &keepalive, None).await.0, 404, "the backup's lease answers keepalives");

    // The lease granted after the backup is honoured by no one: its
    // holder's write is refused before anyone acquires the key again.
    let refused_for = |token: u64, path: &'static str| {
        let sc = &sc;
        async move {
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while std::time::Instant::now() < until {
                let answer = sc.send("PUT", path, Some(token), &[]).await;
                assert_ne!(answer.0, 200, "{path}: the old holder's token {token} was forwarded: {answer:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    refused_for(z1.token(), "/racks/z1").await;

    // Every token granted now is above every token granted before.
    let new_holder = client.acquire("rack/held", AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
    let mut after = vec![new_holder.token()];
    for i in 0..5 {
        after.push(grant(&client, &format!("rack/{i}")).await);
        after.push(grant(&client, &format!("rack/after-{i}")).await);
    }
    let lowest = *after.iter().min().unwrap();
    assert!(lowest > highest, "a token after the restore ({lowest}) is not above one before it ({highest})");
    assert!(after.iter().all(|t| *t < 1 << 53), "tokens JSON parsers read exactly: {after:?}");

    // The sidecar fenced the old cluster and now fences the new one.
    let old = held.token();
    // (Refused at once as an ended lease; as stale once the watch has the new grant.)
    let mut last = None;
    let refused = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let answer = sc.send("PUT", "/racks/held", Some(old), &[]).await;
            if answer.0 == 409 && answer.1["error"] == "stale_token" {
                return;
            }
            assert_ne!(answer.0, 200, "the old holder's write was forwarded");
            last = Some(answer);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(refused.await.is_ok(), "the old holder's write is not refused as stale: {last:?}");
    assert_eq!(sc.send("PUT", "/racks/held", Some(new_holder.token()), &[]).await.0, 200);

    // The table reached the nodes that started empty: without node 1 they
    // still know it, and still grant above the floor.
    c.kill(1);
    let client = Client::new(vec![c.url(2), c.url(3)]).unwrap();
    c.wait_for_leader_among(&[2, 3], Duration::from_secs(20)).await;
    let read = client.read("rack/after-4").await.unwrap();
    assert!(read.token > highest, "{read:?}");
    assert!(grant(&client, "rack/0").await > highest);
}

/// The sidecar's lock service is replaced by another history whose tokens
/// are below what the sidecar already forwarded (a cluster rebuilt empty,
/// or restored by a build that could re-grant tokens). The sidecar sees the
/// cluster id change, drops what it knew, keeps its floors, and forwards
/// neither the old holder's token nor the new holder's lower one, with
/// their own reason and metric, until the service's tokens pass the floor.
/// Before: the old holder's token was forwarded, indefinitely.
#[tokio::test(flavor = "multi_thread")]
async fn a_sidecar_fails_closed_on_a_history_below_its_floors() {
    let bin = bin!();
    let (mut c, _up, mut sc) = fenced_cluster(&bin).await;
    let client = c.client();
    for i in 0..4 {
        grant(&client, &format!("rack/{i}")).await;
    }
    let old = client.acquire("rack/r4", AcquireOptions::new(Duration::from_secs(60))).await.unwrap();
    assert_eq!(sc.send("PUT", "/racks/r4", Some(old.token()), &[]).await.0, 200);
    let floor = old.token();

    // The cluster is rebuilt empty on the same addresses: another history,
    // whose tokens start again at 1.
    lose(&mut c);
    c.start_all();
    c.wait_for_leader(Duration::from_secs(20)).await;
    let client = c.client();
    let new = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match client.acquire("rack/r4", AcquireOptions::new(Duration::from_secs(60))).await {
                Ok(lease) => return lease,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .expect("the new cluster grants");
    assert!(new.token() < floor, "the new history's token {} is not below the floor {floor}", new.token());

    // Once the sidecar has heard of the new history (its knowledge of the
    // old one was proven within `max_staleness`, the documented stale
    // window), neither token passes: both are refused as
    // `lock_service_behind_floor`.
    let changes = "fencegate_sidecar_lock_service_history_changes_total";
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while http::metric(&sc.metrics().await, changes) != Some(1.0) && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = (false, false);
    while !(seen.0 && seen.1) {
        assert!(std::time::Instant::now() < until, "not refused as behind the floor: {seen:?}\n{}", sc.log());
        for (i, token) in [old.token(), new.token()].into_iter().enumerate() {
            let (status, body) = sc.send("PUT", "/racks/r4", Some(token), &[]).await;
            assert_ne!(status, 200, "token {token} was forwarded over a floor of {floor}: {body}");
            if body["error"] == "lock_service_behind_floor" {
                assert_eq!(status, 503);
                if i == 0 {
                    seen.0 = true
                } else {
                    seen.1 = true
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = sc.metrics().await;
    assert_eq!(http::metric(&metrics, changes), Some(1.0), "{metrics}");
    let refused = r#"fencegate_sidecar_rejections_total{reason="lock_service_behind_floor",route="rack-writes"}"#;
    assert!(http::metric(&metrics, refused).unwrap_or(0.0) >= 2.0, "{metrics}");
    // A sidecar restarted now knows nothing but its floors, and no history:
    // it fails closed the same way once the service has answered.
    sc.restart().await;
    let refused_again = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (status, body) = sc.send("PUT", "/racks/r4", Some(new.token()), &[]).await;
            assert_ne!(status, 200, "after a restart, token {} was forwarded over a floor of {floor}", new.token());
            if body["error"] == "lock_service_behind_floor" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(refused_again.await.is_ok(), "not refused as behind the floor after a restart");

    // The new history's tokens pass the floor: fencing goes on.
    new.release().await.unwrap();
    while grant(&client, "rack/other").await <= floor {}
    let newer = client.acquire("rack/r4", AcquireOptions::new(Duration::from_secs(60))).await.unwrap();
    let forwarded = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if sc.send("PUT", "/racks/r4", Some(newer.token()), &[]).await.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(forwarded.await.is_ok(), "the holder above the floor is not forwarded");
    assert_ne!(sc.send("PUT", "/racks/r4", Some(old.token()), &[]).await.0, 200);
}

/// What a node, a sidecar and a backup write is theirs alone, whatever the
/// umask they were started with (022 here): every file 0600, every
/// directory they made 0700. A sidecar restarted on a state file an
/// earlier build left 0644 takes it back to 0600.
#[tokio::test(flavor = "multi_thread")]
async fn state_files_and_backups_are_the_processs_alone() {
    use std::os::unix::fs::PermissionsExt;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    // Every entry under `dir` (made by fencegate), and `dir` itself.
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        out.push(dir.to_path_buf());
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            match p.is_dir() {
                true => walk(&p, out),
                false => out.push(p),
            }
        }
    }
    let bin = bin!();
    let c = Cluster::start(&bin, 1, "raft: { snapshot_every: 100 }\n").await;
    let up = Upstream::start().await;
    let routes = table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"])]);
    let mut sc = c.sidecar("sidecar", &up.url(), &routes).await;
    let client = c.client();
    // An acquire and a release each: the node writes its snapshot file.
    for i in 0..60 {
        grant(&client, &format!("rack/{i}")).await;
    }
    let held = client.acquire("rack/held", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    assert_eq!(sc.send("PUT", "/racks/held", Some(held.token()), &[]).await.0, 200);
    let file = c.dir().join("backup.fgsnap");
    let out = snapshot(&bin, &["save", path(&file), "--endpoints", &c.urls().join(",")]);
    assert_eq!(out.code, 0, "save: {}{}", out.stdout, out.stderr);
    let data = c.data_dir(1);
    wait::until("the node's snapshot file", Duration::from_secs(10), || async { data.join("snapshot").exists() }).await;

    let state = c.dir().join("sidecar").join("state");
    let mut made = vec![file.clone()];
    walk(&data, &mut made);
    walk(&state, &mut made);
    for name in ["raft.redb", "snapshot", "log"] {
        assert!(made.contains(&data.join(name)), "{name}: {made:?}");
    }
    for name in ["floors.redb", "idempotency.log", "admin-token"] {
        assert!(made.contains(&state.join(name)), "{name}: {made:?}");
    }
    let open: Vec<_> = made
        .iter()
        .map(|p| (p, mode(p)))
        .filter(|(p, m)| *m != if p.is_dir() { 0o700 } else { 0o600 })
        .map(|(p, m)| format!("{} {m:o}", p.display()))
        .collect();
    assert!(open.is_empty(), "{open:?}");

    // State an earlier build left open is tightened at start.
    let floors = state.join("floors.redb");
    sc.kill();
    std::fs::set_permissions(&floors, std::fs::Permissions::from_mode(0o644)).unwrap();
    sc.restart().await;
    assert_eq!(format!("{:o}", mode(&floors)), "600");
    assert!(sc.log().contains("made 0600"), "{}", sc.log());
}
