//! State is the process's alone. What a node and a sidecar keep (the Raft
//! log and snapshots, floors, idempotency records holding upstream answers)
//! and backups are read by nobody else: the commands that write them run
//! with umask 077, so every file and directory they create, whichever
//! library creates it (redb), is 0600 or 0700. State left more open by an
//! earlier build is tightened at start, and said so.
//!
//! `own_files_only` sets the umask; `cli::run` calls it before any thread
//! starts, for the commands that write state. `tighten` makes the files in
//! `data_dir`/`state_dir` 0600 at start (the directory is only warned about).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::sys::stat::{umask, Mode};

/// Group and other bits.
const OPEN: u32 = 0o077;

/// From here on, files and directories this process creates are its own
/// (0600, 0700). Called before the runtime starts any thread.
pub(crate) fn own_files_only() {
    umask(Mode::from_bits_truncate(OPEN));
}

/// Take group and other access away from the files directly in `dir`, the
/// state a previous build may have left readable (files other processes
/// might make there are not expected: the directory is fencegate's). The
/// directory itself is left as the operator made it, with a warning if
/// others may enter it.
pub(crate) fn tighten(dir: &Path) -> std::io::Result<()> {
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & OPEN != 0 {
        tracing::warn!(dir = %dir.display(), mode = format!("{:o}", mode & 0o777), "others may enter this state directory: chmod 700 it");
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let mode = meta.permissions().mode();
        if meta.is_file() && mode & OPEN != 0 {
            let path = entry.path();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & !OPEN & 0o7777))?;
            tracing::warn!(file = %path.display(), was = format!("{:o}", mode & 0o777), "made 0600: state is this process's alone");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_files_are_tightened_and_the_directory_left() {
        let dir = tempfile::tempdir().unwrap();
        let (file, own, sub) = (dir.path().join("raft.redb"), dir.path().join("admin-token"), dir.path().join("sub"));
        std::fs::write(&file, b"x").unwrap();
        std::fs::write(&own, b"x").unwrap();
        std::fs::create_dir(&sub).unwrap();
        let set = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        set(&file, 0o644);
        set(&own, 0o400);
        set(&sub, 0o755);
        set(dir.path(), 0o755);
        tighten(dir.path()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&file), mode(&own), mode(&sub), mode(dir.path())), (0o600, 0o400, 0o755, 0o755));
    }
}
