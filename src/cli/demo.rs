//! `fencegate demo`: docs/DESIGN.md's walkthrough, replayed on real components
//! (a 3-node cluster, the inventory API, the sidecar — on ports of their own,
//! so it runs beside `fencegate dev`), then the same without the sidecar.
//! With `--endpoints`, `--sidecar` and `--inventory` it replays it on
//! components that already run (the compose file's).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use hyper::Method;
use tokio::time::Instant;

use super::stack::{Stack, ANY_PORTS};
use super::LockService;
use fencegate_client::http::HttpClient;
use fencegate_client::{AcquireOptions, Client, Lease, TOKEN_HEADER};

pub(super) struct DemoArgs {
    pub ttl: Duration,
    pub pause: Duration,
    pub mermaid: Option<PathBuf>,
    /// Whose locks A and B take.
    pub backend: LockService,
    /// Running components to replay it on, instead of starting its own.
    pub remote: Option<Targets>,
}

/// Where the demo's components are.
pub(super) struct Targets {
    pub endpoints: Vec<String>,
    pub sidecar_url: String,
    pub inventory_url: String,
}

/// The run as it happened, printed live and kept for the Mermaid diagram.
struct Timeline {
    start: Instant,
    arrows: Vec<(String, String, String)>,
}

impl Timeline {
    fn say(&mut self, who: &str, what: &str) {
        println!("[{:>6.2}s] {who:<2} {what}", self.start.elapsed().as_secs_f64());
    }

    fn arrow(&mut self, from: &str, to: &str, label: impl Into<String>) {
        self.arrows.push((from.into(), to.into(), label.into()));
    }
}

pub(super) async fn run(mut args: DemoArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.pause > args.ttl, "--pause must be longer than --ttl: the pause has to outlive the lease");
    let (own, targets) = match args.remote.take() {
        Some(targets) => (None, targets),
        None => {
            let data = tempfile_dir()?;
            let service = match args.backend {
                LockService::Fencegate => "a 3-node lock cluster",
                LockService::Etcd => "a one-member etcd",
            };
            println!("starting {service}, the inventory API and the sidecar on free local ports …");
            let stack = Stack::start(ANY_PORTS, &data, false, args.backend).await?;
            let targets = Targets {
                endpoints: stack.endpoints.clone(),
                sidecar_url: stack.sidecar_url.clone(),
                inventory_url: stack.inventory_url.clone(),
            };
            (Some((stack, data)), targets)
        }
    };
    let client = Client::new(targets.endpoints.clone())?;
    let http = HttpClient::new(1 << 20);
    let mut t = Timeline { start: Instant::now(), arrows: vec![] };

    println!("\n== with the sidecar: A and B write rack 42 through {} ==", targets.sidecar_url);
    let with = round(&mut t, &args, &client, &http, "42", Via::Sidecar, &targets).await?;
    println!("\n== without the sidecar: the same, straight to the inventory API {} ==", targets.inventory_url);
    let without = round(&mut t, &args, &client, &http, "43", Via::Inventory, &targets).await?;

    println!("\nverdict:");
    println!(
        "  with the sidecar    rack 42 is {:?}: A's stale write (token {}) was refused ({}), the inventory never saw it",
        with.final_state, with.a_token, with.a_answer
    );
    println!(
        "  without it          rack 43 is {:?}: A's stale write (token {}) landed after B's and undid B's work",
        without.final_state, without.a_token
    );
    if let Some(path) = &args.mermaid {
        std::fs::write(path, mermaid(&t)).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        println!("\nsequence diagram written to {}", path.display());
    }
    if let Some((stack, data)) = own {
        stack.stop().await;
        let _ = std::fs::remove_dir_all(&data);
    }
    let ok = with.final_state == "drained-by-B" && without.final_state == "flashed-by-A";
    Ok(if ok { 0 } else { 1 })
}

struct RoundResult {
    a_token: u64,
    a_answer: String,
    final_state: String,
}

async fn round(
    t: &mut Timeline,
    args: &DemoArgs,
    client: &Client,
    http: &HttpClient,
    rack: &str,
    via: Via,
    targets: &Targets,
) -> anyhow::Result<RoundResult> {
    let key = format!("rack/{rack}");
    let (target, via) = match via {
        Via::Sidecar => (&targets.sidecar_url, "Sidecar"),
        Via::Inventory => (&targets.inventory_url, "Inventory"),
    };
    let a = acquire(client, args.backend, &key, args.ttl, "A", Duration::ZERO).await?;
    let a_token = a.token();
    t.say("A", &format!("acquire({key}, ttl {}) -> token {a_token}", humantime::format_duration(args.ttl)));
    t.arrow("A", "Lock service", format!("acquire {key}"));
    t.arrow("Lock service", "A", format!("token {a_token}"));
    // The pause: A's process stops, keepalives included.
    drop(a);
    t.say("A", &format!("pauses for {} (GC, SIGSTOP, a stuck SSH session …)", humantime::format_duration(args.pause)));
    t.arrow("A", "A", "paused");
    let woke_at = Instant::now() + args.pause;

    let b = acquire(client, args.backend, &key, Duration::from_secs(30), "B", args.pause * 2).await?;
    t.say("B", &format!("acquire({key}) -> token {} (A's lease {a_token} expired)", b.token()));
    t.arrow("B", "Lock service", format!("acquire {key}"));
    t.arrow("Lock service", "B", format!("token {} (lease {a_token} expired)", b.token()));
    let (status, _) = put(http, target, rack, b.token(), "drained-by-B").await?;
    t.say("B", &format!("PUT /racks/{rack} (token {}) via {via} -> {status}", b.token()));
    t.arrow("B", via, format!("PUT /racks/{rack} token {}", b.token()));
    if via == "Sidecar" {
        t.arrow(via, "Inventory", "forwarded");
    }
    t.arrow(via, "B", status.to_string());

    tokio::time::sleep_until(woke_at).await;
    let (status, body) = put(http, target, rack, a_token, "flashed-by-A").await?;
    let a_answer = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(String::from))
        .unwrap_or_default();
    let shown = if a_answer.is_empty() { status.to_string() } else { format!("{status} {a_answer}") };
    let note = if via == "Sidecar" { ", upstream never sees it" } else { "" };
    t.say("A", &format!("wakes up, PUT /racks/{rack} (token {a_token}) via {via} -> {shown}{note}"));
    t.arrow("A", via, format!("PUT /racks/{rack} token {a_token}"));
    if via == "Inventory" {
        t.arrow(via, "A", format!("{status}: overwrites B's work"));
    } else {
        t.arrow(via, "A", shown.clone());
    }
    let final_state = state_of(http, &targets.inventory_url, rack).await?;
    t.say("", &format!("inventory: rack {rack} is {final_state:?}"));
    b.release().await?;
    Ok(RoundResult { a_token, a_answer: shown, final_state })
}

/// `key`'s lock for `holder`, from fencegate or etcd.
async fn acquire(
    client: &Client,
    backend: LockService,
    key: &str,
    ttl: Duration,
    holder: &str,
    wait: Duration,
) -> anyhow::Result<Lease> {
    Ok(match backend {
        LockService::Fencegate => client.acquire(key, AcquireOptions::new(ttl).holder(holder).wait(wait)).await?,
        LockService::Etcd => client.acquire_etcd(key, ttl, wait).await?,
    })
}

/// Which way a round's writes go.
#[derive(Clone, Copy)]
enum Via {
    Sidecar,
    Inventory,
}

/// What the inventory says rack `rack` is (asked over HTTP, as a person would).
async fn state_of(http: &HttpClient, inventory: &str, rack: &str) -> anyhow::Result<String> {
    let url = format!("{inventory}/racks/{rack}");
    let answer = http.call(Method::GET, &url, None, Duration::from_secs(10)).await?;
    anyhow::ensure!(answer.status.is_success(), "GET {url} answered {}", answer.status);
    let body: serde_json::Value = serde_json::from_slice(&answer.body)?;
    Ok(body.get("state").and_then(|s| s.as_str()).unwrap_or_default().to_string())
}

async fn put(
    http: &HttpClient,
    base: &str,
    rack: &str,
    token: u64,
    state: &str,
) -> anyhow::Result<(u16, bytes::Bytes)> {
    let req = hyper::Request::builder()
        .method(Method::PUT)
        .uri(format!("{base}/racks/{rack}"))
        .header(TOKEN_HEADER, token.to_string())
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(format!("{{\"state\":\"{state}\"}}"))))?;
    let a = http.send(req, Duration::from_secs(10)).await?;
    Ok((a.status.as_u16(), a.body))
}

fn mermaid(t: &Timeline) -> String {
    let mut out = String::from(
        "sequenceDiagram\n    participant A\n    participant B\n    participant Lock service\n    participant Sidecar\n    participant Inventory\n",
    );
    for (from, to, label) in &t.arrows {
        let _ = writeln!(out, "    {from}->>{to}: {label}");
    }
    out
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("fencegate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
