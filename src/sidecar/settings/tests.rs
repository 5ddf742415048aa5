//! The sidecar's config file, end to end: parsed, checked
//! (`SidecarConfig::check`) and compiled into `SidecarSettings`.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::config::sidecar::*;
use crate::config::upstream_url;

/// docs/DESIGN.md's example with every optional section filled in.
const FULL: &str = "
listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
lock_service:
  endpoints: [http://127.0.0.1:7401, http://127.0.0.1:7402, http://127.0.0.1:7403]
state_dir: ./data/sidecar
metrics_listen: 127.0.0.1:9464
limits:
  max_body: 10MiB
  max_header_bytes: 64KiB
  header_timeout: 10s
  body_timeout: 60s
  send_timeout: 60s
tls:
  cert: ./tls/cert.pem
  key: ./tls/key.pem
  client_ca: ./tls/ca.pem
upstream_tls:
  ca: ./tls/upstream-ca.pem
routes:
  - name: rack-writes
    methods: [PUT, POST, PATCH, DELETE]
    path: /racks/{rack}
    lock_key: rack/{rack}
    fence: { mode: strict, consistency: cached }
    missing_token: reject
    upstream: http://127.0.0.1:9001
    timeout: 30s
  - name: everything-else
    path: /{*rest}
    fence: off
";

/// Only the required keys.
const MINIMAL: &str = "
listen: 127.0.0.1:8080
upstream: https://inventory.internal
state_dir: ./data/sidecar
lock_service: { endpoints: [http://127.0.0.1:7401] }
routes:
  - name: racks
    path: /racks/{rack}
    lock_key: rack/{rack}
";

fn err(yaml: &str) -> String {
    SidecarConfig::from_yaml(yaml).unwrap_err().to_string()
}

/// The file as written, after checking that it validates.
fn parsed(yaml: &str) -> SidecarConfig {
    let c: SidecarConfig = crate::config::parse_yaml(yaml).unwrap();
    c.clone().validate().unwrap();
    c
}

#[test]
fn parses_the_full_example() {
    let c = parsed(FULL);
    assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.upstream, "http://127.0.0.1:9000");
    assert_eq!(c.lock_service.as_ref().unwrap().endpoints.len(), 3);
    assert_eq!(c.lock_service.as_ref().unwrap().max_staleness, DEFAULT_MAX_STALENESS);
    let set = parsed(&FULL.replace("7403]\n", "7403]\n  max_staleness: 400ms\n"));
    assert_eq!(set.lock_service.unwrap().max_staleness, Duration::from_millis(400));
    assert_eq!(c.state_dir, PathBuf::from("./data/sidecar"));
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(c.limits.max_body, 10 * MIB);
    assert_eq!(c.limits.max_header_bytes, 64 * KIB);
    assert_eq!(c.limits.header_timeout, Duration::from_secs(10));
    let tls = c.tls.as_ref().unwrap();
    assert_eq!(tls.cert, PathBuf::from("./tls/cert.pem"));
    assert_eq!(tls.key, PathBuf::from("./tls/key.pem"));
    assert_eq!(tls.client_ca, Some(PathBuf::from("./tls/ca.pem")));
    assert_eq!(c.upstream_tls.as_ref().unwrap().ca, PathBuf::from("./tls/upstream-ca.pem"));

    let [writes, rest] = &c.routes[..] else { panic!("two routes expected") };
    assert_eq!(writes.name, "rack-writes");
    assert_eq!(writes.methods.as_deref(), Some(&["PUT", "POST", "PATCH", "DELETE"].map(String::from)[..]));
    assert_eq!(writes.path, "/racks/{rack}");
    assert_eq!(writes.lock_key.as_deref(), Some("rack/{rack}"));
    assert_eq!(writes.fence, Fence::On { mode: FenceMode::Strict, consistency: Consistency::Cached });
    assert_eq!(writes.missing_token, MissingToken::Reject);
    assert_eq!(writes.upstream.as_deref(), Some("http://127.0.0.1:9001"));
    assert_eq!(writes.timeout, Duration::from_secs(30));

    assert_eq!(rest.name, "everything-else");
    assert_eq!(rest.methods, None);
    assert_eq!(rest.path, "/{*rest}");
    assert_eq!(rest.lock_key, None);
    assert_eq!(rest.fence, Fence::Off);
    assert!(!rest.fence.is_fenced() && !rest.fence.needs_lock_service());
}

#[test]
fn defaults() {
    let c = parsed(MINIMAL);
    assert_eq!(c.metrics_listen, None);
    assert!(c.tls.is_none() && c.upstream_tls.is_none());
    assert_eq!(c.limits.max_body, 10 * MIB);
    assert_eq!(c.limits.max_header_bytes, 64 * KIB);
    assert_eq!(c.limits.header_timeout, Duration::from_secs(10));
    assert_eq!(c.limits.drain_timeout, Duration::from_secs(10));
    let r = &c.routes[0];
    assert_eq!(r.methods, None);
    assert_eq!(r.upstream, None);
    assert_eq!(r.missing_token, MissingToken::Reject);
    assert_eq!(r.timeout, DEFAULT_ROUTE_TIMEOUT);
    // No `fence` line is the safe choice, not "off".
    assert_eq!(r.fence, Fence::On { mode: FenceMode::Strict, consistency: Consistency::Cached });
    assert!(r.fence.needs_lock_service());

    let c = parsed(&MINIMAL.replace("lock_key", "fence: {}\n    lock_key"));
    assert_eq!(c.routes[0].fence, Fence::default());
    let c = parsed(&format!("{MINIMAL}limits: {{ max_body: 1KiB }}\n"));
    assert_eq!((c.limits.max_body, c.limits.max_header_bytes), (KIB, 64 * KIB));
}

#[test]
fn fence_is_off_or_a_mapping() {
    let with = |fence: &str| MINIMAL.replace("lock_key", &format!("fence: {fence}\n    lock_key"));
    for (fence, mode, consistency) in [
        ("{ mode: monotonic }", FenceMode::Monotonic, Consistency::Cached),
        ("{ consistency: linearizable }", FenceMode::Strict, Consistency::Linearizable),
        ("{ mode: observed, consistency: cached }", FenceMode::Observed, Consistency::Cached),
    ] {
        let c = parsed(&with(fence));
        assert_eq!(c.routes[0].fence, Fence::On { mode, consistency }, "{fence}");
    }
    let off = MINIMAL.replace("lock_key: rack/{rack}", "fence: off");
    assert_eq!(parsed(&off).routes[0].fence, Fence::Off);
    let off = MINIMAL.replace("lock_key: rack/{rack}", "fence: \"off\"");
    assert_eq!(parsed(&off).routes[0].fence, Fence::Off);

    for (fence, says) in [
        ("on", "`off` or a mapping"),
        ("Off", "`off` or a mapping"),
        ("false", "`off` or a mapping"),
        ("0", "`off` or a mapping"),
        ("[strict]", "`off` or a mapping"),
        ("{ mode: strikt }", "strikt"),
        ("{ mode: strict, consistency: eventual }", "eventual"),
        ("{ mode: strict, colour: blue }", "colour"),
    ] {
        let e = err(&with(fence));
        assert!(e.contains("routes[0].fence") && e.contains(says) && e.contains("line"), "{fence}: {e}");
    }
}

#[test]
fn unknown_keys_are_errors_with_a_line() {
    for (from, to, key) in [
        ("state_dir:", "colour: blue\nstate_dir:", "colour"),
        ("lock_service: { endpoints:", "lock_service: { endpionts:", "endpionts"),
        ("max_body: 10MiB", "max_bodyy: 10MiB", "max_bodyy"),
        ("client_ca:", "client_cert:", "client_cert"),
        ("ca: ./tls/upstream", "cert: ./tls/upstream", "cert"),
        ("    timeout: 30s", "    timout: 30s", "timout"),
    ] {
        let base = if from.starts_with("lock_service") { MINIMAL } else { FULL };
        assert!(base.contains(from), "{from}");
        let e = err(&base.replace(from, to));
        assert!(e.contains(key) && e.contains("line"), "{key}: {e}");
    }
}

#[test]
fn byte_sizes() {
    for (text, bytes) in [
        ("0", Some(0)),
        ("512", Some(512)),
        ("512B", Some(512)),
        ("64KiB", Some(64 * KIB)),
        ("10 MiB", Some(10 * MIB)),
        (" 1GiB ", Some(GIB)),
        ("10MB", None),
        ("10mib", None),
        ("1.5MiB", None),
        ("-1", None),
        ("MiB", None),
        ("", None),
        ("99999999999999999999GiB", None),
        ("17179869184GiB", None),
    ] {
        assert_eq!(parse_byte_size(text), bytes, "{text:?}");
    }
    let c = parsed(&FULL.replace("max_body: 10MiB", "max_body: 4096"));
    assert_eq!(c.limits.max_body, 4096);
    for bad in ["max_body: -5", "max_body: 10MB", "max_body: 1.5", "max_body: [1]"] {
        let e = err(&FULL.replace("max_body: 10MiB", bad));
        assert!(e.contains("max_body") && e.contains("byte size"), "{bad}: {e}");
    }
}

#[test]
fn bad_values_name_the_field() {
    for (from, to, field) in [
        // limits
        ("max_body: 10MiB", "max_body: 0", "limits.max_body"),
        ("max_body: 10MiB", "max_body: 2GiB", "limits.max_body"),
        ("max_header_bytes: 64KiB", "max_header_bytes: 4KiB", "limits.max_header_bytes"),
        ("max_header_bytes: 64KiB", "max_header_bytes: 2MiB", "limits.max_header_bytes"),
        ("header_timeout: 10s", "header_timeout: 0s", "limits.header_timeout"),
        ("header_timeout: 10s", "header_timeout: 6m", "limits.header_timeout"),
        ("header_timeout: 10s", "header_timeout: soon", "header_timeout"),
        ("body_timeout: 60s", "body_timeout: 0s", "limits.body_timeout"),
        ("body_timeout: 60s", "body_timeout: 2h", "limits.body_timeout"),
        ("send_timeout: 60s", "send_timeout: 0s", "limits.send_timeout"),
        ("header_timeout: 10s", "header_timeout: 10s\n  drain_timeout: 0s", "limits.drain_timeout"),
        ("header_timeout: 10s", "header_timeout: 10s\n  drain_timeout: 2h", "limits.drain_timeout"),
        ("header_timeout: 10s", "header_timeout: 10s\n  max_connections: 0", "limits.max_connections"),
        // addresses
        ("metrics_listen: 127.0.0.1:9464", "metrics_listen: 127.0.0.1:8080", "metrics_listen"),
        ("listen: 127.0.0.1:8080", "listen: localhost", "listen"),
        ("state_dir: ./data/sidecar", "state_dir: ''", "state_dir"),
        ("state_dir: ./data/sidecar", "state_dir: ./data/sidecar\nworkers: 0", "workers"),
        ("state_dir: ./data/sidecar", "state_dir: ./data/sidecar\nworkers: 257", "workers"),
        // upstreams
        ("upstream: http://127.0.0.1:9000", "upstream: 127.0.0.1:9000", "upstream"),
        ("upstream: http://127.0.0.1:9000", "upstream: ftp://127.0.0.1:9000", "upstream"),
        ("upstream: http://127.0.0.1:9000", "upstream: http://127.0.0.1:9000/api", "upstream"),
        ("upstream: http://127.0.0.1:9001", "upstream: http://127.0.0.1:9001?x=1", "routes[0].upstream"),
        ("upstream: http://127.0.0.1:9001", "upstream: http://u:p@127.0.0.1:9001", "routes[0].upstream"),
        // lock service
        ("http://127.0.0.1:7403]", "https://127.0.0.1:7403]", "lock_service.endpoints[2]"),
        ("http://127.0.0.1:7403]", "http://127.0.0.1:7401]", "lock_service.endpoints[2]"),
        ("[http://127.0.0.1:7401, http://127.0.0.1:7402, http://127.0.0.1:7403]", "[]", "lock_service.endpoints"),
        ("7403]\n", "7403]\n  max_staleness: 10ms\n", "lock_service.max_staleness"),
        ("7403]\n", "7403]\n  max_staleness: 11s\n", "lock_service.max_staleness"),
        ("7403]\n", "7403]\n  max_staleness: soon\n", "max_staleness"),
        // routes
        ("  - name: rack-writes", "  - name: ''", "routes[0].name"),
        ("  - name: rack-writes", "  - name: rack writes", "routes[0].name"),
        ("  - name: rack-writes", "  - name: rack/writes", "routes[0].name"),
        ("  - name: everything-else", "  - name: rack-writes", "routes[1].name"),
        ("methods: [PUT, POST, PATCH, DELETE]", "methods: [PUT, put]", "routes[0].methods"),
        ("methods: [PUT, POST, PATCH, DELETE]", "methods: [PUT, POST, PUT]", "routes[0].methods"),
        ("methods: [PUT, POST, PATCH, DELETE]", "methods: ['GET /']", "routes[0].methods"),
        ("methods: [PUT, POST, PATCH, DELETE]", "methods: []", "routes[0].methods"),
        ("    lock_key: rack/{rack}\n", "", "routes[0].lock_key"),
        ("    fence: off", "    fence: off\n    lock_key: all", "routes[1].lock_key"),
        ("lock_key: rack/{rack}", "lock_key: rack/{id}", "routes[0].lock_key"),
        ("lock_key: rack/{rack}", "lock_key: rack//{rack}", "routes[0].lock_key"),
        ("lock_key: rack/{rack}", "lock_key: rack/{rack", "routes[0].lock_key"),
        // idempotency
        ("    missing_token: reject\n", "    idempotency: { retention: 30s }\n", "routes[0].idempotency.retention"),
        ("    missing_token: reject\n", "    idempotency: { retention: 31d }\n", "routes[0].idempotency.retention"),
        (
            "    missing_token: reject\n",
            "    idempotency: { max_response: 65MiB }\n",
            "routes[0].idempotency.max_response",
        ),
        ("    fence: off", "    fence: off\n    idempotency: {}", "routes[1].idempotency"),
        (
            "    missing_token: reject\n",
            "    idempotency: { max_response: 1MiB, per_lock_key: 1MiB }\n",
            "routes[0].idempotency.per_lock_key",
        ),
        (
            "    missing_token: reject\n",
            "    idempotency: { per_lock_key: 65MiB }\n",
            "routes[0].idempotency.per_lock_key",
        ),
        ("    missing_token: reject\n", "    idempotency: { per_lock_key: lots }\n", "per_lock_key"),
        ("  header_timeout: 10s", "  header_timeout: 10s\n  idempotency_store: 1KiB", "limits.idempotency_store"),
        ("path: /racks/{rack}", "path: racks/{rack}", "routes[0].path"),
        ("path: /racks/{rack}", "path: /racks/{rack}/", "routes[0].path"),
        ("path: /racks/{rack}", "path: /racks/{rack}.json", "routes[0].path"),
        ("path: /racks/{rack}", "path: /racks/{*rack}/x", "routes[0].path"),
        ("path: /racks/{rack}", "path: /racks/{rack}/{rack}", "routes[0].path"),
        ("path: /racks/{rack}", "path: /racks/../{rack}", "routes[0].path"),
        ("path: /{*rest}", "path: /{1st}", "routes[1].path"),
        ("timeout: 30s", "timeout: 0s", "routes[0].timeout"),
        ("timeout: 30s", "timeout: 2h", "routes[0].timeout"),
        (
            "mode: strict, consistency: cached",
            "mode: observed, consistency: linearizable",
            "routes[0].fence.consistency",
        ),
    ] {
        assert!(FULL.contains(from), "{from}");
        let e = err(&FULL.replacen(from, to, 1));
        assert!(e.contains(field), "{from} -> {to}: {e}");
    }
    let before_routes = FULL.split("routes:").next().unwrap();
    let e = err(before_routes);
    assert!(e.contains("missing field `routes`"), "{e}");
    let e = err(&format!("{before_routes}routes: []\n"));
    assert!(e.contains("`routes`"), "{e}");
    let ten = (1..=10).map(|i| format!("http://127.0.0.1:{}", 7400 + i)).collect::<Vec<_>>().join(", ");
    let e = err(&MINIMAL.replace("[http://127.0.0.1:7401]", &format!("[{ten}]")));
    assert!(e.contains("lock_service.endpoints"), "{e}");
}

/// A lock key's quota: a share of the store by default, never less
/// than one pending record's room, never more than the store.
#[test]
fn a_lock_keys_idempotency_quota_defaults_to_a_share_of_the_store() {
    let quota = |idempotency: &str, limits: &str| {
        let yaml = FULL
            .replace("    missing_token: reject\n", &format!("    idempotency: {idempotency}\n"))
            .replace("  send_timeout: 60s\n", &format!("  send_timeout: 60s\n{limits}"));
        let routes = SidecarConfig::from_yaml(&yaml).unwrap().routes;
        let first = routes.iter().next().unwrap().idempotency.unwrap();
        first.per_lock_key
    };
    assert_eq!(quota("{}", ""), 4 * MIB, "a sixteenth of the default 64MiB");
    assert_eq!(quota("{}", "  idempotency_store: 1GiB\n"), 64 * MIB);
    assert_eq!(quota("{ max_response: 8MiB }", ""), 8 * MIB + 8 * KIB, "room for one answer");
    assert_eq!(quota("{ max_response: 64MiB }", "  idempotency_store: 64MiB\n"), 64 * MIB, "at most the store");
    assert_eq!(quota("{ per_lock_key: 2MiB }", ""), 2 * MIB);
}

#[test]
fn lock_service_is_needed_only_by_strict_and_monotonic_routes() {
    let without = MINIMAL.replace("lock_service: { endpoints: [http://127.0.0.1:7401] }\n", "");
    let e = err(&without);
    assert!(e.contains("`lock_service`") && e.contains("\"racks\""), "{e}");
    let e = err(&without.replace("lock_key", "fence: { mode: monotonic }\n    lock_key"));
    assert!(e.contains("`lock_service`"), "{e}");
    let observed = without.replace("lock_key", "fence: { mode: observed }\n    lock_key");
    assert!(parsed(&observed).lock_service.is_none());
    let off = without.replace("lock_key: rack/{rack}", "fence: off");
    assert!(SidecarConfig::from_yaml(&off).is_ok());
    // Present but unused is still checked.
    let e = err(&MINIMAL.replace("lock_key: rack/{rack}", "fence: off").replace("[http://127.0.0.1:7401]", "[x]"));
    assert!(e.contains("lock_service.endpoints[0]"), "{e}");
}

#[test]
fn routes_that_would_unfence_by_accident_are_refused_naming_both() {
    let catch_all = "  - { name: all, path: '/{*rest}', fence: off }\n";
    let fenced = "  - { name: racks, methods: [PUT], path: '/racks/{rack}', lock_key: 'rack/{rack}' }\n";
    let table = |routes: &str| MINIMAL.split("routes:").next().unwrap().to_string() + "routes:\n" + routes;
    parsed(&table(&format!("{fenced}{catch_all}")));
    let e = err(&table(&format!("{catch_all}{fenced}")));
    assert!(
        e.contains("routes[1]") && e.contains("\"racks\"") && e.contains("\"all\"") && e.contains("PUT /racks/x"),
        "{e}"
    );
    let reads = "  - { name: reads, methods: [GET], path: '/{*rest}', fence: off }\n";
    parsed(&table(&format!("{reads}{fenced}")));
    let typo = fenced.replace("[PUT]", "[PUTT]");
    let e = err(&table(&typo));
    assert!(e.contains("routes[0].methods") && e.contains("PUTT"), "{e}");
    parsed(&table(&fenced.replace("[PUT]", "[PUT, PURGE, X-FLASH]")));
}

#[test]
fn the_lock_service_credentials_need_tls_off_this_machine() {
    let with = |service: &str| MINIMAL.replace("{ endpoints: [http://127.0.0.1:7401] }", service);
    parsed(&with("{ endpoints: [http://127.0.0.1:7401], token_file: t }"));
    let e = err(&with("{ endpoints: [http://10.0.0.1:7401], token_file: t }"));
    assert!(e.contains("lock_service.token_file") && e.contains("clear text"), "{e}");
    parsed(&with("{ endpoints: [https://10.0.0.1:7401], ca: ca.pem, token_file: t }"));
    let e = err(&with("{ endpoints: [http://10.0.0.1:7401], ca: ca.pem }"));
    assert!(e.contains("https://"), "{e}");
    let e = err(&with("{ endpoints: [https://10.0.0.1:7401], cert: c.pem, key: k.pem }"));
    assert!(e.contains("lock_service.ca"), "{e}");
    let e = err(&with("{ endpoints: [https://10.0.0.1:7401], ca: ca.pem, cert: c.pem }"));
    assert!(e.contains("lock_service.cert"), "{e}");
}

/// etcd takes users and passwords, fencegate bearer tokens; etcd follows a
/// `cached` route's keys under the fixed text its lock key starts with, so
/// one that starts with a placeholder is refused with the field to change
/// (a `linearizable` one reads per request, and may).
#[test]
fn each_kind_of_lock_service_takes_its_own_credentials_and_routes() {
    let with = |service: &str| MINIMAL.replace("{ endpoints: [http://127.0.0.1:7401] }", service);
    let linearizable = |yaml: String| {
        yaml.replace("lock_key: rack/{rack}", "lock_key: rack/{rack}\n    fence: { consistency: linearizable }")
    };
    let etcd = "{ kind: etcd, endpoints: [http://127.0.0.1:2379] }";
    let c = parsed(&with(etcd));
    assert_eq!(c.lock_service.unwrap().kind, crate::config::sidecar::LockServiceKind::Etcd);
    let anywhere = |yaml: String| yaml.replace("lock_key: rack/{rack}", "lock_key: '{rack}'");
    let e = err(&anywhere(with(etcd)));
    assert!(e.contains("routes[0].lock_key") && e.contains("linearizable"), "{e}");
    parsed(&anywhere(linearizable(with(etcd))));
    let fencegate = "{ endpoints: [http://127.0.0.1:7401] }";
    parsed(&anywhere(with(fencegate)));
    parsed(&linearizable(with("{ kind: etcd, endpoints: [http://127.0.0.1:2379], user: fence, password_file: p }")));
    for (service, field) in [
        ("{ kind: etcd, endpoints: [http://127.0.0.1:2379], token_file: t }", "lock_service.token_file"),
        ("{ kind: etcd, endpoints: [http://127.0.0.1:2379], user: fence }", "lock_service.user"),
        ("{ kind: etcd, endpoints: [http://127.0.0.1:2379], password_file: p }", "lock_service.user"),
        ("{ endpoints: [http://127.0.0.1:7401], user: fence, password_file: p }", "lock_service.user"),
        ("{ kind: etcd, endpoints: [http://10.0.0.1:2379], user: u, password_file: p }", "lock_service.password_file"),
        ("{ kind: consul, endpoints: [http://127.0.0.1:8500] }", "kind"),
    ] {
        let e = err(&linearizable(with(service)));
        assert!(e.contains(field), "{service}: {e}");
    }
}

/// ZooKeeper: `host:port` endpoints, digest credentials kept to loopback
/// (no TLS), lock keys without the znode's leading `/`, and a `cached`
/// route's placeholders in its last segment, below a znode other than `/`.
#[test]
fn zookeeper_takes_host_port_endpoints_and_followable_znodes() {
    let with = |service: &str| MINIMAL.replace("{ endpoints: [http://127.0.0.1:7401] }", service);
    let key = |yaml: String, key: &str| yaml.replace("lock_key: rack/{rack}", &format!("lock_key: '{key}'"));
    let linearizable = |yaml: String| yaml.replace("lock_key:", "fence: { consistency: linearizable }\n    lock_key:");
    let zk = "{ kind: zookeeper, endpoints: [127.0.0.1:2181, 'zk-2.example:2181'] }";
    let c = parsed(&with(zk));
    assert_eq!(c.lock_service.unwrap().kind, crate::config::sidecar::LockServiceKind::ZooKeeper);
    parsed(&key(with(zk), "locks/db"));
    parsed(&linearizable(key(with(zk), "{rack}")));
    parsed(&with("{ kind: zookeeper, endpoints: ['[::1]:2181'], user: fence, password_file: p }"));
    for (yaml, field) in [
        (key(with(zk), "rack-{rack}"), "routes[0].lock_key"),
        (key(with(zk), "locks/{rack}/x"), "routes[0].lock_key"),
        (key(with(zk), "/locks/rack-{rack}"), "leading '/'"),
        (with("{ kind: zookeeper, endpoints: [http://127.0.0.1:2181] }"), "host:port"),
        (with("{ kind: zookeeper, endpoints: ['127.0.0.1:2181/chroot'] }"), "host:port"),
        (with("{ kind: zookeeper, endpoints: ['a:1,b:2'] }"), "host:port"),
        (with("{ kind: zookeeper, endpoints: ['127.0.0.1'] }"), "host:port"),
        (with("{ kind: zookeeper, endpoints: ['127.0.0.1:0'] }"), "host:port"),
        (with("{ kind: zookeeper, endpoints: ['127.0.0.1:2181', '127.0.0.1:2181'] }"), "twice"),
        (with("{ kind: zookeeper, endpoints: ['10.0.0.1:2181'], user: u, password_file: p }"), "clear text"),
        (with("{ kind: zookeeper, endpoints: ['127.0.0.1:2181'], user: 'u:x', password_file: p }"), "':'"),
        (with("{ kind: zookeeper, endpoints: ['127.0.0.1:2181'], token_file: t }"), "lock_service.token_file"),
        (with("{ kind: zookeeper, endpoints: ['127.0.0.1:2181'], ca: ca.pem }"), "not supported"),
    ] {
        let e = err(&yaml);
        assert!(e.contains(field), "{yaml}: {e}");
    }
}

#[test]
fn listen_ports_may_both_be_os_assigned() {
    let yaml = FULL.replace("127.0.0.1:8080", "127.0.0.1:0").replace("127.0.0.1:9464", "127.0.0.1:0");
    assert!(SidecarConfig::from_yaml(&yaml).is_ok());
}

#[test]
fn upstream_urls() {
    for ok in [
        "http://127.0.0.1:9000",
        "https://inventory.internal",
        "https://inventory.internal:8443/",
        "http://[::1]:9000",
        "http://inventory",
    ] {
        assert!(upstream_url("u", ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        "inventory:9000",
        "/api",
        "ftp://inventory",
        "http://",
        "http://inventory/api",
        "http://inventory?x=1",
        "http://user:secret@inventory",
        "http://inventory:99999",
        "http://inventory:",
        "http://[::1]:x",
    ] {
        let Err(e) = upstream_url("routes[3].upstream", bad) else { panic!("{bad:?} accepted") };
        let e = e.to_string();
        assert!(e.contains("routes[3].upstream"), "{bad}: {e}");
    }
}

#[test]
fn load_reads_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecar.yaml");
    std::fs::write(&path, FULL).unwrap();
    assert_eq!(SidecarConfig::load(&path).unwrap().routes.iter().count(), 2);
    let e = SidecarConfig::load(&dir.path().join("missing.yaml")).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e}");
}
