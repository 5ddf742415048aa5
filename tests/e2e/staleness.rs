//! `lock_service.max_staleness`: a `cached` route trusts what its watch
//! stream told it only until `max_staleness` after its knowledge was last
//! proven current, whatever the network does. A real 3-node cluster, real
//! sidecars reaching it through relays, the recording upstream.

use std::sync::Arc;
use std::time::Duration;

use fencegate_testkit::http::raw;
use fencegate_testkit::relay::Relay;
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::{bin, Cluster, Sidecar, Upstream};
use tokio::time::Instant;

const MAX_STALENESS: Duration = Duration::from_millis(500);

const CACHED: &str = "{ mode: strict, consistency: cached }";
const LINEARIZABLE: &str = "{ mode: strict, consistency: linearizable }";

fn routes(fence: &str) -> String {
    table(&[rack_writes(fence).methods(&["PUT"]), everything_else()])
}

async fn sidecar(c: &Cluster, name: &str, up: &Upstream, endpoints: &[String], max_staleness: &str) -> Sidecar {
    sidecar_fenced(c, name, up, endpoints, max_staleness, CACHED).await
}

async fn sidecar_fenced(
    c: &Cluster,
    name: &str,
    up: &Upstream,
    endpoints: &[String],
    max_staleness: &str,
    fence: &str,
) -> Sidecar {
    let o = SidecarOptions {
        lock_service: endpoints.to_vec(),
        lock_service_yaml: format!("  max_staleness: {max_staleness}\n"),
        yaml: routes(fence),
        ..Default::default()
    };
    Sidecar::start_with(c.bin(), c.dir().join(name), &up.url(), o).await
}

/// Refused for B's grant, or (while the read waits on the silent node)
/// unavailable; never forwarded.
fn assert_refused(status: u16, v: &serde_json::Value, b: u64, what: &str) {
    match status {
        409 => assert_eq!((v["error"].as_str(), v["current"].as_u64()), (Some("stale_token"), Some(b)), "{what}: {v}"),
        503 => assert_eq!(v["error"].as_str(), Some("lock_service_unavailable"), "{what}: {v}"),
        other => panic!("{what}: {other} {v}"),
    }
}

/// Acquire through node 1's own API (no keepalives).
/// Three nodes, each client port behind a relay the test can black-hole;
/// the relays' URLs are the sidecars' endpoints.
async fn relayed_cluster() -> (Cluster, Vec<Relay>, Vec<String>) {
    let c = Cluster::start(&bin!(), 3, "").await;
    let mut relays = vec![];
    for id in c.ids() {
        relays.push(Relay::start(c.port(id)).await);
    }
    let endpoints = relays.iter().map(Relay::url).collect();
    (c, relays, endpoints)
}

async fn take(c: &Cluster, key: &str) -> (u64, String) {
    let (status, v) = raw("POST", &format!("{}/v1/locks/{key}", c.url(1)), Some(r#"{"ttl_ms":30000}"#)).await;
    assert_eq!(status, 200, "{v}");
    (v["token"].as_u64().unwrap(), v["lease_id"].as_str().unwrap().to_string())
}

/// A's writes (token `a`, superseded by `b` at `granted`) every 50 ms for
/// 2 s, each on its own: none sent `MAX_STALENESS` or more after B's grant
/// is forwarded, and none that was forwarded reached the upstream that late
/// (the decision and the floor's fsync included).
/// The control sidecar (a `max_staleness` of 10 s) writes with A's token
/// a second after B's grant...
fn control_writes_late(
    control: Arc<Sidecar>,
    path: &'static str,
    a: u64,
    granted: Instant,
) -> tokio::task::JoinHandle<(u16, serde_json::Value)> {
    tokio::spawn(async move {
        tokio::time::sleep_until(granted + Duration::from_secs(1)).await;
        control.send("PUT", path, Some(a), &[]).await
    })
}

/// ...and must have forwarded it: its watch really was blind that long.
async fn control_forwarded(write: tokio::task::JoinHandle<(u16, serde_json::Value)>) {
    let (status, v) = write.await.unwrap();
    assert_eq!(
        status, 200,
        "the control did not forward A's write a second after B's grant: its watch was not blind ({v})"
    );
}

async fn stale_writes_stop_within_the_bound(
    sc: &Arc<Sidecar>,
    up: &Upstream,
    path: &'static str,
    (a, b): (u64, u64),
    granted: Instant,
    granted_std: std::time::Instant,
    before: usize,
) {
    let mut writes = vec![];
    for i in 0..40u32 {
        let (sc, at) = (sc.clone(), granted + Duration::from_millis(50) * i);
        writes.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let sent = at.saturating_duration_since(granted);
            let (status, v) = sc.send("PUT", path, Some(a), &[]).await;
            (sent, status, v)
        }));
    }
    let (mut forwarded, mut forwarded_late) = (vec![], vec![]);
    for w in writes {
        let (sent, status, v) = w.await.unwrap();
        match status {
            200 if sent >= MAX_STALENESS => forwarded_late.push(sent),
            200 => forwarded.push(sent),
            // Re-checked with the lock service: B's grant, or (while the
            // read still waits on the silent node) unavailable.
            409 => assert_eq!((v["error"].as_str(), v["current"].as_u64()), (Some("stale_token"), Some(b)), "{v}"),
            503 => assert_eq!(v["error"].as_str(), Some("lock_service_unavailable"), "{v}"),
            other => panic!("A's write sent {sent:?} after B's grant: {other} {v}"),
        }
    }
    assert!(forwarded_late.is_empty(), "A's writes sent at {forwarded_late:?} after B's grant were forwarded");
    let mut latest = Duration::ZERO;
    for s in up.seen().iter().filter(|s| s.path == path).skip(before) {
        assert_eq!(s.token, Some(a));
        let late = s.at.saturating_duration_since(granted_std);
        assert!(late < MAX_STALENESS, "A's write reached the upstream {late:?} after B's grant");
        latest = latest.max(late);
    }
    println!("A's writes forwarded when sent at {forwarded:?} after B's grant; the last reached the upstream {latest:?} after it");
}

/// The sidecars' link to the node their watch streams from goes silent (no
/// FIN, no RST: a partition), then A's lease is released and B is granted
/// the key through another node. The sidecar's stream cannot tell it, and
/// would not notice its silence for 12 s. A's writes are forwarded at most
/// until `max_staleness` after B's grant completed; from then on they are
/// re-checked with the lock service and refused. The stream, left behind
/// what the probes answer, is then reopened on another node, and B's
/// writes are decided on what it streams again (no read each).
///
/// Control: a sidecar behind the same relays with `max_staleness: 10s`
/// still forwards A's write a second after B's grant, so the setup does
/// keep the stream blind for that long. (Mutation, by hand: with
/// `Fencer::trusted` answering `true`, the 500 ms sidecar forwards A's
/// writes for the whole run and the test fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_cut_watch_is_trusted_no_longer_than_max_staleness() {
    // The watch streams from the first endpoint: node 1, through relays[0].
    let (c, relays, endpoints) = relayed_cluster().await;
    let (up, control_up) = (Upstream::start().await, Upstream::start().await);
    let sc = Arc::new(sidecar(&c, "sc", &up, &endpoints, "500ms").await);
    let control = Arc::new(sidecar(&c, "control", &control_up, &endpoints, "10s").await);
    let fallbacks = |metrics: &str| {
        let series = "fencegate_sidecar_stale_knowledge_reads_total{route=\"rack-writes\"} ";
        metrics.lines().find_map(|l| l.strip_prefix(series)?.parse::<f64>().ok())
    };
    let at_start = sc.metrics().await;
    assert_eq!(fallbacks(&at_start), Some(0.0), "not at 0 from the start:\n{at_start}");
    let (path, key) = ("/racks/p", "rack/p");
    let (a, lease) = take(&c, key).await;
    assert_eq!(sc.send("PUT", path, Some(a), &[]).await.0, 200);
    assert_eq!(control.send("PUT", path, Some(a), &[]).await.0, 200);
    // Both trust their knowledge now (proven within their bound).
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(sc.send("PUT", path, Some(a), &[]).await.0, 200);

    relays[0].set_black_hole(true);
    let cut = Instant::now();
    assert_eq!(raw("DELETE", &format!("{}/v1/leases/{lease}", c.url(2)), None).await.0, 200);
    let (b, _) = take(&c, key).await;
    let (granted, granted_std) = (Instant::now(), std::time::Instant::now());
    let before = up.tokens(path).len();

    let control_write = control_writes_late(control, path, a, granted);
    stale_writes_stop_within_the_bound(&sc, &up, path, (a, b), granted, granted_std, before).await;
    let (status, v) = sc.send("PUT", path, Some(a), &[]).await;
    assert_eq!((status, v["error"].as_str()), (409, Some("stale_token")), "{v}");
    let metrics = sc.metrics().await;
    assert!(fallbacks(&metrics).is_some_and(|n| n >= 1.0), "no fallback counted:\n{metrics}");

    // Once the probes have moved to a node that answers (the client's
    // failover), the stream, short of their revision for `behind_patience`
    // (2 s here), is dropped for being behind (not for 12 s of silence:
    // with `behind_patience` at 60 s, this fails) and reopened on another
    // node, while node 1 stays silent: knowledge is proven again, and B's
    // writes go through without a read. (Writes further apart than
    // `max_staleness`: a read vouches for its key that long.)
    let reopened_by = cut + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let before = fallbacks(&sc.metrics().await).unwrap();
        assert_eq!(sc.send("PUT", path, Some(b), &[]).await.0, 200);
        if fallbacks(&sc.metrics().await).unwrap() == before {
            println!("B's writes decided on the stream again {:?} after the cut", cut.elapsed());
            break;
        }
        assert!(Instant::now() < reopened_by, "still reading for every write 20 s after the stream went silent");
    }
    let log = sc.log();
    assert!(log.contains("the stream has not reached revision"), "not dropped for being behind:\n{log}");
    // The probes sent to the silent node answered too late, if at all.
    let metrics = sc.metrics().await;
    let failures = "fencegate_sidecar_freshness_probe_failures_total ";
    let failed = metrics.lines().find_map(|l| l.strip_prefix(failures)?.parse::<f64>().ok());
    assert!(failed.is_some_and(|n| n >= 1.0), "no probe failure counted:\n{metrics}");

    control_forwarded(control_write).await;
}

/// The node the sidecar's watch streams from is cut from its peers but not
/// from the sidecar: it keeps the stream open (until its next heartbeat
/// finds no leader, up to 5 s) and tells nothing of B's grant. Its probes
/// reach the leader through another node: the revision they answer is
/// never reached by the stream, so nothing is proven, and A's writes stop
/// being forwarded within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_node_cut_from_its_leader_is_trusted_no_longer_than_max_staleness() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let leader = c.leader().await.expect("a leader");
    let cut = c.ids().into_iter().find(|id| *id != leader).unwrap();
    // The watch streams from the first endpoint: the follower to be cut.
    let mut ids = vec![cut];
    ids.extend(c.ids().into_iter().filter(|id| *id != cut));
    let endpoints: Vec<String> = ids.iter().map(|id| c.url(*id)).collect();
    let (up, control_up) = (Upstream::start().await, Upstream::start().await);
    let sc = Arc::new(sidecar(&c, "sc", &up, &endpoints, "500ms").await);
    // Control: the same watch, trusted for 10 s, still forwards A's write a
    // second after B's grant: the cut node's stream does stay blind.
    let control = Arc::new(sidecar(&c, "control", &control_up, &endpoints, "10s").await);
    let (path, key) = ("/racks/q", "rack/q");
    let (a, lease) = take(&c, key).await;
    assert_eq!(sc.send("PUT", path, Some(a), &[]).await.0, 200);
    assert_eq!(control.send("PUT", path, Some(a), &[]).await.0, 200);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(sc.send("PUT", path, Some(a), &[]).await.0, 200);

    c.isolate(cut, true);
    let other = ids[1];
    let (status, v) = raw("DELETE", &format!("{}/v1/leases/{lease}", c.url(other)), None).await;
    assert_eq!(status, 200, "{v}");
    let body = r#"{"ttl_ms":30000}"#;
    let (status, v) = raw("POST", &format!("{}/v1/locks/{key}", c.url(other)), Some(body)).await;
    assert_eq!(status, 200, "{v}");
    let b = v["token"].as_u64().unwrap();
    let (granted, granted_std) = (Instant::now(), std::time::Instant::now());
    let before = up.tokens(path).len();
    let control_write = control_writes_late(control, path, a, granted);
    stale_writes_stop_within_the_bound(&sc, &up, path, (a, b), granted, granted_std, before).await;
    control_forwarded(control_write).await;
    c.isolate(cut, false);
}

/// A fenced write whose request passed the check, then waited at the
/// ordering barrier behind a slow write of an older token while the watch
/// went silent and B was granted the key: it is decided again when it
/// leaves the barrier, from knowledge vouched for less than `max_staleness`
/// ago, and refused. Both a `cached` route and a `linearizable` one (whose
/// read on arrival is 1.5 s old by then). Fails without the re-check at
/// dispatch for linearizable routes (`Fencer::vouch` returning `Ok` for
/// them: A's write forwarded with 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_held_at_the_barrier_is_decided_again_when_it_leaves() {
    let (c, relays, endpoints) = relayed_cluster().await;
    let up = Upstream::start().await;
    let cached = Arc::new(sidecar_fenced(&c, "cached", &up, &endpoints, "500ms", CACHED).await);
    let lin = Arc::new(sidecar_fenced(&c, "lin", &up, &endpoints, "500ms", LINEARIZABLE).await);
    let key = "rack/w";
    let (x, lease_x) = take(&c, key).await;
    for sc in [&cached, &lin] {
        assert_eq!(sc.send("PUT", "/racks/w", Some(x), &[]).await.0, 200);
    }
    // X's slow writes hold each sidecar's barrier for 2 s.
    let delay = [(fencegate_testkit::upstream::DELAY_HEADER, "2000")];
    let slow: Vec<_> = [&cached, &lin]
        .map(|sc| {
            let sc = sc.clone();
            tokio::spawn(async move { sc.send("PUT", "/racks/w", Some(x), &delay).await })
        })
        .into();
    up.wait_for_arrivals(4, Duration::from_secs(5)).await;
    assert_eq!(raw("DELETE", &format!("{}/v1/leases/{lease_x}", c.url(1)), None).await.0, 200);
    let (a, lease_a) = take(&c, key).await;
    // A's writes pass the check (A holds the key) and wait behind X's.
    let waiting: Vec<_> = [&cached, &lin]
        .map(|sc| {
            let sc = sc.clone();
            tokio::spawn(async move { sc.send("PUT", "/racks/w", Some(a), &[]).await })
        })
        .into();
    tokio::time::sleep(Duration::from_millis(300)).await;
    relays[0].set_black_hole(true);
    assert_eq!(raw("DELETE", &format!("{}/v1/leases/{lease_a}", c.url(2)), None).await.0, 200);
    let (b, _) = take(&c, key).await;
    for s in slow {
        assert_eq!(s.await.unwrap().0, 200);
    }
    for (w, what) in waiting.into_iter().zip(["cached", "linearizable"]) {
        let (status, v) = w.await.unwrap();
        assert_refused(status, &v, b, &format!("{what}: A's write that waited at the barrier"));
    }
    assert!(!up.tokens("/racks/w").contains(&Some(a)), "A's write reached the upstream: {:?}", up.tokens("/racks/w"));
}

/// A chunked write is read whole before it is forwarded; its head passed
/// the check, then its body took a second to come while the watch went
/// silent and B was granted the key. It is decided again after the body,
/// immediately before dispatch, and refused. Fails without the check at
/// dispatch (`Fencer::dispatch` returning `Ok`: 200, and the upstream
/// applies A's write a second after B's grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_outlasts_max_staleness_is_decided_again_at_dispatch() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (c, relays, endpoints) = relayed_cluster().await;
    let up = Upstream::start().await;
    let sc = sidecar(&c, "sc", &up, &endpoints, "500ms").await;
    let (path, key) = ("/racks/c", "rack/c");
    let (a, lease) = take(&c, key).await;
    assert_eq!(sc.send("PUT", path, Some(a), &[]).await.0, 200);
    tokio::time::sleep(Duration::from_millis(400)).await;

    // Fenced requests whose check is done: the head below makes one more.
    let checked = r#"fencegate_sidecar_fence_wait_seconds_count{route="rack-writes"}"#;
    let before = fencegate_testkit::http::metric(&sc.metrics().await, checked).unwrap();
    let port: u16 = sc.url().rsplit(':').next().unwrap().parse().unwrap();
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: x\r\nx-fence-token: {a}\r\ncontent-type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{{}}\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    // The head is checked at once (A holds the key, proven within the
    // bound); the sidecar now waits for the rest of the body.
    sc.wait_for_metric(checked, before + 1.0, Duration::from_secs(5)).await;
    relays[0].set_black_hole(true);
    assert_eq!(raw("DELETE", &format!("{}/v1/leases/{lease}", c.url(2)), None).await.0, 200);
    let (b, _) = take(&c, key).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    conn.write_all(b"0\r\n\r\n").await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(15), conn.read_to_string(&mut out)).await.unwrap().unwrap();
    let status: u16 = out.split(' ').nth(1).unwrap().parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    assert_refused(status, &v, b, &format!("A's write whose body ended 1 s after B's grant ({out})"));
    assert_eq!(up.tokens(path).len(), 1, "A's late write reached the upstream");
}
