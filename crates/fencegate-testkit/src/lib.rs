//! The one test kit of fencegate's integration tests (`tests/`) and
//! benchmarks (`bench/`): everything they start and talk to, on loopback and
//! OS-assigned ports only.
//!
//! - [`Bin`]: the `fencegate` binary under test (`bin!()` in a test or a
//!   benchmark), and running it to its exit with a bound.
//! - [`Cluster`]: real `fencegate server` processes; peer links through
//!   relays that a test can cut ([`relay`]); SIGKILL, SIGSTOP, restart on the
//!   same data; waits for a leader or for a node's own applied state; the
//!   nodes' logs printed when a test fails.
//! - [`Sidecar`]: a real `fencegate sidecar` process; [`routes`]: its route
//!   tables.
//! - [`Upstream`]: the recording "legacy API" behind a sidecar, which checks
//!   nothing and reports arrivals; or, for benchmarks, a counting one on its
//!   own thread.
//! - [`lenient`]: how a lenient web framework would read a request that
//!   reached the upstream (overrides, case, `parseInt` ids and tokens).
//! - [`http`], [`watch`]: raw HTTP requests and answers, the NDJSON watch stream.
//! - [`wait`]: bounded waits for a condition (no bare sleeps for order).
//! - [`verify`]: the verification suites' workload, history and checker.
//! - `netns` and `powerloss` (feature `faults`, the privileged tier): a
//!   private network of network namespaces (a member per node, sidecar,
//!   workers) with firewall rules and packet delay; a FUSE filesystem whose
//!   power a test cuts.
//! - [`etcd`], [`zookeeper`]: the other lock services the sidecar fences,
//!   as 3-member ensembles on loopback, and lock holders on them (installed
//!   by `.ci/lockservices`).
//! - [`browser`]: a headless chromium driven over WebDriver, for the
//!   consoles' tests (installed by `.ci/browser`).
//! - [`files`]: data directories copied whole.
//! - [`ports`], [`process`], [`tls`]: free ports, child processes killed on
//!   drop (and when the test process dies), a throw-away PKI.
//!
//! Every wait in the kit is bounded in time, and a failed one says what it
//! waited for.

pub mod binary;
pub mod browser;
pub mod cluster;
pub mod etcd;
pub mod files;
pub mod http;
pub mod lenient;
#[cfg(feature = "faults")]
pub mod netns;
pub mod ports;
#[cfg(feature = "faults")]
pub mod powerloss;
pub mod process;
pub mod relay;
pub mod routes;
pub mod sidecar;
pub mod tls;
pub mod upstream;
pub mod verify;
pub mod wait;
pub mod watch;
pub mod zookeeper;

pub use binary::Bin;
pub use cluster::Cluster;
pub use ports::{free_port, free_ports};
pub use process::Proc;
pub use sidecar::Sidecar;
pub use upstream::Upstream;
pub use watch::Watch;

/// The `fencegate` binary of the package being tested or benchmarked:
/// `Bin::new(env!("CARGO_BIN_EXE_fencegate"))`, expanded where it is written
/// (Cargo sets that variable for the integration tests and benches of the
/// package that has the binary). `FENCEGATE_TEST_BIN=PATH` runs the tests
/// against another build instead: the one before a fix, to see its test
/// fail.
#[macro_export]
macro_rules! bin {
    () => {
        $crate::Bin::new(std::env::var("FENCEGATE_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_fencegate").into()))
    };
}
