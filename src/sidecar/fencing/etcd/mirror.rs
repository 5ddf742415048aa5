//! The keys under one followed prefix, as a list at some revision and the
//! watch's events after it left them, and who holds each lock among them.
//! Pure: no IO, no clock.
//!
//! `etcdctl lock NAME` (Go's `concurrency.Mutex`) puts `NAME/<lease id in
//! hex>`, and its holder is the key with the lowest create revision under
//! `NAME/` — nested names included, as in the recipe (a key of lock
//! `rack/42/x` also waits its turn under `rack/42`). So a key's event
//! concerns the lock its name ends in (the name without its last segment)
//! and every lock above it that is asked about.

use std::collections::BTreeMap;

/// One change the watch delivered: `key` created at `create_revision`
/// (a put), or deleted (a delete, `create_revision` 0), at `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub key: String,
    pub create_revision: u64,
    pub deleted: bool,
    pub revision: u64,
}

/// Who holds a lock at some revision: the least create revision under its
/// prefix, or nobody.
pub(crate) type Holder = Option<u64>;

#[derive(Debug, Default)]
pub(crate) struct Mirror {
    /// Key → its create revision.
    keys: BTreeMap<String, u64>,
}

impl Mirror {
    /// The keys a list returned, with their create revisions.
    pub(crate) fn new(keys: impl IntoIterator<Item = (String, u64)>) -> Mirror {
        Mirror { keys: keys.into_iter().collect() }
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Apply one change; the locks it may have changed the holder of: the
    /// one its key belongs to, and the ones above it among `asked`.
    pub(crate) fn apply(&mut self, change: &Change, asked: impl Fn(&str) -> bool) -> Vec<String> {
        if change.deleted {
            self.keys.remove(&change.key);
        } else {
            // A put on an existing key (its value or lease changed) keeps
            // the revision it was created at.
            self.keys.entry(change.key.clone()).or_insert(change.create_revision);
        }
        let mut locks = Vec::new();
        let mut name = lock_of(&change.key);
        let mut own = true;
        while let Some(n) = name {
            if own || asked(n) {
                locks.push(n.to_string());
            }
            own = false;
            name = lock_of(n);
        }
        locks
    }

    /// Who holds lock `name`: the least create revision under `name/`.
    pub(crate) fn holder(&self, name: &str) -> Holder {
        let prefix = format!("{name}/");
        self.keys.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(&prefix)).map(|(_, &rev)| rev).min()
    }

    /// Every lock a key of the mirror belongs to (each key's name without
    /// its last segment).
    pub(crate) fn locks(&self) -> impl Iterator<Item = &str> {
        let mut last: Option<&str> = None;
        self.keys.keys().filter_map(move |k| {
            let name = lock_of(k)?;
            (last != Some(name)).then(|| {
                last = Some(name);
                name
            })
        })
    }
}

/// The lock `key` belongs to: its name without the last `/segment`.
pub(crate) fn lock_of(key: &str) -> Option<&str> {
    key.rsplit_once('/').map(|(name, _)| name).filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, rev: u64) -> Change {
        Change { key: key.into(), create_revision: rev, deleted: false, revision: rev }
    }

    fn delete(key: &str) -> Change {
        Change { key: key.into(), create_revision: 0, deleted: true, revision: 99 }
    }

    #[test]
    fn the_holder_is_the_least_create_revision_and_the_next_one_takes_over() {
        let mut m = Mirror::new([("rack/42/a1".to_string(), 9), ("rack/7/b2".to_string(), 4)]);
        assert_eq!((m.holder("rack/42"), m.holder("rack/7"), m.holder("rack/4")), (Some(9), Some(4), None));
        assert_eq!(m.apply(&put("rack/42/c3", 12), |_| false), ["rack/42"]);
        assert_eq!(m.holder("rack/42"), Some(9), "a waiter holds nothing");
        m.apply(&delete("rack/42/a1"), |_| false);
        assert_eq!(m.holder("rack/42"), Some(12), "the waiter takes over");
        m.apply(&delete("rack/42/c3"), |_| false);
        assert_eq!(m.holder("rack/42"), None);
        // `rack/420/…` is not under `rack/42/`.
        m.apply(&put("rack/420/d4", 15), |_| false);
        assert_eq!(m.holder("rack/42"), None);
    }

    #[test]
    fn a_put_on_a_held_key_keeps_its_create_revision() {
        let mut m = Mirror::new([("rack/42/a1".to_string(), 9)]);
        m.apply(&put("rack/42/a1", 20), |_| false);
        assert_eq!(m.holder("rack/42"), Some(9));
    }

    /// As in etcd's recipe: a nested lock's key waits its turn under the
    /// lock above it, which is told of the change when it was asked about.
    #[test]
    fn a_nested_key_concerns_the_locks_above_it_that_were_asked() {
        let mut m = Mirror::default();
        let asked = |n: &str| n == "rack";
        assert_eq!(m.apply(&put("rack/42/x/e5", 3), asked), ["rack/42/x", "rack"]);
        assert_eq!((m.holder("rack/42/x"), m.holder("rack/42"), m.holder("rack")), (Some(3), Some(3), Some(3)));
        m.apply(&put("rack/42/f6", 8), asked);
        assert_eq!(m.holder("rack/42"), Some(3));
        assert_eq!(m.locks().collect::<Vec<_>>(), ["rack/42", "rack/42/x"]);
        assert_eq!(lock_of("solo"), None);
        assert_eq!(lock_of("/x"), None);
    }
}
