//! The decoded vectors of recently ranked scopes, bounded in bytes and checked against the
//! scope's write stamp (`scope_gen`, bumped by triggers on every write) before each use.
//!
//! A ranking by meaning reads every vector of the scopes it ranks. Read from SQLite, that is
//! one B-tree row and one blob copy and decode per document on every search; held here, a
//! repeated search of a scope costs one indexed lookup of its stamp. The stamp is written by
//! triggers in the database itself, so a write by another process (or an older binary) changes
//! it as surely as one of ours; it is random, so a scope key reused after the index was emptied
//! or recreated never meets an entry of its predecessor.

use std::sync::Arc;

use deermem_core::policy::language::ScriptGroup;

/// The vectors of one scope for one model and dimension, as of one stamp.
#[derive(Debug, Default)]
pub(crate) struct ScopeVectors {
    /// The scope's write stamp these were read at.
    pub(crate) stamp: i64,
    /// Per ranked document: fact id, category and script group (same order as `flat`).
    pub(crate) docs: Vec<(String, String, ScriptGroup)>,
    /// The vectors of `docs`, one after another, `dim` numbers each.
    pub(crate) flat: Vec<f32>,
    /// Some document of the scope has no current vector of the model.
    pub(crate) missing: bool,
}

impl ScopeVectors {
    /// What the entry holds in memory, roughly (the bound is counted with this).
    fn bytes(&self) -> usize {
        let docs: usize = self
            .docs
            .iter()
            .map(|(id, cat, _)| id.len() + cat.len() + 56)
            .sum();
        self.flat.len() * 4 + docs + 96
    }
}

/// Cache key: scope key, model id and dimension.
type Key = (i64, String, usize);

/// A least-recently-used map of [`ScopeVectors`] holding at most `max_bytes`.
pub(crate) struct VectorCache {
    map: lru::LruCache<Key, Arc<ScopeVectors>>,
    bytes: usize,
    max_bytes: usize,
}

impl VectorCache {
    /// An empty cache that keeps at most `max_bytes` (0 keeps nothing).
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            map: lru::LruCache::unbounded(),
            bytes: 0,
            max_bytes,
        }
    }

    /// The entry of the scope when it was read at `stamp`; an entry of another stamp is dropped.
    pub(crate) fn get(
        &mut self,
        scope_key: i64,
        model_id: &str,
        dim: usize,
        stamp: i64,
    ) -> Option<Arc<ScopeVectors>> {
        let key = (scope_key, model_id.to_owned(), dim);
        match self.map.get(&key) {
            Some(entry) if entry.stamp == stamp => Some(Arc::clone(entry)),
            Some(_) => {
                if let Some(old) = self.map.pop(&key) {
                    self.bytes = self.bytes.saturating_sub(old.bytes());
                }
                None
            }
            None => None,
        }
    }

    /// Keeps `entry`, evicting the least recently used ones beyond the bound; an entry larger
    /// than the whole bound is not kept.
    pub(crate) fn put(
        &mut self,
        scope_key: i64,
        model_id: &str,
        dim: usize,
        entry: Arc<ScopeVectors>,
    ) {
        let size = entry.bytes();
        if size > self.max_bytes {
            return;
        }
        if let Some(old) = self.map.put((scope_key, model_id.to_owned(), dim), entry) {
            self.bytes = self.bytes.saturating_sub(old.bytes());
        }
        self.bytes += size;
        while self.bytes > self.max_bytes {
            match self.map.pop_lru() {
                Some((_, old)) => self.bytes = self.bytes.saturating_sub(old.bytes()),
                None => {
                    self.bytes = 0;
                    break;
                }
            }
        }
    }

    /// Forgets everything (the file was recreated).
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
    }

    /// Bytes held now.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(stamp: i64, n: usize) -> Arc<ScopeVectors> {
        Arc::new(ScopeVectors {
            stamp,
            docs: (0..n)
                .map(|i| (format!("f{i}"), "context".to_owned(), ScriptGroup::Other))
                .collect(),
            flat: vec![0.5; n * 4],
            missing: false,
        })
    }

    #[test]
    fn an_entry_answers_only_its_stamp_model_and_dimension() {
        let mut cache = VectorCache::new(1 << 20);
        cache.put(7, "m", 4, entry(11, 3));
        assert!(cache.get(7, "m", 4, 11).is_some());
        assert!(cache.get(7, "other", 4, 11).is_none());
        assert!(cache.get(7, "m", 8, 11).is_none());
        // Another stamp: the scope was written; the old entry is gone for good.
        assert!(cache.get(7, "m", 4, 12).is_none());
        assert!(cache.get(7, "m", 4, 11).is_none());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn the_byte_bound_evicts_the_least_recently_used() {
        let one = entry(1, 10).bytes();
        let mut cache = VectorCache::new(one * 2);
        cache.put(1, "m", 4, entry(1, 10));
        cache.put(2, "m", 4, entry(1, 10));
        assert!(cache.get(1, "m", 4, 1).is_some()); // 1 is now the most recent
        cache.put(3, "m", 4, entry(1, 10));
        assert!(cache.bytes() <= one * 2);
        assert!(
            cache.get(2, "m", 4, 1).is_none(),
            "the least recent was evicted"
        );
        assert!(cache.get(1, "m", 4, 1).is_some());
        assert!(cache.get(3, "m", 4, 1).is_some());
        // Larger than the whole bound: not kept, nothing evicted for it.
        cache.put(4, "m", 4, entry(1, 100));
        assert!(cache.get(4, "m", 4, 1).is_none());
        assert!(cache.get(3, "m", 4, 1).is_some());
        cache.clear();
        assert_eq!(cache.bytes(), 0);
        assert!(cache.get(3, "m", 4, 1).is_none());
    }
}
