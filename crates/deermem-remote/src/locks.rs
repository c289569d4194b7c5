//! [`KeyedLocks`]: one async lock per key (a session, a user), held weakly so that an entry
//! disappears once nothing uses it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Async locks by key. An entry lives while a caller holds its `Arc`.
#[derive(Debug, Default)]
pub struct KeyedLocks {
    map: parking_lot::Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    /// The lock of `key` (created on first use).
    pub fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.map.lock();
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(lock) = map.get(key).and_then(Weak::upgrade) {
            return lock;
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key.to_owned(), Arc::downgrade(&lock));
        lock
    }

    /// How many locks are still referenced.
    pub fn live(&self) -> usize {
        let mut map = self.map.lock();
        map.retain(|_, w| w.strong_count() > 0);
        map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_lock_per_key_released_when_unused() {
        let locks = KeyedLocks::default();
        let a = locks.get("a");
        let a2 = locks.get("a");
        assert!(Arc::ptr_eq(&a, &a2));
        let b = locks.get("b");
        assert!(!Arc::ptr_eq(&a, &b));
        let held = a.lock().await;
        assert!(a2.try_lock().is_err(), "the same key shares one lock");
        assert!(b.try_lock().is_ok(), "other keys do not wait");
        drop(held);
        assert_eq!(locks.live(), 2);
        drop((a, a2, b));
        assert_eq!(locks.live(), 0);
    }
}
