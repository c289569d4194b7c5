//! The `FactRepository` port: loads through the cache, point reads under the locks, listing,
//! change sets through the write paths, clearing a user, and closing.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use deermem_core::ports::{FactRepository, ListQuery, ScopedSearch, StorageCapabilities};
use deermem_core::{
    AgentName, ApplyOptions, CacheBound, ChangeResult, ChangeSet, Fact, FactId, MemoryDocument,
    StorageError, UserId,
};

use super::FileStorage;
use super::write::ClearProgress;
use crate::commit::CommitRequest;
use crate::markdown;

/// The name the load cache is reported under ([`FactRepository::cache_bounds`]).
pub const SCOPE_CACHE_NAME: &str = "file_storage.scopes";

#[async_trait]
impl FactRepository for FileStorage {
    /// The load cache (`cache_max_scopes` scope documents) and the index's caches.
    fn cache_bounds(&self) -> Vec<CacheBound> {
        let usage = self.cache_usage();
        let mut out = vec![CacheBound::entries(
            SCOPE_CACHE_NAME,
            usage.max_scopes,
            Some(usage.scopes),
        )];
        if let Some(retrieval) = &self.inner.retrieval {
            out.extend(retrieval.cache_bounds());
        }
        out
    }

    fn capabilities(&self) -> StorageCapabilities {
        let retrieval = self.inner.retrieval.is_some();
        let mut names: BTreeSet<String> = [
            "file",
            "markdown-facts",
            "global-summary-json",
            "revision",
            "journal",
            "fact-repository",
            "substring-fallback",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        if retrieval {
            names.insert("retrieval".into());
        }
        StorageCapabilities {
            names,
            persistent: true,
            retrieval,
        }
    }

    async fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> std::result::Result<MemoryDocument, StorageError> {
        self.load_impl(user, agent, false).await
    }

    async fn reload(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> std::result::Result<MemoryDocument, StorageError> {
        let doc = self.load_impl(user, agent, true).await?;
        if let (Some(agent), true) = (agent, self.inner.retrieval.is_some()) {
            let scopes = [(user.cloned(), agent.clone())];
            let report = self.rebuild_index(Some(&scopes)).await?;
            if report.failed > 0 {
                tracing::warn!(?report, "scope re-index after reload had failures");
            }
        }
        Ok(doc)
    }

    async fn get_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
    ) -> std::result::Result<Option<Fact>, StorageError> {
        let (u, a, id) = (user.cloned(), agent.clone(), id.clone());
        self.run_write(user, Some(agent), move |inner| {
            inner.locked(u.as_ref(), |udir, now| {
                let (notes, _) = inner.read_migrations_locked(udir, Some(&a), now)?;
                let fact = markdown::load_optional(&udir.fact(&a, &id), udir.expected(&a), now)?;
                Ok((fact.map(|l| l.fact), notes))
            })
        })
        .await
    }

    async fn list_facts(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        query: &ListQuery,
    ) -> std::result::Result<Vec<Fact>, StorageError> {
        if query.limit == Some(0) {
            return query.apply(Vec::new());
        }
        query.apply(self.load_impl(user, Some(agent), false).await?.facts)
    }

    async fn apply_changes(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        changes: ChangeSet,
        options: ApplyOptions,
    ) -> std::result::Result<ChangeResult, StorageError> {
        // The core's rules; fresh ids are storage-style.
        let req = CommitRequest::prepare(changes, agent, crate::fresh_fact_id)?;
        let u = user.cloned();
        let done = self
            .run_write(user, agent, move |inner| {
                inner.apply(u.as_ref(), req, options)
            })
            .await?;
        Ok(ChangeResult {
            version: done.version,
            revision: done.revision,
            last_updated: done.last_updated,
            upserted_facts: done.written,
            deleted_fact_ids: done.deleted,
        })
    }

    fn new_fact_id(&self) -> FactId {
        crate::fresh_fact_id()
    }

    async fn clear_all(
        &self,
        user: Option<&UserId>,
    ) -> std::result::Result<MemoryDocument, StorageError> {
        let u = user.cloned();
        let (progress, result) = self
            .run(move |inner| {
                let mut progress = ClearProgress::default();
                let result = inner.clear_all(u.as_ref(), &mut progress);
                Ok((progress, result))
            })
            .await?;
        // The agents cleared before a failure are gone from the files: the index hears of it.
        self.dispatch(progress.notes).await;
        if let Err(e) = result {
            let e = StorageError::from(e);
            // The failing agent's commit may have landed in part (an I/O error after its
            // commit point): its scope is rebuilt from the files at its next search.
            if let (StorageError::Io { .. }, Some(agent)) = (&e, progress.failed_at) {
                self.inner.mark_dirty(user, &agent);
            }
            return Err(e);
        }
        self.load_impl(user, Some(&AgentName::default_bucket()), true)
            .await
    }

    async fn close(&self) {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(r) = &self.inner.retrieval {
            r.close().await;
        }
    }
}
