//! The bypass corpus: every spelling of a write to rack 1 that we know of,
//! sent to a real sidecar in front of the recording upstream, read by the
//! upstream as a lenient framework would (`fencegate_testkit::lenient`:
//! case-insensitive routes, `parseInt` ids and tokens, suffixes, override
//! and rewrite headers). Rack 1's floor is 5 (`observed`, so no lock service
//! is needed); every spelling carries the stale token 3, or none, or a
//! disguised one. For each: the sidecar's status and error; and over all of
//! them, that the upstream applied no write to rack 1 without a token of 5
//! or more. A spelling the sidecar keyed as another lock key (`rack/01`)
//! would pass its own, empty, floor with token 3, and fail that check.
//!
//! The corpus is data: a new spelling is one line.

use std::time::Duration;

use fencegate_testkit::lenient;
use fencegate_testkit::routes::{everything_else, table, Route};
use fencegate_testkit::upstream::{Recording, Seen};
use fencegate_testkit::{bin, Sidecar, Upstream};

/// How a case is sent.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// `method target HTTP/1.1`, the headers, a small body, `Connection: close`.
    H1,
    /// Over HTTP/2 (prior knowledge), `target` as `:path`.
    H2,
    /// `target` is the whole of what is written on the connection.
    Raw,
}

/// (via, method, target, headers, status, error); a `Raw` case's method
/// is its name; `error` "": the answer has no JSON error.
type Case = (Via, &'static str, &'static str, &'static [(&'static str, &'static str)], u16, &'static str);

use Via::{Raw, H1, H2};

/// The stale token.
const T3: (&str, &str) = ("x-fence-token", "3");

const CORPUS: &[Case] = &[
    // Letter case, ids and suffixes: fenced as rack/1, so stale.
    (H1, "PUT", "/racks/1", &[T3], 409, "stale_token"),
    (H1, "PUT", "/RACKS/1", &[T3], 409, "stale_token"),
    (H1, "PATCH", "/Racks/1", &[T3], 409, "stale_token"),
    (H1, "DELETE", "/rAcKs/1/", &[T3], 409, "stale_token"),
    (H1, "PUT", "/racks/01", &[T3], 409, "stale_token"),
    (H1, "PUT", "/racks/0001", &[T3], 409, "stale_token"),
    (H1, "PUT", "/racks/1.json", &[T3], 409, "stale_token"),
    (H1, "POST", "/RACKS/001.JSON", &[T3], 409, "stale_token"),
    (H1, "PUT", "/racks/1?x=1", &[T3], 409, "stale_token"),
    (H1, "PUT", "http://inventory/RACKS/1", &[T3], 409, "stale_token"),
    // Ids with no canonical form.
    (H1, "PUT", "/racks/1.", &[T3], 400, "invalid_param"),
    (H1, "PUT", "/racks/1.0", &[T3], 400, "invalid_param"),
    (H1, "PUT", "/racks/1.xml", &[T3], 400, "invalid_param"),
    (H1, "PUT", "/racks/1abc", &[T3], 400, "invalid_param"),
    (H1, "PUT", "/racks/+1", &[T3], 400, "invalid_param"),
    (H1, "PUT", "/racks/1.json.json", &[T3], 400, "invalid_param"),
    // Tokens.
    (H1, "PUT", "/racks/1", &[], 428, "missing_token"),
    (H1, "PUT", "/racks/1", &[("x-fence-token", "03")], 400, "malformed_token"),
    (H1, "PUT", "/racks/1", &[("x-fence-token", "9abc")], 400, "malformed_token"),
    (H1, "PUT", "/racks/1", &[("x-fence-token", "9"), T3], 400, "malformed_token"),
    (H1, "PUT", "/racks/1", &[("x-fence-token", "9, 3")], 400, "malformed_token"),
    (H1, "PUT", "/racks/1", &[("connection", "x-fence-token"), ("x-fence-token", "9")], 400, "disguised_request"),
    (H1, "PUT", "/racks/1", &[("connection", "close, X-Fence-Token"), ("x-fence-token", "9")], 400, "disguised_request"),
    // Overrides (rack-writes allows them: taken when both methods take it,
    // and then fenced) and rewrites (never taken).
    (H1, "GET", "/racks/1", &[("x-http-method-override", "PUT"), T3], 400, "disguised_request"),
    (H1, "POST", "/racks/1", &[("X-HTTP-Method", "DELETE"), T3], 409, "stale_token"),
    (H1, "POST", "/RACKS/01?_method=patch", &[T3], 409, "stale_token"),
    (H1, "POST", "/racks/1", &[("x-http-method-override", "GET"), T3], 400, "disguised_request"),
    (H1, "POST", "/racks/1", &[("x-http-method-override", "PURGE"), T3], 400, "disguised_request"),
    (H1, "POST", "/racks/1", &[("x-http-method-override", "PUT"), ("x-method-override", "DELETE"), T3], 400, "disguised_request"),
    (H1, "POST", "/racks/1?_method=DELETE", &[("x-http-method-override", "PATCH"), T3], 400, "disguised_request"),
    (H1, "GET", "/racks/1", &[("x-method-override", "PATCH")], 400, "disguised_request"),
    (H1, "GET", "/racks/1", &[("x-original-method", "PUT")], 400, "disguised_request"),
    (H1, "GET", "/racks/1?_method=PUT", &[T3], 400, "disguised_request"),
    (H1, "POST", "/other?a=1&_METHOD=delete", &[], 400, "disguised_request"),
    (H1, "POST", "/other", &[("x-original-url", "/racks/1")], 400, "disguised_request"),
    (H1, "POST", "/other", &[("x-rewrite-url", "/racks/1")], 400, "disguised_request"),
    (H1, "POST", "/other", &[("x-override-url", "/racks/1")], 400, "disguised_request"),
    // Methods the fenced route does not list.
    (H1, "PURGE", "/racks/1", &[T3], 400, "unfenced_write"),
    (H1, "MOVE", "/racks/1", &[T3], 400, "unfenced_write"),
    (H1, "COPY", "/racks/1", &[T3], 400, "unfenced_write"),
    (H1, "PROPPATCH", "/racks/1", &[T3], 400, "unfenced_write"),
    (H1, "MERGE", "/RACKS/01", &[T3], 400, "unfenced_write"),
    (H1, "put", "/racks/1", &[T3], 400, "malformed_method"),
    (H1, "Put", "/racks/1", &[T3], 400, "malformed_method"),
    // Paths that are not canonical.
    (H1, "PUT", "/racks/./1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/x/../racks/1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "//racks/1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks//1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks/%31", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/%72acks/1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks/%2531", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks%2F1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks;v=1/1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks/1;x", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks/%2e/1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks/%C0%AE/1", &[T3], 400, "malformed_path"),
    (H1, "PUT", "/racks\\1", &[T3], 400, "malformed_path"),
    // HTTP/2: the same rules on `:path`.
    (H2, "PUT", "/RACKS/01.json", &[T3], 409, "stale_token"),
    (H2, "PUT", "//racks/1", &[T3], 400, "malformed_path"),
    (H2, "PUT", "/racks/%31", &[T3], 400, "malformed_path"),
    (H2, "PUT", "/racks/1;x", &[T3], 400, "malformed_path"),
    (H2, "put", "/racks/1", &[T3], 400, "malformed_method"),
    (H2, "GET", "/racks/1", &[("x-http-method-override", "PUT"), T3], 400, "disguised_request"),
    (H2, "PUT", "/racks/1", &[("x-fence-token", "03")], 400, "malformed_token"),
    // Framing: smuggling a second request, or a body two parsers would
    // read differently. hyper reads chunked and drops a Content-Length next
    // to it (and closes the connection after such a request, so nothing
    // smuggled behind it is read); it refuses other codings, differing
    // lengths and malformed header lines itself, and the sidecar gives its
    // refusal a JSON body (`malformed_request`).
    (Raw, "CL+TE", "PUT /racks/1 HTTP/1.1\r\nHost: x\r\nx-fence-token: 3\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n", &[], 409, "stale_token"),
    (Raw, "TE+CL smuggling", "POST /other HTTP/1.1\r\nHost: x\r\nContent-Length: 64\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nPUT /racks/1 HTTP/1.1\r\nHost: x\r\nx-fence-token: 3\r\nConnection: close\r\n\r\n", &[], 200, ""),
    (Raw, "TE gzip,chunked", "PUT /other HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n0\r\n\r\n", &[], 400, "ambiguous_framing"),
    (Raw, "TE twice", "PUT /other HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\nConnection: close\r\n\r\n0\r\n\r\n", &[], 400, "malformed_request"),
    (Raw, "TE xchunked", "PUT /other HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\nConnection: close\r\n\r\n0\r\n\r\n", &[], 400, "malformed_request"),
    (Raw, "CL twice, differing", "PUT /racks/1 HTTP/1.1\r\nHost: x\r\nx-fence-token: 9\r\nContent-Length: 2\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", &[], 400, "malformed_request"),
    (Raw, "CL twice, equal", "PUT /racks/1 HTTP/1.1\r\nHost: x\r\nx-fence-token: 3\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab", &[], 409, "stale_token"),
    (Raw, "obs-fold token", "PUT /racks/1 HTTP/1.1\r\nHost: x\r\nx-fence-token: 3\r\n 9\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", &[], 400, "malformed_request"),
    (Raw, "space before colon", "PUT /racks/1 HTTP/1.1\r\nHost: x\r\nx-fence-token : 9\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", &[], 400, "malformed_request"),
    (Raw, "trailer token", "PUT /racks/1 HTTP/1.1\r\nHost: x\r\nx-fence-token: 3\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\nx-fence-token: 9\r\n\r\n", &[], 409, "stale_token"),
    (Raw, "pipelined", "GET /racks/1 HTTP/1.1\r\nHost: x\r\n\r\nPUT /RACKS/01 HTTP/1.1\r\nHost: x\r\nx-fence-token: 3\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", &[], 409, "stale_token"),
    (Raw, "HTTP/1.0", "PUT /RACKS/1 HTTP/1.0\r\nx-fence-token: 3\r\nContent-Length: 0\r\n\r\n", &[], 409, "stale_token"),
    (Raw, "bare LF", "PUT /racks/1 HTTP/1.1\nHost: x\nx-fence-token: 3\nContent-Length: 0\nConnection: close\n\n", &[], 409, "stale_token"),
];

/// Whether the upstream applied `seen` as a write to rack 1 below the floor.
fn violates(seen: &Seen, floor: u64) -> bool {
    lenient::write_of(seen).is_some_and(|w| w.collection == "racks" && w.id == 1 && w.token.is_none_or(|t| t < floor))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_a_write_reaches_a_lenient_upstream_unfenced() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start_on_own_thread(Recording::All);
    let routes = table(&[
        Route::fenced("rack-writes", "/racks/{rack:int}", "rack/{rack}", "{ mode: observed }")
            .methods(&["PUT", "POST", "PATCH", "DELETE"])
            .with("suffixes", "[json]")
            .with("allow_method_override", "true"),
        everything_else(),
    ]);
    let sc = Sidecar::start(&bin!(), dir.path().join("sc"), &up.url(), &[], &routes).await;
    let rejections = |m: String| fencegate_testkit::http::series_of(&m, "fencegate_sidecar_rejections_total");
    let at_start = rejections(sc.metrics().await);
    let floor = 5;
    let (status, v) = sc.send("PUT", "/racks/1", Some(floor), &[]).await;
    assert_eq!(status, 200, "{v}");

    let mut wrong = Vec::new();
    for (i, &(via, method, target, headers, status, error)) in CORPUS.iter().enumerate() {
        let (got, got_error) = match via {
            H1 => raw(sc.port, &h1(method, target, headers)).await,
            Raw => raw(sc.port, target).await,
            H2 => h2(sc.port, method, target, headers).await,
        };
        if (got, got_error.as_str()) != (status, error) {
            wrong.push(format!(
                "#{i} {via:?} {method} {target:?} {headers:?}: got {got} {got_error:?}, not {status} {error:?}"
            ));
        }
    }
    let applied = up.seen();
    let violations: Vec<_> = applied.iter().filter(|s| violates(s, floor)).collect();
    assert!(violations.is_empty(), "applied to rack 1 below its floor {floor}: {violations:#?}");
    assert!(wrong.is_empty(), "{} of {} cases:\n{}", wrong.len(), CORPUS.len(), wrong.join("\n"));
    // Each refusal was counted in a series there (at 0) since start-up, so
    // that an alert's increase() sees the first of its kind.
    let now = rejections(sc.metrics().await);
    let born: Vec<_> = now.difference(&at_start).collect();
    assert!(born.is_empty(), "rejection series born at their first event: {born:?}");
    // Safe reads still pass, whatever the spelling.
    assert_eq!(sc.send("GET", "/RACKS/01.json", None, &[]).await.0, 200);

    // The control arm: the same spellings sent straight to the upstream are
    // applied to rack 1 with token 3, and the check sees it.
    let direct = fencegate_testkit::http::raw_tcp(up.port, &h1("PUT", "/RACKS/01.json", &[T3])).await;
    assert!(direct.starts_with("HTTP/1.1 200"), "{direct}");
    let direct =
        fencegate_testkit::http::raw_tcp(up.port, &h1("GET", "/racks/1", &[("x-http-method-override", "PUT")])).await;
    assert!(direct.starts_with("HTTP/1.1 200"), "{direct}");
    let caught = up.seen().iter().filter(|s| violates(s, floor)).count();
    assert_eq!(caught, 2, "the check misses writes it should catch: {:#?}", up.seen());
}

fn h1(method: &str, target: &str, headers: &[(&str, &str)]) -> String {
    let body = r#"{"state":"drained"}"#;
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: inventory\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    format!("{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
}

/// Write `bytes`, read to the end (5 s at most): the last answer's status
/// (0 if none) and JSON `error` ("" if none).
async fn raw(port: u16, bytes: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    conn.write_all(bytes.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    let Some(at) = text.rfind("HTTP/1.") else { return (0, String::new()) };
    let status = text.get(at + 9..at + 12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text[at..].split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, error_of(body))
}

async fn h2(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(conn);
    let req = fencegate_testkit::http::request(method, &format!("http://inventory{path}"), None, headers, "{}");
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, error_of(&String::from_utf8_lossy(&body)))
}

fn error_of(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_default();
    v["error"].as_str().unwrap_or("").to_string()
}
