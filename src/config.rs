//! Configuration files: `load(path)` → `from_yaml(&str)` → `validate()`.
//! Everything is checked before any port is bound; a bad file is reported with
//! the field and line and the process exits with `EX_CONFIG` (64, docs/DESIGN.md).
//!
//! `ConfigFile` is implemented by `NodeConfig` and `SidecarConfig`, with
//! `deny_unknown_fields` everywhere; serde_yaml_ng's errors carry the line.
//! `validate(self)` returns what the process runs on: the node config itself,
//! or `SidecarSettings` with the compiled route table and every upstream
//! URL parsed once. Config is plain data and its checks: it knows no
//! component's types. The sidecar compiles its file into its own
//! (`sidecar::settings`, where `SidecarConfig`'s `ConfigFile` impl lives),
//! so the imports go one way: `sidecar` → `config`, `tls` → `config`.

pub(crate) mod node;
pub(crate) mod sidecar;

use std::path::Path;

use hyper::Uri;
use serde::de::DeserializeOwned;
use thiserror::Error;

/// Exit status for a bad configuration file.
pub(crate) const EXIT_BAD_CONFIG: i32 = 64;

/// A configuration problem. No variant has an error `source`: each message
/// is whole, and printing the chain (`{:#}`) must not repeat it.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    /// serde_yaml_ng's message names the field and the line and column.
    #[error("{0}")]
    Yaml(serde_yaml_ng::Error),
    #[error("invalid `{field}`: {message}")]
    Invalid { field: String, message: String },
    /// One of the above, in the file `path`.
    #[error("{path}: {error}")]
    InFile { path: String, error: Box<ConfigError> },
}

impl From<serde_yaml_ng::Error> for ConfigError {
    fn from(e: serde_yaml_ng::Error) -> Self {
        Self::Yaml(e)
    }
}

impl ConfigError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid { field: field.into(), message: message.into() }
    }

    /// Name the file the error is in (a read error names it already).
    pub fn in_file(self, path: &Path) -> Self {
        match self {
            e @ (Self::Read { .. } | Self::InFile { .. }) => e,
            e => Self::InFile { path: path.display().to_string(), error: Box::new(e) },
        }
    }
}

/// What a config file configures, when it says so (`kind:`): `check-config`
/// goes by it, and a process started on the other kind's file refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Sidecar,
    Node,
}

impl Kind {
    /// `Ok` unless `said` names another kind than `expected`.
    pub fn check(said: Option<Kind>, expected: Kind) -> Result<(), ConfigError> {
        match said {
            Some(k) if k != expected => Err(ConfigError::invalid(
                "kind",
                format!("this file configures a {k:?}, not a {expected:?}").to_lowercase(),
            )),
            _ => Ok(()),
        }
    }
}

/// A configuration file: parsed, then validated as a whole into what the
/// process runs on (`Valid`), so that nothing is parsed twice.
pub trait ConfigFile: DeserializeOwned {
    type Valid;

    fn validate(self) -> Result<Self::Valid, ConfigError>;

    fn from_yaml(text: &str) -> Result<Self::Valid, ConfigError> {
        parse_yaml::<Self>(text)?.validate()
    }

    fn load(path: &Path) -> Result<Self::Valid, ConfigError> {
        Self::from_yaml(&read(path)?).map_err(|e| e.in_file(path))
    }
}

/// Parse YAML into `T`; unknown keys are errors (`deny_unknown_fields` on every section).
pub(crate) fn parse_yaml<T: DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    Ok(serde_yaml_ng::from_str(text)?)
}

pub(crate) fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|cause| ConfigError::Read { path: path.display().to_string(), cause })
}

/// A lock service node's URL (`http://host:port`, `https://` with `tls`), as `field` names it.
pub(crate) fn endpoint_url(field: &str, url: &str, tls: bool) -> Result<Uri, ConfigError> {
    fencegate_client::url::parse_endpoint(url, tls).map_err(|m| ConfigError::invalid(field, m))
}

/// An absolute `http://` or `https://` URL naming a host, with or without a
/// port (the scheme's default), and without a path, query or credentials:
/// the sidecar appends each request's own path and query to it.
pub(crate) fn upstream_url(field: &str, url: &str) -> Result<Uri, ConfigError> {
    let uri = fencegate_client::url::parse_base(url).map_err(|m| ConfigError::invalid(field, m))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(ConfigError::invalid(field, format!("{url:?} must start with http:// or https://")));
    }
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(ConfigError::invalid(field, format!("{url:?} must name a host")));
    };
    if authority.as_str().contains('@') {
        return Err(ConfigError::invalid(field, format!("{url:?} must not carry credentials")));
    }
    // `Authority::port` is `None` for a port that is not a u16, so look at the text.
    if authority.as_str().strip_prefix(authority.host()) != Some("") && authority.port_u16().is_none() {
        return Err(ConfigError::invalid(field, format!("{url:?} has an invalid port")));
    }
    Ok(uri)
}
