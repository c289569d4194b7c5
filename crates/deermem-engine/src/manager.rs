//! The DeerMem manager: the backend-neutral `MemoryManager` contract over any `MemoryStorage` and
//! the update pipeline of this crate.
//!
//! - **Writes from conversations.** `add` / `add_nowait` filter the raw turn, detect signals and
//!   queue it ([`UpdatePipeline`]); [`DeerMemManager::ingest_now`] runs one extraction at once
//!   and reports what it did.
//! - **Reads.** `get_context` (injection text; summaries only in tool mode), `get_memory` /
//!   `export_memory` (the compatibility document with string sources), `search` (the storage's
//!   index first, then a substring scan over the whole bucket).
//! - **Management.** `clear_memory`, `import_memory` (replace the bucket), `reload_memory`,
//!   fact CRUD with revision preconditions, capacity eviction and its audit.
//! - **Lifecycle.** `shutdown_flush`, `warm` (the token counter),
//!   [`DeerMemManager::warm_retrieval`] (the full index rebuild), `close`.
//!
//! Every storage error crosses the boundary as the neutral [`ManagerError`]; an omitted agent is
//! the reserved `__default__` bucket and agent names are lowercase ([`AgentName`]).

mod bucket;
mod facts;
mod ingest;
mod locks;
mod search;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::ports::{
    AddRequest, Clock, ContextRequest, FactAdmin, LanguageModel, MemoryAdmin, MemoryManager,
    MemoryReader, MemoryReload, MemoryScope, MemorySearch, MemoryStorage,
};
use deermem_core::{
    AgentName, CacheBound, InvalidInputCode, ManagerError, MemoryMode, OverloadScope,
    PublicMemoryDocument, UserId,
};
use deermem_updater::{DeerMemConfig, TokenCounting};

pub use bucket::ImportTrim;
pub use ingest::{AddedFact, IngestReport, IngestStatus, RemovalReason, RemovedFact};

use crate::pipeline::{Submission, SubmitOutcome, UpdatePipeline};
use crate::queue::{QueueConfig, QueueError};
use crate::turns::TurnLog;
use deermem_core::ports::TurnJournal;
use deermem_updater::FactIdSource;
use deermem_updater::HiddenMessagePolicy;
use deermem_updater::MemoryUpdater;
use deermem_updater::PatternSet;
use deermem_updater::TemplateStore;
use deermem_updater::TokenCounter;
use deermem_updater::UpdateObserver;

/// The backend name used in "not supported by" messages and logs.
pub(crate) const DEERMEM_NAME: &str = "DeerMem";

/// Attempts of a manager write whose caller named no revision (create, scoped clear, import,
/// and update or delete without `expected_revision`) before a revision conflict is reported.
/// The reference stops after three; several processes writing one user (CLI invocations,
/// gateway replicas on one root) lose that race often enough that three is not enough, so we
/// retry more, each time after a short randomised pause (`conflict_backoff`).
pub(crate) const MAX_SNAPSHOT_ATTEMPTS: u32 = 8;

/// The pause before retry `attempt + 1` of a write that lost a revision race: exponential from
/// 2 ms, capped at 64 ms, scaled by a random factor in [0.5, 1.5) so racing writers spread out.
pub(crate) async fn conflict_backoff(attempt: u32) {
    let base_ms = 2u64 << attempt.min(5);
    let factor = 0.5 + rand::random::<f64>();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let micros = (base_ms as f64 * 1000.0 * factor) as u64;
    tokio::time::sleep(std::time::Duration::from_micros(micros)).await;
}

/// The longest thread id accepted (bytes). Thread ids end up in fact sources on disk.
pub(crate) const MAX_THREAD_ID_BYTES: usize = 1024;

/// Everything a [`DeerMemManager`] is built from.
///
/// Build it with [`DeerMemParts::new`] and set the optional fields; new optional fields may be
/// added, so prefer `new` over a struct literal.
pub struct DeerMemParts {
    /// The parsed `backend_config`.
    pub config: DeerMemConfig,
    /// Middleware (summaries and facts injected) or tool mode (summaries only).
    pub mode: MemoryMode,
    /// The host's `injection_enabled`; when false `get_context` is always empty.
    pub injection_enabled: bool,
    /// The fact repository.
    pub storage: Arc<dyn MemoryStorage>,
    /// The extraction model; `None` uses the offline rule-based proposer (logged once).
    pub llm: Option<Arc<dyn LanguageModel>>,
    /// The clock every timestamp comes from.
    pub clock: Arc<dyn Clock>,
    /// The host hook for hidden (`hide_from_ui`) user messages.
    pub hidden_messages: HiddenMessagePolicy,
    /// Receives model-call and extraction events (metrics, tracing).
    pub observer: Option<Arc<dyn UpdateObserver>>,
    /// Queue settings; `None` takes `debounce_seconds` and `queue_max_depth` from the config.
    pub queue: Option<QueueConfig>,
    /// Fresh fact ids (`fact_` + 8 hex by default); tests inject deterministic ones.
    pub fact_ids: Option<FactIdSource>,
    /// The turn journal; with `queue.durable` every accepted turn is kept there until its
    /// extraction is committed. `None` keeps turns in memory only.
    pub turns: Option<Arc<dyn TurnJournal>>,
    /// Replay the journal's pending turns in the background from the start, and claim turns
    /// whose owner died every `queue.claim_interval` (hosts that serve; one-shot commands leave it
    /// off and call [`DeerMemManager::recover_turns`] if they want to).
    pub recover_turns: bool,
}

/// How long this process's lease on a journal turn lasts without renewal: the default of
/// `queue.turn_lease`.
pub const TURN_LEASE: Duration = Duration::from_secs(deermem_updater::DEFAULT_TURN_LEASE_SECONDS);
/// How often the journal is claimed again (renewing this process's leases, taking over the
/// turns of a replica that died): the default of `queue.claim_interval`.
pub const CLAIM_INTERVAL: Duration =
    Duration::from_secs(deermem_updater::DEFAULT_CLAIM_INTERVAL_SECONDS);

impl DeerMemParts {
    /// Parts with the defaults: middleware mode, injection on, no model (offline proposer),
    /// the structural hidden-message rule, no observer, the configured queue, random ids.
    pub fn new(
        config: DeerMemConfig,
        storage: Arc<dyn MemoryStorage>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            config,
            mode: MemoryMode::Middleware,
            injection_enabled: true,
            storage,
            llm: None,
            clock,
            hidden_messages: HiddenMessagePolicy::structural(),
            observer: None,
            queue: None,
            fact_ids: None,
            turns: None,
            recover_turns: false,
        }
    }
}

impl fmt::Debug for DeerMemParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeerMemParts")
            .field("mode", &self.mode)
            .field("injection_enabled", &self.injection_enabled)
            .field("storage", &self.storage)
            .field("llm", &self.llm.as_ref().map(|l| l.model_name().to_owned()))
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

/// The embedded DeerMem backend (see the module documentation).
pub struct DeerMemManager {
    config: Arc<DeerMemConfig>,
    mode: MemoryMode,
    injection_enabled: bool,
    storage: Arc<dyn MemoryStorage>,
    clock: Arc<dyn Clock>,
    pipeline: UpdatePipeline,
    hidden: HiddenMessagePolicy,
    ids: FactIdSource,
    warm: search::WarmState,
    /// Whether the storage has a retrieval index (fixed for the storage's lifetime).
    indexed: bool,
    closed: AtomicBool,
    /// Per-user turns of the manager's own write loops.
    write_turns: locks::UserWriteTurns,
    /// The background replay and claim loop, stopped with the manager.
    claims: Option<ClaimLoop>,
    /// Set once the first replay of the journal has queued its pending turns.
    recovered: tokio::sync::watch::Receiver<bool>,
}

/// Aborts the claim loop when the manager goes.
struct ClaimLoop(tokio::task::AbortHandle);

impl Drop for ClaimLoop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl fmt::Debug for DeerMemManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeerMemManager")
            .field("mode", &self.mode)
            .field("injection_enabled", &self.injection_enabled)
            .field("storage", &self.storage)
            .field("pipeline", &self.pipeline)
            .finish_non_exhaustive()
    }
}

fn config_error(key: &str, e: impl fmt::Display) -> ManagerError {
    ManagerError::invalid(InvalidInputCode::Other, format!("{key}: {e}"))
}

impl DeerMemManager {
    /// Builds the manager and starts its update queue on the current tokio runtime.
    ///
    /// `patterns_dir` and `prompts_dir` are read here (blocking reads of a few small files), so
    /// a bad operator directory fails at start-up, naming the file.
    ///
    /// # Errors
    /// `InvalidInput` for an unusable `patterns_dir` / `prompts_dir`; `Unavailable` outside a
    /// tokio runtime.
    pub fn new(parts: DeerMemParts) -> Result<Self, ManagerError> {
        let config = Arc::new(parts.config);
        let ids = parts.fact_ids.unwrap_or_default();
        let mut builder =
            MemoryUpdater::builder(config.clone(), parts.storage.clone(), parts.clock.clone())
                .language_model(parts.llm)
                .id_source(ids.clone());
        if let Some(dir) = &config.patterns_dir {
            let patterns = PatternSet::load_dir_blocking(Path::new(dir))
                .map_err(|e| config_error("memory.backend_config.patterns_dir", e))?;
            builder = builder.patterns(Arc::new(patterns));
        }
        if let Some(dir) = &config.prompts_dir {
            let templates = TemplateStore::load_blocking(Path::new(dir))
                .map_err(|e| config_error("memory.backend_config.prompts_dir", e))?;
            builder = builder.templates(Arc::new(templates));
        }
        if let Some(observer) = parts.observer {
            builder = builder.observer(observer);
        }
        let updater = Arc::new(builder.build());
        let queue = parts
            .queue
            .unwrap_or_else(|| QueueConfig::from_config(&config));
        let turns = parts
            .turns
            .filter(|_| config.queue.durable)
            .map(|journal| TurnLog {
                journal,
                retry: config.queue.retry.clone(),
                clock: parts.clock.clone(),
                lease: config.queue.turn_lease(),
            });
        let durable = turns.is_some();
        let pipeline =
            UpdatePipeline::with_turns(updater, parts.hidden_messages.clone(), queue, turns)
                .map_err(|e| ManagerError::unavailable(e.to_string()).caused_by(e))?;
        let (recovered_tx, recovered) = tokio::sync::watch::channel(!durable);
        let claims = if durable && parts.recover_turns {
            let pipeline = pipeline.clone();
            let (lease, interval) = (config.queue.turn_lease(), config.queue.claim_interval());
            let task = tokio::spawn(async move {
                loop {
                    match pipeline.recover(lease).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(
                            turns = n,
                            "pending turns from the turn journal queued again"
                        ),
                        Err(e) => tracing::warn!(
                            error = %e,
                            "could not read the turn journal's pending turns; trying again"
                        ),
                    }
                    let _ = recovered_tx.send(true);
                    tokio::time::sleep(interval).await;
                }
            });
            Some(ClaimLoop(task.abort_handle()))
        } else {
            None
        };
        let indexed = parts.storage.capabilities().retrieval;
        Ok(Self {
            config,
            mode: parts.mode,
            injection_enabled: parts.injection_enabled,
            storage: parts.storage,
            clock: parts.clock,
            pipeline,
            hidden: parts.hidden_messages,
            ids,
            warm: search::WarmState::new(),
            indexed,
            closed: AtomicBool::new(false),
            write_turns: locks::UserWriteTurns::default(),
            claims,
            recovered,
        })
    }

    /// Queues the turn journal's pending turns that this process does not hold yet (a replay
    /// after a restart, or the turns of a replica that died); how many. 0 without a journal.
    ///
    /// # Errors
    /// `Unavailable` when the journal cannot be read.
    pub async fn recover_turns(&self) -> Result<usize, ManagerError> {
        self.pipeline
            .recover(self.config.queue.turn_lease())
            .await
            .map_err(|e| ManagerError::unavailable(e.to_string()).caused_by(e))
    }

    /// Resolves once the background replay (`recover_turns` in [`DeerMemParts`]) has queued
    /// the journal's pending turns, at once without a journal or without a background replay.
    pub async fn turns_recovered(&self) {
        if self.claims.is_none() {
            return;
        }
        let mut rx = self.recovered.clone();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// The turn journal, when turns are durable.
    pub fn turn_journal(&self) -> Option<&Arc<dyn TurnJournal>> {
        self.pipeline.turns().map(|t| &t.journal)
    }

    /// The storage this manager reads and writes.
    pub fn storage(&self) -> &Arc<dyn MemoryStorage> {
        &self.storage
    }

    /// The update pipeline (admission, queue, updater).
    pub fn pipeline(&self) -> &UpdatePipeline {
        &self.pipeline
    }

    /// The DeerMem configuration.
    pub fn config(&self) -> &DeerMemConfig {
        &self.config
    }

    /// The user and agent bucket of a scope: an omitted agent is `__default__`; without a user
    /// under `strict_user_scope` the call is refused.
    fn bucket(&self, scope: &MemoryScope) -> Result<(Option<UserId>, AgentName), ManagerError> {
        self.check_user(scope.user.as_ref())?;
        let agent = scope
            .agent
            .clone()
            .unwrap_or_else(AgentName::default_bucket);
        Ok((scope.user.clone(), agent))
    }

    fn check_user(&self, user: Option<&UserId>) -> Result<(), ManagerError> {
        if user.is_none() && self.config.strict_user_scope {
            return Err(ManagerError::invalid(
                InvalidInputCode::UserId,
                "user_id is required when strict_user_scope is enabled.",
            ));
        }
        Ok(())
    }

    fn submission(&self, request: &AddRequest) -> Result<Submission, ManagerError> {
        let (user, agent) = self.bucket(&request.scope)?;
        check_thread_id(&request.thread_id)?;
        Ok(Submission {
            thread_id: request.thread_id.clone(),
            user,
            agent,
            trace_id: request.trace_id.clone(),
        })
    }

    /// Logs what became of a submission. The error of a submission the queue refused for its
    /// byte limits (the caller must know the turn was not kept); every other outcome is `Ok`,
    /// as in the reference (a turn refused for depth is picked up again with the
    /// conversation's next turn).
    fn settle(&self, outcome: SubmitOutcome, thread_id: &str) -> Result<(), ManagerError> {
        match outcome {
            SubmitOutcome::Queued { signals } => {
                tracing::debug!(thread_id, ?signals, "memory update queued");
            }
            SubmitOutcome::NotAdmitted => {
                tracing::debug!(
                    thread_id,
                    "nothing to remember: no user turn or no assistant turn after filtering"
                );
            }
            SubmitOutcome::Refused(QueueError::TooManyBytes {
                scope, item, max, ..
            }) => {
                let whose = match scope {
                    OverloadScope::User => "this user's",
                    _ => "all users'",
                };
                // Pending turns are processed after the debounce: retry once it has passed.
                let debounce = self.pipeline.queue().config().debounce;
                return Err(ManagerError::Overloaded {
                    scope,
                    message: format!(
                        "the conversation turn ({item} bytes) was not queued: {whose} pending turns would exceed {max} bytes; retry later"
                    ),
                    retry_after: debounce.max(Duration::from_secs(1)),
                });
            }
            SubmitOutcome::NotKept { message, full } => {
                if full {
                    return Err(ManagerError::Overloaded {
                        scope: OverloadScope::Global,
                        message: format!(
                            "the conversation turn was not accepted: {message}; retry later"
                        ),
                        retry_after: Duration::from_secs(5),
                    });
                }
                return Err(ManagerError::unavailable(format!(
                    "the conversation turn was not accepted: {message}"
                )));
            }
            // The pipeline already logged the refusal; the caller never sees it.
            SubmitOutcome::Refused(_) => {}
        }
        Ok(())
    }
}

/// Thread ids are free-form but end up in stored fact sources: no NUL, bounded length.
fn check_thread_id(thread_id: &str) -> Result<(), ManagerError> {
    if thread_id.contains('\0') {
        return Err(ManagerError::invalid(
            InvalidInputCode::Other,
            "thread_id must not contain NUL characters",
        ));
    }
    if thread_id.len() > MAX_THREAD_ID_BYTES {
        return Err(ManagerError::invalid(
            InvalidInputCode::Other,
            format!(
                "thread_id is too long ({} bytes; at most {MAX_THREAD_ID_BYTES})",
                thread_id.len()
            ),
        ));
    }
    Ok(())
}

#[async_trait]
impl MemoryManager for DeerMemManager {
    fn name(&self) -> &str {
        DEERMEM_NAME
    }

    fn mode(&self) -> MemoryMode {
        self.mode
    }

    async fn add(&self, request: AddRequest) -> Result<(), ManagerError> {
        let submission = self.submission(&request)?;
        let outcome = self.pipeline.submit(submission, &request.messages).await;
        self.settle(outcome, &request.thread_id)
    }

    async fn add_nowait(&self, request: AddRequest) -> Result<(), ManagerError> {
        let submission = self.submission(&request)?;
        let outcome = self
            .pipeline
            .submit_emergency(submission, &request.messages)
            .await;
        self.settle(outcome, &request.thread_id)
    }

    async fn get_context(&self, request: ContextRequest) -> Result<String, ManagerError> {
        let (user, agent) = self.bucket(&request.scope)?;
        Ok(self
            .pipeline
            .context(user.as_ref(), &agent, self.mode, self.injection_enabled)
            .await?)
    }

    fn searcher(&self) -> Option<&dyn MemorySearch> {
        Some(self)
    }

    fn reader(&self) -> Option<&dyn MemoryReader> {
        Some(self)
    }

    fn admin(&self) -> Option<&dyn MemoryAdmin> {
        Some(self)
    }

    fn reloader(&self) -> Option<&dyn MemoryReload> {
        Some(self)
    }

    fn facts(&self) -> Option<&dyn FactAdmin> {
        Some(self)
    }

    async fn shutdown_flush(&self, timeout: Duration) -> bool {
        let drained = self.pipeline.shutdown_flush(timeout).await;
        if let Some(journal) = self.turn_journal() {
            match journal.counts().await {
                Ok(c) if c.pending > 0 || c.dead > 0 => tracing::warn!(
                    pending = c.pending,
                    dead = c.dead,
                    "turns stay in the turn journal at shutdown: pending ones are replayed at the next start, dead ones wait for `deermem turns retry`"
                ),
                Ok(_) => tracing::info!("the turn journal is empty at shutdown"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not count the turn journal's items at shutdown")
                }
            }
        }
        drained
    }

    /// The storage's caches (with its index's), the rendered blocks, the warmed-scope
    /// bookkeeping and the updater's caches.
    fn cache_bounds(&self) -> Vec<CacheBound> {
        let mut out = self.storage.cache_bounds();
        out.extend(self.pipeline.cache_bounds());
        out.push(self.warm.cache_bound());
        out
    }

    async fn warm(&self) -> Option<bool> {
        match self.config.token_counting {
            TokenCounting::Char => Some(true),
            TokenCounting::Tiktoken => Some(
                TokenCounter::new(TokenCounting::Tiktoken)
                    .warm_async()
                    .await,
            ),
        }
    }

    /// Stops accepting queued updates and closes the storage (and its index connection).
    /// Call [`MemoryManager::shutdown_flush`] first: pending items are not drained here.
    async fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.pipeline.queue().close();
        self.storage.close().await;
    }
}

#[async_trait]
impl MemoryReader for DeerMemManager {
    async fn get_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        let (user, agent) = self.bucket(&scope)?;
        Ok(self
            .storage
            .load(user.as_ref(), Some(&agent))
            .await?
            .to_public())
    }

    /// The export document: the same as `get_memory` (the reference raised here; its gateway
    /// exported through `get_memory`).
    async fn export_memory(
        &self,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        MemoryReader::get_memory(self, scope).await
    }
}

#[async_trait]
impl MemoryReload for DeerMemManager {
    async fn reload_memory(
        &self,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let (user, agent) = self.bucket(&scope)?;
        // The storage re-reads from disk and re-indexes this scope (the port's contract).
        let doc = self.storage.reload(user.as_ref(), Some(&agent)).await?;
        Ok(doc.to_public())
    }
}
