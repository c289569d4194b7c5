//! A `MemoryStorage` decorator that adds up the time spent in durable writes (commits and
//! sidecar writes), so the update workload can report its cost with and without the commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::ports::{
    FactMetadata, FactRepository, ListQuery, MemoryStorage, ScopedSearch, StorageCapabilities,
};
use deermem_core::{
    AgentName, ApplyOptions, ChangeResult, ChangeSet, Fact, FactId, MemoryDocument, RebuildReport,
    RetrievalStatus, SearchHit, SearchQuery, StorageError, Timestamp, UserId,
};

/// Delegates everything to `inner`, timing the write operations.
#[derive(Debug)]
pub(crate) struct TimedStorage {
    inner: Arc<dyn MemoryStorage>,
    write_ns: AtomicU64,
}

impl TimedStorage {
    pub(crate) fn new(inner: Arc<dyn MemoryStorage>) -> Self {
        Self {
            inner,
            write_ns: AtomicU64::new(0),
        }
    }

    /// Nanoseconds spent in writes so far.
    pub(crate) fn write_ns(&self) -> u64 {
        self.write_ns.load(Ordering::Relaxed)
    }

    fn add(&self, t: Instant) {
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.write_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

#[async_trait]
impl FactRepository for TimedStorage {
    fn capabilities(&self) -> StorageCapabilities {
        self.inner.capabilities()
    }

    async fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        self.inner.load(user, agent).await
    }

    async fn reload(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        self.inner.reload(user, agent).await
    }

    async fn get_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
    ) -> Result<Option<Fact>, StorageError> {
        self.inner.get_fact(user, agent, id).await
    }

    async fn list_facts(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        query: &ListQuery,
    ) -> Result<Vec<Fact>, StorageError> {
        self.inner.list_facts(user, agent, query).await
    }

    async fn apply_changes(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        changes: ChangeSet,
        options: ApplyOptions,
    ) -> Result<ChangeResult, StorageError> {
        let t = Instant::now();
        let r = self
            .inner
            .apply_changes(user, agent, changes, options)
            .await;
        self.add(t);
        r
    }

    fn new_fact_id(&self) -> FactId {
        self.inner.new_fact_id()
    }

    async fn clear_all(&self, user: Option<&UserId>) -> Result<MemoryDocument, StorageError> {
        let t = Instant::now();
        let r = self.inner.clear_all(user).await;
        self.add(t);
        r
    }

    async fn close(&self) {
        self.inner.close().await;
    }
}

#[async_trait]
impl FactMetadata for TimedStorage {
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<FactUsageMap, StorageError> {
        self.inner.get_fact_usage(user, agent).await
    }

    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        let t = Instant::now();
        let r = self.inner.record_fact_accesses(user, agent, ids, at).await;
        self.add(t);
        r
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
        let t = Instant::now();
        let r = self
            .inner
            .record_capacity_eviction(user, agent, decision, max_facts, shadow, at)
            .await;
        self.add(t);
        r
    }

    async fn clear_fact_metadata(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: Option<&[FactId]>,
    ) -> Result<(), StorageError> {
        let t = Instant::now();
        let r = self.inner.clear_fact_metadata(user, agent, ids).await;
        self.add(t);
        r
    }
}

#[async_trait]
impl ScopedSearch for TimedStorage {
    async fn search_facts(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StorageError> {
        self.inner.search_facts(query).await
    }

    async fn rebuild_index(
        &self,
        scopes: Option<&[(Option<UserId>, AgentName)]>,
    ) -> Result<RebuildReport, StorageError> {
        self.inner.rebuild_index(scopes).await
    }

    async fn retrieval_status(&self) -> RetrievalStatus {
        self.inner.retrieval_status().await
    }
}
