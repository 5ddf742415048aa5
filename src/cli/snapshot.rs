//! `fencegate snapshot save | inspect | restore`: back up the lock table
//! from the leader, check a backup, build a new cluster's first node from
//! one (docs/DESIGN.md "Backup and restore").
//!
//! A backup is written through a synced temporary file and a rename.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use fencegate_client::Client;

use crate::backup::{self, FloorSource, Header, MAX_BACKUP};
use crate::config::node::NodeConfig;
use crate::config::ConfigFile;
use crate::lock::state::LockState;
use crate::raft::identity;

pub(super) async fn save(file: &Path, client: Client) -> anyhow::Result<i32> {
    let bytes = client.snapshot(MAX_BACKUP).await?;
    // Checked before anything is written: a backup nobody can restore is
    // worse than none, because it is trusted.
    let (header, _) = backup::decode(&bytes).map_err(|e| anyhow::anyhow!("the leader's answer is no backup: {e}"))?;
    write_durably(file, &bytes)?;
    println!("saved {}", file.display());
    describe(&header);
    Ok(0)
}

pub(super) fn inspect(file: &Path) -> anyhow::Result<i32> {
    let (header, _) = read(file)?;
    println!("{}: a valid backup (checksum matches)", file.display());
    describe(&header);
    Ok(0)
}

pub(super) fn restore(file: &Path, config: &Path, min_token: u64) -> anyhow::Result<i32> {
    let (header, locks) = read(file)?;
    let config = NodeConfig::load(config)?;
    let clock_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let floor = backup::restore_floor(header.revision, min_token, clock_us).map_err(|e| anyhow::anyhow!(e))?;
    let restored = locks.restored(floor.floor, identity::new_id());
    let path = crate::server::restore(&config, &restored)?;
    println!("restored {} into {} (node {})", file.display(), path.display(), config.id);
    describe(&header);
    let why = match floor.by {
        FloorSource::Clock => "this host's clock in microseconds since 1970: above every token a cluster \
                               restored by this build, or never restored, can have granted"
            .to_string(),
        FloorSource::MinToken => format!(
            "--min-token, above this host's clock: a later restore's clock floor may sit below this cluster's \
             tokens until the clock passes {}",
            floor.floor
        ),
    };
    println!(
        "the restored cluster starts at revision {}; every token it grants is above {} ({why})",
        restored.revision(),
        floor.floor
    );
    println!(
        "it is cluster {}, a new history: no lease of the backup ({} live then) is live, and every token up to {} \
         reads as ended",
        restored.cluster().unwrap_or_default(),
        header.leases,
        restored.revision()
    );
    let others: Vec<String> = config.peers.keys().filter(|id| **id != config.id).map(|id| id.to_string()).collect();
    println!(
        "next: start this node, then nodes {} with empty data directories",
        if others.is_empty() { "(none)".into() } else { others.join(", ") }
    );
    Ok(0)
}

fn describe(h: &Header) {
    println!("  revision {}, {} keys, {} leases", h.revision, h.keys, h.leases);
    println!("  taken {} from node {} (term {}, applied index {})", h.taken_at, h.node, h.term, h.applied_index);
    println!("  {} bytes of table, {}", h.bytes, h.sha256);
}

fn read(file: &Path) -> anyhow::Result<(Header, LockState)> {
    let size = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.len();
    if size > MAX_BACKUP as u64 {
        anyhow::bail!("{} is {size} bytes, larger than any backup ({MAX_BACKUP})", file.display());
    }
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    backup::decode(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))
}

/// Write `bytes` to `file` so that a crash leaves the old file or the new
/// one, never half of it: a temporary file beside it, synced, renamed over.
fn write_durably(file: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = file.file_name().with_context(|| format!("{} is not a file name", file.display()))?;
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let partial = dir.join(format!(".{}.partial", name.to_string_lossy()));
    let mut f = std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, file).with_context(|| format!("renaming {} to {}", partial.display(), file.display()))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}
