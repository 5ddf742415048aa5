//! etcd v3 as the sidecar's lock service (`lock_service.kind: etcd`,
//! docs/decisions/0010): who holds a lock that `etcdctl lock NAME` (Go's
//! `concurrency.Mutex`) takes, read linearizably through etcd's JSON gateway
//! (`POST /v3/kv/range`), which every etcd since 3.4 serves beside gRPC.
//!
//! Lock key `NAME` is held by the key with the lowest `create_revision`
//! under `NAME/` (the recipe's own rule: each contender puts
//! `NAME/<lease id>` and waits for every key created before its own to go),
//! and that revision is the token: successive holders' revisions strictly
//! rise. A read answers as a fencegate node's does (`wire::LockInfo`): the
//! holder's token, held; or, with nothing under the prefix at the read's
//! revision R, `compacted_below: R`: every token up to R of this lock has
//! ended. etcd names its cluster in every answer: that is the history (S7).
//!
//! A range is linearizable unless asked otherwise (the leader confirms its
//! lead with a quorum, ReadIndex): a member cut off from the majority does
//! not answer it, and the next endpoint is tried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use fencegate_client::http::{HttpClient, Reply};
use fencegate_client::wire::LockInfo;
use http_body_util::Full;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;

/// One call to one member: a quorum read answers in milliseconds.
const CALL: Duration = Duration::from_secs(1);
/// One read, over every member tried: past it the answer would be too old
/// to vouch for anything (`max_staleness` is at most 10 s, 1 s by default).
const READ: Duration = Duration::from_secs(3);
/// How long a refused password is not tried again: each try costs etcd a
/// bcrypt check.
const LOGIN_BACKOFF: Duration = Duration::from_secs(1);
/// etcd's answers to what is asked here are small.
pub(crate) const MAX_ANSWER: usize = 64 << 10;

/// The members, how to reach them, and the credentials to present.
pub(crate) struct Etcd {
    endpoints: Vec<String>,
    http: HttpClient,
    user: Option<User>,
    /// The member that answered last: asked first next time.
    preferred: AtomicUsize,
}

/// etcd's user and password authentication: a password buys a token, sent
/// as `Authorization` until etcd refuses it (it expires), then bought again
/// by one caller while the others wait for it.
pub(crate) struct User {
    pub name: String,
    pub password: String,
    bought: tokio::sync::Mutex<Bought>,
}

#[derive(Default)]
struct Bought {
    token: Option<HeaderValue>,
    /// How many tokens were bought: a caller whose token (of this
    /// generation) was refused buys another only if nobody has since.
    generation: u64,
    /// The last refusal of the password, and when.
    refused: Option<(std::time::Instant, String)>,
}

impl User {
    pub(crate) fn new(name: String, password: String) -> User {
        User { name, password, bought: Default::default() }
    }
}

impl Etcd {
    pub(crate) fn new(endpoints: Vec<String>, http: HttpClient, user: Option<User>) -> Etcd {
        Etcd { endpoints, http, user, preferred: AtomicUsize::new(0) }
    }

    /// Who holds lock `name` now, read linearizably; trying each member
    /// once, the one that answered last first.
    pub(crate) async fn read(&self, name: &str) -> Result<LockInfo, String> {
        let prefix = format!("{name}/");
        let body = serde_json::json!({
            "key": B64.encode(&prefix),
            "range_end": B64.encode(prefix_end(prefix.as_bytes())),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "limit": 1,
            "keys_only": true,
            // The default, said: a serializable range is one member's view.
            "serializable": false,
        });
        let reply = self.call("/v3/kv/range", &body).await?;
        let range: Range = serde_json::from_slice(&reply.body).map_err(|e| format!("etcd's range answer: {e}"))?;
        Ok(holder(name, range))
    }

    /// Whether some member has a leader (`GET /health`, which needs no
    /// credentials).
    pub(crate) async fn healthy(&self) -> Result<(), String> {
        let mut tried = Vec::new();
        for endpoint in &self.endpoints {
            let url = format!("{}/health", endpoint.trim_end_matches('/'));
            match self.http.call(Method::GET, &url, None, CALL).await {
                Ok(r) if r.status == StatusCode::OK && healthy_answer(&r.body) => return Ok(()),
                Ok(r) => tried.push(format!("{url}: {} {}", r.status, String::from_utf8_lossy(&r.body).trim())),
                Err(e) => tried.push(format!("{url}: {e}")),
            }
        }
        Err(format!("no etcd member is healthy ({})", tried.join("; ")))
    }

    /// `path` with `body` on each member in turn until one answers 200,
    /// within `READ`. A member that fails is asked last next time.
    async fn call(&self, path: &str, body: &serde_json::Value) -> Result<Reply, String> {
        let deadline = std::time::Instant::now() + READ;
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut tried = Vec::new();
        for i in 0..n {
            if i > 0 && std::time::Instant::now() >= deadline {
                tried.push(format!("gave up after {READ:?}"));
                break;
            }
            let at = (first + i) % n;
            let url = format!("{}{path}", self.endpoints[at].trim_end_matches('/'));
            match self.call_one(&url, body).await {
                Ok(reply) => {
                    self.preferred.store(at, Ordering::Relaxed);
                    return Ok(reply);
                }
                Err(e) => {
                    let _ = self.preferred.compare_exchange(at, (at + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
                    tried.push(format!("{url}: {e}"));
                }
            }
        }
        Err(format!("no etcd member answered ({})", tried.join("; ")))
    }

    /// One member; with a user, buying a new token once if etcd refused the
    /// one presented.
    async fn call_one(&self, url: &str, body: &serde_json::Value) -> Result<Reply, String> {
        let bytes = Bytes::from(body.to_string());
        let mut refused_generation = None;
        for attempt in 0..2 {
            let token = match &self.user {
                Some(user) => Some(self.token(user, url, refused_generation).await?),
                None => None,
            };
            let mut req = Request::builder().method(Method::POST).uri(url).header(CONTENT_TYPE, "application/json");
            if let Some((token, _)) = &token {
                req = req.header(AUTHORIZATION, token);
            }
            let req = req.body(Full::new(bytes.clone())).map_err(|e| e.to_string())?;
            let reply = self.http.send(req, CALL).await.map_err(|e| e.to_string())?;
            match reply.status {
                StatusCode::OK => return Ok(reply),
                // An expired or revoked token: another, once.
                StatusCode::UNAUTHORIZED if token.is_some() && attempt == 0 => {
                    tracing::info!("etcd refused the user's token (expired?): buying another");
                    refused_generation = token.map(|(_, generation)| generation);
                }
                status => return Err(refused(status, &reply.body)),
            }
        }
        Err("etcd refused the user's fresh token".into())
    }

    /// The user's token and its generation: the one bought last, unless it
    /// is of `refused` (then another, bought from the member at `url`). One
    /// caller buys at a time; a refused password is not tried again for
    /// `LOGIN_BACKOFF`.
    async fn token(&self, user: &User, url: &str, refused: Option<u64>) -> Result<(HeaderValue, u64), String> {
        let mut bought = user.bought.lock().await;
        if let Some(token) = &bought.token {
            if refused != Some(bought.generation) {
                return Ok((token.clone(), bought.generation));
            }
        }
        if let Some((at, why)) = &bought.refused {
            if at.elapsed() < LOGIN_BACKOFF {
                return Err(why.clone());
            }
        }
        match self.authenticate(user, url).await {
            Ok(token) => {
                bought.generation += 1;
                (bought.token, bought.refused) = (Some(token.clone()), None);
                Ok((token, bought.generation))
            }
            Err(why) => {
                bought.refused = Some((std::time::Instant::now(), why.clone()));
                Err(why)
            }
        }
    }

    /// A token for `user`, from the member at `url`.
    async fn authenticate(&self, user: &User, url: &str) -> Result<HeaderValue, String> {
        let auth = url.rsplit_once("/v3/").map_or(url, |(base, _)| base).to_string() + "/v3/auth/authenticate";
        let body = serde_json::json!({ "name": user.name, "password": user.password });
        let reply = self
            .http
            .call(Method::POST, &auth, Some(body.to_string().into_bytes()), CALL)
            .await
            .map_err(|e| e.to_string())?;
        if reply.status != StatusCode::OK {
            return Err(refused(reply.status, &reply.body));
        }
        #[derive(Deserialize)]
        struct Authenticated {
            token: String,
        }
        let t: Authenticated = serde_json::from_slice(&reply.body).map_err(|e| format!("etcd's token: {e}"))?;
        let mut value =
            HeaderValue::from_str(&t.token).map_err(|_| "etcd's token is not a header value".to_string())?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// `/health`'s answer: `{"health": "true"}` when the member has a leader.
fn healthy_answer(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Health {
        health: String,
    }
    serde_json::from_slice::<Health>(body).is_ok_and(|h| h.health == "true")
}

/// etcd's refusal, as the gateway words it (`{"error": …, "code": …}`).
fn refused(status: StatusCode, body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Refusal {
        #[serde(default)]
        error: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Refusal>(body) {
        Ok(r) if !r.error.is_empty() => format!("{status}: {}", r.error),
        Ok(r) if !r.message.is_empty() => format!("{status}: {}", r.message),
        _ => format!("{status}"),
    }
}

/// The end of the range of every key that starts with `prefix`: the prefix
/// with its last byte below 0xff raised by one (etcd's `GetPrefixRangeEnd`);
/// `[0]`, every key, for a prefix of 0xff bytes only.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A `RangeResponse` as the gateway writes it: 64-bit numbers are strings
/// (proto3's JSON), empty fields are left out.
#[derive(Debug, Deserialize)]
struct Range {
    header: Header,
    #[serde(default)]
    kvs: Vec<KeyValue>,
}

#[derive(Debug, Deserialize)]
struct Header {
    #[serde(with = "number")]
    cluster_id: u64,
    #[serde(with = "number")]
    revision: u64,
}

#[derive(Debug, Deserialize)]
struct KeyValue {
    #[serde(with = "number")]
    create_revision: u64,
}

/// proto3's JSON writes a 64-bit integer as a string of digits.
mod number {
    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Number {
            Text(String),
            Plain(u64),
        }
        match Number::deserialize(d)? {
            Number::Plain(n) => Ok(n),
            Number::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The lock's holder from a range of its prefix sorted by create revision,
/// at most one key: a key's presence is its holding (its lease keeps it),
/// and with no key every token up to the read's revision has ended.
fn holder(name: &str, range: Range) -> LockInfo {
    // Asked for one, sorted: the least of what came, whatever came.
    let held = range.kvs.iter().map(|kv| kv.create_revision).min();
    LockInfo {
        key: name.to_string(),
        held: held.is_some(),
        token: held.unwrap_or(0),
        holder: None,
        expires_in_ms: None,
        compacted_below: if held.is_none() { Some(range.header.revision) } else { None },
        cluster: Some(format!("etcd:{:x}", range.header.cluster_id)),
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;

    use super::*;

    /// A stand-in for etcd's gateway with authentication on: password `pw`
    /// buys token `t<n>`, and only the latest token reads (a range of no
    /// key). Counts the logins tried.
    async fn gateway(logins: Arc<AtomicU64>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let logins = logins.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                        let logins = logins.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let token = req.headers().get(AUTHORIZATION).map(|v| v.to_str().unwrap().to_string());
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            // Slow, as bcrypt is: callers pile up meanwhile.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            let (status, answer) = match path.as_str() {
                                "/v3/auth/authenticate" => {
                                    let n = logins.fetch_add(1, Ordering::SeqCst) + 1;
                                    if body.windows(4).any(|w| w == b"\"pw\"") {
                                        (200, format!(r#"{{"token":"t{n}"}}"#))
                                    } else {
                                        (400, r#"{"error":"etcdserver: authentication failed"}"#.into())
                                    }
                                }
                                _ if token == Some(format!("t{}", logins.load(Ordering::SeqCst))) => {
                                    (200, r#"{"header":{"cluster_id":"1","revision":"5"}}"#.into())
                                }
                                _ => (401, r#"{"error":"etcdserver: invalid auth token"}"#.into()),
                            };
                            let mut resp = hyper::Response::new(Full::new(Bytes::from(answer)));
                            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        url
    }

    async fn reads(etcd: &Arc<Etcd>, n: usize) -> Vec<Result<LockInfo, String>> {
        let all = (0..n).map(|i| {
            let etcd = etcd.clone();
            tokio::spawn(async move { etcd.read(&format!("rack/{i}")).await })
        });
        let mut out = vec![];
        for r in all {
            out.push(r.await.unwrap());
        }
        out
    }

    /// Concurrent reads share one login, also when the token they had was
    /// refused; a refused password is not tried again at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_login_at_a_time_and_none_right_after_a_refusal() {
        let logins = Arc::new(AtomicU64::new(0));
        let url = gateway(logins.clone()).await;
        let user = |password: &str| Some(User::new("fence".into(), password.into()));
        let etcd = Arc::new(Etcd::new(vec![url.clone()], HttpClient::new(MAX_ANSWER), user("pw")));
        assert!(reads(&etcd, 10).await.iter().all(Result::is_ok));
        assert_eq!(logins.load(Ordering::SeqCst), 1, "ten reads, one login");
        // Another login elsewhere (a second sidecar) made this token stale.
        logins.fetch_add(1, Ordering::SeqCst);
        assert!(reads(&etcd, 10).await.iter().all(Result::is_ok));
        assert_eq!(logins.load(Ordering::SeqCst), 3, "the refused token replaced once");
        let wrong = Arc::new(Etcd::new(vec![url], HttpClient::new(MAX_ANSWER), user("guess")));
        let answers = reads(&wrong, 10).await;
        assert!(answers.iter().all(|a| a.as_ref().is_err_and(|e| e.contains("authentication failed"))), "{answers:?}");
        assert_eq!(logins.load(Ordering::SeqCst), 4, "a refused password, tried once");
    }

    #[test]
    fn a_prefix_ends_where_etcd_ends_it() {
        assert_eq!(prefix_end(b"rack/42/"), b"rack/420");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\x00");
    }

    /// The gateway's own words, from etcd 3.4 (numbers as strings, empty
    /// fields left out).
    #[test]
    fn the_holder_is_the_first_key_by_create_revision() {
        let held: Range = serde_json::from_str(
            r#"{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"12","raft_term":"2"},
               "kvs":[{"key":"cmFjay80Mi82OTRkNzdhYTllMzgyNjBm","create_revision":"9","mod_revision":"9","version":"1","lease":"7587862072907473679"}],
               "more":true,"count":"2"}"#,
        )
        .unwrap();
        let info = holder("rack/42", held);
        assert_eq!((info.held, info.token, info.compacted_below), (true, 9, None));
        assert_eq!(info.cluster.as_deref(), Some("etcd:cdf818194e3a8c32"));
        let free: Range =
            serde_json::from_str(r#"{"header":{"cluster_id":"14841639068965178418","revision":"13","raft_term":"2"}}"#)
                .unwrap();
        let info = holder("rack/42", free);
        assert_eq!((info.held, info.token, info.compacted_below), (false, 0, Some(13)));
        assert!(serde_json::from_str::<Range>(r#"{"header":{"cluster_id":"x","revision":"1"}}"#).is_err());
    }
}
