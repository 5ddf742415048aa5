//! `fencegate idempotency show|resolve`: look at a key's record on a running
//! sidecar, and settle an unknown outcome (docs/DESIGN.md, I1). Talks to the
//! sidecar's metrics listener, which serves these calls only on loopback and
//! only with the token the sidecar keeps in `state_dir/admin-token`.

use fencegate_client::http::HttpClient;
use fencegate_client::FAILOVER_BUDGET;
use hyper::{Method, StatusCode};

/// Which record: a record is its holder's (docs/DESIGN.md, "a stored
/// answer goes only to its holder").
pub(super) struct Holder<'a> {
    pub lock_key: &'a str,
    /// The fencing token the request carried.
    pub token: u64,
    pub key: &'a str,
    /// The client certificate's name, where the sidecar takes them.
    pub identity: Option<&'a str>,
}

/// `applied`: `Some(status)`, the request was applied (a retry gets that
/// status, empty body); `None`, it was not (the next retry is forwarded).
/// A record is printed as the sidecar's JSON; a refusal (no such record,
/// say) as a sentence on stderr, or with `json` as the sidecar's answer on
/// stdout.
pub(super) async fn run(
    sidecar: &str,
    token_file: &std::path::Path,
    record: Holder<'_>,
    resolve: Option<Option<u16>>,
    json: bool,
) -> anyhow::Result<i32> {
    let token = std::fs::read_to_string(token_file)
        .map_err(|e| anyhow::anyhow!("reading the admin token {}: {e}", token_file.display()))?;
    let mut body = serde_json::json!({
        "lock_key": record.lock_key, "token": record.token, "key": record.key, "identity": record.identity,
    });
    let path = match resolve {
        None => "show",
        Some(applied) => {
            body["applied"] = serde_json::json!(applied);
            "resolve"
        }
    };
    let url = format!("{}/admin/idempotency/{path}", sidecar.trim_end_matches('/'));
    let http = HttpClient::new(1 << 20)
        .with_bearer(token.trim())
        .map_err(|e| anyhow::anyhow!("{}: {e}", token_file.display()))?;
    // Given up on as a lock service read is: within the client's failover budget.
    let reply = match http.call(Method::POST, &url, Some(serde_json::to_vec(&body)?), FAILOVER_BUDGET).await {
        Ok(reply) => reply,
        Err(e) => {
            eprintln!("fencegate: sidecar unavailable: {e}; is a fencegate sidecar's metrics_listen there?");
            return Ok(super::exit::UNAVAILABLE);
        }
    };
    let text = String::from_utf8_lossy(&reply.body);
    if reply.status != StatusCode::OK {
        if json {
            println!("{}", text.trim());
            return Ok(1);
        }
        let (key, lock_key, token) = (record.key, record.lock_key, record.token);
        if reply.status == StatusCode::NOT_FOUND {
            eprintln!(
                "fencegate idempotency: no record of key {key:?} under {lock_key} with fence token {token}: never \
                 sent through this sidecar, past its retention, or sent by another holder (another token or identity)"
            );
        } else {
            let why = serde_json::from_slice::<serde_json::Value>(&reply.body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| text.trim().to_string());
            eprintln!("fencegate idempotency: the sidecar refused ({}): {why}", reply.status);
        }
        return Ok(1);
    }
    println!("{}", text.trim());
    Ok(0)
}
