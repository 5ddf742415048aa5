//! `fencegate dev`: the embedded default — everything on one machine on the
//! well-known local ports: lock nodes 7401–7403, the sidecar on 8080 (metrics
//! 9464) in front of the built-in inventory API on 9000 (`--free-ports`: on
//! ports the OS picks).
//!
//! It also shows a retried write replayed. Its banner gives a stale-write
//! snippet; `tests/e2e/cli.rs` `dev_smoke` reads the addresses from the banner,
//! sends the snippet and expects the answer the banner promises.

use std::path::Path;
use std::time::Duration;

use super::stack::{Stack, ANY_PORTS, DEV_PORTS};
use super::LockService;

pub(super) async fn run(data: &Path, fresh: bool, free_ports: bool, backend: LockService) -> anyhow::Result<i32> {
    let stack = Stack::start(if free_ports { ANY_PORTS } else { DEV_PORTS }, data, fresh, backend).await?;
    let replay = match a_retried_write(&stack).await {
        Ok(line) => line,
        Err(e) => format!("  (the retried-write check failed: {e:#})"),
    };
    print_banner(&stack, data, &replay);
    super::server::shutdown_signal().await;
    eprintln!("\nstopping …");
    stack.stop().await;
    Ok(0)
}

/// A drain of `rack/0` through the sidecar, sent twice with one
/// Idempotency-Key as a client that timed out would: what each attempt got,
/// and how often the inventory applied it.
async fn a_retried_write(s: &Stack) -> anyhow::Result<String> {
    use fencegate_client::idempotency::{operation_id, Write, REPLAYED_HEADER};
    let client = fencegate_client::Client::new(s.endpoints.clone())?;
    let ttl = Duration::from_secs(10);
    let lease = match s.backend {
        LockService::Fencegate => client.acquire("rack/0", fencegate_client::AcquireOptions::new(ttl)).await?,
        LockService::Etcd => client.acquire_etcd("rack/0", ttl, Duration::ZERO).await?,
    };
    let url = format!("{}/racks/0", s.sidecar_url);
    let write = Write::new("PUT", &url, lease.token(), &operation_id(), "drain").body(r#"{"state":"drained"}"#);
    let http = fencegate_client::http::HttpClient::new(1 << 20);
    let before = s.inventory.writes().len();
    let first = write.send(&http, 3, Duration::from_secs(5)).await?;
    let retry = write.send(&http, 3, Duration::from_secs(5)).await?;
    lease.release().await?;
    let applied = s.inventory.writes().len() - before;
    let replayed = retry.headers.get(REPLAYED_HEADER).is_some_and(|v| v == "true");
    let same = if first.body == retry.body { "the same answer" } else { "ANOTHER answer" };
    Ok(format!(
        "  PUT /racks/0 sent twice with Idempotency-Key {}: {} then {}{}, {same}; the inventory applied it {applied} time{}",
        write.key(),
        first.status.as_u16(),
        retry.status.as_u16(),
        if replayed { " replayed" } else { " NOT replayed" },
        if applied == 1 { "" } else { "s" },
    ))
}

/// The token of the banner's stale write. A cluster grants token 1 once, to
/// its first grant: `rack/0` here (`a_retried_write`, before the banner), so
/// every grant of `rack/42` is above it and the write is `stale_token`. (Had
/// `rack/42` got token 1 itself, the answer would be `lease_expired`: the
/// token of its latest grant, whose lease has ended.)
pub(super) const STALE_TOKEN: u64 = 1;

/// This binary as the person who started `dev` can call it from here:
/// `./target/release/fencegate` after `cargo run --release -- dev`.
fn binary() -> String {
    let Ok(exe) = std::env::current_exe() else { return "fencegate".into() };
    let here = std::env::current_dir().ok();
    match here.as_deref().and_then(|d| exe.strip_prefix(d).ok()) {
        Some(relative) => format!("./{}", relative.display()),
        None => exe.display().to_string(),
    }
}

fn print_banner(s: &Stack, data: &Path, replay: &str) {
    let fg = binary();
    // What differs on etcd: the lock's flag, and who shows a lock's state.
    let (service, lock, status, demo) = match s.backend {
        LockService::Fencegate => {
            ("lock service", format!("{fg} lock"), format!("{fg} status rack/42"), format!("{fg} demo"))
        }
        LockService::Etcd => (
            "etcd",
            format!("{fg} lock --lock-service etcd"),
            format!("etcdctl --endpoints {} get --prefix rack/42/ -w fields", s.endpoints.join(",")),
            format!("{fg} demo --lock-service etcd"),
        ),
    };
    println!(
        "fencegate dev is running
  {service:<12}   {}
  inventory API  {}   (legacy: checks no tokens; GET /writes lists what it applied)
  sidecar        {}   (fences PUT/POST/PATCH/DELETE /racks/{{rack}} with lock key rack/{{rack}})
  metrics        {}
{node_console}  sidecar's      {sidecar_console}   (its console: refusals and each key's timeline; the admin token is in {data}/sidecar/admin-token)
  data           {data} (kept between runs; --fresh wipes it)

a retried write is applied once (idempotency on rack-writes):
{}

try, in another terminal, in this order (`cargo install --path .` puts `fencegate` on your PATH):
  export FENCEGATE_ENDPOINTS={endpoints}
  {lock} rack/42 -- sh -c 'curl -s -X PUT -H \"X-Fence-Token: $FENCE_TOKEN\" {sidecar}/racks/42 -d \"{{\\\"state\\\":\\\"drained\\\"}}\"'
      # {{\"rack\":\"42\",\"state\":\"drained\",\"seq\":…}}: forwarded with the lock's token, then the lock is released
  {lock} rack/7 -- sh -c 'for try in 1 2; do curl -s -X PUT -H \"X-Fence-Token: $FENCE_TOKEN\" -H \"Idempotency-Key: $FENCE_OPERATION_ID-drain\" {sidecar}/racks/7 -d \"{{\\\"state\\\":\\\"drained\\\"}}\"; done'
      # the same answer twice, seq included: the retry is replayed, the inventory applied it once
  curl -s -X PUT -H 'X-Fence-Token: {stale}' {sidecar}/racks/42 -d '{{\"state\":\"stale\"}}'
      # 409 {{\"error\":\"stale_token\",…}}: token {stale} is below rack/42's latest grant; the inventory never sees it
      # (sent before the first command: 409 unknown_token, rack/42 was never granted)
  curl -s {inventory}/writes
      # every write the inventory applied, with its token: not the stale one
  {status}
      # state: free, and the token of the first command's grant (on etcd: no key left)
  {demo} --endpoints {endpoints} --sidecar {sidecar} --inventory {inventory}
      # the pause story on these components: A's write after its lease expired is refused; watch rack/42 in the consoles

Ctrl-C stops everything.",
        s.endpoints.join("  "),
        s.inventory_url,
        s.sidecar_url,
        s.metrics_url,
        replay,
        node_console = match s.backend {
            LockService::Fencegate => format!(
                "  node console   {}/ui   (in a browser: the lock table and its timeline, live; every node has one)\n",
                s.endpoints[0]
            ),
            LockService::Etcd => String::new(),
        },
        sidecar_console = s.metrics_url.strip_suffix("/metrics").unwrap_or(&s.metrics_url).to_string() + "/console",
        data = data.display(),
        endpoints = s.endpoints.join(","),
        sidecar = s.sidecar_url,
        inventory = s.inventory_url,
        stale = STALE_TOKEN,
    );
}
