//! `HonchoManager`: the `MemoryManager` over Honcho. Captures are queued to one background
//! task per manager that sends only the messages the per-thread cursor has not seen, in
//! batches of at most 100; reads go straight to Honcho under the configured failure policy.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::config::MemoryMode;
use deermem_core::document::{PublicMemoryDocument, SummaryEntry};
use deermem_core::error::{InvalidInputCode, ManagerError};
use deermem_core::fact::PublicFact;
use deermem_core::ports::{
    AddRequest, BackendFailure, Clock, ContextRequest, MemoryManager, MemoryReader, MemoryScope,
    MemorySearch, ScoredFact, SearchRequest,
};
use deermem_core::search::MatchType;
use deermem_core::{ConfigError, Timestamp};
use deermem_pycompat::py;
use deermem_remote::retry::{self, RetryPolicy};
use deermem_remote::{InFlight, InFlightGuard, RemoteHit, remote_fact};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::capture::{Captured, MAX_BATCH, Side, capture};
use crate::client::{HonchoClient, HonchoError, encode_segment};
use crate::config::HonchoConfig;
use crate::cursor::{CursorState, CursorStore, plan};
use crate::identity::{Identity, session_id};
use deermem_core::ports::CursorStorage;

/// The backend name used in "not supported by" messages.
pub const BACKEND_NAME: &str = "HonchoMemoryManager";

/// How many captures may wait for the background task before new ones are dropped (the
/// cursor makes the next turn resend what a dropped capture held).
const QUEUE_CAPACITY: usize = 256;
/// Retries per write request for retryable failures (three attempts in all).
const WRITE_RETRIES: u32 = 2;
/// Write retries wait about 200 ms, doubling, with jitter; a server's `Retry-After` is honoured
/// up to 5 s.
const WRITE_RETRY: RetryPolicy = RetryPolicy {
    base_delay: Duration::from_millis(200),
    max_delay: Duration::from_secs(200),
    retry_after_cap: Duration::from_secs(5),
};
/// `max_conclusions` of the representation request (the reference's value).
const MAX_CONCLUSIONS: u64 = 25;
/// Honcho's largest search `limit`.
const MAX_SEARCH_LIMIT: usize = 100;

/// One queued capture: what to send and where.
#[derive(Debug)]
struct Job {
    identity: Identity,
    session: String,
    captured: Vec<Captured>,
    trace_id: Option<String>,
    /// Counts the capture as pending until it is processed or dropped.
    _pending: InFlightGuard,
}

/// State shared with the background task.
struct Inner {
    config: HonchoConfig,
    client: HonchoClient,
    cursors: CursorStore,
    clock: Arc<dyn Clock>,
    /// Captures queued or being processed.
    pending: Arc<InFlight>,
    /// The last failure reaching the server (`last_backend_failure`).
    failures: deermem_remote::FailureLog,
}

/// The Honcho memory backend (`manager_class: honcho`).
///
/// `Debug` never shows the API key.
pub struct HonchoManager {
    inner: Arc<Inner>,
    mode: MemoryMode,
    storage_root: PathBuf,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    closed: AtomicBool,
}

impl fmt::Debug for HonchoManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HonchoManager")
            .field("config", &self.inner.config)
            .field("client", &self.inner.client)
            .field("mode", &self.mode)
            .field("storage_root", &self.storage_root)
            .field("pending", &self.inner.pending.count())
            .finish_non_exhaustive()
    }
}

fn config_error(e: &ConfigError) -> ManagerError {
    ManagerError::invalid(InvalidInputCode::Other, e.to_string())
}

/// Builds the backend from its raw `backend_config` (the facade's entry point). Warnings
/// (unknown keys, ids Honcho will reject) are logged.
///
/// # Errors
/// [`ManagerError::InvalidInput`] naming the bad `memory.backend_config.<key>`, or
/// [`ManagerError::Backend`] when the HTTP client cannot be built.
pub fn from_backend_config(
    backend_config: &Map<String, Value>,
    mode: MemoryMode,
    storage_root: PathBuf,
    clock: Arc<dyn Clock>,
) -> Result<HonchoManager, ManagerError> {
    from_backend_config_with_cursors(backend_config, mode, storage_root, clock, None)
}

/// [`from_backend_config`] with the cursors kept in `cursors` (the facade passes the
/// PostgreSQL cursor store when the storage is postgres); `None` keeps them in files under
/// `storage_root`.
///
/// # Errors
/// As [`from_backend_config`].
pub fn from_backend_config_with_cursors(
    backend_config: &Map<String, Value>,
    mode: MemoryMode,
    storage_root: PathBuf,
    clock: Arc<dyn Clock>,
    cursors: Option<Arc<dyn CursorStorage>>,
) -> Result<HonchoManager, ManagerError> {
    let (config, warnings) =
        HonchoConfig::from_backend_config(backend_config).map_err(|e| config_error(&e))?;
    for w in &warnings {
        tracing::warn!(warning = %w, "honcho backend configuration");
    }
    HonchoManager::with_cursors(config, mode, storage_root, clock, cursors)
}

/// `YYYY-MM-DDTHH:MM:SSZ` (the reference's `get_memory` timestamps have no fraction).
fn iso_seconds(t: Timestamp) -> String {
    let (y, mo, d, h, mi, s, _) = t.to_civil();
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl HonchoManager {
    /// Builds the backend. Both modes are accepted (tool mode keeps passive writes). Cursor
    /// files live under `{storage_root}/honcho/cursors/`. No request is sent here.
    ///
    /// # Errors
    /// [`ManagerError::InvalidInput`] for a configuration that fails
    /// [`HonchoConfig::validate`]; [`ManagerError::Backend`] when the HTTP client cannot be
    /// built.
    pub fn new(
        config: HonchoConfig,
        mode: MemoryMode,
        storage_root: PathBuf,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ManagerError> {
        Self::with_cursors(config, mode, storage_root, clock, None)
    }

    /// [`HonchoManager::new`] with the cursors kept in `cursors` (`None`: files under
    /// `{storage_root}/honcho/cursors/`).
    ///
    /// # Errors
    /// As [`HonchoManager::new`].
    pub fn with_cursors(
        config: HonchoConfig,
        mode: MemoryMode,
        storage_root: PathBuf,
        clock: Arc<dyn Clock>,
        cursors: Option<Arc<dyn CursorStorage>>,
    ) -> Result<Self, ManagerError> {
        config.validate().map_err(|e| config_error(&e))?;
        let client = HonchoClient::new(&config)?;
        let cursors = match cursors {
            Some(storage) => CursorStore::on(storage),
            None => CursorStore::new(&storage_root),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                cursors,
                config,
                client,
                clock,
                pending: Arc::default(),
                failures: deermem_remote::FailureLog::default(),
            }),
            mode,
            storage_root,
            sender: Mutex::new(None),
            closed: AtomicBool::new(false),
        })
    }

    /// The parsed configuration.
    pub fn config(&self) -> &HonchoConfig {
        &self.inner.config
    }

    /// The storage root cursors live under.
    pub fn storage_root(&self) -> &Path {
        &self.storage_root
    }

    /// Captures queued or in flight.
    pub fn pending_captures(&self) -> usize {
        self.inner.pending.count()
    }

    fn identity(&self, scope: &MemoryScope) -> Option<Identity> {
        Identity::resolve(&self.inner.config, scope.user.as_ref().map(|u| u.as_str()))
    }

    /// The queue, starting the background task on first use.
    fn sender(&self) -> Result<mpsc::Sender<Job>, &'static str> {
        let mut guard = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if self.closed.load(Ordering::SeqCst) {
            return Err("the backend is closed");
        }
        if let Some(tx) = guard.as_ref() {
            return Ok(tx.clone());
        }
        let handle =
            tokio::runtime::Handle::try_current().map_err(|_| "no tokio runtime is running")?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        handle.spawn(run_worker(Arc::clone(&self.inner), rx));
        *guard = Some(tx.clone());
        Ok(tx)
    }

    fn read_failed<T>(
        &self,
        operation: &str,
        e: &HonchoError,
        fallback: T,
    ) -> Result<T, ManagerError> {
        let kind = if operation == "search" {
            "search"
        } else {
            "recall"
        };
        self.inner.note_failure(kind, e);
        self.inner.config.read_policy.apply(
            fallback,
            || tracing::warn!(operation, error = %e, "honcho memory recall failed; returning empty (fail_open)"),
            || {
                let message = format!("honcho memory recall failed: {e}");
                if e.is_timeout() {
                    ManagerError::timeout(message).caused_by(e.clone())
                } else {
                    ManagerError::unavailable(message).caused_by(e.clone())
                }
            },
        )
    }
}

impl Inner {
    /// Keeps a failure reaching the server as the last backend failure.
    fn note_failure(&self, operation: &str, e: &HonchoError) {
        self.failures
            .note(operation, e.to_string(), self.clock.now());
    }

    /// A write with bounded retries for retryable failures.
    async fn write(&self, segments: &[&str], body: &Value) -> Result<Option<Value>, HonchoError> {
        let mut attempt = 0;
        let client = &self.client;
        retry::retry(
            WRITE_RETRY,
            WRITE_RETRIES,
            retry::tokio_sleeper(),
            move || client.post(segments, body),
            |e: &HonchoError| e.is_retryable().then(|| e.retry_after()),
            |e, delay| {
                attempt += 1;
                tracing::debug!(error = %e, attempt, delay_ms = millis(delay), "honcho write failed; retrying");
            },
        )
        .await
    }

    /// Get-or-creates the peers and the session and adds the peers to the session.
    async fn setup(&self, id: &Identity, session: &str) -> Result<(), HonchoError> {
        let w = encode_segment(&id.workspace, "workspace")?;
        let s = encode_segment(session, "session")?;
        self.write(&["workspaces", &w, "peers"], &json!({"id": id.user_peer}))
            .await?;
        if id.assistant_peer != id.user_peer {
            self.write(
                &["workspaces", &w, "peers"],
                &json!({"id": id.assistant_peer}),
            )
            .await?;
        }
        self.write(&["workspaces", &w, "sessions"], &json!({"id": session}))
            .await?;
        let peers = json!({ id.user_peer.as_str(): {}, id.assistant_peer.as_str(): {} });
        self.write(&["workspaces", &w, "sessions", &s, "peers"], &peers)
            .await?;
        Ok(())
    }

    /// Saves the cursor; a failure is logged (the cursor on file stays behind, so the next
    /// capture resends what it does not cover).
    async fn save_cursor(&self, state: &CursorState) {
        if let Err(e) = self.cursors.save(state).await {
            tracing::error!(error = %e, "honcho capture cursor could not be saved");
        }
    }

    /// Sends what the cursor has not seen. Failures are logged; the cursor only moves past
    /// batches Honcho accepted (or rejected as invalid, which are skipped).
    async fn process(&self, job: Job) {
        let Job {
            identity,
            session,
            captured,
            trace_id,
            _pending,
        } = job;
        let trace = trace_id.as_deref().unwrap_or("");
        let mut state = match self.cursors.load(&identity.workspace, &session).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(workspace = %identity.workspace, session = %session, trace_id = trace, error = %e, "honcho capture skipped");
                return;
            }
        };
        let sigs: Vec<String> = captured.iter().map(|c| c.signature.clone()).collect();
        let plan = plan(&state, &sigs);
        if plan.pending.is_empty() {
            if plan.start.is_none() {
                // A rewritten transcript whose messages were all sent: remember it as the
                // new prefix so the next turn takes the append-only path again.
                state.accept(&[], Some(&sigs));
                self.save_cursor(&state).await;
            }
            tracing::debug!(workspace = %identity.workspace, session = %session, "honcho capture: nothing new");
            return;
        }
        let peers = if identity.user_peer == identity.assistant_peer {
            vec![identity.user_peer.clone()]
        } else {
            vec![identity.user_peer.clone(), identity.assistant_peer.clone()]
        };
        if state.session_peers.as_ref() != Some(&peers) {
            if let Err(e) = self.setup(&identity, &session).await {
                self.note_failure("capture", &e);
                tracing::warn!(workspace = %identity.workspace, session = %session, trace_id = trace, error = %e, pending = plan.pending.len(), "honcho capture dropped; the messages are resent on the next turn");
                return;
            }
            state.session_peers = Some(peers.clone());
            self.save_cursor(&state).await;
        }
        let Ok(w) = encode_segment(&identity.workspace, "workspace") else {
            return;
        };
        let Ok(s) = encode_segment(&session, "session") else {
            return;
        };
        let segments = ["workspaces", w.as_str(), "sessions", s.as_str(), "messages"];
        let batches: Vec<&[usize]> = plan.pending.chunks(MAX_BATCH).collect();
        let total = plan.pending.len();
        let mut sent = 0usize;
        for (n, batch) in batches.iter().enumerate() {
            let messages: Vec<Value> = batch
                .iter()
                .map(|&i| {
                    let c = &captured[i];
                    let peer = match c.side {
                        Side::User => &identity.user_peer,
                        Side::Assistant => &identity.assistant_peer,
                    };
                    json!({"peer_id": peer, "content": c.content})
                })
                .collect();
            let body = json!({ "messages": messages });
            let mut result = self.write(&segments, &body).await;
            if matches!(&result, Err(e) if e.status() == Some(404)) {
                // The session or workspace vanished on the server: set it up again once.
                tracing::warn!(workspace = %identity.workspace, session = %session, "honcho session not found; setting it up again");
                state.session_peers = None;
                result = match self.setup(&identity, &session).await {
                    Ok(()) => {
                        state.session_peers = Some(peers.clone());
                        self.write(&segments, &body).await
                    }
                    Err(e) => Err(e),
                };
            }
            match result {
                Ok(_) => {}
                Err(e) if matches!(e.status(), Some(413 | 422)) => {
                    self.note_failure("capture", &e);
                    tracing::error!(workspace = %identity.workspace, session = %session, trace_id = trace, error = %e, skipped = batch.len(), "honcho rejected a message batch as invalid; skipping it so later messages are not blocked");
                }
                Err(e) => {
                    self.note_failure("capture", &e);
                    tracing::warn!(workspace = %identity.workspace, session = %session, trace_id = trace, error = %e, sent, unsent = total - sent, "honcho capture failed; unsent messages are resent on the next turn");
                    self.save_cursor(&state).await;
                    return;
                }
            }
            let accepted: Vec<String> = batch.iter().map(|&i| sigs[i].clone()).collect();
            let last = n + 1 == batches.len();
            let prefix_end = match plan.start {
                Some(_) => batch.last().map(|&i| i + 1),
                None if last => Some(sigs.len()),
                None => None,
            };
            state.accept(&accepted, prefix_end.map(|end| &sigs[..end]));
            sent += batch.len();
            if let Err(e) = self.cursors.save(&state).await {
                tracing::error!(workspace = %identity.workspace, session = %session, error = %e, "honcho capture cursor could not be saved; stopping this capture");
                return;
            }
        }
        tracing::info!(workspace = %identity.workspace, session = %session, trace_id = trace, sent, batches = batches.len(), "honcho capture sent");
    }

    /// The user's representation, stripped and cut to the injection budget.
    async fn representation(&self, id: &Identity) -> Result<String, HonchoError> {
        let w = encode_segment(&id.workspace, "workspace")?;
        let u = encode_segment(&id.user_peer, "user peer")?;
        let v = self
            .client
            .post(
                &["workspaces", &w, "peers", &u, "representation"],
                &json!({"max_conclusions": MAX_CONCLUSIONS}),
            )
            .await?;
        let text = match v {
            Some(Value::Object(m)) => match m.get("representation") {
                Some(Value::String(s)) => s.clone(),
                Some(other) if py::truthy(other) => {
                    py::py_str(other).unwrap_or_else(|| other.to_string())
                }
                _ => String::new(),
            },
            _ => String::new(),
        };
        Ok(py::prefix_chars(py::strip(&text), self.config.max_injection_chars).to_owned())
    }
}

async fn run_worker(inner: Arc<Inner>, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.recv().await {
        inner.process(job).await;
    }
}

fn search_hit(item: &Map<String, Value>, category: &str) -> PublicFact {
    let text = |k: &str| match item.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => py::py_str(other).unwrap_or_else(|| other.to_string()),
    };
    let session = text("session_id");
    remote_fact(RemoteHit {
        id: text("id"),
        content: text("content"),
        category: category.to_owned(),
        confidence: 0.5,
        created_at: text("created_at"),
        source: if session.is_empty() {
            "unknown".to_owned()
        } else {
            session
        },
    })
}

#[async_trait]
impl MemoryManager for HonchoManager {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    fn passive_writes_in_tool_mode(&self) -> bool {
        true
    }

    fn mode(&self) -> MemoryMode {
        self.mode
    }

    async fn add(&self, request: AddRequest) -> Result<(), ManagerError> {
        let Some(identity) = self.identity(&request.scope) else {
            tracing::debug!("honcho capture skipped: no user (fails closed to no memory)");
            return Ok(());
        };
        let captured = capture(
            &request.messages,
            self.inner.config.effective_message_chars(),
        );
        if captured.is_empty() {
            return Ok(());
        }
        let truncated = captured.iter().filter(|c| c.truncated).count();
        if truncated > 0 {
            tracing::debug!(
                truncated,
                limit = self.inner.config.effective_message_chars(),
                "honcho capture: long messages cut to the character limit"
            );
        }
        let job = Job {
            identity,
            session: session_id(&request.thread_id),
            captured,
            trace_id: request.trace_id,
            _pending: self.inner.pending.enter(),
        };
        let tx = match self.sender() {
            Ok(tx) => tx,
            Err(why) => {
                tracing::warn!(reason = why, "honcho capture ignored");
                return Ok(());
            }
        };
        if let Err(e) = tx.try_send(job) {
            let reason = match e {
                mpsc::error::TrySendError::Full(_) => "queue full",
                mpsc::error::TrySendError::Closed(_) => "worker stopped",
            };
            tracing::warn!(
                reason,
                "honcho capture dropped; the cursor resends its messages on the next turn"
            );
        }
        Ok(())
    }

    async fn get_context(&self, request: ContextRequest) -> Result<String, ManagerError> {
        let Some(id) = self.identity(&request.scope) else {
            return Ok(String::new());
        };
        match self.inner.representation(&id).await {
            Ok(text) => Ok(text),
            Err(e) => self.read_failed("get_context", &e, String::new()),
        }
    }

    fn last_backend_failure(&self) -> Option<BackendFailure> {
        self.inner.failures.last()
    }

    fn searcher(&self) -> Option<&dyn MemorySearch> {
        Some(self)
    }

    fn reader(&self) -> Option<&dyn MemoryReader> {
        Some(self)
    }

    async fn shutdown_flush(&self, timeout: Duration) -> bool {
        if self.inner.pending.wait_idle(timeout).await {
            return true;
        }
        tracing::warn!(
            pending = self.inner.pending.count(),
            timeout_ms = millis(timeout),
            "honcho shutdown flush timed out"
        );
        false
    }

    async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let tx = self
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // Dropping the sender lets the task finish what is queued, then stop.
        drop(tx);
    }
}

/// Honcho's search answers facts without scores: each is a remote match.
#[async_trait]
impl MemorySearch for HonchoManager {
    async fn search_scored(&self, request: SearchRequest) -> Result<Vec<ScoredFact>, ManagerError> {
        Ok(MemorySearch::search(self, request)
            .await?
            .into_iter()
            .map(|fact| ScoredFact {
                fact,
                score: None,
                match_type: MatchType::Remote,
            })
            .collect())
    }

    async fn search(&self, request: SearchRequest) -> Result<Vec<PublicFact>, ManagerError> {
        deermem_remote::own_ranking_only(&request, "honcho")?;
        let Some(id) = self.identity(&request.scope) else {
            return Ok(Vec::new());
        };
        if request.top_k == 0 || py::strip(&request.query).is_empty() {
            return Ok(Vec::new());
        }
        let limit = request.top_k.min(MAX_SEARCH_LIMIT);
        let w = match encode_segment(&id.workspace, "workspace") {
            Ok(w) => w,
            Err(e) => return self.read_failed("search", &e, Vec::new()),
        };
        let result = self
            .inner
            .client
            .post(
                &["workspaces", &w, "search"],
                &json!({"query": request.query, "limit": limit}),
            )
            .await;
        let category = request.category.as_deref().unwrap_or("memory");
        match result {
            Ok(Some(Value::Array(items))) => Ok(items
                .iter()
                .filter_map(Value::as_object)
                .map(|m| search_hit(m, category))
                .take(limit)
                .collect()),
            Ok(_) => Ok(Vec::new()),
            Err(e) => self.read_failed("search", &e, Vec::new()),
        }
    }
}

/// The document holds the peer representation as its work context; Honcho does not export.
#[async_trait]
impl MemoryReader for HonchoManager {
    async fn get_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        let now = iso_seconds(self.inner.clock.now());
        let mut doc = PublicMemoryDocument::empty();
        doc.last_updated = now.clone();
        let Some(id) = self.identity(&scope) else {
            return Ok(doc);
        };
        match self.inner.representation(&id).await {
            Ok(summary) => {
                doc.user.work_context = SummaryEntry {
                    summary,
                    updated_at: now,
                };
                Ok(doc)
            }
            Err(e) => self.read_failed("get_memory", &e, doc),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_seconds_drops_fractions() {
        let t = Timestamp::parse_iso("2026-03-04T05:06:07.123456Z").unwrap();
        assert_eq!(iso_seconds(t), "2026-03-04T05:06:07Z");
    }

    #[test]
    fn search_hits_map_to_public_facts() {
        let item = json!({"id": "m1", "content": "likes tea", "session_id": "df-x", "peer_id": "p", "created_at": "2026-01-01T00:00:00Z"});
        let f = search_hit(item.as_object().unwrap(), "memory");
        assert_eq!(
            (
                f.id.as_str(),
                f.content.as_str(),
                f.category.as_str(),
                f.source.as_str(),
                f.created_at.as_str()
            ),
            ("m1", "likes tea", "memory", "df-x", "2026-01-01T00:00:00Z")
        );
        let bare = search_hit(json!({}).as_object().unwrap(), "preference");
        assert_eq!(
            (
                bare.content.as_str(),
                bare.source.as_str(),
                bare.category.as_str()
            ),
            ("", "unknown", "preference")
        );
    }

    #[test]
    fn write_backoff_is_bounded() {
        for attempt in 0..4 {
            let d = WRITE_RETRY.delay(attempt, None);
            assert!(d <= Duration::from_millis(200) * 2u32.pow(attempt));
            assert!(d >= Duration::from_millis(200) * 2u32.pow(attempt) / 2);
        }
        assert_eq!(
            WRITE_RETRY.delay(0, Some(Duration::from_secs(600))),
            Duration::from_secs(5)
        );
    }
}
