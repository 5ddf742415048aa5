//! The sidecar without a lock cluster: what it refuses before the lock
//! service is consulted (tokens, paths, methods, framing, limits), and what
//! it does on routes that need no lock service (forwarding on `fence: off`
//! and `observed` routes). A real `fencegate sidecar` process and a
//! recording upstream.
//!
//! The refusal tests share one sidecar. Its strict route asks a lock service
//! that accepts connections and never answers: a request that got as far as
//! asking it could only end in 503, so every 4xx below was decided before.

use std::time::Duration;

use fencegate_testkit::http::{self, raw_tcp};
use fencegate_testkit::ports::BlackHole;
use fencegate_testkit::routes::{everything_else, rack_writes, table, Route};
use fencegate_testkit::upstream::{Recording, Seen};
use fencegate_testkit::{bin, free_port, Sidecar, Upstream};
use serde_json::Value;
use tokio::sync::OnceCell;

fn error_of(v: &Value) -> &str {
    v["error"].as_str().unwrap_or("")
}

/// Every request of a test carries `x-test: <its name>`, so that a test can
/// tell what of its own reached the shared upstream.
const TAG: &str = "x-test";

struct Shared {
    up: Upstream,
    sc: Sidecar,
    _lock_service: BlackHole,
}

impl Shared {
    /// What of `test`'s requests reached the upstream.
    fn arrivals_of(&self, test: &str) -> Vec<Seen> {
        self.up.arrivals().into_iter().filter(|a| a.headers.get(TAG).is_some_and(|v| v == test)).collect()
    }

    /// `method path` with an optional token and extra headers, tagged.
    async fn send(
        &self,
        test: &str,
        method: &str,
        path: &str,
        token: Option<u64>,
        extra: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut headers = vec![(TAG, test)];
        headers.extend_from_slice(extra);
        self.sc.send(method, path, token, &headers).await
    }
}

/// One sidecar (and its upstream, on a thread of its own) for every test of
/// this file: it lives as long as the test process, which kills it on exit.
async fn shared() -> &'static Shared {
    static SHARED: OnceCell<Shared> = OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sidecar-framing");
            let _ = std::fs::remove_dir_all(&dir);
            let lock_service = BlackHole::new();
            let up = Upstream::start_on_own_thread(Recording::All);
            let routes = table(&[
                rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT", "POST", "PATCH", "DELETE"]),
                Route::fenced("observed-writes", "/observed/{rack}", "rack/{rack}", "{ mode: observed }")
                    .methods(&["PUT"]),
                everything_else(),
            ]);
            let yaml = format!(
                "limits: {{ max_body: 1KiB, max_header_bytes: 8KiB, header_timeout: 1s, body_timeout: 1s }}\n{routes}"
            );
            let sc = Sidecar::start(&bin!(), dir, &up.url(), &[lock_service.url()], &yaml).await;
            Shared { up, sc, _lock_service: lock_service }
        })
        .await
}

/// The fenced routes of the shared sidecar: strict (lock service down) and observed.
const FENCED: [&str; 2] = ["/racks/1", "/observed/1"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_malformed_and_duplicated_tokens_never_reach_the_upstream() {
    let (s, me) = (shared().await, "tokens");
    for path in FENCED {
        let (status, v) = s.send(me, "PUT", path, None, &[]).await;
        assert_eq!((status, error_of(&v)), (428, "missing_token"), "{path}: {v}");
        // (Whitespace around a header value is not part of it in HTTP, so " 7"
        // is 7 to every parser; whitespace inside is refused.)
        for bad in ["", "abc", "-5", "+5", "18446744073709551616", "1,2", "1, 2", "7 8", "7\t8", "0x10", "1e3", "٣"] {
            let (status, v) = s.send(me, "PUT", path, None, &[("x-fence-token", bad)]).await;
            assert_eq!((status, error_of(&v)), (400, "malformed_token"), "{path} {bad:?}: {v}");
        }
        let (status, v) = s.send(me, "PUT", path, None, &[("x-fence-token", "7"), ("x-fence-token", "7")]).await;
        assert_eq!((status, error_of(&v)), (400, "malformed_token"), "{path}, two headers: {v}");
    }
    assert!(s.arrivals_of(me).is_empty(), "the upstream saw {:?}", s.arrivals_of(me));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_canonical_paths_are_refused() {
    let (s, me) = (shared().await, "paths");
    for path in ["//racks/1", "/racks/./1", "/racks/%31", "/racks/a%2Fb", "//observed/1", "/observed/%31"] {
        let (status, v) = s.send(me, "PUT", path, Some(5), &[]).await;
        assert_eq!(status, 400, "{path}: {v}");
    }
    assert!(s.arrivals_of(me).is_empty(), "the upstream saw {:?}", s.arrivals_of(me));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_max_body_is_refused() {
    let (s, me) = (shared().await, "body");
    let big = "x".repeat(2048);
    for path in FENCED {
        let (status, v) = s.sc.send_body("PUT", path, Some(5), &[(TAG, me)], big.clone()).await;
        assert_eq!((status, error_of(&v)), (413, "body_too_large"), "{path}: {v}");
    }
    assert!(s.arrivals_of(me).is_empty(), "the upstream saw {:?}", s.arrivals_of(me));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_case_method_does_not_slip_past_a_route_fenced_for_put() {
    let (s, me) = (shared().await, "method");
    for path in FENCED {
        let request = format!("put {path} HTTP/1.1\r\nHost: x\r\n{TAG}: {me}\r\nContent-Length: 0\r\n\r\n");
        let answer = raw_tcp(s.sc.port, &request).await;
        assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("malformed_method"), "{path}: {answer}");
    }
    assert!(s.arrivals_of(me).is_empty(), "the upstream saw {:?}", s.arrivals_of(me));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_is_refused_or_settled() {
    let (s, me) = (shared().await, "framing");
    let head = format!("PUT /plain HTTP/1.1\r\nHost: x\r\n{TAG}: {me}\r\n");
    // Codings other than chunked would reach the upstream undeclared.
    for rest in [
        "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ] {
        let answer = raw_tcp(s.sc.port, &format!("{head}{rest}")).await;
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 400"), "{rest:?}: {answer}");
    }
    assert!(s.arrivals_of(me).is_empty(), "the upstream saw {:?}", s.arrivals_of(me));
    // CL+TE and duplicate lengths: hyper already settles these (it drops
    // Content-Length next to chunked, and refuses differing lengths), so
    // they are refused or forwarded with one unambiguous framing.
    for rest in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "Content-Length: 2\r\nContent-Length: 2\r\n\r\nab",
        "Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
    ] {
        let answer = raw_tcp(s.sc.port, &format!("{head}{rest}")).await;
        let status = answer.get(9..12).unwrap_or("");
        assert!(answer.is_empty() || status == "400" || status == "200", "{rest:?}: {answer}");
    }
    for a in s.arrivals_of(me) {
        let h = &a.headers;
        assert!(!(h.contains_key("content-length") && h.contains_key("transfer-encoding")), "{a:?}");
        assert!(h.get_all("content-length").iter().count() <= 1, "{a:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_unfinished_heads_never_reach_the_upstream() {
    let (s, me) = (shared().await, "heads");
    // A head over max_header_bytes: hyper refuses it (431), the sidecar
    // gives the refusal its JSON body and counts it.
    let huge = format!("GET /plain HTTP/1.1\r\nHost: x\r\n{TAG}: {me}\r\nX-Big: {}\r\n\r\n", "a".repeat(16384));
    let answer = raw_tcp(s.sc.port, &huge).await;
    assert!(answer.starts_with("HTTP/1.1 431") && answer.contains(r#""error":"headers_too_large""#), "{answer}");
    let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(16384));
    let answer = raw_tcp(s.sc.port, &long).await;
    assert!(answer.starts_with("HTTP/1.1 431") && answer.contains("headers_too_large"), "a long target too: {answer}");
    // A head that never finishes: closed after header_timeout (waiting it
    // out is the point).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", s.sc.port)).await.unwrap();
        conn.write_all(format!("GET /plain HTTP/1.1\r\nHost: x\r\n{TAG}: {me}\r\n").as_bytes()).await.unwrap();
        let started = tokio::time::Instant::now();
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("slow head not closed");
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(3), "closed after {elapsed:?}");
        let text = String::from_utf8_lossy(&buf[..n.unwrap_or(0)]).into_owned();
        assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    }
    assert!(s.arrivals_of(me).is_empty(), "oversized or slow heads reached the upstream: {:?}", s.arrivals_of(me));
}

/// A body that trickles is cut at `limits.body_timeout` (1 s here) with a
/// 408, fenced or not, streamed to the upstream or read whole first; a
/// fenced one read whole never reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_answered_408_at_the_body_timeout() {
    let (s, me) = (shared().await, "slow-body");
    for (path, framing, part, reaches) in [
        ("/plain", "Content-Length: 100", "0123456789", true),
        ("/plain", "Transfer-Encoding: chunked", "a\r\n0123456789\r\n", true),
        ("/observed/8", "Transfer-Encoding: chunked", "a\r\n0123456789\r\n", false),
    ] {
        let request =
            format!("PUT {path} HTTP/1.1\r\nHost: x\r\n{TAG}: {me}\r\nx-fence-token: 80\r\n{framing}\r\n\r\n{part}");
        let started = tokio::time::Instant::now();
        let answer = raw_tcp(s.sc.port, &request).await;
        let took = started.elapsed();
        assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("body_timeout"), "{path} {framing}: {answer}");
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "{path} {framing}: after {took:?}"
        );
        let arrived = s.arrivals_of(me).iter().any(|a| a.path == path);
        assert_eq!(arrived, reaches, "{path} {framing}: the upstream saw {:?}", s.arrivals_of(me));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_timeouts_failures_and_streams() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let dead = free_port();
    let yaml = table(&[
        Route::unfenced("slow", "/slow/{id}").timeout("300ms"),
        Route::unfenced("dead", "/dead/{id}").upstream(&format!("http://127.0.0.1:{dead}")),
        rack_writes("{ mode: observed }").methods(&["PUT"]),
        everything_else(),
    ]);
    let sc = Sidecar::start(&bin!(), dir.path().join("sc"), &up.url(), &[], &yaml).await;
    let t = 7;
    let extra = [("host", "inventory.example"), ("connection", "x-hop"), ("x-hop", "1"), ("x-custom", "kept")];
    let (status, _) = sc.send("PUT", "/racks/h", Some(t), &extra).await;
    assert_eq!(status, 200);
    let seen = up.seen().pop().unwrap();
    let h = &seen.headers;
    assert_eq!(h["host"], "inventory.example", "Host is preserved");
    assert_eq!(h["x-fence-token"], t.to_string().as_str(), "the token is passed on");
    assert_eq!(h["x-custom"], "kept");
    assert!(!h.contains_key("x-hop"), "headers named in Connection are hop-by-hop");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    let fwd = h["forwarded"].to_str().unwrap();
    assert!(fwd.starts_with("for=127.0.0.1;proto=http;host=\"inventory.example\""), "{fwd}");
    assert_eq!(seen.body, r#"{"state":"drained"}"#);

    // The route's timeout: 504, counted as an upstream error.
    let (status, v) = sc.send("GET", "/slow/1", None, &[("x-test-delay-ms", "1500")]).await;
    assert_eq!((status, error_of(&v)), (504, "upstream_timeout"), "{v}");
    // Nothing listening upstream: 502.
    let (status, v) = sc.send("GET", "/dead/1", None, &[]).await;
    assert_eq!((status, error_of(&v)), (502, "upstream_error"), "{v}");
    let m = sc.metrics().await;
    assert!(m.contains(r#"fencegate_sidecar_requests_total{outcome="upstream_error",route="slow"} 1"#), "{m}");

    // A large body streams through whole.
    let big = "y".repeat(3 << 20);
    let (status, _) = sc.send_body("PUT", "/racks/h", Some(t), &[], big.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(up.seen().pop().unwrap().body.len(), big.len());

    // HTTP/2 from the client (prior knowledge, cleartext).
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", sc.port)).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::request("PUT", &format!("http://inventory.example:{}/racks/h", sc.port), Some(t), &[], "h2");
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let seen = up.seen().pop().unwrap();
    assert_eq!(
        (seen.body.as_str(), seen.headers["host"].to_str().unwrap()),
        ("h2", format!("inventory.example:{}", sc.port).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observed_mode_keeps_a_durable_high_water_mark_without_a_lock_service() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let yaml = table(&[
        Route::fenced("etcd-fenced", "/racks/{rack}", "rack/{rack}", "{ mode: observed }").methods(&["PUT"]),
        everything_else(),
    ]);
    let mut sc = Sidecar::start(&bin!(), dir.path().join("sc"), &up.url(), &[], &yaml).await;
    for (t, want) in [(5, 200), (7, 200), (6, 409), (7, 200), (1000, 200), (999, 409)] {
        let (status, v) = sc.send("PUT", "/racks/e", Some(t), &[]).await;
        assert_eq!(status, want, "token {t}: {v}");
    }
    sc.restart().await;
    let (status, v) = sc.send("PUT", "/racks/e", Some(999), &[]).await;
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(1000)), "{v}");
    assert_eq!(up.tokens("/racks/e"), vec![Some(5), Some(7), Some(7), Some(1000)]);
}

/// A fenced write of unannounced length is read whole before the upstream
/// sees any of it: over `max_body` it is a clean 413 and nothing arrives;
/// within it, the upstream gets it with a `Content-Length`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_fenced_write_over_the_limit_never_reaches_the_upstream() {
    let (s, me) = (shared().await, "chunked");
    let chunked = |size: usize, token: u64| {
        format!(
            "PUT /observed/7 HTTP/1.1\r\nHost: x\r\n{TAG}: {me}\r\nx-fence-token: {token}\r\nTransfer-Encoding: chunked\r\n\r\n{size:x}\r\n{}\r\n0\r\n\r\n",
            "x".repeat(size)
        )
    };
    let answer = raw_tcp(s.sc.port, &chunked(2048, 70)).await;
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("body_too_large"), "{answer}");
    assert!(s.arrivals_of(me).is_empty(), "the upstream saw {:?}", s.arrivals_of(me));
    let answer = raw_tcp(s.sc.port, &chunked(100, 71)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let arrived = s.arrivals_of(me);
    assert_eq!(arrived.len(), 1, "{arrived:?}");
    assert_eq!(arrived[0].headers.get("content-length").map(|v| v.as_bytes()), Some(&b"100"[..]));
    let applied: Vec<_> = s.up.seen().into_iter().filter(|a| a.headers.get(TAG).is_some_and(|v| v == me)).collect();
    assert_eq!(applied.iter().map(|a| a.body.len()).collect::<Vec<_>>(), vec![100], "the whole body, once");
}
