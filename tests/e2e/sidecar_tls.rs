//! The sidecar over real TLS: an HTTPS listener (HTTP/1.1 or HTTP/2 by ALPN),
//! mTLS, `https://` upstreams, and TLS files checked like the rest of the
//! config. Routes are `observed`, so no lock cluster is needed.

use std::path::Path;
use std::time::Duration;

use fencegate_testkit::http::raw;
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::tls::{https, Pki};
use fencegate_testkit::{bin, free_port, Sidecar, Upstream};

fn routes() -> String {
    table(&[rack_writes("{ mode: observed }").methods(&["PUT", "POST", "PATCH", "DELETE"]), everything_else()])
}

/// A sidecar in `dir/name` in front of `upstream`; `extra` holds its `tls`,
/// `upstream_tls` or `limits` sections.
async fn sidecar(dir: &Path, name: &str, upstream: &str, extra: &str) -> Sidecar {
    Sidecar::start(&bin!(), dir.join(name), upstream, &[], &format!("{extra}{}", routes())).await
}

/// A temporary directory with a PKI (`main`), a recording upstream, and a
/// sidecar `sc` serving HTTPS with that PKI's server certificate in front of
/// it; `extra` gives its `tls` section (and any other).
async fn https_sidecar(extra: impl FnOnce(&Pki) -> String) -> (tempfile::TempDir, Pki, Upstream, Sidecar) {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "main");
    let up = Upstream::start().await;
    let sc = sidecar(dir.path(), "sc", &up.url(), &extra(&pki)).await;
    (dir, pki, up, sc)
}

fn forwarded(up: &Upstream) -> String {
    let seen = up.seen();
    let last = seen.last().expect("the upstream saw nothing");
    last.headers.get("forwarded").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_requests_are_fenced_and_forwarded_with_proto_https() {
    let (dir, pki, up, sc) = https_sidecar(|pki| pki.tls_yaml(None)).await;
    let client = pki.client(None);

    let r = https(&client, sc.port, "localhost", false, "PUT", "/racks/1", Some(5)).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.alpn.as_deref(), Some("http/1.1"));
    assert_eq!(up.tokens("/racks/1"), vec![Some(5)]);
    let fwd = forwarded(&up);
    assert!(fwd.contains("proto=https") && fwd.contains("host=\"localhost:"), "{fwd}");
    // Fencing is the same over TLS: a lower token is refused and not forwarded.
    let r = https(&client, sc.port, "127.0.0.1", false, "PUT", "/racks/1", Some(4)).await.unwrap();
    assert_eq!((r.status, r.body["error"].as_str()), (409, Some("stale_token")), "{r:?}");
    assert_eq!(up.tokens("/racks/1"), vec![Some(5)]);

    // A client that does not trust the sidecar's CA refuses it.
    let stranger = Pki::new(dir.path(), "stranger");
    let e = https(&stranger.client(None), sc.port, "localhost", false, "GET", "/x", None).await.unwrap_err();
    assert!(e.contains("certificate"), "{e}");
    // Plain HTTP on the HTTPS port gets no HTTP answer.
    let http = fencegate_client::http::HttpClient::new(1 << 20);
    let plain = http.call(hyper::Method::GET, &sc.url(), None, Duration::from_secs(5)).await;
    assert!(plain.is_err(), "{plain:?}");
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_negotiated_by_alpn() {
    let (_dir, pki, up, sc) = https_sidecar(|pki| pki.tls_yaml(None)).await;
    let r = https(&pki.client(None), sc.port, "localhost", true, "PUT", "/racks/2", Some(7)).await.unwrap();
    assert_eq!((r.status, r.alpn.as_deref()), (200, Some("h2")), "{r:?}");
    assert_eq!(up.tokens("/racks/2"), vec![Some(7)]);
    assert!(forwarded(&up).contains("proto=https"), "{}", forwarded(&up));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_ca_only_clients_holding_a_certificate_it_signed_get_through() {
    let (dir, pki, up, sc) = https_sidecar(|pki| pki.tls_yaml(Some(&pki.ca))).await;
    let stranger = Pki::new(dir.path(), "stranger");

    // With TLS 1.3 the client learns of the refusal (an alert) on its first
    // read, after its side of the handshake: no HTTP answer either way, and
    // nothing reaches the upstream.
    for (who, identity, alert) in
        [("no certificate", None, "CertificateRequired"), ("another CA's certificate", Some(&stranger), "UnknownCA")]
    {
        let e = https(&pki.client(identity), sc.port, "localhost", false, "PUT", "/racks/3", Some(1)).await;
        let e = e.expect_err(who);
        assert!(e.contains(&format!("received fatal alert: {alert}")), "{who}: {e}");
    }
    assert!(up.seen().is_empty(), "{:?}", up.seen());
    for h2 in [false, true] {
        let r = https(&pki.client(Some(&pki)), sc.port, "localhost", h2, "PUT", "/racks/3", Some(1)).await.unwrap();
        assert_eq!(r.status, 200, "h2={h2}: {r:?}");
    }
    assert_eq!(up.tokens("/racks/3"), vec![Some(1), Some(1)]);
}

/// SIGHUP with new certificate files: new handshakes get the new
/// certificate; files that do not load are refused and the old one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_rotates_the_certificate_for_new_handshakes() {
    use nix::sys::signal::Signal;
    let (dir, pki, up, sc) = https_sidecar(|pki| pki.tls_yaml(None)).await;
    let next = Pki::new(dir.path(), "next");
    let put = |client: rustls::ClientConfig| {
        let port = sc.port;
        async move { https(&client, port, "localhost", false, "PUT", "/racks/6", Some(3)).await }
    };
    assert_eq!(put(pki.client(None)).await.unwrap().status, 200);
    assert!(put(next.client(None)).await.unwrap_err().contains("certificate"), "the next certificate too early");

    sc.rewrite_config(&format!("{}{}", next.tls_yaml(None), routes()));
    sc.signal(Signal::SIGHUP);
    let applied = r#"fencegate_sidecar_config_reloads_total{result="applied"}"#;
    sc.wait_for_metric(applied, 1.0, Duration::from_secs(10)).await;
    assert_eq!(put(next.client(None)).await.unwrap().status, 200, "the new certificate is served");
    let e = put(pki.client(None)).await.unwrap_err();
    assert!(e.contains("certificate"), "the old certificate is still served: {e}");

    // A key that is not the certificate's: refused, the new one stays.
    let mismatched = format!("tls:\n  cert: {}\n  key: {}\n", pki.cert.display(), next.key.display());
    sc.rewrite_config(&format!("{mismatched}{}", routes()));
    sc.signal(Signal::SIGHUP);
    let refused = r#"fencegate_sidecar_config_reloads_total{result="refused"}"#;
    sc.wait_for_metric(refused, 1.0, Duration::from_secs(10)).await;
    assert_eq!(put(next.client(None)).await.unwrap().status, 200);
    assert!(sc.log().contains("`tls.key`"), "the refusal names the field");
    assert_eq!(up.tokens("/racks/6"), vec![Some(3); 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_is_dropped_after_header_timeout_and_holds_up_nobody() {
    use tokio::io::AsyncReadExt;
    let (_dir, pki, _up, sc) =
        https_sidecar(|pki| format!("limits: {{ header_timeout: 1s }}\n{}", pki.tls_yaml(None))).await;
    let mut stalled = tokio::net::TcpStream::connect(("127.0.0.1", sc.port)).await.unwrap();
    let started = tokio::time::Instant::now();
    // Others are served meanwhile.
    let r = https(&pki.client(None), sc.port, "localhost", false, "PUT", "/racks/4", Some(2)).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(started.elapsed() < Duration::from_millis(900), "served after {:?}", started.elapsed());
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf)).await.expect("stalled handshake kept");
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(3), "closed after {elapsed:?}");
    assert_eq!(n.unwrap_or(0), 0, "closed without a word");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_work_when_their_ca_is_trusted_and_get_502_when_not() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "main");
    let up = Upstream::start().await;
    // The HTTPS upstream: a second sidecar serving TLS in front of the recorder.
    let tls_upstream = sidecar(dir.path(), "tls-upstream", &up.url(), &pki.tls_yaml(None)).await;
    let upstream_url = format!("https://127.0.0.1:{}", tls_upstream.port);
    let trusting = format!("upstream_tls:\n  ca: {}\n", pki.ca.display());
    let sc = sidecar(dir.path(), "trusting", &upstream_url, &trusting).await;
    let (status, v) = sc.send("PUT", "/racks/5", Some(9), &[]).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(up.tokens("/racks/5"), vec![Some(9)]);
    // Each hop appended itself: plain HTTP into the first, TLS into the second.
    let fwd = forwarded(&up);
    assert!(fwd.contains("proto=http;") && fwd.contains("proto=https;"), "{fwd}");

    // Without `upstream_tls` the test CA is not among the public roots.
    let sceptic = sidecar(dir.path(), "sceptic", &upstream_url, "").await;
    let (status, v) = sceptic.send("PUT", "/racks/5", Some(10), &[]).await;
    assert_eq!((status, v["error"].as_str()), (502, Some("upstream_error")), "{v}");
    let message = v["message"].as_str().unwrap_or("");
    assert!(message.contains("certificate"), "{message}");
    assert_eq!(up.tokens("/racks/5"), vec![Some(9)]);
    // Plain http:// upstreams still work through the same connector.
    let plain = sidecar(dir.path(), "plain", &up.url(), &trusting).await;
    assert_eq!(raw("GET", &format!("{}/plain", plain.url()), None).await.0, 200);
}

#[test]
fn missing_or_bad_tls_files_exit_64_naming_the_field_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "main");
    let other = Pki::new(dir.path(), "other");
    let missing = dir.path().join("missing.pem");
    let port = free_port();
    let base = format!(
        "listen: 127.0.0.1:{port}\nupstream: http://127.0.0.1:9\nstate_dir: {}\n",
        dir.path().join("state").display()
    );
    let tls = |cert: &Path, key: &Path| format!("tls:\n  cert: {}\n  key: {}\n", cert.display(), key.display());
    for (section, field, file) in [
        (tls(&missing, &pki.key), "tls.cert", &missing),
        (tls(&pki.cert, &missing), "tls.key", &missing),
        (tls(&pki.cert, &other.key), "tls.key", &other.key),
        (tls(&pki.key, &pki.key), "tls.cert", &pki.key),
        (format!("{}  client_ca: {}\n", tls(&pki.cert, &pki.key), missing.display()), "tls.client_ca", &missing),
        (format!("upstream_tls:\n  ca: {}\n", missing.display()), "upstream_tls.ca", &missing),
    ] {
        let config = dir.path().join("sidecar.yaml");
        std::fs::write(&config, format!("{base}{section}{}", routes())).unwrap();
        let config = config.to_str().unwrap();
        for args in [vec!["check-config", config], vec!["sidecar", "--config", config]] {
            let out = bin!().run(&args, Duration::from_secs(10));
            let (code, err) = (out.code, out.stderr);
            assert_eq!(code, 64, "{args:?} {field}: {err}");
            assert!(err.contains(&format!("`{field}`")) && err.contains(&*file.to_string_lossy()), "{field}: {err}");
        }
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "{field}: bound before failing");
    }
    assert!(!dir.path().join("state").exists(), "state_dir was created before the TLS files were checked");
}
