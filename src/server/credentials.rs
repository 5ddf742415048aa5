//! Who a client API request comes from: a bearer token (looked up by its hash
//! in the tokens file, which is re-read when it changes), else a client
//! certificate (verified in the handshake against `tls.client_ca`), else —
//! only where clients need not authenticate — `anonymous`. And the members'
//! shared secret of a plaintext peer plane (`peer_secrets`), which the peer
//! plane's entry checks (`api::proven_member`).
//!
//! A request that outlives a change of the tokens file or of the ACL (a
//! watch stream, a parked acquire) is not let in for good: `lost` resolves
//! once its token is taken out of the file or its right out of the ACL, and
//! it then ends. A client certificate is checked at the handshake only: a
//! reloaded client CA applies to new connections.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hyper::header::AUTHORIZATION;
use hyper::HeaderMap;

use super::error::ApiError;
use crate::auth::{PeerSecrets, Tokens, ANONYMOUS};
use crate::config::node::NodeConfig;
use crate::config::ConfigError;
use crate::http::Conn;
use crate::tls::identity;

/// How often the tokens file is checked for changes.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Credentials {
    tokens: Option<TokenFile>,
    /// Whether client certificates identify clients (`tls.client_ca`).
    certificates: bool,
    /// Whether a request without credentials is refused.
    required: bool,
    /// Bumped when the tokens or the rules change: long-lived requests
    /// check their standing again.
    changes: tokio::sync::watch::Sender<()>,
}

/// What a request was let in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Credential {
    /// A bearer token, by its hash (the token itself is not kept).
    Token([u8; 32]),
    /// Valid for the request's life: a client certificate (checked at the
    /// handshake), a member's word for a forwarded call, or no credential
    /// where none is needed.
    Lasting,
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
    pub(crate) fn load(config: &NodeConfig) -> Result<Arc<Credentials>, ConfigError> {
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
        let changes = tokio::sync::watch::Sender::new(());
        Ok(Arc::new(Credentials { tokens, certificates, required: config.clients_authenticate(), changes }))
    }

    /// Re-read the tokens file whenever it changes, for as long as `self` lives.
    pub(crate) fn keep_fresh(self: &Arc<Self>) {
        if self.tokens.is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD_EVERY).await;
                let Some(me) = weak.upgrade() else { return };
                let file = me.tokens.as_ref().expect("checked above");
                match file.reload() {
                    Ok(true) => me.rules_changed(),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(path = %file.path.display(), "tokens file not reloaded, keeping the old tokens: {e}")
                    }
                }
            }
        });
    }

    /// Tell long-lived requests to check their standing again: the tokens
    /// changed, or the ACL did (`Node::reload`).
    pub(crate) fn rules_changed(&self) {
        self.changes.send_replace(());
    }

    /// Resolves once a request of `identity` let in on `credential` may go
    /// on no longer: its token is not `identity`'s any more, or `allowed`
    /// (its right under the ACL then in force) says no. Checked at once,
    /// and again after each change of the tokens or of the rules.
    pub(crate) fn lost<'a>(
        self: &Arc<Self>,
        identity: String,
        credential: Credential,
        allowed: impl Fn(&str) -> bool + Send + 'a,
    ) -> impl Future<Output = ApiError> + Send + 'a {
        let me = self.clone();
        let mut changes = self.changes.subscribe();
        async move {
            loop {
                if !me.holds(&identity, credential) {
                    return ApiError::Unauthorized("the bearer token was revoked".into());
                }
                if !allowed(&identity) {
                    return ApiError::Forbidden(format!("{identity} lost the right it was let in on"));
                }
                if changes.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// Whether `credential` still belongs to `identity`.
    fn holds(&self, identity: &str, credential: Credential) -> bool {
        let Credential::Token(hash) = credential else { return true };
        let Some(file) = &self.tokens else { return false };
        let tokens = file.current.read().expect("never poisoned").clone();
        tokens.owner_of_hash(&hash) == Some(identity)
    }

    /// The identity of a request on the client API, and what it was let in on.
    pub(crate) fn identify(&self, headers: &HeaderMap, conn: &Conn) -> Result<(String, Credential), ApiError> {
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
            let hash = crate::auth::token_hash(token.trim());
            return match tokens.owner_of_hash(&hash) {
                Some(identity) => Ok((identity.to_string(), Credential::Token(hash))),
                None => Err(ApiError::Unauthorized("unknown token".into())),
            };
        }
        if let (true, Some(cert)) = (self.certificates, conn.leaf()) {
            let named = conn.named.get_or_init(|| identity::client_name(cert));
            return named
                .clone()
                .map(|identity| (identity, Credential::Lasting))
                .ok_or_else(|| ApiError::Unauthorized("the client certificate names no identity".into()));
        }
        if self.required {
            return Err(ApiError::Unauthorized("authenticate with a client certificate or a bearer token".into()));
        }
        Ok((ANONYMOUS.to_string(), Credential::Lasting))
    }
}

/// The members' shared secret (`peer_secret_file`), if the config names
/// one. Read at startup, by `check-config` and on each reload (a rotation);
/// a file anyone but its owner may read or write is refused, as ssh refuses
/// such a private key: every local user could prove to be a member.
pub(crate) fn peer_secrets(config: &NodeConfig) -> Result<Option<PeerSecrets>, ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = &config.peer_secret_file else { return Ok(None) };
    let refuse = |m: String| ConfigError::invalid("peer_secret_file", format!("{}: {m}", path.display()));
    let mode = std::fs::metadata(path).map_err(|e| refuse(e.to_string()))?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(refuse(format!(
            "mode {mode:03o} lets others than its owner read or change it: `chmod 600` it (every local user who \
             can read it can act as a member)"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| refuse(e.to_string()))?;
    PeerSecrets::parse(&text).map(Some).map_err(refuse)
}

impl TokenFile {
    /// Read the file again; take its tokens if its contents changed. A file
    /// that is gone leaves no token valid (fail closed); one that does not
    /// parse keeps the old tokens (a half-written edit must not lock
    /// everyone out). Replace it by renaming a new file over it. `true`
    /// when new tokens were taken.
    fn reload(&self) -> Result<bool, String> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let digest = crate::auth::token_hash(&text);
        if *self.digest.read().expect("never poisoned") == Some(digest) {
            return Ok(false);
        }
        let tokens = Tokens::parse(&text).map_err(|e| format!("{}: {e}", self.path.display()))?;
        tracing::info!(path = %self.path.display(), tokens = tokens.count(), "tokens file read");
        *self.current.write().expect("never poisoned") = Arc::new(tokens);
        *self.digest.write().expect("never poisoned") = Some(digest);
        Ok(true)
    }
}
