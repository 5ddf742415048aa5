//! Prometheus metric families, one struct per subsystem. Each registers its
//! families on a registry passed down from `main`; there are no global statics.
//!
//! Also here: the process families and `fencegate_build_info` (`process`),
//! the sidecar's label vocabularies (`Outcome`, `KeyResult`), and
//! `start_at_zero`, which creates every series a route can count at 0, so
//! that `increase()` sees a first event (`tests/e2e/metrics.rs`).

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// The Prometheus text exposition of everything in `r`.
pub(crate) fn encode(r: &Registry) -> Vec<u8> {
    let mut buf = Vec::new();
    TextEncoder::new().encode(&r.gather(), &mut buf).expect("text encoding into a Vec cannot fail");
    buf
}

/// A response with the text exposition, as `/metrics` serves it.
pub(crate) fn exposition(r: &Registry) -> hyper::Response<crate::http::Body> {
    let mut resp = hyper::Response::new(crate::http::full(encode(r)));
    resp.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"));
    resp
}

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> prometheus::Result<T> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

/// `name{result}`, the config reloads (SIGHUP) by result: `applied` or
/// `refused`, both present from the start (at 0) so that alerts see them.
pub(crate) fn config_reloads(r: &Registry, name: &str) -> prometheus::Result<IntCounterVec> {
    let reloads = register(r, IntCounterVec::new(Opts::new(name, "Config reloads (SIGHUP) by result"), &["result"])?)?;
    for result in [RELOAD_APPLIED, RELOAD_REFUSED] {
        reloads.with_label_values(&[result]);
    }
    Ok(reloads)
}

pub(crate) const RELOAD_APPLIED: &str = "applied";
pub(crate) const RELOAD_REFUSED: &str = "refused";

/// What every fencegate process exports, node or sidecar: the `process_*`
/// families (CPU seconds, resident memory, open and maximum file
/// descriptors, start time; read from /proc at each scrape) and
/// `fencegate_build_info{version} 1`, which also tells a dashboard's
/// `job` and `instance` variables which targets are fencegate's.
pub(crate) fn process(r: &Registry) -> prometheus::Result<()> {
    #[cfg(target_os = "linux")]
    r.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
    let info = register(
        r,
        IntGaugeVec::new(Opts::new("fencegate_build_info", "Always 1: the version of this process"), &["version"])?,
    )?;
    info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    Ok(())
}

/// Lock service families (docs/DESIGN.md), counted as commands are applied.
#[derive(Clone)]
pub(crate) struct LockMetrics {
    pub grants: IntCounter,
    pub releases: IntCounter,
    pub expirations: IntCounter,
    pub acquire_duration: Histogram,
    pub leases: IntGauge,
    /// Keys in the table (held, in lock-delay, or idle and not compacted yet).
    pub keys: IntGauge,
    /// Acquires parked on this node, waiting for their key.
    pub waiters: IntGauge,
    /// The applied table's revision: every token granted so far is at most
    /// this (what a restore's `--min-token` must cover).
    pub revision: IntGauge,
}

impl LockMetrics {
    /// The gauges that describe the applied table.
    pub(crate) fn set_table(&self, locks: &crate::lock::state::LockState) {
        self.leases.set(locks.lease_count() as i64);
        self.keys.set(locks.key_count() as i64);
        self.revision.set(locks.revision() as i64);
    }

    pub(crate) fn new(r: &Registry) -> prometheus::Result<Self> {
        let buckets = vec![0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
        Ok(Self {
            grants: register(r, IntCounter::new("fencegate_lock_grants_total", "Leases granted (applied)")?)?,
            releases: register(r, IntCounter::new("fencegate_lock_releases_total", "Leases released (applied)")?)?,
            expirations: register(r, IntCounter::new("fencegate_lock_expirations_total", "Leases expired (applied)")?)?,
            acquire_duration: register(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "fencegate_lock_acquire_duration_seconds",
                        "Time to answer an acquire on the leader, waiting included",
                    )
                    .buckets(buckets),
                )?,
            )?,
            leases: register(r, IntGauge::new("fencegate_lock_leases", "Live leases")?)?,
            keys: register(
                r,
                IntGauge::new("fencegate_lock_keys", "Keys in the lock table (idle ones until compacted)")?,
            )?,
            waiters: register(
                r,
                IntGauge::new("fencegate_lock_waiters", "Acquires waiting on this node for their key")?,
            )?,
            revision: register(
                r,
                IntGauge::new(
                    "fencegate_lock_revision",
                    "Revision of the applied lock table (>= every token granted)",
                )?,
            )?,
        })
    }
}

/// Raft families (docs/DESIGN.md), plus the log's fsync counters.
#[derive(Clone)]
pub(crate) struct RaftMetrics {
    pub term: IntGauge,
    pub is_leader: IntGauge,
    pub commit_index: IntGauge,
    pub log_syncs: IntCounter,
    pub log_entries: IntCounter,
}

impl RaftMetrics {
    pub(crate) fn new(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            term: register(r, IntGauge::new("fencegate_raft_term", "Current Raft term")?)?,
            is_leader: register(r, IntGauge::new("fencegate_raft_is_leader", "1 on the leader")?)?,
            commit_index: register(
                r,
                IntGauge::new("fencegate_raft_commit_index", "Last log index applied on this node (<= commit index)")?,
            )?,
            log_syncs: register(r, IntCounter::new("fencegate_raft_log_syncs_total", "Durable log appends (fsyncs)")?)?,
            log_entries: register(
                r,
                IntCounter::new("fencegate_raft_log_entries_total", "Log entries made durable by those appends")?,
            )?,
        })
    }
}

/// The `outcome` label of `fencegate_sidecar_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream's answer, whatever its status.
    Forwarded,
    /// A kept answer replayed for an idempotency key.
    Replayed,
    /// The sidecar's own refusal (also counted in `rejections_total`).
    Rejected,
    /// 502 or 504: the upstream failed or timed out.
    UpstreamError,
    /// The sidecar's own failure.
    Internal,
}

impl Outcome {
    pub const ALL: [Outcome; 5] =
        [Outcome::Forwarded, Outcome::Replayed, Outcome::Rejected, Outcome::UpstreamError, Outcome::Internal];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Replayed => "replayed",
            Outcome::Rejected => "rejected",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Internal => "internal",
        }
    }
}

/// The `result` label of `fencegate_sidecar_idempotency_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyResult {
    /// Forwarded, and the answer kept.
    Stored,
    Replayed,
    /// 422: the key was used for another request.
    Mismatch,
    /// 409: the first request with the key is in flight.
    InFlight,
    /// An outcome became unknown, or a retry of one was refused.
    Unknown,
    /// The answer was too large to keep.
    NotKept,
    /// 503: the idempotency store is full.
    Full,
    /// 429: the lock key's records hold its quota (`per_lock_key`).
    Quota,
    /// An unknown outcome resolved by an operator.
    Resolved,
}

impl KeyResult {
    pub const ALL: [KeyResult; 9] = [
        KeyResult::Stored,
        KeyResult::Replayed,
        KeyResult::Mismatch,
        KeyResult::InFlight,
        KeyResult::Unknown,
        KeyResult::NotKept,
        KeyResult::Full,
        KeyResult::Quota,
        KeyResult::Resolved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            KeyResult::Stored => "stored",
            KeyResult::Replayed => "replayed",
            KeyResult::Mismatch => "mismatch",
            KeyResult::InFlight => "in_flight",
            KeyResult::Unknown => "unknown",
            KeyResult::NotKept => "not_kept",
            KeyResult::Full => "full",
            KeyResult::Quota => "quota",
            KeyResult::Resolved => "resolved",
        }
    }
}

/// Sidecar families (docs/DESIGN.md).
#[derive(Clone)]
pub struct SidecarMetrics {
    /// outcome: `Outcome`
    pub requests: IntCounterVec,
    /// reason: the `error` of every refusal (outcome `rejected`)
    pub rejections: IntCounterVec,
    pub upstream_duration: HistogramVec,
    pub fence_wait: HistogramVec,
    pub fence_barrier_waiting: IntGauge,
    pub lock_service_up: IntGauge,
    /// Seconds since the knowledge was last proven current (`max_staleness`).
    pub knowledge_age: Gauge,
    /// Checks on `cached` routes that read the lock service because the
    /// knowledge was older than `max_staleness`, by route.
    pub stale_knowledge_reads: IntCounterVec,
    /// Probes (`GET /v1/revision`) that failed or were answered too late to prove anything.
    pub freshness_probe_failures: IntCounter,
    /// Times the lock service answered of another history (cluster id) than
    /// the one the knowledge was of: a restore, or endpoints of two clusters.
    pub history_changes: IntCounter,
    /// result: `KeyResult`
    pub idempotency: IntCounterVec,
    /// Idempotency records held.
    pub idempotency_records: IntGauge,
    /// result: applied | refused
    pub config_reloads: IntCounterVec,
}

/// One route's series of the forwarding path (`SidecarMetrics::route_meters`).
#[derive(Clone)]
pub struct RouteMeters {
    pub fence_wait: Histogram,
    pub upstream_duration: Histogram,
    /// `requests` with outcome `forwarded`.
    pub forwarded: IntCounter,
}

impl SidecarMetrics {
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
        let latency = vec![
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ];
        Ok(Self {
            requests: register(
                r,
                IntCounterVec::new(
                    Opts::new("fencegate_sidecar_requests_total", "Requests by route and outcome"),
                    &["route", "outcome"],
                )?,
            )?,
            rejections: register(
                r,
                IntCounterVec::new(
                    Opts::new("fencegate_sidecar_rejections_total", "Rejected requests by route and reason"),
                    &["route", "reason"],
                )?,
            )?,
            idempotency: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "fencegate_sidecar_idempotency_total",
                        "Requests with an Idempotency-Key by route and result",
                    ),
                    &["route", "result"],
                )?,
            )?,
            idempotency_records: register(
                r,
                IntGauge::new(
                    "fencegate_sidecar_idempotency_records",
                    "Idempotency records held (live and expired-not-yet-swept)",
                )?,
            )?,
            upstream_duration: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new("fencegate_sidecar_upstream_duration_seconds", "Upstream time to response head")
                        .buckets(latency.clone()),
                    &["route"],
                )?,
            )?,
            fence_wait: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "fencegate_sidecar_fence_wait_seconds",
                        "Time spent in the fence check: reads, floor fsync and the ordering barrier",
                    )
                    .buckets(latency),
                    &["route"],
                )?,
            )?,
            fence_barrier_waiting: register(
                r,
                IntGauge::new(
                    "fencegate_sidecar_fence_barrier_waiting",
                    "Fenced requests waiting at the ordering barrier for a lower token in flight on their key",
                )?,
            )?,
            lock_service_up: register(
                r,
                IntGauge::new(
                    "fencegate_sidecar_lock_service_up",
                    "1 while the watch stream to the lock service is live",
                )?,
            )?,
            knowledge_age: register(
                r,
                Gauge::new(
                    "fencegate_sidecar_knowledge_age_seconds",
                    "Seconds since the sidecar's knowledge of the lock service was last proven current",
                )?,
            )?,
            stale_knowledge_reads: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "fencegate_sidecar_stale_knowledge_reads_total",
                        "Checks on cached routes that read the lock service because the knowledge was older than max_staleness",
                    ),
                    &["route"],
                )?,
            )?,
            freshness_probe_failures: register(
                r,
                IntCounter::new(
                    "fencegate_sidecar_freshness_probe_failures_total",
                    "Freshness probes (GET /v1/revision) that failed, or were answered max_staleness or more after they were sent",
                )?,
            )?,
            history_changes: register(
                r,
                IntCounter::new(
                    "fencegate_sidecar_lock_service_history_changes_total",
                    "Times the lock service answered with another cluster id than the knowledge was of (a restore): knowledge dropped, floors kept",
                )?,
            )?,
            config_reloads: config_reloads(r, "fencegate_sidecar_config_reloads_total")?,
        })
    }

    /// `route`'s series that every request it forwards touches, looked up
    /// once: a lookup by label values hashes them, three times a request.
    pub fn route_meters(&self, route: &str) -> RouteMeters {
        RouteMeters {
            fence_wait: self.fence_wait.with_label_values(&[route]),
            upstream_duration: self.upstream_duration.with_label_values(&[route]),
            forwarded: self.requests.with_label_values(&[route, Outcome::Forwarded.as_str()]),
        }
    }

    /// One request of `route` answered with `outcome`.
    pub fn request(&self, route: &str, outcome: Outcome) {
        self.requests.with_label_values(&[route, outcome.as_str()]).inc();
    }

    /// One request refused by the sidecar itself with `reason` (its `error`).
    pub fn refusal(&self, route: &str, reason: &str) {
        self.request(route, Outcome::Rejected);
        self.rejections.with_label_values(&[route, reason]).inc();
    }

    /// One request with an idempotency key on `route`, by what its key did.
    pub fn keyed(&self, route: &str, result: KeyResult) {
        self.idempotency.with_label_values(&[route, result.as_str()]).inc();
    }

    /// Every series `route` can count, at 0: a counter series that first
    /// appears at 1 is invisible to `increase()` and `rate()`, so an alert
    /// on it would miss the first event. `reasons` are the refusals the
    /// route can be given (`sidecar::answer::refusals`); `keyed`: the route
    /// takes idempotency keys.
    pub fn start_at_zero<'a>(&self, route: &str, reasons: impl IntoIterator<Item = &'a str>, keyed: bool) {
        for outcome in Outcome::ALL {
            self.requests.with_label_values(&[route, outcome.as_str()]);
        }
        for reason in reasons {
            self.rejections.with_label_values(&[route, reason]);
        }
        if keyed {
            for result in KeyResult::ALL {
                self.idempotency.with_label_values(&[route, result.as_str()]);
            }
        }
    }
}
