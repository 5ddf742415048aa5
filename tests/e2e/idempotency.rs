//! Idempotency keys at the sidecar (I1), on a real `fencegate sidecar` and
//! the recording upstream: a write retried with its key is applied once.
//! The rack route is `observed` (a floor per key, no lock service needed):
//! what is shown here is the key store, not the fence; but where holders
//! take the lock from real lock nodes (a record is its holder's).

use std::time::Duration;

use fencegate_client::AcquireOptions;
use fencegate_testkit::routes::{everything_else, table, Route};
use fencegate_testkit::upstream::{ANSWER_HEADER, DELAY_HEADER};
use fencegate_testkit::{bin, Cluster, Sidecar, Upstream};
use serde_json::Value;

const KEY: &str = "idempotency-key";

fn routes(idempotency: &str) -> String {
    table(&[
        Route::fenced("rack-writes", "/racks/{rack}", "rack/{rack}", "{ mode: observed }")
            .methods(&["PUT", "POST", "PATCH", "DELETE"])
            .timeout("900ms")
            .with("idempotency", idempotency),
        everything_else(),
    ])
}

async fn sidecar(dir: &std::path::Path, up: &Upstream, idempotency: &str, limits: &str) -> Sidecar {
    Sidecar::start(&bin!(), dir.join("sc"), &up.url(), &[], &format!("{limits}{}", routes(idempotency))).await
}

fn error_of(v: &Value) -> &str {
    v["error"].as_str().unwrap_or("")
}

/// How many writes to `path` took effect upstream.
fn applied(up: &Upstream, path: &str) -> usize {
    up.seen().iter().filter(|s| s.path == path).count()
}

/// A raw `PUT` with a key, a token, more header lines (each ending in
/// `\r\n`) and a body; the whole answer as text.
async fn put_raw(port: u16, path: &str, token: u64, key: &str, more: &str, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let req = format!(
        "PUT {path} HTTP/1.1\r\nHost: x\r\nx-fence-token: {token}\r\n{KEY}: {key}\r\n{more}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut out)).await.unwrap().unwrap();
    out
}

/// The answer without the headers that change on every answer (`date`)
/// and the replay mark.
fn stable(answer: &str) -> String {
    answer
        .lines()
        .filter(|l| {
            !l.to_ascii_lowercase().starts_with("date:") && !l.to_ascii_lowercase().starts_with("idempotent-replayed")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_client_timeout_is_applied_once_and_replayed_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let sc = sidecar(dir.path(), &up, "{ retention: 1h }", "").await;
    // The first attempt: the client gives up after 300 ms; the upstream
    // takes 800 ms and applies it anyway.
    let first = fencegate_testkit::http::request(
        "PUT",
        &format!("{}/racks/1", sc.url()),
        Some(5),
        &[(KEY, "drain-1"), (DELAY_HEADER, "800")],
        r#"{"state":"drained"}"#,
    );
    assert!(fencegate_testkit::http::try_send(first, Duration::from_millis(300)).await.is_err(), "it timed out");
    // A retry while it is in flight: refused, not forwarded.
    let (status, v) = sc
        .send_body("PUT", "/racks/1", Some(5), &[(KEY, "drain-1"), (DELAY_HEADER, "800")], r#"{"state":"drained"}"#)
        .await;
    assert_eq!((status, error_of(&v)), (409, "idempotency_in_flight"), "{v}");
    up.wait_for_applied(1, Duration::from_secs(5)).await;
    // Once it is answered (the record is in flight until the upstream's
    // answer is stored): the stored answer, and nothing new upstream.
    let (status, v) =
        fencegate_testkit::wait::until_ok("the first attempt's answer stored", Duration::from_secs(5), || async {
            let retry = [(KEY, "drain-1"), (DELAY_HEADER, "800")];
            let (status, v) = sc.send_body("PUT", "/racks/1", Some(5), &retry, r#"{"state":"drained"}"#).await;
            match (status, error_of(&v)) {
                (409, "idempotency_in_flight") => Err("still in flight"),
                _ => Ok((status, v)),
            }
        })
        .await;
    assert_eq!((status, &v["applied"]), (200, &Value::from(0)), "the first attempt's answer: {v}");
    assert_eq!(applied(&up, "/racks/1"), 1);
    // Byte for byte (but the date), marked as a replay.
    let a = put_raw(sc.port, "/racks/2", 5, "\"k2\"", "", "{}").await;
    let b = put_raw(sc.port, "/racks/2", 5, "k2", "", "{}").await;
    assert!(!a.contains("idempotent-replayed") && b.contains("idempotent-replayed: true"), "{a}\n---\n{b}");
    assert_eq!(stable(&a), stable(&b));
    assert_eq!(applied(&up, "/racks/2"), 1);
    let m = sc.metrics().await;
    for line in [
        r#"fencegate_sidecar_idempotency_total{result="stored",route="rack-writes"} 2"#,
        r#"fencegate_sidecar_idempotency_total{result="replayed",route="rack-writes"} 2"#,
        r#"fencegate_sidecar_idempotency_total{result="in_flight",route="rack-writes"} 1"#,
    ] {
        assert!(m.contains(line), "{line} in\n{m}");
    }
    // An upstream with more to say: repeated and varied headers, and a
    // marker of its own, which the sidecar drops from both answers.
    let more: String = ["x-a: 1", "x-b: two", "x-a: 3", "idempotent-replayed: forged", "etag: \"v1\""]
        .iter()
        .map(|h| format!("{ANSWER_HEADER}: {h}\r\n"))
        .collect();
    let a = put_raw(sc.port, "/racks/3", 5, "k3", &more, "{}").await;
    let b = put_raw(sc.port, "/racks/3", 5, "k3", &more, "{}").await;
    assert!(a.contains("x-a: 1\r\nx-a: 3\r\n") && a.contains("x-b: two") && a.contains("etag: \"v1\""), "{a}");
    assert!(!a.contains("idempotent-replayed") && !b.contains("forged"), "{a}\n---\n{b}");
    assert!(b.contains("idempotent-replayed: true"), "{b}");
    assert_eq!(stable(&a), stable(&b));
    assert_eq!(applied(&up, "/racks/3"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_is_one_request_whatever_else_arrives_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let sc = sidecar(dir.path(), &up, "{ required: true }", "").await;
    // Two at once: one is forwarded, the other refused in flight.
    let slow = [(KEY, "twin"), (DELAY_HEADER, "300")];
    let (a, b) = tokio::join!(
        sc.send_body("PUT", "/racks/1", Some(5), &slow, "{}"),
        sc.send_body("PUT", "/racks/1", Some(5), &slow, "{}")
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{a:?} {b:?}");
    // The same key with another body, path or method: 422, nothing forwarded.
    for (method, path, body) in
        [("PUT", "/racks/1", "{\"other\":1}"), ("POST", "/racks/1", "{}"), ("PUT", "/racks/1?x", "{}")]
    {
        let (status, v) = sc.send_body(method, path, Some(5), &[(KEY, "twin")], body).await;
        assert_eq!((status, error_of(&v)), (422, "idempotency_key_reused"), "{method} {path}: {v}");
    }
    // A key is scoped by its lock key: the same key on another rack is new.
    assert_eq!(sc.send_body("PUT", "/racks/9", Some(5), &[(KEY, "twin")], "{}").await.0, 200);
    // A stale token is refused whatever its key: not a replay.
    assert_eq!(sc.send_body("PUT", "/racks/1", Some(7), &[(KEY, "newer")], "{}").await.0, 200);
    let (status, v) = sc.send_body("PUT", "/racks/1", Some(5), &[(KEY, "twin")], "{}").await;
    assert_eq!((status, error_of(&v)), (409, "stale_token"), "{v}");
    // Required: no key, 428; a malformed one, 400.
    let (status, v) = sc.send_body("PUT", "/racks/1", Some(7), &[], "{}").await;
    assert_eq!((status, error_of(&v)), (428, "missing_idempotency_key"), "{v}");
    for bad in ["a b", "\"\"", &"k".repeat(256)] {
        let (status, v) = sc.send_body("PUT", "/racks/1", Some(7), &[(KEY, bad)], "{}").await;
        assert_eq!((status, error_of(&v)), (400, "malformed_idempotency_key"), "{bad:?}: {v}");
    }
    assert_eq!(applied(&up, "/racks/1"), 2, "the twin once, and `newer`");
}

/// kill -9 between forwarding and storing the answer: the record stays
/// pending on disk, so after the restart the outcome is unknown, and a retry
/// is refused instead of applied a second time. An operator resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_flight_leaves_an_unknown_outcome_that_is_never_retried_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut sc = sidecar(dir.path(), &up, "{}", "").await;
    // A replay that must survive the restart too.
    assert_eq!(sc.send_body("PUT", "/racks/2", Some(5), &[(KEY, "kept")], "{}").await.0, 200);
    let url = format!("{}/racks/1", sc.url());
    let first = tokio::spawn(async move {
        let req =
            fencegate_testkit::http::request("PUT", &url, Some(5), &[(KEY, "crash"), (DELAY_HEADER, "700")], "{}");
        fencegate_testkit::http::try_send(req, Duration::from_secs(10)).await
    });
    up.wait_for_arrival(Duration::from_secs(5), |s| s.path == "/racks/1").await;
    sc.restart().await;
    assert!(first.await.unwrap().is_err(), "the sidecar died under it");
    up.wait_for_applied(2, Duration::from_secs(5)).await;
    let (status, v) = sc.send_body("PUT", "/racks/1", Some(5), &[(KEY, "crash")], "{}").await;
    assert_eq!((status, error_of(&v)), (409, "outcome_unknown"), "{v}");
    assert!(v["message"].as_str().unwrap().contains("stopped while the request was in flight"), "{v}");
    assert_eq!(applied(&up, "/racks/1"), 1, "applied once, not retried");
    let (status, v) = sc.send_body("PUT", "/racks/2", Some(5), &[(KEY, "kept")], "{}").await;
    assert_eq!((status, v["applied"].as_u64()), (200, Some(0)), "replayed after the restart: {v}");
    assert_eq!(applied(&up, "/racks/2"), 1);
    // The operator: it was applied, answer 200. Admin calls need the token
    // the sidecar made in its state_dir; without it, or from a browser, no.
    let admin = format!("http://127.0.0.1:{}", sc.metrics_port);
    let token = dir.path().join("sc/state/admin-token");
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "fga_not-it\n").unwrap();
    let record = ["--lock-key", "rack/1", "--fence-token", "5", "--key", "crash"];
    let cli = |token: &std::path::Path, verb: &str, more: &[&str]| {
        let mut args = vec!["idempotency", verb, "--sidecar", &admin, "--token-file", token.to_str().unwrap()];
        args.extend_from_slice(&record);
        args.extend_from_slice(more);
        bin!().run(&args, Duration::from_secs(10))
    };
    let out = cli(&wrong, "resolve", &["--not-applied"]);
    assert!(out.code == 1 && out.stderr.contains("401"), "{}{}", out.stdout, out.stderr);
    assert!(!out.stderr.contains('{'), "a sentence, not JSON: {}", out.stderr);
    let body = r#"{"lock_key":"rack/1","token":5,"key":"crash"}"#;
    let from_page = [("origin", "http://evil.example"), ("authorization", "Bearer x")];
    let req =
        fencegate_testkit::http::request("POST", &format!("{admin}/admin/idempotency/show"), None, &from_page, body);
    assert_eq!(fencegate_testkit::http::send(req, Duration::from_secs(5)).await.0, 403);
    let out = cli(&token, "show", &[]);
    assert!(out.code == 0 && out.stdout.contains(r#""state":"unknown""#), "{}{}", out.stdout, out.stderr);
    // The console lists it, with the command that settles it.
    let bearer = format!("Bearer {}", std::fs::read_to_string(&token).unwrap().trim());
    let state = fencegate_testkit::http::request(
        "GET",
        &format!("{admin}/console/state"),
        None,
        &[("authorization", &bearer)],
        "",
    );
    let (status, state) = fencegate_testkit::http::send(state, Duration::from_secs(5)).await;
    let open = &state["idempotency_open"][0];
    assert_eq!(
        (status, &open["key"], &open["state"]),
        (200, &Value::from("crash"), &Value::from("unknown")),
        "{state}"
    );
    let resolve = open["resolve"].as_str().unwrap_or("");
    assert!(resolve.contains("--lock-key rack/1 --fence-token 5 --key crash"), "{resolve}");
    // The record is its holder's: under another token there is none.
    let other = ["idempotency", "show", "--sidecar", &admin, "--token-file", token.to_str().unwrap()];
    let other = [&other[..], &["--lock-key", "rack/1", "--fence-token", "6", "--key", "crash"]].concat();
    let out = bin!().run(&other, Duration::from_secs(10));
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (
            1,
            "",
            "fencegate idempotency: no record of key \"crash\" under rack/1 with fence token 6: never sent through \
             this sidecar, past its retention, or sent by another holder (another token or identity)\n"
        )
    );
    // The sidecar's own answer, for a program, when asked.
    let out = bin!().run(&[&other[..], &["--json"]].concat(), Duration::from_secs(10));
    assert_eq!((out.code, out.stdout.as_str()), (1, "{\"error\":\"no record for this key\"}\n"), "{}", out.stderr);
    let out = cli(&token, "resolve", &["--applied", "200"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let out = cli(&token, "resolve", &["--not-applied"]);
    assert!(out.code == 1 && out.stderr.contains("409"), "only an unknown outcome: {}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("the sidecar refused (409 Conflict): the record is"), "{}", out.stderr);
    let (status, _) = sc.send_body("PUT", "/racks/1", Some(5), &[(KEY, "crash")], "{}").await;
    assert_eq!(status, 200, "the operator's answer");
    assert_eq!(applied(&up, "/racks/1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_expire_after_retention() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    // Long enough for the two requests on a loaded machine.
    let sc = sidecar(dir.path(), &up, "{ retention: 3s }", "").await;
    assert_eq!(sc.send_body("PUT", "/racks/1", Some(5), &[(KEY, "once")], "{}").await.0, 200);
    assert_eq!(sc.send_body("PUT", "/racks/1", Some(5), &[(KEY, "once")], "{}").await.0, 200);
    assert_eq!(applied(&up, "/racks/1"), 1, "replayed within retention");
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert_eq!(sc.send_body("PUT", "/racks/1", Some(5), &[(KEY, "once")], "{}").await.0, 200);
    assert_eq!(applied(&up, "/racks/1"), 2, "past retention the key is new");
}

/// A retention no run of this test outlasts: a record that expired while
/// the store filled (a slow machine) would make room and be forwarded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_refuses_new_keys_and_evicts_none() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    // Each pending record holds room for a 1 KiB answer and its headers.
    // One lock key may take the whole store here: this is the store's bound.
    let idempotency = "{ retention: 1h, max_response: 1KiB, per_lock_key: 64KiB }";
    let sc = sidecar(dir.path(), &up, idempotency, "limits: { idempotency_store: 64KiB }\n").await;
    // Fill the store: new keys get 503, none of the live ones is evicted.
    let mut full = None;
    for i in 0..2000 {
        let (status, v) = sc.send_body("PUT", "/racks/2", Some(5), &[(KEY, &format!("fill-{i}"))], "{}").await;
        if status != 200 {
            assert_eq!((status, error_of(&v)), (503, "idempotency_store_full"), "{v}");
            full = Some(i);
            break;
        }
    }
    let full = full.expect("64 KiB of records filled");
    assert!(full >= 8, "only {full} records fit in 64 KiB");
    let (status, _) = sc.send_body("PUT", "/racks/2", Some(5), &[(KEY, "fill-0")], "{}").await;
    assert_eq!(status, 200, "a live record is still replayed");
    assert_eq!(applied(&up, "/racks/2"), full, "each once");
}

/// Issue 34: A (token `a`) writes with `op-1` and gets an answer that sets
/// a cookie; C writes; B, the holder now (token `b`), sends A's request with
/// A's key. B's write is applied (the upstream sees it, with B's token) and
/// B gets its own answer: not A's, not A's cookie, not a replay. A's own
/// retry is still replayed. On real lock nodes, through a `strict` route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_holders_request_with_an_earlier_holders_key_is_its_own() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let table = table(&[
        Route::fenced("rack-writes", "/racks/{rack}", "rack/{rack}", "{ mode: strict, consistency: cached }")
            .methods(&["PUT"])
            .with("idempotency", "{ retention: 1h }"),
        everything_else(),
    ]);
    let sc = c.sidecar("sc", &up.url(), &table).await;
    let client = c.client();
    let lease = |who: &'static str| {
        let client = client.clone();
        async move {
            let opts = AcquireOptions::new(Duration::from_secs(30)).holder(who);
            client.acquire("rack/7", opts).await.unwrap()
        }
    };
    let body = r#"{"state":"drained"}"#;
    let cookie = format!("{ANSWER_HEADER}: set-cookie: session=A\r\n");
    let a = lease("A").await;
    let first = put_raw(sc.port, "/racks/7", a.token(), "op-1", &cookie, body).await;
    assert!(first.starts_with("HTTP/1.1 200") && first.contains("set-cookie: session=A"), "{first}");
    let retry = put_raw(sc.port, "/racks/7", a.token(), "op-1", "", body).await;
    assert!(retry.contains("idempotent-replayed: true") && retry.contains("session=A"), "A's retry: {retry}");
    let token_a = a.token();
    a.release().await.unwrap();
    let c_lease = lease("C").await;
    assert_eq!(sc.send_body("PUT", "/racks/7", Some(c_lease.token()), &[], r#"{"state":"C"}"#).await.0, 200);
    let token_c = c_lease.token();
    c_lease.release().await.unwrap();
    let b = lease("B").await;
    // The same method, path, type and body as A's: only the holder differs.
    let answer = put_raw(sc.port, "/racks/7", b.token(), "op-1", "", body).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.contains("idempotent-replayed"), "B got a replay: {answer}");
    assert!(!answer.contains("session=A"), "B got A's cookie: {answer}");
    assert!(answer.ends_with(r#"{"applied":2}"#), "B's own answer, not A's (applied 0): {answer}");
    assert_eq!(up.tokens("/racks/7"), vec![Some(token_a), Some(token_c), Some(b.token())], "B's write applied");
    // B's retry is B's replay; A's key under B's token is B's record.
    let again = put_raw(sc.port, "/racks/7", b.token(), "op-1", "", body).await;
    assert!(again.contains("idempotent-replayed: true") && again.ends_with(r#"{"applied":2}"#), "{again}");
    assert_eq!(applied(&up, "/racks/7"), 3);
}

/// One lock key's records take at most its quota (`per_lock_key`): past
/// it, its new keys get 429 `idempotency_quota` naming the quota, whoever
/// holds it, while another lock key is still served; a retry of a kept
/// key is still replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_past_its_quota_is_refused_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let sc = sidecar(dir.path(), &up, "{ retention: 1h, max_response: 1KiB, per_lock_key: 16KiB }", "").await;
    let mut refused = None;
    for i in 0..2000 {
        let (status, v) = sc.send_body("PUT", "/racks/2", Some(5), &[(KEY, &format!("fill-{i}"))], "{}").await;
        if status != 200 {
            assert_eq!((status, error_of(&v)), (429, "idempotency_quota"), "{v}");
            let message = v["message"].as_str().unwrap();
            assert!(
                message.contains("rack/2") && message.contains("16384 bytes") && message.contains("per_lock_key"),
                "{v}"
            );
            refused = Some(i);
            break;
        }
    }
    let taken = refused.expect("the quota filled");
    assert!(taken >= 3, "only {taken} records in 16 KiB");
    // A kept key is still replayed; another lock key is served.
    let (status, v) = sc.send_body("PUT", "/racks/2", Some(5), &[(KEY, "fill-0")], "{}").await;
    assert_eq!((status, v["applied"].as_u64()), (200, Some(0)), "{v}");
    assert_eq!(sc.send_body("PUT", "/racks/3", Some(5), &[(KEY, "fill-0")], "{}").await.0, 200);
    // The same lock key under a later holder: the same quota.
    let (status, v) = sc.send_body("PUT", "/racks/2", Some(6), &[(KEY, "later")], "{}").await;
    assert_eq!((status, error_of(&v)), (429, "idempotency_quota"), "{v}");
    assert_eq!(applied(&up, "/racks/2"), taken, "each once; none refused was sent");
    assert_eq!(applied(&up, "/racks/3"), 1);
    let m = sc.metrics().await;
    for line in [
        r#"fencegate_sidecar_rejections_total{reason="idempotency_quota",route="rack-writes"} 2"#,
        r#"fencegate_sidecar_idempotency_total{result="quota",route="rack-writes"} 2"#,
    ] {
        assert!(m.contains(line), "{line} in\n{m}");
    }
}
