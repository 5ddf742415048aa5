//! The two Raft clusters as the benchmark drives them: who leads, whether
//! all members agree, their counters and CPU, and a leader's SIGKILL.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use fencegate_client::http::HttpClient;
use fencegate_testkit::Cluster;
use hyper::Method;
use serde_json::json;
use tokio::time::Instant;

use crate::common::etcd::Etcd;
use crate::common::locks::{call, Backend};

/// Failover grants are never released; they expire while the killed member
/// restarts, before the next repetition.
const FAILOVER_TTL: Duration = Duration::from_secs(2);
/// While failing over, give up on a dead member quickly and try the next.
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(300);
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// How one member sees the cluster.
pub struct Status {
    me: String,
    leader: Option<String>,
    applied: u64,
}

/// A running 3-member cluster, members numbered 1..=3.
pub trait Servers {
    const NAME: &'static str;
    /// The counter of log fsyncs on /metrics.
    const FSYNCS: &'static str;
    fn urls(&self) -> &BTreeMap<u64, String>;
    fn member_pid(&self, id: u64) -> u32;
    fn kill(&mut self, id: u64);
    fn restart(&mut self, id: u64);
    async fn status(&self, http: &HttpClient, url: &str) -> Result<Status>;
}

impl Servers for Cluster {
    const NAME: &'static str = "fencegate";
    const FSYNCS: &'static str = "fencegate_raft_log_syncs_total";

    fn urls(&self) -> &BTreeMap<u64, String> {
        self.url_map()
    }
    fn member_pid(&self, id: u64) -> u32 {
        self.pid(id)
    }
    fn kill(&mut self, id: u64) {
        Cluster::kill(self, id)
    }
    fn restart(&mut self, id: u64) {
        self.start_node(id)
    }

    async fn status(&self, http: &HttpClient, url: &str) -> Result<Status> {
        let v = call(http, Method::GET, &format!("{url}/v1/cluster"), None, STATUS_TIMEOUT).await?;
        Ok(Status {
            me: v["id"].to_string(),
            leader: v["leader"].as_u64().map(|l| l.to_string()),
            applied: v["commit_index"].as_u64().context("no commit_index")?,
        })
    }
}

impl Servers for Etcd {
    const NAME: &'static str = "etcd";
    const FSYNCS: &'static str = "etcd_disk_wal_fsync_duration_seconds_count";

    fn urls(&self) -> &BTreeMap<u64, String> {
        &self.urls
    }
    fn member_pid(&self, id: u64) -> u32 {
        Etcd::member_pid(self, id)
    }
    fn kill(&mut self, id: u64) {
        self.kill_member(id)
    }
    fn restart(&mut self, id: u64) {
        self.start_member(id)
    }

    async fn status(&self, http: &HttpClient, url: &str) -> Result<Status> {
        let v =
            call(http, Method::POST, &format!("{url}/v3/maintenance/status"), Some(json!({})), STATUS_TIMEOUT).await?;
        Ok(Status {
            me: v["header"]["member_id"].as_str().context("no member_id")?.into(),
            leader: v["leader"].as_str().filter(|l| *l != "0").map(String::from),
            applied: v["raftAppliedIndex"].as_str().context("no raftAppliedIndex")?.parse()?,
        })
    }
}

/// Wait until every member answers, follows the same leader and has applied
/// the same index (so a restarted member has caught up); the leader's number.
pub async fn healthy<S: Servers>(s: &S, http: &HttpClient) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut seen = vec![];
        for (id, url) in s.urls() {
            if let Ok(status) = s.status(http, url).await {
                seen.push((*id, status));
            }
        }
        if let Some(leader) = agreed(&seen, s.urls().len()) {
            return leader;
        }
        assert!(Instant::now() < deadline, "{} did not become healthy", S::NAME);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader's number if all `n` members answered, follow the same leader
/// and have applied the same index.
fn agreed(seen: &[(u64, Status)], n: usize) -> Option<u64> {
    let first = &seen.first()?.1;
    let leader = first.leader.as_ref()?;
    let same = seen.iter().all(|(_, st)| st.leader == first.leader && st.applied == first.applied);
    if seen.len() < n || !same {
        return None;
    }
    seen.iter().find(|(_, st)| st.me == *leader).map(|(id, _)| *id)
}

/// A counter (or a histogram's count) on `url`/metrics.
pub async fn metric(http: &HttpClient, url: &str, name: &str) -> f64 {
    let a = http.call(Method::GET, &format!("{url}/metrics"), None, STATUS_TIMEOUT).await.unwrap();
    let text = String::from_utf8_lossy(&a.body);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} on {url}/metrics"))
}

/// SIGKILL the leader while a client acquires fresh keys in a loop, trying
/// the next member after any failure; milliseconds from the kill to the next
/// grant. The killed member is restarted.
pub async fn failover<B: Backend, S: Servers>(api: &B, s: &mut S, leader: u64, tag: &str) -> f64 {
    let urls: Vec<String> = s.urls().values().cloned().collect();
    let leader_at = s.urls().keys().position(|&id| id == leader).unwrap();
    let (tx, mut grants) = tokio::sync::mpsc::unbounded_channel();
    let (api, tag) = (api.clone(), tag.to_string());
    let client = tokio::spawn(async move {
        let mut at = leader_at;
        for n in 0u64.. {
            match api.acquire(&urls[at], &format!("bench/{tag}/{n}"), FAILOVER_TTL, FAILOVER_TIMEOUT).await {
                Ok(_) => {
                    let _ = tx.send((Instant::now(), at));
                }
                Err(_) => {
                    at = (at + 1) % urls.len();
                    // Refusals come back at once; don't spin on the two cores the election needs.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    grants.recv().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.kill(leader);
    let killed = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            // An answer from the dead leader may still be read after the kill.
            match grants.recv().await.unwrap() {
                (t, at) if t > killed && at != leader_at => return t,
                _ => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{}: no grant within 30 s of killing the leader", S::NAME));
    client.abort();
    s.restart(leader);
    (next - killed).as_secs_f64() * 1e3
}
