//! The sidecar's console (docs/decisions/0011) over HTTP: its page under a
//! strict Content-Security-Policy, its data only with the admin token, and
//! a stale write's refusal in its live feed with both tokens. (A real
//! browser is not driven yet: docs/decisions/0011.)

use std::time::Duration;

use fencegate_client::http::{HttpClient, LineReader};
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

    let event = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            let line = lines.next_line(64 << 10).await.unwrap().expect("the feed stays open");
            if let Some(data) = line.strip_prefix(b"data: ") {
                return serde_json::from_slice::<Value>(data).unwrap();
            }
        }
    })
    .await
    .expect("the refusal in the feed within 2 s");
    let fields = |v: &Value| (v["key"].clone(), v["presented"].as_u64(), v["current"].as_u64(), v["reason"].clone());
    assert_eq!(fields(&event), ("rack/7".into(), Some(ta), Some(tb), "stale_token".into()), "{event}");
    let (status, state) =
        send(request("GET", &format!("{console}/state"), None, &admin, ""), Duration::from_secs(5)).await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(fields(&state["refusals"][0]), fields(&event), "{state}");
    assert_eq!(state["routes"][0]["fence"], "strict, cached", "{state}");
    assert_eq!(state["lock_service"]["up"], true, "{state}");
    assert_eq!(state["floors"]["keys"], 1, "{state}");
    assert_eq!(
        (state["floors"]["first"][0]["key"].as_str(), state["floors"]["first"][0]["floor"].as_u64()),
        (Some("rack/7"), Some(tb)),
        "{state}"
    );
}
