//! The backup file of `fencegate snapshot save` and `restore`: one line of
//! JSON, the [`Header`], then the lock table as JSON, whose length and
//! SHA-256 the header carries. Pure: the leader encodes, the CLI checks what
//! it received before writing it and again before restoring; a file that
//! was cut short, altered, or written by a newer fencegate is refused.
//!
//! The body is checksummed, not the header: the header only describes it,
//! and a restore takes the revision from the body.
//!
//! `restore_floor` says where a restore's tokens start: the restoring
//! host's clock in microseconds, or `--min-token` above it (below 2^53), never
//! an operator's guess, so that a restore never grants a token again. What
//! a restore does to the table is the pure `LockState::restored(floor,
//! cluster)`: a new cluster id, no key survives, the revision and
//! `compacted_below` go to `floor + 1`.

use serde::{Deserialize, Serialize};

use crate::lock::state::LockState;

/// What the first line's `format` says: this is a fencegate backup.
const MAGIC: &str = "fencegate-snapshot";

/// The backup format this build writes, and the newest it reads.
pub(crate) const BACKUP_FORMAT: u32 = 1;

/// Largest backup file read: the table is bounded by the nodes' key and
/// request-id limits, far below this.
pub(crate) const MAX_BACKUP: usize = 256 << 20;

/// The first line of a backup file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    /// Always `fencegate-snapshot`.
    pub format: String,
    pub version: u32,
    /// The table's revision: every token in it is at most this.
    pub revision: u64,
    pub keys: u64,
    /// Leases live when the backup was taken (a restore ends them all).
    pub leases: u64,
    /// When, by the leader's wall clock (RFC 3339).
    pub taken_at: String,
    /// The leader that wrote it, its term and applied index.
    pub node: u64,
    pub term: u64,
    pub applied_index: u64,
    /// The body's length and `sha256:<hex>`.
    pub bytes: u64,
    pub sha256: String,
}

/// The highest token a cluster may grant, with room to spare below 2^53:
/// every JSON parser (JavaScript's, `jq`'s) reads a token exactly.
pub(crate) const MAX_TOKEN: u64 = (1 << 53) - (1 << 32);

/// The floor a restored cluster's tokens start above, and what set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RestoreFloor {
    pub floor: u64,
    pub by: FloorSource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloorSource {
    /// The restoring host's clock, in microseconds since 1970.
    Clock,
    /// The operator's `--min-token`, above the clock.
    MinToken,
}

/// The floor of a restore of a backup at `revision`, on a host whose clock
/// reads `clock_us` microseconds since 1970, with the operator's
/// `min_token` (0: none). Pure.
///
/// Why the clock: a cluster's revision rises by one per event, far slower
/// than a microsecond each, and a restore starts it at the clock's reading
/// (this function). So every cluster restored by this build stays below the
/// clock for as long as it runs, and a later restore — of any backup, the
/// newest or the wrong one, once or twice — starts above every token the
/// lost cluster granted, though nobody knows what that was. (A cluster
/// never restored has far smaller tokens still.) What it needs: the
/// restoring host's clock not behind the time of the lost cluster's last
/// grant by more than that cluster's slack (DESIGN, "Residual windows").
pub(crate) fn restore_floor(revision: u64, min_token: u64, clock_us: u64) -> Result<RestoreFloor, String> {
    if revision >= clock_us {
        return Err(format!(
            "the backup's revision {revision} is at or above this host's clock ({clock_us} µs since 1970): the \
             clock is behind (set it right and restore again); a cluster's tokens never run ahead of the clock"
        ));
    }
    let (floor, by) = match min_token > clock_us {
        true => (min_token, FloorSource::MinToken),
        false => (clock_us, FloorSource::Clock),
    };
    if floor >= MAX_TOKEN {
        return Err(format!(
            "a floor of {floor} leaves no room below {MAX_TOKEN} (2^53 - 2^32), above which JSON parsers misread tokens"
        ));
    }
    Ok(RestoreFloor { floor, by })
}

/// Where a backup came from (the header's fields the table does not give).
pub(crate) struct Origin {
    pub taken_at: String,
    pub node: u64,
    pub term: u64,
    pub applied_index: u64,
}

/// The file for `locks`.
pub(crate) fn encode(locks: &LockState, origin: Origin) -> Vec<u8> {
    let body = serde_json::to_vec(locks).expect("the lock table serialises");
    let header = Header {
        format: MAGIC.into(),
        version: BACKUP_FORMAT,
        revision: locks.revision(),
        keys: locks.key_count() as u64,
        leases: locks.lease_count() as u64,
        taken_at: origin.taken_at,
        node: origin.node,
        term: origin.term,
        applied_index: origin.applied_index,
        bytes: body.len() as u64,
        sha256: crate::auth::sha256_text(&body),
    };
    let mut file = serde_json::to_vec(&header).expect("the header serialises");
    file.push(b'\n');
    file.extend_from_slice(&body);
    file
}

/// The header and table of a backup file, or why it is not one this build
/// can restore.
pub(crate) fn decode(file: &[u8]) -> Result<(Header, LockState), String> {
    let newline = file.iter().position(|b| *b == b'\n').ok_or("not a fencegate backup (no header line)")?;
    let (head, body) = (&file[..newline], &file[newline + 1..]);
    let header: Header = serde_json::from_slice(head).map_err(|e| format!("not a fencegate backup (header: {e})"))?;
    if header.format != MAGIC {
        return Err(format!("not a fencegate backup (format {:?})", header.format));
    }
    if header.version > BACKUP_FORMAT {
        return Err(format!(
            "written by a newer fencegate (backup format {}; this build reads up to {BACKUP_FORMAT})",
            header.version
        ));
    }
    if body.len() as u64 != header.bytes {
        return Err(format!(
            "the file is cut short or padded: {} bytes of table, the header says {}",
            body.len(),
            header.bytes
        ));
    }
    let sum = crate::auth::sha256_text(body);
    if sum != header.sha256 {
        return Err(format!(
            "checksum mismatch (the table is {sum}, the header says {}): the file is corrupt",
            header.sha256
        ));
    }
    let locks: LockState = serde_json::from_slice(body).map_err(|e| format!("the table does not decode: {e}"))?;
    if locks.revision() != header.revision {
        return Err(format!("the header says revision {}, the table is at {}", header.revision, locks.revision()));
    }
    Ok((header, locks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::state::{AcquireCmd, Command};

    fn table() -> LockState {
        let mut s = LockState::default();
        for (key, lease) in [("rack/1", "L1"), ("rack/2", "L2")] {
            s.apply(&Command::Acquire(AcquireCmd {
                key: key.into(),
                owner: "o".into(),
                holder: "h".into(),
                ttl_ms: 1000,
                lock_delay_ms: 0,
                lease_id: lease.into(),
                request_id: Some(lease.into()),
            }));
        }
        s
    }

    fn file() -> Vec<u8> {
        let origin = Origin { taken_at: "2026-12-01T00:00:00Z".into(), node: 1, term: 3, applied_index: 9 };
        encode(&table(), origin)
    }

    /// The clock's reading, not the operator's guess, sets the floor; a
    /// restore never starts below the backup or above 2^53.
    #[test]
    fn the_floor_is_the_clock_unless_min_token_is_higher() {
        let now = 1_796_000_000_000_000; // 2026-12, in µs
        let f = restore_floor(5, 1, now).unwrap();
        assert_eq!(f, RestoreFloor { floor: now, by: FloorSource::Clock }, "--min-token 1 changes nothing");
        let f = restore_floor(5, now + 7, now).unwrap();
        assert_eq!(f, RestoreFloor { floor: now + 7, by: FloorSource::MinToken });
        assert!(restore_floor(now, 0, now).unwrap_err().contains("clock is behind"));
        assert!(restore_floor(5, MAX_TOKEN, now).unwrap_err().contains("2^53"));
        // Two restores of one backup a second apart: the second starts
        // above every token the first could grant in that second, at one
        // per microsecond (far above what a Raft log that syncs every entry
        // to disk can commit).
        const TOKENS_PER_SECOND: u64 = 1_000_000;
        let first = restore_floor(5, 0, now).unwrap().floor;
        let second = restore_floor(5, 0, now + 1_000_000).unwrap().floor;
        assert!(second >= first + TOKENS_PER_SECOND);
    }

    #[test]
    fn a_backup_round_trips() {
        let (header, locks) = decode(&file()).unwrap();
        assert_eq!(locks, table());
        assert_eq!((header.revision, header.keys, header.leases, header.node), (2, 2, 2, 1));
    }

    #[test]
    fn any_flipped_byte_of_the_table_is_refused() {
        let f = file();
        let start = f.iter().position(|b| *b == b'\n').unwrap() + 1;
        for i in start..f.len() {
            let mut bad = f.clone();
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "byte {i} flipped was taken");
        }
    }

    #[test]
    fn truncated_foreign_and_newer_files_are_refused() {
        let f = file();
        for cut in [0, 10, f.len() / 2, f.len() - 1] {
            assert!(decode(&f[..cut]).is_err(), "cut at {cut} was taken");
        }
        assert!(decode(b"{\"format\":\"etcd\"}\n{}").unwrap_err().contains("not a fencegate backup"));
        let text = String::from_utf8(f).unwrap();
        let newer = text.replacen("\"version\":1", "\"version\":2", 1);
        assert!(decode(newer.as_bytes()).unwrap_err().contains("newer fencegate"));
        let lying = text.replacen("\"revision\":2", "\"revision\":7", 1);
        assert!(decode(lying.as_bytes()).unwrap_err().contains("revision"));
    }
}
