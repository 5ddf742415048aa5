//! The sidecar's configuration (`fencegate sidecar --config`): where it listens,
//! the upstream it protects, the lock service it asks, and the route table.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, MapAccess, Unexpected, Visitor};
use serde::{Deserialize, Deserializer};

use super::{endpoint_url, ConfigError};
use crate::http::{DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, MAX_CONNECTIONS, MAX_WORKERS};

pub(crate) const KIB: u64 = 1024;
pub(crate) const MIB: u64 = 1024 * KIB;
pub(crate) const GIB: u64 = 1024 * MIB;

/// Route names become metric labels, so they are short and need no escaping.
pub(crate) const MAX_ROUTE_NAME_LEN: usize = 64;
/// Same bound as the lock service's `peers`.
pub(crate) const MAX_LOCK_ENDPOINTS: usize = 9;
pub(crate) const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_ROUTE_TIMEOUT: Duration = Duration::from_secs(3600);
const MAX_HEADER_TIMEOUT: Duration = Duration::from_secs(300);
/// Ten MiB (the default `max_body`) at ~2 Mbit/s.
pub(crate) const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_BODY_TIMEOUT: Duration = Duration::from_secs(3600);
/// Long enough for answers to reach their clients; what S1 needs is waited
/// for after it, whatever it is.
pub(crate) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SidecarConfig {
    /// `sidecar`, if the file says what it is.
    #[serde(default)]
    pub kind: Option<super::Kind>,
    pub listen: SocketAddr,
    /// Where requests go unless their route names its own upstream.
    pub upstream: String,
    /// Needed only by routes that check tokens against the lock service
    /// (`strict`, `monotonic`); `observed` routes work without it.
    pub lock_service: Option<LockServiceConfig>,
    /// Per-key floors, which must survive restarts (S2).
    pub state_dir: PathBuf,
    pub metrics_listen: Option<SocketAddr>,
    /// Event loops serving connections (`http::Workers`); default: one per core.
    pub workers: Option<usize>,
    #[serde(default)]
    pub limits: Limits,
    pub tls: Option<TlsConfig>,
    pub upstream_tls: Option<UpstreamTls>,
    /// In order: the first route that matches a request wins.
    pub routes: Vec<RouteConfig>,
}

/// How long a `cached` route trusts its knowledge after it was last proven
/// current, by default: half the lock service's default shortest TTL
/// (`lease.min_ttl`, 500 ms).
pub(crate) const DEFAULT_MAX_STALENESS: Duration = Duration::from_secs(1);
/// Probes go out every third of it: below this they would be a load of
/// their own on the leader.
const MIN_MAX_STALENESS: Duration = Duration::from_millis(50);
/// Above this the bound is looser than the watch's own silence limit.
const MAX_MAX_STALENESS: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockServiceConfig {
    /// Which lock service: fencegate's own (the default), etcd, whose
    /// `etcdctl lock` locks the sidecar then fences, or ZooKeeper, whose
    /// kazoo and Curator locks it fences (docs/decisions/0010).
    #[serde(default)]
    pub kind: LockServiceKind,
    pub endpoints: Vec<String>,
    /// How long after its knowledge was last proven current (a probe of
    /// the leader's revision, sent at `s`, that the watch stream has caught
    /// up with) a `cached` route may still decide from it alone.
    #[serde(with = "humantime_serde", default = "default_max_staleness")]
    pub max_staleness: Duration,
    /// The CA that signed the nodes' certificates: with it, the endpoints
    /// are `https://`.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// A client certificate and key to present (mTLS).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// A file whose first line is the bearer token to present.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// etcd and ZooKeeper (`digest`): the user to authenticate as, with
    /// the password in `password_file`'s first line.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockServiceKind {
    #[default]
    Fencegate,
    Etcd,
    ZooKeeper,
}

fn default_max_staleness() -> Duration {
    DEFAULT_MAX_STALENESS
}

impl Default for LockServiceConfig {
    fn default() -> Self {
        Self {
            endpoints: vec![],
            max_staleness: DEFAULT_MAX_STALENESS,
            ca: None,
            cert: None,
            key: None,
            token_file: None,
            user: None,
            password_file: None,
            kind: LockServiceKind::Fencegate,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Request bodies above this are refused before anything is forwarded.
    #[serde(deserialize_with = "byte_size")]
    pub max_body: u64,
    #[serde(deserialize_with = "byte_size")]
    pub max_header_bytes: u64,
    /// How long a client may take to send the request head (slowloris), and
    /// how long a connection may sit idle (before and between requests).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// How long a client may take to send a request body, from its head on.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// How long a client may take no data of its answer (a zero window), and
    /// the upstream send none of its answer's body, before the connection
    /// (or the exchange) is closed.
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// The idempotency records kept at most, in bytes (memory and disk);
    /// beyond it new keys are refused (503).
    #[serde(deserialize_with = "byte_size")]
    pub idempotency_store: u64,
    /// How long a stop (SIGTERM) gives connections to finish their answers.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body: 10 * MIB,
            max_header_bytes: 64 * KIB,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            send_timeout: crate::http::DEFAULT_SEND_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idempotency_store: 64 * MIB,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA (mTLS).
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// An extra root for `https://` upstreams, on top of Mozilla's public roots
    /// (compiled in: the machine's store is not consulted).
    pub ca: PathBuf,
}

/// How a route is fenced: `fence: off`, or `fence: { mode, consistency }`.
/// Plain values of the file, which the sidecar's fence decides with
/// (`sidecar::fencing::decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    Off,
    On { mode: FenceMode, consistency: Consistency },
}

impl Default for Fence {
    /// Fenced, strict, cached: forgetting the line must not leave writes unfenced.
    fn default() -> Self {
        Self::On { mode: FenceMode::default(), consistency: Consistency::default() }
    }
}

impl Fence {
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::On { .. })
    }

    /// `observed` keeps its own high-water marks; the other modes verify
    /// tokens with the lock service (S3, S4).
    pub fn needs_lock_service(&self) -> bool {
        matches!(self, Self::On { mode: FenceMode::Strict | FenceMode::Monotonic, .. })
    }

    /// Decides from the watch stream's knowledge while it is proven fresh
    /// enough (`max_staleness`): a `cached` route of the lock service.
    pub fn trusts_the_watch(&self) -> bool {
        self.needs_lock_service() && matches!(self, Self::On { consistency: Consistency::Cached, .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceMode {
    /// S2 + S3 + S4: also refuse a token whose lease is known to have ended.
    #[default]
    Strict,
    /// S2 + S3: refuse only tokens below the latest grant.
    Monotonic,
    /// Durable high-water mark of accepted tokens, no lock service.
    Observed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Consistency {
    /// Check against what the watch stream has delivered so far.
    #[default]
    Cached,
    /// S5: one (coalesced) quorum read per check.
    Linearizable,
}

/// What a fenced route does with a request that carries no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MissingToken {
    /// 428 `missing_token`.
    #[default]
    Reject,
    /// Forward requests without a token unchecked (tokened ones are still checked).
    Allow,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub name: String,
    /// Absent: every method.
    pub methods: Option<Vec<String>>,
    pub path: String,
    /// Template of the key whose tokens fence this route, e.g. `rack/{rack}`.
    pub lock_key: Option<String>,
    /// Absent means `strict`: forgetting the line must not leave writes unfenced.
    #[serde(default, deserialize_with = "fence")]
    pub fence: Fence,
    #[serde(default)]
    pub missing_token: MissingToken,
    pub upstream: Option<String>,
    /// Upstream timeout; also bounds how long a request can hold up later
    /// tokens for its key (the S1 residual window).
    #[serde(with = "humantime_serde", default = "default_route_timeout")]
    pub timeout: Duration,
    /// On a `fence: off` route: forward unsafe methods on paths a fenced
    /// route covers (for other methods), instead of refusing them.
    #[serde(default)]
    pub allow_unfenced_writes: bool,
    /// Let method-override headers (`X-HTTP-Method-Override`, `_method`)
    /// ride on this route's requests, fenced as both methods.
    #[serde(default)]
    pub allow_method_override: bool,
    /// Format suffixes the upstream strips from a path's last segment
    /// (`[json]`: `/racks/42.json` is `/racks/42`).
    #[serde(default)]
    pub suffixes: Vec<String>,
    /// Requests with an `Idempotency-Key` are applied once.
    #[serde(default)]
    pub idempotency: Option<IdempotencyConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// Refuse requests without a key (428).
    #[serde(default)]
    pub required: bool,
    /// How long a key's record is kept after its first request.
    #[serde(with = "humantime_serde", default = "default_retention")]
    pub retention: Duration,
    /// The largest answer body kept for replay.
    #[serde(deserialize_with = "byte_size", default = "default_max_response")]
    pub max_response: u64,
    /// The bytes of records one lock key may hold (memory and disk), so
    /// that one holder cannot fill the store for every other key. Default:
    /// `PER_LOCK_KEY_SHARE` of `limits.idempotency_store`.
    #[serde(default, deserialize_with = "some_byte_size")]
    pub per_lock_key: Option<u64>,
}

/// The default `per_lock_key`: this fraction of `limits.idempotency_store`.
const PER_LOCK_KEY_SHARE: u64 = 16;
/// What a lock key's quota holds at least, past `max_response`: the room a
/// pending record holds for its answer's headers (4 KiB) and its own fields.
const PER_LOCK_KEY_ROOM: u64 = 8 * KIB;

pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
const MAX_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
const MAX_RESPONSE_KEPT: u64 = 64 * MIB;

fn default_retention() -> Duration {
    DEFAULT_RETENTION
}

fn default_max_response() -> u64 {
    MIB
}

impl IdempotencyConfig {
    /// The bytes one lock key's records may hold: `per_lock_key`, or by
    /// default `PER_LOCK_KEY_SHARE` of the store (`limits.idempotency_store`),
    /// with room for one pending record at least.
    pub fn per_lock_key_or_default(&self, store: u64) -> u64 {
        let least = self.max_response + PER_LOCK_KEY_ROOM;
        self.per_lock_key.unwrap_or((store / PER_LOCK_KEY_SHARE).max(least).min(store))
    }

    fn check(&self, i: usize, timeout: Duration, store: u64) -> Result<(), ConfigError> {
        let field = format!("routes[{i}].idempotency.retention");
        if self.retention < Duration::from_secs(1) || self.retention > MAX_RETENTION {
            return Err(ConfigError::invalid(field, "must be between 1s and 30d"));
        }
        // A record must outlive the request it covers: one that expired while
        // the request was still in flight would let a retry through.
        if self.retention <= timeout {
            return Err(ConfigError::invalid(
                field,
                format!("must be longer than the route's timeout ({})", humantime::format_duration(timeout)),
            ));
        }
        if self.max_response > MAX_RESPONSE_KEPT {
            return Err(ConfigError::invalid(format!("routes[{i}].idempotency.max_response"), "must be at most 64MiB"));
        }
        // Room for one pending record at least: a quota below it takes no key.
        let least = self.max_response + PER_LOCK_KEY_ROOM;
        match self.per_lock_key {
            Some(n) if n < least || n > store => Err(ConfigError::invalid(
                format!("routes[{i}].idempotency.per_lock_key"),
                format!(
                    "must be between max_response + 8KiB ({least} bytes) and limits.idempotency_store ({store} bytes)"
                ),
            )),
            _ => Ok(()),
        }
    }
}

fn default_route_timeout() -> Duration {
    DEFAULT_ROUTE_TIMEOUT
}

/// The mapping form of `fence`; kept apart so that it gets serde's
/// `deny_unknown_fields` and defaults.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FenceOn {
    #[serde(default)]
    mode: FenceMode,
    #[serde(default)]
    consistency: Consistency,
}

// Hand-written rather than `#[serde(untagged)]`: an untagged enum's error is
// "data did not match any variant", which hides both the typo and the field.
fn fence<'de, D: Deserializer<'de>>(d: D) -> Result<Fence, D::Error> {
    struct FenceVisitor;
    impl<'de> Visitor<'de> for FenceVisitor {
        type Value = Fence;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("`off` or a mapping like `{ mode: strict, consistency: cached }`")
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<Fence, E> {
            match s {
                "off" => Ok(Fence::Off),
                _ => Err(E::invalid_value(Unexpected::Str(s), &self)),
            }
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Fence, A::Error> {
            let on = FenceOn::deserialize(de::value::MapAccessDeserializer::new(map))?;
            Ok(Fence::On { mode: on.mode, consistency: on.consistency })
        }
    }
    d.deserialize_any(FenceVisitor)
}

/// A byte count: a plain integer, or a string like `64KiB` (units B, KiB, MiB, GiB).
fn byte_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct ByteSizeVisitor;
    impl Visitor<'_> for ByteSizeVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a byte size such as 65536 or 64KiB (units B, KiB, MiB, GiB)")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
            parse_byte_size(s).ok_or_else(|| E::invalid_value(Unexpected::Str(s), &self))
        }
    }
    d.deserialize_any(ByteSizeVisitor)
}

/// An optional field's byte count (absent: `None`, by `serde(default)`).
fn some_byte_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    byte_size(d).map(Some)
}

/// Binary units only: `10MB` is refused rather than guessed at (10^7 or 10 MiB?).
pub(crate) fn parse_byte_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let multiplier = match unit.trim_start() {
        "" | "B" => 1,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => GIB,
        _ => return None,
    };
    number.parse::<u64>().ok()?.checked_mul(multiplier)
}

impl SidecarConfig {
    /// Everything that can be checked on the file's values alone (bounds,
    /// names, combinations); what the values compile into (route templates,
    /// upstream URLs) is checked by the sidecar as it builds its settings
    /// (`sidecar::settings`), so `check-config` reports both.
    pub fn check(&self) -> Result<(), ConfigError> {
        super::Kind::check(self.kind, super::Kind::Sidecar)?;
        self.validate_limits()?;
        if let Some(metrics) = self.metrics_listen {
            // Port 0 twice is two different OS-assigned ports.
            if metrics == self.listen && metrics.port() != 0 {
                return Err(ConfigError::invalid("metrics_listen", "must differ from listen"));
            }
        }
        if self.state_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("state_dir", "must not be empty"));
        }
        if self.routes.is_empty() {
            return Err(ConfigError::invalid("routes", "must list at least one route"));
        }
        let mut names = HashSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            check_route_name(&format!("routes[{i}].name"), &r.name)?;
            if !names.insert(r.name.as_str()) {
                return Err(ConfigError::invalid(format!("routes[{i}].name"), format!("{:?} is used twice", r.name)));
            }
            if r.timeout.is_zero() || r.timeout > MAX_ROUTE_TIMEOUT {
                return Err(ConfigError::invalid(format!("routes[{i}].timeout"), "must be above 0 and at most 1h"));
            }
            if let Fence::On { mode: FenceMode::Observed, consistency: Consistency::Linearizable } = r.fence {
                return Err(ConfigError::invalid(
                    format!("routes[{i}].fence.consistency"),
                    "linearizable reads the lock service, which observed mode does not use",
                ));
            }
            if let Some(idempotency) = &r.idempotency {
                idempotency.check(i, r.timeout, self.limits.idempotency_store)?;
            }
        }
        self.validate_lock_service()?;
        if let Some(n) = self.workers {
            if !(1..=MAX_WORKERS).contains(&n) {
                return Err(ConfigError::invalid("workers", format!("must be between 1 and {MAX_WORKERS}")));
            }
        }
        Ok(())
    }

    /// `workers`, or one event loop per core (at most `MAX_WORKERS`).
    pub fn workers_or_default(&self) -> usize {
        self.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS)))
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        if !(1..=GIB).contains(&l.max_body) {
            return Err(ConfigError::invalid("limits.max_body", "must be between 1 byte and 1GiB"));
        }
        // 8 KiB is the smallest read buffer hyper accepts.
        if !((8 * KIB)..=MIB).contains(&l.max_header_bytes) {
            return Err(ConfigError::invalid("limits.max_header_bytes", "must be between 8KiB and 1MiB"));
        }
        if l.header_timeout.is_zero() || l.header_timeout > MAX_HEADER_TIMEOUT {
            return Err(ConfigError::invalid("limits.header_timeout", "must be above 0 and at most 5m"));
        }
        if l.body_timeout.is_zero() || l.body_timeout > MAX_BODY_TIMEOUT {
            return Err(ConfigError::invalid("limits.body_timeout", "must be above 0 and at most 1h"));
        }
        if l.send_timeout.is_zero() || l.send_timeout > MAX_BODY_TIMEOUT {
            return Err(ConfigError::invalid("limits.send_timeout", "must be above 0 and at most 1h"));
        }
        if !(1..=MAX_CONNECTIONS).contains(&l.max_connections) {
            return Err(ConfigError::invalid("limits.max_connections", "must be between 1 and 1000000"));
        }
        if !((64 * KIB)..=16 * GIB).contains(&l.idempotency_store) {
            return Err(ConfigError::invalid("limits.idempotency_store", "must be between 64KiB and 16GiB"));
        }
        if l.drain_timeout.is_zero() || l.drain_timeout > MAX_DRAIN_TIMEOUT {
            return Err(ConfigError::invalid("limits.drain_timeout", "must be above 0 and at most 1h"));
        }
        Ok(())
    }

    fn validate_lock_service(&self) -> Result<(), ConfigError> {
        let Some(service) = &self.lock_service else {
            return match self.routes.iter().position(|r| r.fence.needs_lock_service()) {
                Some(i) => Err(ConfigError::invalid(
                    "lock_service",
                    format!(
                        "is required: route {:?} (routes[{i}]) checks tokens with the lock service \
                         (only `mode: observed` works without it)",
                        self.routes[i].name
                    ),
                )),
                None => Ok(()),
            };
        };
        let endpoints = &service.endpoints;
        if endpoints.is_empty() || endpoints.len() > MAX_LOCK_ENDPOINTS {
            return Err(ConfigError::invalid("lock_service.endpoints", "must list 1 to 9 lock service nodes"));
        }
        if service.ca.is_none() && (service.cert.is_some() || service.key.is_some()) {
            return Err(ConfigError::invalid("lock_service.ca", "is needed with a client certificate"));
        }
        if service.cert.is_some() != service.key.is_some() {
            return Err(ConfigError::invalid("lock_service.cert", "and lock_service.key go together"));
        }
        if !(MIN_MAX_STALENESS..=MAX_MAX_STALENESS).contains(&service.max_staleness) {
            return Err(ConfigError::invalid(
                "lock_service.max_staleness",
                format!(
                    "must be between {} and {}, and well under the lock service's shortest TTL (got {})",
                    humantime::format_duration(MIN_MAX_STALENESS),
                    humantime::format_duration(MAX_MAX_STALENESS),
                    humantime::format_duration(service.max_staleness),
                ),
            ));
        }
        self.validate_kind(service)?;
        let secret = match (&service.token_file, &service.password_file) {
            (Some(_), _) => Some(("lock_service.token_file", "token")),
            (_, Some(_)) => Some(("lock_service.password_file", "password")),
            _ => None,
        };
        for (i, url) in endpoints.iter().enumerate() {
            let field = format!("lock_service.endpoints[{i}]");
            if endpoints[..i].contains(url) {
                return Err(ConfigError::invalid(field, format!("{url:?} is listed twice")));
            }
            if service.kind == LockServiceKind::ZooKeeper {
                // `validate_zookeeper` checked it.
                continue;
            }
            let uri = endpoint_url(&field, url, service.ca.is_some())?;
            if let Some((secret, what)) = secret.filter(|_| service.ca.is_none()) {
                if !fencegate_client::url::is_loopback(&uri) {
                    return Err(ConfigError::invalid(
                        secret,
                        format!("the {what} would cross the network to {url} in clear text: set lock_service.ca"),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl SidecarConfig {
    /// What each kind of lock service takes: etcd and ZooKeeper
    /// authenticate users with passwords, not bearer tokens; they follow a
    /// `cached` route's keys under the fixed text its lock key starts with;
    /// ZooKeeper is reached over plain TCP.
    fn validate_kind(&self, service: &LockServiceConfig) -> Result<(), ConfigError> {
        let name = match service.kind {
            LockServiceKind::Fencegate => {
                if service.user.is_some() || service.password_file.is_some() {
                    return Err(ConfigError::invalid(
                        "lock_service.user",
                        "and lock_service.password_file are etcd's and ZooKeeper's; fencegate takes token_file",
                    ));
                }
                return Ok(());
            }
            LockServiceKind::Etcd => "etcd",
            LockServiceKind::ZooKeeper => "ZooKeeper",
        };
        if service.token_file.is_some() {
            return Err(ConfigError::invalid(
                "lock_service.token_file",
                format!("is fencegate's: {name} takes user and password_file"),
            ));
        }
        if service.user.is_some() != service.password_file.is_some() {
            return Err(ConfigError::invalid("lock_service.user", "and lock_service.password_file go together"));
        }
        if let Some(user) = &service.user {
            // ZooKeeper's digest is `user:password`.
            let colon = service.kind == LockServiceKind::ZooKeeper && user.contains(':');
            if user.is_empty() || user.len() > 256 || user.chars().any(char::is_control) || colon {
                return Err(ConfigError::invalid(
                    "lock_service.user",
                    "must be 1 to 256 characters, none a control character (nor, for ZooKeeper, a ':')",
                ));
            }
        }
        if service.kind == LockServiceKind::ZooKeeper {
            self.validate_zookeeper(service)?;
        }
        // Both follow a cached route's keys under the fixed text its lock
        // key starts with; one that starts with a placeholder would have
        // them follow the whole keyspace.
        let unfollowable = |r: &RouteConfig| {
            r.fence.trusts_the_watch() && r.lock_key.as_deref().is_some_and(|k| !followable(service.kind, k))
        };
        if let Some(i) = self.routes.iter().position(unfollowable) {
            let example = match service.kind {
                LockServiceKind::ZooKeeper => "its placeholders in its last segment only (e.g. `locks/rack-{rack}`)",
                _ => "(e.g. `rack/{rack}`)",
            };
            return Err(ConfigError::invalid(
                format!("routes[{i}].lock_key"),
                format!(
                    "route {:?} is `cached`, and with kind: {} its lock key must start with fixed text {example}: \
                     the sidecar watches the keys under it; or set `consistency: linearizable` to read the lock \
                     per request",
                    self.routes[i].name,
                    name.to_lowercase(),
                ),
            ));
        }
        Ok(())
    }

    /// ZooKeeper: `host:port` endpoints, no TLS (the client this build
    /// uses has none without a second crypto library), and lock keys that
    /// name a znode without its leading `/`.
    fn validate_zookeeper(&self, service: &LockServiceConfig) -> Result<(), ConfigError> {
        if service.ca.is_some() || service.cert.is_some() {
            return Err(ConfigError::invalid(
                "lock_service.ca",
                "TLS to ZooKeeper is not supported: reach it on loopback, or through a local TLS tunnel",
            ));
        }
        for (i, endpoint) in service.endpoints.iter().enumerate() {
            let field = format!("lock_service.endpoints[{i}]");
            let uri = zookeeper_endpoint(&field, endpoint)?;
            if service.password_file.is_some() && !fencegate_client::url::is_loopback(&uri) {
                return Err(ConfigError::invalid(
                    "lock_service.password_file",
                    format!("the password would cross the network to {endpoint} in clear text"),
                ));
            }
        }
        if let Some(i) = self.routes.iter().position(|r| r.lock_key.as_deref().is_some_and(|k| k.starts_with('/'))) {
            return Err(ConfigError::invalid(
                format!("routes[{i}].lock_key"),
                "names the lock's znode without its leading '/': `locks/rack-{rack}` is znode /locks/rack-42",
            ));
        }
        Ok(())
    }
}

/// Whether etcd or ZooKeeper can follow a `cached` route's lock key `key`
/// by watching the fixed text it starts with: there is some; for
/// ZooKeeper, the placeholders are in its last segment, below a znode
/// other than `/` (which is watched, with every child of it).
fn followable(kind: LockServiceKind, key: &str) -> bool {
    let Some((fixed, rest)) = key.split_once('{') else { return true };
    match kind {
        LockServiceKind::ZooKeeper => fixed.contains('/') && !rest.contains('/'),
        _ => !fixed.is_empty(),
    }
}

/// A ZooKeeper server as its connect strings name one: `host:port`.
fn zookeeper_endpoint(field: &str, endpoint: &str) -> Result<hyper::Uri, ConfigError> {
    let bad = || ConfigError::invalid(field, format!("{endpoint:?} must be host:port, as ZooKeeper's connect strings"));
    let uri: hyper::Uri = endpoint.parse().map_err(|_| bad())?;
    let authority = uri.authority().filter(|a| a.as_str() == endpoint && !a.host().is_empty()).ok_or_else(bad)?;
    if uri.scheme().is_some() || endpoint.contains(['@', ',', '/']) || authority.port_u16().is_none_or(|p| p == 0) {
        return Err(bad());
    }
    Ok(uri)
}

fn check_route_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > MAX_ROUTE_NAME_LEN
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(ConfigError::invalid(
            field,
            format!("{name:?} must be 1 to {MAX_ROUTE_NAME_LEN} characters of [A-Za-z0-9_-] (it is a metric label)"),
        ));
    }
    Ok(())
}
