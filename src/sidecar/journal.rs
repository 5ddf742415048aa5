//! The idempotency records on disk: an append-only journal
//! (`state_dir/idempotency.log`) of puts and forgets, replayed into memory at
//! start. A batch of changes is one append and one `fdatasync`: what I1
//! needs durable before a request is forwarded costs a sequential write,
//! not a B-tree update. When the journal has grown well past what is live,
//! it is rewritten from the live records (a new file, fsync'd, renamed over
//! the old).
//!
//! An entry: `[u32 length of the rest][u8 kind][u16 scope length][scope]
//! [payload][u64 FNV-1a of kind..payload]`, little-endian. A batch is one
//! entry (`BATCH`, no scope), its payload its changes, each as an entry
//! without a sum of its own: a batch is whole or not at all, and nothing
//! in a torn one looks like an entry. (Builds of state format 2 and before
//! appended each change as an entry; those are read, and a journal written
//! anew is still one entry per record: it is renamed into place whole.)
//!
//! A crash can leave a torn last batch, whose pages reached the disk in
//! any order: replay stops at the first entry that does not check out and
//! cuts the file there, if nothing valid follows; a bad entry with valid
//! ones after it is damage, not a torn write, and the journal is not opened
//! (cutting would lose what follows).
//!
//! The file runs past its last entry with zeros written ahead (up to
//! `ZEROS_AHEAD`), and a batch is written over them in place: its
//! `fdatasync` then flushes data alone. An append that grew the file would
//! also commit the file's new size through the filesystem's own journal
//! (ext4's jbd2 thread, which must be scheduled on a busy machine): on
//! this machine a keyed request then waited longer, and the sidecar made
//! fewer of them (`bench/README.md`, issue 13). Zeros end the replay as a
//! torn entry would, but are no damage: a journal ending in zeros opens as
//! it is.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const PUT: u8 = 1;
const FORGET: u8 = 2;
const BATCH: u8 = 3;
/// A batch of more is split into entries of about this much, each written
/// and synced before the next (so only the last can be torn).
const BATCH_BYTES: usize = 8 << 20;
/// Entries longer than this are not ours (a record is at most its answer,
/// 64 MiB, and its headers).
const MAX_ENTRY: u32 = 80 << 20;
/// How far past its last entry the file is written with zeros, at most: a
/// batch that reaches the end of them writes this much more. Flushing a
/// mebibyte of zeros holds that one batch ~2.5 ms here.
const ZEROS_AHEAD: u64 = 1 << 20;

/// Records as stored: (scope, encoding).
pub type Stored = Vec<(String, Vec<u8>)>;

/// One change to the records.
pub enum Change<'a> {
    Put(&'a str, &'a [u8]),
    Forget(&'a str),
}

pub struct Journal {
    path: PathBuf,
    file: File,
    /// Where its entries end: what has been appended since it was last
    /// written anew.
    pub bytes: u64,
    /// The file's length: zeros from `bytes` to here.
    len: u64,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// What `change` takes in a batch.
fn size(change: &Change<'_>) -> usize {
    match change {
        Change::Put(scope, payload) => 7 + scope.len() + payload.len(),
        Change::Forget(scope) => 7 + scope.len(),
    }
}

/// `[u32 length of the rest][u8 kind][u16 scope length][scope][payload]`.
fn unsealed(out: &mut Vec<u8>, kind: u8, scope: &str, payload: &[u8]) {
    out.extend_from_slice(&(3 + scope.len() as u32 + payload.len() as u32).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&(scope.len() as u16).to_le_bytes());
    out.extend_from_slice(scope.as_bytes());
    out.extend_from_slice(payload);
}

fn change(out: &mut Vec<u8>, change: &Change<'_>) {
    match change {
        Change::Put(scope, payload) => unsealed(out, PUT, scope, payload),
        Change::Forget(scope) => unsealed(out, FORGET, scope, &[]),
    }
}

/// The entry begun at `start`, summed and its length set.
fn seal(out: &mut Vec<u8>, start: usize) {
    let sum = fnv(&out[start + 4..]);
    out.extend_from_slice(&sum.to_le_bytes());
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// One change as an entry of its own (a journal written anew).
fn encode(out: &mut Vec<u8>, c: &Change<'_>) {
    let start = out.len();
    change(out, c);
    seal(out, start);
}

fn encode_batch(out: &mut Vec<u8>, changes: &[Change<'_>]) {
    let start = out.len();
    unsealed(out, BATCH, "", &[]);
    for c in changes {
        change(out, c);
    }
    seal(out, start);
}

/// `[u8 kind][u16 scope length][scope][payload]`: (kind, scope, payload).
fn fields(body: &[u8]) -> Option<(u8, &str, &[u8])> {
    let scope_len = u16::from_le_bytes([*body.get(1)?, *body.get(2)?]) as usize;
    let scope = body.get(3..3 + scope_len).and_then(|s| std::str::from_utf8(s).ok())?;
    Some((body[0], scope, &body[3 + scope_len..]))
}

/// The entry at the start of `bytes`, if one checks out: (kind, scope,
/// payload, its whole length).
fn entry(bytes: &[u8]) -> Option<(u8, &str, &[u8], usize)> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().expect("4 bytes"));
    let entry = bytes.get(4..4 + len as usize).filter(|_| (11..=MAX_ENTRY).contains(&len))?;
    let (body, sum) = entry.split_at(entry.len() - 8);
    if fnv(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return None;
    }
    let (kind, scope, payload) = fields(body)?;
    matches!(kind, PUT | FORGET | BATCH).then_some((kind, scope, payload, 4 + len as usize))
}

/// A batch's changes, if they read whole: (kind, scope, payload).
fn batch(mut bytes: &[u8]) -> Option<Vec<(u8, &str, &[u8])>> {
    let mut changes = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes.get(..4)?.try_into().expect("4 bytes")) as usize;
        let (kind, scope, payload) = fields(bytes.get(4..4 + len)?)?;
        if !matches!(kind, PUT | FORGET) {
            return None;
        }
        changes.push((kind, scope, payload));
        bytes = &bytes[4 + len..];
    }
    Some(changes)
}

/// The entries of `bytes` applied in order, and where the valid ones end.
fn replay(bytes: &[u8]) -> (HashMap<String, Vec<u8>>, usize) {
    let mut live = HashMap::new();
    let mut apply = |kind, scope: &str, payload: &[u8]| {
        if kind == PUT {
            live.insert(scope.to_string(), payload.to_vec());
        } else {
            live.remove(scope);
        }
    };
    let mut at = 0;
    while let Some((kind, scope, payload, len)) = entry(&bytes[at..]) {
        if kind == BATCH {
            // Summed whole but not of our making: where the valid ones end.
            let Some(changes) = batch(payload) else { break };
            for (kind, scope, payload) in changes {
                apply(kind, scope, payload);
            }
        } else {
            apply(kind, scope, payload);
        }
        at += len;
    }
    (live, at)
}

impl Journal {
    /// Open (or create) the journal in `dir` and replay it.
    pub fn open(dir: &Path) -> io::Result<(Journal, Stored)> {
        let path = dir.join("idempotency.log");
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (live, valid) = replay(&bytes);
        let mut len = bytes.len() as u64;
        if bytes[valid..].iter().any(|b| *b != 0) {
            if let Some(at) = (valid + 1..bytes.len()).find(|at| entry(&bytes[*at..]).is_some()) {
                return Err(io::Error::other(format!(
                    "{}: a damaged entry at byte {valid} with valid entries after it (at {at}); move the file aside to start without the records",
                    path.display()
                )));
            }
            tracing::warn!(path = %path.display(), cut = bytes.len() - valid, "idempotency journal: a torn last batch, cut off");
            file.set_len(valid as u64)?;
            file.sync_all()?;
            len = valid as u64;
        }
        // The file's own directory entry, for a journal just made.
        File::open(dir)?.sync_all()?;
        Ok((Journal { path, file, bytes: valid as u64, len }, live.into_iter().collect()))
    }

    /// Append `changes` and make them durable: one batch, or several (each
    /// synced before the next) if they are more than `BATCH_BYTES`.
    pub fn append(&mut self, changes: &[Change<'_>]) -> io::Result<()> {
        for c in changes {
            let (Change::Put(scope, _) | Change::Forget(scope)) = c;
            if scope.len() > usize::from(u16::MAX) {
                return Err(io::Error::other("a scope too long for the journal"));
            }
        }
        let mut rest = changes;
        while !rest.is_empty() {
            // As many as fit, and at least one.
            let (mut n, mut bytes) = (1, size(&rest[0]));
            while n < rest.len() && bytes + size(&rest[n]) <= BATCH_BYTES {
                bytes += size(&rest[n]);
                n += 1;
            }
            self.append_batch(&rest[..n], bytes)?;
            rest = &rest[n..];
        }
        Ok(())
    }

    fn append_batch(&mut self, changes: &[Change<'_>], bytes: usize) -> io::Result<()> {
        // Its own header (an empty scope), its changes, its sum.
        let total = 7 + bytes + 8;
        if total - 4 > MAX_ENTRY as usize {
            return Err(io::Error::other("an entry too large for the journal"));
        }
        let end = self.bytes + total as u64;
        // Past the zeros: more of them, in the same write and flush.
        let zeros = if end > self.len { ZEROS_AHEAD as usize } else { 0 };
        let mut out = Vec::with_capacity(total + zeros);
        encode_batch(&mut out, changes);
        debug_assert_eq!(out.len(), total);
        out.resize(total + zeros, 0);
        let written = self.file.write_all_at(&out, self.bytes).and_then(|()| self.file.sync_data());
        if written.is_err() {
            // Whatever part of it landed goes (or, failing that, the reopen
            // after an error cuts it).
            let _ = self.file.set_len(self.bytes).and_then(|()| self.file.sync_data());
            self.len = self.bytes;
            return written;
        }
        self.bytes = end;
        self.len = self.len.max(end + zeros as u64);
        Ok(())
    }

    /// Write the journal anew from `live` (scope, encoding), each encoding
    /// taken as it is written: a new file, fsync'd, renamed over the old
    /// one, the directory fsync'd.
    pub fn rewrite<'a, B: AsRef<[u8]>>(&mut self, live: impl IntoIterator<Item = (&'a str, B)>) -> io::Result<()> {
        let tmp = self.path.with_extension("log.new");
        let mut out = Vec::new();
        for (scope, bytes) in live {
            encode(&mut out, &Change::Put(scope, bytes.as_ref()));
        }
        let mut f = File::create(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        // The new file is the journal from here, whatever fails next: a
        // reopen must not cut it to the old one's length.
        self.file = f;
        self.bytes = out.len() as u64;
        self.len = self.bytes;
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Open the file again after an I/O error, cut to the end of the last
    /// batch that was written whole (known exactly: no replay).
    pub fn reopen(&mut self) -> io::Result<()> {
        let file = OpenOptions::new().write(true).open(&self.path)?;
        file.set_len(self.bytes)?;
        file.sync_all()?;
        self.file = file;
        self.len = self.bytes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_replay_in_order_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let valid = {
            let (mut j, live) = Journal::open(dir.path()).unwrap();
            assert!(live.is_empty());
            j.append(&[Change::Put("a\n1", b"one"), Change::Put("a\n2", b"two")]).unwrap();
            j.append(&[Change::Forget("a\n1"), Change::Put("a\n2", b"two, again")]).unwrap();
            j.bytes
        };
        // A torn entry after the valid ones, over the zeros ahead.
        let path = dir.path().join("idempotency.log");
        OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&[40, 0, 0, 0, 1, 3], valid).unwrap();
        let (mut j, live) = Journal::open(dir.path()).unwrap();
        assert_eq!(live, vec![("a\n2".to_string(), b"two, again".to_vec())]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), valid, "cut at the torn entry");
        // Written anew: the same records, a shorter file, and appends go on.
        j.rewrite(live.iter().map(|(s, b)| (s.as_str(), b))).unwrap();
        assert!(j.bytes < valid);
        j.append(&[Change::Put("a\n3", b"three")]).unwrap();
        drop(j);
        let (_, mut live) = Journal::open(dir.path()).unwrap();
        live.sort();
        assert_eq!(live, vec![("a\n2".into(), b"two, again".to_vec()), ("a\n3".into(), b"three".to_vec())]);
    }

    /// Batches go over the zeros written ahead, at the end of the entries
    /// (not the file's), and zeros at the end are no torn batch.
    #[test]
    fn batches_are_written_over_zeros_ahead_and_a_journal_ending_in_zeros_opens_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idempotency.log");
        let payload = vec![7; 200 << 10];
        let (ends, len) = {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            let mut ends = vec![];
            // Past the first run of zeros, so that it is written again.
            for i in 0..8 {
                j.append(&[Change::Put(&format!("a\n{i}"), &payload)]).unwrap();
                ends.push(j.bytes);
                let len = std::fs::metadata(&path).unwrap().len();
                assert!(len > j.bytes && len <= j.bytes + ZEROS_AHEAD, "zeros ahead: {len} bytes for {}", j.bytes);
            }
            (ends, std::fs::metadata(&path).unwrap().len())
        };
        let (mut j, live) = Journal::open(dir.path()).unwrap();
        assert_eq!((live.len(), j.bytes), (8, ends[7]));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "nothing cut");
        j.append(&[Change::Forget("a\n0")]).unwrap();
        drop(j);
        let (_, live) = Journal::open(dir.path()).unwrap();
        assert_eq!(live.len(), 7, "the forget was written where the entries end, and replayed");
    }

    /// A batch torn by a crash with its first page never written (zeros)
    /// and a later one whole: a tear, cut off, not damage (no change in it
    /// reads as an entry of its own). The batch was never acknowledged.
    #[test]
    fn a_batch_torn_in_any_order_is_cut_off_not_taken_for_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idempotency.log");
        let first = {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append(&[Change::Put("a\n1", b"one")]).unwrap();
            let first = j.bytes;
            j.append(&[Change::Put("a\n2", &[7; 8000]), Change::Put("a\n3", b"three")]).unwrap();
            first
        };
        let mut bytes = std::fs::read(&path).unwrap();
        let page = (first as usize / 4096 + 1) * 4096;
        bytes[first as usize..page].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let (j, live) = Journal::open(dir.path()).expect("a torn batch does not stop the journal");
        assert_eq!(live, vec![("a\n1".to_string(), b"one".to_vec())]);
        assert_eq!((j.bytes, std::fs::metadata(&path).unwrap().len()), (first, first), "cut where it tore");
    }

    /// More than `BATCH_BYTES` at once goes as several batches, each whole.
    #[test]
    fn a_large_batch_is_split_and_replays_whole() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![1; BATCH_BYTES / 2 + 1];
        let path = dir.path().join("idempotency.log");
        {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            let scopes: Vec<String> = (0..5).map(|i| format!("a\n{i}")).collect();
            let changes: Vec<_> = scopes.iter().map(|s| Change::Put(s, &big)).collect();
            j.append(&changes).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let mut entries = 0;
            let mut at = 0;
            while let Some((kind, _, _, len)) = entry(&bytes[at..]) {
                assert_eq!(kind, BATCH);
                (entries, at) = (entries + 1, at + len);
            }
            assert_eq!((entries, at as u64), (5, j.bytes), "one change each: two would pass the bound");
        }
        let (_, live) = Journal::open(dir.path()).unwrap();
        assert_eq!(live.len(), 5);
    }

    #[test]
    fn a_damaged_entry_with_valid_ones_after_it_is_not_cut_away() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append(&[Change::Put("a\n1", b"one")]).unwrap();
            j.append(&[Change::Put("a\n2", b"two")]).unwrap();
        }
        let path = dir.path().join("idempotency.log");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8] ^= 0xff; // inside the first entry
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open(dir.path()).err().expect("refused");
        assert!(e.to_string().contains("damaged entry"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing cut");
    }

    #[test]
    fn a_corrupt_entry_ends_the_replay() {
        let mut out = Vec::new();
        encode(&mut out, &Change::Put("k", b"v"));
        let good = out.len();
        encode(&mut out, &Change::Put("k", b"w"));
        let last = out.len() - 1;
        out[last] ^= 1;
        let (live, valid) = replay(&out);
        assert_eq!((live.get("k").map(Vec::as_slice), valid), (Some(&b"v"[..]), good));
    }
}
