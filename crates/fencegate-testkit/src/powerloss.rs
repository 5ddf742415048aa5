//! A power-loss filesystem for tests, after Jepsen's LazyFS: a FUSE mount,
//! served in-process, that passes data through but keeps every change not
//! yet made durable in memory, and drops those changes on
//! [`PowerLossFs::power_cut`] as a power cut would. SIGKILL alone keeps the
//! page cache, so a process that skipped an fsync loses nothing; on this
//! filesystem it does.
//!
//! ## What is durable (the model)
//! POSIX-strict, the weakest a correct program may assume:
//! - A file's data and size are durable once `fsync` or `fdatasync` of the
//!   file returns (both persist data and size alike; metadata such as mode
//!   and times is not modelled and always kept). Writes and truncations
//!   since then are lost at a cut.
//! - A name is durable once `fsync` of its *parent directory* returns: a
//!   create, rename or unlink not followed by that comes undone at a cut (a
//!   renamed-over file comes back, an unlinked one too, a created one goes).
//!   A directory's own name is an entry of its parent like any other: a file
//!   in a directory whose name was never synced is gone too.
//! - ext4 (`data=ordered`) is kinder in practice: an fsync of a new file
//!   commits the journal, which carries its directory entry too, and a
//!   rename over a file flushes the new file's data first. Programs that
//!   rely on that are not portable (XFS, btrfs and ext4 with other options
//!   differ), and it is exactly what a strict model exposes.
//! - [`PowerLossFs::power_cut`] drops every unsynced write;
//!   [`PowerLossFs::power_cut_torn`] keeps a random subset of them (extents
//!   and sizes, in no order), as a disk that wrote some dirty pages back
//!   before the power went: a commit or journal append cut in the middle.
//!
//! ## The control arm
//! [`Mode::Writeback`] is the same filesystem with `fsync`/`fdatasync`
//! acknowledged but doing nothing; a background writeback persists every
//! file and directory whose changes are older than the given age (like the
//! kernel's dirty-page writeback, a whole file at a time). A power cut then
//! loses only recent writes, acknowledged or not: a test that finds no loss
//! on it cannot see one.
//!
//! Layout: the durable bytes of each file live in a backing directory (one
//! file per inode); the names, and what was written since the last sync,
//! live in memory for the life of the mount. The pure cores are
//! [`pending`] (one file's unsynced writes) and [`names`] (directories).

pub mod fs;
pub mod names;
pub mod pending;
#[cfg(test)]
mod tests;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fs::{Fs, State};

/// What `fsync` does on the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `fsync`/`fdatasync` persist; nothing else does.
    Strict,
    /// `fsync`/`fdatasync` persist nothing; a writeback persists changes
    /// older than the duration (the control arm).
    Writeback(Duration),
}

/// A mounted power-loss filesystem; unmounted on drop.
pub struct PowerLossFs {
    dir: tempfile::TempDir,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    session: Option<fuser::BackgroundSession>,
}

impl PowerLossFs {
    /// Mount a new, empty filesystem in a fresh temporary directory under
    /// `parent` (the system's when `None`). Needs `/dev/fuse` and the right
    /// to mount (root, or `fusermount3`).
    pub fn mount(parent: Option<&Path>, mode: Mode) -> io::Result<PowerLossFs> {
        let dir = match parent {
            Some(p) => tempfile::tempdir_in(p)?,
            None => tempfile::tempdir()?,
        };
        let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
        std::fs::create_dir(&backing)?;
        std::fs::create_dir(&mnt)?;
        let state = Arc::new(Mutex::new(State::new(backing, mode)));
        let mut config = fuser::Config::default();
        config.mount_options = vec![fuser::MountOption::FSName("powerloss".into())];
        let session = fuser::spawn_mount(Fs(state.clone()), &mnt, &config).map_err(|e| {
            io::Error::new(e.kind(), format!("mounting the power-loss filesystem on {}: {e}", mnt.display()))
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        if let Mode::Writeback(age) = mode {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::Builder::new().name("powerloss-writeback".into()).spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20).min(age));
                    state.lock().unwrap_or_else(|p| p.into_inner()).write_back(age);
                }
            })?;
        }
        Ok(PowerLossFs { dir, state, stop, session: Some(session) })
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    pub fn mode(&self) -> Mode {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).mode
    }

    /// Syncs (`fsync`, `fdatasync`, directory `fsync`) asked for so far.
    pub fn syncs(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).syncs
    }

    /// Drop every change not durable, as a power cut would. Kill every
    /// process using the mount first: a handle opened before the cut fails
    /// with EIO afterwards (a request of a killed process still in flight
    /// changes nothing), and names come back as they were last synced.
    pub fn power_cut(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).cut();
    }

    /// A power cut on a disk that had written some of what was not synced
    /// on its own, in any order: each unsynced extent of each file, and each
    /// file's new size, kept or dropped as `seed` draws (names stay
    /// strict). What was synced is kept, as by [`PowerLossFs::power_cut`];
    /// torn commits and torn journal tails are what this adds.
    pub fn power_cut_torn(&self, seed: u64) {
        // xorshift: no dependency for a coin.
        let mut s = seed | 1;
        let keep = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s & 1 == 1
        };
        self.state.lock().unwrap_or_else(|p| p.into_inner()).torn_cut(keep);
    }
}

impl Drop for PowerLossFs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Detached: a process still in the mount (a test that failed
        // before killing it) must not keep the unmount, and so the test,
        // from ending.
        let _ = nix::mount::umount2(&self.path(), nix::mount::MntFlags::MNT_DETACH);
        drop(self.session.take());
    }
}
