//! Shared fixtures of the manager tests: DeerMem over the file storage with the FTS5 index on a
//! temp root, over the in-memory storage, a storage wrapper that injects competing writers and
//! scripted index rebuilds, and conversation builders.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::ports::{
    AddRequest, Clock, FactMetadata, FactRepository, LanguageModel, ListQuery, MemoryScope,
    MemoryStorage, ScopedSearch, SearchRequest, StorageCapabilities,
};
use deermem_core::{
    AgentName, ApplyOptions, ChangeResult, ChangeSet, Fact, FactId, MemoryDocument, Message,
    RebuildReport, RetrievalStatus, SearchHit, SearchMode, SearchQuery, StorageError, Timestamp,
    UserId,
};
use deermem_engine::{DeerMemManager, DeerMemParts};
use deermem_retrieval_fts5::Fts5Retrieval;
use deermem_storage_file::{FileStorage, FileStorageConfig};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::llm::ScriptedLlm;
use deermem_testkit::storage::InMemoryStorage;
use deermem_updater::FactIdSource;
use deermem_updater::{DeerMemConfig, TokenCounting};
use serde_json::{Value, json};
use tempfile::TempDir;

/// The time every test starts at.
pub const START: &str = "2026-06-01T00:00:00Z";

/// A manual clock at [`START`].
pub fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::at(START))
}

/// The test configuration: char token counting (no BPE table needed), defaults otherwise.
pub fn config() -> DeerMemConfig {
    DeerMemConfig {
        token_counting: TokenCounting::Char,
        ..DeerMemConfig::default()
    }
}

/// Deterministic fact ids `fact_0000000N`.
pub fn counter_ids() -> FactIdSource {
    let n = Arc::new(AtomicU64::new(0));
    FactIdSource::from_fn(move || {
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        FactId::new(format!("fact_{i:08x}")).expect("valid id")
    })
}

pub fn user(s: &str) -> UserId {
    UserId::new(s).expect("valid user id")
}

pub fn agent(s: &str) -> AgentName {
    AgentName::parse(s).expect("valid agent")
}

/// The scope of a user and optional agent.
pub fn scope(u: &str, a: Option<&str>) -> MemoryScope {
    MemoryScope::new(Some(user(u)), a.map(agent))
}

/// A search request.
pub fn search(query: &str, top_k: usize, scope: MemoryScope) -> SearchRequest {
    SearchRequest {
        query: query.into(),
        top_k,
        scope,
        category: None,
        mode: None,
    }
}

/// A user message with an id.
pub fn h(id: &str, text: &str) -> Message {
    let mut m = Message::human(text);
    m.id = Some(id.into());
    m
}

/// An assistant message with an id.
pub fn a(id: &str, text: &str) -> Message {
    let mut m = Message::ai(text);
    m.id = Some(id.into());
    m
}

/// One conversation turn for a scope.
pub fn turn(thread: &str, scope: MemoryScope, user_text: &str) -> AddRequest {
    AddRequest {
        thread_id: thread.into(),
        messages: vec![h("u1", user_text), a("a1", "Noted.")],
        scope,
        trace_id: None,
    }
}

/// A labelled new fact for a scripted model answer.
pub fn labelled(content: &str, category: &str, conf: f64) -> Value {
    json!({"content": content, "category": category, "confidence": conf,
           "scope": "user", "durability": "durable", "authority": "descriptive"})
}

/// A model answer adding the given facts.
pub fn answer(facts: &[Value]) -> String {
    json!({"user": {}, "history": {}, "newFacts": facts}).to_string()
}

/// A file storage with the FTS5 index on `root`.
pub fn file_storage(root: &Path, clock: Arc<dyn Clock>) -> FileStorage {
    let index = Fts5Retrieval::open(root, clock.clone()).expect("fts5 index");
    FileStorage::new(FileStorageConfig::new(root), clock, Some(Arc::new(index)))
        .expect("file storage")
}

/// The parts of a manager over `storage` with deterministic ids and a model when given.
pub fn parts(
    config: DeerMemConfig,
    storage: Arc<dyn MemoryStorage>,
    clock: Arc<dyn Clock>,
    llm: Option<Arc<dyn LanguageModel>>,
) -> DeerMemParts {
    let mut p = DeerMemParts::new(config, storage, clock);
    p.llm = llm;
    p.fact_ids = Some(counter_ids());
    p
}

/// DeerMem over the file storage and FTS5 on a fresh temp root.
pub struct FileEnv {
    pub manager: Arc<DeerMemManager>,
    pub storage: FileStorage,
    pub clock: Arc<ManualClock>,
    pub dir: TempDir,
}

impl FileEnv {
    pub fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

/// A file-backed manager with `config` and an optional scripted model.
pub fn file_env(config: DeerMemConfig, llm: Option<Arc<ScriptedLlm>>) -> FileEnv {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock();
    let storage = file_storage(dir.path(), clock.clone());
    let llm = llm.map(|l| l as Arc<dyn LanguageModel>);
    let manager = DeerMemManager::new(parts(config, Arc::new(storage.clone()), clock.clone(), llm))
        .expect("manager");
    FileEnv {
        manager: Arc::new(manager),
        storage,
        clock,
        dir,
    }
}

/// A manager over the in-memory storage (no index: substring search only).
pub fn memory_manager(
    config: DeerMemConfig,
    llm: Option<Arc<ScriptedLlm>>,
) -> (Arc<DeerMemManager>, Arc<InMemoryStorage>, Arc<ManualClock>) {
    let clock = clock();
    let storage = Arc::new(InMemoryStorage::new(clock.clone()));
    let llm = llm.map(|l| l as Arc<dyn LanguageModel>);
    let m =
        DeerMemManager::new(parts(config, storage.clone(), clock.clone(), llm)).expect("manager");
    (Arc::new(m), storage, clock)
}

/// Every `.md` file under `dir`, recursively.
pub fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The scopes one `rebuild_index` call asked for (`None`: everything).
pub type RebuildCall = Option<Vec<(Option<UserId>, AgentName)>>;

/// A competing write the hooked storage performs right before the manager's next commit.
#[derive(Debug, Clone)]
pub struct Competitor {
    pub user: Option<UserId>,
    pub agent: AgentName,
    pub changes: ChangeSet,
}

/// A storage wrapper for race and lifecycle tests: competing commits injected before the next
/// `apply_changes`, scripted `rebuild_index` results, a failing index search, and call logs.
#[derive(Debug)]
pub struct HookedStorage {
    pub inner: Arc<dyn MemoryStorage>,
    pub competitors: Mutex<VecDeque<Competitor>>,
    pub rebuild_results: Mutex<VecDeque<RebuildReport>>,
    pub rebuild_calls: Mutex<Vec<RebuildCall>>,
    pub retrieval: Option<bool>,
    pub fail_search: AtomicBool,
    pub search_calls: AtomicUsize,
    /// The mode of every index search, in order.
    pub search_modes: Mutex<Vec<Option<SearchMode>>>,
    pub accesses: Mutex<Vec<Vec<String>>>,
    pub usage_reads: AtomicUsize,
    pub applies: AtomicUsize,
    pub closes: AtomicUsize,
}

impl HookedStorage {
    pub fn new(inner: Arc<dyn MemoryStorage>) -> Self {
        Self {
            inner,
            competitors: Mutex::new(VecDeque::new()),
            rebuild_results: Mutex::new(VecDeque::new()),
            rebuild_calls: Mutex::new(Vec::new()),
            retrieval: None,
            fail_search: AtomicBool::new(false),
            search_calls: AtomicUsize::new(0),
            search_modes: Mutex::new(Vec::new()),
            accesses: Mutex::new(Vec::new()),
            usage_reads: AtomicUsize::new(0),
            applies: AtomicUsize::new(0),
            closes: AtomicUsize::new(0),
        }
    }

    /// Claims a retrieval index (so the manager's lazy warm-up runs) whatever the inner says.
    pub fn with_retrieval(mut self, on: bool) -> Self {
        self.retrieval = Some(on);
        self
    }

    pub fn compete(&self, c: Competitor) {
        self.competitors.lock().unwrap().push_back(c);
    }

    pub fn script_rebuild(&self, r: RebuildReport) {
        self.rebuild_results.lock().unwrap().push_back(r);
    }

    pub fn rebuild_calls(&self) -> Vec<RebuildCall> {
        self.rebuild_calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl FactRepository for HookedStorage {
    fn capabilities(&self) -> StorageCapabilities {
        let mut c = self.inner.capabilities();
        if let Some(on) = self.retrieval {
            c.retrieval = on;
        }
        c
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
        self.applies.fetch_add(1, Ordering::SeqCst);
        let competitor = self.competitors.lock().unwrap().pop_front();
        if let Some(c) = competitor {
            self.inner
                .apply_changes(
                    c.user.as_ref(),
                    Some(&c.agent),
                    c.changes,
                    ApplyOptions::default(),
                )
                .await?;
        }
        self.inner
            .apply_changes(user, agent, changes, options)
            .await
    }

    fn new_fact_id(&self) -> FactId {
        self.inner.new_fact_id()
    }

    async fn clear_all(&self, user: Option<&UserId>) -> Result<MemoryDocument, StorageError> {
        self.inner.clear_all(user).await
    }

    async fn close(&self) {
        self.closes.fetch_add(1, Ordering::SeqCst);
        self.inner.close().await;
    }
}

#[async_trait]
impl FactMetadata for HookedStorage {
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<FactUsageMap, StorageError> {
        self.usage_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get_fact_usage(user, agent).await
    }

    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        self.accesses
            .lock()
            .unwrap()
            .push(ids.iter().map(|i| i.as_str().to_owned()).collect());
        self.inner.record_fact_accesses(user, agent, ids, at).await
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
        self.inner
            .record_capacity_eviction(user, agent, decision, max_facts, shadow, at)
            .await
    }

    async fn clear_fact_metadata(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: Option<&[FactId]>,
    ) -> Result<(), StorageError> {
        self.inner.clear_fact_metadata(user, agent, ids).await
    }
}

#[async_trait]
impl ScopedSearch for HookedStorage {
    async fn search_facts(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StorageError> {
        self.search_calls.fetch_add(1, Ordering::SeqCst);
        self.search_modes.lock().unwrap().push(query.mode);
        if self.fail_search.load(Ordering::SeqCst) {
            return Err(StorageError::Io {
                context: "index search".into(),
                source: std::io::Error::other("injected index failure"),
            });
        }
        self.inner.search_facts(query).await
    }

    async fn rebuild_index(
        &self,
        scopes: Option<&[(Option<UserId>, AgentName)]>,
    ) -> Result<RebuildReport, StorageError> {
        self.rebuild_calls
            .lock()
            .unwrap()
            .push(scopes.map(<[_]>::to_vec));
        let scripted = self.rebuild_results.lock().unwrap().pop_front();
        match scripted {
            Some(r) => Ok(r),
            None => self.inner.rebuild_index(scopes).await,
        }
    }

    async fn retrieval_status(&self) -> RetrievalStatus {
        self.inner.retrieval_status().await
    }
}

/// A manager over a hooked storage.
pub fn hooked_manager(
    config: DeerMemConfig,
    hooked: Arc<HookedStorage>,
    clock: Arc<ManualClock>,
) -> Arc<DeerMemManager> {
    Arc::new(DeerMemManager::new(parts(config, hooked, clock, None)).expect("manager"))
}

/// A competing create of one fact.
pub fn competing_create(u: &str, a: &str, id: &str, content: &str, confidence: f64) -> Competitor {
    let draft = json!({"id": id, "content": content, "category": "context", "confidence": confidence, "source": "manual"});
    Competitor {
        user: Some(user(u)),
        agent: agent(a),
        changes: ChangeSet {
            upserts: vec![deermem_core::FactDraft::try_from(draft).expect("a valid draft")],
            ..ChangeSet::default()
        },
    }
}

/// Ids of a public document, in order.
pub fn ids(doc: &deermem_core::PublicMemoryDocument) -> Vec<String> {
    doc.facts.iter().map(|f| f.id.clone()).collect()
}
