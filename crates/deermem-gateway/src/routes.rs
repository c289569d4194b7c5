//! The `/api/memory*` handlers: the DeerFlow-compatible routes (the reference router's paths,
//! shapes, status codes and error details) and the extensions (agent selection, conversation
//! turns, context block, search, index rebuild).
//! Handlers validate input, call the `MemoryManager` port on a spawned task (so a timed-out
//! request never cancels a write half-way) and answer in the public shapes.

use deermem_core::ports::MemoryManagerExt as _;
use std::future::Future;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use deermem::shown_backend_config;
use deermem_core::ports::{
    AddRequest, ContextRequest, FactPatch, MemoryManager, MemoryScope, NewFact,
};
use deermem_core::{AgentName, InvalidInputCode, ManagerError, PublicMemoryDocument};
use tracing::Instrument as _;

use crate::auth::Caller;
use crate::body::JsonDocument;
use crate::error::{GatewayError, Operation};
use crate::extract::{Call, ImportBody, JsonBody, QueryParams, parse_agent, parse_fact_id};
use crate::limits::BulkPermit;
use crate::schema::{
    self, Accepted, ContextResponse, MAX_THREAD_ID_CHARS, MAX_TRACE_ID_CHARS, MemoryConfigResponse,
    MemoryStatusResponse, RebuildResponse, RebuildStatus, SearchHit, SearchResponse,
};
use crate::state::{ContextServed, GatewayState, ObserverError, spawn_warm};
use deermem_core::ports::run_journal::{
    EventQuery, EventsLookup, RunEvent, validate_event_type, validate_run_key,
};

type Result<T, E = GatewayError> = std::result::Result<T, E>;

/// Runs `fut` on its own task (so a timed-out request never cancels a write half-way), in the
/// request's span; a task that panicked is an internal error naming `what`.
pub(crate) async fn spawned<T: Send + 'static>(
    what: impl FnOnce() -> String,
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T> {
    tokio::spawn(fut.in_current_span())
        .await
        .map_err(|join| GatewayError::Internal(format!("{} task failed: {join}", what())))
}

impl Call {
    /// The caller's bucket: its user and the `agent` query parameter.
    fn scope(&self) -> Result<MemoryScope> {
        Ok(scope(&self.caller, self.q.agent()?))
    }

    /// Runs `call` on the manager, on its own task in the request's span, and maps its error.
    async fn run<T, Fut>(
        &self,
        op: Operation,
        call: impl FnOnce(Arc<dyn MemoryManager>) -> Fut,
    ) -> Result<T>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, ManagerError>> + Send + 'static,
    {
        let manager = self.state.manager();
        spawned(
            || format!("memory backend ('{}')", op.label()),
            call(Arc::clone(manager)),
        )
        .await?
        .map_err(|e| GatewayError::manager(op, manager.name(), e))
    }

    /// A manager call on the caller's bucket that answers the document.
    async fn document<Fut>(
        &self,
        op: Operation,
        call: impl FnOnce(Arc<dyn MemoryManager>, MemoryScope) -> Fut,
    ) -> Result<JsonDocument>
    where
        Fut: Future<Output = Result<PublicMemoryDocument, ManagerError>> + Send + 'static,
    {
        let scope = self.scope()?;
        self.run(op, |m| call(m, scope)).await.map(JsonDocument)
    }

    /// The caller's document (`get_memory`), read for `op`.
    async fn read_document(&self, op: Operation) -> Result<JsonDocument> {
        self.document(op, |m, s| async move { m.get_memory(s).await })
            .await
    }
}

fn scope(caller: &Caller, agent: Option<AgentName>) -> MemoryScope {
    MemoryScope::new(Some(caller.user.clone()), agent)
}

/// `GET /api/memory`.
pub(crate) async fn get_memory(call: Call) -> Result<JsonDocument> {
    call.read_document(Operation::GetMemory).await
}

/// `GET /api/memory/export`: the same document as `GET /api/memory` (the backup format); a
/// bulk request (see [`BulkPermit`]).
pub(crate) async fn export_memory(call: Call, permit: BulkPermit) -> Result<JsonDocument> {
    call.document(Operation::ExportMemory, |m, s| async move {
        let _permit = permit;
        m.get_memory(s).await
    })
    .await
}

/// `POST /api/memory/reload`: re-reads storage; falls back to `get_memory` when the backend
/// cannot reload (501 only when both are unsupported).
pub(crate) async fn reload_memory(call: Call) -> Result<JsonDocument> {
    call.document(Operation::ReloadMemory, |m, s| async move {
        match m.reload_memory(s.clone()).await {
            Err(ManagerError::Unsupported { .. }) => m.get_memory(s).await,
            other => other,
        }
    })
    .await
}

/// `DELETE /api/memory`: without `agent`, every agent's facts and the summaries; with
/// `agent`, only that bucket's facts.
pub(crate) async fn clear_memory(call: Call) -> Result<JsonDocument> {
    call.document(Operation::ClearMemory, |m, s| async move {
        m.clear_memory(s).await
    })
    .await
}

/// The longest `Idempotency-Key` accepted, in bytes.
const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// The `Idempotency-Key` header: absent, or 1 to 255 visible ASCII characters (400 otherwise).
fn idempotency_key(headers: &axum::http::HeaderMap) -> Result<Option<String>> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().unwrap_or_default();
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY_BYTES
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(GatewayError::BadRequest(format!(
            "Invalid Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY_BYTES} visible ASCII characters."
        )));
    }
    Ok(Some(key.to_owned()))
}

/// `POST /api/memory/facts`: returns the whole document; 409 when the capacity policy evicted
/// the new fact at once. With an `Idempotency-Key` header, a create repeated under the same
/// key (a retry after a lost answer) returns the stored fact instead of creating another.
pub(crate) async fn create_fact(
    call: Call,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<JsonDocument> {
    let input = schema::fact_create(&body)?;
    let key = idempotency_key(&headers)?;
    let scope = call.scope()?;
    let fact = NewFact {
        content: input.content,
        category: input.category,
        confidence: input.confidence,
    };
    let (doc, id) = call
        .run(Operation::CreateFact, |m| async move {
            m.create_fact_once(fact, scope, key.as_deref()).await
        })
        .await?;
    match id {
        Some(_) => Ok(JsonDocument(doc)),
        None => Err(GatewayError::CapacityEvicted),
    }
}

fn path_fact_id(path: Result<Path<String>, PathRejection>) -> Result<deermem_core::FactId> {
    let Path(raw) = path.map_err(|_| {
        GatewayError::BadRequest(
            "Invalid fact id: the path segment is not valid percent-encoded UTF-8.".into(),
        )
    })?;
    parse_fact_id(&raw)
}

/// `PATCH /api/memory/facts/{fact_id}`: fields left out (or `null`) are passed as `None`.
///
/// The order of the reference: the body is validated first (422), then the id; and the fact is
/// looked up before its new values are checked, so a patch of a missing fact is a 404 even
/// when the new content or confidence would be refused.
pub(crate) async fn update_fact(
    call: Call,
    path: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> Result<JsonDocument> {
    let input = schema::fact_patch(&body)?;
    let fact_id = path_fact_id(path)?;
    let patch = FactPatch {
        content: input.content,
        category: input.category,
        confidence: input.confidence,
        expected_revision: None,
    };
    let id = fact_id.clone();
    let updated = call
        .document(Operation::UpdateFact, |m, s| async move {
            m.update_fact(id.as_str(), patch, s).await
        })
        .await;
    match updated {
        Err(e) if refuses_new_values(&e) => {
            let found = call
                .read_document(Operation::UpdateFact)
                .await
                .map(|doc| doc.0.facts.iter().any(|f| f.id == fact_id.as_str()));
            match found {
                Ok(false) => Err(GatewayError::manager(
                    Operation::UpdateFact,
                    call.state.manager().name(),
                    ManagerError::NotFound {
                        fact_id: fact_id.as_str().to_owned(),
                    },
                )),
                _ => Err(e),
            }
        }
        other => other,
    }
}

/// Whether a failed update refused the patch's values (content, confidence, category), as
/// opposed to the ids or the state of storage.
fn refuses_new_values(e: &GatewayError) -> bool {
    matches!(
        e,
        GatewayError::Manager {
            error: ManagerError::InvalidInput {
                code: InvalidInputCode::Content
                    | InvalidInputCode::Confidence
                    | InvalidInputCode::Other,
                ..
            },
            ..
        }
    )
}

/// `DELETE /api/memory/facts/{fact_id}`.
pub(crate) async fn delete_fact(
    call: Call,
    path: Result<Path<String>, PathRejection>,
) -> Result<JsonDocument> {
    let fact_id = path_fact_id(path)?;
    call.document(Operation::DeleteFact, |m, s| async move {
        m.delete_fact(fact_id.as_str(), None, s).await
    })
    .await
}

/// `POST /api/memory/import`: replaces the bucket with the document. A bulk request (see
/// [`ImportBody`]: the slot is taken before the body is read and held until the import ends);
/// a document with more than `MAX_IMPORT_FACTS` facts is refused before they are built.
pub(crate) async fn import_memory(
    call: Call,
    ImportBody { permit, body }: ImportBody,
) -> Result<JsonDocument> {
    let incoming = schema::import_document(&body)?;
    drop(body);
    call.document(Operation::ImportMemory, |m, s| async move {
        let _permit = permit;
        m.import_memory(incoming, s).await
    })
    .await
}

/// The `/config` body: the `memory:` section with only the allowed, non-secret keys of
/// `backend_config` (known secrets as `"***"`, URLs without credentials).
fn config_json(state: &GatewayState) -> MemoryConfigResponse {
    let cfg = state.memory_config();
    MemoryConfigResponse {
        enabled: cfg.enabled,
        mode: cfg.mode,
        injection_enabled: cfg.injection_enabled,
        shutdown_flush_timeout_seconds: cfg.shutdown_flush_timeout_seconds,
        manager_class: cfg.manager_class.clone(),
        backend_config: shown_backend_config(&cfg.manager_class, &cfg.backend_config),
    }
}

/// `GET /api/memory/config` (answers even when memory is disabled).
pub(crate) async fn memory_config(State(state): State<GatewayState>) -> Json<MemoryConfigResponse> {
    Json(config_json(&state))
}

/// `GET /api/memory/status`: the config plus the caller's document.
pub(crate) async fn memory_status(call: Call) -> Result<Json<MemoryStatusResponse>> {
    let doc = call.read_document(Operation::GetMemoryStatus).await?;
    let state = &call.state;
    Ok(Json(MemoryStatusResponse {
        config: config_json(state),
        data: doc.0.for_http(),
        last_backend_failure: state.manager().last_backend_failure(),
        caches: cache_bounds(state),
    }))
}

/// The bounds of the manager's caches and of the run journal's, as reported by each.
fn cache_bounds(state: &GatewayState) -> Vec<deermem_core::CacheBound> {
    let mut out = state.manager().cache_bounds();
    if let Some(journal) = state.run_journal() {
        out.extend(journal.cache_bounds());
    }
    out
}

/// `POST /api/memory/messages`: queues one conversation turn; 202 Accepted.
pub(crate) async fn add_messages(call: Call, JsonBody(body): JsonBody) -> Result<Response> {
    let input = schema::messages_body(&body)?;
    // The turn now lives in `input`: a large one is not held twice while it is queued.
    drop(body);
    let from_body = parse_agent(input.agent.as_deref())?;
    let from_query = call.q.agent()?;
    let agent = match (from_body, from_query) {
        (Some(b), Some(qa)) if b != qa => {
            return Err(GatewayError::BadRequest(
                "The agent in the body and the agent query parameter differ.".into(),
            ));
        }
        (b, qa) => b.or(qa),
    };
    let request = AddRequest {
        thread_id: input.thread_id,
        messages: input.messages,
        scope: scope(&call.caller, agent),
        trace_id: input.trace_id,
    };
    call.run(
        Operation::AddMessages,
        |m| async move { m.add(request).await },
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(Accepted::default())).into_response())
}

/// `GET /api/memory/context`: the injection block with its `<memory>` wrapper and SHA-256.
/// With `memory.injection_enabled: false` the block is empty, as the host would inject
/// nothing.
pub(crate) async fn memory_context(call: Call) -> Result<Json<ContextResponse>> {
    let Call { state, caller, q } = &call;
    let agent = q.agent()?;
    let thread_id = schema::id_param(q, "thread_id", MAX_THREAD_ID_CHARS)?;
    let run_id = schema::id_param(q, "run_id", MAX_TRACE_ID_CHARS)?;
    if run_id.is_some() && thread_id.is_none() {
        return Err(GatewayError::BadRequest(
            "run_id needs a thread_id: a run belongs to a thread.".into(),
        ));
    }
    if let (Some(t), Some(r)) = (&thread_id, &run_id) {
        // A run's identity is recorded under these ids: same grammar as the events route.
        run_key(t, "thread_id")?;
        run_key(r, "run_id")?;
    }
    if !state.memory_config().injection_enabled {
        return Ok(Json(ContextResponse::default()));
    }
    let request = ContextRequest {
        scope: scope(caller, agent.clone()),
        thread_id: thread_id.clone(),
    };
    let ctx = call
        .run(Operation::GetContext, |m| async move {
            m.get_context_block(request).await
        })
        .await?;
    if let (Some(thread_id), Some(run_id), Some(sha)) =
        (thread_id, run_id, ctx.content_sha256.clone())
        && !state.observers.is_empty()
    {
        let served = ContextServed {
            user: caller.user.clone(),
            agent,
            thread_id,
            run_id,
            content_sha256: sha,
        };
        notify_observers(state, served).await?;
    }
    Ok(Json(ContextResponse {
        context: ctx.block,
        content_sha256: ctx.content_sha256,
    }))
}

/// `GET /api/memory/search`: `{"results": [fact + score + matchType...], "count": n}`, ranked
/// by `mode` (or the configured default).
pub(crate) async fn search_memory(call: Call) -> Result<Json<SearchResponse>> {
    let mut request = schema::search_request(&call.q)?;
    request.scope = call.scope()?;
    let hits = call
        .run(Operation::Search, |m| async move {
            m.search_scored(request).await
        })
        .await?;
    let results: Vec<SearchHit> = hits
        .into_iter()
        .map(|hit| SearchHit {
            fact: hit.fact.for_http(),
            score: hit.score,
            match_type: hit.match_type,
        })
        .collect();
    let count = results.len();
    Ok(Json(SearchResponse { results, count }))
}

/// `POST /api/memory/index/rebuild`: runs the manager's `warm()` (DeerMem rebuilds its derived
/// search index) and reports the outcome; 409 while another rebuild runs.
pub(crate) async fn rebuild_index(
    State(state): State<GatewayState>,
) -> Result<Json<RebuildResponse>> {
    let task = spawn_warm(&state).ok_or(GatewayError::RebuildRunning)?;
    let outcome = task
        .await
        .map_err(|join| GatewayError::Internal(format!("index rebuild task failed: {join}")))?;
    let (status, warmed) = match outcome {
        Some(true) => (RebuildStatus::Ok, Some(true)),
        None => (RebuildStatus::NothingToWarm, None),
        Some(false) => return Err(GatewayError::RebuildFailed),
    };
    Ok(Json(RebuildResponse { status, warmed }))
}

/// Tells every observer about a served block, in order; the first refusal answers.
async fn notify_observers(state: &GatewayState, served: ContextServed) -> Result<()> {
    for observer in &state.observers {
        match observer.context_served(&served).await {
            Ok(()) => {}
            Err(ObserverError::Conflict(detail)) => return Err(GatewayError::Conflict(detail)),
            Err(ObserverError::Failed(message)) => {
                return Err(GatewayError::Journal {
                    detail: "Failed to record the memory identity of the run.",
                    message,
                });
            }
        }
    }
    Ok(())
}

/// A thread or run id, checked against the run journal's grammar (400 otherwise).
fn run_key(value: &str, field: &'static str) -> Result<()> {
    validate_run_key(field, value).map_err(|e| GatewayError::BadRequest(e.to_string()))
}

/// The largest `limit` of the events route.
const MAX_EVENTS_LIMIT: i64 = 2000;
/// The most event types one filter may name.
const MAX_EVENT_TYPES: usize = 32;

fn event_query(q: &QueryParams) -> Result<EventQuery> {
    let event_types = match q.get("event_types").filter(|s| !s.is_empty()) {
        None => None,
        Some(raw) => {
            let types: Vec<String> = raw
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect();
            if types.len() > MAX_EVENT_TYPES {
                return Err(GatewayError::BadRequest(format!(
                    "Invalid event_types: at most {MAX_EVENT_TYPES} types."
                )));
            }
            for t in &types {
                validate_event_type(t).map_err(|e| GatewayError::BadRequest(e.to_string()))?;
            }
            Some(types)
        }
    };
    let limit = schema::positive_int_param(q, "limit", Some(MAX_EVENTS_LIMIT))?.unwrap_or(500);
    Ok(EventQuery {
        event_types,
        after_seq: schema::positive_int_param(q, "after_seq", None)?,
        limit: usize::try_from(limit).unwrap_or(usize::MAX),
    })
}

/// `GET /api/threads/{thread_id}/runs/{run_id}/events`: the caller's recorded events of that
/// run (`event_types` comma-separated, `limit` 1–2000 default 500, `after_seq`), as a JSON
/// list. A thread or run the caller has no event in is a 404, whoever else may own it.
pub(crate) async fn run_events(
    Call { state, caller, q }: Call,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Vec<RunEvent>>> {
    let Path((thread_id, run_id)) =
        path.map_err(|_| GatewayError::BadRequest("Invalid thread or run id in the path.".into()))?;
    run_key(&thread_id, "thread_id")?;
    run_key(&run_id, "run_id")?;
    let query = event_query(&q)?;
    let Some(journal) = state.run_journal() else {
        return Err(GatewayError::NotImplemented(
            "Run events are not recorded: this gateway has no run journal.".into(),
        ));
    };
    let found = journal
        .events(&caller.user, &thread_id, &run_id, &query)
        .await
        .map_err(|e| GatewayError::Journal {
            detail: "Failed to read the run journal.",
            message: e.to_string(),
        })?;
    match found {
        EventsLookup::UnknownThread => Err(GatewayError::NotFound(format!(
            "Thread '{thread_id}' not found."
        ))),
        EventsLookup::UnknownRun => Err(GatewayError::NotFound(format!(
            "Run '{run_id}' not found in thread '{thread_id}'."
        ))),
        EventsLookup::Events(events) => Ok(Json(events)),
    }
}
