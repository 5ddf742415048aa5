//! Shared by the benchmarks: what processes cost (/proc, callgrind), load
//! generators, the lock client logic, many live leases kept alive, result
//! files, the etcd cluster and the reverse proxies. The fencegate processes
//! (cluster, sidecar), the upstream and ports come from `fencegate-testkit`,
//! the same kit the tests use, set up here for measuring. The root package's
//! benchmarks and `bench/anchors` (`#[path]`) both include it. `floor.rs`
//! is not declared here: it needs the `fencegate` library, which
//! `bench/anchors` does not build; the benchmarks that use it declare it.
#![allow(dead_code)] // each benchmark uses a part

pub mod callgrind;
pub mod etcd;
pub mod holders;
pub mod load;
pub mod locks;
pub mod pair;
pub mod procs;
pub mod proxies;
pub mod report;

use std::path::Path;
use std::time::Duration;

use fencegate_testkit::cluster::ClusterOptions;
use fencegate_testkit::routes::{everything_else, rack_writes, table};
use fencegate_testkit::sidecar::SidecarOptions;
use fencegate_testkit::{Bin, Cluster, Sidecar};

/// The `fencegate` binary: `FENCEGATE_TEST_BIN` if set (`bench/run` sets
/// it to the release build as shipped); else the one Cargo built with the
/// benchmark if it is the root package's (with the dev-dependencies'
/// features, tokio's test-util clock among them); else (`bench/anchors`,
/// another package) the release build in the same target directory.
pub fn fencegate_bin() -> Bin {
    if let Ok(path) = std::env::var("FENCEGATE_TEST_BIN") {
        return Bin::new(path);
    }
    if let Some(path) = option_env!("CARGO_BIN_EXE_fencegate") {
        return Bin::new(path);
    }
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("release/fencegate");
    assert!(path.is_file(), "no {}: run `cargo build --release` first", path.display());
    Bin::new(path)
}

/// A 3-node cluster for measuring: nodes connected directly (no relays),
/// data on the project's disk (not tmpfs, so that fsync costs what it
/// costs), warnings only in the logs; `extra_yaml` ends every node's config
/// (a `raft:` section, say).
pub async fn fencegate_cluster(extra_yaml: &str) -> Cluster {
    Cluster::start_with(&fencegate_bin(), cluster_options(extra_yaml)).await
}

/// The options of [`fencegate_cluster`], for a benchmark to change some
/// (`security`, say).
pub fn cluster_options(extra_yaml: &str) -> ClusterOptions {
    ClusterOptions {
        yaml: extra_yaml.into(),
        relays: false,
        data_in: Some(env!("CARGO_TARGET_TMPDIR").into()),
        log_filter: "warn".into(),
        ..Default::default()
    }
}

/// A `fencegate sidecar` asking `cluster`, in front of the upstream on
/// `upstream_port`, fencing `PUT /racks/{rack}` with lock key `rack/{rack}`
/// (strict mode, `consistency` = cached | linearizable); any other path is
/// unfenced. Returns once it serves.
pub async fn fenced_sidecar(cluster: &Cluster, name: &str, upstream_port: u16, consistency: &str) -> Sidecar {
    let upstream = format!("http://127.0.0.1:{upstream_port}");
    cluster.sidecar_with(name, &upstream, fenced_options(consistency, false)).await
}

/// A `fencegate sidecar` of another build (`bin`), asking a plain (not
/// secure) `cluster`, with `options` (`fenced_options`).
pub async fn fenced_sidecar_of(
    bin: &fencegate_testkit::Bin,
    cluster: &Cluster,
    name: &str,
    upstream_port: u16,
    options: SidecarOptions,
) -> Sidecar {
    let upstream = format!("http://127.0.0.1:{upstream_port}");
    let options = SidecarOptions { lock_service: cluster.urls(), ..options };
    Sidecar::start_with(bin, cluster.dir().join(name), &upstream, options).await
}

/// The sidecar config of [`fenced_sidecar`]; with `keyed`, the fenced route
/// keeps idempotency records too, with room for every record a run makes
/// (`keyed_puts` sends a new key with every write).
pub fn fenced_options(consistency: &str, keyed: bool) -> SidecarOptions {
    let fence = format!("{{ mode: strict, consistency: {consistency} }}");
    let mut route = rack_writes(&fence).methods(&["PUT"]);
    let mut limits = String::new();
    if keyed {
        route = route.with("idempotency", "{ retention: 1h }");
        limits = "limits: { idempotency_store: 4GiB }\n".into();
    }
    SidecarOptions {
        yaml: format!("{limits}{}", table(&[route, everything_else()])),
        log_filter: "warn".into(),
        ..Default::default()
    }
}

/// `PUT /racks/1` with `token` and a new `Idempotency-Key` on every request.
pub fn keyed_puts(token: u64) -> load::MakeRequest {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    std::sync::Arc::new(move |_| {
        let mut req = fencegate_testkit::http::fenced_put("/racks/1", token);
        let key = format!("bench-{}", next.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        req.headers_mut().insert("idempotency-key", key.parse().unwrap());
        req
    })
}

/// Until something accepts connections on `port` (a proxy, say).
pub async fn wait_for_port(port: u16) {
    fencegate_testkit::ports::wait_for_port(port, Duration::from_secs(20)).await
}

/// A numeric setting from the environment, or its default.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}
