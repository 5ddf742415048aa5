//! The lock service end to end: three real `fencegate server` processes on
//! loopback, peer links through cuttable relays, SIGKILL and restart.

use std::time::Duration;

use fencegate_client::{AcquireOptions, ClientError, LostReason};
use fencegate_testkit::http::{self, raw};
use fencegate_testkit::routes::{rack_writes, table};
use fencegate_testkit::{bin, wait, Cluster, Upstream, Watch};
use serde_json::Value;
use tokio::time::Instant;

fn ttl(ms: u64) -> AcquireOptions {
    AcquireOptions::new(Duration::from_millis(ms))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_keepalive_release_and_fifo_waiters() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let client = c.client();
    let a = client.acquire("rack/1", ttl(1000).holder("a")).await.unwrap();
    assert!(a.is_valid());
    // Held: a try fails at once with the holder's name and latest token.
    match client.acquire("rack/1", ttl(1000)).await {
        Err(ClientError::Held { holder, token, .. }) => {
            assert_eq!(holder.as_deref(), Some("a"));
            assert_eq!(token, a.token());
        }
        other => panic!("expected held, got {:?}", other.map(|l| l.token())),
    }
    // Keepalives keep it past several TTLs.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(a.is_valid(), "keepalives must hold the lease past its TTL");
    assert_eq!(client.read("rack/1").await.unwrap().holder.as_deref(), Some("a"));

    // Two waiters queue in arrival order; each is seen to have joined the
    // queue (`fencegate_lock_waiters`) before the next one comes.
    let (cb, cc) = (client.clone(), client.clone());
    let b =
        tokio::spawn(async move { cb.acquire("rack/1", ttl(1000).wait(Duration::from_secs(10)).holder("b")).await });
    c.wait_for_waiters(1, Duration::from_secs(5)).await;
    let cw =
        tokio::spawn(async move { cc.acquire("rack/1", ttl(1000).wait(Duration::from_secs(10)).holder("c")).await });
    c.wait_for_waiters(2, Duration::from_secs(5)).await;
    let a_token = a.token();
    a.release().await.unwrap();
    let b = b.await.unwrap().unwrap();
    assert!(b.token() > a_token);
    assert!(!cw.is_finished(), "c queued behind b");
    let b_token = b.token();
    b.release().await.unwrap();
    let cl = cw.await.unwrap().unwrap();
    assert!(cl.token() > b_token);
    let info = client.read("rack/1").await.unwrap();
    let c_token = cl.token();
    assert_eq!((info.held, info.holder.as_deref(), info.token), (true, Some("c"), c_token));
    cl.release().await.unwrap();
    let info = client.read("rack/1").await.unwrap();
    assert!(!info.held);
    assert_eq!(info.token, c_token, "a free key still reports its latest token");
    assert_eq!(client.read("never/taken").await.unwrap().token, 0);

    // A waiter that is not served in time gets 409 held.
    let d = client.acquire("rack/2", ttl(5000)).await.unwrap();
    let started = Instant::now();
    let r = client.acquire("rack/2", ttl(1000).wait(Duration::from_millis(700))).await;
    assert!(matches!(r, Err(ClientError::Held { .. })), "{:?}", r.map(|l| l.token()));
    assert!(started.elapsed() >= Duration::from_millis(700));
    d.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expires_no_earlier_than_ttl_and_not_much_later() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let url = format!("{}/v1/locks/exp/1", c.url(1));
    let sent = Instant::now();
    let (status, body) = raw("POST", &url, Some(r#"{"ttl_ms":1500,"holder":"silent"}"#)).await;
    assert_eq!(status, 200, "{body}");
    // No keepalives: poll the linearizable read until the key is free.
    wait::until("exp/1 freed", Duration::from_secs(5), || async {
        raw("GET", &url, None).await.1["held"] == Value::Bool(false)
    })
    .await;
    let freed = sent.elapsed();
    assert!(freed >= Duration::from_millis(1500), "expired after {freed:?}, before its 1500 ms TTL");
    assert!(freed < Duration::from_millis(2500), "expired only after {freed:?}");
    // Keepalive of an expired lease: 404.
    let lease_id = body["lease_id"].as_str().unwrap();
    let (status, body) = raw("POST", &format!("{}/v1/leases/{lease_id}/keepalive", c.url(2)), None).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("lease_not_found")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_keeps_an_expired_key_ungrantable() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let url = format!("{}/v1/locks/delayed", c.url(1));
    let (status, body) = raw("POST", &url, Some(r#"{"ttl_ms":500,"lock_delay_ms":1500}"#)).await;
    assert_eq!(status, 200, "{body}");
    let sent = Instant::now();
    // Wait up to 5 s: the grant must come no earlier than ttl + lock_delay.
    let (status, body) = raw("POST", &url, Some(r#"{"ttl_ms":500,"wait_ms":5000}"#)).await;
    assert_eq!(status, 200, "{body}");
    assert!(sent.elapsed() >= Duration::from_millis(2000), "re-granted after {:?}", sent.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_crash_keeps_leases_and_tokens_rise() {
    let mut c = Cluster::start(&bin!(), 3, "").await;
    let client = c.client();
    let held = client.acquire("survivor", ttl(3000)).await.unwrap();
    let before = client.acquire("other", ttl(3000)).await.unwrap();
    let leader = c.wait_for_leader(Duration::from_secs(5)).await;
    c.kill(leader);
    let rest: Vec<u64> = c.ids().into_iter().filter(|i| *i != leader).collect();
    let new_leader = c.wait_for_leader_among(&rest, Duration::from_secs(10)).await;
    assert_ne!(new_leader, leader);
    let after = client.acquire("fresh", ttl(3000)).await.unwrap();
    assert!(after.token() > before.token() && after.token() > held.token());
    // The lease taken before the crash is still there and still kept alive.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(held.is_valid(), "lease lost across a leader change");
    let info = client.read("survivor").await.unwrap();
    assert!(info.held && info.token == held.token());
    // The old leader comes back as a follower and catches up. Its own
    // applied state, not a read (which it would forward to the leader):
    // its applied index reaches the leader's, and its watch (answered from
    // its own state) shows the grant made while it was down.
    let leader_applied = c.cluster_info(new_leader).await.unwrap().commit_index;
    c.restart(leader);
    c.wait_for_applied(leader, leader_applied, Duration::from_secs(15)).await;
    let mut watch = Watch::open(&format!("{}/v1/watch?prefix=fresh", c.url(leader))).await;
    let state = watch.next().await;
    assert_eq!(
        (state["event"].as_str(), state["key"].as_str(), state["token"].as_u64(), state["held"].as_bool()),
        (Some("state"), Some("fresh"), Some(after.token()), Some(true)),
        "the restarted node's own state: {state}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_crash_does_not_stop_the_cluster() {
    let mut c = Cluster::start(&bin!(), 3, "").await;
    let leader = c.wait_for_leader(Duration::from_secs(5)).await;
    let follower = c.ids().into_iter().find(|i| *i != leader).unwrap();
    c.kill(follower);
    let client = c.client();
    let mut last = 0;
    for i in 0..20 {
        let l = client.acquire(&format!("f/{i}"), ttl(2000)).await.unwrap();
        assert!(l.token() > last);
        last = l.token();
        l.release().await.unwrap();
    }
}

/// The leader is cut off from both followers. It must not grant or
/// acknowledge keepalives; its holders must see `lost()` before the majority
/// can hand the key to someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_leader_cannot_grant_and_its_holders_lose_in_time() {
    let c = Cluster::start(&bin!(), 3, "raft: { propose_timeout: 1s }\n").await;
    let old = c.wait_for_leader(Duration::from_secs(5)).await;
    let via_old = c.client_of(old);
    let lease = via_old.acquire("iso", ttl(2000)).await.unwrap();
    c.isolate(old, true);
    let cut_at = Instant::now();

    // From the cut on, a competitor on the majority side asks for the key,
    // as soon as a leader there can answer: the grant comes when the
    // majority is willing to hand the key out, whatever the old holder does.
    let rest: Vec<u64> = c.ids().into_iter().filter(|i| *i != old).collect();
    let majority = fencegate_client::Client::new(rest.iter().map(|i| c.url(*i)).collect()).unwrap();
    let competitor = tokio::spawn(async move {
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            match majority.acquire("iso", ttl(2000).wait(Duration::from_secs(10))).await {
                // Answered at most a few ms after the grant.
                Ok(next) => return (next, Instant::now()),
                Err(e) => assert!(Instant::now() < give_up, "the majority never granted iso: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });

    // Meanwhile (side by side, from the cut on) the old leader is asked to
    // grant, and grants nothing: 503 with Retry-After, and the client
    // library gives up with Unavailable (after its failover budget).
    let lost = async {
        let reason = tokio::time::timeout(Duration::from_secs(3), lease.lost()).await.expect("lost() did not fire");
        (reason, Instant::now())
    };
    let iso_2 = format!("{}/v1/locks/iso-2", c.url(old));
    let raw_acquire = http::raw_answer("POST", &iso_2, Some(r#"{"ttl_ms":1000}"#));
    let client_acquire = via_old.acquire("iso-3", ttl(1000));
    let ((reason, lost_at), a, client_answer) = tokio::join!(lost, raw_acquire, client_acquire);
    assert_eq!(reason, LostReason::Expired);
    assert!(lost_at - cut_at < Duration::from_millis(2000), "lost() fired {:?} after the cut", lost_at - cut_at);
    assert_eq!(a.status, 503, "{:?}", a.body);
    assert!(a.headers.contains_key("retry-after"));
    match client_answer {
        Err(ClientError::Unavailable(_)) => {}
        other => panic!("isolated leader answered {:?}", other.map(|l| l.token())),
    }
    // The majority elects a leader and, once the lease expires there (a full
    // TTL after the new leader took over, L3), grants.
    let (next, granted_at) = tokio::time::timeout(Duration::from_secs(25), competitor).await.unwrap().unwrap();
    assert!(next.token() > lease.token());
    assert!(
        lost_at < granted_at,
        "the old holder still believed it held the lock when the next grant happened ({:?} after the cut, lost after {:?})",
        granted_at - cut_at,
        lost_at - cut_at
    );
    assert!(granted_at - cut_at >= Duration::from_millis(2000), "granted {:?} after the cut", granted_at - cut_at);
    c.isolate(old, false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_continues_tokens_above_the_last() {
    // Small snapshots, so the restart restores state from a snapshot taken
    // after the leader's first entry of its term.
    let mut c = Cluster::start(&bin!(), 3, "raft: { snapshot_every: 100 }\n").await;
    let client = c.client();
    for _ in 0..120 {
        client.acquire("churn", ttl(60_000)).await.unwrap().release().await.unwrap();
    }
    let mut last = 0;
    for i in 0..5 {
        let l = client.acquire(&format!("r/{i}"), ttl(60_000)).await.unwrap();
        last = l.token();
        std::mem::forget(l); // keep it held: its keepalive task runs on
    }
    let mut applied_before = 0;
    for id in c.ids() {
        applied_before = applied_before.max(c.cluster_info(id).await.unwrap().commit_index);
    }
    for id in c.ids() {
        c.kill(id);
    }
    for id in c.ids() {
        c.restart(id);
    }
    c.wait_for_leader(Duration::from_secs(20)).await;
    // Read before anything new is written: openraft 0.9 may restore the old
    // leader without a new entry, and a read must still see every grant it
    // acknowledged before the crash (regression: the torture suite's long
    // profile saw acknowledged tokens called `unknown_token` after restarts).
    for i in 0..5 {
        let info = client.read(&format!("r/{i}")).await.unwrap();
        assert!(info.held, "state lost across restart: {info:?}");
    }
    // The leader that answered had committed an entry of its own first (the
    // old leader comes back as leader without one, which is what let reads
    // run below acknowledged entries).
    let leader = c.wait_for_leader(Duration::from_secs(5)).await;
    let applied = c.cluster_info(leader).await.unwrap().commit_index;
    assert!(
        applied > applied_before,
        "no fresh entry before serving reads: applied {applied}, before {applied_before}"
    );
    let info = client.read("r/4").await.unwrap();
    assert!(info.held && info.token == last, "state lost across restart: {info:?}");
    let l = client.acquire("after", ttl(2000)).await.unwrap();
    assert!(l.token() > last, "token {} after restart is not above {last}", l.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_is_not_granted_twice() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let body = r#"{"ttl_ms":5000,"holder":"retrier","request_id":"req-123"}"#;
    let (s1, first) = raw("POST", &format!("{}/v1/locks/dedup", c.url(1)), Some(body)).await;
    // The answer was "lost"; the client retries on another node.
    let (s2, second) = raw("POST", &format!("{}/v1/locks/dedup", c.url(2)), Some(body)).await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(first, second, "a retry must return the original grant");
    // A different request id is refused: the key is held by the first grant.
    let other = r#"{"ttl_ms":5000,"request_id":"req-456"}"#;
    let (s3, _) = raw("POST", &format!("{}/v1/locks/dedup", c.url(3)), Some(other)).await;
    assert_eq!(s3, 409);
    // Counted where commands are applied: on the leader, which applied both.
    let leader = c.wait_for_leader(Duration::from_secs(5)).await;
    let metrics = http::get_text(&format!("{}/metrics", c.url(leader))).await;
    assert!(metrics.contains("fencegate_lock_grants_total 1\n"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_answered_even_with_a_waiter_queued_on_the_key() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let url = format!("{}/v1/locks/queued", c.url(1));
    let body = r#"{"ttl_ms":5000,"holder":"retrier","request_id":"req-q"}"#;
    let (s1, first) = raw("POST", &url, Some(body)).await;
    assert_eq!(s1, 200, "{first}");
    // Someone else now waits for the key the (lost) grant holds...
    let waiter_url = url.clone();
    let waiter = tokio::spawn(async move {
        raw("POST", &waiter_url, Some(r#"{"ttl_ms":5000,"wait_ms":3000,"holder":"waiter"}"#)).await
    });
    c.wait_for_waiters(1, Duration::from_secs(5)).await;
    // ...and the retry must still get its own grant back, not "held by retrier".
    let (s2, second) = raw("POST", &url, Some(body)).await;
    assert_eq!((s2, &second), (200, &first), "a retry behind a waiter must return the original grant");
    let (s3, _) = waiter.await.unwrap();
    assert_eq!(s3, 409, "the waiter times out: the retrier still holds the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_4xx_and_changes_nothing() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let base = c.url(2);
    let leader = c.wait_for_leader(Duration::from_secs(5)).await;
    let before = c.cluster_info(leader).await.unwrap().last_log_index;
    let long_key = "k".repeat(300);
    let cases: Vec<(&str, String, Option<&str>, u16)> = vec![
        ("POST", format!("/v1/locks/{long_key}"), None, 400),
        ("POST", "/v1/locks/a//b".into(), None, 400),
        // Keys are percent-decoded once, then checked: a//b and a%2Fb.
        ("POST", "/v1/locks/a%2F%2Fb".into(), None, 400),
        ("POST", "/v1/locks/a%252Fb".into(), None, 400),
        ("POST", "/v1/locks/k".into(), Some("[1000]"), 400),
        ("POST", "/v1/locks/k".into(), Some("{not json"), 400),
        ("POST", "/v1/locks/k".into(), Some(r#"{"ttl_ms":10}"#), 400),
        ("POST", "/v1/locks/k".into(), Some(r#"{"ttl_ms":99999999999}"#), 400),
        ("POST", "/v1/locks/k".into(), Some(r#"{"ttl_ms":-5}"#), 400),
        ("POST", "/v1/locks/k".into(), Some(r#"{"wait_ms":99999999999}"#), 400),
        ("POST", "/v1/locks/k".into(), Some(r#"{"holder":""}"#), 400),
        ("POST", "/v1/locks/k".into(), Some(r#"{"request_id":"has space"}"#), 400),
        ("POST", "/v1/locks/k".into(), Some(r#"{"surprise":true}"#), 400),
        ("PUT", "/v1/locks/k".into(), None, 405),
        ("POST", "/v1/leases/nothex/keepalive".into(), None, 404),
        ("POST", "/v1/leases/00000000000000000000000000000000/keepalive".into(), None, 404),
        ("DELETE", "/v1/leases/00000000000000000000000000000000".into(), None, 404),
        ("GET", "/v1/nothing".into(), None, 404),
        ("GET", "/v1/watch?prefix=bad%20prefix".into(), None, 400),
        ("GET", "/v1/watch?after=minus1".into(), None, 400),
    ];
    for (method, path, body, want) in cases {
        let (status, answer) = raw(method, &format!("{base}{path}"), body).await;
        assert_eq!(status, want, "{method} {path} {body:?} -> {answer}");
        assert!(answer["error"].is_string(), "{method} {path}: no JSON error: {answer}");
    }
    // A body over the limit.
    let big = format!(r#"{{"holder":"{}"}}"#, "x".repeat(100_000));
    let (status, _) = raw("POST", &format!("{base}/v1/locks/k"), Some(&big)).await;
    assert_eq!(status, 413);
    let after = c.cluster_info(leader).await.unwrap().last_log_index;
    assert_eq!(before, after, "bad input wrote to the log");
    assert_eq!(c.client().read("k").await.unwrap().token, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_every_event_in_order_across_a_reconnect() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let client = c.client();
    let pre = client.acquire("w/pre", ttl(60_000)).await.unwrap();
    let mut watch = Watch::open(&format!("{}/v1/watch?prefix=w/", c.url(3))).await;
    // (After an empty state dump, a heartbeat.)
    let first = watch.next_event().await;
    // Node 3 may not have applied the grant yet when the stream starts: then
    // it comes as an event right after the (empty) state.
    let event = first["event"].as_str().unwrap();
    assert!(matches!(event, "state" | "granted") && first["key"] == "w/pre", "{first}");
    assert_eq!(first["token"].as_u64(), Some(pre.token()));
    let mut cursor = first["rev"].as_u64().unwrap();

    let mut expected = vec![];
    let a = client.acquire("w/a", ttl(60_000)).await.unwrap();
    expected.push(("granted", "w/a", a.token()));
    let t = a.token();
    a.release().await.unwrap();
    expected.push(("released", "w/a", t));
    client.acquire("x/ignored", ttl(60_000)).await.unwrap().release().await.unwrap();
    for _ in 0..2 {
        let e = watch.next_event().await;
        cursor = e["rev"].as_u64().unwrap();
        let got = (e["event"].as_str().unwrap(), e["key"].as_str().unwrap(), e["token"].as_u64().unwrap());
        assert_eq!(got, expected.remove(0));
    }
    drop(watch); // the connection goes away ...

    // ... while more happens, including an expiry.
    // Taken without the client library, so nothing keeps it alive: it expires.
    let (_, b) = raw("POST", &format!("{}/v1/locks/w/b", c.url(2)), Some(r#"{"ttl_ms":600}"#)).await;
    let b_token = b["token"].as_u64().unwrap();
    let pre_token = pre.token();
    pre.release().await.unwrap();
    let b_url = format!("{}/v1/locks/w/b", c.url(3));
    wait::until("w/b expired", Duration::from_secs(5), || async { raw("GET", &b_url, None).await.1["held"] == false })
        .await;
    let mut expected = vec![("granted", "w/b", b_token), ("released", "w/pre", pre_token), ("expired", "w/b", b_token)];

    let mut watch = Watch::open(&format!("{}/v1/watch?prefix=w/&after={cursor}", c.url(1))).await;
    while !expected.is_empty() {
        let e = watch.next_event().await;
        let got = (e["event"].as_str().unwrap(), e["key"].as_str().unwrap(), e["token"].as_u64().unwrap());
        assert_eq!(got, expected.remove(0), "resumed stream out of order or with gaps");
        assert!(e["rev"].as_u64().unwrap() > cursor);
        cursor = e["rev"].as_u64().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_bound_the_log_and_bring_a_wiped_node_back() {
    let mut c = Cluster::start(&bin!(), 3, "raft: { snapshot_every: 100 }\n").await;
    let client = c.client();
    let mut last = None;
    for i in 0..160 {
        let l = client.acquire(&format!("s/{}", i % 7), ttl(60_000)).await.unwrap();
        last = Some((format!("s/{}", i % 7), l.token()));
        l.release().await.unwrap();
    }
    let leader = c.wait_for_leader(Duration::from_secs(5)).await;
    let info = c.cluster_info(leader).await.unwrap();
    assert!(info.snapshot_index.unwrap_or(0) >= 100, "no snapshot: {info:?}");
    assert!(info.purged_index.is_some(), "log not purged: {info:?}");

    // A follower that lost its disk is rebuilt from the leader's snapshot.
    let victim = c.ids().into_iter().find(|i| *i != leader).unwrap();
    c.kill(victim);
    std::fs::remove_dir_all(c.data_dir(victim)).unwrap();
    c.restart(victim);
    let (key, token) = last.unwrap();
    // The wiped node's own applied state (a watch is served locally) must
    // reach the last grant.
    let url = format!("{}/v1/watch?prefix={key}", c.url(victim));
    wait::until_ok(
        &format!("the wiped node's own state of {key} at token {token}"),
        Duration::from_secs(15),
        || async {
            let mut watch = Watch::try_open(&url, Duration::from_secs(2)).await?;
            // Its state (at the start, or after the resync of a snapshot
            // install) or its own event stream reaching the last grant.
            let caught_up =
                |l: &Value| (l["event"] == "state" || l["event"] == "granted") && l["token"].as_u64() == Some(token);
            watch.until(Duration::from_secs(5), caught_up).await.map(drop).map_err(|seen| format!("{seen:?}"))
        },
    )
    .await;
}

/// A data directory of format 4 (the committed fixture, its log and vote in
/// `raft.redb`) has its log moved at this build's first start, once, and
/// the node reads the moved log, and what it appends after, across SIGKILLs:
/// tokens go on above the fixture's, and a sidecar running through the
/// restarts forwards the latest holder's writes and refuses the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_4_data_dir_moves_its_log_at_the_first_start_and_keeps_its_tokens() {
    let mut c = Cluster::start(&bin!(), 1, "raft: { snapshot_every: 100 }\n").await;
    c.kill(1);
    let data = c.data_dir(1);
    std::fs::remove_dir_all(&data).unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data-format-4");
    fencegate_testkit::files::copy_dir(&fixture, &data);
    c.start_node(1);
    let client = c.client();
    let opts = || ttl(60_000).wait(Duration::from_secs(10));
    let mut last = client.acquire("fixture/held", opts()).await.unwrap().token();
    assert!(last > 3, "above every token the fixture granted: {last}");
    assert!(data.join("log").is_dir() && !data.join("log.new").exists());
    assert!(c.log_of(1).contains("data format 4 upgraded to 5"), "{}", c.log_of(1));
    let up = Upstream::start().await;
    let routes = table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"])]);
    let sc = c.sidecar("sidecar", &up.url(), &routes).await;
    for round in 0..3 {
        c.restart(1);
        let lease = client.acquire(&format!("after/{round}"), opts()).await.unwrap();
        assert!(lease.token() > last, "round {round}: {} after {last}", lease.token());
        last = lease.token();
        std::mem::forget(lease);
        let (stale, latest) = c.stale_write(&sc, &format!("rack/{round}"), &format!("/racks/{round}")).await;
        assert!(stale > 3 && latest > stale, "round {round}: tokens {stale}, {latest}");
    }
}
