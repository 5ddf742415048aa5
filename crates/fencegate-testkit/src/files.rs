//! Data directories as tests handle them: copied whole (a node's holds
//! `log/`; a ZooKeeper server's, `version-2/`).

use std::path::Path;

/// `from`'s files, copied into a new directory `to` (subdirectories too).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        match entry.file_type().unwrap().is_dir() {
            true => copy_dir(&entry.path(), &target),
            false => drop(std::fs::copy(entry.path(), target).unwrap()),
        }
    }
}
