//! The `ScopedSearch` port: ranked search through the derived index after rebuilding the
//! searched scopes that are dirty, the substring fallback over the files when no index is
//! configured or it fails, index rebuilds, and the retrieval status.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use deermem_core::policy::substring::{SubstringRules, substring_hits};
use deermem_core::ports::{Retrieval, ScopedSearch};
use deermem_core::{
    AgentName, Fact, RebuildReport, RetrievalError, RetrievalStatus, Scope, SearchHit, SearchQuery,
    StorageError, UserId,
};

use super::index::scope_label;
use super::{DirtyKey, FileStorage};

/// A rebuild that failed as a whole.
fn fatal_rebuild(failed: usize) -> RebuildReport {
    RebuildReport {
        supported: true,
        failed,
        fatal: true,
        ..RebuildReport::default()
    }
}

/// Agent directories a streamed rebuild reads in one go (then checks its batch size).
const DIRS_PER_READ: usize = 8;

/// How replacing documents in the index ended.
enum Replaced {
    /// Documents written, and facts that could not be.
    Done { indexed: usize, failed: usize },
    /// The index failed as a whole.
    Fatal,
}

/// Replaces the documents of `scopes` (all of them for `None`) with `records`: one atomic
/// `rebuild`, or, for an index without one (or refusing a fact), a clear and an upsert per
/// fact, counting the facts it refuses.
async fn replace_in_index(
    retrieval: &dyn Retrieval,
    scopes: Option<&[Scope]>,
    records: &[(Scope, Fact)],
) -> Replaced {
    match retrieval.rebuild(scopes, records).await {
        Ok(_) => Replaced::Done {
            indexed: records.len(),
            failed: 0,
        },
        Err(RetrievalError::InvalidInput(_) | RetrievalError::Unsupported { .. }) => {
            if let Err(e) = retrieval.clear(scopes).await {
                tracing::warn!(error = %e, "retrieval clear failed");
                return Replaced::Fatal;
            }
            let (mut indexed, mut failed) = (0, 0);
            for (scope, fact) in records {
                match retrieval.upsert(scope, fact).await {
                    Ok(()) => indexed += 1,
                    Err(e) => {
                        failed += 1;
                        tracing::warn!(error = %e, id = %fact.id, "fact not indexed");
                    }
                }
            }
            Replaced::Done { indexed, failed }
        }
        Err(e) => {
            tracing::warn!(error = %e, "retrieval rebuild failed");
            Replaced::Fatal
        }
    }
}

impl FileStorage {
    /// A full rebuild that streams: the agent directories are read a batch of about
    /// `rebuild_batch_facts` facts at a time (plus at most [`DIRS_PER_READ`] directories), each batch's scopes replaced in the index by one
    /// atomic `rebuild`, and the scopes the index held that no fact file names any more are
    /// cleared at the end. Memory stays bounded by the batch whatever the size of the store;
    /// each scope is replaced atomically (a search, always within scopes, sees a scope before
    /// or after its rebuild). `None` when the index cannot list its scopes; `Fatal` when the
    /// index failed as a whole (it cannot be opened or written), as a one-call rebuild reports it.
    async fn rebuild_all_streamed(
        &self,
        retrieval: &dyn Retrieval,
    ) -> std::result::Result<Option<Replaced>, StorageError> {
        let before = match retrieval.indexed_scopes().await {
            Ok(list) => list,
            Err(RetrievalError::Unsupported { .. }) => return Ok(None),
            Err(e) => {
                tracing::warn!(error = %e, "the index cannot list its scopes");
                return Ok(Some(Replaced::Fatal));
            }
        };
        let dirs = Arc::new(self.run(|inner| Ok(inner.agent_dirs())).await?);
        let per_batch = self.inner.config.rebuild_batch_facts.max(1);
        let (mut indexed, mut failed) = (0usize, 0usize);
        let mut seen: HashSet<Scope> = HashSet::new();
        let mut start = 0;
        while start < dirs.len() {
            // Directories until about `per_batch` facts (a scope is never split).
            let from = start;
            let list = Arc::clone(&dirs);
            let (records, unreadable, next) = self
                .run(move |inner| {
                    let mut records = Vec::new();
                    let mut unreadable = 0;
                    let mut i = from;
                    while i < list.len() && records.len() < per_batch {
                        // A few directories at a time, read on two threads.
                        let end = (i + DIRS_PER_READ).min(list.len());
                        let (r, u) = inner.read_for_index(&list[i..end]);
                        records.extend(r);
                        unreadable += u;
                        i = end;
                    }
                    Ok((records, unreadable, i))
                })
                .await?;
            start = next;
            failed += unreadable;
            let mut batch_scopes: Vec<Scope> = Vec::new();
            let mut in_batch: HashSet<&Scope> = HashSet::new();
            for (scope, _) in &records {
                if in_batch.insert(scope) {
                    batch_scopes.push(scope.clone());
                }
            }
            if batch_scopes.is_empty() {
                continue;
            }
            match replace_in_index(retrieval, Some(&batch_scopes), &records).await {
                Replaced::Done {
                    indexed: i,
                    failed: f,
                } => {
                    indexed += i;
                    failed += f;
                }
                Replaced::Fatal => return Ok(Some(Replaced::Fatal)),
            }
            seen.extend(batch_scopes);
        }
        let gone: Vec<Scope> = before.into_iter().filter(|s| !seen.contains(s)).collect();
        if !gone.is_empty()
            && let Err(e) = retrieval.clear(Some(&gone)).await
        {
            tracing::warn!(error = %e, "clearing the scopes without facts failed");
            failed += 1;
        }
        Ok(Some(Replaced::Done { indexed, failed }))
    }

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
impl ScopedSearch for FileStorage {
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
        let (indexed, failed) = match scopes {
            None => match self.rebuild_all_streamed(&*retrieval).await? {
                Some(Replaced::Done { indexed, failed }) => (indexed, failed),
                Some(Replaced::Fatal) => return Ok(fatal_rebuild(1)),
                None => {
                    // The index cannot list its scopes: everything in one call.
                    let (records, unreadable) =
                        self.run(|inner| Ok(inner.collect_all_for_index())).await?;
                    match replace_in_index(&*retrieval, None, &records).await {
                        Replaced::Done { indexed, failed } => (indexed, failed + unreadable),
                        Replaced::Fatal => {
                            return Ok(fatal_rebuild(unreadable + records.len().max(1)));
                        }
                    }
                }
            },
            Some(list) => {
                let mut records = Vec::new();
                for (user, agent) in list {
                    let doc = self.load_impl(user.as_ref(), Some(agent), false).await?;
                    let scope = Scope::new(user.clone(), Some(agent.clone()));
                    records.extend(doc.facts.into_iter().map(|f| (scope.clone(), f)));
                }
                let scope_list: Vec<Scope> = list
                    .iter()
                    .map(|(u, a)| Scope::new(u.clone(), Some(a.clone())))
                    .collect();
                match replace_in_index(&*retrieval, Some(&scope_list), &records).await {
                    Replaced::Done { indexed, failed } => (indexed, failed),
                    Replaced::Fatal => return Ok(fatal_rebuild(records.len().max(1))),
                }
            }
        };
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
