//! `fencegate status [KEY]`: the cluster or one key, for a person to read.

use fencegate_client::Client;

pub async fn run(key: Option<String>, client: Client) -> anyhow::Result<i32> {
    match key {
        Some(key) => {
            crate::lock::validate::key(&key)?;
            let info = client.read(&key).await?;
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
