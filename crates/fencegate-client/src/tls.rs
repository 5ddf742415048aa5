//! TLS material from PEM files, for everything in fencegate that speaks
//! HTTPS: the client toward the lock service (`--ca`, `--cert`, `--key`),
//! and — through the `fencegate` crate — the nodes' and the sidecar's
//! listeners and peer links.
//!
//! Every config is built on an explicit `ring` provider rather than rustls'
//! process-wide default, so nothing depends on which crate installed one
//! first. Problems name the setting and the file that caused them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use thiserror::Error;

/// A TLS file that could not be used.
#[derive(Debug, Error)]
#[error("{}: {problem}", path.display())]
pub struct TlsError {
    /// The setting that named the file, e.g. `tls.cert` or `--ca`.
    pub field: String,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

/// Building on the default versions fails only for a provider without their cipher suites.
const RING: &str = "ring supports TLS 1.2 and 1.3";

/// The crypto provider of every fencegate TLS config.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where a client's TLS material is: the CA that signed the servers'
/// certificates, and optionally a certificate and key to present (mTLS).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file of the CA(s) to trust; only servers it signed are accepted.
    pub ca: PathBuf,
    /// PEM certificate chain to present, leaf first (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    /// The client config: only `ca` is trusted (never the system's roots: a
    /// lock service is private), and `cert`/`key` are presented when the
    /// server asks. `fields` names the settings in errors, in the order
    /// `[ca, cert, key]`.
    pub fn client_config(&self, fields: [&str; 3]) -> Result<ClientConfig, TlsError> {
        let roots = root_store(fields[0], &self.ca)?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect(RING)
            .with_root_certificates(roots);
        match (&self.cert, &self.key) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let chain = load_certs(fields[1], cert)?;
                let private = load_key(fields[2], key)?;
                builder.with_client_auth_cert(chain, private).map_err(|e| key_problem(fields[2], key, cert, e))
            }
            (Some(cert), None) => Err(problem(fields[2], cert, "a certificate needs its key")),
            (None, Some(key)) => Err(problem(fields[1], key, "a key needs its certificate")),
        }
    }
}

/// The error for a key that rustls refused with `cert`.
pub fn key_problem(field: &str, key: &Path, cert: &Path, e: rustls::Error) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(_) => {
            problem(field, key, format!("is not the key of the certificate in {}", cert.display()))
        }
        e => problem(field, key, e),
    }
}

/// Every certificate in a PEM file, in order (leaf first for a chain).
pub fn load_certs(field: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| pem_problem(field, path, e))?;
    if certs.is_empty() {
        return Err(problem(field, path, "no certificate (-----BEGIN CERTIFICATE-----) in the file"));
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(field: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        pem::Error::NoItemsFound => problem(field, path, "no private key (PKCS#8, PKCS#1 or SEC1) in the file"),
        e => pem_problem(field, path, e),
    })
}

/// The certificates of a PEM file as trust anchors.
pub fn root_store(field: &str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(field, path)? {
        roots.add(cert).map_err(|e| problem(field, path, e))?;
    }
    Ok(roots)
}

fn pem_problem(field: &str, path: &Path, e: pem::Error) -> TlsError {
    match e {
        pem::Error::Io(e) => problem(field, path, format!("cannot read: {e}")),
        e => problem(field, path, format!("not valid PEM: {e}")),
    }
}

/// A [`TlsError`] for `field` and `path`.
pub fn problem(field: &str, path: &Path, problem: impl ToString) -> TlsError {
    TlsError { field: field.to_string(), path: path.to_path_buf(), problem: problem.to_string() }
}
