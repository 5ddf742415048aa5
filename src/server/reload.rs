//! A node's reload (SIGHUP): its TLS material (the certificate and key of
//! both planes and of its peer links, the members' CA, the clients' CA),
//! the members' peer secret (`peer_secret_file`, read again: a rotation)
//! and its ACL, from the config file validated as at startup. Everything
//! else takes a restart, turning TLS or the peer secret on or off too. The
//! tokens file is not part of it: it is re-read within a second whenever it
//! changes (`credentials.rs`). Either change ends the long-lived requests
//! (watch streams, parked acquires) it takes the right from.
//!
//! `restart_needed` is the pure list of every other field that changed.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::TlsAcceptor;

use super::Node;
use crate::config::node::NodeConfig;
use crate::config::{ConfigError, ConfigFile};
use crate::http::LiveListener;
use crate::tls::NodeTls;

impl Node {
    /// Load `path` as at startup (validated, TLS files loaded) and take its
    /// TLS material for new handshakes and its ACL for new checks; or refuse
    /// it whole, keeping what runs, when it is invalid or changes a field
    /// that takes a restart.
    pub(crate) fn reload(&self, path: &Path) -> Result<(), ConfigError> {
        let config = NodeConfig::load(path)?;
        let tls = NodeTls::load(&config)?;
        let peer_secrets = super::credentials::peer_secrets(&config)?;
        if let Some(refusal) = restart_needed(&self.config, &config) {
            return Err(refusal);
        }
        if let (Some(live), Some(secrets)) = (&self.peer_secrets, peer_secrets) {
            self.directory.set_proof(secrets.proof(self.id));
            live.store(Arc::new(secrets));
        }
        if let Some(tls) = tls {
            swap_acceptor(&self.client_plane, tls.client_plane);
            swap_acceptor(&self.peer_plane, tls.peer_plane);
            self.directory.set_tls(tls.peer_links);
        }
        self.acl.store(Arc::new(config.acl()));
        // Open watch streams and parked acquires check their right again.
        self.credentials.rules_changed();
        Ok(())
    }
}

/// New connections on `listener` get handshakes with `config`.
fn swap_acceptor(listener: &LiveListener, config: rustls::ServerConfig) {
    let opts = crate::http::Listener { tls: Some(TlsAcceptor::from(Arc::new(config))), ..(**listener.load()).clone() };
    listener.store(Arc::new(opts));
}

/// Why `new` cannot replace `old` in a running node, if it cannot: a field
/// other than the TLS files, the peer secret's file and the ACL changed, or
/// TLS (or client certificates, or the peer secret) was turned on or off.
pub(super) fn restart_needed(old: &NodeConfig, new: &NodeConfig) -> Option<ConfigError> {
    let client_ca = |c: &NodeConfig| c.tls.as_ref().map(|t| t.client_ca.is_some());
    let changed = [
        ("id", old.id == new.id),
        ("listen", old.listen == new.listen),
        ("peer_listen", old.peer_listen == new.peer_listen),
        ("insecure_peers", old.insecure_peers == new.insecure_peers),
        ("peer_secret_file", old.peer_secret_file.is_some() == new.peer_secret_file.is_some()),
        ("insecure_clients", old.insecure_clients == new.insecure_clients),
        ("tls", old.tls.is_some() == new.tls.is_some()),
        ("tls.client_ca", client_ca(old) == client_ca(new)),
        ("auth", old.auth == new.auth),
        ("data_dir", old.data_dir == new.data_dir),
        ("peers", old.peers == new.peers),
        ("clients", old.clients == new.clients),
        ("lease", old.lease == new.lease),
        ("raft", old.raft == new.raft),
        ("limits", old.limits == new.limits),
    ]
    .into_iter()
    .find(|(_, same)| !same)?;
    Some(ConfigError::invalid(
        changed.0,
        "changed: that takes a restart (a reload takes only `tls` files, `peer_secret_file` and `acl`)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
id: 1
listen: 127.0.0.1:7401
peer_listen: 127.0.0.1:7501
data_dir: ./data/node1
peers: { 1: https://127.0.0.1:7501, 2: https://127.0.0.1:7502, 3: https://127.0.0.1:7503 }
tls: { cert: node1.pem, key: node1.key, ca: ca.pem, client_ca: clients.pem }
auth: { tokens_file: tokens.yaml }
acl:
  - { identity: deploy, prefixes: [rack/], rights: [acquire] }
";

    fn refusal(from: &str, to: &str) -> Option<String> {
        assert!(BASE.contains(from), "{from}");
        let (old, new) = (NodeConfig::from_yaml(BASE).unwrap(), NodeConfig::from_yaml(&BASE.replacen(from, to, 1)));
        restart_needed(&old, &new.unwrap()).map(|e| e.to_string())
    }

    #[test]
    fn tls_files_and_the_acl_reload() {
        for (from, to) in [
            ("cert: node1.pem, key: node1.key", "cert: node1-2027.pem, key: node1-2027.key"),
            ("ca: ca.pem", "ca: ca-2027.pem"),
            ("client_ca: clients.pem", "client_ca: clients-2027.pem"),
            ("rights: [acquire]", "rights: [acquire, read]"),
            (
                "  - { identity: deploy",
                "  - { identity: ops, prefixes: [''], rights: [admin] }\n  - { identity: deploy",
            ),
        ] {
            assert_eq!(refusal(from, to), None, "{to}");
        }
    }

    #[test]
    fn each_field_that_takes_a_restart_is_named() {
        for (from, to, field) in [
            ("id: 1", "id: 2", "`id`"),
            ("listen: 127.0.0.1:7401", "listen: 127.0.0.1:7402", "`listen`"),
            ("peer_listen: 127.0.0.1:7501", "peer_listen: 127.0.0.1:7509", "`peer_listen`"),
            ("data_dir: ./data/node1", "data_dir: ./data/other", "`data_dir`"),
            ("https://127.0.0.1:7503 }", "https://127.0.0.1:7504 }", "`peers`"),
            ("peers:", "clients: { 1: https://127.0.0.1:7401 }\npeers:", "`clients`"),
            (", client_ca: clients.pem }", " }", "`tls.client_ca`"),
            ("tokens_file: tokens.yaml", "tokens_file: other.yaml", "`auth`"),
            ("acl:", "lease: { default_ttl: 10s }\nacl:", "`lease`"),
            ("acl:", "raft: { snapshot_every: 5000 }\nacl:", "`raft`"),
            ("acl:", "limits: { header_timeout: 5s }\nacl:", "`limits`"),
        ] {
            let e = refusal(from, to).unwrap_or_else(|| panic!("{to}: reloaded"));
            assert!(e.contains(field) && e.contains("restart"), "{to}: {e}");
        }
    }

    /// The secret's file is material, as TLS files are: another file is a
    /// rotation; turning the secret on or off takes a restart.
    #[test]
    fn the_peer_secret_file_reloads_and_turning_it_on_or_off_does_not() {
        let plain = "id: 1\nlisten: 127.0.0.1:7401\npeer_listen: 127.0.0.1:7501\ndata_dir: d\npeers: { 1: http://127.0.0.1:7501 }\n";
        let with = |file: &str| NodeConfig::from_yaml(&format!("{plain}peer_secret_file: {file}\n")).unwrap();
        let without = NodeConfig::from_yaml(plain).unwrap();
        assert!(restart_needed(&with("old"), &with("new")).is_none());
        for (old, new) in [(&with("old"), &without), (&without, &with("new"))] {
            let e = restart_needed(old, new).expect("a restart").to_string();
            assert!(e.contains("`peer_secret_file`") && e.contains("restart"), "{e}");
        }
    }
}
