//! A test PKI and an HTTPS client. Every CA, certificate and key is made with
//! rcgen when the test runs and written to its temporary directory: no key
//! material lives in the repository.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

/// A CA, a server certificate it signed for `127.0.0.1` and `localhost`, and
/// a client certificate it signed; PEM files under `dir`.
pub struct Pki {
    /// The CA certificate (what `client_ca` and `upstream_tls.ca` name).
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    ca_der: CertificateDer<'static>,
    client_chain: Vec<CertificateDer<'static>>,
    client_key: Vec<u8>,
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

impl Pki {
    pub fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names).unwrap().signed_by(&key, &ca).unwrap();
            (cert, key)
        };
        let (server, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
        let (client, client_key) = leaf(vec![format!("{name}-client.test")]);
        let path = |file: &str| dir.join(format!("{name}-{file}"));
        let pki = Pki {
            ca: path("ca.pem"),
            cert: path("cert.pem"),
            key: path("key.pem"),
            ca_der: ca.der().clone(),
            client_chain: vec![client.der().clone()],
            client_key: client_key.serialize_der(),
            issuer: ca,
            dir: dir.to_path_buf(),
            name: name.to_string(),
        };
        std::fs::write(&pki.ca, pki.issuer.pem()).unwrap();
        std::fs::write(&pki.cert, server.pem()).unwrap();
        std::fs::write(&pki.key, server_key.serialize_pem()).unwrap();
        pki
    }

    /// A certificate this CA signed for `sans`, with common name `cn` if
    /// given: (cert, key) PEM files named after `stem`.
    pub fn leaf(&self, stem: &str, sans: &[String], cn: Option<&str>) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(sans.to_vec()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = self.leaf_files(stem);
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// Where [`Pki::leaf`] writes the (cert, key) of `stem`.
    fn leaf_files(&self, stem: &str) -> (PathBuf, PathBuf) {
        let path = |file: &str| self.dir.join(format!("{}-{stem}-{file}", self.name));
        (path("cert.pem"), path("key.pem"))
    }

    /// A new certificate for member `id`: `fencegate-node-<id>`, and the
    /// loopback names clients reach it by; written over the last one.
    pub fn member(&self, id: u64) -> (PathBuf, PathBuf) {
        let sans = [format!("fencegate-node-{id}"), "localhost".into(), "127.0.0.1".into()];
        self.leaf(&format!("node{id}"), &sans, None)
    }

    /// Where member `id`'s certificate and key are ([`Pki::member`]).
    pub fn member_files(&self, id: u64) -> (PathBuf, PathBuf) {
        self.leaf_files(&format!("node{id}"))
    }

    /// The certificate a TLS server on 127.0.0.1:`port` presents in a new
    /// handshake, trusting this CA (DER).
    pub async fn served_certificate(&self, port: u16, server_name: &str) -> Result<Vec<u8>, String> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(chain)?;
        let name = ServerName::try_from(server_name.to_string()).map_err(chain)?;
        let connect = TlsConnector::from(Arc::new(self.client(None))).connect(name, tcp);
        let tls = tokio::time::timeout(Duration::from_secs(10), connect).await.map_err(chain)?.map_err(chain)?;
        let chain_served = tls.get_ref().1.peer_certificates().ok_or("no certificate")?;
        Ok(chain_served[0].to_vec())
    }

    /// A client certificate naming the identity `name` (its common name).
    pub fn client_cert(&self, name: &str) -> (PathBuf, PathBuf) {
        self.leaf(&format!("client-{name}"), &[format!("{name}.client.test")], Some(name))
    }

    /// The `tls:` section of a sidecar config serving this PKI's server certificate.
    pub fn tls_yaml(&self, client_ca: Option<&Path>) -> String {
        let mut yaml = format!("tls:\n  cert: {}\n  key: {}\n", self.cert.display(), self.key.display());
        if let Some(ca) = client_ca {
            yaml.push_str(&format!("  client_ca: {}\n", ca.display()));
        }
        yaml
    }

    /// A client trusting this CA only; with `identity`, it presents that
    /// PKI's client certificate when asked.
    pub fn client(&self, identity: Option<&Pki>) -> ClientConfig {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        match identity {
            None => builder.with_no_client_auth(),
            Some(id) => {
                let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(id.client_key.clone()));
                builder.with_client_auth_cert(id.client_chain.clone(), key).unwrap()
            }
        }
    }
}

/// An answer received over TLS.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: serde_json::Value,
    /// The protocol the server chose by ALPN.
    pub alpn: Option<String>,
}

/// One request on a fresh TLS connection to 127.0.0.1:`port`, naming
/// `server_name` in SNI. With `h2` the client offers only ALPN `h2` and speaks
/// HTTP/2, otherwise `http/1.1`. An error carries its whole source chain.
pub async fn https(
    config: &ClientConfig,
    port: u16,
    server_name: &str,
    h2: bool,
    method: &str,
    path: &str,
    token: Option<u64>,
) -> Result<Reply, String> {
    let work = async {
        let mut config = config.clone();
        config.alpn_protocols = vec![if h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(chain)?;
        let name = ServerName::try_from(server_name.to_string()).map_err(chain)?;
        let tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(chain)?;
        let alpn = tls.get_ref().1.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned());
        let authority = format!("{server_name}:{port}");
        // HTTP/2 carries the authority in the URI; HTTP/1.1 in `Host`.
        let mut b = if h2 {
            Request::builder().uri(format!("https://{authority}{path}"))
        } else {
            Request::builder().uri(path).header("host", &authority)
        };
        b = b.method(method);
        if let Some(t) = token {
            b = b.header("x-fence-token", t.to_string());
        }
        let req = b.body(Full::new(Bytes::from_static(b"{\"state\":\"drained\"}"))).map_err(chain)?;
        let io = TokioIo::new(tls);
        let resp = if h2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.map_err(chain)?;
            exchange(sender.send_request(req), conn).await?
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(chain)?;
            exchange(sender.send_request(req), conn).await?
        };
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(chain)?.to_bytes();
        let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        Ok(Reply { status, body, alpn })
    };
    tokio::time::timeout(Duration::from_secs(10), work).await.map_err(|_| "no answer within 10 s".to_string())?
}

/// Drive `conn` while `send` waits for the answer. When the connection dies
/// (a TLS alert, say), `send` only learns that it was canceled: the reason is
/// the connection's error, so that is reported too.
async fn exchange<S, C>(send: S, conn: C) -> Result<Response<Incoming>, String>
where
    S: Future<Output = hyper::Result<Response<Incoming>>>,
    C: Future<Output = hyper::Result<()>> + Send + 'static,
{
    let conn = tokio::spawn(conn);
    match send.await {
        Ok(resp) => Ok(resp),
        Err(e) => match conn.await {
            Ok(Err(c)) => Err(format!("{}: {}", chain(e), chain(c))),
            _ => Err(chain(e)),
        },
    }
}

/// An error and all its sources, for assertions on what went wrong.
fn chain(e: impl std::error::Error) -> String {
    fencegate_client::http::error_chain(&e)
}

/// `sha256:<hex>` of a bearer token, as a node's tokens file stores it.
pub fn token_hash(token: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
