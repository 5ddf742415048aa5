//! Prometheus metric families, one struct per subsystem. Each registers its
//! families on a registry passed down from `main`; there are no global statics.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> prometheus::Result<T> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

/// Lock service families (DESIGN.md), counted as commands are applied.
#[derive(Clone)]
pub struct LockMetrics {
    pub grants: IntCounter,
    pub releases: IntCounter,
    pub expirations: IntCounter,
    pub acquire_duration: Histogram,
    pub leases: IntGauge,
}

impl LockMetrics {
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
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
        })
    }
}

/// Raft families (DESIGN.md), plus the log's fsync counters.
#[derive(Clone)]
pub struct RaftMetrics {
    pub term: IntGauge,
    pub is_leader: IntGauge,
    pub commit_index: IntGauge,
    pub log_syncs: IntCounter,
    pub log_entries: IntCounter,
}

impl RaftMetrics {
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
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
