//! Every Lock API answer of a real node, decoded with the client's wire
//! types: a single-node cluster in this process, on 127.0.0.1:0.

use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_client::wire::{self, ApiError, ErrorCode, KeepaliveAck, Released, WatchLine};
use fencegate_client::{AcquireOptions, Client, ClientError};
use hyper::{Method, StatusCode};

use super::*;
use crate::config::{parse_yaml, ConfigFile};

struct OneNode {
    url: String,
    peer_url: String,
    node: Arc<Node>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
}

async fn one_node(dir: &std::path::Path) -> OneNode {
    one_node_with(dir, "").await
}

/// A `peer_secret_file` line, its file (mode 0600) in `dir`: what a node
/// whose clients authenticate needs on a plaintext peer plane.
fn peer_secret(dir: &std::path::Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let file = dir.join("peer-secret");
    std::fs::write(&file, "s".repeat(crate::auth::MIN_PEER_SECRET)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    format!("peer_secret_file: {}\n", file.display())
}

/// `extra` is appended to the node's config.
async fn one_node_with(dir: &std::path::Path, extra: &str) -> OneNode {
    let listeners = Listeners {
        client: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        peer: TcpListener::bind("127.0.0.1:0").await.unwrap(),
    };
    let (addr, peer) = (listeners.client.local_addr().unwrap(), listeners.peer.local_addr().unwrap());
    let yaml = format!(
        "id: 1\nlisten: {addr}\npeer_listen: {peer}\ndata_dir: {}\npeers:\n  1: http://{peer}\nclients:\n  1: http://{addr}\n{extra}",
        dir.display()
    );
    let config = parse_yaml::<NodeConfig>(&yaml).unwrap().validate().unwrap();
    let node = Node::start(config).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listeners, node.clone(), async move {
        let _ = stopped.await;
    }));
    OneNode { url: format!("http://{addr}"), peer_url: format!("http://{peer}"), node, stop, server }
}

fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> T {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_decodes_with_the_wire_types() {
    let dir = tempfile::tempdir().unwrap();
    let OneNode { url, node, stop, .. } = one_node(dir.path()).await;
    let client = Client::new(vec![url.clone()]).unwrap();
    let http = HttpClient::new(1 << 20);
    let t = Duration::from_secs(5);

    // Granted, LockInfo, the held refusal and ClusterInfo, through the client.
    let lease = client.acquire("wire/k", AcquireOptions::new(Duration::from_secs(5)).holder("a")).await.unwrap();
    let info = client.read("wire/k").await.unwrap();
    assert!(info.held && info.token == lease.token() && info.holder.as_deref() == Some("a"), "{info:?}");
    assert!(info.expires_in_ms.is_some_and(|ms| ms <= 5000));
    match client.acquire("wire/k", AcquireOptions::new(Duration::from_secs(1))).await {
        Err(ClientError::Held { key, holder, token, lock_delay }) => {
            assert_eq!(
                (key.as_str(), holder.as_deref(), token, lock_delay),
                ("wire/k", Some("a"), lease.token(), false)
            )
        }
        other => panic!("expected held, got {:?}", other.map(|l| l.token())),
    }
    let c = client.cluster().await.unwrap();
    assert_eq!((c.id, c.leader, c.state.as_str()), (1, Some(1), "Leader"));
    assert_eq!(c.members, vec![wire::Member { id: 1, url: Some(url.clone()) }]);
    assert!(c.term > 0 && c.commit_index > 0 && c.last_log_index >= c.commit_index, "{c:?}");

    // KeepaliveAck, raw.
    let keepalive = format!("{url}{}{}/keepalive", wire::LEASES_PATH, lease.lease_id());
    let a = http.call(Method::POST, &keepalive, None, t).await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(decode::<KeepaliveAck>(&a.body), KeepaliveAck { ttl_ms: 5000 });

    // The watch stream's first line: the state of the key.
    let watch = format!("{url}{}?prefix=wire/", wire::WATCH_PATH);
    let mut lines = fencegate_client::http::LineReader::new(http.open(&watch, t).await.unwrap().into_body());
    let first = tokio::time::timeout(t, lines.next_line(1 << 16)).await.unwrap().unwrap().unwrap();
    match decode::<WatchLine>(&first) {
        WatchLine::State { key, held: true, token, holder: Some(h), .. } => {
            assert_eq!((key.as_str(), token, h.as_str()), ("wire/k", lease.token(), "a"))
        }
        other => panic!("{other:?}"),
    }

    // Released, then the refusals: lease_not_found, bad_request, not_found.
    let release = format!("{url}{}{}", wire::LEASES_PATH, lease.lease_id());
    let token = lease.token();
    drop(lease);
    let a = http.call(Method::DELETE, &release, None, t).await.unwrap();
    assert_eq!(decode::<Released>(&a.body), Released { key: "wire/k".into(), token, released: true });
    let log = client.cluster().await.unwrap().last_log_index;
    let a = http.call(Method::DELETE, &release, None, t).await.unwrap();
    let e: ApiError = decode(&a.body);
    assert_eq!((a.status, e.error), (StatusCode::NOT_FOUND, ErrorCode::LeaseNotFound));
    let guessed = format!("{url}{}{}", wire::LEASES_PATH, "0".repeat(32));
    assert_eq!(http.call(Method::DELETE, &guessed, None, t).await.unwrap().status, StatusCode::NOT_FOUND);
    let after = client.cluster().await.unwrap().last_log_index;
    assert_eq!(after, log, "a replayed or guessed lease id writes nothing to the log");
    assert_eq!(e.error.status(), a.status, "the status is the one the wire code names");
    let acquire = format!("{url}{}wire/x", wire::LOCKS_PATH);
    let a = http.call(Method::POST, &acquire, Some(br#"{"ttl":1}"#.to_vec()), t).await.unwrap();
    let e: ApiError = decode(&a.body);
    assert_eq!((a.status, e.error), (StatusCode::BAD_REQUEST, ErrorCode::BadRequest));
    assert!(e.message.is_some_and(|m| m.contains("ttl")), "the message names the unknown field");
    let a = http.call(Method::GET, &format!("{url}/v2/nothing"), None, t).await.unwrap();
    assert_eq!((a.status, decode::<ApiError>(&a.body).error), (StatusCode::NOT_FOUND, ErrorCode::NotFound));

    let _ = stop.send(());
    node.shutdown().await;
}

/// Watch streams and parked acquires never finish by themselves: stopping
/// must end them, or every shutdown would wait out the whole drain while
/// this node stays leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_ends_watch_streams_and_parked_acquires_so_the_drain_is_quick() {
    let dir = tempfile::tempdir().unwrap();
    let n = one_node(dir.path()).await;
    let client = Client::new(vec![n.url.clone()]).unwrap();
    let _holder = client.acquire("stop/k", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    let http = HttpClient::new(1 << 20);
    let watch = format!("{}{}?prefix=stop/", n.url, wire::WATCH_PATH);
    let mut lines =
        fencegate_client::http::LineReader::new(http.open(&watch, Duration::from_secs(5)).await.unwrap().into_body());
    lines.next_line(1 << 16).await.unwrap().expect("the state line");
    lines.next_line(1 << 16).await.unwrap().expect("the heartbeat that ends the dump");
    let waiting = {
        let (http, url) = (http.clone(), format!("{}{}stop/k", n.url, wire::LOCKS_PATH));
        tokio::spawn(async move {
            http.call(Method::POST, &url, Some(br#"{"wait_ms":60000}"#.to_vec()), Duration::from_secs(60)).await
        })
    };
    // Wait (bounded) until the acquire is parked: a probe is no longer first in line.
    for _ in 0..500 {
        let probe = n.node.waitlist.join("stop/k");
        if !n.node.waitlist.is_head(&probe) {
            break;
        }
        drop(probe);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = tokio::time::Instant::now();
    n.node.stop_serving();
    let _ = n.stop.send(());
    tokio::time::timeout(Duration::from_secs(3), n.server)
        .await
        .expect("drained well before the 5 s deadline")
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), lines.next_line(1 << 16)).await.unwrap().unwrap(),
        None,
        "the stream ended"
    );
    let parked = waiting.await.unwrap().unwrap();
    assert_eq!(parked.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(decode::<ApiError>(&parked.body).error, ErrorCode::NoLeader);
    n.node.shutdown().await;
}

/// A request head that announces a body and sends one byte of it is
/// answered 408 after `limits.body_timeout`, and the connection is closed:
/// it cannot hold the node forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let n = one_node_with(dir.path(), "limits: { body_timeout: 300ms }\n").await;
    let addr = n.url.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = "POST /v1/locks/slow/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{";
    slow.write_all(head.as_bytes()).await.unwrap();
    let t = tokio::time::Instant::now();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), slow.read_to_string(&mut answer))
        .await
        .expect("answered and closed, not held open")
        .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300), "not before the timeout");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    let client = Client::new(vec![n.url.clone()]).unwrap();
    assert_eq!(client.read("slow/k").await.unwrap().token, 0, "nothing was proposed");
    let _ = n.stop.send(());
    n.node.shutdown().await;
}

/// Quotas: beyond `max_leases_per_identity` or `max_keys`, 429 and nothing
/// proposed; a key that is already in the table needs no new room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_refuse_with_429_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let n = one_node_with(dir.path(), "limits: { max_keys: 3, max_leases_per_identity: 2 }\n").await;
    let client = Client::new(vec![n.url.clone()]).unwrap();
    let opts = || AcquireOptions::new(Duration::from_secs(30));
    let a = client.acquire("q/a", opts()).await.unwrap();
    let _b = client.acquire("q/b", opts()).await.unwrap();
    let quota = |r: Result<fencegate_client::Lease, ClientError>| match r {
        Err(ClientError::Refused { status, error, .. }) => (status.as_u16(), error),
        Err(e) => panic!("{e}"),
        Ok(l) => panic!("granted {}", l.token()),
    };
    let revision = || n.node.applied.lock().locks.revision();
    let before = revision();
    assert_eq!(quota(client.acquire("q/c", opts()).await), (429, ErrorCode::QuotaExceeded), "a third lease");
    a.release().await.unwrap();
    let c = client.acquire("q/c", opts()).await.unwrap();
    assert_eq!(c.token(), before + 2, "the refusal took no revision");
    c.release().await.unwrap();
    assert_eq!(quota(client.acquire("q/d", opts()).await), (429, ErrorCode::QuotaExceeded), "a fourth key");
    client.acquire("q/a", opts()).await.expect("a key in the table needs no room");
    let _ = n.stop.send(());
    n.node.shutdown().await;
}

/// While a handover pauses proposals, an acquire is refused 503 saying
/// that nothing was proposed (a retry is safe), and the log does not grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_proposer_refuses_and_says_nothing_was_proposed() {
    let dir = tempfile::tempdir().unwrap();
    let n = one_node(dir.path()).await;
    let http = HttpClient::new(1 << 20);
    let acquire = format!("{}{}pause/k", n.url, wire::LOCKS_PATH);
    let body = br#"{"ttl_ms": 5000}"#.to_vec();
    let t = Duration::from_secs(5);
    // The client waits for the node to lead.
    let client = Client::new(vec![n.url.clone()]).unwrap();
    client.acquire("pause/k", AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
    let log = || n.node.raft.metrics().borrow().last_log_index;
    {
        let _paused = n.node.proposer.pause();
        // A proposal of the node's own (the keeper's) may have gone out
        // before the pause: the log stops growing once it has landed.
        while !n.node.proposer.idle() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let before = log();
        let a = http.call(Method::POST, &format!("{acquire}2"), Some(body.clone()), t).await.unwrap();
        let e: ApiError = decode(&a.body);
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", e.message);
        let message = e.message.unwrap_or_default();
        assert!(message.contains("nothing was proposed"), "{message}");
        assert_eq!(log(), before, "nothing appended");
    }
    assert_eq!(http.call(Method::POST, &format!("{acquire}2"), Some(body), t).await.unwrap().status, StatusCode::OK);
    let _ = n.stop.send(());
    n.node.shutdown().await;
}

/// A keep-alive connection that goes quiet after its answer is closed after
/// `limits.header_timeout`, and so is one that never sends anything: idle
/// connections cannot pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let n = one_node_with(dir.path(), "limits: { header_timeout: 300ms }\n").await;
    let addr = n.url.trim_start_matches("http://").to_string();
    let mut used = tokio::net::TcpStream::connect(&addr).await.unwrap();
    used.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let got = used.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..got]).starts_with("HTTP/1.1 200"), "answered, kept alive");
    let silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let t = tokio::time::Instant::now();
    for (what, mut conn) in [("after an answer", used), ("without a request", silent)] {
        let closed = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "idle {what}: still open after 5 s ({closed:?})");
    }
    assert!(t.elapsed() >= Duration::from_millis(250), "not before the timeout: {:?}", t.elapsed());
    let _ = n.stop.send(());
    n.node.shutdown().await;
}

/// Raft is not part of the client API, and the peer plane serves nothing
/// of the client API but what followers forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_and_peer_planes_are_apart() {
    let dir = tempfile::tempdir().unwrap();
    let n = one_node(dir.path()).await;
    let http = HttpClient::new(1 << 20);
    let t = Duration::from_secs(5);
    for rpc in ["vote", "append", "snapshot"] {
        let a = http.call(Method::POST, &format!("{}/raft/{rpc}", n.url), Some(b"{}".to_vec()), t).await.unwrap();
        assert_eq!(a.status, StatusCode::NOT_FOUND, "/raft/{rpc} on the client plane");
        let a = http.call(Method::POST, &format!("{}/raft/{rpc}", n.peer_url), Some(b"{}".to_vec()), t).await.unwrap();
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "/raft/{rpc} on the peer plane reaches the decoder");
    }
    for (method, path) in [(Method::POST, "/v1/locks/plane/k"), (Method::GET, "/v1/watch"), (Method::GET, "/metrics")] {
        let a = http.call(method.clone(), &format!("{}{path}", n.peer_url), None, t).await.unwrap();
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{method} {path} on the peer plane");
    }
    let a = http.call(Method::GET, &format!("{}{}", n.peer_url, wire::CLUSTER_PATH), None, t).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "the bootstrap check asks peers for /v1/cluster");
    let _ = n.stop.send(());
    n.node.shutdown().await;
}

/// A peer RPC of a newer protocol is refused, not misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_peer_protocol_is_refused() {
    use crate::raft::network::PROTOCOL_HEADER;
    let dir = tempfile::tempdir().unwrap();
    let n = one_node(dir.path()).await;
    let http = HttpClient::new(1 << 20);
    let vote = hyper::Request::post(format!("{}/raft/vote", n.peer_url))
        .header(PROTOCOL_HEADER, "99")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let a = http.send(vote, Duration::from_secs(5)).await.unwrap();
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&a.body).contains("peer protocol 99 is newer"), "{:?}", a.body);
    let _ = n.stop.send(());
    n.node.shutdown().await;
}

/// A one-node config on `data_dir` (its ports are never bound: these
/// starts are refused first).
fn lone_node(data_dir: &std::path::Path) -> NodeConfig {
    let yaml = format!(
        "id: 1\nlisten: 127.0.0.1:1\npeer_listen: 127.0.0.1:2\ndata_dir: {}\npeers:\n  1: http://127.0.0.1:2\n",
        data_dir.display()
    );
    parse_yaml::<NodeConfig>(&yaml).unwrap().validate().unwrap()
}

/// A data directory a newer build wrote is refused at start, untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_of_a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Database::create(dir.path().join("raft.redb")).unwrap();
        write_meta(&db, "format", &(DATA_FORMAT + 1)).unwrap();
    }
    let e = Node::start(lone_node(dir.path())).await.err().expect("refused");
    assert!(e.to_string().contains("written by a newer fencegate"), "{e}");
}

/// A snapshot left without the log's database (a half-wiped directory)
/// is refused, not taken as the state of a node that forgot its vote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_without_its_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("snapshot"), b"{}\n").unwrap();
    let e = Node::start(lone_node(dir.path())).await.err().expect("refused");
    assert!(e.to_string().contains("without"), "{e}");
    assert!(!dir.path().join("raft.redb").exists(), "nothing created");
}

/// Where the data directory fixture of `format` lives.
fn fixture(format: u32) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/data-format-{format}"))
}

/// The committed fixtures (a node's data directory written by the release
/// that introduced each format) are still read: later releases keep this
/// test and prove they read every one. Tokens go on above them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_fixtures_are_read() {
    for format in 1..=DATA_FORMAT {
        let dir = tempfile::tempdir().unwrap();
        fencegate_testkit::files::copy_dir(&fixture(format), dir.path());
        let n = one_node(dir.path()).await;
        let client = Client::new(vec![n.url.clone()]).unwrap();
        assert_eq!(client.read("fixture/held").await.unwrap().token, 1, "format {format}");
        let released = client.read("fixture/released").await.unwrap();
        assert_eq!((released.token, released.held), (2, false), "format {format}");
        // Left held when the fixture was written: a new leader gives it its
        // TTL (1 s) again, then it expires.
        let opts = AcquireOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(10));
        let lease = client.acquire("fixture/held", opts).await.unwrap();
        assert!(lease.token() > 3, "format {format}: above every token the fixture granted: {}", lease.token());
        // Written under rules 0; a lone node has no one else to wait for.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while n.node.applied.lock().locks.rules() != crate::lock::state::RULES {
            assert!(std::time::Instant::now() < until, "format {format}: still on rules 0");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Then identified (a directory of format 4 on keeps the id it has),
        // and the node holds the id its table carries.
        while n.node.identity.get().is_none() {
            assert!(std::time::Instant::now() < until, "format {format}: no cluster id");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let table = n.node.applied.lock().locks.cluster().map(str::to_string);
        assert_eq!(n.node.identity.get(), table, "format {format}");
        let _ = n.stop.send(());
        n.node.shutdown().await;
        // Moved to this format's place (`raft::log_upgrade` has the rest).
        assert!(dir.path().join(crate::raft::log_store::LOG_DIR).is_dir(), "format {format}");
    }
}

/// Writes the fixture of this build's format: `cargo test --lib
/// write_the_data_dir_fixture -- --ignored`, once per new format (commit
/// `tests/fixtures/data-format-N/`). From format 2 on it holds a snapshot
/// (taken every 100 entries) and the log after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn write_the_data_dir_fixture() {
    let dir = fixture(DATA_FORMAT);
    assert!(!dir.join("raft.redb").exists(), "{} exists: a fixture is written once", dir.display());
    std::fs::create_dir_all(&dir).unwrap();
    let n = one_node_with(&dir, "raft: { snapshot_every: 100 }\n").await;
    let client = Client::new(vec![n.url.clone()]).unwrap();
    let held = client.acquire("fixture/held", AcquireOptions::new(Duration::from_secs(1))).await.unwrap();
    let released = client.acquire("fixture/released", AcquireOptions::new(Duration::from_secs(1))).await.unwrap();
    assert_eq!((held.token(), released.token()), (1, 2));
    released.release().await.unwrap();
    for i in 0..80 {
        let l = client.acquire(&format!("fixture/churn-{i}"), AcquireOptions::new(Duration::from_secs(1))).await;
        l.unwrap().release().await.unwrap();
    }
    std::mem::forget(held); // left held: it expires on its own
    let _ = n.stop.send(());
    n.node.shutdown().await;
}

/// The description is served without credentials, byte for byte the
/// shipped file; a 405 says what the path takes (schemathesis checks both);
/// keys and watch prefixes arrive percent-encoded from generated clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_description_is_served_and_generated_clients_spellings_are_understood() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, format!("someone: {}\n", crate::auth::hash_line("fg_secret"))).unwrap();
    let acl = "acl:\n  - { identity: someone, prefixes: [\"\"], rights: [admin] }\n";
    let extra = format!("auth:\n  tokens_file: {}\n{acl}{}", tokens.display(), peer_secret(dir.path()));
    let OneNode { url, node, stop, .. } = one_node_with(&dir.path().join("data"), &extra).await;
    let http = HttpClient::new(1 << 20);
    let t = Duration::from_secs(5);

    let doc = format!("{url}{}", wire::OPENAPI_PATH);
    let a = http.call(Method::GET, &doc, None, t).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "no credentials needed");
    assert_eq!(a.headers["content-type"], "application/yaml");
    assert_eq!(a.body, super::openapi::DOCUMENT.as_bytes());
    let a = http.call(Method::GET, &format!("{url}{}", wire::CLUSTER_PATH), None, t).await.unwrap();
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "the rest of the API still needs them");

    let http = http.with_bearer("fg_secret").unwrap();
    let lease_path = format!("{url}{}0123456789abcdef0123456789abcdef", wire::LEASES_PATH);
    for (method, path, allow) in [
        (Method::POST, doc.clone(), "GET"),
        (Method::PATCH, format!("{url}{}k", wire::LOCKS_PATH), "GET, POST"),
        (Method::GET, lease_path.clone(), "DELETE"),
        (Method::POST, lease_path.clone(), "DELETE"),
        (Method::DELETE, format!("{lease_path}/keepalive"), "POST"),
        (Method::PUT, format!("{url}{}", wire::MEMBERS_PATH), "GET, POST"),
    ] {
        let a = http.call(method.clone(), &path, None, t).await.unwrap();
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(a.headers["allow"], allow, "{method} {path}");
        assert_eq!(decode::<ApiError>(&a.body).error, ErrorCode::MethodNotAllowed);
    }
    let _ = stop.send(());
    node.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let OneNode { url, node, stop, .. } = one_node(dir.path()).await;
    let http = HttpClient::new(1 << 20);
    let locks = format!("{url}{}", wire::LOCKS_PATH);
    // 503 until the node has elected itself: retried, as the document says.
    let deadline = tokio::time::Instant::now() + t;
    let a = loop {
        let a = http.call(Method::POST, &format!("{locks}rack%2F42%3Aa"), None, t).await.unwrap();
        if a.status != StatusCode::SERVICE_UNAVAILABLE || tokio::time::Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(a.status, StatusCode::OK);
    let granted: wire::Granted = decode(&a.body);
    assert_eq!(granted.key, "rack/42:a", "decoded once");
    let a = http.call(Method::GET, &format!("{locks}rack/42:a"), None, t).await.unwrap();
    assert!(decode::<wire::LockInfo>(&a.body).held, "the same key, spelled plainly");
    // serde would read a struct from an array of its fields: not a body.
    for body in [&b"[null, null]"[..], b"[1000]", b"null", b"7"] {
        let a = http.call(Method::POST, &format!("{locks}k"), Some(body.to_vec()), t).await.unwrap();
        let e: ApiError = decode(&a.body);
        assert_eq!((a.status, e.error), (StatusCode::BAD_REQUEST, ErrorCode::BadRequest), "{body:?}");
    }
    for bad in ["rack%2F..%2Fx", "%2E%2E", "rack%252F42", "a%FF", "a%2F"] {
        let a = http.call(Method::POST, &format!("{locks}{bad}"), None, t).await.unwrap();
        assert_eq!(
            (a.status, decode::<ApiError>(&a.body).error),
            (StatusCode::BAD_REQUEST, ErrorCode::BadRequest),
            "{bad}"
        );
    }
    let watch = format!("{url}{}?prefix=rack%2F", wire::WATCH_PATH);
    let mut lines = fencegate_client::http::LineReader::new(http.open(&watch, t).await.unwrap().into_body());
    let first = tokio::time::timeout(t, lines.next_line(1 << 16)).await.unwrap().unwrap().unwrap();
    assert!(matches!(decode::<WatchLine>(&first), WatchLine::State { key, .. } if key == "rack/42:a"));
    let long = format!("{url}{}?prefix={}/", wire::WATCH_PATH, "k".repeat(crate::lock::validate::MAX_KEY_LEN));
    let a = http.call(Method::GET, &long, None, t).await.unwrap();
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "a prefix is at most as long as a key");

    let _ = stop.send(());
    node.shutdown().await;
}

/// The next watch line within `ms` milliseconds (`None`: none came).
async fn next_line_within(lines: &mut fencegate_client::http::LineReader, ms: u64) -> Option<WatchLine> {
    let line = tokio::time::timeout(Duration::from_millis(ms), lines.next_line(1 << 16)).await;
    line.ok().map(|l| decode::<WatchLine>(&l.unwrap().unwrap()))
}

/// `GET /v1/revision` answers the applied revision to whoever may watch
/// something (403 otherwise), and a watcher's stream keeps up with it: events
/// it may not see are followed at once by a heartbeat at their revision, not
/// 5 s later (a sidecar's `max_staleness` proof waits for its stream to
/// reach the revision it probed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_revision_is_read_linearizably_and_invisible_events_move_a_watch_on() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    let hashes: String =
        ["admin", "watcher", "reader"].iter().map(|id| format!("{id}: {}\n", crate::auth::hash_line(id))).collect();
    std::fs::write(&tokens, hashes).unwrap();
    let acl = "acl:\n  - { identity: admin, prefixes: [\"\"], rights: [admin] }\n  - { identity: watcher, prefixes: [rack/], rights: [watch] }\n  - { identity: reader, prefixes: [\"\"], rights: [read] }\n";
    let extra = format!("auth:\n  tokens_file: {}\n{acl}{}", tokens.display(), peer_secret(dir.path()));
    let OneNode { url, node, stop, .. } = one_node_with(&dir.path().join("data"), &extra).await;
    let t = Duration::from_secs(5);
    let as_ = |id: &str| HttpClient::new(1 << 20).with_bearer(id).unwrap();
    let options = fencegate_client::ClientOptions { token: Some("admin".into()), ..Default::default() };
    let admin = Client::with_options(vec![url.clone()], options).unwrap();
    let first = admin.acquire("other/first", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    let open = |query: &'static str| {
        let (watch, client) = (format!("{url}{}?prefix={query}", wire::WATCH_PATH), as_("watcher"));
        async move { fencegate_client::http::LineReader::new(client.open(&watch, t).await.unwrap().into_body()) }
    };
    // Both streams: the (empty) dump is followed at once by a heartbeat at
    // the revision it reflects, not 5 s later.
    let mut plain = open("").await;
    let mut progress = open("&progress=1").await;
    for lines in [&mut plain, &mut progress] {
        match next_line_within(lines, 2000).await {
            Some(WatchLine::Heartbeat { rev }) => assert_eq!(rev, first.token()),
            other => panic!("expected a heartbeat right after the dump, got {other:?}"),
        }
    }
    let lease = admin.acquire("other/k", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    match next_line_within(&mut progress, 2000).await {
        Some(WatchLine::Heartbeat { rev }) => assert_eq!(rev, lease.token()),
        other => panic!("expected a heartbeat at once with progress=1, got {other:?}"),
    }
    // Without `progress=1`, nothing tells the watcher when events it may
    // not see happen.
    assert_eq!(next_line_within(&mut plain, 1000).await, None, "a line after an invisible event without progress=1");
    let bad = format!("{url}{}?prefix=&progress=yes", wire::WATCH_PATH);
    assert_eq!(as_("watcher").call(Method::GET, &bad, None, t).await.unwrap().status, StatusCode::BAD_REQUEST);
    drop(first);
    let revision = format!("{url}{}", wire::REVISION_PATH);
    let a = as_("watcher").call(Method::GET, &revision, None, t).await.unwrap();
    assert_eq!(decode::<wire::Revision>(&a.body).rev, lease.token());
    let a = as_("reader").call(Method::GET, &revision, None, t).await.unwrap();
    assert_eq!((a.status, decode::<ApiError>(&a.body).error), (StatusCode::FORBIDDEN, ErrorCode::Forbidden));
    drop(lease);
    let _ = stop.send(());
    node.shutdown().await;
}

/// A node never vouches for a position it has not reached: a watch
/// resuming beyond its revision, or at a position of another cluster's
/// history, is answered 409 `position_unknown` with the node's revision
/// and cluster id, never a heartbeat at the watcher's revision (which told
/// a sidecar resuming after a restore that nothing had happened up to
/// there). Every answer names the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_beyond_the_node_or_of_another_history_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let OneNode { url, node, stop, .. } = one_node(dir.path()).await;
    let client = Client::new(vec![url.clone()]).unwrap();
    let lease = client.acquire("rack/1", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let cluster = loop {
        if let Some(id) = client.cluster().await.unwrap().cluster {
            break id;
        }
        assert!(std::time::Instant::now() < until, "the cluster got no id");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let rev = node.applied.lock().locks.revision();
    let (http, t) = (HttpClient::new(1 << 20), Duration::from_secs(5));
    let watch = |query: String| format!("{url}{}?prefix=rack/&progress=1{query}", wire::WATCH_PATH);

    let a = http.call(Method::GET, &watch(format!("&after={}", rev + 100_000)), None, t).await.unwrap();
    assert_eq!(a.status, StatusCode::CONFLICT, "{:?}", String::from_utf8_lossy(&a.body));
    let refusal = decode::<ApiError>(&a.body);
    assert_eq!(refusal.error, ErrorCode::PositionUnknown);
    assert_eq!(refusal.position, Some(wire::NodePosition { rev, cluster: Some(cluster.clone()) }));
    assert_eq!(a.headers[wire::CLUSTER_HEADER], cluster.as_str(), "every answer names the cluster");

    let other = crate::raft::identity::new_id();
    let a = http.call(Method::GET, &watch(format!("&after={rev}&cluster={other}")), None, t).await.unwrap();
    assert_eq!((a.status, decode::<ApiError>(&a.body).error), (StatusCode::CONFLICT, ErrorCode::PositionUnknown));
    let a = http.call(Method::GET, &watch("&cluster=nope".into()), None, t).await.unwrap();
    assert_eq!(a.status, StatusCode::BAD_REQUEST);

    // Its own history, at or below its revision: resumed as before.
    let resumed = http.open(&watch(format!("&after={rev}&cluster={cluster}")), t).await.unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let mut lines = fencegate_client::http::LineReader::new(resumed.into_body());
    let granted = client.acquire("rack/2", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    match next_line_within(&mut lines, 2000).await {
        Some(WatchLine::Granted { token, .. }) => assert_eq!(token, granted.token()),
        other => panic!("expected the grant after the position, got {other:?}"),
    }
    drop((lease, granted));
    let _ = stop.send(());
    node.shutdown().await;
}
