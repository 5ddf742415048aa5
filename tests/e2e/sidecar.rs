//! The sidecar end to end: a real 3-node lock cluster, a real `fencegate
//! sidecar` process and a recording upstream that checks no tokens at all.
//! What needs no lock service (framing, limits, forwarding, observed mode)
//! is in `sidecar/framing.rs`.

/// Refusals decided before the lock service is asked, without a cluster.
mod bypass;
mod framing;
/// SIGHUP reloads, and the configured drain.
mod reload;

use std::sync::Arc;
use std::time::Duration;

use fencegate_testkit::http::raw;
use fencegate_testkit::relay::Relay;
use fencegate_testkit::routes::{everything_else, rack_writes, table, Route};
use fencegate_testkit::{bin, Cluster, Sidecar, Upstream};
use serde_json::Value;

/// How long a test waits for a request to reach (or take effect at) the upstream.
const AT_UPSTREAM: Duration = Duration::from_secs(5);

/// `rack-writes` fenced in `mode` with `consistency`, everything else unfenced.
fn routes(mode: &str, consistency: &str) -> String {
    let fence = format!("{{ mode: {mode}, consistency: {consistency} }}");
    table(&[rack_writes(&fence).methods(&["PUT", "POST", "PATCH", "DELETE"]), everything_else()])
}

/// A 3-node cluster, a recording upstream, and a sidecar (`sc`) in front
/// of it with `routes(mode, "cached")`.
async fn fenced(mode: &str) -> (Cluster, Upstream, Sidecar) {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let sc = c.sidecar("sc", &up.url(), &routes(mode, "cached")).await;
    (c, up, sc)
}

/// Acquire through the raw API (no keepalives): the lease lapses after `ttl_ms`.
async fn take(c: &Cluster, key: &str, ttl_ms: u64, wait_ms: u64) -> (u64, String) {
    let body = format!(r#"{{"ttl_ms":{ttl_ms},"wait_ms":{wait_ms}}}"#);
    let (status, v) = raw("POST", &format!("{}/v1/locks/{key}", c.url(1)), Some(&body)).await;
    assert_eq!(status, 200, "{v}");
    (v["token"].as_u64().unwrap(), v["lease_id"].as_str().unwrap().to_string())
}

fn error_of(v: &Value) -> &str {
    v["error"].as_str().unwrap_or("")
}

/// DESIGN.md's walkthrough, in strict and in monotonic mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walkthrough_a_paused_holder_is_refused() {
    let c = Cluster::start(&bin!(), 3, "").await;
    for mode in ["strict", "monotonic"] {
        let up = Upstream::start().await;
        let sc = c.sidecar(&format!("sidecar-{mode}"), &up.url(), &routes(mode, "cached")).await;
        let key = format!("rack/{mode}");
        let path = format!("/racks/{mode}");
        // A acquires, then "pauses" past its TTL (no keepalives).
        let (a, _) = take(&c, &key, 600, 0).await;
        // B acquires once A's lease expired.
        let (b, _) = take(&c, &key, 30_000, 5_000).await;
        assert!(b > a);
        let (status, v) = sc.send("PUT", &path, Some(b), &[]).await;
        assert_eq!(status, 200, "B's write: {v}");
        // Forwarded as sent, with B's token.
        let b_write = up.seen().pop().unwrap();
        assert_eq!(b_write.headers["x-fence-token"], b.to_string().as_str());
        assert_eq!(b_write.body, r#"{"state":"drained"}"#);
        // A wakes up and writes with its old token.
        let (status, v) = sc.send("PUT", &path, Some(a), &[]).await;
        assert_eq!((status, error_of(&v)), (409, "stale_token"), "{v}");
        assert_eq!((v["token"].as_u64(), v["current"].as_u64()), (Some(a), Some(b)), "{v}");
        assert_eq!(v["route"], "rack-writes");
        assert_eq!(v["key"].as_str(), Some(key.as_str()));
        // The upstream saw B's write only.
        assert_eq!(up.tokens(&path), vec![Some(b)], "{mode}");
        let m = sc.metrics().await;
        assert!(m.contains(r#"fencegate_sidecar_rejections_total{reason="stale_token",route="rack-writes"} 1"#), "{m}");
        assert!(m.contains(r#"fencegate_sidecar_requests_total{outcome="forwarded",route="rack-writes"} 1"#), "{m}");
        assert!(m.contains("fencegate_sidecar_lock_service_up 1"), "{m}");
        assert!(sc.log().contains("rejected"), "a structured log line per rejection");
    }
}

/// The same run without the sidecar: A's write lands after B's (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_sidecar_the_stale_write_lands() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let (a, _) = take(&c, "rack/ctl", 600, 0).await;
    let (b, _) = take(&c, "rack/ctl", 30_000, 5_000).await;
    for t in [b, a] {
        let (status, _) = raw("PUT", &format!("{}/racks/ctl", up.url()), Some(&format!("{{\"by\":{t}}}"))).await;
        assert_eq!(status, 200);
    }
    assert_eq!(up.seen().len(), 2, "the unprotected upstream applied the stale write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_refuses_an_expired_lease_before_anyone_else_acquires() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let strict = c.sidecar("s", &up.url(), &routes("strict", "cached")).await;
    let mono = c.sidecar("m", &up.url(), &routes("monotonic", "cached")).await;
    let (a, _) = take(&c, "rack/exp", 700, 0).await;
    assert_eq!(strict.send("PUT", "/racks/exp", Some(a), &[]).await.0, 200);
    // The lease lapses, nobody re-acquires, and the sidecar hears of the
    // expiry (waiting out the TTL is the point here).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, v) = strict.send("PUT", "/racks/exp", Some(a), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "lease_expired"), "{v}");
    // Monotonic only refuses once a newer grant exists.
    assert_eq!(mono.send("PUT", "/racks/exp", Some(a), &[]).await.0, 200);
    assert_eq!(up.tokens("/racks/exp"), vec![Some(a), Some(a)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_tokens_are_unknown_and_do_not_move_the_floor() {
    let (c, up, sc) = fenced("strict").await;
    let (t, _) = take(&c, "rack/f", 30_000, 0).await;
    for forged in [t + 1, 1_000_000, u64::MAX] {
        let (status, v) = sc.send("PUT", "/racks/f", Some(forged), &[]).await;
        assert_eq!((status, error_of(&v)), (409, "unknown_token"), "{forged}: {v}");
    }
    // The real holder is still served: the forged tokens moved nothing.
    assert_eq!(sc.send("PUT", "/racks/f", Some(t), &[]).await.0, 200);
    // A token granted for another key is not valid for this one.
    let (other, _) = take(&c, "rack/g", 30_000, 0).await;
    let (status, v) = sc.send("PUT", "/racks/f", Some(other), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "unknown_token"), "{v}");
    assert_eq!(up.tokens("/racks/f"), vec![Some(t)]);
}

/// Cached knowledge is trusted only while the watch is up: cut off from the
/// lock service, the sidecar cannot tell that a lease it saw live has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_stops_trusting_a_live_lease_once_its_watch_is_down() {
    let (mut c, up, sc) = fenced("strict").await;
    let (a, _) = take(&c, "rack/w", 2_000, 0).await;
    assert_eq!(sc.send("PUT", "/racks/w", Some(a), &[]).await.0, 200);
    c.kill_all();
    // Until the sidecar has noticed its watch is down.
    sc.wait_for_metric("fencegate_sidecar_lock_service_up", 0.0, Duration::from_secs(10)).await;
    // A's lease may have ended by now for all the sidecar can know.
    let (status, v) = sc.send("PUT", "/racks/w", Some(a), &[]).await;
    assert_eq!((status, error_of(&v)), (503, "lock_service_unavailable"), "{v}");
    assert_eq!(up.tokens("/racks/w"), vec![Some(a)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sidecar_keeps_its_floors_while_the_lock_service_is_down() {
    let (mut c, up, mut sc) = fenced("strict").await;
    let (a, _) = take(&c, "rack/r", 600, 0).await;
    let (b, _) = take(&c, "rack/r", 30_000, 5_000).await;
    assert_eq!(sc.send("PUT", "/racks/r", Some(b), &[]).await.0, 200);
    c.kill_all();
    sc.restart().await;
    let (status, v) = sc.send("PUT", "/racks/r", Some(a), &[]).await;
    assert_eq!((status, error_of(&v)), (409, "stale_token"), "{v}");
    // B's own token needs the service to be judged in strict mode: 503.
    let (status, v) = sc.send("PUT", "/racks/r", Some(b), &[]).await;
    assert_eq!((status, error_of(&v)), (503, "lock_service_unavailable"), "{v}");
    let m = sc.metrics().await;
    assert!(m.contains("fencegate_sidecar_lock_service_up 0"), "{m}");
    // Reads are not fenced and still pass.
    assert_eq!(sc.send("GET", "/racks/r", None, &[]).await.0, 200);
    assert_eq!(up.tokens("/racks/r"), vec![Some(b)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_token_waits_for_lower_ones_in_flight() {
    let (c, up, sc) = fenced("monotonic").await;
    let sc = Arc::new(sc);
    let (a, lease_a) = take(&c, "rack/o", 30_000, 0).await;
    // A's write is slow at the upstream, and has reached it.
    let s = sc.clone();
    let slow = tokio::spawn(async move { s.send("PUT", "/racks/o", Some(a), &[("x-test-delay-ms", "800")]).await });
    up.wait_for_arrivals(1, AT_UPSTREAM).await;
    raw("DELETE", &format!("{}/v1/leases/{lease_a}", c.url(1)), None).await;
    let (b, _) = take(&c, "rack/o", 30_000, 0).await;
    let started = tokio::time::Instant::now();
    let (status, _) = sc.send("PUT", "/racks/o", Some(b), &[]).await;
    assert_eq!(status, 200);
    assert!(slow.is_finished(), "B was dispatched before A's in-flight write completed");
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(slow.await.unwrap().0, 200);
    assert_eq!(up.tokens("/racks/o"), vec![Some(a), Some(b)]);
}

/// S1 when the client goes away: the permit of a write already at the
/// upstream must outlive the client's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_does_not_let_a_higher_token_overtake() {
    let (c, up, sc) = fenced("monotonic").await;
    let (a, lease_a) = take(&c, "rack/d", 30_000, 0).await;
    assert_eq!(sc.send("PUT", "/racks/d", Some(a), &[]).await.0, 200);
    // A sends a slow write and hangs up, once it is at the upstream, before the answer.
    {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", sc.port)).await.unwrap();
        let req = format!("PUT /racks/d HTTP/1.1\r\nHost: x\r\nX-Fence-Token: {a}\r\nX-Test-Delay-Ms: 800\r\nContent-Length: 2\r\n\r\nhi");
        s.write_all(req.as_bytes()).await.unwrap();
        up.wait_for_arrivals(2, AT_UPSTREAM).await;
    } // connection closed here
    raw("DELETE", &format!("{}/v1/leases/{lease_a}", c.url(1)), None).await;
    let (b, _) = take(&c, "rack/d", 30_000, 0).await;
    assert_eq!(sc.send("PUT", "/racks/d", Some(b), &[]).await.0, 200);
    // Until A's abandoned write has taken effect too.
    up.wait_for_applied(3, AT_UPSTREAM).await;
    assert_eq!(up.tokens("/racks/d"), vec![Some(a), Some(a), Some(b)], "B overtook A's abandoned write: {}", sc.log());
}

/// SIGTERM while a write whose client hung up is still at the upstream:
/// the sidecar exits only once the upstream has applied it (the request,
/// finishing on its own, holds its S1 permit, and shutdown waits for every
/// permit), so a restarted sidecar cannot dispatch a higher token while the
/// older write may still be applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_a_write_whose_client_hung_up() {
    let (c, up, mut sc) = fenced("strict").await;
    let (a, _) = take(&c, "rack/h", 30_000, 0).await;
    {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", sc.port)).await.unwrap();
        let req = format!("PUT /racks/h HTTP/1.1\r\nHost: x\r\nX-Fence-Token: {a}\r\nX-Test-Delay-Ms: 1500\r\nContent-Length: 2\r\n\r\nhi");
        s.write_all(req.as_bytes()).await.unwrap();
        up.wait_for_arrivals(1, AT_UPSTREAM).await;
    } // the client hangs up here
    sc.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(sc.wait_exit(Duration::from_secs(10)).await, Some(0), "the sidecar exits 0");
    // The upstream applies the write 1.5 s after it came, whoever waits.
    assert_eq!(up.tokens("/racks/h"), vec![Some(a)], "the sidecar exited before the abandoned write was applied");
}

/// `PUT /racks/{rack}` strict and `PUT /observed/{rack}` observed, on the
/// same lock key `rack/{rack}`.
fn strict_and_observed() -> [Route; 2] {
    [
        Route::fenced("strict-writes", "/racks/{rack}", "rack/{rack}", "{ mode: strict, consistency: cached }")
            .methods(&["PUT"]),
        Route::fenced("observed-writes", "/observed/{rack}", "rack/{rack}", "{ mode: observed }").methods(&["PUT"]),
    ]
}

/// Observed routes believe any token (nobody checks it with the lock
/// service), so their floors live apart: an observed route on the same lock
/// key must not move a strict route's floor, or an unchecked high token
/// there would lock the real holder out here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_route_cannot_raise_a_strict_routes_floor() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let [strict, observed] = strict_and_observed();
    let yaml = table(&[strict, observed, everything_else()]);
    let sc = Arc::new(c.sidecar("sc", &up.url(), &yaml).await);
    let (t, _) = take(&c, "rack/n", 30_000, 0).await;
    // An observed write with an unverified high token, still in flight...
    let s = sc.clone();
    let slow =
        tokio::spawn(async move { s.send("PUT", "/observed/n", Some(1_000_000), &[("x-test-delay-ms", "800")]).await });
    up.wait_for_arrivals(1, AT_UPSTREAM).await;
    // ...neither refuses nor holds back the real holder on the strict route.
    let (status, v) = sc.send("PUT", "/racks/n", Some(t), &[]).await;
    assert_eq!(status, 200, "the holder of rack/n was locked out by an observed write in flight: {v}");
    assert!(!slow.is_finished(), "the strict write waited for the observed one");
    assert_eq!(slow.await.unwrap().0, 200);
    // And once it is done, its floor is not the strict route's either.
    let (status, v) = sc.send("PUT", "/racks/n", Some(t), &[]).await;
    assert_eq!(status, 200, "the holder of rack/n was locked out by an observed write: {v}");
    // And the observed route keeps its own high-water mark.
    let (status, v) = sc.send("PUT", "/observed/n", Some(t), &[]).await;
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(1_000_000)), "{v}");
    assert_eq!(up.tokens("/racks/n"), vec![Some(t), Some(t)]);
}

/// The other way round is safe, and kept: a strict floor is a verified
/// token, so an observed route on the same lock key refuses what is below
/// it, also when the strict route raised it while the observed request
/// waited at its own barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_write_held_at_its_barrier_is_checked_against_the_strict_floor() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let yaml = table(&strict_and_observed());
    let sc = Arc::new(c.sidecar("sc", &up.url(), &yaml).await);
    for i in 0..3 {
        take(&c, &format!("other/{i}"), 60_000, 0).await;
    }
    let (t, _) = take(&c, "rack/o", 60_000, 0).await;
    assert!(t > 2, "{t}");
    // Observed token 1 in flight for a second; token 2 waits behind it...
    let s = sc.clone();
    let slow = tokio::spawn(async move { s.send("PUT", "/observed/o", Some(1), &[("x-test-delay-ms", "1000")]).await });
    up.wait_for_arrivals(1, AT_UPSTREAM).await;
    let s = sc.clone();
    let held = tokio::spawn(async move { s.send("PUT", "/observed/o", Some(2), &[]).await });
    sc.wait_for_metric("fencegate_sidecar_fence_barrier_waiting", 1.0, Duration::from_secs(5)).await;
    // ...while the holder's write raises the strict floor to `t`.
    assert_eq!(sc.send("PUT", "/racks/o", Some(t), &[]).await.0, 200, "the holder's write");
    let (status, v) = held.await.unwrap();
    assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(t)), "{v}");
    assert_eq!(slow.await.unwrap().0, 200);
    assert_eq!(up.tokens("/observed/o"), vec![Some(1)]);
}

/// S5. The sidecars hear from the lock service through relays that hold its
/// answers back by `LAG`, so their watch streams are always `LAG` behind:
/// only a read that started after the request can know of a grant made just
/// before it. A cached route behind the same relays is the control: it does
/// forward the stale write, so the setup can tell the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_routes_see_every_grant_that_completed_before_the_request() {
    const LAG: Duration = Duration::from_millis(300);
    let c = Cluster::start(&bin!(), 3, "").await;
    let mut relays = vec![];
    for id in c.ids() {
        relays.push(Relay::with_delay(c.port(id), LAG).await);
    }
    let endpoints: Vec<String> = relays.iter().map(Relay::url).collect();
    let (up, control_up) = (Upstream::start().await, Upstream::start().await);
    let (bin, dir) = (c.bin(), c.dir());
    let sc = Sidecar::start(bin, dir.join("sc"), &up.url(), &endpoints, &routes("strict", "linearizable")).await;
    // Its probes are answered 300 ms late: above the default max_staleness
    // it would never trust its watch, and read like the linearizable one.
    let o = fencegate_testkit::sidecar::SidecarOptions {
        lock_service: endpoints.clone(),
        lock_service_yaml: "  max_staleness: 5s\n".into(),
        yaml: routes("strict", "cached"),
        ..Default::default()
    };
    let control = Sidecar::start_with(bin, dir.join("control"), &control_up.url(), o).await;
    for i in 0..2 {
        let key = format!("rack/lin{i}");
        let path = format!("/racks/lin{i}");
        let (a, lease) = take(&c, &key, 30_000, 0).await;
        assert_eq!(sc.send("PUT", &path, Some(a), &[]).await.0, 200);
        assert_eq!(control.send("PUT", &path, Some(a), &[]).await.0, 200);
        raw("DELETE", &format!("{}/v1/leases/{lease}", c.url(2)), None).await;
        let (b, _) = take(&c, &key, 30_000, 0).await;
        // Straight after B's grant, before either watch can have told of it.
        let (status, v) = control.send("PUT", &path, Some(a), &[]).await;
        assert_eq!(status, 200, "the control did not forward A's write: its watch was not behind ({v})");
        // A is refused, for B's grant, whatever the watch has delivered.
        let (status, v) = sc.send("PUT", &path, Some(a), &[]).await;
        assert_eq!((status, error_of(&v), v["current"].as_u64()), (409, "stale_token", Some(b)), "{v}");
        assert_eq!(sc.send("PUT", &path, Some(b), &[]).await.0, 200);
        assert_eq!(up.tokens(&path), vec![Some(a), Some(b)]);
        assert_eq!(control_up.tokens(&path), vec![Some(a), Some(a)]);
    }
}

/// `/readyz` says whether the sidecar can fence now: not while its watch of
/// the lock service is down (the whole cluster stopped), again once it is
/// back. `/healthz` (liveness) stays ok: a restart would not help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_lock_service() {
    let mut c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let sc = c.sidecar("sc", &up.url(), &routes("strict", "cached")).await;
    let probe = |path: &'static str| {
        let url = format!("http://127.0.0.1:{}{path}", sc.metrics_port);
        async move { raw("GET", &url, None).await.0 }
    };
    let wait_for = |path: &'static str, status: u16, within: u64| async move {
        let what = format!("{path} answering {status}");
        fencegate_testkit::wait::until_ok(&what, Duration::from_secs(within), || async {
            match probe(path).await {
                s if s == status => Ok(()),
                s => Err(s),
            }
        })
        .await
    };
    wait_for("/readyz", 200, 15).await;
    c.kill_all();
    wait_for("/readyz", 503, 20).await;
    assert_eq!(probe("/healthz").await, 200, "alive, only not ready");
    c.start_all();
    wait_for("/readyz", 200, 30).await;
}

/// SIGTERM on the sidecar: it stops accepting, lets the write in flight
/// finish (its answer reaches the client), and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_writes_in_flight_and_exits_0() {
    let (c, up, sc) = fenced("strict").await;
    let (token, _) = take(&c, "rack/t", 30_000, 0).await;
    let url = sc.url();
    let sc = Arc::new(sc);
    let s = sc.clone();
    let slow = tokio::spawn(async move { s.send("PUT", "/racks/t", Some(token), &[("x-test-delay-ms", "800")]).await });
    up.wait_for_arrivals(1, AT_UPSTREAM).await;
    sc.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, _) = slow.await.unwrap();
    assert_eq!(status, 200, "the write in flight is answered");
    let mut sc = Arc::into_inner(sc).unwrap();
    assert_eq!(sc.wait_exit(Duration::from_secs(10)).await, Some(0), "then the sidecar exits 0");
    assert!(tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await.is_err(), "and accepts no more");
    assert_eq!(up.tokens("/racks/t"), vec![Some(token)]);
}
