//! One file's writes that are not durable yet: the pure core of the
//! power-loss filesystem's data. The durable bytes (the "base", what a power
//! cut leaves) are somewhere else; this overlay holds what was written and
//! truncated since the last sync, answers reads as the processes see the
//! file, and on a sync says what to apply to the base. No IO, no clock.

use std::collections::BTreeMap;

/// Changes to one file since its last sync (fsync or fdatasync).
#[derive(Debug, Default, Clone)]
pub struct Pending {
    /// Data written since the sync, by offset; extents never overlap (a
    /// later write replaces the part of an older one it covers).
    extents: BTreeMap<u64, Vec<u8>>,
    /// The size the processes see, when it differs from the base's.
    len: Option<u64>,
    /// The smallest size the file had since the sync: the base's bytes at
    /// or past it were cut off, and read as zeros unless written again.
    low: Option<u64>,
}

/// What a sync applies to the base, in this order: cut it to `cut_to` (if
/// some), set its length to `len`, then write each extent.
#[derive(Debug, PartialEq, Eq)]
pub struct Flush {
    pub cut_to: Option<u64>,
    pub len: u64,
    pub writes: Vec<(u64, Vec<u8>)>,
}

impl Pending {
    /// Nothing written or truncated since the sync.
    pub fn is_clean(&self) -> bool {
        self.extents.is_empty() && self.len.is_none() && self.low.is_none()
    }

    /// The size the processes see, over a base of `base_len` bytes.
    pub fn len(&self, base_len: u64) -> u64 {
        self.len.unwrap_or(base_len)
    }

    /// `write(2)` of `data` at `offset`.
    pub fn write(&mut self, base_len: u64, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        self.punch(offset, end);
        self.extents.insert(offset, data.to_vec());
        let len = self.len(base_len).max(end);
        self.len = Some(len);
    }

    /// `ftruncate(2)` to `len`.
    pub fn truncate(&mut self, base_len: u64, len: u64) {
        self.punch(len, u64::MAX);
        self.low = Some(self.low.unwrap_or(base_len).min(len));
        self.len = Some(len);
    }

    /// Read up to `size` bytes at `offset` as the processes see the file;
    /// `read_base(buf, at)` fills `buf` from the base (only ever below
    /// `base_len`).
    pub fn read(&self, base_len: u64, offset: u64, size: usize, mut read_base: impl FnMut(&mut [u8], u64)) -> Vec<u8> {
        let end = (offset.saturating_add(size as u64)).min(self.len(base_len));
        if end <= offset {
            return Vec::new();
        }
        let mut out = vec![0; (end - offset) as usize];
        let visible = self.low.unwrap_or(base_len).min(base_len);
        if offset < visible {
            let upto = visible.min(end);
            read_base(&mut out[..(upto - offset) as usize], offset);
        }
        for (&at, data) in self.overlapping(offset, end) {
            let from = at.max(offset);
            let to = (at + data.len() as u64).min(end);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
        }
        out
    }

    /// What a sync must apply to the base; the overlay is then clean.
    pub fn flush(&mut self, base_len: u64) -> Flush {
        let len = self.len(base_len);
        let cut_to = self.low.filter(|low| *low < base_len);
        let writes = std::mem::take(&mut self.extents).into_iter().collect();
        *self = Pending::default();
        Flush { cut_to, len, writes }
    }

    /// A cut on a disk that had written some of the file on its own: what
    /// to apply to the base before the rest is dropped. Each extent is kept
    /// if `keep()` says so; then the size: the new one (truncation
    /// included), or the old one grown to cover the extents kept.
    pub fn flush_some(&mut self, base_len: u64, mut keep: impl FnMut() -> bool) -> Flush {
        let writes: Vec<(u64, Vec<u8>)> = std::mem::take(&mut self.extents).into_iter().filter(|_| keep()).collect();
        let end = writes.iter().map(|(at, d)| at + d.len() as u64).max().unwrap_or(0);
        let flush = if keep() {
            Flush { cut_to: self.low.filter(|low| *low < base_len), len: self.len(base_len), writes }
        } else {
            Flush { cut_to: None, len: base_len.max(end), writes }
        };
        *self = Pending::default();
        flush
    }

    fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (&u64, &Vec<u8>)> {
        // The extent starting before `start` may reach into the range.
        let before = self.extents.range(..start).next_back().filter(|(at, d)| **at + d.len() as u64 > start);
        before.into_iter().chain(self.extents.range(start..end))
    }

    /// Remove `[start, end)` from the extents, keeping what sticks out.
    fn punch(&mut self, start: u64, end: u64) {
        let hit: Vec<u64> = self.overlapping(start, end).map(|(at, _)| *at).collect();
        for at in hit {
            let data = self.extents.remove(&at).expect("listed");
            let stop = at + data.len() as u64;
            if at < start {
                self.extents.insert(at, data[..(start - at) as usize].to_vec());
            }
            if stop > end {
                self.extents.insert(end, data[(end - at) as usize..].to_vec());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file: its base (durable bytes) and its overlay.
    #[derive(Default)]
    struct File {
        base: Vec<u8>,
        pending: Pending,
    }

    impl File {
        fn write(&mut self, at: u64, data: &[u8]) {
            self.pending.write(self.base.len() as u64, at, data);
        }
        fn truncate(&mut self, len: u64) {
            self.pending.truncate(self.base.len() as u64, len);
        }
        fn seen(&self) -> Vec<u8> {
            let base = &self.base;
            self.pending.read(base.len() as u64, 0, usize::MAX / 2, |buf, at| {
                buf.copy_from_slice(&base[at as usize..at as usize + buf.len()])
            })
        }
        fn sync(&mut self) {
            let f = self.pending.flush(self.base.len() as u64);
            if let Some(cut) = f.cut_to {
                self.base.truncate(cut as usize);
            }
            self.base.resize(f.len as usize, 0);
            for (at, d) in f.writes {
                self.base[at as usize..at as usize + d.len()].copy_from_slice(&d);
            }
        }
        fn cut(&mut self) {
            self.pending = Pending::default();
        }
    }

    #[test]
    fn unsynced_writes_are_seen_and_lost_at_a_cut() {
        let mut f = File::default();
        f.write(0, b"hello");
        assert_eq!(f.seen(), b"hello");
        f.cut();
        assert_eq!(f.seen(), b"");
        f.write(0, b"hello");
        f.sync();
        f.write(5, b" world");
        f.write(0, b"J");
        assert_eq!(f.seen(), b"Jello world");
        f.cut();
        assert_eq!(f.seen(), b"hello");
    }

    #[test]
    fn overlapping_writes_keep_the_latest_bytes() {
        let mut f = File::default();
        f.write(2, b"abcdef");
        f.write(0, b"XYZ");
        f.write(6, b"12345");
        f.write(4, b"-");
        assert_eq!(f.seen(), b"XYZb-d12345");
        f.sync();
        assert_eq!(f.base, b"XYZb-d12345");
        assert!(f.pending.is_clean());
    }

    #[test]
    fn a_truncation_hides_the_base_until_synced_and_comes_back_at_a_cut() {
        let mut f = File::default();
        f.write(0, b"0123456789");
        f.sync();
        f.truncate(4);
        assert_eq!(f.seen(), b"0123");
        // Growing again reads zeros, not the cut-off base bytes.
        f.truncate(8);
        assert_eq!(f.seen(), b"0123\0\0\0\0");
        f.write(6, b"ab");
        assert_eq!(f.seen(), b"0123\0\0ab");
        f.cut();
        assert_eq!(f.seen(), b"0123456789");
        f.truncate(2);
        f.write(3, b"x");
        f.sync();
        assert_eq!(f.base, b"01\0x");
    }

    #[test]
    fn a_truncation_drops_pending_writes_past_it() {
        let mut f = File::default();
        f.write(0, b"abcdefgh");
        f.truncate(3);
        f.truncate(6);
        assert_eq!(f.seen(), b"abc\0\0\0");
        f.sync();
        assert_eq!(f.base, b"abc\0\0\0");
    }

    #[test]
    fn reads_at_an_offset_and_past_the_end() {
        let mut f = File::default();
        f.write(0, b"abcdef");
        f.sync();
        f.write(4, b"XYZ");
        let base = f.base.clone();
        let read =
            |at, n| f.pending.read(6, at, n, |buf, o| buf.copy_from_slice(&base[o as usize..o as usize + buf.len()]));
        assert_eq!(read(2, 3), b"cdX");
        assert_eq!(read(5, 10), b"YZ");
        assert_eq!(read(7, 10), b"");
    }

    #[test]
    fn a_torn_cut_keeps_what_was_synced_and_some_of_the_rest() {
        for keep_all in [false, true] {
            let mut f = File::default();
            f.write(0, b"synced;");
            f.sync();
            f.write(7, b"one;");
            f.write(20, b"two;");
            f.truncate(2);
            f.write(2, b"NCED;");
            let mut n = 0;
            let flush = f.pending.flush_some(7, || {
                n += 1;
                keep_all || n % 2 == 0
            });
            if let Some(cut) = flush.cut_to {
                f.base.truncate(cut as usize);
            }
            f.base.resize(flush.len as usize, 0);
            for (at, d) in flush.writes {
                f.base[at as usize..at as usize + d.len()].copy_from_slice(&d);
            }
            f.cut();
            if keep_all {
                assert_eq!(f.seen(), b"syNCED;");
            } else {
                // The one extent dropped, the new size (the truncation
                // to 2, then the write's 7) kept: zeros where it was.
                assert_eq!(f.seen(), b"sy\0\0\0\0\0");
            }
        }
    }

    #[test]
    fn random_histories_match_a_model() {
        // A tiny deterministic generator: no dependency for one test.
        let mut s: u64 = 0x9e3779b97f4a7c15;
        let mut next = |n: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % n
        };
        for _ in 0..300 {
            let mut f = File::default();
            let (mut seen, mut durable): (Vec<u8>, Vec<u8>) = (Vec::new(), Vec::new());
            for _ in 0..40 {
                match next(5) {
                    0 | 1 => {
                        let at = next(64);
                        let data: Vec<u8> = (0..1 + next(16)).map(|_| next(256) as u8).collect();
                        f.write(at, &data);
                        if seen.len() < at as usize + data.len() {
                            seen.resize(at as usize + data.len(), 0);
                        }
                        seen[at as usize..at as usize + data.len()].copy_from_slice(&data);
                    }
                    2 => {
                        let len = next(80);
                        f.truncate(len);
                        seen.resize(len as usize, 0);
                    }
                    3 => {
                        f.sync();
                        durable = seen.clone();
                    }
                    _ => {
                        f.cut();
                        seen = durable.clone();
                    }
                }
                assert_eq!(f.seen(), seen);
            }
        }
    }
}
