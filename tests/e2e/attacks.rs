//! Attacks on a real lock service, made as an outsider would: hostile Raft
//! RPCs (each refused before Raft sees it, no node's core stops, and later
//! grants still get strictly rising tokens that every node agrees on, read
//! from each node's own applied state), and a node out of file descriptors
//! (the accept loop backs off instead of spinning, logs about once a
//! second, and serves again once descriptors are free).
//! One binary for all of them: each test binary costs a link.

use std::process::Command;
use std::time::Duration;

use fencegate::testing::{Entry, TypeConfig};
use fencegate_client::http::HttpClient;
use fencegate_client::AcquireOptions;
use fencegate_testkit::http::raw_answer;
use fencegate_testkit::{bin, free_ports, wait, Cluster, Proc, Watch};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload, LeaderId, LogId, Vote};

fn vote(term: u64, node_id: u64) -> Vote<u64> {
    Vote { leader_id: LeaderId { term, node_id }, committed: false }
}

fn log_id(term: u64, node: u64, index: u64) -> LogId<u64> {
    LogId { leader_id: CommittedLeaderId::new(term, node), index }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_raft_rpcs_are_refused_and_break_nothing() {
    let c = Cluster::start(&bin!(), 3, "").await;
    let client = c.client();
    let first = client.acquire("raft/a", AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let term = c.cluster_info(leader).await.unwrap().term;
    let last = c.cluster_info(leader).await.unwrap().last_log_index;

    let votes = [
        ("an overflowing term", VoteRequest { vote: vote(u64::MAX, leader), last_log_id: None }),
        ("a stranger", VoteRequest { vote: vote(term + 1, 99), last_log_id: None }),
        (
            "a last log above its term",
            VoteRequest { vote: vote(term + 1, leader), last_log_id: Some(log_id(term + 5, leader, 1)) },
        ),
    ];
    let blank = |index| Entry { log_id: log_id(term, leader, index), payload: EntryPayload::Blank };
    let appends: [(&str, AppendEntriesRequest<TypeConfig>); 3] = [
        (
            "entries with a gap",
            AppendEntriesRequest {
                vote: Vote::new_committed(term, leader),
                prev_log_id: Some(log_id(term, leader, last)),
                entries: vec![blank(last + 1000)],
                leader_commit: None,
            },
        ),
        (
            "a stranger as leader",
            AppendEntriesRequest {
                vote: Vote::new_committed(term, 99),
                prev_log_id: None,
                entries: vec![],
                leader_commit: None,
            },
        ),
        (
            "an overflowing term",
            AppendEntriesRequest {
                vote: Vote::new_committed(u64::MAX, leader),
                prev_log_id: None,
                entries: vec![],
                leader_commit: None,
            },
        ),
    ];
    let votes = votes.iter().map(|(what, rpc)| ("vote", *what, serde_json::to_string(rpc).unwrap()));
    let appends = appends.iter().map(|(what, rpc)| ("append", *what, serde_json::to_string(rpc).unwrap()));
    let hostile: Vec<(&str, &str, String)> = votes.chain(appends).collect();
    for id in c.ids() {
        // On the client port Raft does not exist; on the peer port the guard refuses.
        for (rpc, what, body) in &hostile {
            let a = raw_answer("POST", &format!("{}/raft/{rpc}", c.url(id)), Some(body)).await;
            assert_eq!(a.status, 404, "node {id}'s client port, a {rpc} with {what}");
            let a = raw_answer("POST", &format!("{}/raft/{rpc}", c.peer_url(id)), Some(body)).await;
            assert_eq!(a.status, 400, "node {id}, a {rpc} with {what}: {}", String::from_utf8_lossy(&a.body));
        }
    }

    // Nothing stopped and nothing moved: the same leader and term, every
    // node healthy, and grants go on above the first.
    for id in c.ids() {
        let health = raw_answer("GET", &format!("{}/healthz", c.url(id)), None).await;
        assert_eq!(health.status, 200, "node {id}");
        assert_eq!(c.cluster_info(id).await.unwrap().term, term, "node {id}'s term moved");
    }
    let mut tokens = vec![first.token()];
    for key in ["raft/b", "raft/c", "raft/d"] {
        tokens.push(client.acquire(key, AcquireOptions::new(Duration::from_secs(5))).await.unwrap().token());
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens rise: {tokens:?}");
    // Every node's own state names the same tokens (a watch is answered by
    // the node itself, from what it applied).
    let applied = c.cluster_info(leader).await.unwrap().commit_index;
    for id in c.ids() {
        c.wait_for_applied(id, applied, Duration::from_secs(10)).await;
        let mut w = Watch::open(&format!("{}/v1/watch?prefix=raft/", c.url(id))).await;
        let mut seen = vec![];
        for _ in 0..4 {
            let line = w.next().await;
            assert_eq!(line["event"], "state", "node {id}: {line}");
            seen.push(line["token"].as_u64().unwrap());
        }
        assert_eq!(seen, tokens, "node {id} agrees on every token");
    }
}

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
    let [port, peer_port] = free_ports::<2>();
    let config = dir.path().join("node.yaml");
    let yaml = format!(
        "id: 1\nlisten: 127.0.0.1:{port}\npeer_listen: 127.0.0.1:{peer_port}\ndata_dir: {}\npeers:\n  1: http://127.0.0.1:{peer_port}\n",
        dir.path().join("data").display()
    );
    std::fs::write(&config, yaml).unwrap();
    let health = format!("http://127.0.0.1:{port}/healthz");
    out_of_descriptors(dir.path(), &format!("server --config '{}'", config.display()), port, &health).await;
}

/// The sidecar shares the accept loop: the same, with its connections held
/// on its proxy port and its health read on its metrics port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_sidecar_backs_off_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let [port, metrics_port, upstream_port] = free_ports::<3>();
    let config = dir.path().join("sidecar.yaml");
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nmetrics_listen: 127.0.0.1:{metrics_port}\nupstream: http://127.0.0.1:{upstream_port}\nstate_dir: {}\nroutes:\n  - {{ name: all, path: '/{{*rest}}', fence: off }}\n",
        dir.path().join("state").display()
    );
    std::fs::write(&config, yaml).unwrap();
    let health = format!("http://127.0.0.1:{metrics_port}/healthz");
    out_of_descriptors(dir.path(), &format!("sidecar --config '{}'", config.display()), port, &health).await;
}

/// How many descriptors process `pid` has open.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Run `fencegate <args>` with 64 descriptors, open far more connections to
/// `port` than it can accept: it must neither spin nor flood its log, and
/// must serve `health` again once they are gone.
async fn out_of_descriptors(dir: &std::path::Path, args: &str, port: u16, health: &str) {
    let bin = bin!();
    let script = format!("ulimit -n 64 && exec '{}' {args}", bin.path().display());
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]).env("FENCEGATE_LOG", "info,openraft=error");
    let log = dir.join("process.log");
    let process = Proc::spawn("fencegate", cmd, &log);
    wait::until_ok("serving", Duration::from_secs(20), || async {
        match HttpClient::new(1024).call(hyper::Method::GET, health, None, Duration::from_secs(1)).await {
            Ok(a) if a.status == 200 => Ok(()),
            other => Err(other.map(|a| a.status).map_err(|e| e.to_string())),
        }
    })
    .await;

    // Far more connections than descriptors: the kernel completes them, the
    // process cannot accept them all.
    let mut held = vec![];
    for _ in 0..150 {
        held.push(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    wait::until_ok("accept failing for lack of descriptors", Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("Too many open files") {
            Ok(())
        } else {
            // What it did instead, should it never run out.
            let tail: Vec<&str> = text.lines().rev().take(8).collect();
            Err(format!("not yet; {} descriptors open; the log ends {tail:#?}", open_descriptors(process.pid())))
        }
    })
    .await;
    let count = || std::fs::read_to_string(&log).unwrap().matches("accept:").count();
    let (cpu0, lines0) = (cpu_seconds(process.pid()), count());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (cpu1, lines1) = (cpu_seconds(process.pid()), count());
    eprintln!("{args}: out of descriptors, {:.2} CPU s and {} accept warnings in 3 s", cpu1 - cpu0, lines1 - lines0);
    assert!(cpu1 - cpu0 < 0.6, "{:.2} CPU seconds in 3 s: the accept loop spins", cpu1 - cpu0);
    assert!(lines1 - lines0 <= 6, "{} accept warnings in 3 s: not rate-limited", lines1 - lines0);

    drop(held);
    wait::until_ok("serving again", Duration::from_secs(20), || async {
        let a = raw_answer("GET", health, None).await;
        if a.status == 200 {
            Ok(())
        } else {
            Err(a.status)
        }
    })
    .await;
    drop(process);
}
