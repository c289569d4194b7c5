//! Whole-bucket operations: clearing (everything, or one agent's facts with a snapshot retry)
//! and importing (replacing the bucket with a document, with the per-fact revision rule and
//! capacity eviction).

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use deermem_core::ports::{MemoryAdmin, MemoryScope};
use deermem_core::{
    AgentName, ApplyOptions, ChangeSet, Fact, FactDraft, FactId, InvalidInputCode,
    MAX_IMPORT_FACTS, ManagerError, PublicMemoryDocument, Scope, StorageError, SummaryPatch,
    UserId,
};
use deermem_pycompat::py;

use super::facts::{MAX_MANUAL_CONTENT_CHARS, normalize_candidate};
use super::{DeerMemManager, MAX_SNAPSHOT_ATTEMPTS, conflict_backoff};
use deermem_updater::capacity_decision;

fn memory_data(message: String) -> ManagerError {
    ManagerError::invalid(InvalidInputCode::MemoryData, message)
}

/// The refusal of an import document with more than [`MAX_IMPORT_FACTS`] facts.
fn too_many_facts(count: usize) -> ManagerError {
    memory_data(format!(
        "memory_data.facts holds {count} facts; an import document may hold at most {MAX_IMPORT_FACTS}"
    ))
}

/// A fact of an import document, checked.
struct Incoming {
    id: FactId,
    draft: FactDraft,
}

/// Validates the facts of an import document: at most [`MAX_IMPORT_FACTS`] of them, valid,
/// unique ids and bounded content, then each fact's fields (the draft's rules).
fn incoming_facts(document: &PublicMemoryDocument) -> Result<Vec<Incoming>, ManagerError> {
    if document.facts.len() > MAX_IMPORT_FACTS {
        return Err(too_many_facts(document.facts.len()));
    }
    let mut seen: HashSet<FactId> = HashSet::new();
    let mut out = Vec::with_capacity(document.facts.len());
    for (i, f) in document.facts.iter().enumerate() {
        let id = FactId::new(f.id.clone())
            .map_err(|e| memory_data(format!("memory_data.facts[{i}].id: {e}")))?;
        if !seen.insert(id.clone()) {
            return Err(memory_data(format!(
                "memory_data.facts: duplicate fact id '{id}'"
            )));
        }
        if py::strip(&f.content)
            .chars()
            .nth(MAX_MANUAL_CONTENT_CHARS)
            .is_some()
        {
            return Err(memory_data(format!(
                "memory_data.facts[{i}].content is too long (at most {MAX_MANUAL_CONTENT_CHARS} characters)"
            )));
        }
        out.push(id);
    }
    // The fields are checked once every id and length is (the order the checks had when the
    // fields were only checked while scoring the facts for capacity).
    out.into_iter()
        .zip(&document.facts)
        .enumerate()
        .map(|(i, (id, f))| {
            let draft = f
                .to_draft()
                .map_err(|e| memory_data(format!("memory_data.facts[{i}]: {e}")))?;
            Ok(Incoming { id, draft })
        })
        .collect()
}

impl DeerMemManager {
    /// Deletes every fact of one bucket (summaries are shared and kept), recomputing from a
    /// fresh snapshot when a concurrent writer wins.
    async fn clear_agent(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let snapshot = self.storage.load(user, Some(agent)).await?;
            if snapshot.facts.is_empty() {
                return Ok(snapshot.to_public());
            }
            let revisions: BTreeMap<FactId, u64> = snapshot
                .facts
                .iter()
                .map(|f| (f.id.clone(), f.revision))
                .collect();
            let changes = ChangeSet {
                deletes: revisions.keys().cloned().collect(),
                delete_revisions: Some(revisions),
                ..ChangeSet::default()
            };
            let options = ApplyOptions::at_revision(snapshot.revision);
            match self
                .storage
                .apply_changes(user, Some(agent), changes, options)
                .await
            {
                Ok(_) => {
                    if let Err(e) = self.storage.clear_fact_metadata(user, agent, None).await {
                        tracing::warn!(error = %e, "could not remove usage and audit sidecars after a clear");
                    }
                    return self.fresh_document(user, agent).await;
                }
                Err(e) if e.is_conflict() && attempt < MAX_SNAPSHOT_ATTEMPTS => {
                    tracing::info!(attempt, error = %e, "memory changed during clear; recomputing from a fresh snapshot");
                    conflict_backoff(attempt).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[async_trait]
impl MemoryAdmin for DeerMemManager {
    async fn clear_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        self.check_user(scope.user.as_ref())?;
        let user = scope.user.as_ref();
        let _turn = self.write_turns.take(user).await;
        match &scope.agent {
            None => Ok(self.storage.clear_all(user).await?.to_public()),
            Some(agent) => self.clear_agent(user, agent).await,
        }
    }

    async fn import_memory(
        &self,
        document: PublicMemoryDocument,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let (user, agent) = self.bucket(&scope)?;
        let _turn = self.write_turns.take(user.as_ref()).await;
        let user = user.as_ref();
        let incoming = incoming_facts(&document)?;
        let fact_scope = Scope::new(user.cloned(), Some(agent.clone())).to_fact_scope();
        let summaries = SummaryPatch {
            user: Some(document.user.to_section().0),
            history: Some(document.history.to_section().0),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let snapshot = self.storage.load(user, Some(&agent)).await?;
            let now = self.clock.now();
            let mut scored: Vec<Fact> = Vec::with_capacity(incoming.len());
            for (i, f) in incoming.iter().enumerate() {
                let fact = normalize_candidate(&f.draft, &fact_scope, now, &f.id)
                    .map_err(|e| memory_data(format!("memory_data.facts[{i}]: {e}")))?;
                scored.push(fact);
            }
            let usage = self.usage_for_capacity(user, &agent, scored.len()).await;
            let decision = capacity_decision(&scored, &self.config, &usage, now);
            let kept: HashSet<&FactId> = match &decision {
                Some(d) => d.decision.kept.iter().map(|f| &f.id).collect(),
                None => incoming.iter().map(|f| &f.id).collect(),
            };
            let mut changes = ChangeSet {
                summaries: Some(summaries.clone()),
                ..ChangeSet::default()
            };
            let mut upsert_revisions = BTreeMap::new();
            for f in incoming.iter().filter(|f| kept.contains(&f.id)) {
                changes.upserts.push(f.draft.clone());
                // An existing fact must be at this revision, and the payload's own revision
                // (1 when absent) must match it: an old export after edits is a conflict.
                upsert_revisions.insert(
                    f.id.clone(),
                    snapshot.fact(f.id.as_str()).map(|s| s.revision),
                );
            }
            changes.upsert_revisions = (!upsert_revisions.is_empty()).then_some(upsert_revisions);
            let mut delete_revisions = BTreeMap::new();
            for f in snapshot.facts.iter().filter(|f| !kept.contains(&f.id)) {
                changes.deletes.push(f.id.clone());
                delete_revisions.insert(f.id.clone(), f.revision);
            }
            changes.delete_revisions = (!delete_revisions.is_empty()).then_some(delete_revisions);
            let options = ApplyOptions::at_revision(snapshot.revision);
            match self
                .storage
                .apply_changes(user, Some(&agent), changes, options)
                .await
            {
                Ok(_) => {
                    self.audit_capacity(user, &agent, decision.as_ref(), now)
                        .await;
                    return self.fresh_document(user, &agent).await;
                }
                // Only a concurrent writer is retried; a payload whose revision does not
                // match the stored fact is a conflict the caller must resolve.
                Err(e @ StorageError::ManifestConflict { .. })
                    if attempt < MAX_SNAPSHOT_ATTEMPTS =>
                {
                    tracing::info!(attempt, error = %e, "memory changed during import; recomputing from a fresh snapshot");
                    conflict_backoff(attempt).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
