//! Who is at the other end of a TLS connection, from the certificate it
//! presented (already verified against the CA by rustls in the handshake):
//! the member a peer certificate speaks for, and the name a client
//! certificate gives its holder.
//!
//! `certifies_member(cert, id)`: webpki's name check against
//! `fencegate-node-<id>`. `client_name(cert)`: the common name, else the
//! first DNS name (x509-parser).

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::ParsedCertificate;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The DNS name a member's certificate must carry: `fencegate-node-<id>`.
/// Peers check it both ways: a node connecting to member 3 requires the
/// server to be certified as it, and a Raft RPC claiming to come from
/// member 3 is accepted only over a connection certified as it.
pub(crate) fn member_name(id: u64) -> ServerName<'static> {
    ServerName::try_from(format!("fencegate-node-{id}")).expect("a valid DNS name")
}

/// Whether `cert` is certified as member `id` (webpki's name check, as for a server).
pub(crate) fn certifies_member(cert: &CertificateDer<'_>, id: u64) -> bool {
    ParsedCertificate::try_from(cert)
        .and_then(|parsed| rustls::client::verify_server_name(&parsed, &member_name(id)))
        .is_ok()
}

/// The client identity a certificate names: its subject's common name, or
/// else its first DNS subject alternative name. `None` if it has neither
/// (or they are not printable ASCII): such a certificate identifies nobody.
pub(crate) fn client_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, x509) = X509Certificate::from_der(cert.as_ref()).ok()?;
    let cn = x509.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_string);
    let dns = || {
        let san = x509.subject_alternative_name().ok()??;
        san.value.general_names.iter().find_map(|n| match n {
            GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        })
    };
    cn.or_else(dns).filter(|n| crate::auth::identity_ok(n))
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair};

    use super::*;

    fn ca() -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    fn leaf(ca: &CertifiedIssuer<'static, KeyPair>, sans: &[&str], cn: Option<&str>) -> CertificateDer<'static> {
        let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        // Not rcgen's default common name.
        params.distinguished_name = DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.signed_by(&KeyPair::generate().unwrap(), ca).unwrap().der().clone()
    }

    #[test]
    fn a_member_certificate_speaks_for_its_own_id_only() {
        let ca = ca();
        let node2 = leaf(&ca, &["fencegate-node-2", "localhost"], None);
        assert!(certifies_member(&node2, 2));
        assert!(!certifies_member(&node2, 3), "node 2's certificate cannot speak as node 3");
        assert!(!certifies_member(&node2, 22));
        let wildcard = leaf(&ca, &["*.example"], None);
        assert!(!certifies_member(&wildcard, 2));
    }

    #[test]
    fn a_client_is_named_by_its_common_name_else_its_first_dns_name() {
        let ca = ca();
        assert_eq!(client_name(&leaf(&ca, &["deploy.example"], Some("deploy-bot"))).as_deref(), Some("deploy-bot"));
        assert_eq!(client_name(&leaf(&ca, &["deploy.example", "b.example"], None)).as_deref(), Some("deploy.example"));
        assert_eq!(client_name(&leaf(&ca, &["127.0.0.1"], None)), None, "an IP address names nobody");
        assert_eq!(client_name(&leaf(&ca, &[], Some("a b\u{7f}"))), None, "not a valid identity");
    }
}
