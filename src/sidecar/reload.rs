//! The part of the sidecar that a reload (SIGHUP) replaces: the validated
//! settings (routes, upstreams, limits) with the upstream client built on
//! `upstream_tls`, and the listener's options with its TLS acceptor; and the
//! reload itself. A request reads `Live` once and keeps it to its end, so
//! that it finishes on the config it started with.
//!
//! Floors, idempotency records and the S1 ordering permits are keyed by lock
//! key, not by route: they live in `Sidecar`, outside what is swapped, and a
//! reload leaves them as they are.
//!
//! A reload is applied whole or not at all: the new file is validated and
//! its TLS files loaded before anything is swapped, and the pure
//! `restart_needed` refuses what would need rebuilding the listeners, the
//! state store or the watch.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::TlsAcceptor;

use super::Sidecar;
use crate::config::sidecar::SidecarConfig;
use crate::config::{ConfigError, ConfigFile};
use crate::metrics::{RouteMeters, SidecarMetrics};
use crate::sidecar::settings::SidecarSettings;
use crate::sidecar::upstream::Upstream;

/// What requests are served with until the next reload.
pub(crate) struct Live {
    pub settings: SidecarSettings,
    /// The pooled client to the upstreams, with `upstream_tls`.
    pub upstream: Upstream,
    /// Each route's meters, in the routes' order (`Matched::index`).
    pub meters: Vec<RouteMeters>,
}

impl Live {
    pub(crate) fn new(settings: SidecarSettings, upstream: Upstream, metrics: &SidecarMetrics) -> Self {
        let meters = settings.routes.iter().map(|r| metrics.route_meters(&r.name)).collect();
        Live { settings, upstream, meters }
    }
}

impl Sidecar {
    /// The config requests are served with now.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Load `path` as at startup (validated, TLS files loaded) and serve new
    /// connections and requests with it; or refuse it whole, keeping the
    /// running config, when it is invalid or changes what takes a restart.
    pub(crate) fn reload(&self, path: &Path) -> Result<(), ConfigError> {
        let settings = SidecarConfig::load(path)?;
        let tls = settings.load_tls()?;
        if let Some(refusal) = restart_needed(&self.live().settings, &settings, self.fencer.view.is_some()) {
            return Err(refusal);
        }
        let acceptor = tls.server.map(|c| TlsAcceptor::from(Arc::new(c)));
        self.note_route_timeouts(&settings);
        self.listener.store(Arc::new(super::listener_options(&settings, acceptor, &self.metrics)));
        super::start_at_zero(&self.metrics, &settings);
        if let Some(view) = &self.fencer.view {
            view.set_followed(super::fencing::followed(&settings.routes));
        }
        let upstream = Upstream::new(tls.upstream, settings.workers);
        self.live.store(Arc::new(Live::new(settings, upstream, &self.metrics)));
        Ok(())
    }
}

/// Why `new` cannot replace `old` in a running sidecar, if it cannot: a
/// field that takes a restart changed (the listeners, the state directory,
/// the lock service client and its watch, HTTPS on or off, the connection
/// and record bounds), or a route needs the lock service while no watch
/// runs (`watching`: the sidecar started without a route that needed it).
pub(crate) fn restart_needed(old: &SidecarSettings, new: &SidecarSettings, watching: bool) -> Option<ConfigError> {
    let changed = [
        ("listen", old.listen == new.listen),
        ("metrics_listen", old.metrics_listen == new.metrics_listen),
        ("state_dir", old.state_dir == new.state_dir),
        ("workers", old.workers == new.workers),
        ("lock_service", old.lock_service == new.lock_service),
        ("tls", old.tls.is_some() == new.tls.is_some()),
        ("limits.max_connections", old.limits.max_connections == new.limits.max_connections),
        ("limits.idempotency_store", old.limits.idempotency_store == new.limits.idempotency_store),
    ]
    .into_iter()
    .find(|(_, same)| !same);
    if let Some((field, _)) = changed {
        return Some(ConfigError::invalid(field, "changed: that takes a restart"));
    }
    let needing = new.routes.iter().find(|r| r.fence.needs_lock_service()).filter(|_| !watching)?;
    Some(ConfigError::invalid(
        "routes",
        format!(
            "route {:?} checks tokens with the lock service, and this sidecar started without a route that \
             did, so it does not watch it: that takes a restart",
            needing.name
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
lock_service: { endpoints: [http://127.0.0.1:7401] }
state_dir: ./data/sidecar
metrics_listen: 127.0.0.1:9464
routes:
  - { name: racks, methods: [PUT], path: '/racks/{rack}', lock_key: 'rack/{rack}' }
  - { name: rest, path: '/{*rest}', fence: off }
";

    fn settings(yaml: &str) -> SidecarSettings {
        SidecarConfig::from_yaml(yaml).unwrap()
    }

    fn refusal(from: &str, to: &str, watching: bool) -> Option<String> {
        assert!(BASE.contains(from), "{from}");
        restart_needed(&settings(BASE), &settings(&BASE.replacen(from, to, 1)), watching).map(|e| e.to_string())
    }

    #[test]
    fn routes_upstreams_and_request_limits_reload() {
        for (from, to) in [
            ("upstream: http://127.0.0.1:9000", "upstream: http://127.0.0.1:9001"),
            (
                "  - { name: rest",
                "  - { name: hosts, methods: [PUT], path: '/hosts/{h}', lock_key: 'host/{h}' }\n  - { name: rest",
            ),
            ("fence: off }", "fence: off, timeout: 5s }"),
            ("routes:", "limits: { max_body: 1KiB, header_timeout: 1s, drain_timeout: 1m }\nroutes:"),
            ("routes:", "upstream_tls: { ca: ca.pem }\nroutes:"),
        ] {
            assert_eq!(refusal(from, to, true), None, "{to}");
        }
    }

    #[test]
    fn each_field_that_takes_a_restart_is_named() {
        for (from, to, field) in [
            ("listen: 127.0.0.1:8080", "listen: 127.0.0.1:8081", "`listen`"),
            ("metrics_listen: 127.0.0.1:9464", "metrics_listen: 127.0.0.1:9465", "`metrics_listen`"),
            ("state_dir: ./data/sidecar", "state_dir: ./data/other", "`state_dir`"),
            ("[http://127.0.0.1:7401]", "[http://127.0.0.1:7402]", "`lock_service`"),
            ("[http://127.0.0.1:7401] }", "[http://127.0.0.1:7401], token_file: t }", "`lock_service`"),
            ("routes:", "tls: { cert: c.pem, key: k.pem }\nroutes:", "`tls`"),
            ("routes:", "limits: { max_connections: 10 }\nroutes:", "`limits.max_connections`"),
            ("routes:", "limits: { idempotency_store: 1MiB }\nroutes:", "`limits.idempotency_store`"),
        ] {
            let e = refusal(from, to, true).unwrap_or_else(|| panic!("{to}: reloaded"));
            assert!(e.contains(field) && e.contains("restart"), "{to}: {e}");
        }
        let workers = |n| settings(&BASE.replace("routes:", &format!("workers: {n}\nroutes:")));
        let e = restart_needed(&workers(1), &workers(2), true).expect("workers changed").to_string();
        assert!(e.contains("`workers`") && e.contains("restart"), "{e}");
        // The same certificate files, or new ones, are no restart.
        let with_tls = BASE.replace("routes:", "tls: { cert: c.pem, key: k.pem }\nroutes:");
        let rotated = with_tls.replace("c.pem", "c2.pem");
        assert!(restart_needed(&settings(&with_tls), &settings(&rotated), true).is_none());
    }

    #[test]
    fn a_route_that_needs_the_lock_service_needs_its_watch() {
        let e = refusal("", "", false).expect("the strict route needs a watch that does not run");
        assert!(e.contains("\"racks\"") && e.contains("restart"), "{e}");
        let observed = BASE.replace("lock_key: 'rack/{rack}'", "lock_key: 'rack/{rack}', fence: { mode: observed }");
        assert!(restart_needed(&settings(BASE), &settings(&observed), false).is_none());
    }
}
