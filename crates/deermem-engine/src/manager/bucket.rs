//! Whole-bucket operations: clearing (everything, or one agent's facts with a snapshot retry)
//! and importing (replacing the bucket with a document, with the per-fact revision rule and
//! capacity eviction).

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use deermem_core::ports::{MemoryAdmin, MemoryScope};
use std::sync::Arc;

use deermem_core::policy::eviction::FactUsageMap;
use deermem_core::{
    AgentName, ApplyOptions, ChangeSet, Fact, FactDraft, FactId, FactScope, InvalidInputCode,
    MAX_IMPORT_FACTS, ManagerError, MemoryDocument, PublicFact, PublicMemoryDocument, Scope,
    StorageError, SummaryPatch, Timestamp, UserId,
};
use deermem_updater::DeerMemConfig;

use super::facts::{ID_DRAWS, normalize_candidate};
use super::{DeerMemManager, MAX_SNAPSHOT_ATTEMPTS, conflict_backoff};
use deermem_updater::{FactIdSource, capacity_decision};

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
    /// The document left the id blank (`""` or absent): the id was drawn here, and is drawn
    /// again should it name a stored fact.
    generated: bool,
    draft: FactDraft,
}

/// The id an import fact names (`None` when blank: the manager generates one, as the
/// reference does).
fn given_id(i: usize, f: &PublicFact) -> Result<Option<FactId>, ManagerError> {
    if f.id.is_empty() {
        return Ok(None);
    }
    FactId::new(f.id.clone())
        .map(Some)
        .map_err(|e| memory_data(format!("memory_data.facts[{i}].id: {e}")))
}

/// The draft of an import fact (its fields checked by the draft's rules).
fn import_draft(i: usize, f: &PublicFact) -> Result<FactDraft, ManagerError> {
    f.to_draft()
        .map_err(|e| memory_data(format!("memory_data.facts[{i}]: {e}")))
}

fn duplicate_id(id: &FactId) -> ManagerError {
    memory_data(format!("memory_data.facts: duplicate fact id '{id}'"))
}

/// A fresh id that is not in `taken`.
fn fresh_id(ids: &FactIdSource, taken: &HashSet<FactId>) -> Result<FactId, ManagerError> {
    for _ in 0..ID_DRAWS {
        let id = ids.next_id();
        if !taken.contains(&id) {
            return Ok(id);
        }
    }
    Err(ManagerError::conflict("could not draw an unused fact id"))
}

/// Validates the facts of an import document: at most [`MAX_IMPORT_FACTS`] of them, valid and
/// unique ids (a blank one is drawn), then each fact's fields (the draft's rules).
fn incoming_facts(
    document: &PublicMemoryDocument,
    ids: &FactIdSource,
) -> Result<Vec<Incoming>, ManagerError> {
    if document.facts.len() > MAX_IMPORT_FACTS {
        return Err(too_many_facts(document.facts.len()));
    }
    let mut seen: HashSet<FactId> = HashSet::new();
    let mut given = Vec::with_capacity(document.facts.len());
    for (i, f) in document.facts.iter().enumerate() {
        let id = given_id(i, f)?;
        if let Some(id) = &id
            && !seen.insert(id.clone())
        {
            return Err(duplicate_id(id));
        }
        given.push(id);
    }
    // The fields are checked once every id is (the order the checks had when the fields were
    // only checked while scoring the facts for capacity).
    let mut out = Vec::with_capacity(given.len());
    for (i, (id, f)) in given.into_iter().zip(&document.facts).enumerate() {
        let mut draft = import_draft(i, f)?;
        let (id, generated) = match id {
            Some(id) => (id, false),
            None => {
                let id = fresh_id(ids, &seen)?;
                seen.insert(id.clone());
                draft.set_id(id.clone());
                (id, true)
            }
        };
        out.push(Incoming {
            id,
            generated,
            draft,
        });
    }
    Ok(out)
}

/// Draws again every generated id that names a fact of `snapshot` (a generated id never
/// replaces a stored fact).
fn redraw_taken(
    incoming: &mut [Incoming],
    snapshot: &MemoryDocument,
    ids: &FactIdSource,
) -> Result<(), ManagerError> {
    if !incoming
        .iter()
        .any(|f| f.generated && snapshot.fact(f.id.as_str()).is_some())
    {
        return Ok(());
    }
    let mut taken: HashSet<FactId> = incoming.iter().map(|f| f.id.clone()).collect();
    taken.extend(snapshot.facts.iter().map(|f| f.id.clone()));
    for f in incoming
        .iter_mut()
        .filter(|f| f.generated && snapshot.fact(f.id.as_str()).is_some())
    {
        let id = fresh_id(ids, &taken)?;
        taken.insert(id.clone());
        f.draft.set_id(id.clone());
        f.id = id;
    }
    Ok(())
}

/// The facts of an import document received one at a time and trimmed by the capacity policy
/// as they arrive, so a document of any length is imported holding at most twice `max_facts`
/// facts (plus the ids seen, for the duplicate check), never the whole list. Made by
/// [`DeerMemManager::import_trim`]; [`ImportTrim::finish`] gives the facts to import.
///
/// Each fact is checked as the import checks it (id, duplicate id, fields), with its index in
/// the document in the message. The policy is the one the import applies, with the same usage
/// heat; it keeps the best `max_facts` by score (corrections' reserved slots included), so
/// trimming along the way keeps what one decision over the whole list would keep.
pub struct ImportTrim {
    config: Arc<DeerMemConfig>,
    usage: FactUsageMap,
    now: Timestamp,
    scope: FactScope,
    ids: FactIdSource,
    /// The ids the document named, for the duplicate check.
    given: HashSet<FactId>,
    /// Every id in use here: those named and the stand-ins of blank ones.
    seen: HashSet<FactId>,
    /// The facts kept so far, in document order, and their scored form.
    facts: Vec<PublicFact>,
    scored: Vec<Fact>,
    next: usize,
}

impl std::fmt::Debug for ImportTrim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportTrim")
            .field("received", &self.next)
            .field("kept", &self.facts.len())
            .finish_non_exhaustive()
    }
}

impl ImportTrim {
    /// Checks the next fact of the document and keeps it for now; when more than twice
    /// `max_facts` are kept, the policy trims them to `max_facts`.
    ///
    /// # Errors
    /// `InvalidInput{MemoryData}` naming `memory_data.facts[i]`: an invalid or duplicate id,
    /// or a field the fact rules refuse.
    pub fn push(&mut self, fact: PublicFact) -> Result<(), ManagerError> {
        let i = self.next;
        self.next += 1;
        let (id, mut draft) = match given_id(i, &fact)? {
            Some(id) => {
                if !self.given.insert(id.clone()) {
                    return Err(duplicate_id(&id));
                }
                self.seen.insert(id.clone());
                (id, import_draft(i, &fact)?)
            }
            None => {
                // A stand-in id for scoring only: the fact keeps its blank id, and the import
                // draws the real one against the stored facts.
                let id = fresh_id(&self.ids, &self.seen)?;
                self.seen.insert(id.clone());
                (id, import_draft(i, &fact)?)
            }
        };
        draft.set_id(id.clone());
        let scored = normalize_candidate(&draft, &self.scope, self.now, &id)
            .map_err(|e| memory_data(format!("memory_data.facts[{i}]: {e}")))?;
        self.facts.push(fact);
        self.scored.push(scored);
        if self.scored.len() > self.config.max_facts.saturating_mul(2).max(1) {
            self.trim();
        }
        Ok(())
    }

    /// How many facts were received.
    pub fn received(&self) -> usize {
        self.next
    }

    fn trim(&mut self) {
        let Some(decision) = capacity_decision(&self.scored, &self.config, &self.usage, self.now)
        else {
            return;
        };
        let kept: HashSet<&FactId> = decision.decision.kept.iter().map(|f| &f.id).collect();
        let keep: Vec<bool> = self.scored.iter().map(|f| kept.contains(&f.id)).collect();
        let mut flags = keep.iter();
        self.facts
            .retain(|_| flags.next().copied().unwrap_or(false));
        let mut flags = keep.iter();
        self.scored
            .retain(|_| flags.next().copied().unwrap_or(false));
    }

    /// The facts to import, in document order: at most `max_facts` of them when more were
    /// received (the import's own capacity decision then keeps the same ones).
    pub fn finish(mut self) -> Vec<PublicFact> {
        if self.scored.len() > self.config.max_facts {
            self.trim();
        }
        self.facts
    }
}

impl DeerMemManager {
    /// A trim for the facts of an import into `scope` that arrive one at a time (see
    /// [`ImportTrim`]), scoring with this manager's policy, clock and the bucket's usage heat.
    ///
    /// # Errors
    /// The scope is refused (`strict_user_scope`).
    pub async fn import_trim(&self, scope: &MemoryScope) -> Result<ImportTrim, ManagerError> {
        let (user, agent) = self.bucket(scope)?;
        let usage = self
            .usage_for_capacity(user.as_ref(), &agent, usize::MAX)
            .await;
        Ok(ImportTrim {
            config: Arc::clone(&self.config),
            usage,
            now: self.clock.now(),
            scope: Scope::new(user, Some(agent)).to_fact_scope(),
            ids: self.ids.clone(),
            given: HashSet::new(),
            seen: HashSet::new(),
            facts: Vec::new(),
            scored: Vec::new(),
            next: 0,
        })
    }

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
        let mut incoming = incoming_facts(&document, &self.ids)?;
        let fact_scope = Scope::new(user.cloned(), Some(agent.clone())).to_fact_scope();
        let summaries = SummaryPatch {
            user: Some(document.user.to_section().0),
            history: Some(document.history.to_section().0),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let snapshot = self.storage.load(user, Some(&agent)).await?;
            redraw_taken(&mut incoming, &snapshot, &self.ids)?;
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
