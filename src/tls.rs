//! TLS material from PEM files: the sidecar's server config (HTTPS listener,
//! optional mTLS), its client configs for `https://` upstreams and for the
//! lock service (with a token, if it has one), and a node's configs for its
//! two planes and its peer links. `identity` says who a certificate names.
//!
//! Every config is built on an explicit `ring` provider rather than rustls'
//! process-wide default, so nothing depends on which crate installed one first.
//! Problems are reported against the config field and the file that caused
//! them, and become `ConfigError`s (exit 64), because a bad path or PEM file
//! is a configuration mistake like any other.
//!
//! The sidecar's server config offers ALPN h2 and http/1.1 and may verify
//! client certificates; its upstream client trusts webpki's roots plus
//! `upstream_tls.ca`. A node's `NodeTls`: on the client plane client
//! certificates are optional, on the peer plane a member's certificate is
//! required. TLS files are loaded before any port is bound (and by
//! `check-config`). Handshakes run in the accept loop's per-connection task,
//! under `limits.header_timeout`, and the loop hands each request the
//! client's certificate chain (`http::Conn`). Knows no routes, rights or
//! fencing.

use std::path::Path;

pub(crate) use fencegate_client::tls::TlsError;
use fencegate_client::tls::{key_problem, load_certs, load_key, problem, provider, root_store};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use fencegate_client::tls::TlsFiles;
use fencegate_client::ClientOptions;

use crate::config::node::{NodeConfig, NodeTls as NodeTlsConfig};
use crate::config::sidecar::{LockServiceConfig, TlsConfig, UpstreamTls};
use crate::config::ConfigError;

pub(crate) mod identity;

/// ALPN offered by the sidecar's listener, preferred first: hyper serves both.
const SIDECAR_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

impl From<TlsError> for ConfigError {
    fn from(e: TlsError) -> Self {
        ConfigError::invalid(e.field.clone(), e.to_string())
    }
}

/// Building on the default versions fails only for a provider without their cipher suites.
const RING: &str = "ring supports TLS 1.2 and 1.3";

/// Everything TLS a sidecar needs, loaded from the files its config names.
pub struct SidecarTls {
    /// `None` when the listener serves plain HTTP.
    pub server: Option<ServerConfig>,
    pub upstream: ClientConfig,
    /// How to reach the lock service, if one is configured.
    pub lock_service: Option<ClientOptions>,
    /// etcd's password for `lock_service.user` (`password_file`).
    pub lock_service_password: Option<String>,
}

impl SidecarTls {
    /// The files a sidecar's `tls`, `upstream_tls` and `lock_service` name
    /// (`sidecar::settings::SidecarSettings::load_tls`).
    pub fn load(
        tls: Option<&TlsConfig>,
        upstream_tls: Option<&UpstreamTls>,
        lock_service: Option<&LockServiceConfig>,
    ) -> Result<Self, ConfigError> {
        let server = tls.map(server_config).transpose()?;
        let upstream = upstream_client_config(upstream_tls)?;
        let password = lock_service.and_then(|s| s.password_file.as_deref());
        let lock_service_password =
            password.map(|path| first_line("lock_service.password_file", path, "password")).transpose()?;
        let lock_service = lock_service.map(lock_service_options).transpose()?;
        Ok(Self { server, upstream, lock_service, lock_service_password })
    }
}

/// The sidecar's client options toward the lock service: its CA, client
/// certificate and token file.
fn lock_service_options(service: &LockServiceConfig) -> Result<ClientOptions, ConfigError> {
    let tls = match &service.ca {
        None => None,
        Some(ca) => {
            let files = TlsFiles { ca: ca.clone(), cert: service.cert.clone(), key: service.key.clone() };
            Some(files.client_config(["lock_service.ca", "lock_service.cert", "lock_service.key"])?)
        }
    };
    let token = match &service.token_file {
        None => None,
        Some(path) => Some(first_line("lock_service.token_file", path, "token")?),
    };
    Ok(ClientOptions { tls, token, ..ClientOptions::default() })
}

/// The first line of a file holding a secret (`what`: a token, a password),
/// which must not be empty.
fn first_line(field: &str, path: &Path, what: &str) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::invalid(field, format!("{}: cannot read: {e}", path.display())))?;
    match text.lines().next().map(str::trim) {
        Some(t) if !t.is_empty() => Ok(t.to_string()),
        _ => Err(ConfigError::invalid(field, format!("{}: no {what} on its first line", path.display()))),
    }
}

/// A node's TLS: its client API listener (client certificates optional),
/// its peer listener (a member certificate required) and its peer links.
pub(crate) struct NodeTls {
    pub client_plane: ServerConfig,
    pub peer_plane: ServerConfig,
    pub peer_links: ClientConfig,
}

impl NodeTls {
    /// `None` without `tls`. Startup and `check-config` both call it.
    pub(crate) fn load(config: &NodeConfig) -> Result<Option<NodeTls>, ConfigError> {
        let Some(tls) = &config.tls else { return Ok(None) };
        let NodeTlsConfig { cert, key, ca, client_ca } = tls;
        let own = load_certs("tls.cert", cert)?;
        if !identity::certifies_member(&own[0], config.id) {
            return Err(ConfigError::invalid(
                "tls.cert",
                format!(
                    "{}: does not carry the DNS name {:?}, which the other members require of node {}",
                    cert.display(),
                    identity::member_name(config.id).to_str(),
                    config.id
                ),
            ));
        }
        let fields = ["tls.cert", "tls.key"];
        // Optional: a client without a certificate may still present a token.
        let clients = client_ca.as_deref().map(|ca| ClientCerts { field: "tls.client_ca", ca, required: false });
        let client_plane = listener_config(fields, cert, key, clients)?;
        let members = ClientCerts { field: "tls.ca", ca, required: true };
        let peer_plane = listener_config(fields, cert, key, Some(members))?;
        let files = TlsFiles { ca: ca.clone(), cert: Some(cert.clone()), key: Some(key.clone()) };
        let peer_links = files.client_config(["tls.ca", "tls.cert", "tls.key"])?;
        Ok(Some(NodeTls { client_plane, peer_plane, peer_links }))
    }
}

/// The sidecar listener's config: the cert chain and key of `tls`, and with
/// `client_ca` a verifier that refuses clients without a certificate it signed.
fn server_config(tls: &TlsConfig) -> Result<ServerConfig, TlsError> {
    // Required, not optional: with mTLS configured, an anonymous client must
    // fail the handshake rather than reach a route.
    let clients = tls.client_ca.as_deref().map(|ca| ClientCerts { field: "tls.client_ca", ca, required: true });
    let mut config = listener_config(["tls.cert", "tls.key"], &tls.cert, &tls.key, clients)?;
    config.alpn_protocols = SIDECAR_ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Which client certificates a listener asks for.
pub(crate) struct ClientCerts<'a> {
    /// The setting naming `ca`, for errors.
    pub field: &'static str,
    /// Only certificates this CA signed are accepted.
    pub ca: &'a Path,
    /// A client without a certificate fails the handshake; otherwise it is
    /// served, and identifies itself some other way (a bearer token).
    pub required: bool,
}

/// A listener's config: `cert` (chain) and `key`, and the client
/// certificates it accepts (none without `clients`). `fields` names the
/// cert and key settings in errors.
pub(crate) fn listener_config(
    fields: [&str; 2],
    cert: &Path,
    key: &Path,
    clients: Option<ClientCerts<'_>>,
) -> Result<ServerConfig, TlsError> {
    let certs = load_certs(fields[0], cert)?;
    let private = load_key(fields[1], key)?;
    let builder = ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions().expect(RING);
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let roots = root_store(c.field, c.ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(std::sync::Arc::new(roots), provider());
            let verifier = if c.required { verifier } else { verifier.allow_unauthenticated() };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| problem(c.field, c.ca, e))?)
        }
    };
    // This also checks that the key belongs to the first certificate.
    builder.with_single_cert(certs, private).map_err(|e| key_problem(fields[1], key, cert, e))
}

/// The config for `https://` upstreams: Mozilla's roots (compiled in, since the
/// machine's own store may be absent, as in slim containers) plus
/// `upstream_tls.ca`. No ALPN: the upstream connection is HTTP/1.1.
fn upstream_client_config(extra: Option<&UpstreamTls>) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    if let Some(UpstreamTls { ca }) = extra {
        for cert in load_certs("upstream_tls.ca", ca)? {
            roots.add(cert).map_err(|e| problem("upstream_tls.ca", ca, e))?;
        }
    }
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect(RING)
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests;
