//! TLS material from PEM files: the sidecar's server config (HTTPS listener,
//! optional mTLS) and the client config for `https://` upstreams.
//!
//! Every config is built on an explicit `ring` provider rather than rustls'
//! process-wide default, so nothing depends on which crate installed one first.
//! Problems are reported against the config field and the file that caused
//! them, and become `ConfigError`s (exit 64), because a bad path or PEM file
//! is a configuration mistake like any other.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use thiserror::Error;

use crate::config::sidecar::{SidecarSettings, TlsConfig, UpstreamTls};
use crate::config::ConfigError;

/// ALPN offered by the listener, preferred first: hyper serves both.
const SERVER_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

#[derive(Debug, Error)]
#[error("{}: {problem}", path.display())]
pub struct TlsError {
    /// The config field that named the file, e.g. `tls.cert`.
    pub field: &'static str,
    pub path: PathBuf,
    pub problem: String,
}

impl From<TlsError> for ConfigError {
    fn from(e: TlsError) -> Self {
        ConfigError::invalid(e.field, e.to_string())
    }
}

/// Building on the default versions fails only for a provider without their cipher suites.
const RING: &str = "ring supports TLS 1.2 and 1.3";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Everything TLS a sidecar needs, loaded from the files its config names.
pub struct SidecarTls {
    /// `None` when the listener serves plain HTTP.
    pub server: Option<ServerConfig>,
    pub upstream: ClientConfig,
}

impl SidecarTls {
    /// Used by startup and by `check-config`, so that both report the same file problems.
    pub fn load(config: &SidecarSettings) -> Result<Self, ConfigError> {
        let server = config.tls.as_ref().map(server_config).transpose()?;
        let upstream = upstream_client_config(config.upstream_tls.as_ref())?;
        Ok(Self { server, upstream })
    }
}

/// The listener's config: the cert chain and key of `tls`, and with
/// `client_ca` a verifier that refuses clients without a certificate it signed.
fn server_config(tls: &TlsConfig) -> Result<ServerConfig, TlsError> {
    let certs = load_certs("tls.cert", &tls.cert)?;
    let key = load_key("tls.key", &tls.key)?;
    let builder = ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions().expect(RING);
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = root_store("tls.client_ca", ca)?;
            // Required, not optional: with mTLS configured, an anonymous client
            // must fail the handshake rather than reach a route.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| problem("tls.client_ca", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    // This also checks that the key belongs to the first certificate.
    let mut config = builder.with_single_cert(certs, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            problem("tls.key", &tls.key, format!("is not the key of the certificate in {}", tls.cert.display()))
        }
        e => problem("tls.key", &tls.key, e),
    })?;
    config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(config)
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

/// Every certificate in a PEM file, in order (leaf first for a chain).
fn load_certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| pem_problem(field, path, e))?;
    if certs.is_empty() {
        return Err(problem(field, path, "no certificate (-----BEGIN CERTIFICATE-----) in the file"));
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
fn load_key(field: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        pem::Error::NoItemsFound => problem(field, path, "no private key (PKCS#8, PKCS#1 or SEC1) in the file"),
        e => pem_problem(field, path, e),
    })
}

fn root_store(field: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(field, path)? {
        roots.add(cert).map_err(|e| problem(field, path, e))?;
    }
    Ok(roots)
}

fn pem_problem(field: &'static str, path: &Path, e: pem::Error) -> TlsError {
    match e {
        pem::Error::Io(e) => problem(field, path, format!("cannot read: {e}")),
        e => problem(field, path, format!("not valid PEM: {e}")),
    }
}

fn problem(field: &'static str, path: &Path, problem: impl ToString) -> TlsError {
    TlsError { field, path: path.to_path_buf(), problem: problem.to_string() }
}

#[cfg(test)]
mod tests;
