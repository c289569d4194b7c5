//! Search by meaning over any retrieval adapter that can keep vectors: [`HybridRetrieval`]
//! wraps the lexical index, embeds documents behind the write and ranks `vector`/`hybrid`
//! queries (skeleton: interface fixed, ranking to be filled in).

use std::sync::Arc;

use async_trait::async_trait;
use deermem_core::ports::{Embedder, Retrieval, VectorIndex};
use deermem_core::{
    Fact, IndexedDoc, RetrievalError, RetrievalStats, Scope, SearchHit, SearchMode, SearchQuery,
};

/// A retrieval adapter with an embedder: lexical search from `index`, vectors in `vectors`
/// (usually the same adapter), queries ranked by their mode or `default_mode`.
#[derive(Debug)]
pub struct HybridRetrieval {
    index: Arc<dyn Retrieval>,
    vectors: Arc<dyn VectorIndex>,
    embedder: Arc<dyn Embedder>,
    default_mode: SearchMode,
}

impl HybridRetrieval {
    /// Wraps `index`; vectors of `embedder`'s model are kept in `vectors`.
    pub fn new(
        index: Arc<dyn Retrieval>,
        vectors: Arc<dyn VectorIndex>,
        embedder: Arc<dyn Embedder>,
        default_mode: SearchMode,
    ) -> Self {
        Self {
            index,
            vectors,
            embedder,
            default_mode,
        }
    }

    /// The mode a query without one is ranked by.
    pub fn default_mode(&self) -> SearchMode {
        self.default_mode
    }

    /// The embedder.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    /// The vector store.
    pub fn vectors(&self) -> &Arc<dyn VectorIndex> {
        &self.vectors
    }
}

#[async_trait]
impl Retrieval for HybridRetrieval {
    fn kind(&self) -> &'static str {
        self.index.kind()
    }

    async fn upsert(&self, scope: &Scope, fact: &Fact) -> Result<(), RetrievalError> {
        self.index.upsert(scope, fact).await
    }

    async fn remove(&self, scope: &Scope, id: &str) -> Result<(), RetrievalError> {
        self.index.remove(scope, id).await
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        self.index.search(query).await
    }

    async fn clear(&self, scopes: Option<&[Scope]>) -> Result<(), RetrievalError> {
        self.index.clear(scopes).await
    }

    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError> {
        self.index.rebuild(scopes, facts).await
    }

    async fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        self.index.stats().await
    }

    async fn inventory(&self) -> Result<Vec<IndexedDoc>, RetrievalError> {
        self.index.inventory().await
    }

    async fn close(&self) {
        self.index.close().await;
    }

    fn take_stale_scopes(&self) -> Vec<Scope> {
        self.index.take_stale_scopes()
    }
}
