//! Who holds a lock that kazoo's `Lock` or Curator's `InterProcessMutex`
//! takes, from the children of its znode. Pure: no IO.
//!
//! Each contender creates an ephemeral sequential child of the lock's znode
//! (kazoo: `<uuid>__lock__0000000012`, Curator: `_c_<uuid>-lock-0000000012`)
//! and holds the lock once no child with a lower sequence number is left:
//! the holder is the child whose name ends in the lowest sequence number.
//! Children whose names end in no sequence number are no contenders.
//!
//! The token is not the sequence number but the holder's `czxid`, the zxid
//! of the transaction that created it (docs/decisions/0010): the sequence
//! restarts at 0 when the lock's znode is deleted and made again (Curator
//! makes it a container, which ZooKeeper deletes once empty), and the first
//! holder's is 0, which no fencing token is. A zxid only rises, over every
//! znode of the ensemble, and within one lock znode creation order is
//! sequence order: successive holders' czxids strictly rise.

/// How many digits ZooKeeper appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;

/// The znode of lock key `key` (`locks/rack-42` → `/locks/rack-42`): a
/// lock key never starts with `/`, and is a valid znode path without it
/// (segments of `[A-Za-z0-9._:-]`, never `.` or `..`).
pub(crate) fn znode(key: &str) -> String {
    format!("/{key}")
}

/// The sequence number `child`'s name ends in, if it is a contender's.
pub(crate) fn sequence(child: &str) -> Option<u32> {
    let digits = child.len().checked_sub(SEQUENCE_DIGITS).and_then(|at| child.get(at..))?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The contender that holds the lock: the child with the lowest sequence
/// number (by name among equals, which one znode's children never are).
pub(crate) fn first(children: &[String]) -> Option<&str> {
    children.iter().filter_map(|c| Some((sequence(c)?, c.as_str()))).min().map(|(_, c)| c)
}

/// The znodes above `path` (`/a/b/c` → `/a/b`, `/a`, `/`), deepest first.
pub(crate) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(path);
    std::iter::from_fn(move || {
        let (above, _) = rest?.rsplit_once('/')?;
        let above = if above.is_empty() { "/" } else { above };
        rest = (above != "/").then_some(above);
        Some(above)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_holder_is_the_lowest_sequence_of_either_recipe() {
        let kazoo = names(&["b7f1__lock__0000000012", "a0c2__lock__0000000009", "e3d4__lock__0000000031"]);
        assert_eq!(first(&kazoo), Some("a0c2__lock__0000000009"));
        let curator = names(&["_c_9f-lock-0000000003", "_c_1a-lock-0000000002"]);
        assert_eq!(first(&curator), Some("_c_1a-lock-0000000002"));
        assert_eq!(sequence("_c_1a-lock-0000000002"), Some(2));
    }

    #[test]
    fn a_child_without_a_sequence_is_no_contender() {
        let children = names(&["leases", "lock-12", "x__lock__00000000x1", "z__lock__0000000040"]);
        assert_eq!(first(&children), Some("z__lock__0000000040"));
        assert_eq!(first(&names(&["leases", "0123456789x"])), None);
        assert_eq!(first(&[]), None);
        assert_eq!(sequence("123"), None);
        assert_eq!(sequence("9999999999"), None, "above i32: ZooKeeper never writes it");
        assert_eq!(sequence("é__lock__0000000001"), Some(1));
    }

    #[test]
    fn ancestors_go_up_to_the_root() {
        assert_eq!(ancestors("/locks/rack/42").collect::<Vec<_>>(), ["/locks/rack", "/locks", "/"]);
        assert_eq!(ancestors("/locks").collect::<Vec<_>>(), ["/"]);
        assert_eq!(znode("locks/rack-42"), "/locks/rack-42");
    }
}
