//! Manual fact CRUD (what the Gateway's fact routes and the memory tools call): validation with
//! stable error codes, the duplicate check over the whole bucket, capacity eviction of a new fact
//! with a snapshot-recompute retry, and revision-checked point updates and deletes.

use std::collections::BTreeMap;

use async_trait::async_trait;
use deermem_core::fact::{FactSource, NormalizeContext, fact_title, normalize_fact};
use deermem_core::policy::eviction::FactUsageMap;
use deermem_core::ports::{FactAdmin, FactPatch, MemoryScope, NewFact};
use deermem_core::{
    AgentName, ApplyOptions, ChangeResult, ChangeSet, Fact, FactDraft, FactError, FactId,
    FactScope, InvalidInputCode, ManagerError, MemoryDocument, PublicMemoryDocument, Scope,
    Timestamp, UserId,
};
use deermem_pycompat::py;

use super::{DeerMemManager, MAX_SNAPSHOT_ATTEMPTS, conflict_backoff};
use deermem_core::ports::MemoryStorageExt;
use deermem_updater::content_key;
use deermem_updater::{CapacityDecision, capacity_decision};

/// Attempts of a create that lost revision races. Creates of distinct facts commute: each lost
/// race means another write committed, so a create keeps recomputing from a fresh snapshot
/// (with the jittered backoff) far longer than other writes before it reports a conflict, and
/// many writers creating facts for one user through several replicas see none.
const CREATE_ATTEMPTS: u32 = 4 * MAX_SNAPSHOT_ATTEMPTS;

/// Draws at most this many ids before giving up on finding an unused one.
pub(super) const ID_DRAWS: usize = 32;

/// Stripped, non-empty content (`InvalidInput{Content}` otherwise). Its length is not bounded
/// here, as in the reference: the host's boundary bounds it (the gateway's body size), and
/// injection skips a fact that cannot fit its token budget.
pub(super) fn validate_content(content: &str) -> Result<String, ManagerError> {
    let c = py::strip(content);
    if c.is_empty() {
        return Err(ManagerError::invalid(
            InvalidInputCode::Content,
            "content must not be empty",
        ));
    }
    Ok(c.to_owned())
}

/// The stripped category, `context` when blank (its length is the host boundary's business,
/// as for content).
pub(super) fn normalized_category(category: &str) -> String {
    let c = py::strip(category);
    if c.is_empty() { "context" } else { c }.to_owned()
}

/// A finite confidence within `[0, 1]` (`InvalidInput{Confidence}` otherwise).
pub(super) fn validate_confidence(confidence: f64) -> Result<f64, ManagerError> {
    if confidence.is_finite() && (0.0..=1.0).contains(&confidence) {
        Ok(confidence)
    } else {
        Err(ManagerError::invalid(
            InvalidInputCode::Confidence,
            "confidence must be a finite number between 0 and 1",
        ))
    }
}

fn duplicate() -> ManagerError {
    ManagerError::invalid(InvalidInputCode::DuplicateFact, "Duplicate fact")
}

fn not_found(id: &str) -> ManagerError {
    ManagerError::NotFound {
        fact_id: id.to_owned(),
    }
}

impl DeerMemManager {
    /// The usage sidecar when the policy reads it and the list is over the cap; otherwise (or
    /// when it cannot be read) empty.
    pub(super) async fn usage_for_capacity(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        count: usize,
    ) -> FactUsageMap {
        if !(self.config.tracks_usage() && count > self.config.max_facts) {
            return FactUsageMap::new();
        }
        self.storage.get_fact_usage(user, agent).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "fact usage unavailable; capacity scoring without access heat");
            FactUsageMap::new()
        })
    }

    /// Writes the capacity audit after a successful commit; failures are logged.
    pub(super) async fn audit_capacity(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        decision: Option<&CapacityDecision>,
        now: Timestamp,
    ) {
        let Some(d) = decision else { return };
        if let Err(e) = self
            .storage
            .record_capacity_eviction(
                user,
                agent,
                &d.decision,
                self.config.max_facts,
                d.shadow.as_ref(),
                Some(now),
            )
            .await
        {
            tracing::warn!(error = %e, "capacity eviction audit failed");
        }
    }

    pub(super) async fn fresh_document(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        Ok(self.storage.load(user, Some(agent)).await?.to_public())
    }

    /// Creates a fact (see [`FactAdmin::create_fact_once`]): under an idempotency key the
    /// fact's id is the key's, and a fact already stored under it is the answer.
    async fn create(
        &self,
        fact: NewFact,
        scope: MemoryScope,
        idempotency_key: Option<&str>,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        let (user, agent) = self.bucket(&scope)?;
        let _turn = self.write_turns.take(user.as_ref()).await;
        let content = validate_content(&fact.content)?;
        let category = normalized_category(&fact.category);
        let confidence = validate_confidence(fact.confidence)?;
        let key = content_key(&content);
        let fact_scope = Scope::new(user.clone(), Some(agent.clone())).to_fact_scope();
        let keyed = idempotency_key.map(FactId::for_idempotency_key);
        let mut id = keyed.clone().unwrap_or_else(|| self.ids.next_id());
        let mut attempt = 0;
        loop {
            attempt += 1;
            let snapshot = self.storage.load(user.as_ref(), Some(&agent)).await?;
            if let Some(stored) = keyed.as_ref().and_then(|k| snapshot.fact(k.as_str())) {
                // An earlier attempt under this key committed: answer with it.
                if content_key(&stored.content) != key {
                    return Err(ManagerError::invalid(
                        InvalidInputCode::Other,
                        "the Idempotency-Key was already used to create a fact with another content",
                    ));
                }
                return Ok((snapshot.to_public(), Some(id.as_str().to_owned())));
            }
            if snapshot
                .facts
                .iter()
                .any(|f| content_key(&f.content) == key)
            {
                return Err(duplicate());
            }
            if keyed.is_none() {
                id = self.unused_id(&snapshot, id)?;
            }
            let now = self.clock.now();
            let draft = FactDraft::identified(id.clone(), &content)
                .and_then(|d| {
                    d.with_category(category.clone())
                        .with_confidence(confidence)
                })
                .map_err(invalid_fact)?
                .with_created_at(now.to_iso_z())
                .with_source(FactSource::manual());
            let candidate = normalize_candidate(&draft, &fact_scope, now, &id)?;
            let mut all = snapshot.facts.clone();
            all.push(candidate);
            let usage = self
                .usage_for_capacity(user.as_ref(), &agent, all.len())
                .await;
            let decision = capacity_decision(&all, &self.config, &usage, now);
            let kept_new = decision
                .as_ref()
                .is_none_or(|d| d.decision.kept.iter().any(|f| f.id == id));
            if !kept_new {
                // The new fact is the one capacity would drop: the create fails and changes
                // nothing. Stored facts are never evicted for a fact that is not stored (an
                // over-full bucket, e.g. after `max_facts` was lowered, stays as it is).
                // The audit records the decision only when it evicted nothing but the new fact.
                let only_new = decision
                    .as_ref()
                    .is_some_and(|d| d.decision.evicted.iter().all(|e| e.fact_id == id.as_str()));
                if only_new {
                    self.audit_capacity(user.as_ref(), &agent, decision.as_ref(), now)
                        .await;
                }
                return Ok((snapshot.to_public(), None));
            }
            let changes = creation_changes(&snapshot, decision.as_ref(), &id, draft);
            let options = ApplyOptions::at_revision(snapshot.revision);
            match self
                .storage
                .apply_changes(user.as_ref(), Some(&agent), changes, options)
                .await
            {
                Ok(result) => {
                    self.audit_capacity(user.as_ref(), &agent, decision.as_ref(), now)
                        .await;
                    // The fact is stored: whatever happens now, the answer says so.
                    let doc = self
                        .document_after(user.as_ref(), &agent, snapshot, &result)
                        .await;
                    return Ok((doc, kept_new.then(|| id.as_str().to_owned())));
                }
                Err(e) if e.is_conflict() && attempt < CREATE_ATTEMPTS => {
                    tracing::info!(attempt, error = %e, "memory changed during create; recomputing from a fresh snapshot");
                    conflict_backoff(attempt).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The document to answer a committed write with: the scope read again, or when that
    /// read fails (the database went away after the commit), `snapshot` with the commit's
    /// result applied. A durable write is never reported as failed.
    async fn document_after(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        snapshot: MemoryDocument,
        result: &ChangeResult,
    ) -> PublicMemoryDocument {
        match self.fresh_document(user, agent).await {
            Ok(doc) => doc,
            Err(e) => {
                tracing::warn!(error = %e, "the scope could not be read again after a commit; answering from the committed change");
                let mut doc = snapshot;
                doc.facts.retain(|f| {
                    !result.deleted_fact_ids.contains(&f.id)
                        && !result.upserted_facts.iter().any(|u| u.id == f.id)
                });
                doc.facts.extend(result.upserted_facts.iter().cloned());
                doc.revision = result.revision;
                doc.version.clone_from(&result.version);
                doc.last_updated.clone_from(&result.last_updated);
                doc.to_public()
            }
        }
    }

    fn unused_id(
        &self,
        snapshot: &MemoryDocument,
        current: FactId,
    ) -> Result<FactId, ManagerError> {
        let mut id = current;
        for _ in 0..ID_DRAWS {
            if snapshot.fact(id.as_str()).is_none() {
                return Ok(id);
            }
            id = self.ids.next_id();
        }
        Err(ManagerError::conflict("could not draw an unused fact id"))
    }

    /// Loads the bucket (running pending migrations) and finds a fact.
    async fn stored_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
    ) -> Result<Fact, ManagerError> {
        let doc = self.storage.load(user, Some(agent)).await?;
        doc.facts
            .into_iter()
            .find(|f| f.id == *id)
            .ok_or_else(|| not_found(id.as_str()))
    }
}

#[async_trait]
impl FactAdmin for DeerMemManager {
    async fn create_fact(
        &self,
        fact: NewFact,
        scope: MemoryScope,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        self.create(fact, scope, None).await
    }

    async fn create_fact_once(
        &self,
        fact: NewFact,
        scope: MemoryScope,
        idempotency_key: Option<&str>,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        self.create(fact, scope, idempotency_key).await
    }

    async fn update_fact(
        &self,
        fact_id: &str,
        patch: FactPatch,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let (user, agent) = self.bucket(&scope)?;
        let _turn = self.write_turns.take(user.as_ref()).await;
        let id = FactId::new(fact_id)?;
        let content = patch.content.as_deref().map(validate_content).transpose()?;
        let category = patch.category.as_deref().map(normalized_category);
        let confidence = patch.confidence.map(validate_confidence).transpose()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let stored = self.stored_fact(user.as_ref(), &agent, &id).await?;
            let expected = patch.expected_revision.unwrap_or(stored.revision);
            if expected != stored.revision {
                return Err(ManagerError::conflict(format!(
                    "Expected fact '{id}' revision {expected}, found {}",
                    stored.revision
                )));
            }
            if content.is_none() && category.is_none() && confidence.is_none() {
                return self.fresh_document(user.as_ref(), &agent).await;
            }
            let draft = patched_draft(&stored, content.as_deref(), category.clone(), confidence)?;
            match self
                .storage
                .upsert_fact(user.as_ref(), &agent, draft, None, Some(expected))
                .await
            {
                Ok(_) => return self.fresh_document(user.as_ref(), &agent).await,
                // The caller named no revision: the patch applies to whatever is current, so a
                // concurrent write of the same fact is re-read and the patch applied again.
                Err(e)
                    if e.is_conflict()
                        && patch.expected_revision.is_none()
                        && attempt < MAX_SNAPSHOT_ATTEMPTS =>
                {
                    tracing::info!(attempt, error = %e, "fact changed during update; applying the patch to the fresh fact");
                    conflict_backoff(attempt).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn delete_fact(
        &self,
        fact_id: &str,
        expected_revision: Option<u64>,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let (user, agent) = self.bucket(&scope)?;
        let _turn = self.write_turns.take(user.as_ref()).await;
        let id = FactId::new(fact_id)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let stored = self.stored_fact(user.as_ref(), &agent, &id).await?;
            let revision = expected_revision.unwrap_or(stored.revision);
            let result = match self
                .storage
                .delete_fact(user.as_ref(), &agent, &id, None, Some(revision))
                .await
            {
                Ok(r) => r,
                // No revision named: deleting means "whatever is current", so a concurrent
                // update of the fact is re-read and deleted at its new revision.
                Err(e)
                    if e.is_conflict()
                        && expected_revision.is_none()
                        && attempt < MAX_SNAPSHOT_ATTEMPTS =>
                {
                    tracing::info!(attempt, error = %e, "fact changed during delete; deleting the fresh fact");
                    conflict_backoff(attempt).await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if !result.deleted_fact_ids.contains(&id) {
                // Deleted concurrently between the read and the write.
                return Err(not_found(fact_id));
            }
            return self.fresh_document(user.as_ref(), &agent).await;
        }
    }
}

/// Normalises a manager-built draft (it always carries its id) for capacity scoring.
pub(super) fn normalize_candidate(
    draft: &FactDraft,
    scope: &FactScope,
    now: Timestamp,
    id: &FactId,
) -> Result<Fact, ManagerError> {
    let fallback = || id.clone();
    let ctx = NormalizeContext {
        scope,
        existing: None,
        now,
        new_id: &fallback,
    };
    normalize_fact(draft, &ctx).map_err(invalid_fact)
}

/// A fact the manager built or was sent that the fact rules refuse, with its stable code.
pub(super) fn invalid_fact(e: FactError) -> ManagerError {
    let code = match e.field() {
        "content" => InvalidInputCode::Content,
        "confidence" => InvalidInputCode::Confidence,
        _ => InvalidInputCode::Other,
    };
    ManagerError::invalid(code, e.to_string())
}

/// The change set of a create: the new fact, which survived capacity (create-only), and the
/// deletion of every stored fact the policy evicted (with its revision as a precondition).
fn creation_changes(
    snapshot: &MemoryDocument,
    decision: Option<&CapacityDecision>,
    id: &FactId,
    draft: FactDraft,
) -> ChangeSet {
    let mut changes = ChangeSet {
        upserts: vec![draft],
        upsert_revisions: Some([(id.clone(), None)].into_iter().collect()),
        ..ChangeSet::default()
    };
    if let Some(d) = decision {
        let mut revisions = BTreeMap::new();
        for evicted in &d.decision.evicted {
            if let Some(f) = snapshot.fact(&evicted.fact_id) {
                changes.deletes.push(f.id.clone());
                revisions.insert(f.id.clone(), f.revision);
            }
        }
        changes.delete_revisions = (!revisions.is_empty()).then_some(revisions);
    }
    changes
}

/// The stored fact with the patch applied, sent back with its revision.
///
/// A title derived from the old content is re-derived from the new content (an explicit title
/// is kept); a category different from the stored one drops the stale `categoryExtension`
/// (storage recomputes it for a non-core category), the same category keeps it.
fn patched_draft(
    stored: &Fact,
    content: Option<&str>,
    category: Option<String>,
    confidence: Option<f64>,
) -> Result<FactDraft, ManagerError> {
    let mut draft = stored.to_draft();
    if let Some(c) = content {
        if stored.title == fact_title(None, &stored.content) {
            draft.remove("title");
        }
        draft = draft.with_content(c).map_err(invalid_fact)?;
    }
    if let Some(c) = category {
        // Resending the stored category (an edit form always sends it) keeps the extension;
        // only a real change drops it, and storage derives a new one for a non-core category.
        if stored.category.as_deref() != Some(c.as_str()) {
            draft.remove("categoryExtension");
        }
        draft = draft.with_category(c);
    }
    if let Some(c) = confidence {
        draft = draft.with_confidence(c).map_err(invalid_fact)?;
    }
    Ok(draft)
}
