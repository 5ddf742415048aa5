//! The `fencegate` command line as a user runs it.

mod common;

use std::process::Command;
use std::time::Duration;

use common::Cluster;

fn fencegate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fencegate")).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn check_config_accepts_the_shipped_configs_and_rejects_bad_ones_with_64() {
    for i in 1..=3 {
        let path = format!("{}/config/node{i}.yaml", env!("CARGO_MANIFEST_DIR"));
        let (code, out, err) = fencegate(&["check-config", &path]);
        assert_eq!(code, 0, "{path}: {out}{err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "id: 1\nlisten: 127.0.0.1:1\ndata_dir: x\npeers: {1: 'http://127.0.0.1:1'}\ncolour: blue\n")
        .unwrap();
    let (code, _, err) = fencegate(&["check-config", bad.to_str().unwrap()]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("colour") && err.contains("line 5"), "{err}");
    let (code, _, err) = fencegate(&["check-config", "/nonexistent.yaml"]);
    assert_eq!(code, 64, "{err}");
    // `server` validates before binding anything, with the same exit status.
    let (code, _, _) = fencegate(&["server", "--config", bad.to_str().unwrap()]);
    assert_eq!(code, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_cluster_and_a_key() {
    let c = Cluster::start(3, "").await;
    let endpoints = c.urls().join(",");
    let lease = c
        .client()
        .acquire("rack/9", fencegate::client::AcquireOptions::new(Duration::from_secs(30)).holder("ops-1"))
        .await
        .unwrap();
    let (code, out, err) = fencegate(&["status", "--endpoints", &endpoints]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("leader:       node") && out.contains("members:"), "{out}");
    let (code, out, _) = fencegate(&["status", "rack/9", "--endpoints", &endpoints]);
    assert_eq!(code, 0);
    assert!(out.contains("held by ops-1") && out.contains(&format!("token:   {}", lease.token())), "{out}");
    let (code, _, err) = fencegate(&["status", "bad key", "--endpoints", &endpoints]);
    assert_eq!(code, 1);
    assert!(err.contains("key must be"), "{err}");
    // Nothing listening: a clear error, not a hang.
    let (code, _, err) = fencegate(&["status", "--endpoints", &format!("http://127.0.0.1:{}", common::free_port())]);
    assert_eq!(code, 1);
    assert!(err.contains("unavailable"), "{err}");
}
