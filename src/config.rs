//! Configuration files: `load(path)` → `from_yaml(&str)` → `validate()`.
//! Everything is checked before any port is bound; a bad file is reported with
//! the field and line and the process exits with `EX_CONFIG` (64 per DESIGN.md).

pub mod node;
pub mod sidecar;

use std::path::Path;

use serde::de::DeserializeOwned;
use thiserror::Error;

/// Exit status for a bad configuration file.
pub const EXIT_BAD_CONFIG: i32 = 64;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    /// serde_yaml_ng's message names the field and the line and column.
    #[error("{0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("invalid `{field}`: {message}")]
    Invalid { field: String, message: String },
}

impl ConfigError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid { field: field.into(), message: message.into() }
    }
}

/// A configuration file: parsed, then validated as a whole.
pub trait ConfigFile: DeserializeOwned {
    fn validate(&self) -> Result<(), ConfigError>;

    fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let c: Self = parse_yaml(text)?;
        c.validate()?;
        Ok(c)
    }

    fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::from_yaml(&read(path)?)
    }
}

/// Parse YAML into `T`; unknown keys are errors (`deny_unknown_fields` on every section).
pub fn parse_yaml<T: DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    Ok(serde_yaml_ng::from_str(text)?)
}

pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.display().to_string(), source })
}

/// Parse a base URL: one that request paths are appended to, so it may have
/// neither a path nor a query.
fn parse_base(field: &str, url: &str) -> Result<hyper::Uri, ConfigError> {
    let uri: hyper::Uri = url.parse().map_err(|e| ConfigError::invalid(field, format!("{url:?} is not a URL: {e}")))?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(ConfigError::invalid(field, format!("{url:?} must not have a path or query")));
    }
    Ok(uri)
}

/// Check that `url` is an absolute `http://host:port` URL without a path.
pub fn check_base_url(field: &str, url: &str) -> Result<(), ConfigError> {
    let uri = parse_base(field, url)?;
    if uri.scheme_str() != Some("http") {
        return Err(ConfigError::invalid(field, format!("{url:?} must start with http://")));
    }
    if uri.authority().is_none() || uri.port_u16().is_none() {
        return Err(ConfigError::invalid(field, format!("{url:?} must name a host and a port")));
    }
    Ok(())
}

/// Check that `url` is an absolute `http://` or `https://` URL naming a host,
/// with or without a port (the scheme's default), and without a path, query or
/// credentials: the sidecar appends each request's own path and query to it.
pub fn check_upstream_url(field: &str, url: &str) -> Result<(), ConfigError> {
    let uri = parse_base(field, url)?;
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
    Ok(())
}
