//! The bounds of a serving process's caches: what each in-memory cache or table that could grow
//! with the users or facts served may hold at most, in entries or bytes, and what it holds now
//! when that is cheap to know. Adapters and the engine report theirs through the ports
//! ([`crate::ports::MemoryManager::cache_bounds`] and the storage and retrieval ports), and
//! hosts show them (the gateway's `GET /api/memory/status`, key `caches`).

use serde::Serialize;

/// What a [`CacheBound`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheUnit {
    /// Entries (scopes, texts, connections' worth of keys...).
    Entries,
    /// Bytes.
    Bytes,
}

/// One cache of a serving process and its bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheBound {
    /// A stable name, `component.cache` (e.g. `file_storage.scopes`).
    pub name: String,
    /// The most it holds, in `unit`, from the configured value; `None` only when the operator
    /// configured it unbounded (e.g. `watermark_max_keys: 0`).
    pub bound: Option<u64>,
    /// What `bound` and `current` count.
    pub unit: CacheUnit,
    /// What it holds now, when cheaply known; `None` otherwise.
    pub current: Option<u64>,
}

impl CacheBound {
    /// A cache of at most `bound` entries.
    pub fn entries(name: impl Into<String>, bound: usize, current: Option<usize>) -> Self {
        Self {
            name: name.into(),
            bound: Some(to_u64(bound)),
            unit: CacheUnit::Entries,
            current: current.map(to_u64),
        }
    }

    /// A cache of at most `bound` bytes.
    pub fn bytes(name: impl Into<String>, bound: u64, current: Option<u64>) -> Self {
        Self {
            name: name.into(),
            bound: Some(bound),
            unit: CacheUnit::Bytes,
            current,
        }
    }

    /// The same cache without a bound (configured unbounded by the operator).
    #[must_use]
    pub fn unbounded(mut self) -> Self {
        self.bound = None;
        self
    }
}

/// `usize` to `u64` (lossless on every supported target; saturates otherwise).
fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_serialize_with_their_unit_in_lowercase() {
        let b = CacheBound::entries("file_storage.scopes", 7, Some(3));
        assert_eq!(
            serde_json::to_value(&b).unwrap(),
            serde_json::json!({"name": "file_storage.scopes", "bound": 7, "unit": "entries", "current": 3})
        );
        let b = CacheBound::bytes("fts5.page_cache", 1024, None);
        assert_eq!(b.unit, CacheUnit::Bytes);
        assert_eq!(b.current, None);
        assert_eq!(CacheBound::entries("w", 0, None).unbounded().bound, None);
    }
}
