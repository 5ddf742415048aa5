//! etcd's lock recipe (`concurrency.Mutex`, what `etcdctl lock NAME` does),
//! spoken through etcd's JSON gateway, held as a fencegate [`Lease`]: the
//! same keepalives, validity (L4) and loss. Its token is the create
//! revision of the holder's key, which a sidecar with `lock_service.kind:
//! etcd` checks (docs/decisions/0010).
//!
//! The recipe: a lease of the TTL; the key `NAME/<lease id in hex>` put
//! under it if absent; held once no key under `NAME/` was created before
//! it. It interoperates with `etcdctl lock` and Go's `Mutex` on the same
//! name: they queue by the same rule.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;
use tokio::time::Instant;

use crate::client::{Client, ClientError};
use crate::http::Reply;
use crate::lease::Lease;
use crate::wire::Token;

/// How often a waiter asks whether the keys before its own are gone.
const POLL: Duration = Duration::from_millis(100);

impl Client {
    /// Take lock `name` of the etcd behind this client's endpoints (their
    /// client URLs), waiting up to `wait` behind earlier holders. The lease
    /// is granted `ttl` (whole seconds, at least etcd's minimum) and kept
    /// alive from the grant on, through the wait. Someone still ahead after
    /// `wait`: [`ClientError::Held`] with the first key's create revision,
    /// and the lease revoked (its key goes with it).
    pub async fn acquire_etcd(&self, name: &str, ttl: Duration, wait: Duration) -> Result<Lease, ClientError> {
        let sent = Instant::now();
        #[derive(Deserialize)]
        struct Granted {
            #[serde(rename = "ID", with = "number")]
            id: u64,
            #[serde(rename = "TTL", with = "number")]
            ttl: u64,
        }
        let ask = serde_json::json!({ "TTL": ttl.as_secs().max(1) });
        let g: Granted = decode(self.etcd_call("/v3/lease/grant", &ask).await?)?;
        let ttl = Duration::from_secs(g.ttl);
        let mut lease =
            Lease::start_on(self.clone(), true, name.to_string(), 0, g.id.to_string(), ttl, sent).hand_out();
        match self.queue(name, g.id, wait, &lease).await {
            Ok(token) => {
                lease.set_token(token);
                Ok(lease)
            }
            Err(e) => {
                // Its key goes with it: nobody waits behind a waiter gone.
                let _ = lease.release().await;
                Err(e)
            }
        }
    }

    /// Put `name/<id>` under lease `id` if absent, then wait until no key
    /// under `name/` was created before it; its create revision.
    async fn queue(&self, name: &str, id: u64, wait: Duration, lease: &Lease) -> Result<Token, ClientError> {
        let deadline = Instant::now() + wait;
        let key = B64.encode(format!("{name}/{id:x}"));
        let put = serde_json::json!({
            "compare": [{ "key": key, "target": "CREATE", "create_revision": 0 }],
            "success": [{ "request_put": { "key": key, "value": "", "lease": id.to_string() } }],
            "failure": [{ "request_range": { "key": key } }],
        });
        let txn: Txn = decode(self.etcd_call("/v3/kv/txn", &put).await?)?;
        let mine = match (txn.succeeded, txn.responses.first()) {
            (true, _) => txn.header.revision,
            (false, Some(Op { response_range: Some(r) })) => r.kvs.first().map_or(0, |kv| kv.create_revision),
            _ => 0,
        };
        if mine == 0 {
            return Err(ClientError::Protocol(format!("etcd's answer to putting {name}/{id:x} names no revision")));
        }
        let prefix = format!("{name}/");
        let before = serde_json::json!({
            "key": B64.encode(&prefix),
            "range_end": B64.encode(prefix_end(prefix.as_bytes())),
            "max_create_revision": mine - 1,
            "sort_order": "DESCEND",
            "sort_target": "CREATE",
            "limit": 1,
            "keys_only": true,
        });
        let lost = || ClientError::Unavailable(format!("the lease was lost while waiting for {name}"));
        loop {
            let ahead: Range = decode(self.etcd_call("/v3/kv/range", &before).await?)?;
            if !lease.is_valid() {
                return Err(lost());
            }
            let Some(first) = ahead.kvs.first() else {
                // Nothing ahead is the lock only while the key is still
                // ours: a lease that ran out while this waiter was paused
                // took the key with it, and a later waiter may hold the
                // lock now (as Go's Mutex checks after its wait).
                let own: Range = decode(self.etcd_call("/v3/kv/range", &serde_json::json!({ "key": key })).await?)?;
                if own.kvs.first().map(|kv| kv.create_revision) != Some(mine) || !lease.is_valid() {
                    return Err(lost());
                }
                return Ok(mine);
            };
            if Instant::now() >= deadline {
                let token = first.create_revision;
                return Err(ClientError::Held { key: name.to_string(), holder: None, token, lock_delay: false });
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    /// Renew etcd lease `id`; [`ClientError::LeaseNotFound`] once etcd no
    /// longer has it (its answer carries no TTL then).
    pub(crate) async fn etcd_keepalive(&self, id: &str) -> Result<(), ClientError> {
        #[derive(Deserialize)]
        struct Line {
            result: Kept,
        }
        #[derive(Deserialize)]
        struct Kept {
            #[serde(rename = "TTL", default, with = "number")]
            ttl: u64,
        }
        let kept: Line = decode(self.etcd_call("/v3/lease/keepalive", &serde_json::json!({ "ID": id })).await?)?;
        if kept.result.ttl == 0 {
            return Err(ClientError::LeaseNotFound);
        }
        Ok(())
    }

    /// Revoke etcd lease `id`: its keys (the lock's) go with it.
    pub(crate) async fn etcd_revoke(&self, id: &str) -> Result<(), ClientError> {
        self.etcd_call("/v3/lease/revoke", &serde_json::json!({ "ID": id })).await.map(drop)
    }

    /// POST `body` to `path` on each endpoint in turn until one answers;
    /// a refusal is returned as it is (`lease not found` as
    /// [`ClientError::LeaseNotFound`]).
    async fn etcd_call(&self, path: &str, body: &serde_json::Value) -> Result<Reply, ClientError> {
        let bytes = Bytes::from(body.to_string());
        let timeout = self.options().request_timeout;
        let mut tried = Vec::new();
        for endpoint in self.endpoints() {
            let url = format!("{endpoint}{path}");
            let req = Request::builder()
                .method(Method::POST)
                .uri(&url)
                .header(CONTENT_TYPE, "application/json")
                .body(Full::new(bytes.clone()))
                .map_err(|_| ClientError::BadEndpoint(endpoint.clone(), "not a URL".into()))?;
            match self.http().send(req, timeout).await {
                Ok(reply) if reply.status == StatusCode::OK => return Ok(reply),
                Ok(reply) => {
                    let why = refusal(&reply.body);
                    if why.contains("lease not found") {
                        return Err(ClientError::LeaseNotFound);
                    }
                    // No leader (a member cut off, an election), a deadline
                    // passed, too many requests: the next one.
                    let transient =
                        [StatusCode::SERVICE_UNAVAILABLE, StatusCode::GATEWAY_TIMEOUT, StatusCode::TOO_MANY_REQUESTS];
                    if transient.contains(&reply.status) {
                        tried.push(format!("{url}: {why}"));
                        continue;
                    }
                    return Err(ClientError::Protocol(format!("{url} answered {}: {why}", reply.status)));
                }
                Err(e) => tried.push(format!("{url}: {e}")),
            }
        }
        Err(ClientError::Unavailable(format!("no etcd member answered ({})", tried.join("; "))))
    }
}

/// etcd's refusal as the gateway words it (`{"error": …, "message": …}`),
/// else the start of the body.
pub fn refusal(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Refusal {
        #[serde(default)]
        error: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Refusal>(body) {
        Ok(r) if !r.error.is_empty() => r.error,
        Ok(r) if !r.message.is_empty() => r.message,
        _ => String::from_utf8_lossy(body).chars().take(200).collect(),
    }
}

fn decode<T: serde::de::DeserializeOwned>(reply: Reply) -> Result<T, ClientError> {
    serde_json::from_slice(&reply.body).map_err(|e| ClientError::Protocol(format!("etcd's answer: {e}")))
}

/// The end of the range of every key that starts with `prefix` (etcd's
/// `GetPrefixRangeEnd`): the prefix with its last byte below 0xff raised
/// by one; `[0]`, every key, for a prefix of 0xff bytes only.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[derive(Deserialize)]
struct Header {
    #[serde(with = "number")]
    revision: u64,
}

#[derive(Deserialize)]
struct Txn {
    header: Header,
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<Op>,
}

#[derive(Deserialize)]
struct Op {
    response_range: Option<Range>,
}

#[derive(Deserialize)]
struct Range {
    #[serde(default)]
    kvs: Vec<KeyValue>,
}

#[derive(Deserialize)]
struct KeyValue {
    #[serde(default, with = "number")]
    create_revision: u64,
}

/// proto3's JSON writes a 64-bit integer as a string of digits: for
/// `#[serde(with = "fencegate_client::etcd::number")]`.
pub mod number {
    use serde::{Deserialize, Deserializer};

    /// A `u64` written as digits in a string, or as a number.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_where_etcd_ends_it() {
        assert_eq!(prefix_end(b"rack/42/"), b"rack/420");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\x00");
    }

    /// etcd 3.4's own answers (curl against a real member).
    #[test]
    fn etcds_answers_are_read() {
        let put: Txn = serde_json::from_str(
            r#"{"header":{"cluster_id":"1","revision":"2","raft_term":"2"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"2"}}}]}"#,
        )
        .unwrap();
        assert!(put.succeeded && put.header.revision == 2);
        let none: Range = serde_json::from_str(r#"{"header":{"revision":"2"},"count":"1"}"#).unwrap();
        assert!(none.kvs.is_empty(), "count is before the create-revision filter: kvs decide");
        assert_eq!(
            refusal(br#"{"error":"etcdserver: requested lease not found","code":5}"#),
            "etcdserver: requested lease not found"
        );
    }
}
