//! The least a reverse proxy built on hyper and tokio does: hyper's HTTP/1
//! server in front, hyper's HTTP/1 client behind, each client connection
//! tied to one upstream connection of its own, on fencegate's event loops
//! (`http::Workers`, as the sidecar runs). Nothing else: no routing, no
//! header rewriting, no limits, no timeouts, no pool, no task per request;
//! flat writes, the cheaper of hyper's write strategies here (so does the
//! sidecar).
//! Not something to deploy; a measuring rod. What it costs per request is
//! the floor under any sidecar built on these parts, the sidecar included:
//! the part of the gap to nginx that no change to fencegate's own code can
//! close.
//!
//! A benchmark runs it as a process of its own (so that it can run under
//! callgrind like the other proxies): its own executable, re-run with
//! `--hyper-floor PORT UPSTREAM_PORT WORKERS`, which `run_if_asked` at the
//! top of `main` turns into the floor proxy.

use std::future::poll_fn;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use fencegate::testing::Workers;
use fencegate_testkit::Proc;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

const FLAG: &str = "--hyper-floor";

/// Start the floor proxy on `port` in front of the upstream on `up`, with
/// `workers` event loops; `program` is this executable or a wrapper of it
/// (`callgrind::wrap`).
pub fn start(dir: &Path, program: &Path, port: u16, up: u16, workers: usize) -> Proc {
    let mut cmd = Command::new(program);
    cmd.args([FLAG, &port.to_string(), &up.to_string(), &workers.to_string()]);
    Proc::spawn("hyper floor", cmd, &dir.join("hyper-floor.log"))
}

/// If this process was started as the floor proxy, be it, and never return.
pub fn run_if_asked() {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|a| a == FLAG) else { return };
    let number = |i: usize| -> u16 {
        args.get(at + i).and_then(|a| a.parse().ok()).unwrap_or_else(|| panic!("{FLAG} PORT UPSTREAM_PORT WORKERS"))
    };
    let (port, up, workers) = (number(1), number(2), number(3) as usize);
    let accepting = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    accepting.block_on(serve(port, up, workers));
    unreachable!("the accept loop ends only with the process");
}

async fn serve(port: u16, up: u16, workers: usize) {
    let workers = Workers::start("floor", workers).unwrap();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await.unwrap();
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, up));
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        // Off this runtime's reactor and onto the event loop's, as the sidecar does.
        let stream = stream.into_std().unwrap();
        drop(workers.spawn(async move {
            if let Err(e) = connection(TcpStream::from_std(stream).unwrap(), upstream).await {
                eprintln!("hyper floor: {e}");
            }
        }));
    }
}

/// Serve one client connection over an upstream connection of its own.
async fn connection(client: TcpStream, upstream: SocketAddr) -> Result<(), hyper::Error> {
    let behind = TcpStream::connect(upstream).await.expect("the upstream listens");
    let _ = behind.set_nodelay(true);
    // Flat writes (head and body copied into one buffer, one `write`): the
    // cheaper of hyper's two write strategies here, ~3 % fewer instructions.
    let (send, conn) = hyper::client::conn::http1::Builder::new().writev(false).handshake(TokioIo::new(behind)).await?;
    tokio::spawn(conn);
    // One request at a time on an HTTP/1 connection: the lock is never
    // contended, and is held only to start a request, never across a wait.
    let send: Arc<Mutex<SendRequest<Incoming>>> = Arc::new(Mutex::new(send));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let send = send.clone();
        async move {
            poll_fn(|cx| send.lock().unwrap().poll_ready(cx)).await?;
            let answer = send.lock().unwrap().send_request(req);
            let answer: Response<Incoming> = answer.await?;
            Ok::<_, hyper::Error>(answer)
        }
    });
    hyper::server::conn::http1::Builder::new().writev(false).serve_connection(TokioIo::new(client), service).await
}
