//! Sidecar overhead: the same closed-loop load straight to a small upstream
//! and through `fencegate sidecar` (fencing on: strict, cached), in one run.
//!
//! Reports requests/s and p50/p99 latency for both and their ratios.
//! Run: `cargo bench --bench sidecar` (env: BENCH_SECONDS per phase, default
//! 10; BENCH_CONNECTIONS, default 32). Writes bench/results/sidecar.md.

mod common;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use fencegate::client::{AcquireOptions, Client};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// A minimal upstream: reads the body, answers 200 with a small JSON body.
async fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}"))))
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    port
}

/// `connections` keep-alive connections, each sending PUTs back to back.
async fn load(port: u16, token: u64, connections: usize, seconds: u64) -> (f64, Vec<Duration>) {
    let until = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let mut tasks = vec![];
    for _ in 0..connections {
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
            tokio::spawn(conn);
            let mut lat = vec![];
            while Instant::now() < until {
                let req = hyper::Request::put("/racks/1")
                    .header("host", "inventory")
                    .header("x-fence-token", token.to_string())
                    .body(Full::new(Bytes::from_static(b"{\"state\":\"drained\"}")))
                    .unwrap();
                let t = Instant::now();
                let resp = send.send_request(req).await.unwrap();
                assert_eq!(resp.status(), 200);
                let _ = resp.into_body().collect().await.unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = vec![];
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    all.sort();
    (rate, all)
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let seconds: u64 = std::env::var("BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let connections: usize = std::env::var("BENCH_CONNECTIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(32);
    let up_port = upstream().await;
    let mut cluster = common::cluster::start_cluster().await;
    let [sc_port] = common::free_ports();
    let dir = cluster.dir.path().to_path_buf();
    let sc_yaml = format!(
        "listen: 127.0.0.1:{sc_port}\nupstream: http://127.0.0.1:{up_port}\nlock_service:\n  endpoints: [{}]\nstate_dir: {}/sidecar\nroutes:\n  - name: rack-writes\n    methods: [PUT]\n    path: /racks/{{rack}}\n    lock_key: rack/{{rack}}\n    fence: {{ mode: strict, consistency: cached }}\n  - name: rest\n    path: /{{*rest}}\n    fence: off\n",
        cluster.endpoints().join(", "),
        dir.display()
    );
    let sc_path = dir.join("sidecar.yaml");
    std::fs::write(&sc_path, sc_yaml).unwrap();
    cluster.also_run("sidecar", &["sidecar", "--config", sc_path.to_str().unwrap()]);

    let client = Client::new(cluster.endpoints()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let lease = loop {
        match client.acquire("rack/1", AcquireOptions::new(Duration::from_secs(60))).await {
            Ok(l) => break l,
            Err(e) => {
                assert!(Instant::now() < deadline, "cluster did not come up: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let token = lease.token();
    // Warm up both paths (and let the sidecar learn the grant).
    let _ = load(up_port, token, 4, 1).await;
    let _ = load(sc_port, token, 4, 1).await;

    let (direct_rate, direct) = load(up_port, token, connections, seconds).await;
    let (sidecar_rate, through) = load(sc_port, token, connections, seconds).await;

    let table = format!(
        "| path | requests/s | p50 µs | p99 µs |\n|---|---|---|---|\n\
         | straight to the upstream | {direct_rate:.0} | {:.0} | {:.0} |\n\
         | through the sidecar (strict, cached) | {sidecar_rate:.0} | {:.0} | {:.0} |\n\
         | ratio sidecar ÷ straight | {:.2} | {:.2} | {:.2} |\n\
         | added p50 | | {:.0} µs | |\n",
        pct(&direct, 0.5),
        pct(&direct, 0.99),
        pct(&through, 0.5),
        pct(&through, 0.99),
        sidecar_rate / direct_rate,
        pct(&through, 0.5) / pct(&direct, 0.5),
        pct(&through, 0.99) / pct(&direct, 0.99),
        pct(&through, 0.5) - pct(&direct, 0.5),
    );
    println!("\nsidecar overhead, {connections} keep-alive connections, closed loop, {seconds} s per path\n\n{table}");
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/results");
    std::fs::create_dir_all(out).unwrap();
    std::fs::write(format!("{out}/sidecar.md"), table).unwrap();
    lease.release().await.unwrap();
}
