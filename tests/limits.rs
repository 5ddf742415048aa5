//! Resource exhaustion on a real `fencegate server` process: out of file
//! descriptors, the accept loop backs off instead of spinning a core, logs
//! at most about once a second, and serves again once descriptors are free.

use std::process::Command;
use std::time::Duration;

use fencegate_client::http::HttpClient;
use fencegate_testkit::http::raw_answer;
use fencegate_testkit::{bin, free_port, wait, Proc};

/// CPU seconds (user + system) the process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses): utime and
    // stime are the 12th and 13th of them, in clock ticks (100 a second).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_accept_loop_backs_off_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let config = dir.path().join("node.yaml");
    let yaml = format!(
        "id: 1\nlisten: 127.0.0.1:{port}\ndata_dir: {}\npeers:\n  1: {url}\n",
        dir.path().join("data").display()
    );
    std::fs::write(&config, yaml).unwrap();
    let bin = bin!();
    let script = format!("ulimit -n 64 && exec '{}' server --config '{}'", bin.path().display(), config.display());
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]).env("FENCEGATE_LOG", "info,openraft=error");
    let log = dir.path().join("node.log");
    let node = Proc::spawn("node", cmd, &log);
    wait::until_ok("the node serving", Duration::from_secs(20), || async {
        match HttpClient::new(1024)
            .call(hyper::Method::GET, &format!("{url}/healthz"), None, Duration::from_secs(1))
            .await
        {
            Ok(a) if a.status == 200 => Ok(()),
            other => Err(other.map(|a| a.status).map_err(|e| e.to_string())),
        }
    })
    .await;

    // Far more connections than descriptors: the kernel completes them, the
    // node cannot accept them all.
    let mut held = vec![];
    for _ in 0..150 {
        held.push(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    wait::until_ok("accept failing for lack of descriptors", Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("Too many open files") {
            Ok(())
        } else {
            Err("not yet")
        }
    })
    .await;
    let (cpu0, lines0) = (cpu_seconds(node.pid()), std::fs::read_to_string(&log).unwrap().matches("accept:").count());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (cpu1, lines1) = (cpu_seconds(node.pid()), std::fs::read_to_string(&log).unwrap().matches("accept:").count());
    assert!(cpu1 - cpu0 < 0.6, "{:.2} CPU seconds in 3 s: the accept loop spins", cpu1 - cpu0);
    assert!(lines1 - lines0 <= 6, "{} accept warnings in 3 s: not rate-limited", lines1 - lines0);

    drop(held);
    wait::until_ok("the node serving again", Duration::from_secs(20), || async {
        let a = raw_answer("GET", &format!("{url}/healthz"), None).await;
        if a.status == 200 {
            Ok(())
        } else {
            Err(a.status)
        }
    })
    .await;
    drop(node);
}
