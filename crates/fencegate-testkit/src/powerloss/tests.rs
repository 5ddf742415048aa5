//! The mounted filesystem under real syscalls: what survives a cut in each
//! mode.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::time::Duration;

use super::{Mode, PowerLossFs};

fn mount(mode: Mode) -> Option<PowerLossFs> {
    Some(PowerLossFs::mount(None, mode).expect("mounting a power-loss filesystem (FUSE: root and /dev/fuse)"))
}

fn read(path: &std::path::Path) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    File::open(path).ok()?.read_to_end(&mut out).unwrap();
    Some(out)
}

fn sync_dir(path: &std::path::Path) {
    File::open(path).unwrap().sync_all().unwrap();
}

#[test]
fn strict_keeps_exactly_what_was_synced() {
    let Some(fs) = mount(Mode::Strict) else { return };
    let root = fs.path();
    fs::create_dir(root.join("node")).unwrap();
    sync_dir(&root);
    let dir = root.join("node");
    // Synced data and name.
    let mut f = File::create(dir.join("log")).unwrap();
    f.write_all(b"entry 1;").unwrap();
    f.sync_data().unwrap();
    sync_dir(&dir);
    f.write_all(b"entry 2;").unwrap();
    // A rename over a synced file, the directory not synced after it.
    fs::write(dir.join("snap"), b"old").unwrap();
    File::open(dir.join("snap")).unwrap().sync_all().unwrap();
    sync_dir(&dir);
    // A file whose data is synced but whose name is not.
    let mut g = File::create(dir.join("unnamed")).unwrap();
    g.write_all(b"data").unwrap();
    g.sync_all().unwrap();
    fs::write(dir.join("snap.partial"), b"new").unwrap();
    File::open(dir.join("snap.partial")).unwrap().sync_all().unwrap();
    fs::rename(dir.join("snap.partial"), dir.join("snap")).unwrap();
    assert_eq!(read(&dir.join("log")).unwrap(), b"entry 1;entry 2;");
    assert_eq!(read(&dir.join("snap")).unwrap(), b"new");
    drop((f, g));

    fs.power_cut();
    assert_eq!(read(&dir.join("log")).unwrap(), b"entry 1;");
    assert_eq!(read(&dir.join("unnamed")), None);
    assert_eq!(read(&dir.join("snap")).unwrap(), b"old");
    assert_eq!(read(&dir.join("snap.partial")), None);

    // Appends and truncation after the cut, synced this time.
    let mut f = OpenOptions::new().append(true).open(dir.join("log")).unwrap();
    f.write_all(b"entry 3;").unwrap();
    f.set_len(4).unwrap();
    f.write_all(b"!").unwrap();
    f.sync_data().unwrap();
    drop(f);
    fs.power_cut();
    assert_eq!(read(&dir.join("log")).unwrap(), b"entr!");
    assert!(fs.syncs() > 0);
}

#[test]
fn writeback_acknowledges_syncs_and_persists_only_what_is_old_enough() {
    let Some(fs) = mount(Mode::Writeback(Duration::from_millis(300))) else { return };
    let root = fs.path();
    let mut f = File::create(root.join("log")).unwrap();
    f.write_all(b"old;").unwrap();
    f.sync_all().unwrap();
    sync_dir(&root);
    std::thread::sleep(Duration::from_millis(700));
    f.write_all(b"new;").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs.power_cut();
    assert_eq!(read(&root.join("log")).unwrap(), b"old;", "the synced but recent write is lost");
}

#[test]
fn a_handle_from_before_a_cut_is_dead() {
    let Some(fs) = mount(Mode::Strict) else { return };
    let mut f = File::create(fs.path().join("f")).unwrap();
    sync_dir(&fs.path());
    fs.power_cut();
    assert!(f.write_all(b"late").is_err());
    assert_eq!(read(&fs.path().join("f")).unwrap(), b"");
}
