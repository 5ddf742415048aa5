//! `fencegate healthcheck [URL]`: a container's HEALTHCHECK with no curl in
//! the image. One GET within `--timeout`; exit 0 on a 2xx answer, else 1
//! with one line on stderr saying what failed. Each role points it at its
//! own port (`FENCEGATE_HEALTH_URL`): a node's `listen`, a sidecar's
//! `metrics_listen`.

use std::path::PathBuf;
use std::time::Duration;

use hyper::Method;

use fencegate_client::http::{error_chain, HttpClient};

/// A node's liveness on the example configs' first port.
pub(super) const DEFAULT_URL: &str = "http://127.0.0.1:7401/healthz";

/// Enough for `ok` or an error body; a health endpoint says little.
const MAX_BODY: usize = 64 << 10;

pub(super) async fn run(url: &str, timeout: Duration, ca: Option<PathBuf>) -> anyhow::Result<i32> {
    // https is verified against --ca and nothing else: a probe that trusts
    // any certificate would report a node healthy behind someone else's.
    let https = url.get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
    let http = match (https, ca) {
        (false, None) => HttpClient::new(MAX_BODY),
        (true, Some(ca)) => {
            let files = fencegate_client::tls::TlsFiles { ca, cert: None, key: None };
            HttpClient::https(MAX_BODY, files.client_config(["--ca", "--cert", "--key"])?, None)
        }
        (true, None) => anyhow::bail!("{url}: https:// needs --ca, the CA that signed the node's certificate"),
        (false, Some(_)) => anyhow::bail!("{url}: --ca is for https:// URLs"),
    };
    let problem = match http.call(Method::GET, url, None, timeout).await {
        Ok(reply) if reply.status.is_success() => return Ok(0),
        Ok(reply) => {
            let body = String::from_utf8_lossy(&reply.body);
            let first = body.lines().next().unwrap_or("").trim();
            format!("{url} answered {}: {first}", reply.status)
        }
        Err(e) => error_chain(&e),
    };
    eprintln!("fencegate healthcheck: unhealthy: {problem}");
    Ok(1)
}
