//! The power-loss filesystem's namespace: the pure core of its directories.
//! Each directory has the entries the processes see and the entries a power
//! cut leaves, which become the seen ones when the directory itself is
//! synced (`fsync` of the directory): POSIX-strict, a create, rename or
//! unlink is durable only after its parent directory is synced. No IO.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};

pub type Ino = u64;
pub const ROOT: Ino = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// Why an operation was refused (each maps to an errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    Invalid,
}

#[derive(Debug)]
struct Node {
    kind: Kind,
    /// Names in the seen entries of directories.
    links: u32,
    /// Names in the durable entries of directories.
    durable_links: u32,
    /// A directory's entries as seen, and as a power cut leaves them.
    entries: BTreeMap<OsString, Ino>,
    durable: BTreeMap<OsString, Ino>,
}

#[derive(Debug)]
pub struct Names {
    nodes: HashMap<Ino, Node>,
    next: Ino,
}

impl Default for Names {
    fn default() -> Self {
        let root =
            Node { kind: Kind::Dir, links: 1, durable_links: 1, entries: BTreeMap::new(), durable: BTreeMap::new() };
        Names { nodes: HashMap::from([(ROOT, root)]), next: ROOT + 1 }
    }
}

impl Names {
    pub fn kind(&self, ino: Ino) -> Option<Kind> {
        self.nodes.get(&ino).map(|n| n.kind)
    }

    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Ino, Refused> {
        self.dir(parent)?.entries.get(name).copied().ok_or(Refused::NotFound)
    }

    /// The seen entries of a directory, in name order.
    pub fn entries(&self, dir: Ino) -> Result<Vec<(OsString, Ino, Kind)>, Refused> {
        Ok(self.dir(dir)?.entries.iter().map(|(n, i)| (n.clone(), *i, self.nodes[i].kind)).collect())
    }

    /// `creat`/`mkdir`: a new inode under a new name (not durable yet).
    pub fn create(&mut self, parent: Ino, name: &OsStr, kind: Kind) -> Result<Ino, Refused> {
        check_name(name)?;
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(Refused::Exists);
        }
        let ino = self.next;
        self.next += 1;
        let node = Node { kind, links: 1, durable_links: 0, entries: BTreeMap::new(), durable: BTreeMap::new() };
        self.nodes.insert(ino, node);
        self.dir_mut(parent)?.entries.insert(name.to_os_string(), ino);
        Ok(ino)
    }

    /// `unlink` (`dir: false`) or `rmdir` (`dir: true`); returns the inode.
    pub fn remove(&mut self, parent: Ino, name: &OsStr, dir: bool) -> Result<Ino, Refused> {
        let ino = self.lookup(parent, name)?;
        match (self.nodes[&ino].kind, dir) {
            (Kind::Dir, false) => return Err(Refused::IsDir),
            (Kind::File, true) => return Err(Refused::NotDir),
            (Kind::Dir, true) if !self.nodes[&ino].entries.is_empty() => return Err(Refused::NotEmpty),
            _ => {}
        }
        self.dir_mut(parent)?.entries.remove(name);
        self.node_mut(ino).links -= 1;
        Ok(ino)
    }

    /// `rename(2)`, replacing the target if there is one (returned).
    pub fn rename(&mut self, from: Ino, name: &OsStr, to: Ino, new: &OsStr) -> Result<Option<Ino>, Refused> {
        check_name(new)?;
        let ino = self.lookup(from, name)?;
        self.dir(to)?;
        if (from, name) == (to, new) {
            return Ok(None);
        }
        if self.nodes[&ino].kind == Kind::Dir && (ino == to || self.is_below(to, ino)) {
            return Err(Refused::Invalid);
        }
        let replaced = self.dir(to)?.entries.get(new).copied();
        if let Some(old) = replaced {
            match (self.nodes[&ino].kind, self.nodes[&old].kind) {
                (Kind::File, Kind::Dir) => return Err(Refused::IsDir),
                (Kind::Dir, Kind::File) => return Err(Refused::NotDir),
                (Kind::Dir, Kind::Dir) if !self.nodes[&old].entries.is_empty() => return Err(Refused::NotEmpty),
                _ => {}
            }
            self.node_mut(old).links -= 1;
        }
        self.dir_mut(from)?.entries.remove(name);
        self.dir_mut(to)?.entries.insert(new.to_os_string(), ino);
        Ok(replaced)
    }

    /// `fsync` of a directory: its seen entries become durable.
    pub fn sync_dir(&mut self, dir: Ino) -> Result<(), Refused> {
        let d = self.dir(dir)?;
        let (old, new) = (d.durable.clone(), d.entries.clone());
        for ino in old.values() {
            self.node_mut(*ino).durable_links -= 1;
        }
        for ino in new.values() {
            self.node_mut(*ino).durable_links += 1;
        }
        self.dir_mut(dir)?.durable = new;
        Ok(())
    }

    /// No name, seen or durable, refers to `ino` any more: nothing can
    /// reach it but a handle already open.
    pub fn is_orphan(&self, ino: Ino) -> bool {
        self.nodes.get(&ino).is_some_and(|n| ino != ROOT && n.links == 0 && n.durable_links == 0)
    }

    /// Forget an orphan (its last handle closed).
    pub fn forget(&mut self, ino: Ino) {
        if self.is_orphan(ino) && self.nodes[&ino].kind == Kind::File {
            self.nodes.remove(&ino);
        }
    }

    /// A power cut: every directory's entries become its durable ones, and
    /// whatever no durable name reaches from the root is gone (returned).
    pub fn cut(&mut self) -> Vec<Ino> {
        for n in self.nodes.values_mut() {
            n.entries = n.durable.clone();
        }
        let mut reached = HashSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(d) = todo.pop() {
            for ino in self.nodes[&d].entries.values() {
                if reached.insert(*ino) {
                    todo.push(*ino);
                }
            }
        }
        let gone: Vec<Ino> = self.nodes.keys().filter(|i| !reached.contains(i)).copied().collect();
        for ino in &gone {
            self.nodes.remove(ino);
        }
        for n in self.nodes.values_mut() {
            n.links = 0;
            n.durable_links = 0;
        }
        let counted: Vec<Ino> = self.nodes.values().flat_map(|n| n.entries.values().copied()).collect();
        for ino in counted {
            let n = self.node_mut(ino);
            n.links += 1;
            n.durable_links += 1;
        }
        let root = self.node_mut(ROOT);
        root.links = 1;
        root.durable_links = 1;
        gone
    }

    fn is_below(&self, ino: Ino, dir: Ino) -> bool {
        let mut todo = vec![dir];
        while let Some(d) = todo.pop() {
            for i in self.nodes[&d].entries.values() {
                if *i == ino {
                    return true;
                }
                if self.nodes[i].kind == Kind::Dir {
                    todo.push(*i);
                }
            }
        }
        false
    }

    fn dir(&self, ino: Ino) -> Result<&Node, Refused> {
        match self.nodes.get(&ino) {
            Some(n) if n.kind == Kind::Dir => Ok(n),
            Some(_) => Err(Refused::NotDir),
            None => Err(Refused::NotFound),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> Result<&mut Node, Refused> {
        self.dir(ino)?;
        Ok(self.node_mut(ino))
    }

    fn node_mut(&mut self, ino: Ino) -> &mut Node {
        self.nodes.get_mut(&ino).expect("a known inode")
    }
}

fn check_name(name: &OsStr) -> Result<(), Refused> {
    if name.is_empty() || name == "." || name == ".." || name.len() > 255 {
        return Err(Refused::Invalid);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &Names, dir: Ino) -> Vec<String> {
        n.entries(dir).unwrap().into_iter().map(|(s, ..)| s.into_string().unwrap()).collect()
    }

    #[test]
    fn a_new_name_is_durable_only_once_its_directory_is_synced() {
        let mut n = Names::default();
        let a = n.create(ROOT, "a".as_ref(), Kind::File).unwrap();
        n.create(ROOT, "b".as_ref(), Kind::File).unwrap();
        assert_eq!(n.cut().len(), 2);
        assert_eq!(names(&n, ROOT), Vec::<String>::new());
        let gone = {
            let a2 = n.create(ROOT, "a".as_ref(), Kind::File).unwrap();
            assert_ne!(a, a2, "inode numbers are not reused");
            n.sync_dir(ROOT).unwrap();
            n.create(ROOT, "c".as_ref(), Kind::File).unwrap();
            n.cut()
        };
        assert_eq!(gone.len(), 1);
        assert_eq!(names(&n, ROOT), ["a"]);
    }

    #[test]
    fn an_unsynced_rename_comes_undone_at_a_cut() {
        let mut n = Names::default();
        let old = n.create(ROOT, "snapshot".as_ref(), Kind::File).unwrap();
        n.sync_dir(ROOT).unwrap();
        let new = n.create(ROOT, "snapshot.partial".as_ref(), Kind::File).unwrap();
        assert_eq!(n.rename(ROOT, "snapshot.partial".as_ref(), ROOT, "snapshot".as_ref()), Ok(Some(old)));
        assert!(!n.is_orphan(old), "its durable name still holds it");
        assert_eq!(n.lookup(ROOT, "snapshot".as_ref()), Ok(new));
        assert_eq!(n.cut(), vec![new]);
        assert_eq!(n.lookup(ROOT, "snapshot".as_ref()), Ok(old));
        // Synced this time.
        let new = n.create(ROOT, "snapshot.partial".as_ref(), Kind::File).unwrap();
        n.rename(ROOT, "snapshot.partial".as_ref(), ROOT, "snapshot".as_ref()).unwrap();
        n.sync_dir(ROOT).unwrap();
        assert!(n.is_orphan(old));
        assert_eq!(n.cut(), vec![old]);
        assert_eq!(n.lookup(ROOT, "snapshot".as_ref()), Ok(new));
    }

    #[test]
    fn an_unsynced_unlink_comes_undone_and_a_directory_needs_its_own_name_synced() {
        let mut n = Names::default();
        let d = n.create(ROOT, "node-1".as_ref(), Kind::Dir).unwrap();
        let f = n.create(d, "raft.redb".as_ref(), Kind::File).unwrap();
        n.sync_dir(d).unwrap();
        // The file's name is durable in `d`, but `d` has no durable name.
        let mut gone = n.cut();
        gone.sort();
        assert_eq!(gone, vec![d, f]);
        let d = n.create(ROOT, "node-1".as_ref(), Kind::Dir).unwrap();
        n.sync_dir(ROOT).unwrap();
        let f = n.create(d, "raft.redb".as_ref(), Kind::File).unwrap();
        n.sync_dir(d).unwrap();
        n.remove(d, "raft.redb".as_ref(), false).unwrap();
        assert_eq!(n.remove(ROOT, "node-1".as_ref(), true), Ok(d));
        assert_eq!(n.cut(), Vec::<Ino>::new());
        assert_eq!(n.lookup(d, "raft.redb".as_ref()), Ok(f));
    }

    #[test]
    fn refusals() {
        let mut n = Names::default();
        let d = n.create(ROOT, "d".as_ref(), Kind::Dir).unwrap();
        n.create(d, "f".as_ref(), Kind::File).unwrap();
        assert_eq!(n.create(ROOT, "d".as_ref(), Kind::File), Err(Refused::Exists));
        assert_eq!(n.remove(ROOT, "d".as_ref(), true), Err(Refused::NotEmpty));
        assert_eq!(n.remove(ROOT, "d".as_ref(), false), Err(Refused::IsDir));
        assert_eq!(n.remove(d, "f".as_ref(), true), Err(Refused::NotDir));
        assert_eq!(n.rename(ROOT, "d".as_ref(), d, "x".as_ref()), Err(Refused::Invalid));
        assert_eq!(n.lookup(ROOT, "nope".as_ref()), Err(Refused::NotFound));
    }
}
