//! A map from strings split over many small hash maps, so that growing it
//! rehashes one small map, never all of it: the idempotency index grows
//! under its lock, in the request path, and a single map of 114,000
//! records took 28 ms to double (measured in `bench/idempotency.rs`),
//! stalling every keyed request behind it. Split 256 ways, a doubling moves
//! 1/256th of the records.
//!
//! Each shard has its own `RandomState`, and the shard is picked by yet
//! another: keys come from clients, so where they land must not be
//! predictable (no aimed collisions), and a shard's own hash must not be
//! the one that picked it (its keys would all share those bits).

use std::collections::hash_map::{self, RandomState};
use std::collections::HashMap;
use std::hash::BuildHasher;

pub const SHARDS: usize = 256;

pub struct Sharded<V> {
    pick: RandomState,
    shards: Vec<HashMap<String, V>>,
    len: usize,
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Sharded { pick: RandomState::new(), shards: (0..SHARDS).map(|_| HashMap::new()).collect(), len: 0 }
    }
}

impl<V> Sharded<V> {
    fn shard(&self, key: &str) -> usize {
        self.pick.hash_one(key) as usize % SHARDS
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.shards[self.shard(key)].get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let i = self.shard(key);
        self.shards[i].get_mut(key)
    }

    /// The value `key` had, if any.
    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        let i = self.shard(&key);
        let old = self.shards[i].insert(key, value);
        self.len += usize::from(old.is_none());
        old
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let i = self.shard(key);
        let old = self.shards[i].remove(key);
        self.len -= usize::from(old.is_some());
        old
    }

    /// The entries of shard `i` (of `SHARDS`), in no particular order.
    pub fn shard_entries(&self, i: usize) -> impl Iterator<Item = (&String, &V)> {
        self.shards[i].iter()
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.shards.iter().flat_map(hash_map::HashMap::iter)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u32),
        Remove(u8),
        Change(u8, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u8>(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            any::<u8>().prop_map(Op::Remove),
            (any::<u8>(), any::<u32>()).prop_map(|(k, v)| Op::Change(k, v)),
        ]
    }

    proptest! {
        /// The same answers as one `HashMap` given the same changes.
        #[test]
        fn behaves_as_one_map(ops in proptest::collection::vec(op(), 0..400)) {
            let (mut sharded, mut model) = (Sharded::default(), HashMap::new());
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(sharded.insert(k.to_string(), v), model.insert(k.to_string(), v)),
                    Op::Remove(k) => prop_assert_eq!(sharded.remove(&k.to_string()), model.remove(&k.to_string())),
                    Op::Change(k, v) => {
                        let (a, b) = (sharded.get_mut(&k.to_string()), model.get_mut(&k.to_string()));
                        prop_assert_eq!(a.is_some(), b.is_some());
                        if let (Some(a), Some(b)) = (a, b) {
                            (*a, *b) = (v, v);
                        }
                    }
                }
                prop_assert_eq!(sharded.len(), model.len());
            }
            let mut all: Vec<_> = sharded.iter().map(|(k, v)| (k.clone(), *v)).collect();
            all.sort();
            let mut expected: Vec<_> = model.into_iter().collect();
            expected.sort();
            prop_assert_eq!(all, expected);
        }
    }

    #[test]
    fn keys_spread_over_the_shards() {
        let mut m = Sharded::default();
        for i in 0..(SHARDS * 64) {
            m.insert(format!("rack/1\nkey-{i}"), ());
        }
        // So that growing one shard rehashes a small part: none holds more
        // than four times its share.
        let biggest = m.shards.iter().map(HashMap::len).max().unwrap();
        assert!(biggest < 4 * 64, "{biggest}");
        assert_eq!(m.len(), SHARDS * 64);
    }
}
