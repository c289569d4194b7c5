//! [`PgIndexedStorage`]: the PostgreSQL storage with its search answered by a retrieval adapter
//! over the same facts (the engine's hybrid retrieval over [`crate::PgFactIndex`], for search
//! by meaning). Every port is the storage's; search goes through the retrieval (falling back
//! to the storage's own search when it fails), each commit's written facts are announced to it
//! (so its embedding worker wakes), a rebuild also rebuilds it, and the index status carries
//! its embedding coverage.

use std::sync::Arc;

use async_trait::async_trait;
use deermem_core::document::{ApplyOptions, ChangeResult, ChangeSet, MemoryDocument};
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::ports::{
    FactMetadata, FactRepository, ListQuery, Retrieval, ScopedSearch, StorageCapabilities,
};
use deermem_core::search::{RebuildReport, RetrievalStatus, SearchHit, SearchQuery};
use deermem_core::{AgentName, Fact, FactId, Scope, StorageError, Timestamp, UserId};

use crate::repository::PgStorage;

/// The PostgreSQL storage whose search goes through `retrieval`.
#[derive(Debug)]
pub struct PgIndexedStorage {
    storage: Arc<PgStorage>,
    retrieval: Arc<dyn Retrieval>,
}

impl PgIndexedStorage {
    /// `storage` with its search answered by `retrieval` (an index over the same facts).
    pub fn new(storage: Arc<PgStorage>, retrieval: Arc<dyn Retrieval>) -> Self {
        Self { storage, retrieval }
    }

    /// The storage underneath.
    pub fn storage(&self) -> &Arc<PgStorage> {
        &self.storage
    }

    /// The retrieval search goes through.
    pub fn retrieval(&self) -> &Arc<dyn Retrieval> {
        &self.retrieval
    }
}

#[async_trait]
impl FactRepository for PgIndexedStorage {
    fn cache_bounds(&self) -> Vec<deermem_core::CacheBound> {
        let mut out = self.storage.cache_bounds();
        out.extend(self.retrieval.cache_bounds());
        out
    }

    fn capabilities(&self) -> StorageCapabilities {
        self.storage.capabilities()
    }

    async fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        self.storage.load(user, agent).await
    }

    async fn reload(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        self.storage.reload(user, agent).await
    }

    async fn get_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
    ) -> Result<Option<Fact>, StorageError> {
        self.storage.get_fact(user, agent, id).await
    }

    async fn list_facts(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        query: &ListQuery,
    ) -> Result<Vec<Fact>, StorageError> {
        self.storage.list_facts(user, agent, query).await
    }

    async fn apply_changes(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        changes: ChangeSet,
        options: ApplyOptions,
    ) -> Result<ChangeResult, StorageError> {
        let result = self
            .storage
            .apply_changes(user, agent, changes, options)
            .await?;
        if let Some(agent) = agent {
            let scope = Scope::new(user.cloned(), Some(agent.clone()));
            for fact in &result.upserted_facts {
                // The commit stands whatever the index says: the worker finds the fact's
                // missing vector on its next pass in any case.
                if let Err(e) = self.retrieval.upsert(&scope, fact).await {
                    tracing::warn!(error = %e, "the search index did not take a committed fact");
                }
            }
        }
        Ok(result)
    }

    fn new_fact_id(&self) -> FactId {
        self.storage.new_fact_id()
    }

    async fn clear_all(&self, user: Option<&UserId>) -> Result<MemoryDocument, StorageError> {
        // Deleting the facts deletes their vectors (the foreign key cascades).
        self.storage.clear_all(user).await
    }

    async fn close(&self) {
        self.retrieval.close().await;
        self.storage.close().await;
    }
}

#[async_trait]
impl FactMetadata for PgIndexedStorage {
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<FactUsageMap, StorageError> {
        self.storage.get_fact_usage(user, agent).await
    }

    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        self.storage
            .record_fact_accesses(user, agent, ids, at)
            .await
    }

    async fn record_capacity_eviction(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        decision: &EvictionDecision,
        max_facts: usize,
        shadow: Option<&EvictionDecision>,
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        self.storage
            .record_capacity_eviction(user, agent, decision, max_facts, shadow, at)
            .await
    }

    async fn clear_fact_metadata(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: Option<&[FactId]>,
    ) -> Result<(), StorageError> {
        self.storage.clear_fact_metadata(user, agent, ids).await
    }
}

#[async_trait]
impl ScopedSearch for PgIndexedStorage {
    async fn search_facts(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StorageError> {
        if query.category.as_deref().is_some_and(|c| c.contains('\0')) {
            return Err(StorageError::invalid(
                "category",
                "a search category cannot contain a NUL character",
            ));
        }
        match self.retrieval.search(query).await {
            Ok(hits) => Ok(hits),
            Err(e) => {
                tracing::warn!(error = %e, "search through the index failed; answering with the storage's own search");
                self.storage.search_facts(query).await
            }
        }
    }

    async fn rebuild_index(
        &self,
        scopes: Option<&[(Option<UserId>, AgentName)]>,
    ) -> Result<RebuildReport, StorageError> {
        let report = self.storage.rebuild_index(scopes).await?;
        let list: Option<Vec<Scope>> = scopes.map(|l| {
            l.iter()
                .map(|(u, a)| Scope::new(u.clone(), Some(a.clone())))
                .collect()
        });
        // Embeds what the scopes lack (best effort: an embedder failure is recorded in the
        // index status, and search falls back to BM25 meanwhile).
        if let Err(e) = self.retrieval.rebuild(list.as_deref(), &[]).await {
            tracing::warn!(error = %e, "the search index could not be rebuilt");
        }
        Ok(report)
    }

    async fn retrieval_status(&self) -> RetrievalStatus {
        let mut status = self.storage.retrieval_status().await;
        match self.retrieval.stats().await {
            Ok(stats) => status.vectors = stats.vectors,
            Err(e) => {
                if status.last_error.is_none() {
                    status.last_error = Some(e.to_string());
                }
            }
        }
        status
    }
}
