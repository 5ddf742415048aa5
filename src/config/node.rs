//! The lock service node's configuration (`fencegate server --config`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{endpoint_url, ConfigError, ConfigFile};
use crate::auth::{Acl, AclRule};
use crate::http::{DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, MAX_CONNECTIONS};

use crate::lock::validate::{MAX_WAIT, MIN_TTL};
const MAX_LIMIT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// `node`, if the file says what it is.
    #[serde(default)]
    pub kind: Option<super::Kind>,
    pub id: u64,
    /// The client API.
    pub listen: SocketAddr,
    /// The peer plane: Raft RPCs, and leader calls followers forward.
    pub peer_listen: SocketAddr,
    /// Without `tls`, anyone who reaches `peer_listen` can speak Raft.
    /// Outside loopback that must be said in so many words.
    #[serde(default)]
    pub insecure_peers: bool,
    /// Without `tls`: a file (mode 0600) of the members' shared secret,
    /// which every peer-plane request proves (`auth::PeerSecrets`).
    /// Required when clients authenticate or an `acl` is set: otherwise any
    /// local user could speak Raft, or forward a call as any identity.
    #[serde(default)]
    pub peer_secret_file: Option<PathBuf>,
    /// Without client authentication, anyone who reaches `listen` may take
    /// and release any lock. Outside loopback that must be said too.
    #[serde(default)]
    pub insecure_clients: bool,
    /// HTTPS on both planes, and mTLS between members.
    #[serde(default)]
    pub tls: Option<NodeTls>,
    /// How clients authenticate besides `tls.client_ca`: bearer tokens.
    #[serde(default)]
    pub auth: AuthConfig,
    /// Who may do what on which keys. Required when clients authenticate;
    /// without it (and without authentication) everyone may do everything.
    #[serde(default)]
    pub acl: Option<Vec<AclRule>>,
    pub data_dir: PathBuf,
    /// Each member's peer-plane URL (its `peer_listen`). The same ids on
    /// every node; the cluster bootstraps from them on first start.
    pub peers: BTreeMap<u64, String>,
    /// Each member's client API URL, as clients reach it: `GET /v1/cluster`
    /// names the leader's, so that clients go to it directly. Optional.
    #[serde(default)]
    pub clients: BTreeMap<u64, String>,
    #[serde(default)]
    pub lease: LeaseConfig,
    #[serde(default)]
    pub raft: RaftConfig,
    #[serde(default)]
    pub limits: NodeLimits,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeTls {
    /// This node's certificate chain: served on both planes, and presented
    /// to the other members. Must carry the DNS name `fencegate-node-<id>`
    /// (and the names clients reach the node by).
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The cluster CA: members must present a certificate it signed that
    /// names the member they speak for.
    pub ca: PathBuf,
    /// Clients presenting a certificate this CA signed are identified by it
    /// (its common name, else its first DNS name). Optional: clients may
    /// use tokens instead.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `identity: sha256:<hex>` lines (`fencegate token new` makes them);
    /// re-read when it changes.
    #[serde(default)]
    pub tokens_file: Option<PathBuf>,
}

/// Bounds on what a client (or peer) may make the node hold open.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeLimits {
    /// How long a client may take to send a request head (an idle keep-alive
    /// connection is closed after it too).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// How long a client may take to send a request body once the head is in.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Keys in the lock table at most (held, in lock-delay, or idle and not
    /// compacted yet); an acquire of a new key beyond it gets 429.
    pub max_keys: usize,
    /// Live leases one identity may hold at once; beyond it, 429.
    pub max_leases_per_identity: u64,
    /// A key neither held nor in lock-delay for this long is dropped from
    /// the table (its tokens are still judged ended: `compacted_below`).
    #[serde(with = "humantime_serde")]
    pub idle_key_retention: Duration,
}

impl Default for NodeLimits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: Duration::from_secs(10),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_keys: 1_000_000,
            max_leases_per_identity: 100_000,
            idle_key_retention: Duration::from_secs(3600),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    #[serde(with = "humantime_serde")]
    pub min_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    /// L6: how long a key stays ungrantable after a lease on it expires.
    #[serde(with = "humantime_serde")]
    pub lock_delay: Duration,
    /// Longest `wait_ms` an acquire may ask for.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            min_ttl: Duration::from_millis(500),
            max_ttl: Duration::from_secs(3600),
            default_ttl: Duration::from_secs(30),
            lock_delay: Duration::ZERO,
            max_wait: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftConfig {
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    #[serde(with = "humantime_serde")]
    pub election_timeout_min: Duration,
    #[serde(with = "humantime_serde")]
    pub election_timeout_max: Duration,
    /// Build a snapshot (and purge the log before it) every this many entries.
    pub snapshot_every: u64,
    /// How long a write may wait for a quorum before the caller gets 503
    /// (its outcome is then unknown, never assumed failed).
    #[serde(with = "humantime_serde")]
    pub propose_timeout: Duration,
}

impl Default for RaftConfig {
    fn default() -> Self {
        Self {
            // openraft 0.9 makes a follower wait a leader lease
            // (election_timeout_max) on top of its election timeout before
            // it campaigns: 350–500 ms of silence with these, against
            // etcd's 300–600 ms (bench/README.md "Failover defaults").
            heartbeat: Duration::from_millis(50),
            election_timeout_min: Duration::from_millis(100),
            election_timeout_max: Duration::from_millis(250),
            snapshot_every: 10_000,
            propose_timeout: Duration::from_secs(5),
        }
    }
}

impl NodeConfig {
    /// Whether clients prove who they are (certificates or tokens).
    pub fn clients_authenticate(&self) -> bool {
        self.auth.tokens_file.is_some() || self.tls.as_ref().is_some_and(|t| t.client_ca.is_some())
    }

    /// Whether identities mean anything here: clients authenticate, or an
    /// `acl` tells identities apart. Then the peer plane, which takes a
    /// forwarded identity and Raft, must be for members only.
    pub fn peers_must_authenticate(&self) -> bool {
        self.clients_authenticate() || self.acl.is_some()
    }

    /// Who can speak Raft to this node and act as whom on its peer plane,
    /// in a sentence (`check-config` prints it).
    pub fn peer_plane(&self) -> String {
        match (&self.tls, &self.peer_secret_file) {
            (Some(_), _) => "TLS, each member by its certificate (signed by tls.ca, naming fencegate-node-<id>); \
                             a forwarded identity is accepted only from the member it names"
                .into(),
            (None, Some(file)) => format!(
                "members prove the shared secret in {}; a forwarded identity is accepted only from them",
                file.display()
            ),
            (None, None) => format!(
                "open to {} (no client authentication configured): anyone can speak Raft to this node, and \
                 forwarded calls act only as anonymous; set peer_secret_file to close it",
                match self.peer_listen.ip().is_loopback() {
                    true => "every local user".to_string(),
                    false => format!("everyone who reaches {}", self.peer_listen),
                }
            ),
        }
    }

    pub fn acl(&self) -> Acl {
        match &self.acl {
            Some(rules) => Acl::rules(rules.clone()),
            None => Acl::open(),
        }
    }
}

impl ConfigFile for NodeConfig {
    type Valid = NodeConfig;

    fn validate(mut self) -> Result<NodeConfig, ConfigError> {
        super::Kind::check(self.kind, super::Kind::Node)?;
        if self.peers.is_empty() || self.peers.len() > 9 {
            return Err(ConfigError::invalid("peers", "must list 1 to 9 nodes (3 or 5 in production)"));
        }
        if !self.peers.contains_key(&self.id) {
            return Err(ConfigError::invalid("id", format!("{} is not one of the peers", self.id)));
        }
        if self.id == 0 {
            return Err(ConfigError::invalid("id", "must be a positive integer"));
        }
        let tls = self.tls.is_some();
        for (id, url) in &self.peers {
            endpoint_url(&format!("peers.{id}"), url, tls)?;
        }
        for (id, url) in &self.clients {
            endpoint_url(&format!("clients.{id}"), url, tls)?;
            if !self.peers.contains_key(id) {
                return Err(ConfigError::invalid(format!("clients.{id}"), "names a node that is not one of the peers"));
            }
        }
        // Port 0 twice is two different OS-assigned ports.
        if self.peer_listen == self.listen && self.listen.port() != 0 {
            return Err(ConfigError::invalid("peer_listen", "must differ from listen: the peer plane is its own"));
        }
        if tls && self.insecure_peers {
            return Err(ConfigError::invalid("insecure_peers", "contradicts tls: with tls, peers are authenticated"));
        }
        if tls && self.peer_secret_file.is_some() {
            return Err(ConfigError::invalid(
                "peer_secret_file",
                "contradicts tls: with tls, members authenticate by their certificates",
            ));
        }
        if !tls && !self.peer_listen.ip().is_loopback() && !self.insecure_peers {
            return Err(ConfigError::invalid(
                "peer_listen",
                format!(
                    "{} is not a loopback address, and without `tls` anyone who reaches it could speak Raft \
                     to this node. Configure tls, or firewall it to the members and set `insecure_peers: true`",
                    self.peer_listen
                ),
            ));
        }
        if self.auth.tokens_file.is_some() && !tls && !self.listen.ip().is_loopback() {
            return Err(ConfigError::invalid(
                "auth.tokens_file",
                format!("bearer tokens on {} without tls would cross the network in clear text", self.listen),
            ));
        }
        let authenticated = self.clients_authenticate();
        if authenticated && self.insecure_clients {
            return Err(ConfigError::invalid("insecure_clients", "contradicts client authentication"));
        }
        if !authenticated && !self.listen.ip().is_loopback() && !self.insecure_clients {
            return Err(ConfigError::invalid(
                "listen",
                format!(
                    "{} is not a loopback address, and clients do not authenticate: anyone who reaches it \
                     could take or release any lock. Configure tls.client_ca or auth.tokens_file with an \
                     acl, or set `insecure_clients: true`",
                    self.listen
                ),
            ));
        }
        match &self.acl {
            None if authenticated => {
                return Err(ConfigError::invalid("acl", "is required when clients authenticate (who may do what?)"))
            }
            Some(rules) => {
                for (i, rule) in rules.iter().enumerate() {
                    rule.validate().map_err(|m| ConfigError::invalid(format!("acl[{i}]"), m))?;
                }
            }
            None => {}
        }
        if self.peers_must_authenticate() && !tls && self.peer_secret_file.is_none() {
            return Err(ConfigError::invalid(
                "peer_secret_file",
                format!(
                    "is required: clients authenticate (or an acl tells identities apart), but without tls the \
                     peer plane on {} would take Raft RPCs and a forwarded identity from anyone who reaches it, \
                     every local user included. Set `peer_secret_file:` to a file only the service user can \
                     read (mode 0600) holding the members' shared secret (`openssl rand -hex 32`), the same on \
                     every member; or configure tls",
                    self.peer_listen
                ),
            ));
        }
        let l = &self.lease;
        if l.min_ttl < MIN_TTL || l.min_ttl > l.default_ttl || l.default_ttl > l.max_ttl {
            return Err(ConfigError::invalid("lease", "need 1ms <= min_ttl <= default_ttl <= max_ttl"));
        }
        // An acquire's own lock_delay_ms may be at most max_ttl: a default
        // above it would make every acquire that does not name one a 400.
        if l.lock_delay > l.max_ttl {
            return Err(ConfigError::invalid("lease.lock_delay", "must be at most lease.max_ttl"));
        }
        if l.max_wait > MAX_WAIT {
            return Err(ConfigError::invalid("lease.max_wait", "must be at most 1h"));
        }
        let r = &self.raft;
        if r.heartbeat.is_zero() || r.election_timeout_min < r.heartbeat * 2 {
            return Err(ConfigError::invalid("raft.election_timeout_min", "must be at least twice raft.heartbeat"));
        }
        if r.election_timeout_max <= r.election_timeout_min {
            return Err(ConfigError::invalid("raft.election_timeout_max", "must be above election_timeout_min"));
        }
        if r.snapshot_every < 100 {
            return Err(ConfigError::invalid("raft.snapshot_every", "must be at least 100"));
        }
        if r.propose_timeout < r.election_timeout_max {
            return Err(ConfigError::invalid("raft.propose_timeout", "must be at least election_timeout_max"));
        }
        let n = &self.limits;
        if n.header_timeout.is_zero() || n.header_timeout > MAX_LIMIT_TIMEOUT {
            return Err(ConfigError::invalid("limits.header_timeout", "must be above 0 and at most 5m"));
        }
        if n.body_timeout.is_zero() || n.body_timeout > MAX_LIMIT_TIMEOUT {
            return Err(ConfigError::invalid("limits.body_timeout", "must be above 0 and at most 5m"));
        }
        if !(1..=MAX_CONNECTIONS).contains(&n.max_connections) {
            return Err(ConfigError::invalid("limits.max_connections", "must be between 1 and 1000000"));
        }
        if !(1..=100_000_000).contains(&n.max_keys) {
            return Err(ConfigError::invalid("limits.max_keys", "must be between 1 and 100000000"));
        }
        if n.max_leases_per_identity == 0 || n.max_leases_per_identity > n.max_keys as u64 {
            return Err(ConfigError::invalid(
                "limits.max_leases_per_identity",
                "must be between 1 and limits.max_keys",
            ));
        }
        if n.idle_key_retention < Duration::from_secs(1) || n.idle_key_retention > Duration::from_secs(30 * 86400) {
            return Err(ConfigError::invalid("limits.idle_key_retention", "must be between 1s and 30 days"));
        }
        // Paths are appended to peer URLs: `http://h:1/` must not give `//raft/...`.
        for url in self.peers.values_mut().chain(self.clients.values_mut()) {
            url.truncate(url.trim_end_matches('/').len());
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "
id: 2
listen: 127.0.0.1:7402
peer_listen: 127.0.0.1:7502
data_dir: ./data/node2
peers:
  1: http://127.0.0.1:7501
  2: http://127.0.0.1:7502
  3: http://127.0.0.1:7503
clients:
  1: http://127.0.0.1:7401
  2: http://127.0.0.1:7402
  3: http://127.0.0.1:7403
lease: { default_ttl: 10s, lock_delay: 2s }
";

    #[test]
    fn parses_with_defaults() {
        let c = NodeConfig::from_yaml(GOOD).unwrap();
        assert_eq!(c.id, 2);
        assert_eq!(c.lease.default_ttl, Duration::from_secs(10));
        assert_eq!(c.lease.lock_delay, Duration::from_secs(2));
        assert_eq!(c.lease.min_ttl, Duration::from_millis(500));
        assert_eq!(c.raft.heartbeat, Duration::from_millis(50));
        assert_eq!(c.peers[&2], "http://127.0.0.1:7502");
        assert_eq!(c.clients[&2], "http://127.0.0.1:7402");
        assert!(!c.insecure_peers, "the safe default");
        let c = NodeConfig::from_yaml(&GOOD.replace("7503", "7503/")).unwrap();
        assert_eq!(c.peers[&3], "http://127.0.0.1:7503", "a trailing / is dropped: paths are appended");
        let without_clients = GOOD.split("clients:").next().unwrap().to_string() + "lease: {}\n";
        assert!(NodeConfig::from_yaml(&without_clients).unwrap().clients.is_empty(), "clients is optional");
    }

    #[test]
    fn a_peer_plane_outside_loopback_must_be_declared_insecure() {
        let public = GOOD.replace("peer_listen: 127.0.0.1:7502", "peer_listen: 0.0.0.0:7502");
        assert!(NodeConfig::from_yaml(&public).is_err());
        let c = NodeConfig::from_yaml(&format!("{public}insecure_peers: true\n")).unwrap();
        assert!(c.insecure_peers);
        let e = NodeConfig::from_yaml(&GOOD.replace("peer_listen: 127.0.0.1:7502\n", "")).unwrap_err().to_string();
        assert!(e.contains("peer_listen"), "peer_listen is required: {e}");
    }

    #[test]
    fn clients_outside_loopback_must_authenticate_or_be_declared_insecure() {
        let public = GOOD.replace("listen: 127.0.0.1:7402", "listen: 0.0.0.0:7402");
        let e = NodeConfig::from_yaml(&public).unwrap_err().to_string();
        assert!(e.contains("`listen`") && e.contains("insecure_clients"), "{e}");
        assert!(NodeConfig::from_yaml(&format!("{public}insecure_clients: true\n")).is_ok());
        let tokens = format!("{public}auth: {{ tokens_file: /etc/fencegate/tokens.yaml }}\n");
        let e = NodeConfig::from_yaml(&tokens).unwrap_err().to_string();
        assert!(e.contains("auth.tokens_file") && e.contains("clear text"), "tokens without tls: {e}");
        let tls = "tls: { cert: n2.pem, key: n2.key, ca: ca.pem }\n";
        let tokens = format!(
            "{}{tls}auth: {{ tokens_file: /etc/fencegate/tokens.yaml }}\n",
            public.replace("http://", "https://")
        );
        let e = NodeConfig::from_yaml(&tokens).unwrap_err().to_string();
        assert!(e.contains("`acl`"), "authenticating without an acl: {e}");
        let acl = format!("{tokens}acl:\n  - {{ identity: ci, prefixes: [rack/], rights: [acquire] }}\n");
        let c = NodeConfig::from_yaml(&acl).unwrap();
        assert!(c.clients_authenticate());
        assert!(c.acl().allows("ci", crate::auth::Right::Acquire, "rack/1"));
        assert!(!c.acl().allows("ci", crate::auth::Right::Acquire, "fw/1"));
        assert!(NodeConfig::from_yaml(GOOD).unwrap().acl().allows("anyone", crate::auth::Right::Admin, "x"));
    }

    #[test]
    fn where_identities_mean_something_a_plaintext_peer_plane_needs_the_secret() {
        let acl = "acl:\n  - { identity: ci, prefixes: [rack/], rights: [acquire] }\n";
        let tokens = "auth: { tokens_file: /etc/fencegate/tokens.yaml }\n";
        let secret = "peer_secret_file: /etc/fencegate/peer-secret\n";
        let public =
            GOOD.replace("peer_listen: 127.0.0.1:7502", "peer_listen: 10.0.0.2:7502") + "insecure_peers: true\n";
        // Clients authenticate, or an acl tells anonymous apart from others:
        // on loopback or not, the peer plane must be for members.
        for base in [GOOD.to_string(), public.clone()] {
            for auth in [format!("{tokens}{acl}"), acl.to_string()] {
                let e = NodeConfig::from_yaml(&format!("{base}{auth}")).unwrap_err().to_string();
                assert!(
                    e.contains("`peer_secret_file`") && e.contains("every local user") && e.contains("0600"),
                    "{auth}: {e}"
                );
                let c = NodeConfig::from_yaml(&format!("{base}{auth}{secret}")).unwrap();
                assert_eq!(
                    c.peer_plane(),
                    "members prove the shared secret in /etc/fencegate/peer-secret; a forwarded identity is \
                     accepted only from them"
                );
            }
        }
        // Nobody authenticates: the plane may stay open, and says so.
        let open = NodeConfig::from_yaml(GOOD).unwrap();
        assert!(open.peer_plane().starts_with("open to every local user (no client authentication configured)"));
        let open = NodeConfig::from_yaml(&public).unwrap();
        assert!(open.peer_plane().starts_with("open to everyone who reaches 10.0.0.2:7502"), "{}", open.peer_plane());
        assert!(NodeConfig::from_yaml(&format!("{GOOD}{secret}")).unwrap().peer_secret_file.is_some());
        // With tls, members have certificates; a secret beside them is refused.
        let https = GOOD.replace("http://", "https://") + "tls: { cert: n2.pem, key: n2.key, ca: ca.pem }\n";
        let c = NodeConfig::from_yaml(&format!("{https}{tokens}{acl}")).unwrap();
        assert!(c.peer_plane().starts_with("TLS, each member by its certificate"), "{}", c.peer_plane());
        let e = NodeConfig::from_yaml(&format!("{https}{secret}")).unwrap_err().to_string();
        assert!(e.contains("`peer_secret_file`") && e.contains("contradicts tls"), "{e}");
    }

    #[test]
    fn tls_means_https_peers_and_no_insecure_flags() {
        let tls = "tls: { cert: n2.pem, key: n2.key, ca: ca.pem }\n";
        let e = NodeConfig::from_yaml(&format!("{GOOD}{tls}")).unwrap_err().to_string();
        assert!(e.contains("peers.1") && e.contains("https://"), "{e}");
        let https = format!("{}{tls}", GOOD.replace("http://", "https://"));
        let c = NodeConfig::from_yaml(&https).unwrap();
        assert!(!c.clients_authenticate(), "a client_ca or tokens make clients authenticate");
        let e = NodeConfig::from_yaml(&format!("{https}insecure_peers: true\n")).unwrap_err().to_string();
        assert!(e.contains("insecure_peers"), "{e}");
        let public_peers = https.replace("peer_listen: 127.0.0.1:7502", "peer_listen: 0.0.0.0:7502");
        assert!(NodeConfig::from_yaml(&public_peers).is_ok(), "with tls, peers are authenticated");
    }

    #[test]
    fn unknown_keys_are_errors_with_a_line() {
        let e = NodeConfig::from_yaml(&format!("{GOOD}colour: blue\n")).unwrap_err().to_string();
        assert!(e.contains("colour") && e.contains("line"), "{e}");
        let e = NodeConfig::from_yaml(&GOOD.replace("lock_delay", "lock_dealy")).unwrap_err().to_string();
        assert!(e.contains("lock_dealy"), "{e}");
    }

    #[test]
    fn bad_values_name_the_field() {
        for (from, to, field) in [
            ("id: 2", "id: 4", "id"),
            ("http://127.0.0.1:7503", "127.0.0.1:7503", "peers.3"),
            ("http://127.0.0.1:7503", "http://127.0.0.1:7503/x", "peers.3"),
            ("3: http://127.0.0.1:7403", "4: http://127.0.0.1:7403", "clients.4"),
            ("3: http://127.0.0.1:7403", "3: 127.0.0.1:7403", "clients.3"),
            ("peer_listen: 127.0.0.1:7502", "peer_listen: 127.0.0.1:7402", "peer_listen"),
            ("peer_listen: 127.0.0.1:7502", "peer_listen: 0.0.0.0:7502", "insecure_peers"),
            ("peer_listen: 127.0.0.1:7502", "peer_listen: 10.1.2.3:7502", "insecure_peers"),
            ("default_ttl: 10s", "default_ttl: 2h", "lease"),
            ("default_ttl: 10s", "default_ttl: 10 parsecs", "default_ttl"),
            ("lock_delay: 2s", "lock_delay: 2h", "lease.lock_delay"),
            ("lock_delay: 2s", "lock_delay: 2s, max_wait: 2h", "lease.max_wait"),
            ("lease:", "limits: { body_timeout: 0s }\nlease:", "limits.body_timeout"),
            ("lease:", "limits: { header_timeout: 1h }\nlease:", "limits.header_timeout"),
            ("lease:", "limits: { max_connections: 0 }\nlease:", "limits.max_connections"),
            ("lease:", "limits: { max_conections: 5 }\nlease:", "max_conections"),
            ("lease:", "limits: { max_keys: 0 }\nlease:", "limits.max_keys"),
            (
                "lease:",
                "limits: { max_keys: 10, max_leases_per_identity: 11 }\nlease:",
                "limits.max_leases_per_identity",
            ),
            ("lease:", "limits: { idle_key_retention: 10ms }\nlease:", "limits.idle_key_retention"),
            ("lease:", "acl: [{ identity: \"a*b\", prefixes: [x], rights: [read] }]\nlease:", "acl[0]"),
            ("lease:", "acl: [{ identity: a, prefixes: [], rights: [read] }]\nlease:", "acl[0]"),
            ("lease:", "acl: [{ identity: a, prefixes: [x], rights: [write] }]\nlease:", "write"),
        ] {
            let e = NodeConfig::from_yaml(&GOOD.replace(from, to)).unwrap_err().to_string();
            assert!(e.contains(field), "{from} -> {to}: {e}");
        }
    }
}
