//! L5 (durable before acknowledged) and the sidecar's floors (S2) across
//! power cuts. SIGKILL keeps the page cache, so a node that skipped an
//! fsync loses nothing under it; here every node's data directory and the
//! sidecar's `state_dir` are on their own [`PowerLossFs`] mount, which drops
//! whatever was not made durable (data not fsync'd, names whose directory
//! was not fsync'd) when the test cuts its power.
//!
//! Each cut: a burst of concurrent acquires and fenced writes through the
//! sidecar, every acknowledged grant (key, token) and write (its token is a
//! floor) recorded; SIGKILL of the sidecar and of all nodes or a majority
//! (the seed decides), a power cut of their filesystems (half of them torn:
//! some unsynced writes kept, in no order); then the sidecar
//! alone, its lock service out of reach, must refuse a token below each
//! acknowledged write's (only its floors can tell it); the nodes restart,
//! and each key's latest token must be at least every acknowledged grant's,
//! and a new grant above all of them.
//!
//! The control arm runs the same on filesystems whose fsync does nothing
//! (a writeback persists what is older than a second): it must lose
//! acknowledged grants within 6 cuts (it stops at the first loss), or this
//! test could not see a loss.
//!
//! - the fault tier: `cargo test --features faults --test faults power_loss::` (10 cuts, and up to 6 on the control)
//! - on demand: `POWER_LOSS_CUTS=50 POWER_LOSS_SEED=7 cargo test --features faults --test faults -- --ignored --nocapture power_loss::many`
//!
//! A failure names the lost grants and floors and the seed; the seed
//! replays the schedule (burst lengths, victims, keys), not the exact
//! interleaving of requests.
//! FUSE is required (root and `/dev/fuse`); without it the test fails.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencegate_testkit::cluster::ClusterOptions;
use fencegate_testkit::http;
use fencegate_testkit::powerloss::{Mode, PowerLossFs};
use fencegate_testkit::relay::Relay;
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::{bin, Cluster, Sidecar, Upstream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// Small snapshots, so that cuts also land around the snapshot file's
/// rename and the log's purge.
const NODE_YAML: &str = "raft: { heartbeat: 50ms, election_timeout_min: 200ms, election_timeout_max: 400ms, \
                         propose_timeout: 2s, snapshot_every: 100 }\n";
/// Keys per cut: each cut has its own (racks `100 * cut + k`), since the
/// leases a killed worker never released outlive the restart (a new leader
/// gives every lease its full TTL again).
const KEYS: u64 = 4;
const WORKERS: u64 = 4;

/// What was acknowledged before the cuts.
#[derive(Default)]
struct Acked {
    /// (key, token) of every acknowledged grant.
    grants: Vec<(String, u64)>,
    /// key -> the highest token of an acknowledged write through the sidecar.
    floors: BTreeMap<String, u64>,
}

/// What the checks found after the cuts.
#[derive(Default, Debug)]
struct Found {
    cuts: usize,
    grants_checked: usize,
    floors_checked: usize,
    /// (cut, key, acknowledged token, what the service had after it).
    lost_grants: Vec<(usize, String, u64, String)>,
    /// (cut, key, acknowledged write's token, the sidecar's answer to one below).
    lost_floors: Vec<(usize, String, u64, String)>,
    /// Cuts after which the restarted cluster granted nothing within 20 s.
    stuck: Vec<usize>,
}

/// Three nodes and a sidecar, each on its own power-loss mount (dropped
/// last: the processes go first).
struct Rig {
    cluster: Cluster,
    sidecar: Sidecar,
    /// The sidecar's way to each node: cut while it is checked alone.
    relays: Vec<Relay>,
    _upstream: Upstream,
    nodes_fs: BTreeMap<u64, PowerLossFs>,
    sidecar_fs: PowerLossFs,
}

async fn rig(mode: Mode) -> Rig {
    let mount = || PowerLossFs::mount(None, mode).expect("mounting a power-loss filesystem (FUSE: root and /dev/fuse)");
    let nodes_fs: BTreeMap<u64, PowerLossFs> = (1..=3).map(|id| (id, mount())).collect();
    let sidecar_fs = mount();
    let data_roots = nodes_fs.iter().map(|(id, fs)| (*id, fs.path())).collect();
    let o = ClusterOptions { yaml: NODE_YAML.into(), data_roots, ..Default::default() };
    let cluster = Cluster::start_with(&bin!(), o).await;
    let upstream = Upstream::start().await;
    let mut relays = vec![];
    for id in cluster.ids() {
        relays.push(Relay::start(cluster.port(id)).await);
    }
    let o = SidecarOptions {
        lock_service: relays.iter().map(Relay::url).collect(),
        yaml: table(&[rack_writes("{ mode: strict, consistency: cached }").methods(&["PUT"]), everything_else()]),
        state_dir: Some(sidecar_fs.path().join("state")),
        ..Default::default()
    };
    let sidecar = Sidecar::start_with(&bin!(), cluster.dir().join("sidecar"), &upstream.url(), o).await;
    Rig { cluster, sidecar, relays, _upstream: upstream, nodes_fs, sidecar_fs }
}

/// One worker of a burst: acquire a key, write through the sidecar with
/// its token, release; every acknowledgement recorded.
async fn worker(
    urls: Vec<String>,
    sidecar: String,
    cut: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Acked>>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let k = 100 * cut as u64 + rng.random_range(0..KEYS);
        let url = &urls[rng.random_range(0..urls.len())];
        let key = format!("rack/{k}");
        let body = r#"{"ttl_ms":5000,"wait_ms":500}"#;
        let req = http::request("POST", &format!("{url}/v1/locks/{key}"), None, &[], body.to_string());
        let Ok((200, v)) = http::try_send(req, Duration::from_secs(3)).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let (token, lease) = (v["token"].as_u64().unwrap(), v["lease_id"].as_str().unwrap().to_string());
        acked.lock().unwrap().grants.push((key.clone(), token));
        let put = http::fenced_put(format!("{sidecar}/racks/{k}"), token);
        if let Ok((200, _)) = http::try_send(put, Duration::from_secs(3)).await {
            let mut a = acked.lock().unwrap();
            let floor = a.floors.entry(key).or_default();
            *floor = (*floor).max(token);
        }
        let release = http::request("DELETE", &format!("{url}/v1/leases/{lease}"), None, &[], "");
        let _ = http::try_send(release, Duration::from_secs(3)).await;
    }
}

/// Until `f` gives `Some` (20 s at most).
async fn within_20s<T, F: std::future::Future<Output = Option<T>>>(mut f: impl FnMut() -> F) -> Option<T> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(t) = f().await {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// `method path` on each node in turn (a leader call is forwarded to the
/// leader) until one answers 200; the token of its answer.
async fn ask(urls: &[String], method: &str, path: String, body: &'static str) -> Option<u64> {
    for url in urls {
        let req = http::request(method, &format!("{url}{path}"), None, &[], body);
        if let Ok((200, v)) = http::try_send(req, Duration::from_secs(3)).await {
            return v["token"].as_u64();
        }
    }
    None
}

/// `cuts` power cuts on `mode`'s filesystems (fewer if `until_lost` and a
/// cut lost an acknowledged grant); what was lost.
async fn run(mode: Mode, cuts: usize, seed: u64, until_lost: bool) -> Found {
    let mut rig = rig(mode).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut found = Found::default();
    if let Mode::Writeback(age) = mode {
        // The cluster's first writes (its data directories) written back.
        tokio::time::sleep(age * 2).await;
    }
    for cut in 1..=cuts {
        let acked = Arc::new(Mutex::new(Acked::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (urls, sc) = (rig.cluster.urls(), rig.sidecar.url());
                tokio::spawn(worker(urls, sc, cut, rng.random(), stop.clone(), acked.clone()))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.random_range(400..1200))).await;
        let victims: Vec<u64> = if rng.random_range(0..3) == 0 {
            vec![1, 2, 3]
        } else {
            let spared = rng.random_range(1..=3);
            (1..=3).filter(|id| *id != spared).collect()
        };
        for id in &victims {
            rig.cluster.kill(*id);
        }
        rig.sidecar.kill();
        // Half the cuts torn: some unsynced writes reached the disk anyway.
        let torn = rng.random_bool(0.5);
        for fs in victims.iter().map(|id| &rig.nodes_fs[id]).chain([&rig.sidecar_fs]) {
            match torn {
                true => fs.power_cut_torn(rng.random()),
                false => fs.power_cut(),
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.await.unwrap();
        }
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        found.cuts += 1;

        // The sidecar alone: only its floors know the acknowledged writes.
        for r in &rig.relays {
            r.set_cut(true);
        }
        // A sidecar that cannot start on what the cut left (a store whose
        // fsyncs lied, corrupted) has lost every floor; the run ends there.
        let sidecar_up = rig.sidecar.try_restart().await;
        for (key, floor) in &acked.floors {
            found.floors_checked += 1;
            let answer = match &sidecar_up {
                Ok(()) => {
                    let url = format!("{}/racks/{}", rig.sidecar.url(), key.trim_start_matches("rack/"));
                    let put = || http::request("PUT", &url, Some(floor - 1), &[], http::DRAINED);
                    // Twice: the first try may go out on a pooled connection
                    // to the process the cut killed. A sidecar that answers
                    // neither has lost the floor as surely as one that lets
                    // the write through.
                    let answer = match http::try_send(put(), Duration::from_secs(20)).await {
                        Err(_) => http::try_send(put(), Duration::from_secs(20)).await,
                        first => first,
                    };
                    match answer {
                        Ok((409, v)) if v["error"].as_str() == Some("stale_token") => continue,
                        Ok((status, v)) => format!("{status} {v}"),
                        Err(e) => format!("no answer: {e}"),
                    }
                }
                Err(log) => format!("nothing: the sidecar did not start ({})", log.trim()),
            };
            found.lost_floors.push((cut, key.clone(), *floor, answer));
        }
        for r in &rig.relays {
            r.set_cut(false);
        }

        // The nodes back: every acknowledged grant still there.
        rig.cluster.start_all();
        // A new grant first: once it is there, the reads have a leader.
        let urls = rig.cluster.urls();
        let fresh = within_20s(|| ask(&urls, "POST", format!("/v1/locks/probe/{cut}"), r#"{"ttl_ms":1000}"#)).await;
        let mut latest = BTreeMap::new();
        for k in (0..KEYS).map(|k| 100 * cut as u64 + k) {
            let key = format!("rack/{k}");
            let read = match fresh {
                Some(_) => within_20s(|| ask(&urls, "GET", format!("/v1/locks/{key}"), "")).await,
                None => None,
            };
            latest.insert(key, read);
        }
        if fresh.is_none() {
            found.stuck.push(cut);
        }
        for (key, token) in &acked.grants {
            found.grants_checked += 1;
            let after = latest[key];
            let kept = after.is_some_and(|t| t >= *token) && fresh.is_some_and(|f| f > *token);
            if !kept {
                let what = format!("the key's latest token {after:?}, a new grant's {fresh:?}");
                found.lost_grants.push((cut, key.clone(), *token, what));
            }
        }
        eprintln!(
            "cut {cut} ({victims:?} and the sidecar{}): {} grants and {} floors acknowledged; lost so far: {} grants, {} floors",
            if torn { ", torn" } else { "" },
            acked.grants.len(),
            acked.floors.len(),
            found.lost_grants.len(),
            found.lost_floors.len()
        );
        if sidecar_up.is_err() || (until_lost && !found.lost_grants.is_empty()) {
            break;
        }
    }
    found
}

fn seed() -> u64 {
    std::env::var("POWER_LOSS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random)
}

fn report(arm: &str, seed: u64, f: &Found) -> String {
    let mut s = format!(
        "{arm} (seed {seed}; replay with POWER_LOSS_SEED={seed}): {} cuts, {} acknowledged grants and {} acknowledged floors checked; lost {} grants, {} floors; no grant within 20 s after cuts {:?}\n",
        f.cuts,
        f.grants_checked,
        f.floors_checked,
        f.lost_grants.len(),
        f.lost_floors.len(),
        f.stuck
    );
    for (cut, key, token, after) in f.lost_grants.iter().take(20) {
        s += &format!("  lost grant: cut {cut}, {key} token {token} acknowledged; after the cut: {after}\n");
    }
    for (cut, key, floor, answer) in f.lost_floors.iter().take(20) {
        s += &format!(
            "  lost floor: cut {cut}, {key} written with token {floor}; token {} was answered {answer}\n",
            floor - 1
        );
    }
    s
}

async fn durable_arm(cuts: usize) {
    let seed = seed();
    let found = run(Mode::Strict, cuts, seed, false).await;
    let report = report("power cuts", seed, &found);
    eprintln!("{report}");
    assert!(found.grants_checked > 0 && found.floors_checked > 0, "nothing was acknowledged: {report}");
    assert!(found.lost_grants.is_empty() && found.lost_floors.is_empty() && found.stuck.is_empty(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grants_and_floors_survive_power_cuts() {
    durable_arm(10).await;
}

/// The on-demand profile: `POWER_LOSS_CUTS` cuts (default 50).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn many_power_cuts() {
    let cuts = std::env::var("POWER_LOSS_CUTS").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
    durable_arm(cuts).await;
}

/// The control arm: fsync acknowledged but not done (what a node that
/// skipped its fsyncs would get) must lose acknowledged grants or floors
/// within 6 cuts (it stops at the first cut that loses a grant, or leaves
/// the sidecar's store unable to open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_arm_without_fsync_loses_acknowledged_grants() {
    let seed = seed();
    let found = run(Mode::Writeback(Duration::from_secs(1)), 6, seed, true).await;
    let report = report("control (fsync does nothing)", seed, &found);
    eprintln!("{report}");
    let lost = !found.lost_grants.is_empty() || !found.lost_floors.is_empty();
    assert!(lost, "the control arm lost nothing: the test cannot see a loss. {report}");
}
