//! The idempotency records on disk: an append-only journal
//! (`state_dir/idempotency.log`) of puts and forgets, replayed into memory at
//! start. A batch of changes is one write and one `fdatasync`: what I1
//! needs durable before a request is forwarded costs a sequential write,
//! not a B-tree update. When the journal has grown well past what is live,
//! it is rewritten from the live records (a new file, fsync'd, renamed over
//! the old).
//!
//! The file: a header `[8 bytes "fgidem4\n"][u64 salt][u64 sum of both]`,
//! then entries `[u32 length of the body][u32 check of the length][body:
//! u8 kind, u16 scope length, scope, payload][u64 sum of the body]`,
//! little-endian; the check and the sum are XXH3 seeded with the journal's
//! salt, random per file. A batch is one entry (`BATCH`, no scope), its
//! payload its changes, each `[u32 length][body]` without a sum of its own:
//! a batch is whole or not at all, and nothing in a torn one reads as an
//! entry. A journal written anew is one `PUT` entry per record (it is
//! renamed into place whole).
//!
//! A crash can leave a torn last batch, whose pages reached the disk in
//! any order: replay stops at the first entry that does not check out and
//! cuts the file there, if nothing valid follows; a bad entry with valid
//! ones after it is damage, not a torn write, and the journal is not opened
//! (cutting would lose what follows). Looking for valid entries after a bad
//! one reads each offset's length check first, so it is linear in the
//! file; and the salt keeps bytes of a record (an upstream's answer) from
//! forging an entry: without it a torn batch holding one would be taken for
//! damage.
//!
//! The file runs past its last entry with zeros written ahead (up to
//! `ZEROS_AHEAD`), and a batch is written over them in place: its
//! `fdatasync` then flushes data alone. An append that grew the file would
//! also commit the file's new size through the filesystem's own journal
//! (ext4's jbd2 thread, which must be scheduled on a busy machine): on
//! this machine a keyed request then waited longer, and the sidecar made
//! fewer of them (`bench/JOURNAL.md`, issue 13). Zeros end the replay as a
//! torn entry would, but are no damage: a journal ending in zeros opens as
//! it is.
//!
//! Journals of state formats 3 and before (no header, entries summed by
//! FNV-1a) are replayed and written anew in this format at start. Their
//! entries have no length check, so the scan past a bad one sums at most
//! `LEGACY_SCAN_BYTES`, and a journal it cannot tell from damaged within
//! that is refused, not cut.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64_with_seed;

const PUT: u8 = 1;
const FORGET: u8 = 2;
const BATCH: u8 = 3;
const MAGIC: &[u8; 8] = b"fgidem4\n";
/// The header's length: magic, salt, sum.
const HEADER: usize = 24;
/// A batch's own framing: length and check, kind and an empty scope, sum.
const BATCH_FRAME: usize = 8 + 3 + 8;
/// A batch of more is split into entries of about this much, each written
/// and synced before the next (so only the last can be torn).
const BATCH_BYTES: usize = 8 << 20;
/// Bodies longer than this are not ours (a record is at most its answer,
/// 64 MiB, and its headers).
const MAX_ENTRY: u32 = 80 << 20;
/// How far past its last entry the file is written with zeros, at most: a
/// batch that reaches the end of them writes this much more. Flushing a
/// mebibyte of zeros holds that one batch ~2.5 ms here.
const ZEROS_AHEAD: u64 = 1 << 20;
/// How much of an older journal, at most, is summed looking for valid
/// entries after a bad one (its entries have no length check: a scan can
/// sum most of the file at every offset). About a second of FNV-1a.
const LEGACY_SCAN_BYTES: usize = 1 << 30;

/// Records as stored: (scope, encoding).
pub(crate) type Stored = Vec<(String, Vec<u8>)>;

/// One change to the records.
pub(crate) enum Change<'a> {
    Put(&'a str, &'a [u8]),
    Forget(&'a str),
}

pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    salt: u64,
    /// Where its entries end: what has been appended since it was last
    /// written anew.
    pub bytes: u64,
    /// The file's length: zeros from `bytes` to here.
    len: u64,
    /// A file renamed into place whose directory was not synced yet (its
    /// sync failed): nothing is acknowledged until it is.
    dir_unsynced: bool,
}

/// An entry's length's check: read before anything else at an offset.
fn check(salt: u64, len: u32) -> u32 {
    xxh3_64_with_seed(&len.to_le_bytes(), !salt) as u32
}

/// What `change` takes in a batch.
fn size(change: &Change<'_>) -> usize {
    match change {
        Change::Put(scope, payload) => 7 + scope.len() + payload.len(),
        Change::Forget(scope) => 7 + scope.len(),
    }
}

/// `[kind][u16 scope length][scope][payload]`.
fn body(out: &mut Vec<u8>, kind: u8, scope: &str, payload: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&(scope.len() as u16).to_le_bytes());
    out.extend_from_slice(scope.as_bytes());
    out.extend_from_slice(payload);
}

/// A change inside a batch: `[u32 length][body]`.
fn change(out: &mut Vec<u8>, change: &Change<'_>) {
    let (kind, scope, payload) = match change {
        Change::Put(scope, payload) => (PUT, scope, *payload),
        Change::Forget(scope) => (FORGET, scope, &[][..]),
    };
    out.extend_from_slice(&(3 + scope.len() as u32 + payload.len() as u32).to_le_bytes());
    body(out, kind, scope, payload);
}

/// An entry whose body `fill` writes.
fn entry_of(out: &mut Vec<u8>, salt: u64, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    fill(out);
    let len = (out.len() - start - 8) as u32;
    let sum = xxh3_64_with_seed(&out[start + 8..], salt);
    out.extend_from_slice(&sum.to_le_bytes());
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&check(salt, len).to_le_bytes());
}

fn encode_batch(out: &mut Vec<u8>, salt: u64, changes: &[Change<'_>]) {
    entry_of(out, salt, |out| {
        body(out, BATCH, "", &[]);
        for c in changes {
            change(out, c);
        }
    });
}

fn header(salt: u64) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&salt.to_le_bytes());
    let sum = xxh3_64_with_seed(&out, 0);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().expect("4 bytes")))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().expect("8 bytes")))
}

/// `[u8 kind][u16 scope length][scope][payload]`: (kind, scope, payload).
fn fields(body: &[u8]) -> Option<(u8, &str, &[u8])> {
    let scope_len = u16::from_le_bytes([*body.get(1)?, *body.get(2)?]) as usize;
    let scope = body.get(3..3 + scope_len).and_then(|s| std::str::from_utf8(s).ok())?;
    Some((body[0], scope, &body[3 + scope_len..]))
}

/// An entry read at the start of some bytes: (kind, scope, payload, its
/// whole length).
type Entry<'a> = (u8, &'a str, &'a [u8], usize);

/// This format's entry at the start of `bytes`, if one checks out.
fn entry(bytes: &[u8], salt: u64) -> Option<Entry<'_>> {
    let len = u32_at(bytes, 0)?;
    if !(3..=MAX_ENTRY).contains(&len) || u32_at(bytes, 4)? != check(salt, len) {
        return None;
    }
    let body = bytes.get(8..8 + len as usize)?;
    if xxh3_64_with_seed(body, salt) != u64_at(bytes, 8 + len as usize)? {
        return None;
    }
    let (kind, scope, payload) = fields(body)?;
    matches!(kind, PUT | FORGET | BATCH).then_some((kind, scope, payload, 16 + len as usize))
}

/// FNV-1a, what state formats 3 and before summed entries with.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// An entry of state formats 3 and before: `[u32 length of the rest][body]
/// [u64 FNV-1a of the body]`, a change each (or, in builds between, a
/// batch of them).
fn legacy_entry(bytes: &[u8]) -> Option<Entry<'_>> {
    let len = u32_at(bytes, 0)?;
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
        let len = u32_at(bytes, 0)? as usize;
        let (kind, scope, payload) = fields(bytes.get(4..4 + len)?)?;
        if !matches!(kind, PUT | FORGET) {
            return None;
        }
        changes.push((kind, scope, payload));
        bytes = &bytes[4 + len..];
    }
    Some(changes)
}

/// The entries of `bytes` from `at` applied in order, and where the valid
/// ones end.
fn replay<'a>(
    bytes: &'a [u8],
    mut at: usize,
    entry: impl Fn(&'a [u8]) -> Option<Entry<'a>>,
) -> (HashMap<String, Vec<u8>>, usize) {
    let mut live = HashMap::new();
    let mut apply = |kind, scope: &str, payload: &[u8]| {
        if kind == PUT {
            live.insert(scope.to_string(), payload.to_vec());
        } else {
            live.remove(scope);
        }
    };
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

/// What follows the valid entries of `bytes` at `valid`: `Ok(true)` if it is
/// a torn tail to cut, `Ok(false)` if only zeros, an error if a valid entry
/// comes after it (damage).
fn torn<'a>(
    path: &Path,
    bytes: &'a [u8],
    valid: usize,
    entry: impl Fn(&'a [u8]) -> Option<Entry<'a>>,
) -> io::Result<bool> {
    if bytes[valid..].iter().all(|b| *b == 0) {
        return Ok(false);
    }
    match (valid + 1..bytes.len()).find(|at| entry(&bytes[*at..]).is_some()) {
        Some(at) => {
            Err(refused(path, format!("a damaged entry at byte {valid} with valid entries after it (at {at})")))
        }
        None => Ok(true),
    }
}

/// A journal not opened, and why: left as it is for the operator.
fn refused(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{}: {why}; move the file aside to start without the records", path.display()))
}

fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// `live` as a journal of its own at `path`, with `salt`: written to a
/// new file, fsync'd and renamed over `path` (the directory not synced
/// yet). The file and its length.
fn write_anew<'a, B: AsRef<[u8]>>(
    path: &Path,
    salt: u64,
    live: impl IntoIterator<Item = (&'a str, B)>,
) -> io::Result<(File, u64)> {
    let tmp = path.with_extension("log.new");
    let mut out = header(salt);
    for (scope, bytes) in live {
        entry_of(&mut out, salt, |out| body(out, PUT, scope, bytes.as_ref()));
    }
    let mut f = File::create(&tmp)?;
    f.write_all(&out)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok((f, out.len() as u64))
}

impl Journal {
    /// Open (or create) the journal in `dir` and replay it.
    pub(crate) fn open(dir: &Path) -> io::Result<(Journal, Stored)> {
        let path = dir.join("idempotency.log");
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        if !bytes.starts_with(MAGIC) {
            return Journal::upgrade(path, &bytes);
        }
        let salt = u64_at(&bytes, 8).filter(|salt| bytes.get(..HEADER) == Some(&header(*salt)[..]));
        let salt = salt.ok_or_else(|| refused(&path, "its header is damaged"))?;
        let ours = |b| entry(b, salt);
        let (live, valid) = replay(&bytes, HEADER, ours);
        let file = OpenOptions::new().write(true).open(&path)?;
        let mut len = bytes.len() as u64;
        if torn(&path, &bytes, valid, ours)? {
            tracing::warn!(path = %path.display(), cut = bytes.len() - valid, "idempotency journal: a torn last batch, cut off");
            file.set_len(valid as u64)?;
            file.sync_all()?;
            len = valid as u64;
        }
        // The directory's entries, for a state directory just made.
        sync_dir(&path)?;
        let journal = Journal { path, file, salt, bytes: valid as u64, len, dir_unsynced: false };
        Ok((journal, live.into_iter().collect()))
    }

    /// A journal of an older build (or none): replayed, and written anew
    /// in this format.
    fn upgrade(path: PathBuf, bytes: &[u8]) -> io::Result<(Journal, Stored)> {
        let (live, valid) = replay(bytes, 0, legacy_entry);
        let budget = std::cell::Cell::new(LEGACY_SCAN_BYTES);
        let exhausted = std::cell::Cell::new(false);
        let bounded = |b| {
            let len = u32_at(b, 0)? as usize;
            if len + 4 <= b.len() {
                exhausted.set(exhausted.get() || budget.get() < len);
                budget.set(budget.get().checked_sub(len)?);
            }
            legacy_entry(b)
        };
        if torn(&path, bytes, valid, bounded)? {
            if exhausted.get() {
                let why = format!("a bad entry at byte {valid}, and too much after it to tell a torn tail from damage");
                return Err(refused(&path, why));
            }
            // Nothing valid and more than zeros is not a journal an older
            // build wrote (or one whose first entry tore; nothing in it was
            // acknowledged): not cut away unasked.
            if valid == 0 {
                return Err(refused(&path, "not an idempotency journal this build can read"));
            }
            tracing::warn!(path = %path.display(), cut = bytes.len() - valid, "idempotency journal: a torn last entry, cut off");
        }
        let salt = rand::random();
        let (file, bytes_now) = write_anew(&path, salt, live.iter().map(|(s, b)| (s.as_str(), b)))?;
        sync_dir(&path)?;
        if !bytes.is_empty() {
            tracing::info!(path = %path.display(), records = live.len(), "idempotency journal: written anew in this build's format");
        }
        let journal = Journal { path, file, salt, bytes: bytes_now, len: bytes_now, dir_unsynced: false };
        Ok((journal, live.into_iter().collect()))
    }

    /// Whether it holds no entries.
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes == HEADER as u64
    }

    /// Append `changes` and make them durable: one batch, or several (each
    /// synced before the next) if they are more than `BATCH_BYTES`.
    pub(crate) fn append(&mut self, changes: &[Change<'_>]) -> io::Result<()> {
        for c in changes {
            let (Change::Put(scope, _) | Change::Forget(scope)) = c;
            if scope.len() > usize::from(u16::MAX) {
                return Err(io::Error::other("a scope too long for the journal"));
            }
        }
        if self.dir_unsynced {
            sync_dir(&self.path)?;
            self.dir_unsynced = false;
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
        let total = BATCH_FRAME + bytes;
        if total - 16 > MAX_ENTRY as usize {
            return Err(io::Error::other("an entry too large for the journal"));
        }
        let end = self.bytes + total as u64;
        // Past the zeros: more of them, in the same write and flush.
        let zeros = if end > self.len { ZEROS_AHEAD as usize } else { 0 };
        let mut out = Vec::with_capacity(total + zeros);
        encode_batch(&mut out, self.salt, changes);
        assert_eq!(out.len(), total, "a batch's length counted ahead");
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
    pub(crate) fn rewrite<'a, B: AsRef<[u8]>>(
        &mut self,
        live: impl IntoIterator<Item = (&'a str, B)>,
    ) -> io::Result<()> {
        // A salt of its own: stale blocks of the old file (a crash on a
        // filesystem that can show them) cannot read as the new one's.
        let salt = rand::random();
        let (file, bytes) = write_anew(&self.path, salt, live)?;
        // The new file is the journal from here, whatever fails next: a
        // reopen must not cut it to the old one's length, and no batch is
        // acknowledged before its name is durable.
        (self.file, self.salt, self.bytes, self.len, self.dir_unsynced) = (file, salt, bytes, bytes, true);
        sync_dir(&self.path)?;
        self.dir_unsynced = false;
        Ok(())
    }

    /// Open the file again after an I/O error, cut to the end of the last
    /// batch that was written whole (known exactly: no replay).
    pub(crate) fn reopen(&mut self) -> io::Result<()> {
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
        let (opened, first, len) = torn_after(|_| vec![7; 8000]);
        assert_eq!(opened.expect("a torn batch does not stop the journal"), (first, 1));
        assert_eq!(len, first, "cut where it tore");
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
            let mut at = HEADER;
            while let Some((kind, _, _, len)) = entry(&bytes[at..], j.salt) {
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
        bytes[HEADER + 8] ^= 0xff; // inside the first entry
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open(dir.path()).err().expect("refused");
        assert!(e.to_string().contains("damaged entry"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing cut");
    }

    #[test]
    fn a_corrupt_entry_ends_the_replay() {
        let mut out = Vec::new();
        let put = |out: &mut Vec<u8>, v: &[u8]| entry_of(out, 7, |out| body(out, PUT, "k", v));
        put(&mut out, b"v");
        let good = out.len();
        put(&mut out, b"w");
        let last = out.len() - 1;
        out[last] ^= 1;
        let (live, valid) = replay(&out, 0, |b| entry(b, 7));
        assert_eq!((live.get("k").map(Vec::as_slice), valid), (Some(&b"v"[..]), good));
    }

    /// A journal whose second batch holds `payload` (given the journal's
    /// salt) and another change, torn in its first page, opened again:
    /// (entries' end, records), where the first batch ended, and the
    /// file's length after.
    fn torn_after(payload: impl Fn(u64) -> Vec<u8>) -> (io::Result<(u64, usize)>, u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idempotency.log");
        let first = {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append(&[Change::Put("a\n1", b"one")]).unwrap();
            let first = j.bytes;
            j.append(&[Change::Put("a\n2", &payload(j.salt)), Change::Put("a\n3", b"three")]).unwrap();
            first
        };
        let mut bytes = std::fs::read(&path).unwrap();
        let page = (first as usize / 4096 + 1) * 4096;
        bytes[first as usize..page].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let opened = Journal::open(dir.path()).map(|(j, live)| (j.bytes, live.len()));
        (opened, first, std::fs::metadata(&path).unwrap().len())
    }

    /// A record's bytes (an upstream's answer) holding a whole entry as an
    /// older build or another journal would sum it: in a torn batch, no
    /// valid entry (the sum is salted), so the batch is cut, not taken for
    /// damage. With the journal's own salt (which no one outside has) the
    /// same bytes would be taken for damage: the scan does reach them.
    #[test]
    fn an_entry_forged_inside_a_torn_batch_does_not_pass_for_one() {
        let forge = |salts: &[u64]| {
            let mut forged = vec![7; 8000];
            legacy(&mut forged, PUT, "a\nforged", b"x");
            for salt in salts {
                entry_of(&mut forged, *salt, |out| body(out, PUT, "a\nforged", b"x"));
            }
            forged
        };
        let (opened, first, _) = torn_after(|salt| forge(&[0, 1, u64::MAX, salt ^ 1]));
        assert_eq!(opened.expect("nothing forged is taken for an entry"), (first, 1));
        let (opened, ..) = torn_after(|salt| forge(&[salt]));
        let e = opened.expect_err("with the salt, taken for an entry");
        assert!(e.to_string().contains("damaged entry"), "{e}");
    }

    /// Looking past a bad entry for valid ones is linear in the file. An
    /// answer of bytes `ff ff 3f 00` over and over reads, at every fourth
    /// offset, as the length of a body that fits in what follows: summing
    /// each (as a build before the length check did) would hold the start
    /// for hours.
    #[test]
    fn a_torn_batch_of_crafted_lengths_is_cut_off_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idempotency.log");
        let crafted = [0xff, 0xff, 0x3f, 0x00].repeat((BATCH_BYTES - 64) / 4);
        {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append(&[Change::Put("a\n1", &crafted)]).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER..HEADER + 4096].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(open_in_time(dir.path()).unwrap(), (HEADER as u64, 0));
    }

    /// The journal in `dir` opened within 30 s (or the test fails):
    /// (entries' end, records).
    fn open_in_time(dir: &Path) -> io::Result<(u64, usize)> {
        let (tx, rx) = std::sync::mpsc::channel();
        let at = dir.to_owned();
        std::thread::spawn(move || tx.send(Journal::open(&at).map(|(j, live)| (j.bytes, live.len()))));
        rx.recv_timeout(std::time::Duration::from_secs(30)).expect("opened or refused within 30 s")
    }

    /// An entry as state formats 3 and before wrote it.
    fn legacy(out: &mut Vec<u8>, kind: u8, scope: &str, payload: &[u8]) {
        let mut b = Vec::new();
        body(&mut b, kind, scope, payload);
        out.extend_from_slice(&(b.len() as u32 + 8).to_le_bytes());
        out.extend_from_slice(&b);
        out.extend_from_slice(&fnv(&b).to_le_bytes());
    }

    /// `a\n1` = one, `a\n2` = two, as an older build wrote them.
    fn two_legacy_entries() -> Vec<u8> {
        let mut old = Vec::new();
        legacy(&mut old, PUT, "a\n1", b"one");
        legacy(&mut old, PUT, "a\n2", b"two");
        old
    }

    #[test]
    fn an_older_builds_journal_is_replayed_and_written_anew() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idempotency.log");
        let mut old = two_legacy_entries();
        // A batch, as builds between formats 3 and 4 wrote them.
        let mut changes = Vec::new();
        change(&mut changes, &Change::Put("a\n3", b"three"));
        change(&mut changes, &Change::Forget("a\n2"));
        legacy(&mut old, BATCH, "", &changes);
        legacy(&mut old, PUT, "a\n2", b"two");
        old.extend_from_slice(&[9, 0, 0]); // a torn last entry
        old.extend_from_slice(&[0; 4096]); // and zeros ahead (format 3)
        std::fs::write(&path, &old).unwrap();
        let (mut j, mut live) = Journal::open(dir.path()).unwrap();
        live.sort();
        let three = ("a\n3".to_string(), b"three".to_vec());
        assert_eq!(live, vec![("a\n1".into(), b"one".to_vec()), ("a\n2".into(), b"two".to_vec()), three.clone()]);
        assert!(std::fs::read(&path).unwrap().starts_with(MAGIC), "written anew");
        j.append(&[Change::Forget("a\n1"), Change::Forget("a\n2")]).unwrap();
        drop(j);
        let (_, live) = Journal::open(dir.path()).unwrap();
        assert_eq!(live, vec![three]);
    }

    /// An older journal with a bad entry and valid ones after it is refused
    /// as damaged, and one whose torn tail is too much to look through in
    /// time is refused too (its entries have no length check), not cut.
    #[test]
    fn an_older_damaged_journal_is_refused_and_its_scan_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idempotency.log");
        let mut old = two_legacy_entries();
        old[6] ^= 1;
        std::fs::write(&path, &old).unwrap();
        let e = Journal::open(dir.path()).err().expect("refused");
        assert!(e.to_string().contains("damaged entry"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), old, "left as it was");

        let mut old = Vec::new();
        legacy(&mut old, PUT, "a\n1", b"one");
        let valid = old.len();
        legacy(&mut old, PUT, "a\n2", &[0xff, 0xff, 0x3f, 0x00].repeat(2 << 20));
        old[valid..valid + 4096].fill(0);
        std::fs::write(&path, &old).unwrap();
        let e = open_in_time(dir.path()).expect_err("refused");
        assert!(e.to_string().contains("too much after it"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), old, "left as it was");
    }

    /// Bytes that are neither this format nor an older one, or a damaged
    /// header: refused, and left as they are.
    #[test]
    fn a_file_that_is_no_journal_or_has_a_damaged_header_is_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idempotency.log");
        std::fs::write(&path, b"{\"not\": \"a journal\"}").unwrap();
        let e = Journal::open(dir.path()).err().expect("refused");
        assert!(e.to_string().contains("not an idempotency journal"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"not\": \"a journal\"}");
        std::fs::remove_file(&path).unwrap();
        {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append(&[Change::Put("a\n1", b"one")]).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 1; // the salt
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open(dir.path()).err().expect("refused");
        assert!(e.to_string().contains("header is damaged"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing cut");
    }
}
