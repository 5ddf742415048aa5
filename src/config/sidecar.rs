//! The sidecar's configuration (`fencegate sidecar --config`): where it listens,
//! the upstream it protects, the lock service it asks, and the route table.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hyper::Uri;
use serde::de::{self, MapAccess, Unexpected, Visitor};
use serde::{Deserialize, Deserializer};

use super::{endpoint_url, upstream_url, ConfigError, ConfigFile};
use crate::http::{DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, MAX_CONNECTIONS, MAX_WORKERS};
use crate::sidecar::fencing::decision::{Consistency, Fence, FenceMode, MissingToken};
use crate::sidecar::idempotency::Policy;
use crate::sidecar::routing::{Route, RouteSpec, Routes};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// Route names become metric labels, so they are short and need no escaping.
pub const MAX_ROUTE_NAME_LEN: usize = 64;
/// Same bound as the lock service's `peers`.
pub const MAX_LOCK_ENDPOINTS: usize = 9;
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_ROUTE_TIMEOUT: Duration = Duration::from_secs(3600);
const MAX_HEADER_TIMEOUT: Duration = Duration::from_secs(300);
/// Ten MiB (the default `max_body`) at ~2 Mbit/s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_BODY_TIMEOUT: Duration = Duration::from_secs(3600);
/// Long enough for answers to reach their clients; what S1 needs is waited
/// for after it, whatever it is.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
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
pub const DEFAULT_MAX_STALENESS: Duration = Duration::from_secs(1);
/// Probes go out every third of it: below this they would be a load of
/// their own on the leader.
const MIN_MAX_STALENESS: Duration = Duration::from_millis(50);
/// Above this the bound is looser than the watch's own silence limit.
const MAX_MAX_STALENESS: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockServiceConfig {
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

pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
const MAX_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
const MAX_RESPONSE_KEPT: u64 = 64 * MIB;

fn default_retention() -> Duration {
    DEFAULT_RETENTION
}

fn default_max_response() -> u64 {
    MIB
}

fn idempotency_policy(i: usize, c: &IdempotencyConfig, timeout: Duration, store: u64) -> Result<Policy, ConfigError> {
    let field = format!("routes[{i}].idempotency.retention");
    if c.retention < Duration::from_secs(1) || c.retention > MAX_RETENTION {
        return Err(ConfigError::invalid(field, "must be between 1s and 30d"));
    }
    // A record must outlive the request it covers: one that expired while
    // the request was still in flight would let a retry through.
    if c.retention <= timeout {
        return Err(ConfigError::invalid(
            field,
            format!("must be longer than the route's timeout ({})", humantime::format_duration(timeout)),
        ));
    }
    if c.max_response > MAX_RESPONSE_KEPT {
        return Err(ConfigError::invalid(format!("routes[{i}].idempotency.max_response"), "must be at most 64MiB"));
    }
    // Room for one pending record at least: a quota below it takes no key.
    let least = c.max_response + PER_LOCK_KEY_ROOM;
    let per_lock_key = match c.per_lock_key {
        Some(n) if n < least || n > store => {
            return Err(ConfigError::invalid(
                format!("routes[{i}].idempotency.per_lock_key"),
                format!(
                    "must be between max_response + 8KiB ({least} bytes) and limits.idempotency_store ({store} bytes)"
                ),
            ))
        }
        Some(n) => n,
        None => (store / PER_LOCK_KEY_SHARE).max(least).min(store),
    };
    Ok(Policy { required: c.required, retention: c.retention, max_response: c.max_response, per_lock_key })
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
fn parse_byte_size(s: &str) -> Option<u64> {
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

/// A sidecar configuration that passed validation, with what the sidecar
/// runs on built once: the compiled route table (each route with its parsed
/// upstream) and the checked lock service endpoints. TLS files are loaded
/// from `tls` and `upstream_tls` by `tls::SidecarTls::load`.
#[derive(Debug, Clone)]
pub struct SidecarSettings {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// The default upstream (routes carry their own, resolved).
    pub upstream: Uri,
    /// `None` when no route checks tokens with the lock service and none was configured.
    pub lock_service: Option<LockServiceConfig>,
    pub state_dir: PathBuf,
    pub workers: usize,
    pub limits: Limits,
    pub tls: Option<TlsConfig>,
    pub upstream_tls: Option<UpstreamTls>,
    pub routes: Routes,
}

impl ConfigFile for SidecarConfig {
    type Valid = SidecarSettings;

    /// Everything the sidecar will need at startup, route templates included,
    /// so that a typo is reported by `check-config` and not on the first request.
    fn validate(self) -> Result<SidecarSettings, ConfigError> {
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
        let upstream = upstream_url("upstream", &self.upstream)?;
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
        }
        let routes = compile_routes(&self.routes, &upstream, self.limits.idempotency_store)?;
        self.validate_lock_service()?;
        let workers = match self.workers {
            Some(n) if !(1..=MAX_WORKERS).contains(&n) => {
                return Err(ConfigError::invalid("workers", format!("must be between 1 and {MAX_WORKERS}")))
            }
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS)),
        };
        Ok(SidecarSettings {
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            upstream,
            lock_service: self.lock_service,
            state_dir: self.state_dir,
            workers,
            limits: self.limits,
            tls: self.tls,
            upstream_tls: self.upstream_tls,
            routes,
        })
    }
}

/// Compile the route table: templates, methods and upstreams, each parsed
/// once. Errors name the field (`routes[2].lock_key`).
/// `store` is `limits.idempotency_store`, which routes' quotas are a share of.
pub fn compile_routes(routes: &[RouteConfig], default_upstream: &Uri, store: u64) -> Result<Routes, ConfigError> {
    let mut compiled = Vec::with_capacity(routes.len());
    for (i, r) in routes.iter().enumerate() {
        let upstream = match &r.upstream {
            Some(url) => upstream_url(&format!("routes[{i}].upstream"), url)?,
            None => default_upstream.clone(),
        };
        let spec = RouteSpec {
            name: &r.name,
            methods: r.methods.as_deref(),
            path: &r.path,
            lock_key: r.lock_key.as_deref(),
            fence: r.fence,
            missing_token: r.missing_token,
            upstream,
            timeout: r.timeout,
            allow_unfenced_writes: r.allow_unfenced_writes,
            allow_method_override: r.allow_method_override,
            idempotency: r.idempotency.as_ref().map(|c| idempotency_policy(i, c, r.timeout, store)).transpose()?,
            suffixes: &r.suffixes,
        };
        let route =
            Route::build(spec).map_err(|e| ConfigError::invalid(format!("routes[{i}].{}", e.field), e.message))?;
        compiled.push(route);
    }
    let routes = Routes::new(compiled);
    if let Some((i, earlier, request)) = routes.shadowed() {
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        let name = |j: usize| names[j];
        return Err(ConfigError::invalid(
            format!("routes[{i}]"),
            format!(
                "fenced route {:?} is shadowed by the earlier route {:?} (routes[{earlier}]), which takes {request}: \
                 put {:?} first, or narrow {:?}",
                name(i),
                name(earlier),
                name(i),
                name(earlier)
            ),
        ));
    }
    Ok(routes)
}

impl SidecarConfig {
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
        for (i, url) in endpoints.iter().enumerate() {
            let field = format!("lock_service.endpoints[{i}]");
            let uri = endpoint_url(&field, url, service.ca.is_some())?;
            if service.token_file.is_some() && service.ca.is_none() && !fencegate_client::url::is_loopback(&uri) {
                return Err(ConfigError::invalid(
                    "lock_service.token_file",
                    format!("the token would cross the network to {url} in clear text: set lock_service.ca"),
                ));
            }
            if endpoints[..i].contains(url) {
                return Err(ConfigError::invalid(field, format!("{url:?} is listed twice")));
            }
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/DESIGN.md's example with every optional section filled in.
    const FULL: &str = "
listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
lock_service:
  endpoints: [http://127.0.0.1:7401, http://127.0.0.1:7402, http://127.0.0.1:7403]
state_dir: ./data/sidecar
metrics_listen: 127.0.0.1:9464
limits:
  max_body: 10MiB
  max_header_bytes: 64KiB
  header_timeout: 10s
  body_timeout: 60s
  send_timeout: 60s
tls:
  cert: ./tls/cert.pem
  key: ./tls/key.pem
  client_ca: ./tls/ca.pem
upstream_tls:
  ca: ./tls/upstream-ca.pem
routes:
  - name: rack-writes
    methods: [PUT, POST, PATCH, DELETE]
    path: /racks/{rack}
    lock_key: rack/{rack}
    fence: { mode: strict, consistency: cached }
    missing_token: reject
    upstream: http://127.0.0.1:9001
    timeout: 30s
  - name: everything-else
    path: /{*rest}
    fence: off
";

    /// Only the required keys.
    const MINIMAL: &str = "
listen: 127.0.0.1:8080
upstream: https://inventory.internal
state_dir: ./data/sidecar
lock_service: { endpoints: [http://127.0.0.1:7401] }
routes:
  - name: racks
    path: /racks/{rack}
    lock_key: rack/{rack}
";

    fn err(yaml: &str) -> String {
        SidecarConfig::from_yaml(yaml).unwrap_err().to_string()
    }

    /// The file as written, after checking that it validates.
    fn parsed(yaml: &str) -> SidecarConfig {
        let c: SidecarConfig = crate::config::parse_yaml(yaml).unwrap();
        c.clone().validate().unwrap();
        c
    }

    #[test]
    fn parses_the_full_example() {
        let c = parsed(FULL);
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.upstream, "http://127.0.0.1:9000");
        assert_eq!(c.lock_service.as_ref().unwrap().endpoints.len(), 3);
        assert_eq!(c.lock_service.as_ref().unwrap().max_staleness, DEFAULT_MAX_STALENESS);
        let set = parsed(&FULL.replace("7403]\n", "7403]\n  max_staleness: 400ms\n"));
        assert_eq!(set.lock_service.unwrap().max_staleness, Duration::from_millis(400));
        assert_eq!(c.state_dir, PathBuf::from("./data/sidecar"));
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.limits.max_body, 10 * MIB);
        assert_eq!(c.limits.max_header_bytes, 64 * KIB);
        assert_eq!(c.limits.header_timeout, Duration::from_secs(10));
        let tls = c.tls.as_ref().unwrap();
        assert_eq!(tls.cert, PathBuf::from("./tls/cert.pem"));
        assert_eq!(tls.key, PathBuf::from("./tls/key.pem"));
        assert_eq!(tls.client_ca, Some(PathBuf::from("./tls/ca.pem")));
        assert_eq!(c.upstream_tls.as_ref().unwrap().ca, PathBuf::from("./tls/upstream-ca.pem"));

        let [writes, rest] = &c.routes[..] else { panic!("two routes expected") };
        assert_eq!(writes.name, "rack-writes");
        assert_eq!(writes.methods.as_deref(), Some(&["PUT", "POST", "PATCH", "DELETE"].map(String::from)[..]));
        assert_eq!(writes.path, "/racks/{rack}");
        assert_eq!(writes.lock_key.as_deref(), Some("rack/{rack}"));
        assert_eq!(writes.fence, Fence::On { mode: FenceMode::Strict, consistency: Consistency::Cached });
        assert_eq!(writes.missing_token, MissingToken::Reject);
        assert_eq!(writes.upstream.as_deref(), Some("http://127.0.0.1:9001"));
        assert_eq!(writes.timeout, Duration::from_secs(30));

        assert_eq!(rest.name, "everything-else");
        assert_eq!(rest.methods, None);
        assert_eq!(rest.path, "/{*rest}");
        assert_eq!(rest.lock_key, None);
        assert_eq!(rest.fence, Fence::Off);
        assert!(!rest.fence.is_fenced() && !rest.fence.needs_lock_service());
    }

    #[test]
    fn defaults() {
        let c = parsed(MINIMAL);
        assert_eq!(c.metrics_listen, None);
        assert!(c.tls.is_none() && c.upstream_tls.is_none());
        assert_eq!(c.limits.max_body, 10 * MIB);
        assert_eq!(c.limits.max_header_bytes, 64 * KIB);
        assert_eq!(c.limits.header_timeout, Duration::from_secs(10));
        assert_eq!(c.limits.drain_timeout, Duration::from_secs(10));
        let r = &c.routes[0];
        assert_eq!(r.methods, None);
        assert_eq!(r.upstream, None);
        assert_eq!(r.missing_token, MissingToken::Reject);
        assert_eq!(r.timeout, DEFAULT_ROUTE_TIMEOUT);
        // No `fence` line is the safe choice, not "off".
        assert_eq!(r.fence, Fence::On { mode: FenceMode::Strict, consistency: Consistency::Cached });
        assert!(r.fence.needs_lock_service());

        let c = parsed(&MINIMAL.replace("lock_key", "fence: {}\n    lock_key"));
        assert_eq!(c.routes[0].fence, Fence::default());
        let c = parsed(&format!("{MINIMAL}limits: {{ max_body: 1KiB }}\n"));
        assert_eq!((c.limits.max_body, c.limits.max_header_bytes), (KIB, 64 * KIB));
    }

    #[test]
    fn fence_is_off_or_a_mapping() {
        let with = |fence: &str| MINIMAL.replace("lock_key", &format!("fence: {fence}\n    lock_key"));
        for (fence, mode, consistency) in [
            ("{ mode: monotonic }", FenceMode::Monotonic, Consistency::Cached),
            ("{ consistency: linearizable }", FenceMode::Strict, Consistency::Linearizable),
            ("{ mode: observed, consistency: cached }", FenceMode::Observed, Consistency::Cached),
        ] {
            let c = parsed(&with(fence));
            assert_eq!(c.routes[0].fence, Fence::On { mode, consistency }, "{fence}");
        }
        let off = MINIMAL.replace("lock_key: rack/{rack}", "fence: off");
        assert_eq!(parsed(&off).routes[0].fence, Fence::Off);
        let off = MINIMAL.replace("lock_key: rack/{rack}", "fence: \"off\"");
        assert_eq!(parsed(&off).routes[0].fence, Fence::Off);

        for (fence, says) in [
            ("on", "`off` or a mapping"),
            ("Off", "`off` or a mapping"),
            ("false", "`off` or a mapping"),
            ("0", "`off` or a mapping"),
            ("[strict]", "`off` or a mapping"),
            ("{ mode: strikt }", "strikt"),
            ("{ mode: strict, consistency: eventual }", "eventual"),
            ("{ mode: strict, colour: blue }", "colour"),
        ] {
            let e = err(&with(fence));
            assert!(e.contains("routes[0].fence") && e.contains(says) && e.contains("line"), "{fence}: {e}");
        }
    }

    #[test]
    fn unknown_keys_are_errors_with_a_line() {
        for (from, to, key) in [
            ("state_dir:", "colour: blue\nstate_dir:", "colour"),
            ("lock_service: { endpoints:", "lock_service: { endpionts:", "endpionts"),
            ("max_body: 10MiB", "max_bodyy: 10MiB", "max_bodyy"),
            ("client_ca:", "client_cert:", "client_cert"),
            ("ca: ./tls/upstream", "cert: ./tls/upstream", "cert"),
            ("    timeout: 30s", "    timout: 30s", "timout"),
        ] {
            let base = if from.starts_with("lock_service") { MINIMAL } else { FULL };
            assert!(base.contains(from), "{from}");
            let e = err(&base.replace(from, to));
            assert!(e.contains(key) && e.contains("line"), "{key}: {e}");
        }
    }

    #[test]
    fn byte_sizes() {
        for (text, bytes) in [
            ("0", Some(0)),
            ("512", Some(512)),
            ("512B", Some(512)),
            ("64KiB", Some(64 * KIB)),
            ("10 MiB", Some(10 * MIB)),
            (" 1GiB ", Some(GIB)),
            ("10MB", None),
            ("10mib", None),
            ("1.5MiB", None),
            ("-1", None),
            ("MiB", None),
            ("", None),
            ("99999999999999999999GiB", None),
            ("17179869184GiB", None),
        ] {
            assert_eq!(parse_byte_size(text), bytes, "{text:?}");
        }
        let c = parsed(&FULL.replace("max_body: 10MiB", "max_body: 4096"));
        assert_eq!(c.limits.max_body, 4096);
        for bad in ["max_body: -5", "max_body: 10MB", "max_body: 1.5", "max_body: [1]"] {
            let e = err(&FULL.replace("max_body: 10MiB", bad));
            assert!(e.contains("max_body") && e.contains("byte size"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_values_name_the_field() {
        for (from, to, field) in [
            // limits
            ("max_body: 10MiB", "max_body: 0", "limits.max_body"),
            ("max_body: 10MiB", "max_body: 2GiB", "limits.max_body"),
            ("max_header_bytes: 64KiB", "max_header_bytes: 4KiB", "limits.max_header_bytes"),
            ("max_header_bytes: 64KiB", "max_header_bytes: 2MiB", "limits.max_header_bytes"),
            ("header_timeout: 10s", "header_timeout: 0s", "limits.header_timeout"),
            ("header_timeout: 10s", "header_timeout: 6m", "limits.header_timeout"),
            ("header_timeout: 10s", "header_timeout: soon", "header_timeout"),
            ("body_timeout: 60s", "body_timeout: 0s", "limits.body_timeout"),
            ("body_timeout: 60s", "body_timeout: 2h", "limits.body_timeout"),
            ("send_timeout: 60s", "send_timeout: 0s", "limits.send_timeout"),
            ("header_timeout: 10s", "header_timeout: 10s\n  drain_timeout: 0s", "limits.drain_timeout"),
            ("header_timeout: 10s", "header_timeout: 10s\n  drain_timeout: 2h", "limits.drain_timeout"),
            ("header_timeout: 10s", "header_timeout: 10s\n  max_connections: 0", "limits.max_connections"),
            // addresses
            ("metrics_listen: 127.0.0.1:9464", "metrics_listen: 127.0.0.1:8080", "metrics_listen"),
            ("listen: 127.0.0.1:8080", "listen: localhost", "listen"),
            ("state_dir: ./data/sidecar", "state_dir: ''", "state_dir"),
            ("state_dir: ./data/sidecar", "state_dir: ./data/sidecar\nworkers: 0", "workers"),
            ("state_dir: ./data/sidecar", "state_dir: ./data/sidecar\nworkers: 257", "workers"),
            // upstreams
            ("upstream: http://127.0.0.1:9000", "upstream: 127.0.0.1:9000", "upstream"),
            ("upstream: http://127.0.0.1:9000", "upstream: ftp://127.0.0.1:9000", "upstream"),
            ("upstream: http://127.0.0.1:9000", "upstream: http://127.0.0.1:9000/api", "upstream"),
            ("upstream: http://127.0.0.1:9001", "upstream: http://127.0.0.1:9001?x=1", "routes[0].upstream"),
            ("upstream: http://127.0.0.1:9001", "upstream: http://u:p@127.0.0.1:9001", "routes[0].upstream"),
            // lock service
            ("http://127.0.0.1:7403]", "https://127.0.0.1:7403]", "lock_service.endpoints[2]"),
            ("http://127.0.0.1:7403]", "http://127.0.0.1:7401]", "lock_service.endpoints[2]"),
            ("[http://127.0.0.1:7401, http://127.0.0.1:7402, http://127.0.0.1:7403]", "[]", "lock_service.endpoints"),
            ("7403]\n", "7403]\n  max_staleness: 10ms\n", "lock_service.max_staleness"),
            ("7403]\n", "7403]\n  max_staleness: 11s\n", "lock_service.max_staleness"),
            ("7403]\n", "7403]\n  max_staleness: soon\n", "max_staleness"),
            // routes
            ("  - name: rack-writes", "  - name: ''", "routes[0].name"),
            ("  - name: rack-writes", "  - name: rack writes", "routes[0].name"),
            ("  - name: rack-writes", "  - name: rack/writes", "routes[0].name"),
            ("  - name: everything-else", "  - name: rack-writes", "routes[1].name"),
            ("methods: [PUT, POST, PATCH, DELETE]", "methods: [PUT, put]", "routes[0].methods"),
            ("methods: [PUT, POST, PATCH, DELETE]", "methods: [PUT, POST, PUT]", "routes[0].methods"),
            ("methods: [PUT, POST, PATCH, DELETE]", "methods: ['GET /']", "routes[0].methods"),
            ("methods: [PUT, POST, PATCH, DELETE]", "methods: []", "routes[0].methods"),
            ("    lock_key: rack/{rack}\n", "", "routes[0].lock_key"),
            ("    fence: off", "    fence: off\n    lock_key: all", "routes[1].lock_key"),
            ("lock_key: rack/{rack}", "lock_key: rack/{id}", "routes[0].lock_key"),
            ("lock_key: rack/{rack}", "lock_key: rack//{rack}", "routes[0].lock_key"),
            ("lock_key: rack/{rack}", "lock_key: rack/{rack", "routes[0].lock_key"),
            // idempotency
            ("    missing_token: reject\n", "    idempotency: { retention: 30s }\n", "routes[0].idempotency.retention"),
            ("    missing_token: reject\n", "    idempotency: { retention: 31d }\n", "routes[0].idempotency.retention"),
            (
                "    missing_token: reject\n",
                "    idempotency: { max_response: 65MiB }\n",
                "routes[0].idempotency.max_response",
            ),
            ("    fence: off", "    fence: off\n    idempotency: {}", "routes[1].idempotency"),
            (
                "    missing_token: reject\n",
                "    idempotency: { max_response: 1MiB, per_lock_key: 1MiB }\n",
                "routes[0].idempotency.per_lock_key",
            ),
            (
                "    missing_token: reject\n",
                "    idempotency: { per_lock_key: 65MiB }\n",
                "routes[0].idempotency.per_lock_key",
            ),
            ("    missing_token: reject\n", "    idempotency: { per_lock_key: lots }\n", "per_lock_key"),
            ("  header_timeout: 10s", "  header_timeout: 10s\n  idempotency_store: 1KiB", "limits.idempotency_store"),
            ("path: /racks/{rack}", "path: racks/{rack}", "routes[0].path"),
            ("path: /racks/{rack}", "path: /racks/{rack}/", "routes[0].path"),
            ("path: /racks/{rack}", "path: /racks/{rack}.json", "routes[0].path"),
            ("path: /racks/{rack}", "path: /racks/{*rack}/x", "routes[0].path"),
            ("path: /racks/{rack}", "path: /racks/{rack}/{rack}", "routes[0].path"),
            ("path: /racks/{rack}", "path: /racks/../{rack}", "routes[0].path"),
            ("path: /{*rest}", "path: /{1st}", "routes[1].path"),
            ("timeout: 30s", "timeout: 0s", "routes[0].timeout"),
            ("timeout: 30s", "timeout: 2h", "routes[0].timeout"),
            (
                "mode: strict, consistency: cached",
                "mode: observed, consistency: linearizable",
                "routes[0].fence.consistency",
            ),
        ] {
            assert!(FULL.contains(from), "{from}");
            let e = err(&FULL.replacen(from, to, 1));
            assert!(e.contains(field), "{from} -> {to}: {e}");
        }
        let before_routes = FULL.split("routes:").next().unwrap();
        let e = err(before_routes);
        assert!(e.contains("missing field `routes`"), "{e}");
        let e = err(&format!("{before_routes}routes: []\n"));
        assert!(e.contains("`routes`"), "{e}");
        let ten = (1..=10).map(|i| format!("http://127.0.0.1:{}", 7400 + i)).collect::<Vec<_>>().join(", ");
        let e = err(&MINIMAL.replace("[http://127.0.0.1:7401]", &format!("[{ten}]")));
        assert!(e.contains("lock_service.endpoints"), "{e}");
    }

    /// A lock key's quota: a share of the store by default, never less
    /// than one pending record's room, never more than the store.
    #[test]
    fn a_lock_keys_idempotency_quota_defaults_to_a_share_of_the_store() {
        let quota = |idempotency: &str, limits: &str| {
            let yaml = FULL
                .replace("    missing_token: reject\n", &format!("    idempotency: {idempotency}\n"))
                .replace("  send_timeout: 60s\n", &format!("  send_timeout: 60s\n{limits}"));
            let routes = SidecarConfig::from_yaml(&yaml).unwrap().routes;
            let first = routes.iter().next().unwrap().idempotency.unwrap();
            first.per_lock_key
        };
        assert_eq!(quota("{}", ""), 4 * MIB, "a sixteenth of the default 64MiB");
        assert_eq!(quota("{}", "  idempotency_store: 1GiB\n"), 64 * MIB);
        assert_eq!(quota("{ max_response: 8MiB }", ""), 8 * MIB + 8 * KIB, "room for one answer");
        assert_eq!(quota("{ max_response: 64MiB }", "  idempotency_store: 64MiB\n"), 64 * MIB, "at most the store");
        assert_eq!(quota("{ per_lock_key: 2MiB }", ""), 2 * MIB);
    }

    #[test]
    fn lock_service_is_needed_only_by_strict_and_monotonic_routes() {
        let without = MINIMAL.replace("lock_service: { endpoints: [http://127.0.0.1:7401] }\n", "");
        let e = err(&without);
        assert!(e.contains("`lock_service`") && e.contains("\"racks\""), "{e}");
        let e = err(&without.replace("lock_key", "fence: { mode: monotonic }\n    lock_key"));
        assert!(e.contains("`lock_service`"), "{e}");
        let observed = without.replace("lock_key", "fence: { mode: observed }\n    lock_key");
        assert!(parsed(&observed).lock_service.is_none());
        let off = without.replace("lock_key: rack/{rack}", "fence: off");
        assert!(SidecarConfig::from_yaml(&off).is_ok());
        // Present but unused is still checked.
        let e = err(&MINIMAL.replace("lock_key: rack/{rack}", "fence: off").replace("[http://127.0.0.1:7401]", "[x]"));
        assert!(e.contains("lock_service.endpoints[0]"), "{e}");
    }

    #[test]
    fn routes_that_would_unfence_by_accident_are_refused_naming_both() {
        let catch_all = "  - { name: all, path: '/{*rest}', fence: off }\n";
        let fenced = "  - { name: racks, methods: [PUT], path: '/racks/{rack}', lock_key: 'rack/{rack}' }\n";
        let table = |routes: &str| MINIMAL.split("routes:").next().unwrap().to_string() + "routes:\n" + routes;
        parsed(&table(&format!("{fenced}{catch_all}")));
        let e = err(&table(&format!("{catch_all}{fenced}")));
        assert!(
            e.contains("routes[1]") && e.contains("\"racks\"") && e.contains("\"all\"") && e.contains("PUT /racks/x"),
            "{e}"
        );
        let reads = "  - { name: reads, methods: [GET], path: '/{*rest}', fence: off }\n";
        parsed(&table(&format!("{reads}{fenced}")));
        let typo = fenced.replace("[PUT]", "[PUTT]");
        let e = err(&table(&typo));
        assert!(e.contains("routes[0].methods") && e.contains("PUTT"), "{e}");
        parsed(&table(&fenced.replace("[PUT]", "[PUT, PURGE, X-FLASH]")));
    }

    #[test]
    fn the_lock_service_credentials_need_tls_off_this_machine() {
        let with = |service: &str| MINIMAL.replace("{ endpoints: [http://127.0.0.1:7401] }", service);
        parsed(&with("{ endpoints: [http://127.0.0.1:7401], token_file: t }"));
        let e = err(&with("{ endpoints: [http://10.0.0.1:7401], token_file: t }"));
        assert!(e.contains("lock_service.token_file") && e.contains("clear text"), "{e}");
        parsed(&with("{ endpoints: [https://10.0.0.1:7401], ca: ca.pem, token_file: t }"));
        let e = err(&with("{ endpoints: [http://10.0.0.1:7401], ca: ca.pem }"));
        assert!(e.contains("https://"), "{e}");
        let e = err(&with("{ endpoints: [https://10.0.0.1:7401], cert: c.pem, key: k.pem }"));
        assert!(e.contains("lock_service.ca"), "{e}");
        let e = err(&with("{ endpoints: [https://10.0.0.1:7401], ca: ca.pem, cert: c.pem }"));
        assert!(e.contains("lock_service.cert"), "{e}");
    }

    #[test]
    fn listen_ports_may_both_be_os_assigned() {
        let yaml = FULL.replace("127.0.0.1:8080", "127.0.0.1:0").replace("127.0.0.1:9464", "127.0.0.1:0");
        assert!(SidecarConfig::from_yaml(&yaml).is_ok());
    }

    #[test]
    fn upstream_urls() {
        for ok in [
            "http://127.0.0.1:9000",
            "https://inventory.internal",
            "https://inventory.internal:8443/",
            "http://[::1]:9000",
            "http://inventory",
        ] {
            assert!(upstream_url("u", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "inventory:9000",
            "/api",
            "ftp://inventory",
            "http://",
            "http://inventory/api",
            "http://inventory?x=1",
            "http://user:secret@inventory",
            "http://inventory:99999",
            "http://inventory:",
            "http://[::1]:x",
        ] {
            let Err(e) = upstream_url("routes[3].upstream", bad) else { panic!("{bad:?} accepted") };
            let e = e.to_string();
            assert!(e.contains("routes[3].upstream"), "{bad}: {e}");
        }
    }

    #[test]
    fn load_reads_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sidecar.yaml");
        std::fs::write(&path, FULL).unwrap();
        assert_eq!(SidecarConfig::load(&path).unwrap().routes.iter().count(), 2);
        let e = SidecarConfig::load(&dir.path().join("missing.yaml")).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    }
}
