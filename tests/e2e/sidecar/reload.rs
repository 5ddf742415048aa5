//! SIGHUP: the sidecar reloads its config file while it serves. New
//! requests take the new routes, requests in flight finish on the old ones,
//! an invalid file or one changing what takes a restart is refused whole.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencegate_testkit::http;
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::{bin, wait, Cluster, Sidecar, Upstream};
use nix::sys::signal::Signal;

use super::{error_of, take, AT_UPSTREAM};

const APPLIED: &str = r#"fencegate_sidecar_config_reloads_total{result="applied"}"#;
const REFUSED: &str = r#"fencegate_sidecar_config_reloads_total{result="refused"}"#;

/// Rewrite the test's part of `sc`'s config, SIGHUP it, and wait until
/// the reload is counted as `series` = `n`.
async fn reload(sc: &Sidecar, yaml: &str, series: &str, n: f64) {
    sc.rewrite_config(yaml);
    sc.signal(Signal::SIGHUP);
    sc.wait_for_metric(series, n, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_new_routes_under_load_and_refuses_a_bad_file() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let writes = rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]);
    let only_writes = table(std::slice::from_ref(&writes));
    let sc = Arc::new(c.sidecar("sc", &up.url(), &only_writes).await);
    let m = sc.metrics().await;
    assert!(m.contains(&format!("{APPLIED} 0")) && m.contains(&format!("{REFUSED} 0")), "both series at 0: {m}");
    assert_eq!(sc.send("GET", "/hosts/1", None, &[]).await.0, 404, "no route for it yet");

    // Fenced writes that take 300 ms at the upstream, four at a time, for
    // as long as the reloads go on: some are in flight at each reload.
    let (token, _) = take(&c, "rack/load", 60_000, 0).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = vec![];
    for _ in 0..4 {
        let (sc, stop) = (sc.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut statuses = vec![];
            while !stop.load(Ordering::Relaxed) {
                let (status, v) = sc.send("PUT", "/racks/load", Some(token), &[("x-test-delay-ms", "300")]).await;
                statuses.push((status, v));
            }
            statuses
        }));
    }
    let writes_seen = || up.arrivals().iter().filter(|a| a.path == "/racks/load").count();
    up.wait_for_arrivals(4, AT_UPSTREAM).await;

    // A catch-all added: what was 404 is forwarded.
    reload(&sc, &table(&[writes.clone(), everything_else()]), APPLIED, 1.0).await;
    // Its series are there at 0 before its first request, as at start-up.
    let m = sc.metrics().await;
    for series in [
        r#"fencegate_sidecar_requests_total{outcome="upstream_error",route="everything-else"}"#,
        r#"fencegate_sidecar_rejections_total{reason="body_too_large",route="everything-else"}"#,
    ] {
        assert_eq!(http::metric(&m, series), Some(0.0), "{series}: {m}");
    }
    let (status, v) = sc.send("GET", "/hosts/1", None, &[]).await;
    assert_eq!(status, 200, "the new route does not serve: {v}");

    // A file that does not validate: refused, the running routes stay.
    let before = writes_seen();
    let bad = table(&[rack_writes("{ mode: strikt }").methods(&["PUT"]), everything_else()]);
    reload(&sc, &bad, REFUSED, 1.0).await;
    // One that changes what takes a restart: refused whole, nothing of it taken.
    let restart = format!("limits: {{ max_connections: 7 }}\n{}", only_writes);
    reload(&sc, &restart, REFUSED, 2.0).await;
    assert_eq!(sc.send("GET", "/hosts/1", None, &[]).await.0, 200, "the running routes stay");
    // Writes go on after the refusals too.
    wait::until("four more writes", AT_UPSTREAM, || async { writes_seen() >= before + 4 }).await;
    stop.store(true, Ordering::Relaxed);

    let mut sent = 0;
    for w in workers {
        for (status, v) in w.await.unwrap() {
            assert_eq!(status, 200, "a write failed across the reloads: {v}");
            sent += 1;
        }
    }
    assert_eq!(sent, up.tokens("/racks/load").len(), "every write sent was answered 200 and applied");
    let m = sc.metrics().await;
    assert!(m.contains(&format!("{APPLIED} 1")) && m.contains(&format!("{REFUSED} 2")), "{m}");
    // Each forward is counted under its own route, before and after the
    // reload changed the table (the meters are the config's, by route).
    let forwarded = |route: &str| {
        http::metric(&m, &format!(r#"fencegate_sidecar_requests_total{{outcome="forwarded",route="{route}"}}"#))
    };
    assert_eq!(forwarded("rack-writes"), Some(sent as f64), "{m}");
    assert_eq!(forwarded("everything-else"), Some(2.0), "the two GETs after the reload: {m}");
    let log = sc.log();
    let path = sc.config_path().display().to_string();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("config not reloaded")).collect();
    assert_eq!(refusals.len(), 2, "{log}");
    assert!(refusals.iter().all(|l| l.contains("ERROR") && l.contains(&path)), "{refusals:?}");
    assert!(refusals[0].contains("strikt"), "{}", refusals[0]);
    assert!(refusals[1].contains("limits.max_connections") && refusals[1].contains("restart"), "{}", refusals[1]);
    // The floor is the sidecar's, not the config's: a stale token is still refused.
    let (status, v) = sc.send("PUT", "/racks/load", Some(token - 1), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "stale_token"), "{v}");
}

/// `limits.drain_timeout`: SIGTERM gives the answers in flight that long,
/// not the 10 s default. No route is fenced, so nothing is waited for after
/// the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_lasts_the_configured_drain_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let yaml = format!("limits: {{ drain_timeout: 300ms }}\n{}", table(&[everything_else()]));
    let mut sc = Sidecar::start(&bin!(), dir.path().join("sc"), &up.url(), &[], &yaml).await;
    // The client holds its connection open, waiting for the answer.
    let req = http::request("PUT", &format!("{}/slow", sc.url()), None, &[("x-test-delay-ms", "8000")], http::DRAINED);
    let _slow = tokio::spawn(http::send(req, Duration::from_secs(20)));
    up.wait_for_arrivals(1, AT_UPSTREAM).await;
    let t = tokio::time::Instant::now();
    sc.signal(Signal::SIGTERM);
    assert_eq!(sc.wait_exit(Duration::from_secs(5)).await, Some(0), "the sidecar did not exit within 5 s");
    assert!(t.elapsed() < Duration::from_secs(4), "it waited {:?}, not the 300 ms drain", t.elapsed());
}

/// A reload that switches a route from `strict` to `observed` keeps the
/// key's floor: a token below what the strict route forwarded is refused
/// on the observed route. An observed token still never raises the strict
/// floor: back on `strict`, the holder's token passes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_switched_from_strict_to_observed_keeps_the_floor() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let strict = table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"])]);
    let observed = table(&[rack_writes("{ mode: observed }").methods(&["PUT"])]);
    let sc = c.sidecar("sc", &up.url(), &strict).await;
    let (old, _) = take(&c, "rack/5", 500, 0).await;
    assert_eq!(sc.send("PUT", "/racks/5", Some(old), &[]).await.0, 200, "the first holder's write");
    let (new, _) = take(&c, "rack/5", 60_000, 5_000).await;
    assert_eq!(sc.send("PUT", "/racks/5", Some(new), &[]).await.0, 200, "the next holder's write");

    reload(&sc, &observed, APPLIED, 1.0).await;
    let (status, v) = sc.send("PUT", "/racks/5", Some(old), &[]).await;
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(new)), "{v}");
    assert_eq!(sc.send("PUT", "/racks/5", Some(new + 100), &[]).await.0, 200, "an observed token above it");

    reload(&sc, &strict, APPLIED, 2.0).await;
    assert_eq!(sc.send("PUT", "/racks/5", Some(new), &[]).await.0, 200, "the strict floor was not raised");
    assert_eq!(up.tokens("/racks/5"), vec![Some(old), Some(new), Some(new + 100), Some(new)]);
}
