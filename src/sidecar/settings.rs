//! What the sidecar runs on, compiled from its config file: the config
//! module checks the file's values (`SidecarConfig::check`) and knows no
//! sidecar type; here they become the route table, each route with its
//! parsed upstream and idempotency policy. Data flows one way:
//! `sidecar` → `config`, never back.
//!
//! `SidecarConfig`'s `ConfigFile` impl lives here for that reason: `load`,
//! `from_yaml` and `check-config` all end in [`SidecarSettings`].

use std::net::SocketAddr;
use std::path::PathBuf;

use hyper::Uri;

use crate::config::sidecar::{
    IdempotencyConfig, Limits, LockServiceConfig, RouteConfig, SidecarConfig, TlsConfig, UpstreamTls,
};
use crate::config::{upstream_url, ConfigError, ConfigFile};
use crate::sidecar::idempotency::Policy;
use crate::sidecar::routing::{Route, RouteSpec, Routes};
use crate::tls::SidecarTls;

/// A sidecar configuration that passed validation, with what the sidecar
/// runs on built once: the compiled route table (each route with its parsed
/// upstream) and the checked lock service endpoints. TLS files are loaded
/// from `tls` and `upstream_tls` by [`SidecarSettings::load_tls`].
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

impl SidecarSettings {
    /// The TLS files the settings name, loaded: by startup, a reload and
    /// `check-config` alike, so that all three report the same problems.
    pub fn load_tls(&self) -> Result<SidecarTls, ConfigError> {
        SidecarTls::load(self.tls.as_ref(), self.upstream_tls.as_ref(), self.lock_service.as_ref())
    }
}

impl ConfigFile for SidecarConfig {
    type Valid = SidecarSettings;

    /// Everything the sidecar will need at startup, route templates included,
    /// so that a typo is reported by `check-config` and not on the first request.
    fn validate(self) -> Result<SidecarSettings, ConfigError> {
        self.check()?;
        let upstream = upstream_url("upstream", &self.upstream)?;
        let routes = compile_routes(&self.routes, &upstream, self.limits.idempotency_store)?;
        Ok(SidecarSettings {
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            upstream,
            workers: self.workers_or_default(),
            lock_service: self.lock_service,
            state_dir: self.state_dir,
            limits: self.limits,
            tls: self.tls,
            upstream_tls: self.upstream_tls,
            routes,
        })
    }
}

/// A route's `idempotency` (its bounds checked by `SidecarConfig::check`),
/// with its lock keys' quota a share of the store by default.
fn policy(c: &IdempotencyConfig, store: u64) -> Policy {
    Policy {
        required: c.required,
        retention: c.retention,
        max_response: c.max_response,
        per_lock_key: c.per_lock_key_or_default(store),
    }
}

/// Compile the route table: templates, methods and upstreams, each parsed
/// once. Errors name the field (`routes[2].lock_key`).
/// `store` is `limits.idempotency_store`, which routes' quotas are a share of.
pub(crate) fn compile_routes(
    routes: &[RouteConfig],
    default_upstream: &Uri,
    store: u64,
) -> Result<Routes, ConfigError> {
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
            idempotency: r.idempotency.as_ref().map(|c| policy(c, store)),
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

#[cfg(test)]
mod tests;
