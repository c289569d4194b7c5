//! The embedded engine's search index handle: the FTS5 index of a storage root that recovers
//! when it could not be opened at start-up, instead of leaving the process on the substring
//! scan until a restart.
//!
//! [`RecoveringFts5`] starts by opening `{root}/.retrieval/` (the adapter itself deletes and
//! recreates a corrupt or unreadable file once). When that fails, every later call (upsert,
//! search, rebuild, status...) tries to open it again first; until one succeeds, each call fails
//! with [`RetrievalError::Unavailable`] naming the cause, so the storage searches with its
//! substring scan, marks the scopes of failed writes dirty, reports the cause as the status's
//! `last_error`, and a rebuild reports failure. Once the index opens, the manager's lazy
//! per-scope rebuild (or an explicit rebuild) refills it from the canonical files.
//!
//! It is also the vector store ([`VectorIndex`]) of the hybrid search: the vectors live in the
//! same file, so they are reached (and recover) the same way.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use deermem_core::policy::language::ScriptGroup;
use deermem_core::ports::{
    Clock, EmbedTask, MeaningHit, MeaningQuery, MeaningRanking, Retrieval, VectorIndex, WordHit,
};
use deermem_core::{
    Fact, IndexedDoc, RetrievalError, RetrievalStats, Scope, SearchHit, SearchQuery,
};
use deermem_retrieval_fts5::Fts5Retrieval;

#[derive(Default)]
struct Slot {
    index: Option<Fts5Retrieval>,
    /// Why the last open attempt failed (cleared when one succeeds).
    open_error: Option<String>,
}

/// The FTS5 index of a storage root, opened again on demand after a failed open.
pub struct RecoveringFts5 {
    root: PathBuf,
    clock: Arc<dyn Clock>,
    slot: Mutex<Slot>,
    /// One open attempt at a time.
    opening: tokio::sync::Mutex<()>,
    closed: AtomicBool,
}

impl std::fmt::Debug for RecoveringFts5 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slot = self.lock();
        f.debug_struct("RecoveringFts5")
            .field("root", &self.root)
            .field("open", &slot.index.is_some())
            .field("open_error", &slot.open_error)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

fn closed_error() -> RetrievalError {
    RetrievalError::Unavailable("the FTS5 index is closed".into())
}

impl RecoveringFts5 {
    /// Opens the index of `root` now (blocking: run at start-up); a failure is logged and
    /// remembered, and the next call tries again.
    pub fn open(root: &Path, clock: Arc<dyn Clock>) -> Self {
        let me = Self {
            root: root.to_path_buf(),
            clock,
            slot: Mutex::new(Slot::default()),
            opening: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
        };
        let result = Fts5Retrieval::open(&me.root, Arc::clone(&me.clock));
        if me.settle(result).is_err() {
            // Logged and remembered by `settle`; the next call tries again.
        }
        me
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why the index could not be opened, while it is not open.
    pub fn open_error(&self) -> Option<String> {
        self.lock().open_error.clone()
    }

    /// Records the outcome of an open attempt; returns the index or the error to report.
    fn settle(
        &self,
        result: Result<Fts5Retrieval, RetrievalError>,
    ) -> Result<Fts5Retrieval, RetrievalError> {
        let mut slot = self.lock();
        match result {
            Ok(index) => {
                if let Some(previous) = slot.open_error.take() {
                    tracing::info!(root = %self.root.display(), %previous,
                        "the FTS5 search index is open again; scopes are re-indexed on their next search or by `deermem index rebuild`");
                }
                slot.index = Some(index.clone());
                Ok(index)
            }
            Err(e) => {
                let e = e.to_string();
                if slot.open_error.as_deref() == Some(e.as_str()) {
                    tracing::debug!(root = %self.root.display(), error = %e,
                        "the FTS5 search index still cannot be opened");
                } else {
                    tracing::warn!(root = %self.root.display(), error = %e,
                        "the FTS5 search index cannot be opened; search uses the substring scan and the index is opened again on the next search or rebuild");
                }
                slot.open_error = Some(e.clone());
                Err(RetrievalError::Unavailable(format!(
                    "the FTS5 index under {} cannot be opened: {e}",
                    self.root.display()
                )))
            }
        }
    }

    /// The open index, opening it first when an earlier attempt failed.
    async fn index(&self) -> Result<Fts5Retrieval, RetrievalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed_error());
        }
        if let Some(index) = self.lock().index.clone() {
            return Ok(index);
        }
        let _one_at_a_time = self.opening.lock().await;
        if self.closed.load(Ordering::Acquire) {
            return Err(closed_error());
        }
        if let Some(index) = self.lock().index.clone() {
            return Ok(index);
        }
        let root = self.root.clone();
        let clock = Arc::clone(&self.clock);
        let attempt = move || Fts5Retrieval::open(&root, clock);
        let result = match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle.spawn_blocking(attempt).await.unwrap_or_else(|e| {
                Err(RetrievalError::Backend(format!(
                    "the index open task failed: {e}"
                )))
            }),
            Err(_) => attempt(),
        };
        self.settle(result)
    }
}

#[async_trait]
impl Retrieval for RecoveringFts5 {
    fn kind(&self) -> &'static str {
        deermem_retrieval_fts5::KIND
    }

    async fn upsert(&self, scope: &Scope, fact: &Fact) -> Result<(), RetrievalError> {
        self.index().await?.upsert(scope, fact).await
    }

    async fn remove(&self, scope: &Scope, id: &str) -> Result<(), RetrievalError> {
        self.index().await?.remove(scope, id).await
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        if query.is_trivially_empty() {
            return Ok(Vec::new());
        }
        self.index().await?.search(query).await
    }

    async fn clear(&self, scopes: Option<&[Scope]>) -> Result<(), RetrievalError> {
        self.index().await?.clear(scopes).await
    }

    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError> {
        self.index().await?.rebuild(scopes, facts).await
    }

    async fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        self.index().await?.stats().await
    }

    async fn inventory(&self) -> Result<Vec<IndexedDoc>, RetrievalError> {
        self.index().await?.inventory().await
    }

    async fn indexed_scopes(&self) -> Result<Vec<Scope>, RetrievalError> {
        self.index().await?.indexed_scopes().await
    }

    fn take_stale_scopes(&self) -> Vec<Scope> {
        self.lock()
            .index
            .as_ref()
            .map(Retrieval::take_stale_scopes)
            .unwrap_or_default()
    }

    /// The open index's caches; while it is not open, the bounds it opens with (nothing held).
    fn cache_bounds(&self) -> Vec<deermem_core::CacheBound> {
        match self.lock().index.as_ref() {
            Some(index) => index.cache_bounds(),
            None => deermem_retrieval_fts5::cache_bounds(
                &deermem_retrieval_fts5::Fts5Options::default(),
                Some(0),
                Some(0),
            ),
        }
    }

    async fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wait for a running open attempt, so an index it opens is closed too.
        let _no_open_running = self.opening.lock().await;
        let index = self.lock().index.take();
        if let Some(index) = index {
            index.close().await;
        }
    }
}

#[async_trait]
impl VectorIndex for RecoveringFts5 {
    async fn missing_vectors(
        &self,
        model_id: &str,
        scopes: Option<&[Scope]>,
        limit: usize,
    ) -> Result<Vec<EmbedTask>, RetrievalError> {
        self.index()
            .await?
            .missing_vectors(model_id, scopes, limit)
            .await
    }

    async fn put_vectors(
        &self,
        model_id: &str,
        tasks: &[EmbedTask],
        vectors: &[Vec<f32>],
    ) -> Result<usize, RetrievalError> {
        self.index()
            .await?
            .put_vectors(model_id, tasks, vectors)
            .await
    }

    async fn scope_vectors(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>)>, RetrievalError> {
        self.index().await?.scope_vectors(scopes, model_id).await
    }

    async fn scope_vectors_tagged(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>, ScriptGroup)>, RetrievalError> {
        self.index()
            .await?
            .scope_vectors_tagged(scopes, model_id)
            .await
    }

    async fn nearest(&self, query: &MeaningQuery<'_>) -> Result<MeaningRanking, RetrievalError> {
        self.index().await?.nearest(query).await
    }

    async fn word_ranking(
        &self,
        query: &SearchQuery,
    ) -> Result<Option<Vec<WordHit>>, RetrievalError> {
        self.index().await?.word_ranking(query).await
    }

    async fn read_hits(&self, hits: &mut Vec<MeaningHit>) -> Result<(), RetrievalError> {
        self.index().await?.read_hits(hits).await
    }

    async fn vector_coverage(&self, model_id: &str) -> Result<(u64, u64), RetrievalError> {
        self.index().await?.vector_coverage(model_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deermem_core::{SearchMode, SearchQuery};
    use deermem_testkit::clock::ManualClock;
    use deermem_testkit::retrieval::{fact, scope};

    /// The hybrid search ranks words without reading facts only when every layer forwards
    /// `word_ranking`: the port's default would answer `None` here.
    #[tokio::test]
    async fn the_lean_word_ranking_is_forwarded() {
        let dir = tempfile::tempdir().unwrap();
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::at("2026-01-01T00:00:00Z"));
        let index = RecoveringFts5::open(dir.path(), clock);
        let s = scope(Some("alice"), "coder");
        let f = fact(&s, "f1", "plays basketball every Sunday", "context", 0.9);
        index.upsert(&s, &f).await.unwrap();
        let mut q = SearchQuery::new("basketball", s, 5);
        q.mode = Some(SearchMode::Bm25);
        let words = index.word_ranking(&q).await.unwrap().expect("forwarded");
        assert_eq!(words.len(), 1);
        assert_eq!(words[0].fact_id, "f1");
        index.close().await;
    }
}
