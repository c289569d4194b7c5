//! `FileMemoryStorage`: the `MemoryStorage` port over the reference's on-disk layout. Every
//! public operation is async; the filesystem work (including lock waits) runs on tokio's
//! blocking pool, and retrieval notifications are dispatched after both locks are released.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use deermem_core::document::DOCUMENT_VERSION;
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::policy::substring::{SubstringRules, substring_hits};
use deermem_core::ports::{
    Clock, FactMetadata, FactRepository, ListQuery, MigrationReport, Retrieval, ScopedSearch,
    StorageCapabilities,
};
use deermem_core::{
    AgentName, ApplyOptions, ChangeResult, ChangeSet, DeerMemConfig, Fact, FactDraft, FactId,
    IndexedDoc, MemoryDocument, RebuildReport, RetrievalError, RetrievalStatus, Scope, SearchHit,
    SearchQuery, StorageError, SummaryPatch, SummarySection, Timestamp, UserId, py,
};
use parking_lot::Mutex;
use serde_json::Value;

use crate::commit::{self, CommitRequest, Committed, Notification};
use crate::error::{Error, Result};
use crate::group::{Groups, Member, Turn};
use crate::journal;
use crate::lock::{LockRegistry, UserLock};
use crate::manifest::{self, Manifest, Signature, StatToken};
use crate::markdown::{self, Expected};
use crate::migrate;
use crate::paths::{self, AUDIT_FILE, Layout, USAGE_FILE, UserDir};
use crate::sidecar;

/// Settings of a [`FileMemoryStorage`].
#[derive(Debug, Clone, PartialEq)]
pub struct FileStorageConfig {
    /// The storage root (`users/<bucket>/...` lives below it).
    pub root: PathBuf,
    /// The manifest file name (`memory.json`): a plain name ending in `.json`.
    pub manifest_filename: String,
    /// Reject operations without a user (the legacy root layout).
    pub strict_user_scope: bool,
    /// How long to wait for the per-user lock.
    pub lock_timeout: Duration,
    /// Events kept in the capacity-eviction audit (0 disables it).
    pub audit_max_entries: usize,
    /// Half-life of the access heat in the usage sidecar, in days.
    pub access_half_life_days: f64,
}

impl FileStorageConfig {
    /// The reference defaults for a root directory.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            manifest_filename: "memory.json".into(),
            strict_user_scope: false,
            lock_timeout: Duration::from_secs(10),
            audit_max_entries: 200,
            access_half_life_days: 30.0,
        }
    }

    /// The settings a DeerMem configuration selects. The root is `storage_path`, else
    /// `$DEERMEM_DATA_DIR`, else `~/.deermem`, with the environment and home lookups injected.
    ///
    /// # Errors
    /// `InvalidInput` when no root can be determined.
    pub fn from_deermem(
        cfg: &DeerMemConfig,
        env: &dyn Fn(&str) -> Option<String>,
        home: &dyn Fn() -> Option<PathBuf>,
    ) -> std::result::Result<Self, StorageError> {
        let root = paths::resolve_root(&cfg.storage_path, env, home).ok_or_else(|| {
            StorageError::invalid(
                "storage_path",
                "no storage root: storage_path is empty, DEERMEM_DATA_DIR is unset and there is no home directory",
            )
        })?;
        Ok(Self {
            root,
            manifest_filename: cfg.manifest_filename.clone(),
            strict_user_scope: cfg.strict_user_scope,
            lock_timeout: Duration::from_secs(cfg.file_lock_timeout_seconds),
            audit_max_entries: cfg.eviction_audit_max_entries,
            access_half_life_days: cfg.eviction_access_half_life_days as f64,
        })
    }
}

type CacheKey = (Option<UserId>, Option<AgentName>);
type DirtyKey = (Option<UserId>, AgentName);

#[derive(Debug)]
struct CacheEntry {
    /// Shared so a hit clones it outside the cache lock.
    doc: Arc<MemoryDocument>,
    /// The reference's validation token (mtime, size, revision), checked by re-reading.
    sig: Signature,
    /// The manifest's `stat` when the document was read, and when that `stat` was taken: lets
    /// a load skip re-reading the manifest (see [`manifest::StatToken::vouches_for`]).
    stat: Option<StatToken>,
    observed_at: SystemTime,
}

/// The file storage adapter. Cheap to clone; clones share caches and locks.
#[derive(Debug, Clone)]
pub struct FileMemoryStorage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    layout: Layout,
    config: FileStorageConfig,
    clock: Arc<dyn Clock>,
    retrieval: Option<Arc<dyn Retrieval>>,
    locks: LockRegistry,
    cache: Mutex<HashMap<CacheKey, CacheEntry>>,
    dirty: Mutex<BTreeSet<DirtyKey>>,
    /// Point writes of one user waiting for a leader to take them into its commit.
    groups: Groups<Option<UserId>, GroupedWrite, Applied>,
    /// `users/` was seen or created (and marked) by this instance: later locks skip the check.
    users_dir_ready: AtomicBool,
    closed: AtomicBool,
}

impl FileMemoryStorage {
    /// A storage over `config.root`.
    ///
    /// # Errors
    /// `InvalidInput` for a manifest name that is not a plain `.json` file name.
    pub fn new(
        config: FileStorageConfig,
        clock: Arc<dyn Clock>,
        retrieval: Option<Arc<dyn Retrieval>>,
    ) -> std::result::Result<Self, StorageError> {
        paths::validate_manifest_name(&config.manifest_filename)?;
        let layout = Layout {
            root: config.root.clone(),
            manifest_name: config.manifest_filename.clone(),
            strict_user_scope: config.strict_user_scope,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                layout,
                config,
                clock,
                retrieval,
                locks: LockRegistry::default(),
                cache: Mutex::new(HashMap::new()),
                dirty: Mutex::new(BTreeSet::new()),
                groups: Groups::default(),
                users_dir_ready: AtomicBool::new(false),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// A storage configured from a DeerMem configuration, resolving the root from the process
    /// environment (`$DEERMEM_DATA_DIR`, `$HOME`) when `storage_path` is empty.
    ///
    /// # Errors
    /// As [`FileStorageConfig::from_deermem`] and [`FileMemoryStorage::new`].
    pub fn from_config(
        cfg: &DeerMemConfig,
        clock: Arc<dyn Clock>,
        retrieval: Option<Arc<dyn Retrieval>>,
    ) -> std::result::Result<Self, StorageError> {
        let config =
            FileStorageConfig::from_deermem(cfg, &paths::process_env, &paths::process_home)?;
        Self::new(config, clock, retrieval)
    }

    /// The storage root.
    pub fn root(&self) -> &Path {
        &self.inner.layout.root
    }

    /// The settings in use.
    pub fn config(&self) -> &FileStorageConfig {
        &self.inner.config
    }

    /// In-process lock entries currently held or awaited (the registry keeps no unused ones).
    pub fn live_lock_entries(&self) -> usize {
        self.inner.locks.live_entries()
    }

    /// Cached documents (for diagnostics and tests).
    pub fn cached_documents(&self) -> usize {
        self.inner.cache.lock().len()
    }

    /// Runs blocking filesystem work off the async runtime's worker threads.
    /// Compares the derived index with the canonical fact files, scope by scope: facts the
    /// index lacks, documents it holds for facts that are gone, and documents of an older
    /// revision. A process killed between its durable commit and its index write leaves the
    /// index behind without any record of it, so an honest status has to look. `None` when no
    /// index is configured or the adapter cannot list its documents.
    ///
    /// Reads every fact file: an operator's check (`deermem index status`), not a hot path.
    ///
    /// # Errors
    /// The index cannot be listed (`Unavailable`), or the facts cannot be read.
    pub async fn verify_index(
        &self,
    ) -> std::result::Result<Option<IndexVerification>, StorageError> {
        let Some(retrieval) = self.inner.retrieval.clone() else {
            return Ok(None);
        };
        let indexed = match retrieval.inventory().await {
            Ok(docs) => docs,
            Err(RetrievalError::Unsupported { .. }) => return Ok(None),
            Err(e) => {
                return Err(StorageError::Io {
                    context: "listing the search index".into(),
                    source: std::io::Error::other(e.to_string()),
                });
            }
        };
        let (records, unreadable) = self.run(|inner| Ok(inner.collect_all_for_index())).await?;
        Ok(Some(IndexVerification::compare(
            &records, &indexed, unreadable,
        )))
    }

    async fn run<T, F>(&self, f: F) -> std::result::Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => match handle.spawn_blocking(move || f(&inner)).await {
                Ok(r) => r.map_err(StorageError::from),
                Err(e) => Err(StorageError::Io {
                    context: "memory storage worker failed".into(),
                    source: std::io::Error::other(e.to_string()),
                }),
            },
            Err(_) => f(&inner).map_err(StorageError::from),
        }
    }

    /// [`Self::run`] for a write to one scope: when it fails with an I/O error, part of it may
    /// be on disk without the index having been told (a commit that failed after its commit
    /// point, a read migration committed before a later step failed), so the scope is marked
    /// dirty and the next search there rebuilds it from the files.
    async fn run_write<T, F>(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        f: F,
    ) -> std::result::Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T> + Send + 'static,
    {
        let r = self.run(f).await;
        if let (Err(StorageError::Io { .. }), Some(agent), true) =
            (&r, agent, self.inner.retrieval.is_some())
        {
            self.inner
                .dirty
                .lock()
                .insert((user.cloned(), agent.clone()));
        }
        r
    }

    /// Marks dirty the scopes whose acknowledged index writes failed to apply later; `true`
    /// when one of `among` (or any, without a list) was among them.
    fn absorb_stale_scopes(&self, among: Option<&[Scope]>) -> bool {
        let Some(retrieval) = &self.inner.retrieval else {
            return false;
        };
        let stale = retrieval.take_stale_scopes();
        if stale.is_empty() {
            return false;
        }
        let hit = among.is_none_or(|list| stale.iter().any(|s| list.contains(s)));
        let mut dirty = self.inner.dirty.lock();
        for s in stale {
            if let Some(agent) = s.agent {
                tracing::warn!(user = ?s.user, agent = %agent, "index writes of a scope failed; scope marked dirty");
                dirty.insert((s.user, agent));
            }
        }
        hit
    }

    /// Sends queued notifications to the index; failures mark their scope dirty.
    async fn dispatch(&self, notes: Vec<Notification>) {
        let Some(retrieval) = &self.inner.retrieval else {
            return;
        };
        for note in notes {
            let (scope, result) = match &note {
                Notification::Upsert { scope, fact } => {
                    (scope, retrieval.upsert(scope, fact).await)
                }
                Notification::Remove { scope, id } => (scope, retrieval.remove(scope, id).await),
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, ?scope, "retrieval notification failed; scope marked dirty");
                if let Some(agent) = &scope.agent {
                    self.inner
                        .dirty
                        .lock()
                        .insert((scope.user.clone(), agent.clone()));
                }
            }
        }
    }

    async fn load_impl(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        force: bool,
    ) -> std::result::Result<MemoryDocument, StorageError> {
        if !force && let Some(doc) = self.inner.cached(user, agent) {
            return Ok(doc);
        }
        let (user, agent) = (user.cloned(), agent.cloned());
        let (doc, notes) = self
            .run(move |inner| inner.load(user.as_ref(), agent.as_ref(), force))
            .await?;
        self.dispatch(notes).await;
        Ok(doc)
    }

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

/// Validated inputs of `apply_changes`.
/// One writer's share of a group commit: the agent and its prepared upserts.
#[derive(Debug)]
struct GroupedWrite {
    agent: AgentName,
    prepared: PreparedChanges,
}

/// What a commit gives its writer: the commit and the index notifications to send.
type Applied = Result<(Committed, Vec<Notification>)>;

/// Writers taken into one group commit at most (the leader included).
const GROUP_MAX: usize = 64;

#[derive(Debug)]
struct PreparedChanges {
    upserts: Vec<(FactId, FactDraft)>,
    upsert_revisions: HashMap<FactId, Option<u64>>,
    deletes: Vec<FactId>,
    delete_revisions: Option<BTreeMap<FactId, u64>>,
    summaries: Option<SummaryPatch>,
}

fn bad_revision() -> Error {
    Error::invalid(
        "change_set.upsertRevisions",
        "change_set.upsertRevisions values must be null or integers >= 1",
    )
}

/// One writer's part of a group's commit: the shared revision and time stamps, its own facts
/// and their index notifications.
fn share_of(done: &Committed, w: &GroupedWrite) -> (Committed, Vec<Notification>) {
    let ids: HashSet<&FactId> = w.prepared.upserts.iter().map(|(id, _)| id).collect();
    let written: Vec<Fact> = done
        .written
        .iter()
        .filter(|f| ids.contains(&f.id))
        .cloned()
        .collect();
    let notifications: Vec<Notification> = done
        .notifications
        .iter()
        .filter(|n| match n {
            Notification::Upsert { fact, .. } => ids.contains(&fact.id),
            Notification::Remove { .. } => false,
        })
        .cloned()
        .collect();
    let share = Committed {
        version: done.version.clone(),
        revision: done.revision,
        last_updated: done.last_updated.clone(),
        written,
        deleted: Vec::new(),
        notifications: notifications.clone(),
        wrote: done.wrote,
    };
    (share, notifications)
}

fn prepare_changes(changes: ChangeSet, agent: Option<&AgentName>) -> Result<PreparedChanges> {
    if changes.has_fact_changes() && agent.is_none() {
        return Err(Error::invalid(
            "agent_name",
            "agent_name is required for fact repository changes",
        ));
    }
    let mut upserts = Vec::with_capacity(changes.upserts.len());
    let mut seen: HashSet<FactId> = HashSet::new();
    let mut upsert_revisions = HashMap::new();
    for mut draft in changes.upserts {
        let id = match draft.get("id") {
            Some(v) if py::truthy(v) => {
                let text = py::py_str(v).unwrap_or_default();
                FactId::new(text).map_err(|_| {
                    Error::invalid(
                        "fact.id",
                        "fact.id may contain only letters, numbers, '_' and '-'",
                    )
                })?
            }
            _ => {
                let id = crate::fresh_fact_id();
                draft.insert("id".into(), Value::String(id.as_str().to_owned()));
                id
            }
        };
        if !seen.insert(id.clone()) {
            return Err(Error::invalid(
                "change_set.upserts",
                format!("Duplicate fact id '{id}' in upserts"),
            ));
        }
        let expected = match changes.upsert_revisions.as_ref().and_then(|m| m.get(&id)) {
            Some(Some(0)) => return Err(bad_revision()),
            Some(e) => *e,
            None => match draft.get("revision") {
                None | Some(Value::Null) => None,
                Some(Value::Number(n)) => match n.as_u64() {
                    Some(r) if r >= 1 => Some(r),
                    _ => return Err(bad_revision()),
                },
                Some(_) => return Err(bad_revision()),
            },
        };
        upsert_revisions.insert(id.clone(), expected);
        upserts.push((id, draft));
    }
    let mut del_seen: HashSet<&FactId> = HashSet::new();
    for id in &changes.deletes {
        if !del_seen.insert(id) {
            return Err(Error::invalid(
                "change_set.deletes",
                "Duplicate fact ids are not allowed in deletes",
            ));
        }
        if seen.contains(id) {
            return Err(Error::invalid(
                "change_set",
                format!("Fact '{id}' cannot be upserted and deleted together"),
            ));
        }
    }
    Ok(PreparedChanges {
        upserts,
        upsert_revisions,
        deletes: changes.deletes,
        delete_revisions: changes.delete_revisions,
        summaries: changes.summaries,
    })
}

/// How far `clear_all` got: the notifications of the commits that landed, the agents cleared,
/// the agent whose step was running when it failed, and the outcome.
struct ClearProgress {
    notes: Vec<Notification>,
    agents: Vec<AgentName>,
    failed_at: Option<AgentName>,
    result: Result<()>,
}

impl Default for ClearProgress {
    fn default() -> Self {
        Self {
            notes: Vec::new(),
            agents: Vec::new(),
            failed_at: None,
            result: Ok(()),
        }
    }
}

impl Inner {
    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn user_dir(&self, user: Option<&UserId>) -> Result<UserDir> {
        self.layout.user_dir(user)
    }

    fn lock(&self, udir: &UserDir) -> Result<UserLock> {
        // The first user directory of a new root: create `users/` as the top of per-user trees.
        // Checked until this instance has seen `users/` once, so the write path pays no `stat`.
        if !self.users_dir_ready.load(Ordering::Relaxed)
            && let Some(users) = udir.dir.parent()
            && users == self.layout.root.join("users")
        {
            if !users.is_dir() {
                crate::fsutil::create_dir_all(users)?;
                crate::fsutil::mark_top_directory(users);
            }
            self.users_dir_ready.store(true, Ordering::Relaxed);
        }
        self.locks.acquire(&udir.lock(), self.config.lock_timeout)
    }

    fn invalidate_user(&self, user: &Option<UserId>) {
        self.cache.lock().retain(|(u, _), _| u != user);
    }

    /// The cached document when a few `stat` calls prove it current: no journal, no legacy
    /// layout to migrate, and a manifest whose `stat` the cache entry vouches for. Runs on the
    /// caller's thread (no file is opened or read); `None` sends the load down the full path,
    /// which re-reads the manifest and compares its revision.
    fn cached(&self, user: Option<&UserId>, agent: Option<&AgentName>) -> Option<MemoryDocument> {
        let udir = self.user_dir(user).ok()?;
        if udir.journal().exists()
            || agent.is_some_and(|a| udir.legacy_agent_doc(a).exists())
            || (agent.is_some_and(AgentName::is_default)
                && migrate::has_legacy_default_bucket(&udir))
        {
            return None;
        }
        let now = manifest::stat_token(&udir.manifest()).ok()?;
        let doc = {
            let cache = self.cache.lock();
            let entry = cache.get(&(user.cloned(), agent.cloned()))?;
            let current = match (&entry.stat, &now) {
                (None, None) => entry.sig.is_none(),
                (Some(then), Some(now)) => then.vouches_for(now, entry.observed_at),
                _ => false,
            };
            if !current {
                return None;
            }
            Arc::clone(&entry.doc)
        };
        Some(MemoryDocument::clone(&doc))
    }

    /// Whether a load must take the locks to recover or migrate first.
    fn needs_read_migration(
        &self,
        udir: &UserDir,
        agent: Option<&AgentName>,
        manifest: Option<&Manifest>,
    ) -> bool {
        udir.journal().exists()
            || agent.is_some_and(|a| udir.legacy_agent_doc(a).exists())
            || manifest.is_some_and(Manifest::needs_migration)
            || (agent.is_some_and(AgentName::is_default)
                && migrate::has_legacy_default_bucket(udir))
    }

    /// Journal recovery; the caller holds the locks. After an interrupted commit was
    /// rolled back or forward, the user's cached documents are dropped and the journal's scope
    /// is marked dirty: the index was never told about the interrupted commit's facts, and the
    /// next search rebuilds that scope from the files.
    fn recover_locked(&self, udir: &UserDir) -> Result<()> {
        let (outcome, agent) = journal::recover(udir)?;
        if outcome != journal::Recovery::Nothing {
            self.invalidate_user(&udir.user);
            if let Some(agent) = agent
                && self.retrieval.is_some()
            {
                self.dirty.lock().insert((udir.user.clone(), agent));
            }
        }
        Ok(())
    }

    /// Recovery plus the lazy read migrations (the legacy global manifest into `__default__`,
    /// the agent's legacy document, the old `lead-agent` bucket); the caller holds the locks.
    fn read_migrations_locked(
        &self,
        udir: &UserDir,
        agent: Option<&AgentName>,
        now: Timestamp,
    ) -> Result<Vec<Notification>> {
        self.read_migrations_keeping_manifest(udir, agent, now)
            .map(|(notes, _)| notes)
    }

    /// [`Self::read_migrations_locked`] that also hands back the manifest it read, when nothing
    /// was migrated after reading it (so a commit under the same locks need not read it again).
    fn read_migrations_keeping_manifest(
        &self,
        udir: &UserDir,
        agent: Option<&AgentName>,
        now: Timestamp,
    ) -> Result<(Vec<Notification>, Option<Option<Manifest>>)> {
        let mut notes = Vec::new();
        self.recover_locked(udir)?;
        let current = manifest::read_manifest(&udir.manifest())?;
        let global_legacy = current.as_ref().is_some_and(Manifest::needs_migration);
        if global_legacy {
            let out = migrate::migrate_locked(
                udir,
                &AgentName::default_bucket(),
                true,
                true,
                false,
                now,
            )?;
            notes.extend(out.notifications);
        }
        let mut migrated = global_legacy;
        if let Some(agent) = agent {
            if udir.legacy_agent_doc(agent).exists() {
                migrated = true;
                let out = migrate::migrate_locked(udir, agent, false, true, false, now)?;
                notes.extend(out.notifications);
            }
            if agent.is_default() && migrate::has_legacy_default_bucket(udir) {
                migrated = true;
                notes.extend(migrate::migrate_legacy_default_bucket(udir, now)?);
            }
        }
        if !notes.is_empty() {
            self.invalidate_user(&udir.user);
        }
        // The manifest read above is still the current one unless a migration ran.
        Ok((notes, (!migrated).then_some(current)))
    }

    fn read_document_locked(
        &self,
        udir: &UserDir,
        agent: Option<&AgentName>,
        now: Timestamp,
    ) -> Result<(MemoryDocument, Signature)> {
        let (manifest, sig) = manifest::read_with_signature(&udir.manifest())?;
        let facts = match agent {
            Some(a) => markdown::load_all(
                &udir.facts(a),
                Expected {
                    user: udir.user.as_ref(),
                    agent: a.as_str(),
                },
                now,
            )?
            .into_iter()
            .map(|l| l.fact)
            .collect(),
            None => Vec::new(),
        };
        let doc = manifest::document(manifest.as_ref(), facts, now)?;
        Ok((doc, sig))
    }

    fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        force: bool,
    ) -> Result<(MemoryDocument, Vec<Notification>)> {
        let udir = self.user_dir(user)?;
        let now = self.now();
        // The stat is taken before the read it vouches for.
        let observed_at = SystemTime::now();
        let token = manifest::stat_token(&udir.manifest()).ok().flatten();
        let (manifest, mut sig) = manifest::read_with_signature(&udir.manifest())?;
        let mut notes = Vec::new();
        if self.needs_read_migration(&udir, agent, manifest.as_ref()) {
            let _lock = self.lock(&udir)?;
            notes = self.read_migrations_locked(&udir, agent, now)?;
            sig = manifest::read_with_signature(&udir.manifest())?.1;
        }
        let key: CacheKey = (user.cloned(), agent.cloned());
        if !force {
            let hit = {
                let mut cache = self.cache.lock();
                match cache.get_mut(&key) {
                    Some(entry) if entry.sig == sig => {
                        // Still current by the reference's token; when the stat taken before
                        // the read describes the same file, remember it for the stat path.
                        if notes.is_empty()
                            && let (Some(t), Some((mtime_ns, size, _))) = (token, sig)
                            && t.mtime_ns == mtime_ns
                            && t.size == size
                        {
                            entry.stat = Some(t);
                            entry.observed_at = observed_at;
                        }
                        Some(Arc::clone(&entry.doc))
                    }
                    _ => None,
                }
            };
            if let Some(doc) = hit {
                return Ok((MemoryDocument::clone(&doc), notes));
            }
        }
        // Miss: read a consistent snapshot under the locks (a user never written to needs no
        // lock and leaves no trace on disk).
        let (doc, sig, stat, observed_at) = if udir.dir.is_dir() {
            let _lock = self.lock(&udir)?;
            // A journal may have appeared since the check above; recovery also sweeps leftovers
            // of commits that crashed before their journal was durable.
            notes.extend(self.read_migrations_locked(&udir, agent, now)?);
            // Under the lock no cooperating writer can replace the manifest between this stat
            // and the read below.
            let observed_at = SystemTime::now();
            let stat = manifest::stat_token(&udir.manifest()).ok().flatten();
            let (doc, sig) = self.read_document_locked(&udir, agent, now)?;
            (doc, sig, stat, observed_at)
        } else {
            (MemoryDocument::empty(now), None, None, observed_at)
        };
        let shared = Arc::new(doc);
        self.cache.lock().insert(
            key,
            CacheEntry {
                doc: Arc::clone(&shared),
                sig,
                stat,
                observed_at,
            },
        );
        Ok((MemoryDocument::clone(&shared), notes))
    }

    /// Commits under the locks, with recovery, read migrations, and the reference's rebase loop
    /// (up to three attempts; a manifest revision conflict is retried only for fact changes
    /// whose every fact carries its own revision check).
    /// Point upserts without a shared-revision check go through a group commit.
    fn apply(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        prepared: PreparedChanges,
        options: ApplyOptions,
    ) -> Result<(Committed, Vec<Notification>)> {
        if let Some(agent) = agent
            && options.expected_manifest_revision.is_none()
            && !prepared.upserts.is_empty()
            && prepared.deletes.is_empty()
            && prepared.summaries.is_none()
        {
            return self.apply_grouped(user, agent, prepared);
        }
        self.apply_alone(user, agent, prepared, options)
    }

    /// A point upsert (no deletes, no summaries, no shared-revision check) through the user's
    /// write group (`group.rs`): writers that arrive while the leader waits for the user lock
    /// or commits are taken into its next commit when they write the same agent and other fact
    /// ids: one journal, one manifest revision and one set of fsyncs for all of them. Each
    /// writer's own fact preconditions still hold: when the shared commit fails (a fact
    /// conflict, an I/O error), each writer's changes are committed alone under the same lock,
    /// so each gets exactly the result it would have had alone.
    fn apply_grouped(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        prepared: PreparedChanges,
    ) -> Result<(Committed, Vec<Notification>)> {
        let mine = GroupedWrite {
            agent: agent.clone(),
            prepared,
        };
        let (mine, leader) = match self.groups.join(user.cloned(), mine) {
            Turn::Lead(mine, leader) => (mine, leader),
            Turn::Done(result) => return result,
            Turn::Abandoned => {
                return Err(Error::io(
                    "The group commit this write joined stopped without an answer under",
                    &self.layout.root,
                    std::io::Error::other("the leading writer failed"),
                ));
            }
        };
        let udir = self.user_dir(user)?;
        let now = self.now();
        let lock = match self.lock(&udir) {
            Ok(lock) => lock,
            Err(Error::LockTimeout { lock }) => {
                // Everyone queued behind this leader waited for the same lock: they time out
                // with it instead of each waiting the whole timeout again.
                for m in leader.take(usize::MAX, |_| true) {
                    m.finish(Err(Error::LockTimeout { lock: lock.clone() }));
                }
                return Err(Error::LockTimeout { lock });
            }
            Err(e) => return Err(e),
        };
        let (notes, current_manifest) =
            self.read_migrations_keeping_manifest(&udir, Some(agent), now)?;
        // Other writers of this agent whose fact ids no member writes.
        let mut ids: HashSet<FactId> = mine
            .prepared
            .upserts
            .iter()
            .map(|(id, _)| id.clone())
            .collect();
        let members = leader.take(GROUP_MAX - 1, |w| {
            w.agent == mine.agent && w.prepared.upserts.iter().all(|(id, _)| !ids.contains(id)) && {
                ids.extend(w.prepared.upserts.iter().map(|(id, _)| id.clone()));
                true
            }
        });
        let result = if members.is_empty() {
            self.commit_point_upserts(&udir, &mine, current_manifest, now)
        } else {
            self.commit_group(&udir, mine, members, current_manifest, now)
        };
        drop(lock);
        drop(leader);
        let (done, mut own_notes) = result?;
        let mut all = notes;
        all.append(&mut own_notes);
        Ok((done, all))
    }

    /// Commits one writer's point upserts; the caller holds the locks and ran recovery.
    fn commit_point_upserts(
        &self,
        udir: &UserDir,
        w: &GroupedWrite,
        current_manifest: Option<Option<Manifest>>,
        now: Timestamp,
    ) -> Result<(Committed, Vec<Notification>)> {
        let req = CommitRequest {
            current_manifest,
            agent: Some(w.agent.clone()),
            upserts: w.prepared.upserts.clone(),
            upsert_revisions: Some(w.prepared.upsert_revisions.clone()),
            ..CommitRequest::default()
        };
        let done = commit::commit(udir, req, now)?;
        if done.wrote {
            self.invalidate_user(&udir.user);
        }
        let notes = done.notifications.clone();
        Ok((done, notes))
    }

    /// Commits the leader's and its members' upserts together, or, when that fails, each
    /// alone; answers the members and returns the leader's result.
    fn commit_group(
        &self,
        udir: &UserDir,
        mine: GroupedWrite,
        members: Vec<Member<GroupedWrite, Applied>>,
        current_manifest: Option<Option<Manifest>>,
        now: Timestamp,
    ) -> Result<(Committed, Vec<Notification>)> {
        let writes = std::iter::once(&mine).chain(members.iter().map(|m| &m.work));
        let mut upserts = Vec::new();
        let mut revisions = HashMap::new();
        for w in writes {
            upserts.extend(w.prepared.upserts.iter().cloned());
            revisions.extend(
                w.prepared
                    .upsert_revisions
                    .iter()
                    .map(|(k, v)| (k.clone(), *v)),
            );
        }
        let req = CommitRequest {
            current_manifest,
            agent: Some(mine.agent.clone()),
            upserts,
            upsert_revisions: Some(revisions),
            ..CommitRequest::default()
        };
        match commit::commit(udir, req, now) {
            Ok(done) => {
                if done.wrote {
                    self.invalidate_user(&udir.user);
                }
                tracing::debug!(
                    writers = members.len() + 1,
                    revision = done.revision,
                    "group commit"
                );
                for m in members {
                    let share = share_of(&done, &m.work);
                    m.finish(Ok(share));
                }
                Ok(share_of(&done, &mine))
            }
            Err(e) => {
                tracing::debug!(error = %e, writers = members.len() + 1,
                    "group commit failed; committing each writer alone");
                let alone = |w: &GroupedWrite| {
                    let (_, current) =
                        self.read_migrations_keeping_manifest(udir, Some(&w.agent), now)?;
                    self.commit_point_upserts(udir, w, current, now)
                };
                let own = alone(&mine);
                for m in members {
                    let r = alone(&m.work);
                    m.finish(r);
                }
                own
            }
        }
    }

    /// The commit loop for everything that is not a grouped point upsert.
    fn apply_alone(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        prepared: PreparedChanges,
        options: ApplyOptions,
    ) -> Result<(Committed, Vec<Notification>)> {
        let udir = self.user_dir(user)?;
        let has_fact_changes = !prepared.upserts.is_empty() || !prepared.deletes.is_empty();
        let can_rebase = options.allow_manifest_rebase
            && has_fact_changes
            && prepared.summaries.is_none()
            && (prepared.deletes.is_empty()
                || prepared
                    .delete_revisions
                    .as_ref()
                    .is_some_and(|r| prepared.deletes.iter().all(|d| r.contains_key(d))));
        let mut expected = options.expected_manifest_revision;
        let mut attempt = 0;
        loop {
            let now = self.now();
            let lock = self.lock(&udir)?;
            let (mut notes, current_manifest) =
                self.read_migrations_keeping_manifest(&udir, agent, now)?;
            let req = CommitRequest {
                current_manifest,
                agent: agent.cloned(),
                upserts: prepared.upserts.clone(),
                upsert_revisions: Some(prepared.upsert_revisions.clone()),
                deletes: prepared.deletes.clone(),
                delete_revisions: prepared.delete_revisions.clone(),
                summaries: prepared
                    .summaries
                    .as_ref()
                    .map(|s| (s.user.clone(), s.history.clone())),
                expected_revision: expected,
                allow_legacy_drop: false,
            };
            match commit::commit(&udir, req, now) {
                Ok(done) => {
                    if done.wrote {
                        self.invalidate_user(&udir.user);
                    }
                    if let (Some(agent), false) = (agent, prepared.deletes.is_empty()) {
                        let ids: Vec<String> =
                            prepared.deletes.iter().map(|i| i.to_string()).collect();
                        if let Err(e) = self.clear_metadata_locked(&udir, agent, Some(&ids)) {
                            tracing::warn!(error = %e, "could not clear sidecar metadata of deleted facts");
                        }
                    }
                    drop(lock);
                    notes.extend(done.notifications.iter().cloned());
                    return Ok((done, notes));
                }
                Err(Error::ManifestConflict { expected: e, found })
                    if can_rebase && attempt < 2 =>
                {
                    drop(lock);
                    tracing::debug!(expected = e, found, "rebasing point operation");
                    expected = Some(found);
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn clear_metadata_locked(
        &self,
        udir: &UserDir,
        agent: &AgentName,
        ids: Option<&[String]>,
    ) -> Result<()> {
        let meta = udir.metadata(agent);
        match ids {
            None => match std::fs::remove_dir_all(&meta) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::io("Failed to remove", &meta, e)),
            },
            Some([]) => Ok(()),
            Some(ids) => sidecar::clear_ids(&meta.join(USAGE_FILE), &meta.join(AUDIT_FILE), ids),
        }
    }

    fn get_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
    ) -> Result<(Option<Fact>, Vec<Notification>)> {
        let udir = self.user_dir(user)?;
        let now = self.now();
        let _lock = self.lock(&udir)?;
        let notes = self.read_migrations_locked(&udir, Some(agent), now)?;
        let fact = markdown::load_optional(
            &udir.fact(agent, id),
            Expected {
                user: udir.user.as_ref(),
                agent: agent.as_str(),
            },
            now,
        )?
        .map(|l| l.fact);
        Ok((fact, notes))
    }

    /// Clears every agent of a user, one commit per agent, then resets the summaries. What was
    /// committed before a failure stays committed, so `out` collects the notifications of each
    /// commit as it lands (the caller dispatches them whether or not a later step failed) and
    /// names the agent whose step failed.
    fn clear_all(&self, user: Option<&UserId>, out: &mut ClearProgress) -> Result<()> {
        let udir = self.user_dir(user)?;
        let now = self.now();
        let _lock = self.lock(&udir)?;
        let result = self.clear_all_locked(&udir, now, out);
        // Earlier agents' commits may have landed even when a later one failed.
        self.invalidate_user(&udir.user);
        result
    }

    fn clear_all_locked(
        &self,
        udir: &UserDir,
        now: Timestamp,
        out: &mut ClearProgress,
    ) -> Result<()> {
        let notes = self.read_migrations_locked(udir, None, now)?;
        out.notes.extend(notes);
        journal::sweep_temp_files(udir);
        for entry in crate::fsutil::sorted_entries(&udir.agents())? {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(agent) = markdown::canonical_agent_dir(&name) else {
                tracing::warn!(dir = %entry.path().display(), "clear_all skips a directory that is not a DeerMem agent bucket");
                continue;
            };
            out.failed_at = Some(agent.clone());
            if udir.legacy_agent_doc(&agent).exists() {
                let migrated = migrate::migrate_locked(udir, &agent, false, false, false, now)?;
                out.notes.extend(migrated.notifications);
            }
            let facts = markdown::load_all(
                &udir.facts(&agent),
                Expected {
                    user: udir.user.as_ref(),
                    agent: agent.as_str(),
                },
                now,
            )?;
            if !facts.is_empty() {
                let current = manifest::read_manifest(&udir.manifest())?.map_or(0, |m| m.revision);
                let deletes: Vec<FactId> = facts.iter().map(|l| l.fact.id.clone()).collect();
                let delete_revisions = facts
                    .iter()
                    .map(|l| (l.fact.id.clone(), l.fact.revision))
                    .collect();
                let done = commit::commit(
                    udir,
                    CommitRequest {
                        agent: Some(agent.clone()),
                        deletes,
                        delete_revisions: Some(delete_revisions),
                        expected_revision: Some(current),
                        ..CommitRequest::default()
                    },
                    now,
                )?;
                out.notes.extend(done.notifications);
            }
            out.failed_at = None;
            out.agents.push(agent);
        }
        let defaults = (
            Some(SummarySection::default_user().0),
            Some(SummarySection::default_history().0),
        );
        commit::commit(
            udir,
            CommitRequest {
                summaries: Some(defaults),
                ..CommitRequest::default()
            },
            now,
        )?;
        for agent in &out.agents {
            if let Err(e) = self.clear_metadata_locked(udir, agent, None) {
                tracing::warn!(error = %e, agent = %agent, "could not remove sidecar metadata");
            }
        }
        Ok(())
    }

    fn migrate(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        dry_run: bool,
    ) -> Result<(MigrationReport, Vec<Notification>)> {
        let udir = self.user_dir(user)?;
        let now = self.now();
        // A dry run changes nothing on disk: it does not create the lock file (no writer can
        // be mid-commit where none ever locked) and does not recover a journal.
        let _lock = if dry_run && !udir.lock().exists() {
            None
        } else {
            Some(self.lock(&udir)?)
        };
        if !dry_run {
            self.recover_locked(&udir)?;
            journal::sweep_temp_files(&udir);
        }
        let out = migrate::migrate_locked(&udir, agent, true, true, dry_run, now)?;
        if out.migrated && !dry_run {
            self.invalidate_user(&udir.user);
        }
        let m = manifest::read_manifest(&udir.manifest())?;
        let (to_version, revision) = match &m {
            Some(m) if !dry_run => (m.version(), m.revision),
            Some(m) => (
                if out.migrated {
                    DOCUMENT_VERSION.to_owned()
                } else {
                    m.version()
                },
                m.revision,
            ),
            None => (deermem_core::document::EMPTY_DOCUMENT_VERSION.to_owned(), 0),
        };
        Ok((
            MigrationReport {
                migrated: out.migrated,
                from_version: out.from_version,
                to_version,
                revision,
                migrated_facts: out.facts,
                dry_run,
            },
            out.notifications,
        ))
    }

    fn existing_ids(&self, udir: &UserDir, agent: &AgentName, ids: &[FactId]) -> Vec<String> {
        let mut seen = HashSet::new();
        ids.iter()
            .filter(|id| seen.insert(id.as_str().to_owned()))
            .filter(|id| udir.fact(agent, id).is_file())
            .map(|id| id.to_string())
            .collect()
    }

    /// Every fact file of the layout, for a full index rebuild (restricted to the memory
    /// directories, where the reference globs every Markdown file under the home).
    fn collect_all_for_index(&self) -> (Vec<(Scope, Fact)>, usize) {
        let now = self.now();
        let mut roots: Vec<(Option<String>, PathBuf)> = vec![(None, self.layout.root.clone())];
        if let Ok(users) = crate::fsutil::sorted_entries(&self.layout.root.join("users")) {
            for u in users {
                if u.file_type().is_ok_and(|t| t.is_dir()) {
                    roots.push((Some(u.file_name().to_string_lossy().into_owned()), u.path()));
                }
            }
        }
        // Every agent directory, then each one listed and read independently (possibly on
        // two threads), merged in order.
        let mut agent_dirs: Vec<(Option<String>, String, PathBuf)> = Vec::new();
        for (bucket, dir) in roots {
            let Ok(agents) = crate::fsutil::sorted_entries(&dir.join("agents")) else {
                continue;
            };
            for a in agents {
                if !a.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = a.file_name().to_string_lossy().into_owned();
                agent_dirs.push((bucket.clone(), name, a.path().join("facts")));
            }
        }
        let per_agent = crate::par::map_in_order(&agent_dirs, |(bucket, name, facts)| {
            let Some(dir) = crate::walk::FactsDir::open(facts)? else {
                return Ok(Vec::new());
            };
            let mut buf = Vec::new();
            let mut out = Vec::new();
            for entry in dir.entries() {
                out.extend(dir.read_entry(entry, &mut buf, |file, read, bytes| {
                    let r = read
                        .map_err(|e| Error::FactParse {
                            path: file.clone(),
                            reason: e.to_string(),
                        })
                        .and_then(|()| index_record(&file, bytes, bucket.as_deref(), name, now));
                    (file, r)
                })?);
            }
            Ok(out)
        });
        let mut records = Vec::new();
        let mut failed = 0;
        for listed in per_agent {
            let listed: Result<Vec<IndexedFile>> = listed;
            match listed {
                Ok(files) => {
                    for (file, r) in files {
                        match r {
                            Ok(r) => records.push(r),
                            Err(e) => {
                                failed += 1;
                                tracing::warn!(path = %file.display(), error = %e, "fact not indexed");
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list facts for the index");
                    failed += 1;
                }
            }
        }
        (records, failed)
    }

    fn list_users(&self) -> Result<Vec<UserId>> {
        let mut out: BTreeSet<UserId> = BTreeSet::new();
        for u in crate::fsutil::sorted_entries(&self.layout.root.join("users"))? {
            if !u.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let bucket = u.file_name().to_string_lossy().into_owned();
            let mut learned: Option<UserId> = None;
            'agents: for a in crate::fsutil::sorted_entries(&u.path().join("agents"))? {
                let Ok(files) = crate::fsutil::markdown_files(&a.path().join("facts")) else {
                    continue;
                };
                for f in files {
                    let Ok(bytes) = std::fs::read(&f) else {
                        continue;
                    };
                    let Ok(parsed) = markdown::parse(&f, &bytes) else {
                        continue;
                    };
                    if let Some(raw) = parsed.user_id.as_str()
                        && let Ok(id) = UserId::new(raw)
                        && id.bucket() == bucket
                    {
                        learned = Some(id);
                        break 'agents;
                    }
                }
            }
            match learned.or_else(|| {
                UserId::new(bucket.clone())
                    .ok()
                    .filter(|u| u.bucket() == bucket)
            }) {
                Some(id) => {
                    out.insert(id);
                }
                None => {
                    tracing::warn!(bucket = %bucket, "skipping a users/ entry that is not a user bucket")
                }
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// One listed fact file and its index record (or why it could not be indexed).
type IndexedFile = (PathBuf, Result<(Scope, Fact)>);

/// Parses and validates one file for the full index rebuild: the owner is checked through the
/// bucket (original ids such as e-mail addresses are accepted).
fn index_record(
    path: &Path,
    bytes: &[u8],
    bucket: Option<&str>,
    agent_dir: &str,
    now: Timestamp,
) -> Result<(Scope, Fact)> {
    let parsed = markdown::parse(path, bytes)?;
    let user = match (&parsed.user_id, bucket) {
        (Value::Null, None) => None,
        (Value::String(s), Some(b)) => {
            let u = UserId::new(s.as_str())?;
            if u.bucket() != b {
                return Err(Error::ScopeMismatch {
                    path: path.to_path_buf(),
                    expected: format!("a user of bucket {b:?}"),
                    found: s.clone(),
                });
            }
            Some(u)
        }
        (other, b) => {
            return Err(Error::ScopeMismatch {
                path: path.to_path_buf(),
                expected: format!("user bucket {b:?}"),
                found: other.to_string(),
            });
        }
    };
    let agent = AgentName::parse(agent_dir)?;
    let loaded = markdown::validate(
        path,
        parsed,
        Expected {
            user: user.as_ref(),
            agent: agent.as_str(),
        },
        now,
    )?;
    Ok((Scope::new(user, Some(agent)), loaded.fact))
}

/// How the derived index compares with the canonical facts ([`FileMemoryStorage::verify_index`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IndexVerification {
    /// Readable fact files.
    pub canonical_facts: usize,
    /// Fact files that could not be read (they are never indexed; the logs name them).
    pub unreadable_facts: usize,
    /// Documents in the index.
    pub indexed_docs: usize,
    /// Scopes where the two differ, sorted by label.
    pub stale_scopes: Vec<StaleScope>,
}

/// One scope whose index documents differ from its fact files.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StaleScope {
    /// `user|agent`.
    pub scope: String,
    /// Facts on disk the index lacks.
    pub missing: usize,
    /// Index documents whose fact is gone.
    pub extra: usize,
    /// Index documents of another revision than the fact on disk.
    pub outdated: usize,
}

impl IndexVerification {
    fn compare(records: &[(Scope, Fact)], indexed: &[IndexedDoc], unreadable: usize) -> Self {
        type Key = (Option<UserId>, Option<AgentName>);
        let mut canonical: BTreeMap<Key, BTreeMap<&str, u64>> = BTreeMap::new();
        for (scope, fact) in records {
            canonical
                .entry((scope.user.clone(), scope.agent.clone()))
                .or_default()
                .insert(fact.id.as_str(), fact.revision);
        }
        let mut in_index: BTreeMap<Key, BTreeMap<&str, Option<u64>>> = BTreeMap::new();
        for doc in indexed {
            in_index
                .entry((doc.scope.user.clone(), doc.scope.agent.clone()))
                .or_default()
                .insert(doc.fact_id.as_str(), doc.revision);
        }
        let empty_c = BTreeMap::new();
        let empty_i = BTreeMap::new();
        let keys: BTreeSet<&Key> = canonical.keys().chain(in_index.keys()).collect();
        let mut stale_scopes = Vec::new();
        for key in keys {
            let c = canonical.get(key).unwrap_or(&empty_c);
            let i = in_index.get(key).unwrap_or(&empty_i);
            let missing = c.keys().filter(|id| !i.contains_key(*id)).count();
            let extra = i.keys().filter(|id| !c.contains_key(*id)).count();
            let outdated = c
                .iter()
                .filter(|(id, rev)| i.get(*id).is_some_and(|r| *r != Some(**rev)))
                .count();
            if missing + extra + outdated > 0 {
                let agent = key.1.as_ref().map_or("", |a| a.as_str());
                stale_scopes.push(StaleScope {
                    scope: format!("{}|{agent}", key.0.as_ref().map_or("", |u| u.as_str())),
                    missing,
                    extra,
                    outdated,
                });
            }
        }
        stale_scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        Self {
            canonical_facts: records.len(),
            unreadable_facts: unreadable,
            indexed_docs: indexed.len(),
            stale_scopes,
        }
    }
}

fn scope_label(user: &Option<UserId>, agent: &AgentName) -> String {
    format!(
        "{}|{}",
        user.as_ref().map_or("", |u| u.as_str()),
        agent.as_str()
    )
}

#[async_trait]
impl FactRepository for FileMemoryStorage {
    fn capabilities(&self) -> StorageCapabilities {
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
        if self.inner.retrieval.is_some() {
            names.insert("retrieval".into());
        }
        StorageCapabilities {
            names,
            persistent: true,
            retrieval: self.inner.retrieval.is_some(),
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
        let (fact, notes) = self
            .run_write(user, Some(agent), move |inner| {
                inner.get_fact(u.as_ref(), &a, &id)
            })
            .await?;
        self.dispatch(notes).await;
        Ok(fact)
    }

    async fn list_facts(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        query: &ListQuery,
    ) -> std::result::Result<Vec<Fact>, StorageError> {
        if query.limit == Some(0) {
            return Err(StorageError::invalid(
                "limit",
                "cursor must be >= 0 and limit must be >= 1",
            ));
        }
        let doc = self.load_impl(user, Some(agent), false).await?;
        let matched = doc.facts.into_iter().filter(|f| {
            if query.filters.is_empty() {
                return true;
            }
            let m = f.to_internal_map();
            query
                .filters
                .iter()
                .all(|(k, v)| m.get(k).is_some_and(|x| py::py_eq(x, v)))
        });
        let paged = matched.skip(query.cursor);
        Ok(match query.limit {
            Some(n) => paged.take(n).collect(),
            None => paged.collect(),
        })
    }

    async fn apply_changes(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        changes: ChangeSet,
        options: ApplyOptions,
    ) -> std::result::Result<ChangeResult, StorageError> {
        let prepared = prepare_changes(changes, agent)?;
        let (u, a) = (user.cloned(), agent.cloned());
        let (done, notes) = self
            .run_write(user, agent, move |inner| {
                inner.apply(u.as_ref(), a.as_ref(), prepared, options)
            })
            .await?;
        self.dispatch(notes).await;
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
        let progress = self
            .run(move |inner| {
                let mut progress = ClearProgress::default();
                progress.result = inner.clear_all(u.as_ref(), &mut progress);
                Ok(progress)
            })
            .await?;
        // The agents cleared before a failure are gone from the files: the index hears of it.
        self.dispatch(progress.notes).await;
        if let Err(e) = progress.result {
            let e = StorageError::from(e);
            // The failing agent's commit may have landed in part (an I/O error after its
            // commit point): its scope is rebuilt from the files at its next search.
            if let (StorageError::Io { .. }, Some(agent), true) =
                (&e, progress.failed_at, self.inner.retrieval.is_some())
            {
                self.inner.dirty.lock().insert((user.cloned(), agent));
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

#[async_trait]
impl FactMetadata for FileMemoryStorage {
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> std::result::Result<FactUsageMap, StorageError> {
        let (u, a) = (user.cloned(), agent.clone());
        self.run(move |inner| {
            let udir = inner.user_dir(u.as_ref())?;
            let _lock = inner.lock(&udir)?;
            Ok(sidecar::read_usage(&udir.metadata(&a).join(USAGE_FILE)))
        })
        .await
    }

    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> std::result::Result<(), StorageError> {
        if ids.is_empty() {
            return Ok(());
        }
        let (u, a, ids) = (user.cloned(), agent.clone(), ids.to_vec());
        self.run(move |inner| {
            let udir = inner.user_dir(u.as_ref())?;
            let now = at.unwrap_or_else(|| inner.now());
            let _lock = inner.lock(&udir)?;
            let existing = inner.existing_ids(&udir, &a, &ids);
            if existing.is_empty() {
                return Ok(());
            }
            sidecar::record_accesses(
                &udir.metadata(&a).join(USAGE_FILE),
                &existing,
                now,
                inner.config.access_half_life_days,
            )
        })
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
    ) -> std::result::Result<(), StorageError> {
        if decision.evicted.is_empty() || self.inner.config.audit_max_entries == 0 {
            return Ok(());
        }
        let (u, a) = (user.cloned(), agent.clone());
        let (decision, shadow) = (decision.clone(), shadow.cloned());
        self.run(move |inner| {
            let udir = inner.user_dir(u.as_ref())?;
            let now = at.unwrap_or_else(|| inner.now());
            let _lock = inner.lock(&udir)?;
            sidecar::record_eviction(
                &udir.metadata(&a).join(AUDIT_FILE),
                &decision,
                max_facts,
                shadow.as_ref(),
                now,
                inner.config.audit_max_entries,
            )
        })
        .await
    }

    async fn clear_fact_metadata(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: Option<&[FactId]>,
    ) -> std::result::Result<(), StorageError> {
        let (u, a) = (user.cloned(), agent.clone());
        let ids: Option<Vec<String>> = ids.map(|i| i.iter().map(|x| x.to_string()).collect());
        self.run(move |inner| {
            let udir = inner.user_dir(u.as_ref())?;
            let _lock = inner.lock(&udir)?;
            inner.clear_metadata_locked(&udir, &a, ids.as_deref())
        })
        .await
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
                supported: false,
                indexed: 0,
                failed: 0,
                fatal: false,
                reason: Some("retrieval_not_configured".into()),
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
            Err(
                deermem_core::RetrievalError::InvalidInput(_)
                | deermem_core::RetrievalError::Unsupported { .. },
            ) => {
                // Fall back to clear + one upsert per fact, counting failures.
                if let Err(e) = retrieval.clear(scope_list.as_deref()).await {
                    tracing::warn!(error = %e, "retrieval clear failed");
                    return Ok(RebuildReport {
                        supported: true,
                        indexed: 0,
                        failed: failed + records.len().max(1),
                        fatal: true,
                        reason: None,
                    });
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
                return Ok(RebuildReport {
                    supported: true,
                    indexed: 0,
                    failed: failed + records.len().max(1),
                    fatal: true,
                    reason: None,
                });
            }
        }
        if failed == 0 || scope_list.is_some() {
            let mut dirty = self.inner.dirty.lock();
            match &scopes {
                None if failed == 0 => dirty.clear(),
                None => {}
                Some(list) if failed == 0 => {
                    for k in *list {
                        dirty.remove(k);
                    }
                }
                Some(_) => {}
            }
        }
        Ok(RebuildReport {
            supported: true,
            indexed,
            failed,
            fatal: false,
            reason: None,
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
            .map(|(u, a)| scope_label(u, a))
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
            }
            Some(Err(e)) => status.last_error = Some(e.to_string()),
            None => {}
        }
        status
    }
}

impl FileMemoryStorage {
    /// Migrates legacy v1 data of the user into the agent's bucket (explicit migration), or
    /// with `dry_run` only reports whether it would. An administrative operation of this
    /// adapter (`deermem migrate`); normal reads migrate lazily on their own.
    ///
    /// # Errors
    /// `Corrupt` for conflicting summaries or mismatched backups (nothing modified).
    pub async fn migrate(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        dry_run: bool,
    ) -> std::result::Result<MigrationReport, StorageError> {
        let (u, a) = (user.cloned(), agent.clone());
        let (report, notes) = self
            .run_write(user, Some(agent), move |inner| {
                inner.migrate(u.as_ref(), &a, dry_run)
            })
            .await?;
        self.dispatch(notes).await;
        Ok(report)
    }

    /// The raw ids of the users this root holds data for (those it can name).
    ///
    /// # Errors
    /// `Io` when the root cannot be read.
    pub async fn list_users(&self) -> std::result::Result<Vec<UserId>, StorageError> {
        self.run(|inner| inner.list_users()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_deermem_resolves_the_root_with_injected_lookups() {
        let mut cfg = DeerMemConfig {
            file_lock_timeout_seconds: 3,
            eviction_audit_max_entries: 7,
            eviction_access_half_life_days: 12,
            strict_user_scope: true,
            manifest_filename: "index.json".into(),
            ..DeerMemConfig::default()
        };
        let env = |k: &str| (k == "DEERMEM_DATA_DIR").then(|| "/data/dm".to_owned());
        let no_env = |_: &str| None;
        let home = || Some(PathBuf::from("/home/u"));
        let no_home = || None;
        let c = FileStorageConfig::from_deermem(&cfg, &env, &home).unwrap();
        assert_eq!(c.root, PathBuf::from("/data/dm"));
        assert_eq!(c.lock_timeout, Duration::from_secs(3));
        assert_eq!(c.audit_max_entries, 7);
        assert_eq!(c.access_half_life_days, 12.0);
        assert!(c.strict_user_scope);
        assert_eq!(c.manifest_filename, "index.json");
        let c = FileStorageConfig::from_deermem(&cfg, &no_env, &home).unwrap();
        assert_eq!(c.root, PathBuf::from("/home/u/.deermem"));
        assert!(FileStorageConfig::from_deermem(&cfg, &no_env, &no_home).is_err());
        cfg.storage_path = "/srv/mem".into();
        let c = FileStorageConfig::from_deermem(&cfg, &env, &home).unwrap();
        assert_eq!(c.root, PathBuf::from("/srv/mem"));
    }
}
