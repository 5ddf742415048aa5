//! The `/metrics` of a real node and a real sidecar: every series an alert
//! reads exists at 0 before its first event, every refusal is counted in
//! `fencegate_sidecar_rejections_total`, process and build metrics are
//! there, and `promtool check metrics` finds nothing to say about either
//! (when promtool is on PATH; with `FENCEGATE_REQUIRE_PROMTOOL=1`, as CI
//! sets it, its absence fails the test).

use std::io::Write;
use std::process::{Command, Stdio};

use fencegate_testkit::http::{get_text, metric, raw, raw_tcp, series_of};
use fencegate_testkit::routes::{table, Route};
use fencegate_testkit::{bin, Cluster, Upstream};

const REJECTIONS: &str = "fencegate_sidecar_rejections_total";

/// `promtool check metrics` on `exposition`; `None` if promtool is not
/// installed (and not required).
fn promtool_check(what: &str, exposition: &str) -> Option<()> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let required = std::env::var("FENCEGATE_REQUIRE_PROMTOOL").is_ok_and(|v| v == "1");
            assert!(!required, "FENCEGATE_REQUIRE_PROMTOOL=1 and promtool is not on PATH (Debian: prometheus)");
            eprintln!("promtool not on PATH: `promtool check metrics` skipped");
            return None;
        }
        Err(e) => panic!("promtool: {e}"),
    };
    child.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics on the {what}'s /metrics:\n{said}");
    Some(())
}

/// The families every fencegate process exports besides its own.
fn assert_process_and_build_info(what: &str, m: &str) {
    for family in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(metric(m, family).is_some(), "{what}: no {family}\n{m}");
    }
    let info = format!(r#"fencegate_build_info{{version="{}"}}"#, env!("CARGO_PKG_VERSION"));
    assert_eq!(metric(m, &info), Some(1.0), "{what}\n{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_exist_at_zero_and_every_refusal_is_counted() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let routes = table(&[
        Route::fenced("rack-writes", "/racks/{rack}", "rack/{rack}", "{ mode: strict, consistency: linearizable }")
            .methods(&["PUT"])
            .with("idempotency", "{}"),
        Route::unfenced("reads", "/racks/{rack}").methods(&["GET"]),
    ]);
    let sc =
        c.sidecar("sc", &up.url(), &format!("limits: {{ max_body: 1KiB, max_header_bytes: 8KiB }}\n{routes}")).await;

    // Before any request: the series alerts read, at 0.
    let node = get_text(&format!("{}/metrics", c.url(1))).await;
    let before = sc.metrics().await;
    for series in [
        r#"fencegate_sidecar_rejections_total{reason="stale_token",route="rack-writes"}"#,
        r#"fencegate_sidecar_rejections_total{reason="unknown_token",route="rack-writes"}"#,
        r#"fencegate_sidecar_rejections_total{reason="malformed_path",route="-"}"#,
        r#"fencegate_sidecar_requests_total{outcome="upstream_error",route="rack-writes"}"#,
        r#"fencegate_sidecar_requests_total{outcome="rejected",route="-"}"#,
        r#"fencegate_sidecar_idempotency_total{result="unknown",route="rack-writes"}"#,
        r#"fencegate_sidecar_config_reloads_total{result="refused"}"#,
    ] {
        assert_eq!(metric(&before, series), Some(0.0), "{series}\n{before}");
    }
    // The age of the sidecar's proof of freshness (max_staleness) is there
    // from the start; reads for staleness are counted per strict or
    // monotonic route (a linearizable one re-reads at dispatch too), exactly
    // those, at 0; probe failures at 0 (this sidecar has no cached route,
    // so it sends no probes at all).
    assert!(metric(&before, "fencegate_sidecar_knowledge_age_seconds").is_some(), "{before}");
    const STALE: &str = "fencegate_sidecar_stale_knowledge_reads_total";
    let stale_series: Vec<String> = series_of(&before, STALE).into_iter().collect();
    assert_eq!(stale_series, [format!("{STALE}{{route=\"rack-writes\"}}")], "{before}");
    assert_eq!(metric(&before, &stale_series[0]), Some(0.0), "{before}");
    const PROBE_FAILURES: &str = "fencegate_sidecar_freshness_probe_failures_total";
    assert_eq!(metric(&before, PROBE_FAILURES), Some(0.0), "{before}");
    // A route without idempotency counts no keys.
    assert!(!before.contains(r#"fencegate_sidecar_idempotency_total{result="stored",route="reads"}"#));
    assert_eq!(metric(&node, r#"fencegate_config_reloads_total{result="refused"}"#), Some(0.0), "{node}");
    assert_process_and_build_info("node", &node);
    assert_process_and_build_info("sidecar", &before);
    promtool_check("node", &node);
    promtool_check("sidecar", &before);

    // Refusals of every phase: before routing, by the route table, by the
    // fence (the lock service asked), after it, and by the HTTP parser.
    let (status, grant) = raw("POST", &format!("{}/v1/locks/rack/1", c.url(1)), Some(r#"{"ttl_ms":30000}"#)).await;
    assert_eq!(status, 200, "{grant}");
    let token = grant["token"].as_u64();
    let big = "x".repeat(2048);
    for (method, path, token, headers, body, status, error) in [
        ("PUT", "/racks/../1", Some(1), vec![], "{}", 400, "malformed_path"),
        ("PUT", "/hosts/1", Some(1), vec![], "{}", 404, "no_route"),
        ("PUT", "/racks/1", None, vec![("X-Original-URL", "/racks/2")], "{}", 400, "disguised_request"),
        ("PUT", "/racks/1", Some(999_999), vec![], "{}", 409, "unknown_token"),
        ("PUT", "/racks/1", None, vec![], "{}", 428, "missing_token"),
        ("PUT", "/racks/1", None, vec![("X-Fence-Token", "07")], "{}", 400, "malformed_token"),
        ("PUT", "/racks/1", token, vec![("Idempotency-Key", "")], "{}", 400, "malformed_idempotency_key"),
        ("PUT", "/racks/1", Some(1), vec![], big.as_str(), 413, "body_too_large"),
    ] {
        let (got, v) = sc.send_body(method, path, token, &headers, body.to_string()).await;
        assert_eq!((got, v["error"].as_str().unwrap_or("")), (status, error), "{method} {path}: {v}");
    }
    let huge = format!("GET /racks/1 HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n", "y".repeat(16384));
    let answer = raw_tcp(sc.port, &huge).await;
    assert!(answer.contains("headers_too_large"), "{answer}");

    let after = sc.metrics().await;
    for (route, reason) in [
        ("-", "malformed_path"),
        ("-", "no_route"),
        ("-", "disguised_request"),
        ("-", "body_too_large"),
        ("-", "headers_too_large"),
        ("rack-writes", "unknown_token"),
        ("rack-writes", "missing_token"),
        ("rack-writes", "malformed_token"),
        ("rack-writes", "malformed_idempotency_key"),
    ] {
        let series = format!(r#"{REJECTIONS}{{reason="{reason}",route="{route}"}}"#);
        assert_eq!(metric(&after, &series), Some(1.0), "{series}\n{after}");
    }
    // Not one of them appeared with its first event: each was there at 0.
    let (at_start, now) = (series_of(&before, REJECTIONS), series_of(&after, REJECTIONS));
    let born: Vec<_> = now.difference(&at_start).collect();
    assert!(born.is_empty(), "series born at their first event: {born:?}");
    // Every refusal in requests_total{outcome="rejected"} is in rejections_total.
    let sum = |m: &str, family: &str, filter: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with(family) && l.contains(filter))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    let rejected = sum(&after, "fencegate_sidecar_requests_total{", r#"outcome="rejected""#);
    assert_eq!(rejected, 9.0, "{after}");
    assert_eq!(sum(&after, "fencegate_sidecar_rejections_total{", ""), rejected, "{after}");
    assert!(up.seen().is_empty(), "a refusal reached the upstream");
    promtool_check("sidecar", &after);
    assert_eq!(metric(&after, PROBE_FAILURES), Some(0.0), "no cached route, no probe: {after}");
}
