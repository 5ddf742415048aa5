//! Who a client API request comes from: a bearer token (looked up by its hash
//! in the tokens file, which is re-read when it changes), else a client
//! certificate (verified in the handshake against `tls.client_ca`), else —
//! only where clients need not authenticate — `anonymous`.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hyper::header::AUTHORIZATION;
use hyper::HeaderMap;

use super::error::ApiError;
use crate::auth::{Tokens, ANONYMOUS};
use crate::config::node::NodeConfig;
use crate::config::ConfigError;
use crate::http::Conn;
use crate::tls::identity;

/// How often the tokens file is checked for changes.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

pub struct Credentials {
    tokens: Option<TokenFile>,
    /// Whether client certificates identify clients (`tls.client_ca`).
    certificates: bool,
    /// Whether a request without credentials is refused.
    required: bool,
}

struct TokenFile {
    path: PathBuf,
    current: RwLock<Arc<Tokens>>,
    /// The SHA-256 of the contents last taken.
    digest: RwLock<Option<[u8; 32]>>,
}

impl Credentials {
    /// Read the tokens file, if any: a missing or malformed one is a
    /// configuration error at startup (later, a bad edit keeps the old tokens).
    pub fn load(config: &NodeConfig) -> Result<Arc<Credentials>, ConfigError> {
        let tokens = match &config.auth.tokens_file {
            None => None,
            Some(path) => {
                if !path.is_file() {
                    return Err(ConfigError::invalid("auth.tokens_file", format!("{}: no such file", path.display())));
                }
                let file = TokenFile { path: path.clone(), current: RwLock::default(), digest: RwLock::default() };
                file.reload().map_err(|e| ConfigError::invalid("auth.tokens_file", e))?;
                Some(file)
            }
        };
        let certificates = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
        Ok(Arc::new(Credentials { tokens, certificates, required: config.clients_authenticate() }))
    }

    /// Re-read the tokens file whenever it changes, for as long as `self` lives.
    pub fn keep_fresh(self: &Arc<Self>) {
        if self.tokens.is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD_EVERY).await;
                let Some(me) = weak.upgrade() else { return };
                let file = me.tokens.as_ref().expect("checked above");
                if let Err(e) = file.reload() {
                    tracing::error!(path = %file.path.display(), "tokens file not reloaded, keeping the old tokens: {e}");
                }
            }
        });
    }

    /// The identity of a request on the client API.
    pub fn identify(&self, headers: &HeaderMap, conn: &Conn) -> Result<String, ApiError> {
        if let Some(value) = headers.get(AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .ok_or_else(|| ApiError::Unauthorized("Authorization must be `Bearer <token>`".into()))?;
            let Some(file) = &self.tokens else {
                return Err(ApiError::Unauthorized("this node accepts no bearer tokens".into()));
            };
            let tokens = file.current.read().expect("never poisoned").clone();
            return match tokens.owner(token.trim()) {
                Some(identity) => Ok(identity.to_string()),
                None => Err(ApiError::Unauthorized("unknown token".into())),
            };
        }
        if let (true, Some(cert)) = (self.certificates, conn.leaf()) {
            let named = conn.named.get_or_init(|| identity::client_name(cert));
            return named
                .clone()
                .ok_or_else(|| ApiError::Unauthorized("the client certificate names no identity".into()));
        }
        if self.required {
            return Err(ApiError::Unauthorized("authenticate with a client certificate or a bearer token".into()));
        }
        Ok(ANONYMOUS.to_string())
    }
}

impl TokenFile {
    /// Read the file again; take its tokens if its contents changed. A file
    /// that is gone leaves no token valid (fail closed); one that does not
    /// parse keeps the old tokens (a half-written edit must not lock
    /// everyone out). Replace it by renaming a new file over it.
    fn reload(&self) -> Result<(), String> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let digest = crate::auth::token_hash(&text);
        if *self.digest.read().expect("never poisoned") == Some(digest) {
            return Ok(());
        }
        let tokens = Tokens::parse(&text).map_err(|e| format!("{}: {e}", self.path.display()))?;
        tracing::info!(path = %self.path.display(), tokens = tokens.count(), "tokens file read");
        *self.current.write().expect("never poisoned") = Arc::new(tokens);
        *self.digest.write().expect("never poisoned") = Some(digest);
        Ok(())
    }
}
