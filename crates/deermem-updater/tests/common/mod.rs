//! Shared helpers of the integration tests: a spy around the testkit's in-memory storage that
//! counts calls and can simulate concurrent writers, a log capture, and message builders.

#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::ports::{
    Clock, FactMetadata, FactRepository, ListQuery, ScopedSearch, StorageCapabilities,
};
use deermem_core::prelude::*;
use deermem_core::{
    AgentName, ApplyOptions, ChangeResult, ChangeSet, Fact, FactDraft, FactId, MemoryDocument,
    Message, RebuildReport, RetrievalStatus, SearchHit, SearchQuery, StorageError, SummaryPatch,
    Timestamp, UserId,
};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::storage::InMemoryStorage;
use deermem_updater::DeerMemConfig;
use deermem_updater::FactIdSource;
use serde_json::json;

/// The time every test starts at.
pub const START: &str = "2026-06-01T00:00:00Z";

/// A manual clock at [`START`].
pub fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::at(START))
}

/// Deterministic fact ids `fact_0000000N`.
pub fn counter_ids() -> FactIdSource {
    let n = Arc::new(AtomicU64::new(0));
    FactIdSource::from_fn(move || {
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        FactId::new(format!("fact_{i:08}")).unwrap()
    })
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

/// A labelled new fact for a scripted model answer.
pub fn labelled(content: &str, conf: f64) -> serde_json::Value {
    json!({"content": content, "category": "preference", "confidence": conf,
           "scope": "user", "durability": "durable", "authority": "descriptive"})
}

/// A model answer adding the given facts.
pub fn answer(facts: &[serde_json::Value]) -> String {
    json!({"user": {}, "history": {}, "newFacts": facts}).to_string()
}

/// A storage wrapper that counts calls and can inject concurrent commits.
#[derive(Debug)]
pub struct SpyStorage {
    pub inner: InMemoryStorage,
    pub loads: AtomicUsize,
    pub applies: AtomicUsize,
    pub usage_reads: Mutex<Vec<(Option<String>, String)>>,
    pub audits: Mutex<Vec<(Vec<String>, bool)>>,
    /// How many of the next `apply_changes` calls see a concurrent summary write first.
    pub conflicts_to_inject: AtomicUsize,
    pub last_options: Mutex<Vec<ApplyOptions>>,
}

impl SpyStorage {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: InMemoryStorage::new(clock),
            loads: AtomicUsize::new(0),
            applies: AtomicUsize::new(0),
            usage_reads: Mutex::new(Vec::new()),
            audits: Mutex::new(Vec::new()),
            conflicts_to_inject: AtomicUsize::new(0),
            last_options: Mutex::new(Vec::new()),
        }
    }

    pub async fn seed(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        facts: Vec<serde_json::Value>,
    ) {
        let changes = ChangeSet {
            upserts: facts
                .into_iter()
                .map(|f| FactDraft::try_from(f).unwrap())
                .collect(),
            ..ChangeSet::default()
        };
        self.inner
            .apply_changes(user, Some(agent), changes, ApplyOptions::default())
            .await
            .unwrap();
    }
}

#[async_trait]
impl FactRepository for SpyStorage {
    fn capabilities(&self) -> StorageCapabilities {
        self.inner.capabilities()
    }

    async fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        self.loads.fetch_add(1, Ordering::SeqCst);
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
        self.last_options.lock().unwrap().push(options);
        let inject =
            self.conflicts_to_inject
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if let Ok(left) = inject {
            // Another writer commits first: a summary change bumps the shared revision.
            let mut child = serde_json::Map::new();
            child.insert(
                "topOfMind".into(),
                json!({"summary": "concurrent writer", "updatedAt": format!("{START}#{left}")}),
            );
            self.inner
                .update_summaries(
                    user,
                    SummaryPatch {
                        user: Some(child),
                        history: None,
                    },
                    None,
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
        self.inner.close().await;
    }
}

#[async_trait]
impl FactMetadata for SpyStorage {
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<FactUsageMap, StorageError> {
        self.usage_reads.lock().unwrap().push((
            user.map(|u| u.as_str().to_owned()),
            agent.as_str().to_owned(),
        ));
        self.inner.get_fact_usage(user, agent).await
    }

    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
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
        self.audits
            .lock()
            .unwrap()
            .push((decision.evicted_ids(), shadow.is_some()));
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
impl ScopedSearch for SpyStorage {
    async fn search_facts(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StorageError> {
        self.inner.search_facts(query).await
    }

    async fn rebuild_index(
        &self,
        scopes: Option<&[(Option<UserId>, AgentName)]>,
    ) -> Result<RebuildReport, StorageError> {
        self.inner.rebuild_index(scopes).await
    }

    async fn retrieval_status(&self) -> RetrievalStatus {
        self.inner.retrieval_status().await
    }
}

/// A drafting helper for seeded facts.
pub fn seed_fact(id: &str, content: &str, conf: f64) -> serde_json::Value {
    json!({"id": id, "content": content, "category": "preference", "confidence": conf, "createdAt": START})
}

/// Config with defaults.
pub fn config() -> DeerMemConfig {
    DeerMemConfig::default()
}

/// Captured log output of the current thread.
#[derive(Clone, Default)]
pub struct LogCapture(pub Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Installs a subscriber for the current thread; keep the guard alive.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let buf = self.0.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || Writer(buf.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(sub)
    }
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl Write for Writer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
