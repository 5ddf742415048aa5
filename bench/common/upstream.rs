//! The small upstream every proxy benchmark puts behind its proxies: reads
//! the request body and answers 200 with a short JSON body, in its own
//! single-threaded runtime on its own thread so its cost stays apart from the
//! load generator's.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// Start it; returns its port.
pub fn start() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}"))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    port
}
