//! What containers and Kubernetes rely on: `fencegate healthcheck` (the
//! image's HEALTHCHECK, no curl) against each role's own port, a node's
//! `/readyz`, and peers named by DNS name (compose service names, StatefulSet
//! pod names), resolved when a node connects.

use std::path::Path;
use std::time::Duration;

use fencegate_testkit::ports::reserve;
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::{bin, free_port, Cluster, Proc, Sidecar, Upstream};
use tokio::time::Instant;

/// `fencegate healthcheck ARGS…` with `env` set: (exit status, stderr).
fn healthcheck(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = bin!().command(&["healthcheck"]);
    cmd.args(args).env_remove("FENCEGATE_HEALTH_URL").envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn healthcheck_passes_on_each_roles_own_port_and_says_what_failed() {
    let cluster = Cluster::start(&bin!(), 3, "").await;
    let node = cluster.url(2);
    for path in ["/healthz", "/readyz"] {
        let (code, err) = healthcheck(&[&format!("{node}{path}")], &[]);
        assert_eq!(code, 0, "node {path}: {err}");
        assert!(err.is_empty(), "nothing printed when healthy: {err}");
    }
    // The URL from the environment, as the compose file and manifests set it.
    let (code, err) = healthcheck(&[], &[("FENCEGATE_HEALTH_URL", &format!("{node}/healthz"))]);
    assert_eq!(code, 0, "FENCEGATE_HEALTH_URL: {err}");

    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = table(&[rack_writes("{ mode: strict }"), everything_else()]);
    let sidecar = Sidecar::start(&bin!(), dir.path(), &upstream.url(), &cluster.urls(), &yaml).await;
    let metrics = format!("http://127.0.0.1:{}", sidecar.metrics_port);
    let (code, err) = healthcheck(&[], &[("FENCEGATE_HEALTH_URL", &format!("{metrics}/healthz"))]);
    assert_eq!(code, 0, "sidecar /healthz: {err}");

    // Nothing listening: exit 1 and one line naming the URL and the cause.
    let closed = format!("http://127.0.0.1:{}/healthz", free_port());
    let (code, err) = healthcheck(&[&closed], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unhealthy") && err.contains(&closed) && err.contains("refused"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    // An answer that is not 2xx: its status and first line.
    let (code, err) = healthcheck(&[&format!("{metrics}/nothing")], &[]);
    assert!(code == 1 && err.contains("404"), "{code}: {err}");
    // https is never accepted unverified.
    let (code, err) = healthcheck(&["https://127.0.0.1:1/healthz"], &[]);
    assert!(code == 1 && err.contains("--ca"), "{code}: {err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_node_is_checked_against_its_ca() {
    let cluster = Cluster::start_with(
        &bin!(),
        fencegate_testkit::cluster::ClusterOptions { security: Some(Default::default()), ..Default::default() },
    )
    .await;
    let ca = &cluster.pki().unwrap().ca;
    let url = format!("{}/healthz", cluster.url(1));
    let (code, err) = healthcheck(&[&url, "--ca", ca.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{url}: {err}");
    // Another CA's certificate is not this node's: unhealthy, not trusted.
    let other = fencegate_testkit::tls::Pki::new(&cluster.dir().join("other"), "other");
    let (code, err) = healthcheck(&[&url, "--ca", other.ca.to_str().unwrap()], &[]);
    assert!(code == 1 && err.contains("unhealthy"), "{code}: {err}");
}

/// A node config of a 3-node cluster whose peers are named `localhost`,
/// not an address: as `node1:7501` in compose, `fencegate-0.fencegate:7501`
/// in Kubernetes.
fn named_config(dir: &Path, id: u64, ports: &[(u16, u16)]) -> std::path::PathBuf {
    let peers: String = (1..=3).map(|i| format!("  {i}: http://localhost:{}\n", ports[i - 1].1)).collect();
    let clients: String = (1..=3).map(|i| format!("  {i}: http://localhost:{}\n", ports[i - 1].0)).collect();
    let (listen, peer) = ports[id as usize - 1];
    let yaml = format!(
        "kind: node\nid: {id}\nlisten: 127.0.0.1:{listen}\npeer_listen: 127.0.0.1:{peer}\ndata_dir: {}\npeers:\n{peers}clients:\n{clients}",
        dir.join(format!("node{id}")).display()
    );
    let path = dir.join(format!("node{id}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

fn start_node(dir: &Path, config: &Path, id: u64) -> Proc {
    let mut cmd = bin!().command(&["server", "--config"]);
    cmd.arg(config).env("FENCEGATE_LOG", "info,openraft=warn");
    Proc::spawn(&format!("node{id}"), cmd, &dir.join(format!("node{id}.log")))
}

#[tokio::test(flavor = "multi_thread")]
async fn peers_by_dns_name_form_a_cluster_and_readyz_waits_for_a_leader() {
    let dir = tempfile::tempdir().unwrap();
    let reserved: Vec<_> = (0..6).map(|_| reserve()).collect();
    let ports: Vec<(u16, u16)> = reserved.chunks(2).map(|r| (r[0].port, r[1].port)).collect();
    let configs: Vec<_> = (1..=3).map(|id| named_config(dir.path(), id, &ports)).collect();
    for c in &configs {
        let out = bin!().run(&["check-config", c.to_str().unwrap()], Duration::from_secs(30));
        assert_eq!(out.code, 0, "check-config accepts peers by name: {}", out.stderr);
    }
    let url = |id: usize, path: &str| format!("http://127.0.0.1:{}{path}", ports[id - 1].0);
    let mut nodes = vec![start_node(dir.path(), &configs[0], 1)];
    // Alive but alone: live, not ready (no quorum, so no leader).
    let deadline = Instant::now() + Duration::from_secs(10);
    while healthcheck(&[&url(1, "/healthz")], &[]).0 != 0 {
        assert!(Instant::now() < deadline, "node 1 did not serve /healthz:\n{}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (code, err) = healthcheck(&[&url(1, "/readyz")], &[]);
    assert!(code == 1 && err.contains("503") && err.contains("no leader"), "{code}: {err}");

    // The others join; the names are resolved when the nodes connect.
    nodes.push(start_node(dir.path(), &configs[1], 2));
    nodes.push(start_node(dir.path(), &configs[2], 3));
    let deadline = Instant::now() + Duration::from_secs(20);
    for id in 1..=3 {
        while healthcheck(&[&url(id, "/readyz")], &[]).0 != 0 {
            let logs: Vec<String> = nodes.iter().map(|n| n.log()).collect();
            assert!(Instant::now() < deadline, "node {id} not ready within 20 s:\n{}", logs.join("\n---\n"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let status = bin!().run(&["status", "--endpoints", &url(2, "")], Duration::from_secs(30));
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert!(status.stdout.contains("http://localhost:"), "members by name: {}", status.stdout);
    drop(reserved);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_replays_on_running_components_as_in_compose() {
    let cluster = Cluster::start(&bin!(), 3, "").await;
    let dir = tempfile::tempdir().unwrap();
    // `fencegate inventory`, the compose file's `inventory` service.
    let port = reserve();
    let inventory_url = format!("http://127.0.0.1:{}", port.port);
    let cmd = bin!().command(&["inventory", "--listen", &format!("127.0.0.1:{}", port.port)]);
    let inventory = Proc::spawn("inventory", cmd, &dir.path().join("inventory.log"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while healthcheck(&[&format!("{inventory_url}/racks")], &[]).0 != 0 {
        assert!(Instant::now() < deadline, "the inventory did not serve:\n{}", inventory.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let yaml = table(&[rack_writes("{ mode: strict }"), everything_else()]);
    let sidecar = Sidecar::start(&bin!(), dir.path().join("sidecar"), &inventory_url, &cluster.urls(), &yaml).await;
    let endpoints = cluster.urls().join(",");
    let args = ["demo", "--ttl", "1s", "--pause", "1500ms", "--endpoints", &endpoints];
    let sidecar_url = sidecar.url();
    let remote = [&args[..], &["--sidecar", &sidecar_url, "--inventory", &inventory_url]].concat();
    let out = bin!().run(&remote, Duration::from_secs(60));
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(!out.stdout.contains("starting a 3-node"), "it starts nothing of its own: {}", out.stdout);
    assert!(out.stdout.contains("via Sidecar -> 409"), "A's stale write refused: {}", out.stdout);
    // A second run on the same components works too (tokens only go up).
    let again = bin!().run(&remote, Duration::from_secs(60));
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    // Half the targets is a usage error, not a demo on a stack of its own.
    let half = bin!().run(&args, Duration::from_secs(10));
    assert_eq!(half.code, 2, "{}", half.stderr);
}

/// A leader cut off from its majority stays leader in openraft (it does not
/// step down by itself): `/readyz` must say it cannot serve, so Kubernetes
/// takes it out of the client Service, and say so again once it can.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_without_its_quorum_is_not_ready() {
    let cluster = Cluster::start(&bin!(), 3, "").await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let ready = |id| healthcheck(&[&format!("{}/readyz", cluster.url(id))], &[]);
    assert_eq!(ready(leader).0, 0, "{}", ready(leader).1);
    let others: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != leader).collect();
    for id in &others {
        cluster.freeze(*id, true);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        let (code, err) = ready(leader);
        if code != 0 {
            break err;
        }
        assert!(Instant::now() < deadline, "the leader stayed ready without a quorum for 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(err.contains("503") && err.contains("no quorum has acknowledged"), "{err}");
    for id in &others {
        cluster.freeze(*id, false);
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready(leader).0 != 0 {
        assert!(Instant::now() < deadline, "not ready again with its quorum back: {}", ready(leader).1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
