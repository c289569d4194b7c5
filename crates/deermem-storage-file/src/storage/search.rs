//! The `ScopedSearch` port: ranked search through the derived index after rebuilding the
//! searched scopes that are dirty, the substring fallback over the files when no index is
//! configured or it fails, index rebuilds, and the retrieval status.

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use deermem_core::policy::substring::{SubstringRules, substring_hits};
use deermem_core::ports::ScopedSearch;
use deermem_core::{
    AgentName, Fact, RebuildReport, RetrievalError, RetrievalStatus, Scope, SearchHit, SearchQuery,
    StorageError, UserId,
};

use super::index::scope_label;
use super::{DirtyKey, FileMemoryStorage};

/// A rebuild that failed as a whole.
fn fatal_rebuild(failed: usize) -> RebuildReport {
    RebuildReport {
        supported: true,
        failed,
        fatal: true,
        ..RebuildReport::default()
    }
}

impl FileMemoryStorage {
    /// Search without the index: the storage's substring rules over the scopes' facts.
    async fn substring_search(
        &self,
        query: &SearchQuery,
    ) -> std::result::Result<Vec<SearchHit>, StorageError> {
        if query.is_trivially_empty() {
            return Ok(Vec::new());
        }
        let mut facts: Vec<Fact> = Vec::new();
        for scope in &query.scopes {
            let Some(agent) = &scope.agent else { continue };
            facts.extend(
                self.load_impl(scope.user.as_ref(), Some(agent), false)
                    .await?
                    .facts,
            );
        }
        Ok(substring_hits(&facts, query, SubstringRules::STORAGE))
    }
}

#[async_trait]
impl ScopedSearch for FileMemoryStorage {
    async fn search_facts(
        &self,
        query: &SearchQuery,
    ) -> std::result::Result<Vec<SearchHit>, StorageError> {
        if query.is_trivially_empty() {
            return Ok(Vec::new());
        }
        for scope in &query.scopes {
            // Reject scopes that cannot be resolved (strict mode without a user).
            self.inner.user_dir(scope.user.as_ref())?;
        }
        let Some(retrieval) = self.inner.retrieval.clone() else {
            return self.substring_search(query).await;
        };
        self.absorb_stale_scopes(None);
        let dirty: Vec<DirtyKey> = {
            let d = self.inner.dirty.lock();
            query
                .scopes
                .iter()
                .filter_map(|s| s.agent.as_ref().map(|a| (s.user.clone(), a.clone())))
                .filter(|k| d.contains(k))
                .collect()
        };
        if !dirty.is_empty() {
            let rebuilt = self.rebuild_index(Some(&dirty)).await;
            match rebuilt {
                Ok(r) if r.failed == 0 && !r.fatal => {}
                other => {
                    tracing::warn!(result = ?other.map(|r| r.failed), "dirty scope rebuild failed; using substring fallback");
                    return self.substring_search(query).await;
                }
            }
        }
        match retrieval.search(query).await {
            // A write of a searched scope that failed while the search applied it: answer from
            // the files instead (the next search rebuilds the scope).
            Ok(_) if self.absorb_stale_scopes(Some(&query.scopes)) => {
                self.substring_search(query).await
            }
            Ok(hits) => Ok(hits),
            Err(e) => {
                tracing::warn!(error = %e, "retrieval search failed; using substring fallback");
                self.substring_search(query).await
            }
        }
    }

    async fn rebuild_index(
        &self,
        scopes: Option<&[(Option<UserId>, AgentName)]>,
    ) -> std::result::Result<RebuildReport, StorageError> {
        let Some(retrieval) = self.inner.retrieval.clone() else {
            return Ok(RebuildReport {
                reason: Some("retrieval_not_configured".into()),
                ..RebuildReport::default()
            });
        };
        let (records, mut failed, scope_list): (Vec<(Scope, Fact)>, usize, Option<Vec<Scope>>) =
            match scopes {
                None => {
                    let (r, f) = self.run(|inner| Ok(inner.collect_all_for_index())).await?;
                    (r, f, None)
                }
                Some(list) => {
                    let mut records = Vec::new();
                    for (user, agent) in list {
                        let doc = self.load_impl(user.as_ref(), Some(agent), false).await?;
                        let scope = Scope::new(user.clone(), Some(agent.clone()));
                        records.extend(doc.facts.into_iter().map(|f| (scope.clone(), f)));
                    }
                    let scopes = list
                        .iter()
                        .map(|(u, a)| Scope::new(u.clone(), Some(a.clone())))
                        .collect();
                    (records, 0, Some(scopes))
                }
            };
        let mut indexed = 0;
        match retrieval.rebuild(scope_list.as_deref(), &records).await {
            Ok(_) => indexed = records.len(),
            Err(RetrievalError::InvalidInput(_) | RetrievalError::Unsupported { .. }) => {
                // Fall back to clear + one upsert per fact, counting failures.
                if let Err(e) = retrieval.clear(scope_list.as_deref()).await {
                    tracing::warn!(error = %e, "retrieval clear failed");
                    return Ok(fatal_rebuild(failed + records.len().max(1)));
                }
                for (scope, fact) in &records {
                    match retrieval.upsert(scope, fact).await {
                        Ok(()) => indexed += 1,
                        Err(e) => {
                            failed += 1;
                            tracing::warn!(error = %e, id = %fact.id, "fact not indexed");
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "retrieval rebuild failed");
                return Ok(fatal_rebuild(failed + records.len().max(1)));
            }
        }
        if failed == 0 {
            let mut dirty = self.inner.dirty.lock();
            match scopes {
                None => dirty.clear(),
                Some(list) => {
                    for k in list {
                        dirty.remove(k);
                    }
                }
            }
        }
        Ok(RebuildReport {
            supported: true,
            indexed,
            failed,
            ..RebuildReport::default()
        })
    }

    async fn retrieval_status(&self) -> RetrievalStatus {
        // One stats call: it applies the index's pending writes first, so the scopes whose
        // writes failed are among the stale ones absorbed below, and its figures are reported.
        let stats = match &self.inner.retrieval {
            Some(retrieval) if !self.inner.closed.load(Ordering::SeqCst) => {
                Some(retrieval.stats().await)
            }
            _ => None,
        };
        self.absorb_stale_scopes(None);
        let dirty_scopes = self
            .inner
            .dirty
            .lock()
            .iter()
            .map(|(u, a)| scope_label(u.as_ref(), Some(a)))
            .collect();
        let Some(retrieval) = &self.inner.retrieval else {
            return RetrievalStatus {
                configured: false,
                mode: "substring_fallback".into(),
                dirty_scopes,
                ..RetrievalStatus::default()
            };
        };
        let mut status = RetrievalStatus {
            configured: true,
            mode: "external".into(),
            adapter: Some(retrieval.kind().to_owned()),
            dirty_scopes,
            ..RetrievalStatus::default()
        };
        match stats {
            Some(Ok(s)) => {
                status.total_docs = Some(s.total_docs);
                status.db_bytes = s.db_bytes;
                status.db_path = s.db_path;
                status.last_error = s.last_error;
                status.vectors = s.vectors;
            }
            Some(Err(e)) => status.last_error = Some(e.to_string()),
            None => {}
        }
        status
    }
}
