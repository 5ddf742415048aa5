//! The power-loss filesystem's FUSE side: requests from the kernel served
//! from the namespace ([`Names`]) and, per file, the durable bytes in a
//! backing file plus the [`Pending`] overlay. Every cache the kernel could
//! keep is off (entries and attributes with a zero TTL, file data with
//! direct I/O), so after a power cut the processes see exactly what the
//! model left.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::names::{Ino, Kind, Names, Refused};
use super::pending::Pending;
use super::Mode;

/// No caching of names or attributes in the kernel.
const TTL: Duration = Duration::ZERO;

/// One file's data: the durable bytes and what was written since.
struct Data {
    base: File,
    base_len: u64,
    pending: Pending,
}

impl Data {
    fn sync(&mut self) -> std::io::Result<()> {
        let flush = self.pending.flush(self.base_len);
        if let Some(cut) = flush.cut_to {
            self.base.set_len(cut)?;
        }
        self.base.set_len(flush.len)?;
        for (at, data) in flush.writes {
            self.base.write_all_at(&data, at)?;
        }
        self.base_len = flush.len;
        Ok(())
    }
}

/// Everything the filesystem knows, behind one lock.
pub(super) struct State {
    pub(super) mode: Mode,
    backing: PathBuf,
    names: Names,
    data: HashMap<Ino, Data>,
    perm: HashMap<Ino, u16>,
    open: HashMap<Ino, u32>,
    /// Files and directories with changes not durable yet, and since when
    /// (the writeback of [`Mode::Writeback`] persists the old ones).
    dirty: HashMap<Ino, Instant>,
    next_fh: u64,
    /// Handles below this were opened before the last power cut: a request
    /// on one (from a process killed mid-request) changes nothing.
    first_fh: u64,
    /// Who owns everything (the backing directory's owner).
    owner: (u32, u32),
    /// Syncs asked for, and power cuts.
    pub(super) syncs: u64,
}

impl State {
    pub(super) fn new(backing: PathBuf, mode: Mode) -> State {
        State {
            mode,
            backing: backing.clone(),
            names: Names::default(),
            data: HashMap::new(),
            perm: HashMap::from([(super::names::ROOT, 0o755)]),
            open: HashMap::new(),
            dirty: HashMap::new(),
            next_fh: 1,
            first_fh: 1,
            owner: std::fs::metadata(&backing)
                .map(|m| {
                    use std::os::unix::fs::MetadataExt;
                    (m.uid(), m.gid())
                })
                .unwrap_or((0, 0)),
            syncs: 0,
        }
    }

    /// Make the changes of `ino` durable (a file's data and size, or a
    /// directory's entries).
    fn persist(&mut self, ino: Ino) -> Result<(), Errno> {
        self.dirty.remove(&ino);
        match self.names.kind(ino) {
            Some(Kind::Dir) => self.names.sync_dir(ino).map_err(errno),
            Some(Kind::File) => match self.data.get_mut(&ino) {
                Some(d) => d.sync().map_err(|_| Errno::EIO),
                None => Ok(()),
            },
            None => Err(Errno::ENOENT),
        }
    }

    /// Writeback: persist what has been dirty for `age` or longer.
    pub(super) fn write_back(&mut self, age: Duration) {
        let now = Instant::now();
        let old: Vec<Ino> = self.dirty.iter().filter(|(_, since)| now - **since >= age).map(|(i, _)| *i).collect();
        for ino in old {
            let _ = self.persist(ino);
        }
    }

    /// A power cut on a disk that had written some of the files' data on
    /// its own (each unsynced extent, and each file's new size, kept if
    /// `keep()` says so); then [`State::cut`]. Names stay strict.
    pub(super) fn torn_cut(&mut self, mut keep: impl FnMut() -> bool) {
        for d in self.data.values_mut() {
            let flush = d.pending.flush_some(d.base_len, &mut keep);
            let applied = (|| -> std::io::Result<()> {
                if let Some(cut) = flush.cut_to {
                    d.base.set_len(cut)?;
                }
                d.base.set_len(flush.len)?;
                for (at, data) in &flush.writes {
                    d.base.write_all_at(data, *at)?;
                }
                Ok(())
            })();
            applied.expect("writing the backing file");
            d.base_len = flush.len;
        }
        self.cut();
    }

    /// Drop everything not durable, as a power cut would.
    pub(super) fn cut(&mut self) {
        self.first_fh = self.next_fh + 1;
        self.dirty.clear();
        self.open.clear();
        for d in self.data.values_mut() {
            d.pending = Pending::default();
        }
        for ino in self.names.cut() {
            self.drop_inode(ino);
        }
    }

    fn drop_inode(&mut self, ino: Ino) {
        self.perm.remove(&ino);
        if self.data.remove(&ino).is_some() {
            let _ = std::fs::remove_file(self.backing.join(ino.to_string()));
        }
    }

    fn touch(&mut self, ino: Ino) {
        self.dirty.entry(ino).or_insert_with(Instant::now);
    }

    fn release(&mut self, ino: Ino) {
        if let Some(n) = self.open.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                self.open.remove(&ino);
            }
        }
        self.collect(ino);
    }

    /// Forget a file nothing refers to any more.
    fn collect(&mut self, ino: Ino) {
        if self.names.is_orphan(ino) && !self.open.contains_key(&ino) && self.names.kind(ino) == Some(Kind::File) {
            self.names.forget(ino);
            self.dirty.remove(&ino);
            self.drop_inode(ino);
        }
    }

    fn attr(&self, ino: Ino) -> Result<FileAttr, Errno> {
        let kind = self.names.kind(ino).ok_or(Errno::ENOENT)?;
        let size = match kind {
            Kind::File => self.data.get(&ino).map_or(0, |d| d.pending.len(d.base_len)),
            Kind::Dir => 4096,
        };
        let now = SystemTime::now();
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: match kind {
                Kind::File => FileType::RegularFile,
                Kind::Dir => FileType::Directory,
            },
            perm: self.perm.get(&ino).copied().unwrap_or(0o644),
            nlink: 1,
            uid: self.owner.0,
            gid: self.owner.1,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn create(&mut self, parent: Ino, name: &OsStr, kind: Kind, mode: u32) -> Result<FileAttr, Errno> {
        let ino = self.names.create(parent, name, kind).map_err(errno)?;
        self.perm.insert(ino, (mode & 0o7777) as u16);
        if kind == Kind::File {
            let path = self.backing.join(ino.to_string());
            let base = File::options().read(true).write(true).create_new(true).open(path).map_err(|_| Errno::EIO)?;
            self.data.insert(ino, Data { base, base_len: 0, pending: Pending::default() });
        }
        self.touch(parent);
        self.attr(ino)
    }

    fn opened(&mut self, ino: Ino) -> FileHandle {
        *self.open.entry(ino).or_default() += 1;
        self.next_fh += 1;
        FileHandle(self.next_fh)
    }

    /// A handle opened before the last power cut is dead.
    fn live(&self, fh: FileHandle) -> Result<(), Errno> {
        if fh.0 < self.first_fh {
            return Err(Errno::EIO);
        }
        Ok(())
    }

    fn data(&mut self, ino: Ino) -> Result<&mut Data, Errno> {
        match self.names.kind(ino) {
            Some(Kind::File) => self.data.get_mut(&ino).ok_or(Errno::EIO),
            Some(Kind::Dir) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn sync(&mut self, ino: Ino) -> Result<(), Errno> {
        self.syncs += 1;
        match self.mode {
            Mode::Strict => self.persist(ino),
            // Acknowledged, not persisted: the writeback will, later.
            Mode::Writeback(_) => self.names.kind(ino).map(|_| ()).ok_or(Errno::ENOENT),
        }
    }
}

fn errno(r: Refused) -> Errno {
    match r {
        Refused::NotFound => Errno::ENOENT,
        Refused::Exists => Errno::EEXIST,
        Refused::NotDir => Errno::ENOTDIR,
        Refused::IsDir => Errno::EISDIR,
        Refused::NotEmpty => Errno::ENOTEMPTY,
        Refused::Invalid => Errno::EINVAL,
    }
}

/// What fuser serves: the shared state.
pub(super) struct Fs(pub(super) Arc<Mutex<State>>);

impl Fs {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = self.state();
        match s.names.lookup(parent.0, name).map_err(errno).and_then(|ino| s.attr(ino)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.state();
        let ino = ino.0;
        if let Err(e) = fh.map_or(Ok(()), |fh| s.live(fh)) {
            return reply.error(e);
        }
        if let Some(mode) = mode {
            s.perm.insert(ino, (mode & 0o7777) as u16);
        }
        if let Some(len) = size {
            match s.data(ino) {
                Ok(d) => d.pending.truncate(d.base_len, len),
                Err(e) => return reply.error(e),
            }
            s.touch(ino);
        }
        match s.attr(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        match self.state().create(parent.0, name, Kind::Dir, mode & !umask) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state();
        match s.names.remove(parent.0, name, false) {
            Ok(ino) => {
                s.touch(parent.0);
                s.collect(ino);
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state();
        match s.names.remove(parent.0, name, true) {
            Ok(_) => {
                s.touch(parent.0);
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let mut s = self.state();
        match s.names.rename(parent.0, name, newparent.0, newname) {
            Ok(replaced) => {
                s.touch(parent.0);
                s.touch(newparent.0);
                if let Some(old) = replaced {
                    s.collect(old);
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut s = self.state();
        if let Err(e) = s.data(ino.0) {
            return reply.error(e);
        }
        let fh = s.opened(ino.0);
        reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO)
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.state();
        match s.create(parent.0, name, Kind::File, mode & !umask) {
            Ok(attr) => {
                let fh = s.opened(attr.ino.0);
                reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut s = self.state();
        if let Err(e) = s.live(fh) {
            return reply.error(e);
        }
        let d = match s.data(ino.0) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let mut failed = false;
        let out = d.pending.read(d.base_len, offset, size as usize, |buf, at| {
            failed |= d.base.read_exact_at(buf, at).is_err();
        });
        if failed {
            return reply.error(Errno::EIO);
        }
        reply.data(&out)
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.state();
        if let Err(e) = s.live(fh) {
            return reply.error(e);
        }
        match s.data(ino.0) {
            Ok(d) => d.pending.write(d.base_len, offset, data),
            Err(e) => return reply.error(e),
        }
        s.touch(ino.0);
        reply.written(data.len() as u32)
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _owner: LockOwner, reply: ReplyEmpty) {
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.state().release(ino.0);
        reply.ok()
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // fsync and fdatasync alike: the data and the size (all a
        // fdatasync must persist for the data to be read back).
        let mut s = self.state();
        match s.live(fh).and_then(|()| s.sync(ino.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().names.kind(ino.0) {
            Some(Kind::Dir) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Some(Kind::File) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let s = self.state();
        let entries = match s.names.entries(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(e)),
        };
        let dots = [(".".into(), ino.0, Kind::Dir), ("..".into(), ino.0, Kind::Dir)];
        for (i, (name, ino, kind)) in dots.into_iter().chain(entries).enumerate().skip(offset as usize) {
            let kind = if kind == Kind::Dir { FileType::Directory } else { FileType::RegularFile };
            if reply.add(INodeNo(ino), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        reply.ok()
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.state().sync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096)
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok()
    }
}
