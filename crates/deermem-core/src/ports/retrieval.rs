//! The `Retrieval` port: a derived, rebuildable search index over canonical facts.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::caches::CacheBound;
use crate::error::RetrievalError;
use crate::fact::Fact;
use crate::ids::Scope;
use crate::search::{IndexedDoc, RetrievalStats, SearchHit, SearchQuery};

/// A scope-aware search index. It holds only data that can be rebuilt from canonical storage.
///
/// # Contract
/// - **Isolation.** A search returns only facts indexed under one of the query's scopes; scopes
///   compare the raw user id exactly and the agent name exactly (storage passes canonical
///   lowercase names).
/// - **Upsert/remove.** `upsert` replaces any earlier document with the same `(scope, id)`;
///   `remove` of an absent id is a no-op. Every later call sees an acknowledged write, even
///   when the adapter applies it after returning (see [`Retrieval::take_stale_scopes`]).
/// - **Search.** Blank queries and `top_k == 0` return no hits without touching the index. Any
///   query text is accepted: text that is not valid index syntax is searched as plain words,
///   never an error. Hits are ordered by descending score; the category filter applies before
///   the `top_k` cut.
/// - **Rebuild.** `rebuild(scopes, facts)` atomically replaces the listed scopes' documents (or
///   the whole index when `scopes` is `None`) with `facts`.
/// - **Robustness.** A corrupt index is recreated; errors are typed, never panics.
#[async_trait]
pub trait Retrieval: Send + Sync + Debug {
    /// The adapter kind, e.g. `fts5`.
    fn kind(&self) -> &'static str;

    /// Indexes (or re-indexes) one fact under a scope.
    ///
    /// # Errors
    /// `InvalidInput` for a scope without an agent; `Unavailable`/`Backend` on index failure.
    async fn upsert(&self, scope: &Scope, fact: &Fact) -> Result<(), RetrievalError>;

    /// Removes one fact from a scope.
    ///
    /// # Errors
    /// `Unavailable`/`Backend` on index failure.
    async fn remove(&self, scope: &Scope, id: &str) -> Result<(), RetrievalError>;

    /// Ranked search.
    ///
    /// # Errors
    /// `Unavailable`/`Backend` on index failure (callers fall back to a substring scan).
    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError>;

    /// Deletes the documents of the given scopes, or everything.
    ///
    /// # Errors
    /// `Unavailable`/`Backend` on index failure.
    async fn clear(&self, scopes: Option<&[Scope]>) -> Result<(), RetrievalError>;

    /// Atomically replaces the scopes' documents with `facts` (each with its scope).
    /// Returns how many documents were written.
    ///
    /// # Errors
    /// `InvalidInput` for an unindexable fact (nothing is replaced); `Unavailable`/`Backend`.
    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError>;

    /// Index statistics.
    ///
    /// # Errors
    /// `Unavailable`/`Backend`.
    async fn stats(&self) -> Result<RetrievalStats, RetrievalError>;

    /// Every document the index holds (after applying accepted writes), so that an operator's
    /// status check can compare the index with the canonical facts: a process killed between
    /// its durable commit and its index write leaves facts the index lacks, and nothing else
    /// records that.
    ///
    /// # Errors
    /// `Unsupported` (the default) for an adapter that cannot list its documents;
    /// `Unavailable`/`Backend` on index failure.
    async fn inventory(&self) -> Result<Vec<IndexedDoc>, RetrievalError> {
        Err(RetrievalError::Unsupported {
            operation: "inventory",
            adapter: self.kind(),
        })
    }

    /// The scopes the index holds documents for (after applying accepted writes), so that a
    /// full rebuild can replace the index scope by scope, a bounded batch of facts at a time,
    /// and then clear the scopes that no longer hold any fact.
    ///
    /// # Errors
    /// `Unsupported` (the default): the caller rebuilds the whole index in one call instead;
    /// `Unavailable`/`Backend` on index failure.
    async fn indexed_scopes(&self) -> Result<Vec<Scope>, RetrievalError> {
        Err(RetrievalError::Unsupported {
            operation: "indexed_scopes",
            adapter: self.kind(),
        })
    }

    /// Closes the index. Idempotent; later calls fail with `Unavailable`. Writes accepted
    /// before are applied first.
    async fn close(&self);

    /// Scopes whose accepted writes were lost since the last call. An adapter may acknowledge
    /// `upsert`/`remove` before applying them (every later `search`, `stats`, `clear` and
    /// `rebuild` sees them); when applying one then fails, its scope is reported here once, and
    /// the storage rebuilds it from the canonical files before searching it. Adapters that
    /// apply writes before returning report nothing (the default).
    fn take_stale_scopes(&self) -> Vec<Scope> {
        Vec::new()
    }

    /// The bounds of the index's in-process caches (a database's page cache, decoded rows, a
    /// query-embedding cache; see [`CacheBound`]). Empty by default.
    fn cache_bounds(&self) -> Vec<CacheBound> {
        Vec::new()
    }
}
