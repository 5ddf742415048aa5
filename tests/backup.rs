//! Backup and restore on real processes: `fencegate snapshot save` from a
//! running cluster, more grants the backup does not know of, the cluster
//! lost, `fencegate snapshot restore` into an empty node, the cluster built
//! again. Every token granted after the restore is above every token
//! granted before it (after the backup too); no lease of the backup is
//! live; a sidecar that fenced the old cluster refuses the old holder and
//! forwards the new one; a corrupt or unfit backup is refused and writes
//! nothing.

use std::path::Path;
use std::time::Duration;

use fencegate_client::{AcquireOptions, Client};
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::{bin, http, Bin, Cluster, Upstream};

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

#[tokio::test(flavor = "multi_thread")]
async fn a_restored_cluster_grants_above_every_earlier_token_and_no_lease_of_the_backup() {
    let bin = bin!();
    let mut c = Cluster::start(&bin, 3, "").await;
    let up = Upstream::start().await;
    let routes = table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]), everything_else()]);
    let sc = c.sidecar("sidecar", &up.url(), &routes).await;
    let client = c.client();

    let mut before = Vec::new();
    for i in 0..5 {
        before.push(grant(&client, &format!("rack/{i}")).await);
    }
    // Held across the backup (30 s: it would still be live at the restore).
    let held = client.acquire("rack/held", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    assert_eq!(sc.send("PUT", "/racks/held", Some(held.token()), &[]).await.0, 200);

    let file = c.dir().join("backup.fgsnap");
    let endpoints = c.urls().join(",");
    let out = snapshot(&bin, &["save", path(&file), "--endpoints", &endpoints]);
    assert_eq!(out.code, 0, "save: {}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("1 leases"), "{}", out.stdout);
    let out = snapshot(&bin, &["inspect", path(&file)]);
    assert_eq!(out.code, 0, "inspect: {}{}", out.stdout, out.stderr);

    // Granted after the backup: it does not know these.
    for i in 0..5 {
        before.push(grant(&client, &format!("rack/after-{i}")).await);
    }
    let highest = *before.iter().max().unwrap();
    let revision: u64 = http::metric(&http::get_text(&format!("{}/metrics", c.url(1))).await, "fencegate_lock_revision")
        .expect("the revision gauge") as u64;
    assert!(revision >= highest, "the gauge ({revision}) covers every token ({highest})");

    // The cluster is lost, disks and all.
    c.kill_all();
    for id in c.ids() {
        std::fs::remove_dir_all(c.data_dir(id)).unwrap();
    }
    let first = c.dir().join("node1.yaml");
    let (first, second) = (path(&first), c.dir().join("node2.yaml"));
    let nothing_written = |c: &Cluster| assert!(!c.data_dir(1).exists() && !c.data_dir(2).exists());

    // Refused, each writing nothing: a corrupt file, a --min-token below
    // what the backup itself shows, a node that is not the first, no
    // --min-token at all.
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 0x20;
    let corrupt = c.dir().join("corrupt.fgsnap");
    std::fs::write(&corrupt, &bytes).unwrap();
    let min = highest.to_string();
    let out = snapshot(&bin, &["restore", path(&corrupt), "--config", first, "--min-token", &min]);
    assert!(out.code != 0 && out.stderr.contains("checksum mismatch"), "corrupt: {}{}", out.stdout, out.stderr);
    nothing_written(&c);
    let out = snapshot(&bin, &["restore", path(&file), "--config", first, "--min-token", "3"]);
    assert!(out.code != 0 && out.stderr.contains("below the backup's revision"), "low: {}", out.stderr);
    let out = snapshot(&bin, &["restore", path(&file), "--config", path(&second), "--min-token", &min]);
    assert!(out.code != 0 && out.stderr.contains("smallest id"), "second node: {}", out.stderr);
    let out = snapshot(&bin, &["restore", path(&file), "--config", first]);
    assert!(out.code != 0 && out.stderr.contains("--min-token"), "no floor: {}", out.stderr);
    nothing_written(&c);

    // The restore, into node 1; nodes 2 and 3 start empty.
    let out = snapshot(&bin, &["restore", path(&file), "--config", first, "--min-token", &min]);
    assert_eq!(out.code, 0, "restore: {}{}", out.stdout, out.stderr);
    let out = snapshot(&bin, &["restore", path(&file), "--config", first, "--min-token", &min]);
    assert!(out.code != 0 && out.stderr.contains("exists"), "a second restore over it: {}", out.stderr);
    c.start_all();
    c.wait_for_leader(Duration::from_secs(20)).await;
    let client = c.client();

    // Keys keep their latest token; the lease held at the backup is not
    // live: its key is free, its id unknown.
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
    assert_eq!(read.token, before[0]);
    let info = client.read("rack/held").await.unwrap();
    assert!(!info.held, "a lease of the backup is live again: {info:?}");
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let keepalive = format!("{}/v1/leases/{}/keepalive", c.url(leader), held.lease_id());
    assert_eq!(http::raw("POST", &keepalive, None).await.0, 404, "the backup's lease answers keepalives");

    // Every token granted now is above every token granted before.
    let new_holder = client.acquire("rack/held", AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
    let mut after = vec![new_holder.token()];
    for i in 0..5 {
        after.push(grant(&client, &format!("rack/{i}")).await);
        after.push(grant(&client, &format!("rack/after-{i}")).await);
    }
    let lowest = *after.iter().min().unwrap();
    assert!(lowest > highest, "a token after the restore ({lowest}) is not above one before it ({highest})");

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
