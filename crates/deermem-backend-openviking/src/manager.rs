//! `OpenVikingManager`: the `MemoryManager` over an OpenViking server: owner-checked scopes,
//! background capture with the hash-only cursor, recall with the fixed injection query, failure
//! policies, health warm-up and a drain-then-close lifecycle.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::ports::{
    AddRequest, BackendFailure, Clock, ContextRequest, FAIL_OPEN_LOG_TARGET, MemoryManager,
    MemoryScope, MemorySearch, ScoredFact, SearchRequest,
};
use deermem_core::search::MatchType;
use deermem_core::{
    ConfigError, InvalidInputCode, ManagerError, MemoryMode, Message, PublicFact, Timestamp,
};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::client::{OpenVikingClient, OpenVikingError, RetrievalRequest};
use deermem_remote::{FailurePolicy, InFlight, InFlightGuard, KeyedLocks, RemoteHit, remote_fact};

use crate::config::{OpenVikingConfig, StartupPolicy};
use crate::convert::{self, HiddenMessageFilter};
use crate::cursor::{CursorError, CursorState, CursorStore, InDoubtBatch};
use crate::recall::{self, RecalledMemory};
use crate::scope;
use deermem_core::ports::CursorStorage;

/// The backend name used in "not supported by" messages.
pub const BACKEND_NAME: &str = "OpenVikingMemoryManager";

/// Most payloads sent in one batch request.
pub const MAX_BATCH_MESSAGES: usize = 100;

/// Captures waiting for the background worker before new ones are dropped (the next turn's
/// full transcript resends whatever a dropped capture held).
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;

/// Capture counters, for health pages and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Captures queued or running now.
    pub in_flight: usize,
    /// Captures that finished without error.
    pub completed: u64,
    /// Captures that failed (whatever the write policy did with the error).
    pub failed: u64,
    /// Captures dropped because the queue was full.
    pub dropped: u64,
    /// The last failure's message.
    pub last_failure: Option<String>,
    /// When the last failure happened.
    pub last_failure_at: Option<Timestamp>,
    /// When the last capture succeeded.
    pub last_success_at: Option<Timestamp>,
}

/// What one capture achieved on the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureReport {
    /// Messages this capture sent that the server confirmed.
    pub sent: usize,
    /// Messages of an earlier batch that never got an answer which the server turned out to
    /// hold (they were not sent again).
    pub found_on_server: usize,
    /// Whether this capture's commit was accepted.
    pub committed: bool,
}

/// A queued capture.
#[derive(Debug)]
struct Job {
    session_id: String,
    peer: String,
    messages: Vec<Message>,
    trace_id: Option<String>,
    _guard: InFlightGuard,
}

/// A capture failure, and whether the write policy may swallow it.
#[derive(Debug)]
struct CaptureFailure {
    error: ManagerError,
    /// Cursor read and save failures always propagate, whatever the policy says.
    always_raise: bool,
}

impl CaptureFailure {
    fn policy(error: ManagerError) -> Self {
        Self {
            error,
            always_raise: false,
        }
    }

    fn always(error: ManagerError) -> Self {
        Self {
            error,
            always_raise: true,
        }
    }
}

/// What recording the pending messages achieved.
#[derive(Debug, Default)]
struct RecordOutcome {
    /// Leading input messages the server confirmed (all of them once the batches succeeded).
    consumed: usize,
    /// Payloads the server confirmed.
    sent: usize,
    /// The session's uncommitted message count after the confirmed batches, when known.
    uncommitted: Option<u64>,
    /// The batch that failed in a way that may still have stored it.
    in_doubt: Option<InDoubtBatch>,
    /// Every batch succeeded but the commit failed.
    commit_pending: bool,
    /// The commit was accepted.
    committed: bool,
    /// The failure, if any.
    error: Option<OpenVikingError>,
}

#[derive(Debug, Default)]
struct QueueState {
    sender: Option<mpsc::Sender<Job>>,
    started: bool,
    capacity: usize,
}

struct Inner {
    config: OpenVikingConfig,
    mode: MemoryMode,
    client: OpenVikingClient,
    cursors: CursorStore,
    locks: KeyedLocks,
    keep_hidden: parking_lot::RwLock<HiddenMessageFilter>,
    clock: Arc<dyn Clock>,
    closed: AtomicBool,
    active: Arc<InFlight>,
    queue: parking_lot::Mutex<QueueState>,
    deferred_error: parking_lot::Mutex<Option<ManagerError>>,
    stats: parking_lot::Mutex<CaptureStats>,
    last_failure: deermem_remote::FailureLog,
}

/// The OpenViking memory backend (`manager_class: openviking`, middleware mode only).
///
/// `Debug` shows the configuration without the API key.
#[derive(Clone)]
pub struct OpenVikingManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OpenVikingManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &self.inner;
        f.debug_struct("OpenVikingManager")
            .field("config", &inner.config)
            .field("mode", &inner.mode)
            .field("cursor_dir", &inner.cursors.dir())
            .field("closed", &inner.closed.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

fn config_error(e: ConfigError) -> ManagerError {
    ManagerError::invalid(InvalidInputCode::Other, e.to_string())
}

impl OpenVikingManager {
    /// Builds the manager. Sends no request and touches no file.
    ///
    /// The cursor files live under `{storage_root}/openviking/sessions/`. `storage_root` is the
    /// root the host resolved from `backend_config.storage_path` (the facade applies the CLI's
    /// `--storage-path`, `$DEER_FLOW_HOME` for relative paths and the data-directory defaults),
    /// so `config.storage_path` is not applied a second time.
    ///
    /// # Errors
    /// `mode: tool` (OpenViking memory is middleware-only), an invalid configuration, or an HTTP
    /// stack that cannot start.
    pub fn new(
        config: OpenVikingConfig,
        mode: MemoryMode,
        storage_root: PathBuf,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ManagerError> {
        Self::build(config, mode, storage_root, clock, None)
    }

    /// Parses `backend_config` (reading the key through `env`) and builds the manager; the
    /// facade's entry point. Configuration warnings are logged. The cursor root is
    /// `storage_root`, as for [`OpenVikingManager::new`].
    ///
    /// # Errors
    /// As [`OpenVikingConfig::from_backend_config`] and [`OpenVikingManager::new`].
    pub fn from_backend_config(
        backend_config: &Map<String, Value>,
        mode: MemoryMode,
        storage_root: PathBuf,
        clock: Arc<dyn Clock>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ManagerError> {
        Self::from_backend_config_with_cursors(backend_config, mode, storage_root, clock, env, None)
    }

    /// [`OpenVikingManager::from_backend_config`] with the cursors kept in `cursors` (the
    /// facade passes the PostgreSQL cursor store when the storage is postgres); `None` keeps
    /// them in files under `storage_root`.
    ///
    /// # Errors
    /// As [`OpenVikingManager::from_backend_config`].
    pub fn from_backend_config_with_cursors(
        backend_config: &Map<String, Value>,
        mode: MemoryMode,
        storage_root: PathBuf,
        clock: Arc<dyn Clock>,
        env: &dyn Fn(&str) -> Option<String>,
        cursors: Option<Arc<dyn CursorStorage>>,
    ) -> Result<Self, ManagerError> {
        if mode != MemoryMode::Middleware {
            return Err(tool_mode_error());
        }
        let (config, warnings) =
            OpenVikingConfig::from_backend_config(backend_config, env).map_err(config_error)?;
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Self::build(config, mode, storage_root, clock, cursors)
    }

    fn build(
        config: OpenVikingConfig,
        mode: MemoryMode,
        storage_root: PathBuf,
        clock: Arc<dyn Clock>,
        cursors: Option<Arc<dyn CursorStorage>>,
    ) -> Result<Self, ManagerError> {
        if mode != MemoryMode::Middleware {
            return Err(tool_mode_error());
        }
        config.validate().map_err(config_error)?;
        let client =
            OpenVikingClient::new(&config.base_url, config.api_key.clone(), config.timeout())?;
        let root = storage_root;
        Ok(Self {
            inner: Arc::new(Inner {
                cursors: match cursors {
                    Some(storage) => CursorStore::on(&root, storage),
                    None => CursorStore::new(&root),
                },
                config,
                mode,
                client,
                locks: KeyedLocks::default(),
                keep_hidden: parking_lot::RwLock::new(Arc::new(
                    deermem_core::message::is_human_input_response,
                )),
                clock,
                closed: AtomicBool::new(false),
                active: Arc::default(),
                queue: parking_lot::Mutex::new(QueueState {
                    capacity: DEFAULT_QUEUE_CAPACITY,
                    ..QueueState::default()
                }),
                deferred_error: parking_lot::Mutex::new(None),
                stats: parking_lot::Mutex::new(CaptureStats::default()),
                last_failure: deermem_remote::FailureLog::default(),
            }),
        })
    }

    /// Replaces the host hook that decides whether a `hide_from_ui` message is still captured
    /// (the default keeps only human-input clarification answers).
    pub fn set_hidden_message_filter(&self, filter: HiddenMessageFilter) {
        *self.inner.keep_hidden.write() = filter;
    }

    /// Sets how many captures may wait for the background worker (at least 1). Takes effect
    /// only before the first `add`.
    pub fn set_queue_capacity(&self, capacity: usize) {
        let mut q = self.inner.queue.lock();
        if !q.started {
            q.capacity = capacity.max(1);
        }
    }

    /// The parsed configuration.
    pub fn config(&self) -> &OpenVikingConfig {
        &self.inner.config
    }

    /// The directory holding the cursor files.
    pub fn cursor_dir(&self) -> &Path {
        self.inner.cursors.dir()
    }

    /// How many per-session locks are still referenced (they vanish once unused).
    pub fn live_session_locks(&self) -> usize {
        self.inner.locks.live()
    }

    /// Capture counters.
    pub fn stats(&self) -> CaptureStats {
        let mut s = self.inner.stats.lock().clone();
        s.in_flight = self.inner.active.count();
        s
    }

    /// The actor peer and session of a capture request, checking the owner first.
    ///
    /// # Errors
    /// A missing thread id, another user, or an invalid agent name.
    pub fn session_for(&self, request: &AddRequest) -> Result<(String, String), ManagerError> {
        if request.thread_id.is_empty() {
            return Err(ManagerError::invalid(
                InvalidInputCode::Other,
                "OpenViking memory write requires thread_id",
            ));
        }
        let (peer, _) = self.inner.resolve_scope(&request.scope)?;
        let sid = scope::session_id(&self.inner.config.owner_user_id, &peer, &request.thread_id);
        Ok((peer, sid))
    }

    /// Captures a conversation now, awaiting every request, and applies the write policy:
    /// `raise` returns the failure, `log_and_drop` logs it. Cursor read or save failures are
    /// always returned.
    ///
    /// # Errors
    /// Invalid scope, and capture failures as described.
    pub async fn capture(&self, request: AddRequest) -> Result<CaptureReport, ManagerError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            tracing::info!("OpenViking write ignored after backend shutdown");
            return Ok(CaptureReport::default());
        }
        let (peer, sid) = self.session_for(&request)?;
        let _guard = self.inner.active.enter();
        let mut report = CaptureReport::default();
        let result = self
            .inner
            .capture_session(&sid, &peer, request.messages, &mut report)
            .await;
        self.inner
            .finish_capture(&sid, result, request.trace_id.as_deref())
            .map(|()| report)
    }

    /// Captures a conversation now, awaiting every request, and returns what reached the
    /// server together with any failure, whatever the write policy says (for a command that
    /// must report a failed capture, like `deermem ingest`). The failure is counted and kept as
    /// the last backend failure, but not logged: the caller reports it.
    pub async fn capture_now(
        &self,
        request: AddRequest,
    ) -> (CaptureReport, Result<(), ManagerError>) {
        let mut report = CaptureReport::default();
        if self.inner.closed.load(Ordering::SeqCst) {
            tracing::info!("OpenViking write ignored after backend shutdown");
            return (report, Ok(()));
        }
        let (peer, sid) = match self.session_for(&request) {
            Ok(v) => v,
            Err(e) => return (report, Err(e)),
        };
        let _guard = self.inner.active.enter();
        let result = self
            .inner
            .capture_session(&sid, &peer, request.messages, &mut report)
            .await;
        let result = self.inner.count_capture(result).map_err(|f| f.error);
        (report, result)
    }

    /// Waits until every queued and running operation finished, without closing; true when
    /// that happened within `timeout`.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        self.inner.active.wait_idle(timeout).await
    }

    /// The startup probe: `GET /health`. Unhealthy under `startup_policy: fail_fast` is an
    /// error; under `warn` it is `Ok(false)`. A closed backend is `Ok(false)`.
    ///
    /// # Errors
    /// [`ManagerError::Unavailable`] for an unhealthy server under `fail_fast`.
    pub async fn startup_check(&self) -> Result<bool, ManagerError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let _guard = self.inner.active.enter();
        if self.inner.client.health().await {
            return Ok(true);
        }
        match self.inner.config.startup_policy {
            StartupPolicy::FailFast => Err(ManagerError::unavailable(
                "OpenViking health check returned an unhealthy response",
            )),
            StartupPolicy::Warn => {
                tracing::warn!(
                    base_url = %self.inner.client.base_url(),
                    "OpenViking health check returned an unhealthy response; continuing (startup_policy: warn)"
                );
                Ok(false)
            }
        }
    }

    /// The recalled memories of a search (no dedup, no total cap): a blank query or
    /// `top_k == 0` returns nothing before the owner check and without a request, a closed
    /// backend returns nothing; other `top_k` values are clamped to 1–100.
    ///
    /// # Errors
    /// Invalid scope; a `mode` other than `hybrid` (the server ranks itself); backend
    /// failures under `failure_policy.read: raise`.
    pub async fn search_memories(
        &self,
        request: SearchRequest,
    ) -> Result<Vec<RecalledMemory>, ManagerError> {
        deermem_remote::own_ranking_only(&request, "openviking")?;
        let query = deermem_pycompat::py::strip(&request.query);
        if query.is_empty() || request.top_k == 0 || self.inner.closed.load(Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        let (peer, uris) = self.inner.resolve_scope(&request.scope)?;
        let _guard = self.inner.active.enter();
        let memory_type = request
            .category
            .as_deref()
            .map(|c| deermem_pycompat::py::lower(deermem_pycompat::py::strip(c)))
            .filter(|c| !c.is_empty());
        if memory_type.as_deref().is_some_and(|t| t.contains('=')) {
            // No memory type contains `=`, and the server refuses such a tag.
            return Ok(Vec::new());
        }
        let retrieval = RetrievalRequest {
            query: query.to_owned(),
            target_uri: uris.to_vec(),
            session_id: None,
            limit: request.top_k.clamp(1, 100),
            score_threshold: self.inner.config.retrieval.score_threshold,
            filter: None,
            // The server stores a memory's type as the tag `memory_type=<type>`; a `category`
            // filter (the reference's) matches nothing.
            tags: memory_type
                .as_ref()
                .map(|t| vec![format!("{}{t}", recall::MEMORY_TYPE_TAG)]),
        };
        match self.inner.recall(&peer, &retrieval).await {
            Ok(mut memories) => {
                if let Some(t) = &memory_type {
                    // Also checked here, for a server that would ignore the tag.
                    memories.retain(|m| {
                        m.category
                            .as_deref()
                            .is_some_and(|c| deermem_pycompat::py::lower(c) == *t)
                    });
                }
                Ok(memories)
            }
            Err(e) => self.inner.read_failure("search", &e, Vec::new()),
        }
    }

    fn enqueue(&self, job: Job) -> Result<(), Job> {
        let mut q = self.inner.queue.lock();
        if !q.started {
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                return Err(job);
            };
            let (tx, rx) = mpsc::channel(q.capacity);
            handle.spawn(worker(Arc::downgrade(&self.inner), rx));
            q.sender = Some(tx);
            q.started = true;
        }
        let Some(tx) = q.sender.as_ref() else {
            tracing::info!("OpenViking write ignored after backend shutdown");
            return Ok(());
        };
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(job)) => {
                self.inner.stats.lock().dropped += 1;
                tracing::warn!(
                    session = %job.session_id,
                    "OpenViking capture queue is full; capture dropped (the next turn resends it)"
                );
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::info!("OpenViking write ignored after backend shutdown");
                Ok(())
            }
        }
    }

    fn close_queue(&self) {
        self.inner.queue.lock().sender = None;
    }
}

fn tool_mode_error() -> ManagerError {
    ManagerError::invalid(
        InvalidInputCode::Other,
        "The OpenViking memory backend supports only memory.mode: middleware; for tool-style access use OpenViking's MCP server",
    )
}

async fn worker(inner: Weak<Inner>, mut rx: mpsc::Receiver<Job>) {
    while let Some(mut job) = rx.recv().await {
        let Some(inner) = inner.upgrade() else {
            break;
        };
        if let Err(e) = inner.run(&mut job).await {
            // Reported by the next add (write policy `raise`, or a cursor failure).
            *inner.deferred_error.lock() = Some(e);
        }
        drop(job);
    }
}

impl Inner {
    /// Runs a queued capture (its messages taken out of `job`, whose in-flight guard the
    /// caller still holds) and applies the write policy to its result.
    async fn run(&self, job: &mut Job) -> Result<(), ManagerError> {
        let messages = std::mem::take(&mut job.messages);
        let result = self
            .capture_session(
                &job.session_id,
                &job.peer,
                messages,
                &mut CaptureReport::default(),
            )
            .await;
        self.finish_capture(&job.session_id, result, job.trace_id.as_deref())
    }

    /// The actor peer and target URIs of a scope, after the owner check.
    fn resolve_scope(&self, scope: &MemoryScope) -> Result<(String, [String; 2]), ManagerError> {
        scope::check_owner(&self.config.owner_user_id, scope.user.as_ref())?;
        let peer = scope::canonical_peer_id(
            scope.agent.as_ref().map(|a| a.as_str()),
            &self.config.default_peer_id,
        )?;
        let uris = scope::target_uris(&peer);
        Ok((peer, uris))
    }

    /// Keeps a failure as the last backend failure.
    fn note_failure(&self, operation: &str, message: String) {
        self.last_failure.note(operation, message, self.clock.now());
    }

    /// Records a capture result in the stats and, for a failure, as the last backend failure.
    fn count_capture(&self, result: Result<(), CaptureFailure>) -> Result<(), CaptureFailure> {
        let now = self.clock.now();
        match &result {
            Ok(()) => {
                let mut s = self.stats.lock();
                s.completed += 1;
                s.last_success_at = Some(now);
            }
            Err(failure) => {
                let message = failure.error.to_string();
                {
                    let mut s = self.stats.lock();
                    s.failed += 1;
                    s.last_failure = Some(message.clone());
                    s.last_failure_at = Some(now);
                }
                self.note_failure("capture", message);
            }
        }
        result
    }

    /// Records stats, logs, and applies the write policy to a capture result.
    fn finish_capture(
        &self,
        session_id: &str,
        result: Result<(), CaptureFailure>,
        trace_id: Option<&str>,
    ) -> Result<(), ManagerError> {
        match self.count_capture(result) {
            Ok(()) => Ok(()),
            Err(failure) => {
                tracing::error!(
                    session = session_id,
                    trace_id = trace_id.unwrap_or(""),
                    error = %failure.error,
                    "OpenViking capture failed"
                );
                if failure.always_raise
                    || self.config.failure_policy.write == FailurePolicy::FailClosed
                {
                    Err(failure.error)
                } else {
                    Ok(())
                }
            }
        }
    }

    async fn load_cursor(
        &self,
        session_id: &str,
        messages: Vec<Message>,
    ) -> Result<(CursorState, Vec<Message>, Vec<String>), CaptureFailure> {
        let state = self
            .cursors
            .load(session_id)
            .await
            .map_err(|e| CaptureFailure::always(cursor_error(e)))?;
        let keep = self.keep_hidden.read().clone();
        tokio::task::spawn_blocking(move || {
            let messages = convert::captureable(messages, &keep);
            let sigs: Vec<String> = messages.iter().map(convert::message_signature).collect();
            (state, messages, sigs)
        })
        .await
        .map_err(|e| {
            CaptureFailure::always(
                ManagerError::backend(format!(
                    "OpenViking cursor task failed (session={session_id}): {e}"
                ))
                .caused_by(e),
            )
        })
    }

    async fn save_cursor(
        &self,
        session_id: &str,
        state: CursorState,
    ) -> Result<(), CaptureFailure> {
        self.cursors
            .save(session_id, &state)
            .await
            .map_err(|e| CaptureFailure::always(cursor_error(e)))
    }

    /// The reference's capture algorithm, under the session lock: load the cursor, retry a
    /// pending commit, settle a batch left in doubt, find the messages not yet submitted,
    /// record them, and advance the cursor by what the server confirmed. `report` counts what
    /// reached the server, also when the capture fails part-way.
    async fn capture_session(
        &self,
        session_id: &str,
        peer: &str,
        messages: Vec<Message>,
        report: &mut CaptureReport,
    ) -> Result<(), CaptureFailure> {
        let lock = self.locks.get(session_id);
        let _held = lock.lock().await;
        let (mut state, messages, sigs) = self.load_cursor(session_id, messages).await?;
        let max_seen = self.config.max_seen_message_ids;

        if state.commit_pending {
            let retried = async {
                let info = self.client.session_info(session_id, peer).await?;
                if info.is_some_and(|i| i.pending_tokens > 0) {
                    self.client.commit(session_id, peer).await?;
                    return Ok::<_, OpenVikingError>((true, Some(0)));
                }
                Ok((false, info.map_or(Some(0), |i| i.message_count)))
            }
            .await;
            match retried {
                Ok((committed, uncommitted)) => {
                    report.committed |= committed;
                    state.commit_pending = false;
                    state.empty = false;
                    state.uncommitted_on_server = uncommitted;
                    self.save_cursor(session_id, state.clone()).await?;
                }
                Err(e) => {
                    return Err(CaptureFailure::policy(e.to_manager_error(&format!(
                        "OpenViking pending commit retry failed; preserving capture cursor (session={session_id})"
                    ))));
                }
            }
        }

        // A batch whose answer never came may be on the server: ask before sending it again.
        let mut needs_commit = false;
        if let Some(doubt) = state.in_doubt.clone() {
            let info = match self.client.session_info(session_id, peer).await {
                Ok(info) => info,
                Err(e) => {
                    return Err(CaptureFailure::policy(e.to_manager_error(&format!(
                        "OpenViking could not check whether an unanswered batch reached the server; preserving capture cursor (session={session_id})"
                    ))));
                }
            };
            let now = info.map_or(Some(0), |i| i.message_count);
            match (doubt.uncommitted_before, now) {
                (Some(before), Some(n)) if before.checked_add(doubt.payload_count) == Some(n) => {
                    tracing::info!(
                        session = session_id,
                        messages = doubt.payload_count,
                        "OpenViking stored a batch whose answer never came; not sending it again"
                    );
                    state = state.with_landed(&doubt, &sigs, max_seen);
                    report.found_on_server += usize::try_from(doubt.payload_count).unwrap_or(0);
                    needs_commit = true;
                }
                (Some(before), Some(n)) if n == before => state.in_doubt = None,
                _ => {
                    tracing::warn!(
                        session = session_id,
                        uncommitted_before = ?doubt.uncommitted_before,
                        uncommitted_now = ?now,
                        "OpenViking cannot tell whether an unanswered batch was stored; sending it again"
                    );
                    state.in_doubt = None;
                }
            }
            state.uncommitted_on_server = now;
            self.save_cursor(session_id, state.clone()).await?;
        }

        let start = state.matching_prefix_count(&sigs);
        let pending_idx: Vec<usize> = match start {
            Some(s) => (s..messages.len()).collect(),
            None => {
                let seen: std::collections::HashSet<&str> = state
                    .submitted_signatures
                    .iter()
                    .map(String::as_str)
                    .collect();
                (0..messages.len())
                    .filter(|i| !seen.contains(sigs[*i].as_str()))
                    .collect()
            }
        };
        if pending_idx.is_empty() {
            let mut next = state.advanced(Some(&sigs), &[], max_seen, false);
            if needs_commit {
                if let Err(e) = self.client.commit(session_id, peer).await {
                    next.commit_pending = true;
                    next.uncommitted_on_server = None;
                    self.save_cursor(session_id, next).await?;
                    return Err(CaptureFailure::policy(e.to_manager_error(&format!(
                        "OpenViking commit failed; it is retried by the next capture (session={session_id})"
                    ))));
                }
                report.committed = true;
                next.uncommitted_on_server = Some(0);
            }
            return self.save_cursor(session_id, next).await;
        }
        let pending_sigs: Vec<String> = pending_idx.iter().map(|i| sigs[*i].clone()).collect();
        let pending: Vec<Message> = pending_idx.iter().map(|i| messages[*i].clone()).collect();
        drop(messages);

        let outcome = self
            .record(
                session_id,
                peer,
                &pending,
                &pending_sigs,
                state.uncommitted_on_server,
            )
            .await;
        report.sent += outcome.sent;
        report.committed |= outcome.committed;
        let Some(error) = outcome.error else {
            let mut next = state.advanced(Some(&sigs), &pending_sigs, max_seen, false);
            next.uncommitted_on_server = Some(0);
            return self.save_cursor(session_id, next).await;
        };
        let consumed = outcome.consumed.min(pending_sigs.len());
        if consumed > 0 || outcome.commit_pending || outcome.in_doubt.is_some() {
            let prefix = start.map(|s| &sigs[..(s + consumed).min(sigs.len())]);
            let mut next = state.advanced(
                prefix,
                &pending_sigs[..consumed],
                max_seen,
                outcome.commit_pending,
            );
            next.in_doubt = outcome.in_doubt.clone();
            next.uncommitted_on_server = outcome.uncommitted;
            self.save_cursor(session_id, next).await?;
        }
        let doubt_note = if outcome.in_doubt.is_some() {
            "; the server may have stored the last batch, which the next capture checks before sending it again"
        } else {
            ""
        };
        let context = if consumed == 0 && !outcome.commit_pending {
            format!(
                "OpenViking recording failed; capture cursor was not advanced{doubt_note} (session={session_id})"
            )
        } else {
            format!(
                "OpenViking partially recorded {consumed} of {} messages; confirmed progress was preserved{doubt_note} (session={session_id})",
                pending_sigs.len()
            )
        };
        Err(CaptureFailure::policy(error.to_manager_error(&context)))
    }

    /// Sends the pending messages in batches of at most 100 and commits after the last one.
    /// `uncommitted` is the session's uncommitted message count before the first batch, when
    /// known; a batch that fails in a way that may still have stored it is returned as in doubt,
    /// with the count it would start from.
    async fn record(
        &self,
        session_id: &str,
        peer: &str,
        pending: &[Message],
        pending_sigs: &[String],
        uncommitted: Option<u64>,
    ) -> RecordOutcome {
        let payloads = convert::to_payloads(pending, peer);
        let mut out = RecordOutcome {
            uncommitted,
            ..RecordOutcome::default()
        };
        if payloads.is_empty() {
            out.consumed = pending.len();
            return out;
        }
        for chunk in payloads.chunks(MAX_BATCH_MESSAGES) {
            let batch: Vec<Value> = chunk.iter().map(|(_, p)| p.clone()).collect();
            let last = chunk.last().map_or(out.consumed, |(i, _)| *i);
            match self.client.add_messages(session_id, peer, &batch).await {
                Ok(count) => {
                    out.consumed = last + 1;
                    out.sent += chunk.len();
                    out.uncommitted = count.or_else(|| {
                        out.uncommitted
                            .map(|u| u.saturating_add(chunk.len() as u64))
                    });
                }
                Err(error) => {
                    if error.may_have_been_applied() {
                        let end = (last + 1).min(pending_sigs.len());
                        out.in_doubt = Some(InDoubtBatch {
                            signatures: pending_sigs[out.consumed.min(end)..end].to_vec(),
                            payload_count: chunk.len() as u64,
                            uncommitted_before: out.uncommitted,
                        });
                        out.uncommitted = None;
                    }
                    out.error = Some(error);
                    return out;
                }
            }
        }
        out.consumed = pending.len();
        match self.client.commit(session_id, peer).await {
            Ok(()) => {
                out.committed = true;
                out.uncommitted = Some(0);
            }
            Err(error) => {
                out.commit_pending = true;
                out.uncommitted = None;
                out.error = Some(error);
            }
        }
        out
    }

    /// Runs a retrieval and picks each memory's text by `content_mode`.
    async fn recall(
        &self,
        peer: &str,
        request: &RetrievalRequest,
    ) -> Result<Vec<RecalledMemory>, OpenVikingError> {
        let result = self.client.retrieve(peer, request).await?;
        let max = self.config.retrieval.max_injection_chars;
        let mode = self.config.retrieval.content_mode;
        let mut out = Vec::new();
        for hit in recall::memory_hits(&result) {
            let mut read = None;
            if recall::wants_read(&hit, mode)
                && let Some(uri) = recall::hit_uri(&hit)
            {
                match self.client.read_content(peer, uri).await {
                    Ok(Value::String(text)) if !text.is_empty() => {
                        read = Some(Value::String(recall::strip_front_matter(&text).to_owned()));
                    }
                    Ok(v) if deermem_pycompat::py::truthy(&v) && !v.is_string() => read = Some(v),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(uri, error = %e, "OpenViking content read failed; using the summary");
                    }
                }
            }
            let content = recall::stringify(
                read.as_ref()
                    .or_else(|| recall::summary_content(&hit, mode)),
                max,
            );
            out.push(recall::to_memory(&hit, content));
        }
        Ok(out)
    }

    fn read_failure<T>(
        &self,
        op: &str,
        e: &OpenVikingError,
        fallback: T,
    ) -> Result<T, ManagerError> {
        let error = e.to_manager_error(&format!("OpenViking {op} failed"));
        self.note_failure(op, error.to_string());
        self.config.failure_policy.read.apply(
            fallback,
            || tracing::warn!(target: FAIL_OPEN_LOG_TARGET, error = %e, "OpenViking {op} failed; returning no memory (failure_policy.read: fail_open)"),
            || error,
        )
    }
}

fn cursor_error(e: CursorError) -> ManagerError {
    match e {
        CursorError::Save { .. } => ManagerError::storage(e.to_string()).caused_by(e),
        other => ManagerError::corruption(other.to_string()).caused_by(other),
    }
}

#[async_trait]
impl MemoryManager for OpenVikingManager {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    /// Tool mode needs fact-level tools OpenViking does not have; the host refuses it.
    fn allows_tool_mode(&self) -> bool {
        false
    }

    fn mode(&self) -> MemoryMode {
        self.inner.mode
    }

    /// Checks the scope (owner first, before any file or network access) and queues the
    /// capture; returns at once. Under `failure_policy.write: raise`, a failure of an earlier
    /// queued capture is returned here (the new capture is still queued).
    async fn add(&self, request: AddRequest) -> Result<(), ManagerError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            tracing::info!("OpenViking write ignored after backend shutdown");
            return Ok(());
        }
        let (peer, session_id) = self.session_for(&request)?;
        let job = Job {
            session_id,
            peer,
            messages: request.messages,
            trace_id: request.trace_id,
            _guard: self.inner.active.enter(),
        };
        if let Err(mut job) = self.enqueue(job) {
            // No tokio runtime to run a background task on: capture inline instead.
            return self.inner.run(&mut job).await;
        }
        match self.inner.deferred_error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn get_context(&self, request: ContextRequest) -> Result<String, ManagerError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Ok(String::new());
        }
        let (peer, uris) = self.inner.resolve_scope(&request.scope)?;
        let _guard = self.inner.active.enter();
        let session_id = request
            .thread_id
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| scope::session_id(&self.inner.config.owner_user_id, &peer, t));
        let r = &self.inner.config.retrieval;
        let retrieval = RetrievalRequest {
            query: r.injection_query.clone(),
            target_uri: uris.to_vec(),
            session_id,
            limit: r.top_k,
            score_threshold: r.score_threshold,
            filter: None,
            tags: None,
        };
        match self.inner.recall(&peer, &retrieval).await {
            Ok(memories) => Ok(recall::format_context(&memories, r.max_injection_chars)),
            Err(e) => self.inner.read_failure("recall", &e, String::new()),
        }
    }

    fn searcher(&self) -> Option<&dyn MemorySearch> {
        Some(self)
    }

    /// Closes the backend to new work, then waits up to `timeout` for queued and running
    /// operations. True when everything drained in time, also when a capture failed: a failure
    /// is not a timeout, and it was already logged and kept as the last backend failure. A
    /// later call returns true once drained.
    async fn shutdown_flush(&self, timeout: Duration) -> bool {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.close_queue();
        if !self.inner.active.wait_idle(timeout).await {
            tracing::warn!(
                in_flight = self.inner.active.count(),
                "OpenViking shutdown flush timed out; captures still running"
            );
            return false;
        }
        true
    }

    fn last_backend_failure(&self) -> Option<BackendFailure> {
        self.inner.last_failure.last()
    }

    /// `Some(true)` when `/health` is healthy, `Some(false)` otherwise (and after close). Under
    /// `startup_policy: fail_fast` an unhealthy server is logged as an error; hosts that must
    /// refuse to start call [`OpenVikingManager::startup_check`].
    async fn warm(&self) -> Option<bool> {
        Some(self.startup_check().await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "OpenViking startup check failed (startup_policy: fail_fast)");
            false
        }))
    }

    /// Stops accepting work. Captures already queued still drain in the background.
    async fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.close_queue();
    }
}

#[async_trait]
impl MemorySearch for OpenVikingManager {
    async fn search(&self, request: SearchRequest) -> Result<Vec<PublicFact>, ManagerError> {
        let memories = self.search_memories(request).await?;
        Ok(memories.into_iter().map(to_public_fact).collect())
    }

    async fn search_scored(&self, request: SearchRequest) -> Result<Vec<ScoredFact>, ManagerError> {
        let memories = self.search_memories(request).await?;
        Ok(memories
            .into_iter()
            .map(|m| {
                let score = m.score;
                ScoredFact {
                    fact: to_public_fact(m),
                    score,
                    match_type: MatchType::Remote,
                }
            })
            .collect())
    }
}

fn to_public_fact(m: RecalledMemory) -> PublicFact {
    remote_fact(RemoteHit {
        id: m.uri.clone(),
        content: m.content,
        category: m.category.unwrap_or_else(|| "memory".to_owned()),
        confidence: m.score.unwrap_or(0.0),
        created_at: String::new(),
        source: m.uri,
    })
}
