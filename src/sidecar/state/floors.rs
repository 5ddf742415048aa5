//! Per-key floors: the highest token this sidecar has forwarded for each key,
//! kept in the state store (`state.rs`) so that a restarted sidecar still
//! refuses what it refused before (S2), even while the lock service is down.
//!
//! A new, higher floor is fsync'd before the first request carrying it is
//! forwarded; concurrent raises (and idempotency records) share one write
//! transaction.
//!
//! Knows nothing of what tokens mean, only that floors never go down.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::lock::state::Token;
use crate::sidecar::state::{Store, StoreError, Write};

pub(crate) struct Floors {
    /// What is durable (or being made durable right now).
    known: Mutex<HashMap<String, Token>>,
    store: Arc<Store>,
}

impl Floors {
    /// The floors `store` held when it was opened.
    pub(crate) fn new(store: Arc<Store>, loaded: HashMap<String, Token>) -> Self {
        Floors { known: Mutex::new(loaded), store }
    }

    pub(crate) fn get(&self, key: &str) -> Token {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied().unwrap_or(0)
    }

    pub(crate) fn len(&self) -> usize {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// At most `limit` keys' floors, by key, and how many keys have one.
    /// Under the lock every fenced request takes: one linear pass, and only
    /// the `limit` keys shown are sorted and copied.
    pub(crate) fn first(&self, limit: usize) -> (Vec<(String, Token)>, usize) {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let mut keys: Vec<(&String, &Token)> = known.iter().collect();
        if keys.len() > limit && limit > 0 {
            keys.select_nth_unstable(limit - 1);
        }
        keys.truncate(limit);
        keys.sort_unstable();
        (keys.into_iter().map(|(k, t)| (k.clone(), *t)).collect(), known.len())
    }

    /// Make `token` the durable floor of `key` if it is higher; returns once
    /// it is on disk, whether it rose.
    pub(crate) async fn raise(&self, key: &str, token: Token) -> Result<bool, StoreError> {
        if self.get(key) >= token {
            return Ok(false);
        }
        self.store.write(Write::Floor(key.to_string(), token)).await?;
        // Two requests with one token may both have written it: only the
        // first to get here raised it.
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let floor = known.entry(key.to_string()).or_default();
        let rose = *floor < token;
        *floor = (*floor).max(token);
        Ok(rose)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn floors_survive_a_restart_and_never_go_down() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, loaded) = Store::open(dir.path()).unwrap();
            let f = Floors::new(Arc::new(store), loaded.floors);
            assert!(f.raise("rack/42", 34).await.unwrap());
            assert!(!f.raise("rack/42", 33).await.unwrap(), "never down");
            f.raise("rack/7", 5).await.unwrap();
            assert_eq!(f.get("rack/42"), 34);
        }
        // The writer task closes the database once the store is dropped.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let (store, loaded) = Store::open(dir.path()).unwrap();
        let f = Floors::new(Arc::new(store), loaded.floors);
        assert_eq!((f.get("rack/42"), f.get("rack/7"), f.get("other")), (34, 5, 0));
    }

    #[test]
    fn the_first_keys_are_the_least_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let loaded = (0..50u64).map(|i| (format!("rack/{:02}", (i * 37) % 50), i)).collect();
        let f = Floors::new(Arc::new(store), loaded);
        let (first, keys) = f.first(3);
        let names: Vec<&str> = first.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!((names, keys), (vec!["rack/00", "rack/01", "rack/02"], 50));
        assert_eq!(f.first(80).0.len(), 50);
        assert!(f.first(0).0.is_empty());
    }
}
