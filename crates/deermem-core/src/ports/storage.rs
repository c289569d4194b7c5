//! The storage ports, each saying one thing: [`FactRepository`] (load a scope, commit a change
//! set under optimistic revisions), [`FactMetadata`] (usage heat and the capacity audit),
//! [`ScopedSearch`] (ranked search over a derived index), [`MemoryStorage`] (all three, what the
//! manager holds), and [`MemoryStorageExt`] (point writes, whole-document save and summaries,
//! derived once from the repository for every adapter).
//!
//! A new storage adapter implements the three small traits and runs the storage contract suite
//! of `deermem-testkit`; everything else comes with them.

use std::collections::BTreeSet;
use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::caches::CacheBound;
use crate::document::{
    ApplyOptions, ChangeResult, ChangeSet, MemoryDocument, SummariesSnapshot, SummaryPatch,
};
use crate::error::StorageError;
use crate::fact::{Fact, FactDraft};
use crate::ids::{AgentName, FactId, UserId};
use crate::policy::eviction::{EvictionDecision, FactUsageMap};
use crate::search::{RebuildReport, RetrievalStatus, SearchHit, SearchQuery};
use crate::time::Timestamp;

/// What a storage adapter supports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageCapabilities {
    /// Capability names as the reference reports them (`file`, `markdown-facts`,
    /// `global-summary-json`, `revision`, `journal`, `fact-repository`, `substring-fallback`,
    /// `retrieval`).
    pub names: BTreeSet<String>,
    /// Whether data survives the process.
    pub persistent: bool,
    /// Whether a retrieval index is attached.
    pub retrieval: bool,
}

/// Filters and paging for [`FactRepository::list_facts`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListQuery {
    /// Keep facts whose internal field equals the value (Python equality), for every entry.
    pub filters: Map<String, Value>,
    /// Skip this many matches.
    pub cursor: usize,
    /// Return at most this many; `None` returns all (the reference's default of 100 silently
    /// truncated its internal callers, so ours has no default cap).
    pub limit: Option<usize>,
}

impl ListQuery {
    /// The facts (already sorted by id) that match every filter (Python equality on the
    /// internal field), after `cursor`, at most `limit`: what every adapter's `list_facts`
    /// answers.
    ///
    /// # Errors
    /// `InvalidInput` for `limit == Some(0)`.
    pub fn apply(&self, facts: impl IntoIterator<Item = Fact>) -> Result<Vec<Fact>, StorageError> {
        if self.limit == Some(0) {
            return Err(StorageError::invalid(
                "limit",
                "cursor must be >= 0 and limit must be >= 1",
            ));
        }
        let matched = facts.into_iter().filter(|f| {
            if self.filters.is_empty() {
                return true;
            }
            let m = f.to_internal_map();
            self.filters
                .iter()
                .all(|(k, v)| m.get(k).is_some_and(|x| deermem_pycompat::py::py_eq(x, v)))
        });
        Ok(matched
            .skip(self.cursor)
            .take(self.limit.unwrap_or(usize::MAX))
            .collect())
    }
}

/// The outcome of a v1 → v2 migration of one user.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationReport {
    /// Whether anything was migrated.
    pub migrated: bool,
    /// The manifest version before, if a manifest with a version existed.
    #[serde(rename = "fromVersion")]
    pub from_version: Option<String>,
    /// The document version after (`2.0`, or `1.0` when no manifest exists).
    #[serde(rename = "toVersion")]
    pub to_version: String,
    /// Shared revision after.
    pub revision: u64,
    /// Facts moved into Markdown.
    #[serde(rename = "migratedFacts", default)]
    pub migrated_facts: usize,
    /// Whether only a plan was computed (dry run).
    #[serde(rename = "dryRun", default)]
    pub dry_run: bool,
}

/// The fact repository: per-user summaries plus per-agent facts, committed in change sets.
///
/// # Contract
/// - **Scopes.** `user == None` is the legacy root layout. Fact operations need an agent; a
///   fact change without one is `InvalidInput` naming `agent_name`. A request for one user never
///   reads or writes another user's data.
/// - **Documents.** `load` returns the user's summaries and the agent's facts sorted by id, with
///   structured sources. A user never written to reads as the empty template (`version` "1.0",
///   revision 0). Returned values are owned copies: mutating them never affects storage.
/// - **Revisions.** Every commit that writes increments the shared user revision by exactly 1; a
///   no-op changes nothing. A fact's revision starts at the value it is created with (default 1)
///   and increases by 1 on each material change.
/// - **Conflicts.** A stale `expected_manifest_revision` fails with `ManifestConflict` unless
///   `allow_manifest_rebase` is set and the change is a pure fact point operation whose
///   per-fact preconditions still hold (then it rebases, at most 3 attempts). A per-fact
///   precondition failure is `FactConflict`: creating an existing id, updating with a stale
///   `revision`, deleting with a stale `delete_revisions` entry. Nothing is written on conflict.
/// - **Atomicity.** `apply_changes` is all-or-nothing and durable before it returns: after a
///   crash, the next access rolls the change back or forward.
/// - **Delta results.** `apply_changes` returns only the facts actually written and the ids
///   actually deleted; never a complete document.
/// - **Corruption.** Unreadable manifests, fact files, journals or mismatched backups are
///   `Corrupt`, never silently repaired or skipped in canonical reads.
#[async_trait]
pub trait FactRepository: Send + Sync + Debug {
    /// What the adapter supports.
    fn capabilities(&self) -> StorageCapabilities;

    /// The bounds of the adapter's in-process caches, and of the derived index it keeps (see
    /// [`CacheBound`]). Empty by default.
    fn cache_bounds(&self) -> Vec<CacheBound> {
        Vec::new()
    }

    /// The user's summaries plus the agent's facts (none for `agent == None`), from the cache
    /// when the manifest is unchanged. Runs pending lazy migrations first.
    ///
    /// # Errors
    /// `Corrupt` for unreadable data; `InvalidInput` for scope problems.
    async fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError>;

    /// Like `load` but always re-reads (picking up out-of-band Markdown edits) and rebuilds the
    /// scope's index when an agent is given.
    ///
    /// # Errors
    /// As `load`.
    async fn reload(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError>;

    /// One fact, or `None`.
    ///
    /// # Errors
    /// `Corrupt` when the fact file is unreadable.
    async fn get_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
    ) -> Result<Option<Fact>, StorageError>;

    /// The agent's facts matching the query, sorted by id.
    ///
    /// # Errors
    /// As `load`.
    async fn list_facts(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        query: &ListQuery,
    ) -> Result<Vec<Fact>, StorageError>;

    /// Applies a change set atomically (see the contract above).
    ///
    /// # Errors
    /// `ManifestConflict`, `FactConflict`, `InvalidInput` (duplicate ids, a fact
    /// both upserted and deleted, fact changes without an agent), `Corrupt`, `LockTimeout`, `Io`.
    async fn apply_changes(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        changes: ChangeSet,
        options: ApplyOptions,
    ) -> Result<ChangeResult, StorageError>;

    /// A fresh storage-style fact id (`fact_` + 32 hex).
    fn new_fact_id(&self) -> FactId;

    /// Deletes every agent's facts and resets the summaries, keeping agent configuration files;
    /// returns the reloaded default-bucket document.
    ///
    /// # Errors
    /// As `apply_changes`.
    async fn clear_all(&self, user: Option<&UserId>) -> Result<MemoryDocument, StorageError>;

    /// Releases resources (the index connection). Idempotent.
    async fn close(&self);
}

/// Metadata about facts kept beside them and never part of a fact's revision: the decaying
/// query-access heat the hybrid eviction policy reads, and the bounded capacity audit.
#[async_trait]
pub trait FactMetadata: Send + Sync + Debug {
    /// The usage sidecar of the agent (tolerant: unreadable sidecars read as empty).
    ///
    /// # Errors
    /// `LockTimeout` or scope errors.
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<FactUsageMap, StorageError>;

    /// Records one query access for each existing fact among `ids`.
    ///
    /// # Errors
    /// `LockTimeout`, `Io`.
    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> Result<(), StorageError>;

    /// Appends a capacity-eviction event to the bounded audit (metadata only).
    ///
    /// # Errors
    /// `LockTimeout`, `Io`.
    async fn record_capacity_eviction(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        decision: &EvictionDecision,
        max_facts: usize,
        shadow: Option<&EvictionDecision>,
        at: Option<Timestamp>,
    ) -> Result<(), StorageError>;

    /// Removes sidecar metadata of the given ids, or all of the agent's with `None`.
    ///
    /// # Errors
    /// `LockTimeout`, `Io`.
    async fn clear_fact_metadata(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: Option<&[FactId]>,
    ) -> Result<(), StorageError>;
}

/// Ranked search over the storage's facts, through a derived index kept in step with commits.
#[async_trait]
pub trait ScopedSearch: Send + Sync + Debug {
    /// Ranked search within the query's scopes through the retrieval index, falling back to a
    /// substring scan when no index is configured or the scope is dirty and cannot be rebuilt.
    ///
    /// # Errors
    /// `InvalidInput` for bad scopes; index failures fall back instead of failing.
    async fn search_facts(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StorageError>;

    /// Rebuilds the derived index for the given `(user, agent)` scopes, or for everything.
    ///
    /// # Errors
    /// Scoped rebuilds propagate `Corrupt`; failures of single facts are counted, not raised.
    async fn rebuild_index(
        &self,
        scopes: Option<&[(Option<UserId>, AgentName)]>,
    ) -> Result<RebuildReport, StorageError>;

    /// Index configuration and health.
    async fn retrieval_status(&self) -> RetrievalStatus;
}

/// Everything the memory manager needs of a storage: implemented for every type that
/// implements the three ports.
pub trait MemoryStorage: FactRepository + FactMetadata + ScopedSearch {}

impl<T: FactRepository + FactMetadata + ScopedSearch + ?Sized> MemoryStorage for T {}

/// Operations every fact repository gets from [`FactRepository::apply_changes`] and
/// [`FactRepository::load`]: point writes, the compatibility whole-document save, and the
/// summaries. Implemented once, here, for every repository.
#[async_trait]
pub trait MemoryStorageExt: FactRepository {
    /// Creates or updates one fact: `expected_fact_revision == None` means create-only.
    /// Rebases over unrelated concurrent commits.
    ///
    /// # Errors
    /// As `apply_changes`.
    async fn upsert_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        fact: FactDraft,
        expected_manifest_revision: Option<u64>,
        expected_fact_revision: Option<u64>,
    ) -> Result<ChangeResult, StorageError> {
        let mut fact = fact;
        let id = match fact.id() {
            Some(id) => id.clone(),
            None => {
                let id = self.new_fact_id();
                fact.set_id(id.clone());
                id
            }
        };
        let changes = ChangeSet {
            upserts: vec![fact],
            upsert_revisions: Some([(id, expected_fact_revision)].into_iter().collect()),
            ..ChangeSet::default()
        };
        let options = ApplyOptions {
            expected_manifest_revision,
            allow_manifest_rebase: true,
        };
        self.apply_changes(user, Some(agent), changes, options)
            .await
    }

    /// Deletes one fact; with `expected_fact_revision` the delete is a point operation that can
    /// rebase. Deleting an absent fact is a no-op.
    ///
    /// # Errors
    /// As `apply_changes`.
    async fn delete_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
        expected_manifest_revision: Option<u64>,
        expected_fact_revision: Option<u64>,
    ) -> Result<ChangeResult, StorageError> {
        let changes = ChangeSet {
            deletes: vec![id.clone()],
            delete_revisions: expected_fact_revision
                .map(|r| [(id.clone(), r)].into_iter().collect()),
            ..ChangeSet::default()
        };
        let options = ApplyOptions {
            expected_manifest_revision,
            allow_manifest_rebase: true,
        };
        self.apply_changes(user, Some(agent), changes, options)
            .await
    }

    /// The compatibility whole-document save: the agent's facts become exactly `document.facts`
    /// (missing ones deleted); agent-less saves write the summaries.
    ///
    /// The current facts are read and the change set committed against that read's revision,
    /// so a fact created in between is never deleted unseen: with `expected_revision` a stale
    /// read is the caller's `ManifestConflict`; without one the save is recomputed (at most
    /// three times).
    ///
    /// # Errors
    /// `InvalidInput` for facts in an agent-less save or duplicate ids; as `apply_changes`.
    async fn save(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        document: &MemoryDocument,
        expected_revision: Option<u64>,
    ) -> Result<(), StorageError> {
        let invalid = |message: String| StorageError::InvalidInput {
            field: "memory_data.facts".into(),
            message,
        };
        if agent.is_none() && !document.facts.is_empty() {
            return Err(invalid("an agent-less save must not contain facts".into()));
        }
        let mut keep: BTreeSet<&str> = BTreeSet::new();
        for f in &document.facts {
            if !keep.insert(f.id.as_str()) {
                return Err(invalid(format!("Duplicate fact id '{}' in facts", f.id)));
            }
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let current = self.load(user, agent).await?;
            let deletes: Vec<FactId> = current
                .facts
                .iter()
                .map(|f| f.id.clone())
                .filter(|id| !keep.contains(id.as_str()))
                .collect();
            // Each fact is written over whatever the read saw: a create when it is new, an
            // overwrite at the stored revision otherwise (never the payload's own revision).
            let upsert_revisions = document
                .facts
                .iter()
                .map(|f| {
                    (
                        f.id.clone(),
                        current.fact(f.id.as_str()).map(|c| c.revision),
                    )
                })
                .collect();
            let changes = ChangeSet {
                upserts: document.facts.iter().map(Fact::to_draft).collect(),
                upsert_revisions: Some(upsert_revisions),
                deletes,
                summaries: agent.is_none().then(|| SummaryPatch {
                    user: Some(document.user.0.clone()),
                    history: Some(document.history.0.clone()),
                }),
                ..ChangeSet::default()
            };
            let options = ApplyOptions::at_revision(expected_revision.unwrap_or(current.revision));
            match self.apply_changes(user, agent, changes, options).await {
                Ok(_) => return Ok(()),
                Err(StorageError::ManifestConflict { .. })
                    if expected_revision.is_none() && attempt < 3 => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The user's summaries with their revision.
    ///
    /// # Errors
    /// As `load`.
    async fn get_summaries(
        &self,
        user: Option<&UserId>,
    ) -> Result<SummariesSnapshot, StorageError> {
        let doc = self.load(user, None).await?;
        Ok(SummariesSnapshot {
            user: doc.user,
            history: doc.history,
            revision: doc.revision,
        })
    }

    /// Merges summary children and returns the reloaded user document.
    ///
    /// # Errors
    /// `ManifestConflict` when `expected_revision` is stale; as `apply_changes`.
    async fn update_summaries(
        &self,
        user: Option<&UserId>,
        patch: SummaryPatch,
        expected_revision: Option<u64>,
    ) -> Result<MemoryDocument, StorageError> {
        let changes = ChangeSet {
            summaries: Some(patch),
            ..ChangeSet::default()
        };
        let options = ApplyOptions {
            expected_manifest_revision: expected_revision,
            allow_manifest_rebase: false,
        };
        self.apply_changes(user, None, changes, options).await?;
        self.reload(user, None).await
    }
}

impl<T: FactRepository + ?Sized> MemoryStorageExt for T {}
