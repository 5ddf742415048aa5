//! The consoles (docs/decisions/0011) in a real browser: Debian's headless
//! chromium (installed by `.ci/browser`; as root, hence this tier), driven
//! by the test kit's `browser`. What tests/e2e/console.rs checks over HTTP,
//! seen as an operator sees it, under each page's Content-Security-Policy,
//! on a wide and a narrow screen: the sidecar's shows a stale write's
//! refusal live, with both tokens, without a reload; the node's lists a
//! held key with its token and shows an identity none of the keys it may
//! not read. The screenshots are kept in `target/console-screenshots/`
//! (CI artefacts).

use std::path::PathBuf;
use std::time::Duration;

use fencegate_client::AcquireOptions;
use fencegate_testkit::browser::Browser;
use fencegate_testkit::cluster::{ClusterOptions, Security};
use fencegate_testkit::routes::{rack_writes, table};
use fencegate_testkit::{bin, Cluster, Upstream};
use serde_json::{json, Value};
use tokio::time::Instant;

/// The first refusal row's cells as the page renders them, and whether
/// its reason cell is on screen, unhidden, uncovered: the cell's text, its
/// rectangle inside the viewport, and the element at its centre within it.
const REFUSAL_ROW: &str = "const row = document.querySelector('#refusals tbody tr.refused');
    if (!row) return null;
    const reason = row.cells[5];
    reason.scrollIntoView({ block: 'center' });
    const r = reason.getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return {
      cells: Array.from(row.cells, (td) => td.innerText),
      rows: document.querySelectorAll('#refusals tbody tr.refused.fresh').length,
      before: getComputedStyle(reason, '::before').content,
      on_screen: r.width > 0 && r.height > 0 && r.left >= 0 && r.top >= 0
        && r.right <= innerWidth && r.bottom <= innerHeight && reason.contains(hit),
    };";

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots")
}

/// No error in the browser's log (a script or style the policy blocked
/// would be one) but the answers with a status in `expected` (a refusal
/// the test provoked).
async fn no_errors(browser: &Browser, expected: &[u16]) {
    let log = browser.browser_log().await;
    let provoked = |e: &&Value| {
        let message = e["message"].as_str().unwrap_or("");
        e["source"] == "network" && expected.iter().any(|s| message.contains(&format!("status of {s} ")))
    };
    let severe: Vec<&Value> = log.iter().filter(|e| e["level"] == "SEVERE").filter(|e| !provoked(e)).collect();
    assert!(severe.is_empty(), "the browser logged errors: {severe:#?}");
}

/// The node's console as `ops`, who may read and watch `rack/` only: it
/// asks for a token, then lists the held `rack/1` with its holder and
/// token, shows grants live on its timeline (a key's own when picked), and
/// never shows `secret/`'s keys, held before or granted while it is open.
/// The same page as `all` lists `secret/db`: the control that the page
/// would show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_console_lists_held_keys_and_hides_what_the_identity_may_not_read() {
    let o = ClusterOptions { security: Some(Security::rack_and_every_key()), ..Default::default() };
    let c = Cluster::start_with(&bin!(), o).await;
    c.wait_for_leader(Duration::from_secs(10)).await;
    let client = c.client();
    let ttl = Duration::from_secs(60);
    let rack = client.acquire("rack/1", AcquireOptions::new(ttl).holder("drain-1")).await.unwrap();
    let _secret = client.acquire("secret/db", AcquireOptions::new(ttl).holder("db-rotation")).await.unwrap();

    let browser = Browser::start().await;
    browser.goto(&format!("{}/ui", c.url(c.ids()[0]))).await;
    browser.wait_for_text("#status", "Refused: unauthorized", Duration::from_secs(5)).await;
    browser.type_into("#token", "ops-token").await;
    browser.click("#login button[type=submit]").await;
    browser.wait_for_text("#status", "Live.", Duration::from_secs(5)).await;
    let row = browser
        .js("const row = document.querySelector('#locks tbody tr');
         return row && Array.from(row.cells, (td) => td.innerText);")
        .await;
    let row: Vec<String> = serde_json::from_value(row.clone()).unwrap_or_else(|_| panic!("no lock row: {row}"));
    assert_eq!(
        (row[0].as_str(), row[1].as_str(), row[2].as_str(), row[4].clone()),
        ("rack/1", "held", "drain-1", rack.token().to_string()),
        "key, state, holder, token: {row:?}"
    );
    browser.wait_for_text("#cluster-facts", "ready: a leader is known", Duration::from_secs(5)).await;

    // Granted while the page is open: rack/2 on its timeline, secret/new not.
    client.acquire("secret/new", AcquireOptions::new(ttl)).await.unwrap();
    let rack2 = client.acquire("rack/2", AcquireOptions::new(ttl).holder("drain-2")).await.unwrap();
    browser.wait_for_text("#timeline tbody", "rack/2", Duration::from_secs(2)).await;
    browser.wait_for_text("#locks tbody", "drain-2", Duration::from_secs(3)).await;
    let text = browser.js("return document.body.innerText").await;
    assert!(!text.as_str().unwrap().contains("secret"), "ops sees a secret/ key: {text}");
    // One key's timeline.
    browser.click("#locks tbody tr:nth-child(2) button.key").await;
    browser.wait_for_text("#timeline-of", "rack/2", Duration::from_secs(2)).await;
    let shown = browser
        .js("return Array.from(document.querySelectorAll('#timeline tbody tr'), (r) => r.cells[1].innerText)")
        .await;
    assert_eq!(shown, json!(["rack/2"]), "rack/2's timeline: {shown}");
    let granted = browser.js("return document.querySelector('#timeline tbody tr').cells[3].innerText").await;
    assert_eq!(granted, json!(rack2.token().to_string()));
    browser.screenshot(screenshots().join("node.png")).await;
    browser.set_viewport(390, 844).await;
    let width = browser.js("return document.documentElement.scrollWidth").await;
    assert!(width.as_u64().is_some_and(|w| w <= 390), "no sideways scrolling at 390 px: {width}");
    browser.screenshot(screenshots().join("node-narrow.png")).await;
    no_errors(&browser, &[401]).await;

    // The control: an identity that may read secret/ sees it on the same page.
    browser.js("sessionStorage.setItem('fencegate-token', 'all-token'); location.reload()").await;
    browser.wait_for_text("#locks tbody", "secret/db", Duration::from_secs(5)).await;
}

/// A stale write through the sidecar shows in the console open in a
/// browser within 2 s, with the key, the token presented (A's) and the
/// current one (B's), and says it was refused in text; the page does not
/// reload for it, and logs no error (a blocked script or style would be
/// one). At 390 px wide the refusal still reads as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_console_shows_a_refusal_live_in_a_browser() {
    let shots = screenshots();
    let c = Cluster::start(&bin!(), 3, "").await;
    let up = Upstream::start().await;
    let sc = c.sidecar("sc", &up.url(), &table(&[rack_writes("{ mode: strict, consistency: cached }")])).await;
    let admin_token = std::fs::read_to_string(sc.dir.join("state/admin-token")).unwrap().trim().to_string();

    let browser = Browser::start().await;
    browser.goto(&format!("http://127.0.0.1:{}/console", sc.metrics_port)).await;
    browser.type_into("#token", &admin_token).await;
    browser.click("#login button[type=submit]").await;
    browser.wait_for_text("#routes tbody", "rack-writes", Duration::from_secs(5)).await;
    // The feed is open (the sidecar subscribed it) before the write.
    browser.wait_for_text("#status", "Live.", Duration::from_secs(5)).await;
    browser.js("window.__noReload = 1").await;

    let (ta, tb) = c.stale_write(&sc, "rack/7", "/racks/7").await;
    let refused = Instant::now();

    browser.wait_for_text("#refusals tbody tr.refused.fresh", "stale_token", Duration::from_secs(2)).await;
    eprintln!("the refusal showed {:?} after the 409", refused.elapsed());
    let row = browser.js(REFUSAL_ROW).await;
    let cells = |v: &Value| v["cells"].as_array().map(|c| c[1..].to_vec()).unwrap_or_default();
    let shown =
        [json!("rack-writes"), json!("rack/7"), json!(ta.to_string()), json!(tb.to_string()), json!("stale_token")];
    assert_eq!(cells(&row), shown, "route, key, presented, current, reason: {row}");
    assert_eq!(
        (&row["rows"], &row["before"]),
        (&json!(1), &json!("\"refused: \"")),
        "one fresh row, its reason styled: {row}"
    );
    assert_eq!(browser.js("return window.__noReload").await, json!(1), "the page reloaded");
    // The key's timeline, drawn from what the sidecar lived: B's first
    // write forwarded, then A's refused, each in its lane and in words.
    browser.click("#refusals tbody tr.refused button.key").await;
    browser.wait_for_text("#timeline-of", "rack/7", Duration::from_secs(2)).await;
    let lanes = browser
        .js("return Array.from(document.querySelectorAll('#timeline tbody tr'), (r) => r.cells[2].innerText).filter((t) => t)")
        .await;
    let sidecar = [
        format!("first write with token {tb} forwarded"),
        format!("write with token {ta} REFUSED: stale_token (current {tb})"),
    ];
    assert_eq!(lanes, json!(sidecar), "the sidecar's lane: {lanes}");
    browser.wait_for_text("#timeline tbody", &format!("grants token {tb}"), Duration::from_secs(1)).await;
    browser.screenshot(shots.join("sidecar.png")).await;

    browser.set_viewport(390, 844).await;
    let narrow = browser.js(REFUSAL_ROW).await;
    assert_eq!(cells(&narrow), shown, "at 390 px: {narrow}");
    assert_eq!(narrow["on_screen"], true, "at 390 px the reason is on screen, uncovered: {narrow}");
    let width = browser.js("return document.documentElement.scrollWidth").await;
    assert!(width.as_u64().is_some_and(|w| w <= 390), "no sideways scrolling at 390 px: {width}");
    // What else the page shows is refreshed: B's floor, raised by its write.
    browser.wait_for_text("#floors tbody", "rack/7", Duration::from_secs(7)).await;
    browser.screenshot(shots.join("sidecar-narrow.png")).await;
    no_errors(&browser, &[]).await;
}

/// A process's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    rss.trim().trim_end_matches(" kB").trim().parse().unwrap()
}

/// Both consoles left open with a steady load, each beside a twin without
/// one: a follower with the node's page open against the other follower
/// (both apply the same log), a sidecar with its page open against a
/// second sidecar taking the same writes. Memory sampled every 30 s; the
/// pages' rows counted (the node page's timeline keeps its latest 500: it
/// grew by a row per event, ~1,260 after a minute, before it was bounded). The cost of an open page is the
/// difference between the twins' growth. Run by hand:
/// `CONSOLE_SOAK_SECONDS=600 cargo test --features faults --test faults -- --ignored --nocapture console::soak`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a 10-minute measurement, run by hand"]
async fn soak_an_open_page_keeps_memory_flat() {
    let seconds: u64 = std::env::var("CONSOLE_SOAK_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    let c = Cluster::start(&bin!(), 3, "").await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let followers: Vec<u64> = c.ids().into_iter().filter(|id| *id != leader).collect();
    let (watched, twin) = (followers[0], followers[1]);
    let up = Upstream::start().await;
    let routes = table(&[rack_writes("{ mode: strict, consistency: cached }")]);
    let (sc, sc_twin) = (c.sidecar("sc", &up.url(), &routes).await, c.sidecar("twin", &up.url(), &routes).await);
    let admin_token = std::fs::read_to_string(sc.dir.join("state/admin-token")).unwrap().trim().to_string();

    let browser = Browser::start().await;
    browser.goto(&format!("{}/ui", c.url(watched))).await;
    browser.wait_for_text("#status", "Live.", Duration::from_secs(5)).await;
    let node_tab = browser.tab().await;
    let sidecar_tab = browser.new_tab().await;
    browser.goto(&format!("http://127.0.0.1:{}/console", sc.metrics_port)).await;
    browser.type_into("#token", &admin_token).await;
    browser.click("#login button[type=submit]").await;
    browser.wait_for_text("#status", "Live.", Duration::from_secs(5)).await;

    // The load: every 100 ms a grant and its release on one of 50 keys;
    // every second a write forwarded and a stale one refused, through both
    // sidecars (B's token, then A's).
    let load = tokio::spawn({
        let (client, sidecars) = (c.client(), [sc.port, sc_twin.port]);
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for i in 0u64.. {
                tick.tick().await;
                let key = format!("rack/{}", i % 50);
                let lease = client.acquire(&key, AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
                if i % 10 == 0 {
                    for port in sidecars {
                        for token in [lease.token(), lease.token() - 1] {
                            let url = format!("http://127.0.0.1:{port}/racks/{}", i % 50);
                            fencegate_testkit::http::send(
                                fencegate_testkit::http::fenced_put(url, token),
                                Duration::from_secs(5),
                            )
                            .await;
                        }
                    }
                }
                lease.release().await.unwrap();
            }
        }
    });
    let pids = [("node, page open", c.pid(watched)), ("node, no page", c.pid(twin))];
    let pids = pids
        .into_iter()
        .chain([("sidecar, page open", sc.pid().unwrap()), ("sidecar, no page", sc_twin.pid().unwrap())]);
    let pids: Vec<(&str, u32)> = pids.collect();
    let rows = "return document.querySelectorAll('tr').length";
    let mut samples = vec![];
    let start = Instant::now();
    let node_rows = loop {
        browser.switch_to(&node_tab).await;
        let node_rows = browser.js(rows).await;
        browser.switch_to(&sidecar_tab).await;
        let sidecar_rows = browser.js(rows).await;
        let rss: Vec<u64> = pids.iter().map(|(_, pid)| rss_kib(*pid)).collect();
        eprintln!(
            "[{:>4} s] RSS KiB {rss:?}; rows: node page {node_rows}, sidecar page {sidecar_rows}",
            start.elapsed().as_secs()
        );
        samples.push(rss);
        if start.elapsed() >= Duration::from_secs(seconds) {
            break node_rows;
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    };
    load.abort();
    // From the first minute on (allocators and rings warm up first).
    let from = samples.len().min(3) - 1;
    for (i, (name, _)) in pids.iter().enumerate() {
        let grew = samples.last().unwrap()[i] as i64 - samples[from][i] as i64;
        eprintln!(
            "{name}: {} KiB at {} s, {} KiB at the end ({grew:+} KiB)",
            samples[from][i],
            from * 30,
            samples.last().unwrap()[i]
        );
    }
    let growth = |i: usize| samples.last().unwrap()[i] as i64 - samples[from][i] as i64;
    for (open, closed) in [(0, 1), (2, 3)] {
        let cost = growth(open) - growth(closed);
        assert!(cost < 8 << 10, "{}: grew {cost} KiB more than its twin", pids[open].0);
    }
    // The node page keeps 500 events and lists 50 keys (and headers).
    assert!(node_rows.as_u64().is_some_and(|n| n <= 560), "the node page's rows grew: {node_rows}");
    // The node page keeps 500 events and lists 50 keys (and headers).
    assert!(node_rows.as_u64().is_some_and(|n| n <= 560), "the node page's rows grew: {node_rows}");
    no_errors(&browser, &[]).await;
}
