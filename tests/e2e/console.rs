//! The consoles (docs/decisions/0011) over HTTP (tests/faults/console.rs
//! drives them in a real browser). The sidecar's: its page under a strict
//! Content-Security-Policy, its data only with the admin token, a stale
//! write's refusal in its live feed with both tokens. The node's: its page
//! for anyone, its data the Lock API's, so that the ACL filters it — the
//! lock table (`GET /v1/locks`) lists only the keys an identity may read.

use std::time::Duration;

use fencegate_client::http::{HttpClient, LineReader};
use fencegate_client::AcquireOptions;
use fencegate_testkit::cluster::{ClusterOptions, Security};
use fencegate_testkit::http::{request, send};
use fencegate_testkit::routes::{rack_writes, table};
use fencegate_testkit::{bin, Cluster, Upstream};
use serde_json::Value;

/// A stale write through the sidecar shows in its console: at once in the
/// live feed, with the token presented and the current one, and in the
/// state a page loads first. Without the admin token, neither; the page
/// itself holds no data and forbids every script but its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_shows_in_the_sidecar_console_with_both_tokens() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let sc = c.sidecar("sc", &up.url(), &table(&[rack_writes("{ mode: strict, consistency: cached }")])).await;
    let console = format!("http://127.0.0.1:{}/console", sc.metrics_port);
    let token = std::fs::read_to_string(sc.dir.join("state/admin-token")).unwrap();
    let bearer = format!("Bearer {}", token.trim());
    let admin = [("authorization", bearer.as_str())];

    let page = HttpClient::new(1 << 20).call(hyper::Method::GET, &console, None, Duration::from_secs(5)).await.unwrap();
    let policy = page.headers.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or("");
    assert!(page.status == 200 && policy.starts_with("default-src 'none'; script-src 'self';"), "{policy}");
    assert!(String::from_utf8_lossy(&page.body).contains("/console/app.js"));
    for (what, headers) in [("no token", &[][..]), ("a wrong token", &[("authorization", "Bearer fga_no")][..])] {
        let (status, v) =
            send(request("GET", &format!("{console}/state"), None, headers, ""), Duration::from_secs(5)).await;
        assert_eq!(status, 401, "{what}: {v}");
    }
    let (status, _) =
        send(request("POST", &format!("{console}/state"), None, &admin, ""), Duration::from_secs(5)).await;
    assert_eq!(status, 405, "the console only reads");

    let mut req = request("GET", &format!("{console}/events"), None, &admin, "");
    req.headers_mut().remove("x-fence-token");
    let feed = HttpClient::new(1 << 20).stream(req, Duration::from_secs(5)).await.unwrap();
    assert_eq!(feed.headers()["content-type"], "text/event-stream");
    let mut lines = LineReader::new(feed.into_body());

    let (ta, tb) = c.stale_write(&sc, "rack/7", "/racks/7").await;

    // The seed's sequence as the sidecar lived it: A's grant and its end,
    // learnt from the lock service; B's grant; B's first write forwarded;
    // A's write refused. All in the feed as they happen, the refusal
    // within 2 s. (Had B's write been read about before the watch told of
    // A, A's grant was never learnt: the sequence starts at B's.)
    let mut fed = vec![];
    tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            let line = lines.next_line(64 << 10).await.unwrap().expect("the feed stays open");
            if let Some(data) = line.strip_prefix(b"data: ") {
                fed.push(serde_json::from_slice::<Value>(data).unwrap());
                if fed.last().unwrap()["event"] == "refused" {
                    return;
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the refusal in the feed within 2 s: {fed:?}"));
    let event = fed.last().unwrap().clone();
    let fields = |v: &Value| (v["key"].clone(), v["presented"].as_u64(), v["current"].as_u64(), v["reason"].clone());
    assert_eq!(fields(&event), ("rack/7".into(), Some(ta), Some(tb), "stale_token".into()), "{event}");
    let seed = [("granted", ta), ("ended", ta), ("granted", tb), ("forwarded", tb), ("refused", ta)];
    let told: Vec<(&str, u64)> = fed
        .iter()
        .map(|e| (e["event"].as_str().unwrap(), e["token"].as_u64().or(e["presented"].as_u64()).unwrap()))
        .collect();
    assert!(told == seed || told == seed[2..], "{fed:?}");
    assert!(fed.iter().all(|e| e["key"] == "rack/7"), "{fed:?}");
    let (status, state) =
        send(request("GET", &format!("{console}/state"), None, &admin, ""), Duration::from_secs(5)).await;
    assert_eq!(status, 200, "{state}");
    let mut kept: Vec<Value> = state["timeline"].as_array().unwrap().clone();
    kept.reverse();
    assert_eq!(kept, fed, "the state keeps what the feed told, latest first");
    assert_eq!(state["routes"][0]["fence"], "strict, cached", "{state}");
    assert_eq!(state["lock_service"]["up"], true, "{state}");
    assert_eq!(state["floors"]["keys"], 1, "{state}");
    assert_eq!(
        (state["floors"]["first"][0]["key"].as_str(), state["floors"]["first"][0]["floor"].as_u64()),
        (Some("rack/7"), Some(tb)),
        "{state}"
    );
}

/// The lock table a console lists: every key an identity may read, with
/// its holder, owner, token, time left, TTL, lock-delay and waiters, from
/// any node (a follower forwards it with the identity); none it may not
/// read, not even counted; a prefix it may read nothing under is refused,
/// as is a caller without credentials, and a request a browser sends for
/// another site. The page itself needs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_table_lists_only_the_keys_an_identity_may_read() {
    let o = ClusterOptions { security: Some(Security::rack_and_every_key()), ..Default::default() };
    let c = Cluster::start_with(&bin!(), o).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let client = c.client();
    let ttl = Duration::from_secs(30);
    let rack =
        client.acquire("rack/1", AcquireOptions::new(ttl).holder("drain-1").lock_delay(Duration::ZERO)).await.unwrap();
    let secret = client.acquire("secret/db", AcquireOptions::new(ttl)).await.unwrap();
    // A waiter on rack/1, parked on the leader.
    let waiter = tokio::spawn({
        let client = c.client();
        async move { client.acquire("rack/1", AcquireOptions::new(ttl).wait(Duration::from_secs(20))).await }
    });
    c.wait_for_waiters(1, Duration::from_secs(5)).await;

    let list = |node: u64, token: Option<&'static str>, query: &'static str| {
        let url = format!("{}/v1/locks{query}", c.url(node));
        let bearer = token.map(|t| format!("Bearer {t}"));
        async move {
            let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
            let mut req = request("GET", &url, None, &headers, "");
            req.headers_mut().remove("x-fence-token");
            send(req, Duration::from_secs(5)).await
        }
    };
    let follower = c.ids().into_iter().find(|id| *id != leader).unwrap();
    for node in [leader, follower] {
        let (status, all) = list(node, Some("all-token"), "").await;
        assert_eq!(status, 200, "node {node}: {all}");
        let keys: Vec<&str> = all["locks"].as_array().unwrap().iter().map(|l| l["key"].as_str().unwrap()).collect();
        assert_eq!(keys, ["rack/1", "secret/db"], "node {node}: {all}");
        let row = &all["locks"][0];
        assert_eq!(
            (&row["held"], &row["holder"], &row["owner"], row["token"].as_u64(), &row["waiters"]),
            (
                &true.into(),
                &"drain-1".into(),
                &fencegate_testkit::cluster::KIT_IDENTITY.into(),
                Some(rack.token()),
                &1.into()
            ),
            "node {node}: {row}"
        );
        let left = row["expires_in_ms"].as_u64().unwrap();
        assert!(left > 20_000 && left <= 30_000, "node {node}: time left {left} ms");
        assert_eq!(
            (&row["ttl_ms"], &row["lock_delay_ms"], &row["delay_left_ms"]),
            (&30_000.into(), &0.into(), &Value::Null)
        );
        assert_eq!(all["locks"][1]["token"].as_u64(), Some(secret.token()), "{all}");

        let (status, ops) = list(node, Some("ops-token"), "").await;
        assert_eq!(status, 200, "node {node}: {ops}");
        assert_eq!(ops["locks"].as_array().unwrap().len(), 1, "secret/db is not ops': {ops}");
        assert_eq!((&ops["locks"][0]["key"], &ops["truncated"]), (&"rack/1".into(), &false.into()), "{ops}");
        assert!(!ops.to_string().contains("secret"), "{ops}");
        let (status, refused) = list(node, Some("ops-token"), "?prefix=secret%2F").await;
        assert_eq!((status, &refused["error"]), (403, &"forbidden".into()), "{refused}");
        let (status, refused) = list(node, None, "").await;
        assert_eq!((status, &refused["error"]), (401, &"unauthorized".into()), "{refused}");
        let (status, first) = list(node, Some("all-token"), "?limit=1").await;
        assert_eq!(
            (status, first["locks"].as_array().unwrap().len(), &first["truncated"]),
            (200, 1, &true.into()),
            "{first}"
        );
        let (status, bad) = list(node, Some("all-token"), "?limit=0").await;
        assert_eq!((status, &bad["error"]), (400, &"bad_request".into()), "{bad}");
    }

    // A browser's write, or a request another site made a browser send,
    // is refused before anything is asked: a page elsewhere cannot take a
    // lock with the operator's credentials (its client certificate).
    for (method, path, header) in [
        ("POST", "/v1/locks/rack/9", ("origin", "https://elsewhere.example")),
        ("DELETE", "/v1/leases/00000000000000000000000000000000", ("origin", "null")),
        ("GET", "/v1/locks", ("sec-fetch-site", "cross-site")),
    ] {
        let headers = [("authorization", "Bearer all-token"), header];
        let mut req = request(method, &format!("{}{path}", c.url(leader)), None, &headers, "");
        req.headers_mut().remove("x-fence-token");
        let (status, v) = send(req, Duration::from_secs(5)).await;
        assert_eq!((status, &v["error"]), (403, &"forbidden".into()), "{method} {path} with {header:?}: {v}");
    }
    let (status, table) = list(leader, Some("all-token"), "?prefix=rack%2F9").await;
    assert_eq!((status, table["locks"].as_array().map(Vec::len)), (200, Some(0)), "nothing granted: {table}");
    let mut same = request(
        "GET",
        &format!("{}/v1/locks", c.url(leader)),
        None,
        &[("authorization", "Bearer all-token"), ("sec-fetch-site", "same-origin")],
        "",
    );
    same.headers_mut().remove("x-fence-token");
    assert_eq!(send(same, Duration::from_secs(5)).await.0, 200, "the console's own requests");

    // The page and its scripts hold no data: served without credentials,
    // under the policy; nothing else is under /ui.
    let http = HttpClient::new(1 << 20);
    let page =
        http.call(hyper::Method::GET, &format!("{}/ui", c.url(leader)), None, Duration::from_secs(5)).await.unwrap();
    let policy = page.headers.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or("");
    assert!(page.status == 200 && policy.starts_with("default-src 'none'; script-src 'self';"), "{policy}");
    assert!(String::from_utf8_lossy(&page.body).contains("/ui/app.js"));
    for (method, path, status) in [("GET", "/ui/app.js", 200), ("GET", "/ui/secret", 404), ("POST", "/ui", 405)] {
        let mut req = request(method, &format!("{}{path}", c.url(leader)), None, &[], "");
        req.headers_mut().remove("x-fence-token");
        let got = HttpClient::new(1 << 20).send(req, Duration::from_secs(5)).await.unwrap().status;
        assert_eq!(got.as_u16(), status, "{method} {path}");
    }
    rack.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}
