//! A recording upstream: the "legacy inventory API" of the tests. It checks
//! no tokens at all; it applies every write it receives and records it
//! (method, path, token) in the order the writes *take effect*: after the
//! body is read and after the `x-test-delay-ms` processing time it was asked
//! to take.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub token: Option<u64>,
    pub body: String,
    pub headers: hyper::HeaderMap,
}

pub struct Upstream {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let s = s.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(record(s, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { port, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Tokens of the writes applied to `path`, in the order they took effect.
    pub fn tokens(&self, path: &str) -> Vec<Option<u64>> {
        self.seen().into_iter().filter(|s| s.path == path && s.method != "GET").map(|s| s.token).collect()
    }
}

async fn record(seen: Arc<Mutex<Vec<Seen>>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let token = parts.headers.get("x-fence-token").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let delay = parts.headers.get("x-test-delay-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    // Like a real service, once a request is in, it is processed to the end
    // even if the connection it came on goes away.
    let applied = tokio::spawn(async move {
        if let Some(ms) = delay {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let mut s = seen.lock().unwrap();
        s.push(Seen {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            token,
            body: String::from_utf8_lossy(&body).into_owned(),
            headers: parts.headers.clone(),
        });
        s.len() - 1
    });
    let index = applied.await.unwrap();
    Response::new(Full::new(Bytes::from(format!("{{\"applied\":{index}}}"))))
}
