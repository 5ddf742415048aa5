//! etcd through its JSON gateway (`/v3/...` over HTTP/1.1), the way the
//! first version of this benchmark spoke to it: a lock is what etcd's lock
//! recipes do, minus the waiting — grant a lease, then put the key attached
//! to it if the key does not exist (the token is that put's revision);
//! release revokes the lease. Three Raft entries per pair (grant, txn,
//! revoke). Kept as a second line beside the native gRPC client.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use fencegate_client::http::HttpClient;
use hyper::Method;
use serde_json::json;

use crate::common::etcd::base64;
use crate::common::locks::{call, Backend, Held, LOAD_TIMEOUT};

/// etcd's JSON gateway: 64-bit numbers travel as decimal strings, keys and
/// values as base64, and fields with default values (false, 0) are left out.
#[derive(Clone)]
pub struct EtcdJson(pub HttpClient);

impl Backend for EtcdJson {
    async fn acquire(&self, url: &str, key: &str, ttl: Duration, timeout: Duration) -> Result<Held> {
        let grant = json!({"TTL": ttl.as_secs()});
        let grant = call(&self.0, Method::POST, &format!("{url}/v3/lease/grant"), Some(grant), timeout).await?;
        let lease = grant["ID"].as_str().context("no lease ID")?.to_string();
        let (name, key) = (key, base64(key.as_bytes()));
        let txn = json!({
            "compare": [{"key": key, "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": base64(b"bench"), "lease": lease}}],
        });
        let put = call(&self.0, Method::POST, &format!("{url}/v3/kv/txn"), Some(txn), timeout).await?;
        if put["succeeded"] != true {
            bail!("key {name} is held");
        }
        let token = put["header"]["revision"].as_str().context("no revision")?.parse()?;
        Ok(Held { token: Some(token), lease, key: name.into() })
    }

    async fn release(&self, url: &str, held: &Held) -> Result<()> {
        let body = json!({"ID": held.lease});
        call(&self.0, Method::POST, &format!("{url}/v3/lease/revoke"), Some(body), LOAD_TIMEOUT).await.map(drop)
    }

    async fn keepalive(&self, url: &str, held: &Held) -> Result<()> {
        let body = json!({"ID": held.lease});
        let v = call(&self.0, Method::POST, &format!("{url}/v3/lease/keepalive"), Some(body), LOAD_TIMEOUT).await?;
        // A lease that is gone answers 200 without a TTL.
        v["result"]["TTL"].as_str().map(drop).context("lease lost")
    }
}
