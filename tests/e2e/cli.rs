//! The `fencegate` command line as a user runs it.

use std::time::Duration;

use fencegate_testkit::{bin, free_port, http, Cluster};

/// `fencegate args…`, which must exit within a minute: (exit status, stdout, stderr).
fn fencegate(args: &[&str]) -> (i32, String, String) {
    let out = bin!().run(args, Duration::from_secs(60));
    (out.code, out.stdout, out.stderr)
}

/// A plaintext peer plane where identities mean something needs the
/// members' secret, in a file only its owner may read; `check-config`
/// refuses it otherwise (64) and says who can speak on the peer plane.
#[test]
fn check_config_holds_a_plaintext_peer_plane_to_a_private_secret() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (tokens, secret, node) = (dir.path().join("tokens.yaml"), dir.path().join("secret"), dir.path().join("n.yaml"));
    std::fs::write(&tokens, "").unwrap();
    std::fs::write(&secret, format!("{}\n", "7".repeat(64))).unwrap();
    let base = format!(
        "id: 1\nlisten: 127.0.0.1:7401\npeer_listen: 127.0.0.1:7501\ndata_dir: d\npeers: {{ 1: http://127.0.0.1:7501 }}\n\
         auth: {{ tokens_file: {} }}\nacl: [{{ identity: ci, prefixes: [rack/], rights: [acquire] }}]\n",
        tokens.display()
    );
    let check = |yaml: String| {
        std::fs::write(&node, yaml).unwrap();
        fencegate(&["check-config", node.to_str().unwrap()])
    };
    let (code, _, err) = check(base.clone());
    assert!(code == 64 && err.contains("`peer_secret_file`") && err.contains("every local user"), "{code} {err}");
    let with_secret = format!("{base}peer_secret_file: {}\n", secret.display());
    for (mode, ok) in [(0o644, false), (0o640, false), (0o600, true), (0o400, true)] {
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(mode)).unwrap();
        let (code, out, err) = check(with_secret.clone());
        match ok {
            true => assert!(
                code == 0
                    && out.contains(&format!("peer plane: members prove the shared secret in {}", secret.display())),
                "{mode:o}: {code} {out}{err}"
            ),
            false => assert!(code == 64 && err.contains("chmod 600"), "{mode:o}: {code} {err}"),
        }
    }
}

/// With the cluster down, `member list` gives up as `status` does (69
/// within the client's failover budget), not after a membership change's
/// 150 s; and it takes `--endpoints` after `list`.
#[test]
fn member_list_gives_up_in_seconds_when_no_node_answers() {
    let down = format!("http://127.0.0.1:{}", free_port());
    let started = std::time::Instant::now();
    let (code, _, stderr) = fencegate(&["member", "list", "--endpoints", &down]);
    assert_eq!(code, 69, "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
}

/// Every read gives up as `status` does when nothing listens: non-zero
/// within seconds (the client's 5 s failover budget), not after a
/// membership change's 150 s or a backup's 60 s.
#[test]
fn every_read_gives_up_in_seconds_when_nothing_listens() {
    let down = format!("http://127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let (file, token) = (dir.path().join("backup"), dir.path().join("admin-token"));
    std::fs::write(&token, "t\n").unwrap();
    let (file, token) = (file.to_str().unwrap().to_string(), token.to_str().unwrap().to_string());
    let idempotency = ["--sidecar", &down, "--token-file", &token, "--lock-key", "rack/1", "--fence-token", "1"];
    let commands: Vec<Vec<&str>> = vec![
        vec!["status", "--endpoints", &down],
        vec!["status", "rack/1", "--endpoints", &down],
        vec!["member", "list", "--endpoints", &down],
        vec!["member", "add", "4", "http://127.0.0.1:1", "--endpoints", &down],
        vec!["member", "remove", "3", "--endpoints", &down],
        vec!["snapshot", "save", &file, "--endpoints", &down],
        [&["idempotency", "show", "--key", "k"][..], &idempotency].concat(),
    ];
    std::thread::scope(|s| {
        for args in &commands {
            s.spawn(move || {
                let started = std::time::Instant::now();
                let (code, _, stderr) = fencegate(args);
                let took = started.elapsed();
                assert_eq!(code, 69, "{args:?}: {stderr}");
                assert!(stderr.contains(" unavailable: "), "{args:?}: {stderr}");
                assert!(took < Duration::from_secs(15), "{args:?} took {took:?}");
            });
        }
    });
}

#[test]
fn check_config_accepts_the_shipped_configs_and_rejects_bad_ones_with_64() {
    for name in ["node1", "node2", "node3", "sidecar", "dev"] {
        let path = format!("{}/config/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
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
    // Which kind of file it is comes from its fields, not from which parse fails.
    let neither = dir.path().join("neither.yaml");
    std::fs::write(
        &neither,
        "listen: 127.0.0.1:1
",
    )
    .unwrap();
    let (code, _, err) = fencegate(&["check-config", neither.to_str().unwrap()]);
    assert!(code == 64 && err.contains("both or neither") && err.contains("kind: sidecar"), "{code} {err}");
    // `kind:` decides, and a file of one kind is never taken for the other.
    let sidecar = std::fs::read_to_string(format!("{}/config/sidecar.yaml", env!("CARGO_MANIFEST_DIR"))).unwrap();
    for (kind, says) in [("kind: node", "unknown field"), ("kind: lamp", "`sidecar` or `node`")] {
        let file = dir.path().join("kind.yaml");
        std::fs::write(&file, sidecar.replace("kind: sidecar", kind)).unwrap();
        let (code, _, err) = fencegate(&["check-config", file.to_str().unwrap()]);
        assert!(code == 64 && err.contains(says), "{kind}: {code} {err}");
        let (code, _, err) = fencegate(&["sidecar", "--config", file.to_str().unwrap()]);
        assert!(code == 64 && err.contains("kind"), "sidecar on {kind}: {code} {err}");
    }
    // A fenced route behind a catch-all that takes its writes is refused, naming both.
    let shadowed = dir.path().join("shadowed.yaml");
    std::fs::write(
        &shadowed,
        "listen: 127.0.0.1:1\nupstream: http://127.0.0.1:2\nstate_dir: x\nroutes:\n  - { name: all, path: '/{*rest}', fence: off }\n  - { name: racks, methods: [PUT], path: '/racks/{rack}', lock_key: 'rack/{rack}', fence: { mode: observed } }\n",
    )
    .unwrap();
    let (code, _, err) = fencegate(&["check-config", shadowed.to_str().unwrap()]);
    assert!(code == 64 && err.contains("\"racks\"") && err.contains("\"all\""), "{code} {err}");
    // `server` validates before binding anything, with the same exit status.
    let (code, _, _) = fencegate(&["server", "--config", bad.to_str().unwrap()]);
    assert_eq!(code, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_cluster_and_a_key() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let endpoints = c.urls().join(",");
    let lease = c
        .client()
        .acquire("rack/9", fencegate_client::AcquireOptions::new(Duration::from_secs(30)).holder("ops-1"))
        .await
        .unwrap();
    let (code, out, err) = fencegate(&["status", "--endpoints", &endpoints]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("leader:       node") && out.contains("members:"), "{out}");
    let (code, out, _) = fencegate(&["status", "rack/9", "--endpoints", &endpoints]);
    assert_eq!(code, 0);
    assert!(out.contains("held by ops-1") && out.contains(&format!("token:   {}", lease.token())), "{out}");
    // A key no node would take is a usage error, found before any request.
    let (code, _, err) = fencegate(&["status", "bad key", "--endpoints", &endpoints]);
    assert_eq!(code, 2);
    assert!(err.contains("key must be"), "{err}");
    // Nothing listening: a clear error, not a hang, and its own exit status.
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let (code, _, err) = fencegate(&["status", "--endpoints", &nobody]);
    assert_eq!(code, 69);
    assert!(err.contains("unavailable"), "{err}");
    // A node of the list that does not answer is skipped.
    let (code, out, err) = fencegate(&["status", "rack/9", "--json", "--endpoints", &format!("{nobody},{endpoints}")]);
    assert_eq!(code, 0, "{err}");
    let key: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&key["key"], &key["held"], &key["holder"], &key["token"]),
        (&"rack/9".into(), &true.into(), &"ops-1".into(), &lease.token().into()),
        "{out}"
    );
    let (code, out, err) = fencegate(&["status", "--json", "--endpoints", &endpoints]);
    assert_eq!(code, 0, "{err}");
    let cluster: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(cluster["leader"].is_u64() && cluster["term"].is_u64(), "{out}");
    assert_eq!(cluster["members"].as_array().map(Vec::len), Some(3), "{out}");
}

#[test]
fn the_demo_shows_the_stale_write_refused_with_the_sidecar_and_landing_without() {
    let dir = tempfile::tempdir().unwrap();
    let mermaid = dir.path().join("run.mmd");
    let (code, out, err) =
        fencegate(&["demo", "--ttl", "1s", "--pause", "1500ms", "--mermaid", mermaid.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("via Sidecar -> 409 stale_token"), "{out}");
    assert!(out.contains(r#"rack 42 is "drained-by-B""#), "{out}");
    assert!(out.contains(r#"rack 43 is "flashed-by-A""#), "{out}");
    let diagram = std::fs::read_to_string(&mermaid).unwrap();
    assert!(diagram.starts_with("sequenceDiagram") && diagram.contains("409 stale_token"), "{diagram}");
    let (code, _, err) = fencegate(&["demo", "--ttl", "2s", "--pause", "1s"]);
    assert_eq!(code, 1);
    assert!(err.contains("--pause must be longer"), "{err}");
}

/// The URLs `fencegate dev` prints in its banner.
#[derive(Debug, Default)]
struct Banner {
    lock_service: Vec<String>,
    inventory: String,
    sidecar: String,
    metrics: String,
    /// The node's console and the sidecar's.
    consoles: Vec<String>,
    /// The arguments of the demo on these components.
    demo: Vec<String>,
    /// The token of the stale-write snippet, and the error its comment says it gets.
    stale_token: Option<u64>,
    stale_answer: String,
}

impl Banner {
    /// Fill in from one banner line ("  sidecar        http://… (…)").
    fn read(&mut self, line: &str) {
        let line = line.trim_start();
        let urls = |rest: &str| -> Vec<String> {
            rest.split_whitespace().take_while(|w| w.starts_with("http://")).map(String::from).collect()
        };
        let first = |rest: &str| urls(rest).into_iter().next().unwrap_or_default();
        if let Some(rest) = line.strip_prefix("curl -s -X PUT -H 'X-Fence-Token: ") {
            self.stale_token = rest.split('\'').next().and_then(|t| t.parse().ok());
        } else if let Some(rest) = line.strip_prefix("# 409 {\"error\":\"").filter(|_| self.stale_token.is_some()) {
            self.stale_answer = rest.split('"').next().unwrap_or_default().to_string();
        } else if let Some(rest) = line.strip_prefix("lock service ") {
            self.lock_service = urls(rest);
        } else if let Some(rest) = line.strip_prefix("inventory API ") {
            self.inventory = first(rest);
        } else if let Some(rest) = line.strip_prefix("sidecar ") {
            self.sidecar = first(rest);
        } else if let Some(rest) = line.strip_prefix("metrics ") {
            self.metrics = first(rest);
        } else if let Some(rest) = line.strip_prefix("node console ").or(line.strip_prefix("sidecar's ")) {
            self.consoles.push(first(rest));
        } else if let Some((_, args)) = line.split_once(" demo --endpoints ") {
            self.demo = ["demo", "--endpoints"].into_iter().chain(args.split_whitespace()).map(String::from).collect();
        }
    }

    fn complete(&self) -> bool {
        self.lock_service.len() == 3
            && self.consoles.len() == 2
            && !self.demo.is_empty()
            && ![&self.inventory, &self.sidecar, &self.metrics, &self.stale_answer].iter().any(|u| u.is_empty())
    }
}

/// `fencegate dev --free-ports`, on the ports its banner names: acquire,
/// write through the sidecar, read the inventory's log, open the consoles,
/// run the banner's demo on its components and find it there, stop. Its terminal
/// shows the banner and one line per change: no start-up INFO lines, each
/// grant once (not once per node), nothing about the watch on Ctrl-C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_smoke() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr");
    let mut child = bin!()
        .tokio_command(&["dev", "--free-ports", "--data"])
        .arg(dir.path().join("data"))
        .env_remove("FENCEGATE_LOG")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        let mut running = false;
        let mut replayed = false;
        let mut banner = Banner::default();
        // The banner is a dozen lines; a bound in case it never completes.
        for _ in 0..100 {
            let Some(line) = lines.next_line().await.unwrap() else { break };
            running |= line.contains("fencegate dev is running");
            // The banner's own check: a write sent twice with one key.
            replayed |= line.contains("then 200 replayed, the same answer; the inventory applied it 1 time");
            banner.read(&line);
            if running && replayed && banner.complete() {
                return Some(banner);
            }
        }
        None
    });
    let banner = started.await.expect("no banner within 30 s").expect("dev did not start, or printed no addresses");
    for url in banner.lock_service.iter().chain([&banner.inventory, &banner.sidecar, &banner.metrics]) {
        assert!(url.starts_with("http://127.0.0.1:"), "{banner:?}");
    }
    // The stale-write snippet before anything was granted on rack/42: what the banner says then.
    let stale = banner.stale_token.unwrap();
    let (status, body) =
        http::send(http::fenced_put(format!("{}/racks/42", banner.sidecar), stale), Duration::from_secs(5)).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("unknown_token")), "{body}");
    let client = fencegate_client::Client::new(banner.lock_service.clone()).unwrap();
    let lease =
        client.acquire("rack/42", fencegate_client::AcquireOptions::new(Duration::from_secs(10))).await.unwrap();
    let lease_token = lease.token();
    let put = http::fenced_put(format!("{}/racks/42", banner.sidecar), lease_token);
    assert_eq!(http::send(put, Duration::from_secs(5)).await.0, 200);
    let writes = http::get_json(&format!("{}/writes", banner.inventory)).await.unwrap();
    let ours = writes.as_array().unwrap().iter().find(|w| w["rack"] == "42").expect("the write to rack 42");
    assert_eq!(ours["state"], "drained");
    assert_eq!(ours["token"], lease.token().to_string());
    assert!(http::get_text(&banner.metrics).await.contains("fencegate_sidecar_requests_total"), "{banner:?}");
    lease.release().await.unwrap();
    // The banner's stale write, after its first command (done above): the
    // answer its comment promises, and the inventory never sees it.
    let (status, body) =
        http::send(http::fenced_put(format!("{}/racks/42", banner.sidecar), stale), Duration::from_secs(5)).await;
    assert_eq!((status, body["error"].as_str()), (409, Some(banner.stale_answer.as_str())), "{body}");
    assert_eq!(banner.stale_answer, "stale_token");

    // The consoles it names answer, under their policy.
    for url in &banner.consoles {
        let page = fencegate_client::http::HttpClient::new(1 << 20)
            .call(hyper::Method::GET, url, None, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(page.status == 200 && page.headers.contains_key("content-security-policy"), "{url}");
    }
    // The demo beside it, as the banner says: it shows up there.
    let demo = bin!().tokio_command(&banner.demo.iter().map(String::as_str).collect::<Vec<_>>()).output();
    let demo = tokio::time::timeout(Duration::from_secs(60), demo).await.expect("the demo within 60 s").unwrap();
    let said = String::from_utf8_lossy(&demo.stdout);
    assert_eq!(demo.status.code(), Some(0), "{said}\n{}", String::from_utf8_lossy(&demo.stderr));
    let admin = std::fs::read_to_string(dir.path().join("data/sidecar/admin-token")).unwrap();
    let state = format!("{}/state", banner.consoles[1]);
    let mut req = http::request("GET", &state, None, &[("authorization", &format!("Bearer {}", admin.trim()))], "");
    req.headers_mut().remove("x-fence-token");
    let (status, state) = http::send(req, Duration::from_secs(5)).await;
    assert_eq!(status, 200, "{state}");
    let refused =
        state["timeline"].as_array().unwrap().iter().find(|e| e["event"] == "refused" && e["presented"] != stale);
    let refused = refused.unwrap_or_else(|| panic!("the demo's refusal in the sidecar's console: {state}"));
    assert!(said.contains(&format!("(token {})", refused["presented"])), "A's token: {refused}\n{said}");
    assert_eq!(refused["key"], "rack/42");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), nix::sys::signal::Signal::SIGINT)
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    let said = std::fs::read_to_string(&stderr).unwrap();
    let grant = format!(r#"event="grant" identity="anonymous" key="rack/42" token={}"#, lease_token);
    assert_eq!(said.lines().filter(|l| l.contains(&grant)).count(), 1, "the grant once:\n{said}");
    let noise = |l: &&str| l.contains(" INFO ") && !l.contains("fencegate::audit");
    assert_eq!(said.lines().filter(noise).count(), 0, "INFO lines besides the changes:\n{said}");
    assert!(!said.contains("reconnecting"), "the watch on Ctrl-C:\n{said}");
}

/// `fencegate args…` with its stdout a pipe whose reader went away before
/// anything was written (`… | head -0`): (exit status, stderr).
fn into_closed_pipe(args: &[&str]) -> (Option<i32>, String) {
    use std::process::{Command, Stdio};
    // The reader closes at once; fencegate starts a moment later.
    let mut child = Command::new("sh")
        .args(["-c", r#"sleep 0.3; exec "$0" "$@""#, bin!().path().to_str().unwrap()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Every command that prints ends quietly with 141 (128 + SIGPIPE, as a
/// shell reports coreutils there) when its reader is gone, instead of
/// Rust's panic on a closed stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_into_a_closed_pipe_ends_quietly_with_141() {
    let c = Cluster::start(&bin!(), 1, "").await;
    let endpoints = c.urls().join(",");
    let backup = c.dir().join("backup.fgsnap");
    let (code, _, err) = fencegate(&["snapshot", "save", backup.to_str().unwrap(), "--endpoints", &endpoints]);
    assert_eq!(code, 0, "{err}");
    let config = c.config_path(1);
    for args in [
        vec!["snapshot", "inspect", backup.to_str().unwrap()],
        vec!["status", "--endpoints", &endpoints],
        vec!["status", "rack/1", "--json", "--endpoints", &endpoints],
        vec!["member", "--endpoints", &endpoints, "list"],
        vec!["check-config", config.to_str().unwrap()],
        vec!["token", "new", "ops"],
    ] {
        let (code, err) = into_closed_pipe(&args);
        assert_eq!(code, Some(141), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
    }
}
