//! `fencegate lock KEY -- CMD` as a user runs it, against a real cluster.

use std::process::Stdio;
use std::time::Duration;

use fencegate_client::AcquireOptions;
use fencegate_testkit::{bin, wait, Cluster};
use tokio::process::Command;
use tokio::time::Instant;

/// `fencegate lock args…` against `c` (killed if the test ends first).
fn lock_cmd(c: &Cluster, args: &[&str]) -> Command {
    let mut cmd = c.bin().tokio_command(&["lock"]);
    cmd.args(args).env("FENCEGATE_ENDPOINTS", c.urls().join(",")).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Run it to its exit (30 s at most).
async fn run(mut cmd: Command) -> std::process::Output {
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output()).await;
    out.expect("fencegate lock did not exit within 30 s").unwrap()
}

fn alive(pid: i32) -> bool {
    // A zombie still has a /proc entry; check its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_the_command_with_the_token_and_releases_after() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let out =
        run(lock_cmd(&c, &["rack/1", "--", "sh", "-c", "echo $FENCE_KEY $FENCE_TOKEN ${#FENCE_LEASE_ID}; exit 3"]))
            .await;
    assert_eq!(out.status.code(), Some(3), "CMD's own exit status: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(fields[0], "rack/1");
    let token: u64 = fields[1].parse().unwrap();
    assert_eq!(fields[2], "32", "a lease id was passed");
    let info = c.client().read("rack/1").await.unwrap();
    assert!(!info.held, "released when CMD ended");
    assert_eq!(info.token, token);
    // The operation id for CMD's idempotency keys: a fresh one by default,
    // the job's own when given.
    let out = run(lock_cmd(&c, &["rack/1", "--", "sh", "-c", "echo ${#FENCE_OPERATION_ID}"])).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "32");
    let given = ["rack/1", "--operation-id", "ticket-42", "--", "sh", "-c", "echo $FENCE_OPERATION_ID"];
    let out = run(lock_cmd(&c, &given)).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ticket-42");
    let out = run(lock_cmd(&c, &["rack/1", "--operation-id", "a b", "--", "true"])).await;
    assert_eq!(out.status.code(), Some(2), "refused by the argument parser");
}

/// A CMD that cannot run gets a shell's status (127 not found, 126 not
/// executable), and the lock is given back at once, not held for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_run_exits_as_a_shell_would_and_releases_the_lock() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let not_executable = c.dir().join("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    for (cmd, code) in [("/nonexistent/cmd", 127), (not_executable.to_str().unwrap(), 126)] {
        let out = run(lock_cmd(&c, &["rack/42", "--ttl", "30s", "--", cmd])).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{cmd}: {stderr}");
        assert!(stderr.contains("cannot run") && !stderr.contains("panicked"), "{stderr}");
        let info = c.client().read("rack/42").await.unwrap();
        assert!(!info.held, "{cmd}: the lock is still held: {info:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_75_when_the_lock_is_not_obtained_within_wait() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let held = c.client().acquire("rack/2", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    let started = Instant::now();
    let out = run(lock_cmd(&c, &["rack/2", "--wait", "700ms", "--", "true"])).await;
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not obtained"));
    held.release().await.unwrap();
}

/// The cluster goes away under a running command: CMD must be stopped within
/// the lease's validity bound, and `fencegate lock` exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stops_the_command_within_the_lease_bound_when_the_lease_is_lost() {
    let mut c = Cluster::start(&bin!(), 3, "").await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut child =
        lock_cmd(&c, &["rack/3", "--ttl", "2s", "--grace", "1s", "--", "sh", "-c", &script]).spawn().unwrap();
    let pid: i32 = wait::until_ok("CMD writing its pid", Duration::from_secs(10), || async {
        std::fs::read_to_string(&pidfile).map_err(|e| e.to_string())?.trim().parse::<i32>().map_err(|e| e.to_string())
    })
    .await;
    assert!(alive(pid));
    c.kill_all();
    let killed_at = Instant::now();
    let status =
        tokio::time::timeout(Duration::from_secs(10), child.wait()).await.expect("fencegate lock hung").unwrap();
    let stopped_after = killed_at.elapsed();
    assert_eq!(status.code(), Some(76));
    assert!(!alive(pid), "CMD still running after the lease was lost");
    // Validity is at most ttl*(1-drift)-margin = 1.88 s after the last
    // acknowledged keepalive, which was sent before the cluster died; sleep
    // dies on SIGTERM at once.
    assert!(stopped_after < Duration::from_millis(2200), "stopped only after {stopped_after:?}");
}

/// Ctrl-C (exit 130) and SIGTERM (exit 143), as a shell reports a job
/// ended by them: CMD is stopped and the lease released at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_command_and_releases_the_lease_at_once() {
    use nix::sys::signal::Signal;
    let c = Cluster::start(&bin!(), 3, "").await;
    let client = c.client();
    for (key, signal, code) in [("rack/4", Signal::SIGINT, 130), ("rack/5", Signal::SIGTERM, 143)] {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
        let mut child = lock_cmd(&c, &[key, "--", "sh", "-c", &script]).spawn().unwrap();
        wait::until("the key taken", Duration::from_secs(10), || async {
            pidfile.exists() && client.read(key).await.unwrap().held
        })
        .await;
        let cmd: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), signal).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await.unwrap().unwrap();
        assert_eq!(status.code(), Some(code), "{signal}");
        assert!(!alive(cmd), "CMD stopped ({signal})");
        // Another waiter gets the key straight away: it was released, not left to expire.
        let started = Instant::now();
        let next = client.acquire(key, AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        next.release().await.unwrap();
    }
}

/// fencegate killed outright (kill -9: no handler runs) takes CMD with it:
/// nothing would stop CMD when the lease is lost, and it must not work on
/// unwatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_fencegate_kills_the_command() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let client = c.client();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut child = lock_cmd(&c, &["rack/6", "--", "sh", "-c", &script]).spawn().unwrap();
    wait::until("the key taken", Duration::from_secs(10), || async {
        pidfile.exists() && client.read("rack/6").await.unwrap().held
    })
    .await;
    let cmd: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    wait::until("CMD gone", Duration::from_secs(5), || async { !alive(cmd) }).await;
}

/// Against a secure cluster: TLS and a token from the environment for
/// `lock`, a client certificate on the command line for `status`; without
/// credentials, a clear refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speaks_tls_and_authenticates_to_a_secure_cluster() {
    use fencegate_testkit::cluster::{ClusterOptions, Security};
    let security = Security {
        acl: "  - { identity: deploy, prefixes: [rack/], rights: [acquire] }\n  - { identity: viewer, prefixes: [rack/], rights: [read] }\n".into(),
        tokens: vec![("deploy".into(), "deploy-token".into())],
        ..Default::default()
    };
    let c = Cluster::start_with(&bin!(), ClusterOptions { security: Some(security), ..Default::default() }).await;
    let ca = c.pki().unwrap().ca.display().to_string();
    let mut cmd = lock_cmd(&c, &["rack/9", "--", "sh", "-c", "echo $FENCE_TOKEN"]);
    cmd.env("FENCEGATE_CA", &ca).env("FENCEGATE_TOKEN", "deploy-token");
    let out = run(cmd).await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let token: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();

    let (cert, key) = c.pki().unwrap().client_cert("viewer");
    let mut status = c.bin().tokio_command(&["status", "rack/9", "--ca", &ca, "--cert"]);
    status.arg(&cert).arg("--key").arg(&key).env("FENCEGATE_ENDPOINTS", c.urls().join(","));
    let out = run(status).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("token:   {token}")),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut anonymous = lock_cmd(&c, &["rack/9", "--", "true"]);
    anonymous.env("FENCEGATE_CA", &ca);
    let out = run(anonymous).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("unauthorized"), "{stderr}");
}
