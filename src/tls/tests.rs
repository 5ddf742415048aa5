//! Loading TLS files: what works, and that every failure names the field and the file.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

use super::*;

/// A CA and a server certificate for 127.0.0.1 it signed, written to `dir`.
struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    other_key: PathBuf,
}

fn write_files(dir: &Path) -> Files {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
    let files = Files {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        other_key: dir.join("other-key.pem"),
    };
    std::fs::write(&files.ca, ca.pem()).unwrap();
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    std::fs::write(&files.other_key, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    files
}

fn tls(f: &Files) -> TlsConfig {
    TlsConfig { cert: f.cert.clone(), key: f.key.clone(), client_ca: None }
}

#[test]
fn a_cert_and_its_key_make_a_server_config_offering_h2_and_http1() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_files(dir.path());
    let config = server_config(&tls(&f)).unwrap();
    assert_eq!(config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    let mtls = TlsConfig { client_ca: Some(f.ca.clone()), ..tls(&f) };
    assert!(server_config(&mtls).is_ok());
    let client = upstream_client_config(Some(&UpstreamTls { ca: f.ca.clone() })).unwrap();
    assert!(client.alpn_protocols.is_empty(), "the upstream connector sets its own ALPN");
    assert!(upstream_client_config(None).is_ok());
}

#[test]
fn every_failure_names_the_field_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_files(dir.path());
    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n").unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let cases: Vec<(TlsConfig, &str, &Path, &str)> = vec![
        (TlsConfig { cert: missing.clone(), ..tls(&f) }, "tls.cert", &missing, "cannot read"),
        (TlsConfig { cert: garbage.clone(), ..tls(&f) }, "tls.cert", &garbage, "not valid PEM"),
        (TlsConfig { cert: empty.clone(), ..tls(&f) }, "tls.cert", &empty, "no certificate"),
        // A key file given as the certificate holds no certificate.
        (TlsConfig { cert: f.key.clone(), ..tls(&f) }, "tls.cert", &f.key, "no certificate"),
        (TlsConfig { key: missing.clone(), ..tls(&f) }, "tls.key", &missing, "cannot read"),
        (TlsConfig { key: f.cert.clone(), ..tls(&f) }, "tls.key", &f.cert, "no private key"),
        (TlsConfig { key: f.other_key.clone(), ..tls(&f) }, "tls.key", &f.other_key, "not the key of the certificate"),
        (TlsConfig { client_ca: Some(missing.clone()), ..tls(&f) }, "tls.client_ca", &missing, "cannot read"),
        (TlsConfig { client_ca: Some(empty.clone()), ..tls(&f) }, "tls.client_ca", &empty, "no certificate"),
    ];
    for (config, field, path, says) in cases {
        let e = server_config(&config).unwrap_err();
        assert_eq!((e.field.as_str(), e.path.as_path()), (field, path), "{e}");
        let text = ConfigError::from(e).to_string();
        assert!(text.contains(&format!("`{field}`")) && text.contains(&*path.to_string_lossy()), "{text}");
        assert!(text.to_lowercase().contains(&says.to_lowercase()), "{field} {}: {text}", path.display());
    }
    let e = upstream_client_config(Some(&UpstreamTls { ca: missing.clone() })).unwrap_err();
    assert_eq!((e.field.as_str(), e.path.as_path()), ("upstream_tls.ca", missing.as_path()), "{e}");
}
