//! Golden tests of what `fencegate` tells a person when something is wrong:
//! the exact stderr and exit status of the real binary (ports, tokens and
//! temporary paths normalised), so that Rust debug formatting (`Some(…)`,
//! `0ns`, `BadRequest { … }`) and doubled messages cannot come back.

use std::path::Path;
use std::time::Duration;

use fencegate_client::AcquireOptions;
use fencegate_testkit::{bin, free_port, Cluster};

/// `fencegate args…` with `env` (FENCEGATE_* variables of the test's own
/// environment removed): (exit status, stderr).
async fn fencegate(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = bin!().tokio_command(args);
    for (var, _) in std::env::vars().filter(|(v, _)| v.starts_with("FENCEGATE_")) {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied()).stdin(std::process::Stdio::null());
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.expect("exits within 60 s").unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `text` with `dir` written as `DIR` and every `127.0.0.1:<port>` as `127.0.0.1:PORT`.
fn normalised(text: &str, dir: Option<&Path>) -> String {
    let text = match dir {
        Some(d) => text.replace(&*d.to_string_lossy(), "DIR"),
        None => text.to_string(),
    };
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("127.0.0.1:") {
        out.push_str(&rest[..i + "127.0.0.1:".len()]);
        rest = &rest[i + "127.0.0.1:".len()..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        out.push_str(if digits > 0 { "PORT" } else { "" });
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// What no message a person reads may contain.
fn assert_readable(stderr: &str) {
    for debug in ["Some(", "None", "0ns", "{ ", "Error {", "Os {", "\\\""] {
        assert!(!stderr.contains(debug), "debug formatting {debug:?} in: {stderr}");
    }
    assert!(!stderr.contains('\u{1b}'), "ANSI escape codes in a pipe: {stderr:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_and_unavailable_are_told_apart_in_words_and_in_exit_status() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let holder = AcquireOptions::new(Duration::from_secs(30)).holder("vm:22858");
    let lease = c.client().acquire("rack/8", holder).await.unwrap();
    let endpoints = c.urls().join(",");
    let env = [("FENCEGATE_ENDPOINTS", endpoints.as_str())];

    let (code, stderr) = fencegate(&["lock", "rack/8", "--", "true"], &env).await;
    let token = lease.token();
    assert_eq!(
        (code, stderr.as_str()),
        (
            75,
            format!("fencegate lock: rack/8 is held by vm:22858 (token {token}); not obtained (--wait 0s)\n").as_str()
        )
    );
    assert_readable(&stderr);
    let (code, stderr) = fencegate(&["lock", "rack/8", "--wait", "1s 500ms", "--", "true"], &env).await;
    assert_eq!(code, 75);
    assert!(stderr.ends_with("; not obtained (--wait 1s 500ms)\n"), "{stderr}");

    // Quiet on success (cron mails what a job prints): nothing on stderr.
    let (code, stderr) = fencegate(&["lock", "rack/9", "--", "true"], &env).await;
    assert_eq!((code, stderr.as_str()), (0, ""));
    // Log lines when asked: no colour into a pipe; one JSON object per line with --log-format json.
    for (args, env) in [
        (&["lock", "-v", "rack/9", "--", "true"][..], &env[..]),
        (&["--verbose", "lock", "rack/9", "--", "true"], &env),
        (&["lock", "rack/9", "--", "true"], &[env[0], ("FENCEGATE_LOG", "info")]),
    ] {
        let (code, stderr) = fencegate(args, env).await;
        assert!(code == 0 && stderr.contains("INFO") && stderr.contains("lock acquired"), "{args:?}: {stderr}");
        assert_readable(&stderr);
    }
    let (code, stderr) = fencegate(&["--log-format", "json", "lock", "-v", "rack/9", "--", "true"], &env).await;
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<serde_json::Value> =
        stderr.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    let acquired = lines
        .iter()
        .find(|l| l["fields"]["message"] == "lock acquired; running true")
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!((&acquired["level"], &acquired["fields"]["key"]), (&"INFO".into(), &"rack/9".into()), "{stderr}");

    // Nothing listening: 69, and the message says the service, not the key,
    // is the problem, names every endpoint tried, and what to check.
    let [a, b, c] = fencegate_testkit::free_ports::<3>();
    let nobody = format!("http://127.0.0.1:{a},http://127.0.0.1:{b},http://127.0.0.1:{c}");
    let env = [("FENCEGATE_ENDPOINTS", nobody.as_str())];
    let (code, stderr) = fencegate(&["lock", "rack/8", "--", "true"], &env).await;
    let refused = "failed: client error (Connect): tcp connect error: Connection refused (os error 111)";
    assert_eq!(
        (code, normalised(&stderr, None).as_str()),
        (
            69,
            format!(
                "fencegate: rack/8 not obtained: lock service unavailable: no node answered; tried \
                 http://127.0.0.1:PORT, http://127.0.0.1:PORT, http://127.0.0.1:PORT (last error: request to \
                 http://127.0.0.1:PORT/v1/locks/rack/8 {refused}); is a fencegate node listening there?\n"
            )
            .as_str()
        )
    );
    for port in [a, b, c] {
        assert!(stderr.contains(&format!("http://127.0.0.1:{port},")) || stderr.contains(&format!("{port} (")));
    }
    assert_readable(&stderr);
    let (code, stderr) = fencegate(&["status"], &env).await;
    assert_eq!(code, 69, "{stderr}");
    assert!(stderr.starts_with("fencegate: lock service unavailable: no node answered; tried "), "{stderr}");
    assert!(stderr.ends_with("; is a fencegate node listening there?\n"), "{stderr}");
    assert_readable(&stderr);
    lease.release().await.unwrap();
}

/// An endpoint that answers, but is another service (here one answering
/// 404 `{"error":"not found"}`, as the demo's inventory API does), is named
/// as not a lock node, not reported as a refusal with an empty reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_service_at_the_endpoint_is_named_as_not_a_lock_node() {
    use std::io::{Read, Write};
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", other.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in other.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let body = r#"{"error":"not found"}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let env = [("FENCEGATE_ENDPOINTS", url.as_str())];
    let not_a_node = "answered 404 Not Found but is not a fencegate lock node (no fencegate-cluster header, no Lock \
                      API error): is the endpoint a node's `listen` address?\n";
    let (code, stderr) = fencegate(&["status"], &env).await;
    assert_eq!(
        (code, normalised(&stderr, None).as_str()),
        (1, format!("fencegate: http://127.0.0.1:PORT/v1/cluster {not_a_node}").as_str())
    );
    let (code, stderr) = fencegate(&["lock", "rack/1", "--", "true"], &env).await;
    assert_eq!(
        (code, normalised(&stderr, None).as_str()),
        (1, format!("fencegate: rack/1 not obtained: http://127.0.0.1:PORT/v1/locks/rack/1 {not_a_node}").as_str())
    );
    assert_readable(&stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_error_is_printed_once_naming_the_file_the_field_and_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let node = |text: &str| {
        let path = dir.path().join("node.yaml");
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let valid = "id: 1\nlisten: 127.0.0.1:7401\npeer_listen: 127.0.0.1:7501\ndata_dir: ./data\npeers: { 1: http://127.0.0.1:7501 }\n";
    let cases = [
        (
            valid.replace("id: 1", "id: one"),
            "fencegate: DIR/node.yaml: id: invalid type: string \"one\", expected u64 at line 1 column 5\n",
        ),
        (format!("{valid}colour: blue\n"), "fencegate: DIR/node.yaml: unknown field `colour`, expected one of"),
        (valid.replace("id: 1", "id: 0"), "fencegate: DIR/node.yaml: invalid `id`: "),
    ];
    for (text, expected) in cases {
        let path = node(&text);
        for command in [&["server", "--config", &path][..], &["check-config", &path][..]] {
            let (code, stderr) = fencegate(command, &[]).await;
            let shown = normalised(&stderr, Some(dir.path()));
            assert_eq!(code, 64, "{command:?}: {stderr}");
            assert!(shown.starts_with(expected), "{command:?}: {shown}\nexpected: {expected}");
            assert_eq!(shown.lines().count(), 1, "printed once: {shown}");
            assert_readable(&stderr);
        }
    }
    let (code, stderr) = fencegate(&["check-config", "/nonexistent/node.yaml"], &[]).await;
    assert_eq!(
        (code, stderr.as_str()),
        (64, "fencegate: cannot read /nonexistent/node.yaml: No such file or directory (os error 2)\n")
    );
}

/// A process whose port is taken says which one, exits 69, and leaves
/// nothing on disk: it binds every listener before it creates anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_exits_69_and_leaves_no_state() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let state = dir.path().join("state");
    let sidecar = dir.path().join("sidecar.yaml");
    std::fs::write(
        &sidecar,
        format!(
            "listen: 127.0.0.1:{port}\nupstream: http://127.0.0.1:{}\nstate_dir: {}\nroutes:\n  - {{ name: racks, path: '/racks/{{rack}}', lock_key: 'rack/{{rack}}', fence: {{ mode: observed }} }}\n",
            free_port(),
            state.display()
        ),
    )
    .unwrap();
    let (code, stderr) = fencegate(&["sidecar", "--config", &sidecar.to_string_lossy()], &[]).await;
    assert_eq!(
        (code, normalised(&stderr, None).as_str()),
        (69, "fencegate: cannot listen on 127.0.0.1:PORT (listen): Address already in use (os error 98)\n")
    );
    assert!(!state.exists(), "state_dir created before the listener was bound");
    // The files it names are checked before it binds: a bad one is 64, port taken or not.
    let text = std::fs::read_to_string(&sidecar).unwrap();
    std::fs::write(
        &sidecar,
        format!("{text}tls: {{ cert: {0}/missing.pem, key: {0}/missing.pem }}\n", dir.path().display()),
    )
    .unwrap();
    let (code, stderr) = fencegate(&["sidecar", "--config", &sidecar.to_string_lossy()], &[]).await;
    assert!(code == 64 && stderr.contains("`tls.cert`"), "{code}: {stderr}");
    assert!(!state.exists());

    let data = dir.path().join("data");
    let node = dir.path().join("node.yaml");
    let peer = free_port();
    std::fs::write(
        &node,
        format!(
            "id: 1\nlisten: 127.0.0.1:{port}\npeer_listen: 127.0.0.1:{peer}\ndata_dir: {}\npeers: {{ 1: http://127.0.0.1:{peer} }}\n",
            data.display()
        ),
    )
    .unwrap();
    let (code, stderr) = fencegate(&["server", "--config", &node.to_string_lossy()], &[]).await;
    assert_eq!(code, 69, "{stderr}");
    let expected =
        format!("fencegate: cannot listen on 127.0.0.1:{port} (listen): Address already in use (os error 98)\n");
    assert!(stderr.ends_with(&expected), "{stderr}");
    assert!(!data.exists(), "data_dir created before the listeners were bound");
    drop(taken);
}

/// A failure that repeats every few hundred milliseconds is logged once,
/// then once per 10 s: a sidecar whose lock service is down, a node whose
/// peers are not up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_failure_is_logged_once_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = dir.path().join("sidecar.yaml");
    std::fs::write(
        &sidecar,
        format!(
            "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:{}\nlock_service: {{ endpoints: [http://127.0.0.1:{}] }}\nstate_dir: {}\nroutes:\n  - {{ name: racks, path: '/racks/{{rack}}', lock_key: 'rack/{{rack}}' }}\n",
            free_port(),
            free_port(),
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let [listen, peer, two, three] = fencegate_testkit::free_ports::<4>();
    let node = dir.path().join("node.yaml");
    std::fs::write(
        &node,
        format!(
            "id: 1\nlisten: 127.0.0.1:{listen}\npeer_listen: 127.0.0.1:{peer}\ndata_dir: {}\npeers: {{ 1: http://127.0.0.1:{peer}, 2: http://127.0.0.1:{two}, 3: http://127.0.0.1:{three} }}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    for (config, repeated) in [("sidecar", "watch stream: "), ("server", "/raft/vote to node 2 failed")] {
        let path = if config == "sidecar" { &sidecar } else { &node };
        let child = bin!()
            .tokio_command(&[config, "--config"])
            .arg(path)
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Long enough for a dozen attempts (reconnects from 100 ms, elections every 150-300 ms).
        tokio::time::sleep(Duration::from_secs(3)).await;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id().unwrap() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output()).await.unwrap().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.matches(repeated).count(), 1, "{config}: {stderr}");
        assert!(!stderr.contains("openraft"), "{config}: {stderr}");
    }
}

/// What no lock service would accept is a usage error (2) said by the
/// parser, before any request: the node at --endpoints is never contacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_no_node_accepts_is_a_usage_error_before_any_request() {
    let node = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    node.set_nonblocking(true).unwrap();
    let endpoints = format!("http://{}", node.local_addr().unwrap());
    let env = [("FENCEGATE_ENDPOINTS", endpoints.as_str())];
    let more = "\n\nFor more information, try '--help'.\n";
    let cases: [(&[&str], String); 5] = [
        (
            &["lock", "rack/1", "--ttl", "0s", "--", "true"],
            format!(
                "error: invalid value '0s' for '--ttl <TTL>': a lease lasts at least 1ms (a cluster grants \
                 lease.min_ttl to lease.max_ttl, by default 500ms to 1h){more}"
            ),
        ),
        (
            &["lock", "rack/1", "--ttl", "500us", "--", "true"],
            format!(
                "error: invalid value '500us' for '--ttl <TTL>': a lease lasts at least 1ms (a cluster grants \
                 lease.min_ttl to lease.max_ttl, by default 500ms to 1h){more}"
            ),
        ),
        (
            &["lock", "rack/1", "--wait", "2h", "--", "true"],
            format!(
                "error: invalid value '2h' for '--wait <WAIT>': no lock service waits longer than 1h (a cluster's \
                 limit is its lease.max_wait, by default 5m){more}"
            ),
        ),
        (
            &["lock", "rack//1", "--", "true"],
            format!(
                "error: invalid value 'rack//1' for '<KEY>': key must be 1..=256 bytes of [A-Za-z0-9._:-] segments \
                 (not . or ..) separated by single '/', got \"rack//1\"{more}"
            ),
        ),
        (
            &["lock", "rack/1", "--holder", "", "--", "true"],
            format!(
                "error: invalid value '' for '--holder <HOLDER>': holder must be 1..=128 printable ASCII characters{more}"
            ),
        ),
    ];
    for (args, expected) in cases {
        let (code, stderr) = fencegate(args, &env).await;
        assert_eq!((code, stderr.as_str()), (2, expected.as_str()), "{args:?}");
        assert!(node.accept().is_err(), "{args:?}: the node was contacted");
    }
    // Inside every node's limits, the request is made (and here refused by nobody answering HTTP).
    let (code, _) = fencegate(&["lock", "rack/1", "--ttl", "1ms", "--", "true"], &env).await;
    assert_ne!(code, 2);
}
