//! A secure cluster, attacked and used as its operators would: HTTPS with
//! member certificates on both planes, clients identified by bearer tokens
//! or certificates, an ACL per key prefix. Every refusal is checked to have
//! changed nothing; every later grant still gets a strictly higher token
//! that each node agrees on (read from each node's own applied state).

use std::time::Duration;

use fencegate::testing::PeerSecrets;
use fencegate::testing::TypeConfig;
use fencegate_client::http::{error_chain, HttpClient, Reply};
use fencegate_client::tls::TlsFiles;
use fencegate_client::{AcquireOptions, ClientOptions};
use fencegate_testkit::cluster::{ClusterOptions, Security};
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::tls::{token_hash, Pki};
use fencegate_testkit::{bin, wait, Cluster, Upstream};
use hyper::Method;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{LeaderId, Vote};

const ACL: &str = r#"
  - { identity: deploy, prefixes: ["rack/"], rights: [acquire, read] }
  - { identity: other, prefixes: ["rack/"], rights: [acquire] }
  - { identity: ops, prefixes: ["rack/"], rights: [admin] }
  - { identity: sidecar, prefixes: ["rack/"], rights: [read, watch] }
  - { identity: cert-user, prefixes: ["fw/"], rights: [acquire] }
"#;

fn security() -> Security {
    let tokens = ["deploy", "other", "ops", "sidecar"].map(|id| (id.to_string(), format!("{id}-token")));
    Security { acl: ACL.into(), tokens: tokens.to_vec(), ..Default::default() }
}

async fn secure_cluster() -> Cluster {
    Cluster::start_with(&bin!(), ClusterOptions { security: Some(security()), ..Default::default() }).await
}

/// An HTTPS client trusting the cluster CA, presenting `cert` (a member's or
/// a client's files) and/or `token`.
fn https(c: &Cluster, cert: Option<(std::path::PathBuf, std::path::PathBuf)>, token: Option<&str>) -> HttpClient {
    let pki = c.pki().unwrap();
    let (cert, key) = cert.unzip();
    let tls = TlsFiles { ca: pki.ca.clone(), cert, key }.client_config(["ca", "cert", "key"]).unwrap();
    let http = HttpClient::https(1 << 20, tls, None);
    match token {
        Some(t) => http.with_bearer(t).unwrap(),
        None => http,
    }
}

async fn call(http: &HttpClient, method: Method, url: &str, body: Option<&str>) -> Result<Reply, String> {
    http.call(method, url, body.map(|b| b.as_bytes().to_vec()), Duration::from_secs(5))
        .await
        .map_err(|e| error_chain(&e))
}

fn error_of(r: &Reply) -> String {
    serde_json::from_slice::<serde_json::Value>(&r.body)
        .map(|v| v["error"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Every node's own applied tokens under `prefix`, in key order.
async fn tokens_on(c: &Cluster, id: u64, prefix: &str, n: usize) -> Vec<u64> {
    let mut w = c.watch(id, &format!("prefix={prefix}")).await;
    let mut seen = vec![];
    for _ in 0..n {
        let line = w.next().await;
        assert_eq!(line["event"], "state", "node {id}: {line}");
        seen.push(line["token"].as_u64().unwrap());
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_members_speak_raft_and_each_only_as_itself() {
    let c = secure_cluster().await;
    let client = c.client();
    let first = client.acquire("rack/a", AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let term = c.cluster_info(leader).await.unwrap().term;
    let pki = c.pki().unwrap();
    let vote = |node_id| VoteRequest {
        vote: Vote { leader_id: LeaderId { term: term + 1, node_id }, committed: false },
        last_log_id: None,
    };
    let append = |node_id, t| AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(t, node_id),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let as_node2 = https(&c, Some(pki.member(2)), None);
    let anonymous = https(&c, None, None);
    for id in c.ids() {
        let peer = c.peer_url(id);
        let body = serde_json::to_string(&vote(3)).unwrap();
        // No certificate: the handshake itself fails. In TLS 1.3 the client
        // is done with its side first, so it sees the server's alert, or
        // just the connection going away, depending on timing; never an
        // answer.
        let e = call(&anonymous, Method::POST, &format!("{peer}/raft/vote"), Some(&body)).await.unwrap_err();
        let refused = ["CertificateRequired", "connection was not ready", "connection closed", "reset"];
        assert!(refused.iter().any(|r| e.contains(r)), "node {id}: {e}");
        // Plain HTTP on a TLS port is no way in either.
        let plain = HttpClient::new(1 << 20);
        let plain_url = peer.replace("https://", "http://");
        assert!(call(&plain, Method::POST, &format!("{plain_url}/raft/vote"), Some(&body))
            .await
            .map(|r| r.status != 200)
            .unwrap_or(true));
        // Node 2's certificate claiming to be node 3, as candidate or leader.
        for (rpc, body) in [("vote", body.clone()), ("append", serde_json::to_string(&append(3, term)).unwrap())] {
            let a = call(&as_node2, Method::POST, &format!("{peer}/raft/{rpc}"), Some(&body)).await.unwrap();
            assert_eq!(
                (a.status.as_u16(), error_of(&a).as_str()),
                (403, "forbidden"),
                "node {id}, {rpc} as 3 with 2's certificate"
            );
        }
        // As itself, but with a term that would overflow: the guard refuses.
        // (Node 2's own certificate is no peer of node 2's.)
        let overflow = serde_json::to_string(&append(2, u64::MAX)).unwrap();
        let a = call(&as_node2, Method::POST, &format!("{peer}/raft/append"), Some(&overflow)).await.unwrap();
        let expected = if id == 2 { 403 } else { 400 };
        assert_eq!(a.status, expected, "node {id}: {}", String::from_utf8_lossy(&a.body));
        // The client port has no Raft at all, whoever asks.
        let kit = https(&c, None, Some("ops-token"));
        let a = call(&kit, Method::POST, &format!("{}/raft/vote", c.url(id)), Some(&body)).await.unwrap();
        assert_eq!(a.status, 404, "node {id}'s client port");
    }
    // Forwarded leader calls carry the identity a member authenticated:
    // nobody but that member may send one. A client certificate of the
    // same CA is no member's; node 2's may not forward as node 3.
    let as_client = https(&c, Some(pki.client_cert("intruder")), None);
    let forged = |by: u64| {
        hyper::Request::post(format!("{}/v1/locks/rack/forged", c.peer_url(leader)))
            .header("x-fencegate-forwarded-by", by.to_string())
            .header("x-fencegate-identity", "testkit")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap()
    };
    for (who, http, by) in [("a client's certificate", &as_client, 2), ("node 2's as 3", &as_node2, 3)] {
        let a = http.send(forged(by), Duration::from_secs(5)).await.unwrap();
        assert_eq!((a.status.as_u16(), error_of(&a).as_str()), (403, "forbidden"), "{who}");
    }
    let body = serde_json::to_string(&vote(2)).unwrap();
    let a = call(&as_client, Method::POST, &format!("{}/raft/vote", c.peer_url(leader)), Some(&body)).await.unwrap();
    assert_eq!(a.status, 403, "a client's certificate speaks no Raft");
    assert_eq!(client.read("rack/forged").await.unwrap().token, 0, "nothing was granted");
    for id in c.ids() {
        assert_eq!(c.cluster_info(id).await.unwrap().term, term, "node {id}'s term moved");
    }
    let mut tokens = vec![first.token()];
    for key in ["rack/b", "rack/c"] {
        tokens.push(client.acquire(key, AcquireOptions::new(Duration::from_secs(5))).await.unwrap().token());
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens rise: {tokens:?}");
    let applied = c.cluster_info(leader).await.unwrap().commit_index;
    for id in c.ids() {
        c.wait_for_applied(id, applied, Duration::from_secs(10)).await;
        assert_eq!(tokens_on(&c, id, "rack/", 3).await, tokens, "node {id} agrees on every token");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_authenticated_and_authorised_per_prefix() {
    let c = secure_cluster().await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let lock = |key: &str| format!("{}/v1/locks/{key}", c.url(leader));
    let lease = |id: &str, suffix: &str| format!("{}/v1/leases/{id}{suffix}", c.url(leader));
    let body = Some(r#"{"ttl_ms":30000}"#);
    let log_index = || async { c.cluster_info(leader).await.unwrap().last_log_index };

    // Who are you?
    let before = log_index().await;
    for (who, http) in [("nobody", https(&c, None, None)), ("an unknown token", https(&c, None, Some("guess")))] {
        let a = call(&http, Method::POST, &lock("rack/1"), body).await.unwrap();
        assert_eq!((a.status.as_u16(), error_of(&a).as_str()), (401, "unauthorized"), "{who}");
    }
    // Health and metrics stay open to supervisors and scrapers.
    let a = call(&https(&c, None, None), Method::GET, &format!("{}/healthz", c.url(leader)), None).await.unwrap();
    assert_eq!(a.status, 200);

    // No right: 403, and nothing reaches the log.
    let deploy = https(&c, None, Some("deploy-token"));
    let a = call(&deploy, Method::POST, &lock("fw/1"), body).await.unwrap();
    assert_eq!((a.status.as_u16(), error_of(&a).as_str()), (403, "forbidden"));
    let sidecar = https(&c, None, Some("sidecar-token"));
    let a = call(&sidecar, Method::POST, &lock("rack/1"), body).await.unwrap();
    assert_eq!(a.status, 403, "read and watch are not acquire");
    assert_eq!(log_index().await, before, "refusals wrote to the log");

    // A lease is its owner's: another identity can neither keep it alive nor release it.
    let a = call(&deploy, Method::POST, &lock("rack/1"), body).await.unwrap();
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    let granted: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    let (id, token) = (granted["lease_id"].as_str().unwrap().to_string(), granted["token"].as_u64().unwrap());
    let other = https(&c, None, Some("other-token"));
    let after_grant = log_index().await;
    for (method, url) in [(Method::POST, lease(&id, "/keepalive")), (Method::DELETE, lease(&id, ""))] {
        let a = call(&other, method.clone(), &url, None).await.unwrap();
        assert_eq!((a.status.as_u16(), error_of(&a).as_str()), (403, "forbidden"), "{method} by another identity");
    }
    assert_eq!(log_index().await, after_grant);
    let a = call(&deploy, Method::GET, &lock("rack/1"), None).await.unwrap();
    assert!(String::from_utf8_lossy(&a.body).contains(r#""held":true"#), "still held");
    // Also through a follower, which forwards the identity it authenticated.
    let follower = c.ids().into_iter().find(|i| *i != leader).unwrap();
    let via = format!("{}/v1/leases/{id}", c.url(follower));
    assert_eq!(call(&other, Method::DELETE, &via, None).await.unwrap().status, 403, "forwarded");

    // An admin revokes it, and the audit log says who did what to whom.
    let ops = https(&c, None, Some("ops-token"));
    let a = call(&ops, Method::DELETE, &lease(&id, ""), None).await.unwrap();
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    // Every node writes the state changes it applies; the leader, the refusals.
    for id in c.ids() {
        wait::until_ok(&format!("node {id}'s revoke line"), Duration::from_secs(5), || async {
            let log = c.log_of(id);
            match log.lines().find(|l| l.contains("fencegate::audit") && l.contains("revoke")) {
                Some(l) if l.contains("ops") && l.contains("deploy") && l.contains(&token.to_string()) => Ok(()),
                other => Err(other.map(str::to_string)),
            }
        })
        .await;
    }
    let log = c.log_of(leader);
    for event in ["grant", "deny"] {
        assert!(log.lines().any(|l| l.contains("fencegate::audit") && l.contains(event)), "no {event} line");
    }

    // A backup holds every key: admin of rack/ is not enough, admin of
    // every key (the kit's identity) is.
    let a = call(&ops, Method::GET, &format!("{}/v1/snapshot", c.url(leader)), None).await.unwrap();
    assert_eq!((a.status.as_u16(), error_of(&a).as_str()), (403, "forbidden"), "a backup by an admin of rack/");
    let backup = c.client().snapshot(1 << 20).await.unwrap();
    assert!(backup.starts_with(br#"{"format":"fencegate-snapshot""#));

    // A client certificate is an identity too.
    let cert_user = c.client_with_cert("cert-user");
    cert_user.acquire("fw/2", AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
    let Err(e) = cert_user.acquire("rack/2", AcquireOptions::new(Duration::from_secs(5))).await else {
        panic!("granted without the right");
    };
    assert!(e.to_string().contains("forbidden"), "{e}");

    // The tokens file is re-read: a token added to it works without a restart.
    let late = https(&c, None, Some("late-token"));
    assert_eq!(call(&late, Method::GET, &lock("rack/1"), None).await.unwrap().status, 401);
    let file = c.dir().join("tokens.yaml");
    let mut tokens = std::fs::read_to_string(&file).unwrap();
    tokens.push_str(&format!("late: {}\n", token_hash("late-token")));
    std::fs::write(&file, tokens).unwrap();
    wait::until_ok("the new token to be known", Duration::from_secs(10), || async {
        // Known now, and without rights: 403 instead of 401.
        match call(&late, Method::GET, &lock("rack/1"), None).await.map(|a| a.status.as_u16()) {
            Ok(403) => Ok(()),
            other => Err(other),
        }
    })
    .await;
}

/// The sidecar needs only `read` and `watch` on its prefixes to fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_with_read_and_watch_only_fences_correctly() {
    let c = secure_cluster().await;
    let up = Upstream::start().await;
    let fence = "{ mode: strict, consistency: cached }";
    let yaml = table(&[rack_writes(fence).methods(&["PUT"]), everything_else()]);
    let o = SidecarOptions { yaml, lock_token: Some("sidecar-token".into()), ..Default::default() };
    let sc = c.sidecar_with("sc", &up.url(), o).await;
    let deploy = c.client_with_token("deploy-token");
    let a = deploy.acquire("rack/7", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    assert_eq!(sc.send("PUT", "/racks/7", Some(a.token()), &[]).await.0, 200, "the holder's write");
    let token = a.token();
    a.release().await.unwrap();
    let b = deploy.acquire("rack/7", AcquireOptions::new(Duration::from_secs(30))).await.unwrap();
    // The watch may tell the sidecar of A's release before B's grant: A's
    // write is then refused as ended (`lease_expired`) until B's is known.
    // Never forwarded.
    wait::until_ok("A's write refused as stale", Duration::from_secs(5), || async {
        let (status, v) = sc.send("PUT", "/racks/7", Some(token), &[]).await;
        match (status, v["error"].as_str()) {
            (409, Some("stale_token")) => Ok(()),
            (409, Some("lease_expired")) => Err(v.to_string()),
            _ => panic!("A's write after B's grant: {status} {v}"),
        }
    })
    .await;
    assert_eq!(sc.send("PUT", "/racks/7", Some(b.token()), &[]).await.0, 200);
    assert_eq!(up.tokens("/racks/7"), vec![Some(token), Some(b.token())], "only the holders' writes arrived");
}

/// `series` (`name{labels}`) of node `id`'s `/metrics`, read with `http`.
async fn node_metric(c: &Cluster, http: &HttpClient, id: u64, series: &str) -> Option<f64> {
    let text = call(http, Method::GET, &format!("{}/metrics", c.url(id)), None).await.ok()?.body;
    fencegate_testkit::http::metric(&String::from_utf8_lossy(&text), series)
}

/// SIGHUP every node and wait until each counts the reload as `series` = `n`
/// (its `/metrics` read with `http`).
async fn reload_all(c: &Cluster, http: &HttpClient, series: &str, n: f64) {
    for id in c.ids() {
        c.signal(id, nix::sys::signal::Signal::SIGHUP);
    }
    for id in c.ids() {
        let what = format!("node {id}: {series} = {n}");
        let check = || async { node_metric(c, http, id, series).await == Some(n) };
        wait::until(&what, Duration::from_secs(10), check).await;
    }
}

const APPLIED: &str = r#"fencegate_config_reloads_total{result="applied"}"#;
const REFUSED: &str = r#"fencegate_config_reloads_total{result="refused"}"#;

/// SIGHUP on the nodes: a new ACL takes a right away from the next call; a
/// file that does not validate, or changes what takes a restart, is
/// refused whole and the rules in force stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_acl_applies_to_the_next_call_and_a_bad_file_is_refused() {
    let mut c = secure_cluster().await;
    let http = https(&c, None, None);
    for id in c.ids() {
        assert_eq!(node_metric(&c, &http, id, APPLIED).await, Some(0.0), "node {id}: the series exists from the start");
        assert_eq!(node_metric(&c, &http, id, REFUSED).await, Some(0.0), "node {id}");
    }
    let deploy = c.client_with_token("deploy-token");
    deploy.read("rack/1").await.expect("deploy may read");

    let without_read = ACL.replace("rights: [acquire, read] }", "rights: [acquire] }");
    c.rewrite_configs(&without_read, "");
    reload_all(&c, &http, APPLIED, 1.0).await;
    let e = deploy.read("rack/1").await.expect_err("deploy may not read any more");
    assert!(e.to_string().contains("forbidden"), "{e}");

    // Giving the right back with a typo: refused, still no read.
    c.rewrite_configs(&ACL.replace("rights: [acquire, read] }", "rights: [acquire, raed] }"), "");
    reload_all(&c, &http, REFUSED, 1.0).await;
    // Giving it back along with a change that takes a restart: refused too.
    c.rewrite_configs(ACL, "lease: { default_ttl: 10s }\n");
    reload_all(&c, &http, REFUSED, 2.0).await;
    let e = deploy.read("rack/1").await.expect_err("a refused reload changed the rules");
    assert!(e.to_string().contains("forbidden"), "{e}");
    let log = c.log_of(1);
    let path = c.config_path(1).display().to_string();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("config not reloaded")).collect();
    assert_eq!(refusals.len(), 2, "{log}");
    assert!(refusals.iter().all(|l| l.contains("ERROR") && l.contains(&path)), "{refusals:?}");
    assert!(refusals[0].contains("raed") && refusals[1].contains("`lease`"), "{refusals:?}");

    c.rewrite_configs(ACL, "");
    reload_all(&c, &http, APPLIED, 2.0).await;
    deploy.read("rack/1").await.expect("deploy may read again");
}

/// A whole cluster moves to a new CA with three SIGHUPs and no restart:
/// trust both CAs, take certificates of the new one, trust only the new
/// one. New handshakes on both planes then present the new certificates.
/// The leader's links are cut for a moment (their TLS sessions dropped) and
/// it stays leader in the same term: its peer links reconnected with the
/// new certificate and CA. Then each node takes a grant, forwarding to the
/// leader over its own links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_moves_to_a_new_ca_by_reloads() {
    // Elections slow enough that a leader cut off for 300 ms keeps its term.
    let raft = "raft: { heartbeat: 100ms, election_timeout_min: 2s, election_timeout_max: 3s, propose_timeout: 3s }\n";
    let o = ClusterOptions { security: Some(security()), yaml: raft.into(), ..Default::default() };
    let c = Cluster::start_with(&bin!(), o).await;
    let old = c.pki().unwrap();
    let new = Pki::new(&c.dir().join("pki2"), "next");
    let both = c.dir().join("both-cas.pem");
    let pem = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    std::fs::write(&both, format!("{}{}", pem(&old.ca), pem(&new.ca))).unwrap();
    // What the test itself reaches the nodes with, whichever CA they serve.
    let tls = TlsFiles { ca: both.clone(), cert: None, key: None }.client_config(["ca", "cert", "key"]).unwrap();
    let kit_token = c.client_options().token.unwrap();
    let http = HttpClient::https(1 << 20, tls.clone(), None).with_bearer(&kit_token).unwrap();
    let cluster_info = |id: u64| {
        let (http, url) = (&http, format!("{}/v1/cluster", c.url(id)));
        async move {
            let body = call(http, Method::GET, &url, None).await.unwrap().body;
            serde_json::from_slice::<fencegate_client::ClusterInfo>(&body).unwrap()
        }
    };
    // Each node's `tls` section, rewritten in place.
    let edit = |id: u64, from: &str, to: &str| {
        let text = std::fs::read_to_string(c.config_path(id)).unwrap();
        assert!(text.contains(from), "node {id}: {from}");
        std::fs::write(c.config_path(id), text.replace(from, to)).unwrap();
    };
    let ca = |p: &std::path::Path| p.display().to_string();
    for id in c.ids() {
        edit(id, &ca(&old.ca), &ca(&both));
    }
    reload_all(&c, &http, APPLIED, 1.0).await;
    for id in c.ids() {
        let ((cert, key), (next_cert, next_key)) = (old.member_files(id), new.member(id));
        edit(id, &ca(&cert), &ca(&next_cert));
        edit(id, &ca(&key), &ca(&next_key));
    }
    reload_all(&c, &http, APPLIED, 2.0).await;
    for id in c.ids() {
        edit(id, &ca(&both), &ca(&new.ca));
    }
    reload_all(&c, &http, APPLIED, 3.0).await;
    let port = |url: String| url.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    for id in c.ids() {
        for url in [c.url(id), c.peer_url(id)] {
            new.served_certificate(port(url.clone()), "localhost").await.unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(old.served_certificate(port(url.clone()), "localhost").await.is_err(), "{url}: the old CA's");
        }
    }
    let before = cluster_info(1).await;
    let leader = before.leader.expect("a leader");
    for follower in c.ids().into_iter().filter(|f| *f != leader) {
        c.set_one_way(leader, follower, true);
    }
    // Long enough for every relay's connection task to see the cut (a cut
    // healed at once can go unseen) and drop its connections; far below
    // the election timeout.
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.heal_all();
    let options = ClientOptions { tls: Some(tls), ..c.client_options() };
    for id in c.ids() {
        let client = fencegate_client::Client::with_options(vec![c.url(id)], options.clone()).unwrap();
        let lease = tokio::time::timeout(
            Duration::from_secs(10),
            client.acquire(&format!("rack/new-ca-{id}"), AcquireOptions::new(Duration::from_secs(5))),
        )
        .await
        .map(|r| r.map(|l| l.token()));
        assert!(matches!(lease, Ok(Ok(_))), "no grant through node {id}: {lease:?}");
    }
    let after = cluster_info(1).await;
    assert_eq!((after.leader, after.term), (Some(leader), before.term), "the leader's peer links did not come back");
}

/// The ACL of the peer-plane attacks: `oncall`, whom an attacker forges,
/// may do everything, so that only the peer plane's check stands between
/// a forged header and a grant.
fn oncall_security(plain: bool) -> Security {
    let acl = format!("{ACL}  - {{ identity: oncall, prefixes: [\"\"], rights: [admin] }}\n");
    Security { plain, acl, ..security() }
}

/// An HTTP client for cluster `c` as its clients reach it: HTTPS with the
/// cluster CA on a TLS cluster, plain HTTP otherwise; with `token`.
fn client_http(c: &Cluster, token: Option<&str>) -> HttpClient {
    match (c.pki(), token) {
        (Some(_), _) => https(c, None, token),
        (None, Some(t)) => HttpClient::new(1 << 20).with_bearer(t).unwrap(),
        (None, None) => HttpClient::new(1 << 20),
    }
}

/// `fencegate check-config`'s line about node `id`'s peer plane.
fn peer_plane_said(c: &Cluster, id: u64) -> String {
    let out = c.bin().run(&["check-config", c.config_path(id).to_str().unwrap()], Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    out.stdout.lines().find_map(|l| l.strip_prefix("peer plane: ")).unwrap_or_default().to_string()
}

/// The forged calls of the finding (issue 34): a local user's request to a
/// peer plane, as if member `by` had forwarded it for `oncall`; and a Raft
/// vote as member `by` in a new term. `auth`: an `Authorization` value.
fn forgeries(peer: &str, by: u64, term: u64, auth: Option<&str>) -> Vec<(&'static str, hyper::Request<Full>)> {
    let vote =
        VoteRequest { vote: Vote { leader_id: LeaderId { term, node_id: by }, committed: false }, last_log_id: None };
    let calls = [
        ("acquire", Method::POST, "/v1/locks/rack/forged", r#"{"ttl_ms": 60000}"#.to_string()),
        ("snapshot", Method::GET, "/v1/snapshot", String::new()),
        ("members", Method::GET, "/v1/members", String::new()),
        ("raft vote", Method::POST, "/raft/vote", serde_json::to_string(&vote).unwrap()),
    ];
    let by = by.to_string();
    calls
        .into_iter()
        .map(|(what, method, path, body)| {
            let mut r = hyper::Request::builder().method(method).uri(format!("{peer}{path}"));
            if !path.starts_with("/raft/") {
                r = r.header("x-fencegate-forwarded-by", &by).header("x-fencegate-identity", "oncall");
            }
            if let Some(a) = auth {
                r = r.header("authorization", a);
            }
            (what, r.header("content-type", "application/json").body(Full::new(body.into())).unwrap())
        })
        .collect()
}

type Full = http_body_util::Full<bytes::Bytes>;

/// Issue 34: with clients authenticating, a local user who sends
/// `x-fencegate-identity`/`x-fencegate-forwarded-by` to a peer plane, or
/// speaks Raft to it, is refused in every peer-plane configuration
/// `check-config` accepts (plaintext on loopback with the peer secret,
/// `insecure_peers` with it, TLS), with an audit line; nothing is granted
/// and no term moves. The same forgery carrying a member's proof of the
/// secret goes through (the control: the proof is what is checked), and the
/// real cluster elects, replicates and forwards calls as their caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_identity_or_raft_on_the_peer_plane_is_refused_in_every_configuration() {
    let plain =
        |yaml: &str| ClusterOptions { security: Some(oncall_security(true)), yaml: yaml.into(), ..Default::default() };
    let configurations = [
        ("plaintext loopback with the secret", plain(""), "members prove the shared secret in "),
        ("insecure_peers with the secret", plain("insecure_peers: true\n"), "members prove the shared secret in "),
        (
            "tls",
            ClusterOptions { security: Some(oncall_security(false)), ..Default::default() },
            "TLS, each member by its certificate",
        ),
    ];
    for (name, options, said) in configurations {
        let c = Cluster::start_with(&bin!(), options).await;
        assert!(peer_plane_said(&c, 1).starts_with(said), "{name}: {}", peer_plane_said(&c, 1));
        let leader = c.wait_for_leader(Duration::from_secs(10)).await;
        let term = c.cluster_info(leader).await.unwrap().term;
        let local_user = client_http(&c, None);
        let proof = |id| {
            c.peer_secret_file().map(|f| PeerSecrets::parse(&std::fs::read_to_string(f).unwrap()).unwrap().proof(id))
        };
        let wrong = PeerSecrets::parse(&"f".repeat(64)).unwrap();
        for id in c.ids() {
            let by = c.ids().into_iter().find(|o| *o != id).unwrap();
            let mut attempts = vec![("no proof", forgeries(&c.peer_url(id), by, term + 1, None))];
            if c.pki().is_none() {
                let bearer = |p: String| format!("Bearer {p}");
                attempts.push((
                    "another secret's proof",
                    forgeries(&c.peer_url(id), by, term + 1, Some(&bearer(wrong.proof(by)))),
                ));
                let own = bearer(proof(id).unwrap());
                attempts.push(("its own id's proof", forgeries(&c.peer_url(id), by, term + 1, Some(&own))));
            }
            for (how, requests) in attempts {
                for (what, req) in requests {
                    match local_user.send(req, Duration::from_secs(5)).await {
                        // TLS: no member certificate, no handshake.
                        Err(e) => {
                            assert!(c.pki().is_some(), "{name}, node {id}, {what} with {how}: {}", error_chain(&e))
                        }
                        Ok(a) => assert!(
                            matches!(a.status.as_u16(), 401 | 403),
                            "{name}, node {id}, {what} with {how}: {} {}",
                            a.status,
                            String::from_utf8_lossy(&a.body)
                        ),
                    }
                }
            }
            // (With TLS, the handshake refuses them, before any request.)
            let audited = c.log_of(id).contains("peer_refused");
            assert!(audited || c.pki().is_some(), "{name}: node {id} audited no refusal");
        }
        let client = c.client();
        assert_eq!(client.read("rack/forged").await.unwrap().token, 0, "{name}: nothing was granted");
        for id in c.ids() {
            assert_eq!(c.cluster_info(id).await.unwrap().term, term, "{name}: node {id}'s term moved");
        }
        // The control: a member's proof makes the same forgery a forwarded
        // call (members are trusted with identities), and a stale vote gets
        // a Raft answer.
        if let Some(by) = c.ids().into_iter().find(|o| *o != leader).filter(|_| c.pki().is_none()) {
            let auth = format!("Bearer {}", proof(by).unwrap());
            let mut proven = forgeries(&c.peer_url(leader), by, 1, Some(&auth));
            let (_, acquire) = proven.remove(0);
            let a = local_user.send(acquire, Duration::from_secs(5)).await.unwrap();
            assert_eq!(a.status, 200, "{name}: control acquire: {}", String::from_utf8_lossy(&a.body));
            for (what, req) in proven {
                let a = local_user.send(req, Duration::from_secs(5)).await.unwrap();
                assert_eq!(a.status, 200, "{name}: control {what}: {}", String::from_utf8_lossy(&a.body));
            }
        }
        // The real cluster forwards a follower's call as its caller: a lease
        // taken by deploy through one follower is deploy's on the leader.
        let followers: Vec<u64> = c.ids().into_iter().filter(|id| *id != leader).collect();
        let deploy = client_http(&c, Some("deploy-token"));
        let url = format!("{}/v1/locks/rack/forwarded", c.url(followers[0]));
        let granted = call(&deploy, Method::POST, &url, Some(r#"{"ttl_ms": 60000}"#)).await.unwrap();
        assert_eq!(granted.status, 200, "{name}: {}", String::from_utf8_lossy(&granted.body));
        let granted: serde_json::Value = serde_json::from_slice(&granted.body).unwrap();
        let lease = granted["lease_id"].as_str().unwrap();
        let other = client_http(&c, Some("other-token"));
        let a = call(&other, Method::DELETE, &format!("{}/v1/leases/{lease}", c.url(leader)), None).await.unwrap();
        assert_eq!((a.status.as_u16(), error_of(&a).as_str()), (403, "forbidden"), "{name}: another's lease");
        let a =
            call(&deploy, Method::DELETE, &format!("{}/v1/leases/{lease}", c.url(followers[1])), None).await.unwrap();
        assert_eq!(a.status, 200, "{name}: deploy releases its own: {}", String::from_utf8_lossy(&a.body));
        let token = granted["token"].as_u64().unwrap();
        let applied = c.cluster_info(leader).await.unwrap().commit_index;
        for id in c.ids() {
            c.wait_for_applied(id, applied, Duration::from_secs(10)).await;
            assert_eq!(tokens_on(&c, id, "rack/forwarded", 1).await, [token], "{name}: node {id} replicated it");
        }
    }
}

/// Without client authentication or an acl, `check-config` says the peer
/// plane is open to every local user, and it is: anyone speaks Raft to it,
/// and a forwarded call acts as `anonymous`, as any client's does. A
/// forwarded identity other than `anonymous` is still refused: the header
/// is never taken as truth from a sender that proved nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_peer_plane_is_said_to_be_and_takes_no_forged_identity() {
    let c = Cluster::start(&bin!(), 3, "").await;
    assert!(
        peer_plane_said(&c, 1).starts_with("open to every local user (no client authentication configured)"),
        "{}",
        peer_plane_said(&c, 1)
    );
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let by = c.ids().into_iter().find(|o| *o != leader).unwrap();
    let local_user = HttpClient::new(1 << 20);
    let requests = forgeries(&c.peer_url(leader), by, 1, None);
    for (what, req) in requests {
        let a = local_user.send(req, Duration::from_secs(5)).await.unwrap();
        match what {
            "raft vote" => assert_eq!(a.status, 200, "anyone speaks Raft here: {}", String::from_utf8_lossy(&a.body)),
            _ => assert_eq!((a.status.as_u16(), error_of(&a).as_str()), (403, "forbidden"), "{what} as oncall"),
        }
    }
    assert!(c.log_of(leader).contains("peer_refused"), "the forged identity was audited");
    assert_eq!(c.client().read("rack/forged").await.unwrap().token, 0, "nothing was granted");
    let as_anonymous = hyper::Request::post(format!("{}/v1/locks/rack/anonymous", c.peer_url(leader)))
        .header("x-fencegate-forwarded-by", by.to_string())
        .header("x-fencegate-identity", "anonymous")
        .body(Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let a = local_user.send(as_anonymous, Duration::from_secs(5)).await.unwrap();
    assert_eq!(a.status, 200, "as anonymous, as on the client plane: {}", String::from_utf8_lossy(&a.body));
}

/// The peer secret rotates by SIGHUPs with no member refused on the way:
/// every node takes the new secret as a second line, then proves it first,
/// then alone; a proof of the old one is then refused. A secret file
/// others may read is refused on reload and the running secret stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_secret_rotates_by_reloads() {
    use std::os::unix::fs::PermissionsExt;
    let o = ClusterOptions { security: Some(oncall_security(true)), ..Default::default() };
    let c = Cluster::start_with(&bin!(), o).await;
    let file = c.peer_secret_file().unwrap().to_path_buf();
    let old = std::fs::read_to_string(&file).unwrap().trim().to_string();
    let new = "0123456789abcdef".repeat(4);
    let metrics = HttpClient::new(1 << 20);
    let deploy = c.client_with_token("deploy-token");
    let probe = |secret: &str, id: u64| {
        let proof = PeerSecrets::parse(secret).unwrap().proof(id);
        let http = HttpClient::new(1 << 20).with_bearer(&proof).unwrap();
        let url = format!("{}/v1/cluster", c.peer_url(if id == 1 { 2 } else { 1 }));
        async move { http.call(Method::GET, &url, None, Duration::from_secs(5)).await.unwrap().status.as_u16() }
    };
    for (n, lines) in [(1.0, format!("{old}\n{new}\n")), (2.0, format!("{new}\n{old}\n")), (3.0, format!("{new}\n"))] {
        std::fs::write(&file, lines).unwrap();
        reload_all(&c, &metrics, APPLIED, n).await;
        deploy.acquire(&format!("rack/rotation-{n}"), AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
        assert_eq!(probe(&new, 3).await, 200, "step {n}: the new secret is taken");
    }
    assert_eq!(probe(&old, 3).await, 401, "the old secret is no longer taken");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    reload_all(&c, &metrics, REFUSED, 1.0).await;
    assert!(c.log_of(1).contains("chmod 600"), "{}", c.log_of(1));
    assert_eq!(probe(&new, 3).await, 200, "the running secret stays");
}

/// A long-lived call is not let in for good: once its right is taken out
/// of the ACL (SIGHUP) or its token out of the tokens file, its watch
/// stream ends and its parked acquire (on the leader, or forwarded by a
/// follower) is answered, within 3 s; the next call is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_token_or_a_right_ends_its_streams_and_parked_acquires() {
    let mut c = secure_cluster().await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let follower = c.ids().into_iter().find(|i| *i != leader).unwrap();
    let http = https(&c, None, None);
    let (watcher, other) = (https(&c, None, Some("sidecar-token")), https(&c, None, Some("other-token")));
    // Closures of URLs, not of `c`: its configs are rewritten below.
    let (leader, follower) = (c.url(leader), c.url(follower));
    let watch = |node: &str| {
        let (watcher, url) = (watcher.clone(), format!("{node}/v1/watch?prefix=rack/"));
        async move { fencegate_testkit::Watch::try_open_with(&watcher, &url, Duration::from_secs(5)).await }
    };
    // rack/1 is held, so `other`'s acquires park (on the leader, and
    // forwarded by the follower).
    let deploy = c.client_with_token("deploy-token");
    let _held = deploy.acquire("rack/1", AcquireOptions::new(Duration::from_secs(60))).await.unwrap();
    let park = |node: &str| {
        let (other, url) = (other.clone(), format!("{node}/v1/locks/rack/1"));
        tokio::spawn(async move {
            let a = call(&other, Method::POST, &url, Some(r#"{"ttl_ms":30000,"wait_ms":60000}"#)).await.unwrap();
            (a.status.as_u16(), error_of(&a), std::time::Instant::now())
        })
    };
    let bound = Duration::from_secs(3);

    // The ACL loses the rights.
    let mut streams = [watch(&leader).await.unwrap(), watch(&follower).await.unwrap()];
    let parked = park(&leader);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!parked.is_finished(), "the acquire waits");
    let fewer = ACL.replace("rights: [read, watch] }", "rights: [read] }").replace(
        r#"{ identity: other, prefixes: ["rack/"], rights: [acquire] }"#,
        r#"{ identity: other, prefixes: ["fw/"], rights: [acquire] }"#,
    );
    c.rewrite_configs(&fewer, "");
    reload_all(&c, &http, APPLIED, 1.0).await;
    let reloaded = std::time::Instant::now();
    for (i, w) in streams.iter_mut().enumerate() {
        w.ends_within(bound).await.unwrap_or_else(|seen| panic!("stream {i} still runs, lines: {seen:?}"));
    }
    let (status, error, at) = tokio::time::timeout(bound, parked).await.expect("the acquire still waits").unwrap();
    assert_eq!((status, error.as_str()), (403, "forbidden"));
    assert!(at.duration_since(reloaded) < bound);
    assert_eq!(watch(&follower).await.err().as_deref(), Some("status 403 Forbidden"), "a new watch");

    // The rights are back; then the tokens file loses the tokens.
    c.rewrite_configs(ACL, "");
    reload_all(&c, &http, APPLIED, 2.0).await;
    let mut streams = [watch(&leader).await.unwrap(), watch(&follower).await.unwrap()];
    let parked = [park(&leader), park(&follower)];
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(parked.iter().all(|p| !p.is_finished()), "the acquires wait");
    let file = c.dir().join("tokens.yaml");
    let kept: String = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("\"sidecar\"") && !l.starts_with("\"other\""))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!kept.contains(&token_hash("sidecar-token")) && kept.contains(&token_hash("deploy-token")), "{kept}");
    let new = file.with_extension("new");
    std::fs::write(&new, kept).unwrap();
    std::fs::rename(&new, &file).unwrap();
    let revoked = std::time::Instant::now();
    // The file is checked every second.
    let bound = bound + Duration::from_secs(1);
    for (i, w) in streams.iter_mut().enumerate() {
        w.ends_within(bound).await.unwrap_or_else(|seen| panic!("stream {i} still runs, lines: {seen:?}"));
    }
    for (p, on) in parked.into_iter().zip(["leader", "follower"]) {
        let (status, error, at) = tokio::time::timeout(bound, p).await.expect(on).unwrap();
        assert_eq!((status, error.as_str()), (401, "unauthorized"), "{on}");
        assert!(at.duration_since(revoked) < bound, "{on}");
    }
    assert_eq!(watch(&follower).await.err().as_deref(), Some("status 401 Unauthorized"), "a new watch");
}
