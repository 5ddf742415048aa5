//! `fencegate dev`: the embedded default — everything on one machine on the
//! well-known local ports: lock nodes 7401–7403, the sidecar on 8080 (metrics
//! 9464) in front of the built-in inventory API on 9000 (`--free-ports`: on
//! ports the OS picks).

use std::path::Path;

use anyhow::Context;

use super::stack::{Stack, ANY_PORTS, DEV_PORTS};

pub async fn run(data: &Path, fresh: bool, free_ports: bool) -> anyhow::Result<i32> {
    if fresh && data.exists() {
        std::fs::remove_dir_all(data).with_context(|| format!("removing {}", data.display()))?;
    }
    let stack = Stack::start(if free_ports { ANY_PORTS } else { DEV_PORTS }, data).await?;
    print_banner(&stack, data);
    super::server::shutdown_signal().await;
    eprintln!("\nstopping …");
    stack.stop().await;
    Ok(0)
}

fn print_banner(s: &Stack, data: &Path) {
    println!(
        "fencegate dev is running
  lock service   {}
  inventory API  {}   (legacy: checks no tokens; GET /writes lists what it applied)
  sidecar        {}   (fences PUT/POST/PATCH/DELETE /racks/{{rack}} with lock key rack/{{rack}})
  metrics        {}
  data           {} (kept between runs; --fresh wipes it)

try, in another terminal:
  export FENCEGATE_ENDPOINTS={}
  fencegate lock rack/42 -- sh -c 'curl -s -X PUT -H \"X-Fence-Token: $FENCE_TOKEN\" {}/racks/42 -d \"{{\\\"state\\\":\\\"drained\\\"}}\"'
  curl -s -X PUT -H 'X-Fence-Token: 1' {}/racks/42 -d '{{\"state\":\"stale\"}}'     # refused: 409
  curl -s {}/writes
  fencegate status rack/42
  fencegate demo

Ctrl-C stops everything.",
        s.endpoints.join("  "),
        s.inventory_url,
        s.sidecar_url,
        s.metrics_url,
        data.display(),
        s.endpoints.join(","),
        s.sidecar_url,
        s.sidecar_url,
        s.inventory_url,
    );
}
