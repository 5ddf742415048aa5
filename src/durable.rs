//! Names that survive a power cut. A file's fsync makes its data durable,
//! not its name: a new directory entry (a create, a rename, a `mkdir`) is
//! durable only once its parent directory is fsync'd (POSIX; ext4 often
//! does it anyway, XFS and btrfs need not). `tests/faults/power_loss.rs` holds the
//! node's and the sidecar's directories to that.

use std::fs::File;
use std::io;
use std::path::Path;

/// `create_dir_all`, each directory it makes synced into its parent.
pub(crate) fn create_dir_all(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        // Made meanwhile by someone else, who syncs it.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) => return Err(e),
    }
    sync_dir(dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")))
}

/// fsync `dir`: the entries made in it so far become durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
