//! `InMemoryStorage`: a `MemoryStorage` fake holding everything in process memory. It is
//! stricter than production: every stored fact is re-validated through core's normalisation on
//! every read, and every draft is validated before anything is applied, so a caller that
//! relies on lenient behaviour fails here first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use deermem_core::fact::{FactDraft, FactScope, NormalizeContext, normalize_fact};
use deermem_core::policy::commit::{self, CommitRequest, CurrentRecord, Decision, StoredFact};
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::policy::metadata;
use deermem_core::policy::substring::{SubstringRules, substring_hits};
use deermem_core::ports::MemoryStorageExt;
use deermem_core::ports::{
    Clock, FactMetadata, FactRepository, ListQuery, MigrationReport, ScopedSearch,
    StorageCapabilities,
};
use deermem_core::{
    AgentName, ApplyOptions, ChangeResult, ChangeSet, Fact, FactId, MemoryDocument, RebuildReport,
    RetrievalStatus, SearchHit, SearchQuery, StorageError, SummaryPatch, SummarySection, Timestamp,
    UserId,
};
use serde_json::{Map, Value};

#[derive(Debug, Default, Clone)]
struct UserData {
    /// `(revision, lastUpdated, user, history)` once something was committed.
    manifest: Option<(u64, String, SummarySection, SummarySection)>,
    facts: BTreeMap<AgentName, BTreeMap<String, Fact>>,
    usage: BTreeMap<AgentName, Map<String, Value>>,
    audit: BTreeMap<AgentName, Vec<Value>>,
}

/// An in-memory storage for tests (see the module documentation).
#[derive(Debug)]
pub struct InMemoryStorage {
    clock: Arc<dyn Clock>,
    users: Mutex<HashMap<Option<UserId>, UserData>>,
    audit_max_entries: usize,
    half_life_days: f64,
}

fn fresh_id() -> FactId {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    FactId::long_from_hex(&hex).unwrap_or_else(|e| panic!("a v4 uuid is 32 hex digits: {e}"))
}

impl InMemoryStorage {
    /// An empty storage reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            users: Mutex::new(HashMap::new()),
            audit_max_entries: 200,
            half_life_days: 30.0,
        }
    }

    fn data(&self) -> MutexGuard<'_, HashMap<Option<UserId>, UserData>> {
        self.users.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn scope(user: Option<&UserId>, agent: &AgentName) -> FactScope {
        FactScope {
            user_id: user.map(|u| u.as_str().to_owned()),
            agent_name: Some(agent.as_str().to_owned()),
        }
    }

    /// Re-validates a stored fact (the strictness of this fake).
    fn revalidate(&self, fact: &Fact) -> Result<Fact, StorageError> {
        let ctx = NormalizeContext {
            scope: &fact.scope,
            existing: None,
            now: self.clock.now(),
            new_id: &fresh_id,
        };
        let draft = FactDraft::from_json(fact.to_internal_map());
        let again = draft.and_then(|d| normalize_fact(&d, &ctx)).map_err(|e| {
            StorageError::corrupt(format!(
                "stored fact '{}' no longer validates: {e}",
                fact.id
            ))
        })?;
        if &again != fact {
            return Err(StorageError::corrupt(format!(
                "stored fact '{}' does not round-trip through normalisation",
                fact.id
            )));
        }
        Ok(again)
    }

    fn document(
        &self,
        data: Option<&UserData>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        let now = self.clock.now();
        let mut doc = MemoryDocument::empty(now);
        if let Some((rev, last, user, hist)) = data.and_then(|d| d.manifest.clone()) {
            doc.version = "2.0".into();
            doc.revision = rev;
            doc.last_updated = last;
            doc.user = user;
            doc.history = hist;
        }
        if let (Some(d), Some(a)) = (data, agent)
            && let Some(facts) = d.facts.get(a)
        {
            for f in facts.values() {
                doc.facts.push(self.revalidate(f)?);
            }
        }
        Ok(doc)
    }

    #[allow(clippy::too_many_lines)]
    /// One commit under the data lock, decided by the core's shared commit policy.
    fn commit(
        &self,
        user: Option<&UserId>,
        req: &CommitRequest,
    ) -> Result<ChangeResult, StorageError> {
        let now = self.clock.now();
        let mut all = self.data();
        let data = all.entry(user.cloned()).or_default();
        let record = data.manifest.as_ref().map(|m| CurrentRecord {
            revision: m.0,
            needs_rewrite: false,
        });
        let bucket = req
            .agent
            .as_ref()
            .and_then(|a| data.facts.get(a))
            .cloned()
            .unwrap_or_default();
        let stored = |id: &FactId| {
            Ok::<_, StorageError>(bucket.get(id.as_str()).map(|f| StoredFact {
                fact: f.clone(),
                foreign_owner: false,
            }))
        };
        let sections = || {
            Ok(data.manifest.as_ref().map_or_else(
                || {
                    (
                        SummarySection::default_user(),
                        SummarySection::default_history(),
                    )
                },
                |m| (m.2.clone(), m.3.clone()),
            ))
        };
        let raw_user = user.map(|u| u.as_str().to_owned());
        let w = match commit::decide(req, raw_user, record, stored, sections, now)? {
            Decision::Unchanged => {
                let (rev, last, ..) = data.manifest.clone().unwrap_or_default();
                return Ok(ChangeResult {
                    version: "2.0".into(),
                    revision: rev,
                    last_updated: last,
                    upserted_facts: Vec::new(),
                    deleted_fact_ids: Vec::new(),
                });
            }
            Decision::Write(w) => *w,
        };
        let written: Vec<Fact> = w.writes.into_iter().map(|d| d.fact).collect();
        if let Some(agent) = &req.agent {
            let bucket = data.facts.entry(agent.clone()).or_default();
            for f in &written {
                bucket.insert(f.id.to_string(), f.clone());
            }
            for id in &w.removals {
                bucket.remove(id.as_str());
            }
            if !w.removals.is_empty() {
                let gone: Vec<String> = w.removals.iter().map(ToString::to_string).collect();
                if let Some(u) = data.usage.get_mut(agent) {
                    u.retain(|k, _| !gone.contains(k));
                }
            }
        }
        let last = now.to_iso_z();
        data.manifest = Some((w.next_revision, last.clone(), w.user, w.history));
        Ok(ChangeResult {
            version: "2.0".into(),
            revision: w.next_revision,
            last_updated: last,
            upserted_facts: written,
            deleted_fact_ids: w.removals,
        })
    }
}

#[async_trait]
impl FactRepository for InMemoryStorage {
    fn capabilities(&self) -> StorageCapabilities {
        StorageCapabilities {
            names: ["revision", "fact-repository", "substring-fallback"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
            persistent: false,
            retrieval: false,
        }
    }

    async fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        let all = self.data();
        self.document(all.get(&user.cloned()), agent)
    }

    async fn reload(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        self.load(user, agent).await
    }

    async fn get_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
    ) -> Result<Option<Fact>, StorageError> {
        let all = self.data();
        match all
            .get(&user.cloned())
            .and_then(|d| d.facts.get(agent))
            .and_then(|b| b.get(id.as_str()))
        {
            Some(f) => self.revalidate(f).map(Some),
            None => Ok(None),
        }
    }

    async fn list_facts(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        query: &ListQuery,
    ) -> Result<Vec<Fact>, StorageError> {
        if query.limit == Some(0) {
            return query.apply(Vec::new());
        }
        query.apply(self.load(user, Some(agent)).await?.facts)
    }

    async fn apply_changes(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        changes: ChangeSet,
        options: ApplyOptions,
    ) -> Result<ChangeResult, StorageError> {
        let mut req = CommitRequest::prepare(changes, agent, fresh_id)?;
        if let Some(agent) = agent {
            // Strict: every draft must validate on its own before anything is applied.
            let scope = Self::scope(user, agent);
            for (_, d) in &req.upserts {
                let ctx = NormalizeContext {
                    scope: &scope,
                    existing: None,
                    now: self.clock.now(),
                    new_id: &fresh_id,
                };
                normalize_fact(d, &ctx)?;
            }
        }
        req.expected_revision = options.expected_manifest_revision;
        let can_rebase = commit::may_rebase(&req, options.allow_manifest_rebase);
        let mut attempt = 0;
        loop {
            match self.commit(user, &req) {
                Err(StorageError::ManifestConflict { found, .. }) if can_rebase && attempt < 2 => {
                    req.expected_revision = Some(found);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn new_fact_id(&self) -> FactId {
        fresh_id()
    }

    async fn clear_all(&self, user: Option<&UserId>) -> Result<MemoryDocument, StorageError> {
        let agents: Vec<AgentName> = self
            .data()
            .get(&user.cloned())
            .map(|d| d.facts.keys().cloned().collect())
            .unwrap_or_default();
        for a in &agents {
            let ids: Vec<FactId> = self
                .load(user, Some(a))
                .await?
                .facts
                .into_iter()
                .map(|f| f.id)
                .collect();
            if !ids.is_empty() {
                self.apply_changes(
                    user,
                    Some(a),
                    ChangeSet {
                        deletes: ids,
                        ..ChangeSet::default()
                    },
                    ApplyOptions::default(),
                )
                .await?;
            }
        }
        self.update_summaries(
            user,
            SummaryPatch {
                user: Some(SummarySection::default_user().0),
                history: Some(SummarySection::default_history().0),
            },
            None,
        )
        .await?;
        if let Some(d) = self.data().get_mut(&user.cloned()) {
            d.usage.clear();
            d.audit.clear();
        }
        self.load(user, Some(&AgentName::default_bucket())).await
    }

    async fn close(&self) {}
}

#[async_trait]
impl FactMetadata for InMemoryStorage {
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<FactUsageMap, StorageError> {
        Ok(self
            .data()
            .get(&user.cloned())
            .and_then(|d| d.usage.get(agent).cloned())
            .unwrap_or_default())
    }

    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        let now = at.unwrap_or_else(|| self.clock.now());
        let mut all = self.data();
        let Some(data) = all.get_mut(&user.cloned()) else {
            return Ok(());
        };
        let existing: Vec<String> = {
            let bucket = data.facts.get(agent);
            let mut seen = HashSet::new();
            ids.iter()
                .filter(|i| seen.insert(i.as_str().to_owned()))
                .filter(|i| bucket.is_some_and(|b| b.contains_key(i.as_str())))
                .map(ToString::to_string)
                .collect()
        };
        if existing.is_empty() {
            return Ok(());
        }
        let usage = data.usage.entry(agent.clone()).or_default();
        metadata::record_accesses(usage, &existing, now, self.half_life_days);
        Ok(())
    }

    async fn record_capacity_eviction(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        decision: &EvictionDecision,
        max_facts: usize,
        _shadow: Option<&EvictionDecision>,
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        if decision.evicted.is_empty() || self.audit_max_entries == 0 {
            return Ok(());
        }
        let now = at.unwrap_or_else(|| self.clock.now());
        let mut all = self.data();
        let events = all
            .entry(user.cloned())
            .or_default()
            .audit
            .entry(agent.clone())
            .or_default();
        events.push(serde_json::json!({
            "occurredAt": now.to_iso_z(),
            "maxFacts": max_facts,
            "evicted": decision.evicted_ids(),
        }));
        let excess = events.len().saturating_sub(self.audit_max_entries);
        events.drain(..excess);
        Ok(())
    }

    async fn clear_fact_metadata(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: Option<&[FactId]>,
    ) -> Result<(), StorageError> {
        let mut all = self.data();
        let Some(data) = all.get_mut(&user.cloned()) else {
            return Ok(());
        };
        match ids {
            None => {
                data.usage.remove(agent);
                data.audit.remove(agent);
            }
            Some(ids) => {
                let gone: Vec<&str> = ids.iter().map(FactId::as_str).collect();
                if let Some(u) = data.usage.get_mut(agent) {
                    u.retain(|k, _| !gone.contains(&k.as_str()));
                }
            }
        }
        Ok(())
    }
}

#[async_trait]
impl ScopedSearch for InMemoryStorage {
    async fn search_facts(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StorageError> {
        if query.is_trivially_empty() {
            return Ok(Vec::new());
        }
        let mut facts = Vec::new();
        for scope in &query.scopes {
            let Some(agent) = &scope.agent else { continue };
            facts.extend(self.load(scope.user.as_ref(), Some(agent)).await?.facts);
        }
        Ok(substring_hits(&facts, query, SubstringRules::STORAGE))
    }

    async fn rebuild_index(
        &self,
        _scopes: Option<&[(Option<UserId>, AgentName)]>,
    ) -> Result<RebuildReport, StorageError> {
        Ok(RebuildReport {
            supported: false,
            reason: Some("retrieval_not_configured".into()),
            ..RebuildReport::default()
        })
    }

    async fn retrieval_status(&self) -> RetrievalStatus {
        RetrievalStatus {
            configured: false,
            mode: "substring_fallback".into(),
            ..RetrievalStatus::default()
        }
    }
}

impl InMemoryStorage {
    pub async fn migrate(
        &self,
        user: Option<&UserId>,
        _agent: &AgentName,
        dry_run: bool,
    ) -> Result<MigrationReport, StorageError> {
        let doc = self.load(user, None).await?;
        Ok(MigrationReport {
            migrated: false,
            from_version: (doc.revision > 0).then(|| doc.version.clone()),
            to_version: doc.version,
            revision: doc.revision,
            migrated_facts: 0,
            dry_run,
        })
    }

    pub async fn list_users(&self) -> Result<Vec<UserId>, StorageError> {
        let mut users: Vec<UserId> = self.data().keys().flatten().cloned().collect();
        users.sort();
        Ok(users)
    }
}
