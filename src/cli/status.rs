//! `fencegate status [KEY]`: the cluster or one key, for a person to read,
//! or (`--json`) for a program: the Lock API's own answer, whose field
//! names are the API's.

use fencegate_client::Client;

pub(super) async fn run(key: Option<String>, json: bool, client: Client) -> anyhow::Result<i32> {
    match key {
        Some(key) => {
            crate::lock::validate::key(&key)?;
            let info = client.read(&key).await?;
            if json {
                println!("{}", serde_json::to_string(&info)?);
                return Ok(0);
            }
            println!("key:     {}", info.key);
            if info.held {
                println!("state:   held by {}", info.holder.as_deref().unwrap_or("?"));
                if let Some(ms) = info.expires_in_ms {
                    println!("expires: in {}", humantime::format_duration(std::time::Duration::from_millis(ms)));
                }
            } else {
                println!("state:   free");
            }
            println!("token:   {} (latest grant{})", info.token, if info.token == 0 { ", never granted" } else { "" });
        }
        None => {
            let c = client.cluster().await?;
            if json {
                println!("{}", serde_json::to_string(&c)?);
                return Ok(0);
            }
            let leader = c.leader.map_or("none (no quorum?)".to_string(), |l| format!("node {l}"));
            println!("leader:       {leader}");
            println!("term:         {}", c.term);
            println!("commit index: {}", c.commit_index);
            println!("members:");
            for m in &c.members {
                let role = if Some(m.id) == c.leader { "leader" } else { "follower" };
                println!("  {:>3}  {:<8}  {}", m.id, role, m.url.as_deref().unwrap_or("?"));
            }
            println!("(as seen by node {}, {})", c.id, c.state.to_lowercase());
        }
    }
    Ok(0)
}

/// A member list, one line each.
pub(super) fn members(list: &fencegate_client::wire::MemberList) {
    println!(
        "leader: node {}  last log index: {}{}",
        list.leader,
        list.last_log_index,
        if list.changing { "  (a change is under way)" } else { "" }
    );
    println!("  {:>3}  {:<7}  {:<9}  {:>9}  url", "id", "role", "state", "matched");
    for m in &list.members {
        let state = if m.id == list.leader {
            "leader"
        } else if m.reachable {
            "up"
        } else {
            "DOWN"
        };
        let matched = m.matched_index.map_or("-".to_string(), |i| i.to_string());
        println!("  {:>3}  {:<7}  {:<9}  {:>9}  {}", m.id, m.role, state, matched, m.peer_url);
    }
}
