//! A `fencegate sidecar` process in front of an upstream, fencing
//! `PUT /racks/{rack}` with lock key `rack/{rack}`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use super::cluster::Cluster;

/// Start a sidecar (strict mode, `consistency` = cached | linearizable);
/// returns its port and pid once it answers.
pub async fn start(cluster: &mut Cluster, name: &str, upstream_port: u16, consistency: &str) -> (u16, u32) {
    let [port] = super::free_ports();
    let dir = cluster.dir.path().to_path_buf();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nupstream: http://127.0.0.1:{upstream_port}\nlock_service:\n  endpoints: [{}]\n\
         state_dir: {}/{name}\nroutes:\n  - name: rack-writes\n    methods: [PUT]\n    path: /racks/{{rack}}\n    \
         lock_key: rack/{{rack}}\n    fence: {{ mode: strict, consistency: {consistency} }}\n  - name: rest\n    \
         path: /{{*rest}}\n    fence: off\n",
        cluster.endpoints().join(", "),
        dir.display()
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    let pid = cluster.also_run(name, &["sidecar", "--config", path.to_str().unwrap()]).pid();
    wait_for_port(port).await;
    (port, pid)
}

/// Until something accepts connections on `port` (20 s at most).
pub async fn wait_for_port(port: u16) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing listening on port {port}");
}

/// `PUT {uri}` with `token`, as an inventory client fencing a rack write would send it.
pub fn put(uri: impl AsRef<str>, token: u64) -> hyper::Request<Full<Bytes>> {
    hyper::Request::put(uri.as_ref())
        .header("host", "inventory")
        .header("x-fence-token", token.to_string())
        .body(Full::new(Bytes::from_static(b"{\"state\":\"drained\"}")))
        .unwrap()
}
