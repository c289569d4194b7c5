//! Shared test support: an in-memory `MemoryManager` that records every call and can be
//! scripted to fail or pause, request helpers over `tower::ServiceExt::oneshot`, and the
//! backend-agnostic route suite (functions taking any `Arc<dyn MemoryManager>`).
#![allow(dead_code, unreachable_pub)]

use deermem_core::ports::{FactAdmin, MemoryAdmin, MemoryReader, MemoryReload, MemorySearch};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use deermem_core::ports::{
    AddRequest, ContextRequest, FactPatch, MemoryManager, MemoryScope, NewFact, SearchRequest,
};
use deermem_core::{
    FactScope, InvalidInputCode, ManagerError, MemoryConfig, MemoryMode, PublicFact,
    PublicMemoryDocument,
};
use deermem_gateway::{GatewayConfig, GatewayState, router};
use http_body_util::BodyExt as _;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt as _;

/// One recorded manager call, with the scope as the manager saw it.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Add {
        thread_id: String,
        user: Option<String>,
        agent: Option<String>,
        messages: usize,
        trace_id: Option<String>,
    },
    GetContext {
        user: Option<String>,
        agent: Option<String>,
        thread_id: Option<String>,
    },
    Search {
        query: String,
        top_k: usize,
        user: Option<String>,
        agent: Option<String>,
        category: Option<String>,
    },
    GetMemory {
        user: Option<String>,
        agent: Option<String>,
    },
    Reload {
        user: Option<String>,
        agent: Option<String>,
    },
    Clear {
        user: Option<String>,
        agent: Option<String>,
    },
    Import {
        user: Option<String>,
        agent: Option<String>,
        fact_ids: Vec<String>,
    },
    CreateFact {
        user: Option<String>,
        agent: Option<String>,
        content: String,
        category: String,
        confidence: f64,
    },
    UpdateFact {
        user: Option<String>,
        agent: Option<String>,
        fact_id: String,
        content: Option<String>,
        category: Option<String>,
        confidence: Option<f64>,
    },
    DeleteFact {
        user: Option<String>,
        agent: Option<String>,
        fact_id: String,
    },
    Warm,
    ShutdownFlush(Duration),
    Close,
}

impl Call {
    /// The user the call was scoped to, if it has a scope.
    pub fn user(&self) -> Option<Option<&str>> {
        match self {
            Call::Add { user, .. }
            | Call::GetContext { user, .. }
            | Call::Search { user, .. }
            | Call::GetMemory { user, .. }
            | Call::Reload { user, .. }
            | Call::Clear { user, .. }
            | Call::Import { user, .. }
            | Call::CreateFact { user, .. }
            | Call::UpdateFact { user, .. }
            | Call::DeleteFact { user, .. } => Some(user.as_deref()),
            _ => None,
        }
    }
}

type ErrorFn = Box<dyn Fn() -> ManagerError + Send + Sync>;

/// A pause point: the operation signals `entered`, then waits for a `release` permit.
#[derive(Debug)]
pub struct Gate {
    pub entered: Notify,
    pub release: Semaphore,
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            entered: Notify::new(),
            release: Semaphore::new(0),
        })
    }
    pub fn open(&self) {
        self.release.add_permits(1000);
    }
}

#[derive(Default)]
struct Store {
    /// (user, agent bucket) → facts by id.
    buckets: BTreeMap<(String, String), BTreeMap<String, PublicFact>>,
    /// user → work-context summary.
    summaries: BTreeMap<String, String>,
}

/// An in-memory backend that records every call. Scripted errors and pauses are keyed by
/// operation name (`get_memory`, `create_fact`...).
pub struct FakeManager {
    name: String,
    calls: Mutex<Vec<Call>>,
    errors: Mutex<HashMap<&'static str, ErrorFn>>,
    gates: Mutex<HashMap<&'static str, Arc<Gate>>>,
    store: Mutex<Store>,
    next_id: AtomicU64,
    /// `create_fact` reports the new fact as evicted (nothing stored).
    pub evict_new_facts: std::sync::atomic::AtomicBool,
    warm_result: Mutex<Option<bool>>,
    flush_result: std::sync::atomic::AtomicBool,
    context_body: Mutex<String>,
    backend_failure: Mutex<Option<deermem_core::ports::BackendFailure>>,
}

impl std::fmt::Debug for FakeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeManager")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn user_of(scope: &MemoryScope) -> Option<String> {
    scope.user.as_ref().map(|u| u.as_str().to_owned())
}
fn agent_of(scope: &MemoryScope) -> Option<String> {
    scope.agent.as_ref().map(|a| a.as_str().to_owned())
}
fn bucket_key(scope: &MemoryScope) -> (String, String) {
    (
        user_of(scope).unwrap_or_default(),
        agent_of(scope).unwrap_or_else(|| "__default__".into()),
    )
}

impl FakeManager {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            name: "FakeMemoryManager".into(),
            calls: Mutex::new(Vec::new()),
            errors: Mutex::new(HashMap::new()),
            gates: Mutex::new(HashMap::new()),
            store: Mutex::new(Store::default()),
            next_id: AtomicU64::new(1),
            evict_new_facts: std::sync::atomic::AtomicBool::new(false),
            warm_result: Mutex::new(Some(true)),
            flush_result: std::sync::atomic::AtomicBool::new(true),
            context_body: Mutex::new("User Context:\n- Work: Rust".into()),
            backend_failure: Mutex::new(None),
        })
    }

    /// The failure `last_backend_failure` reports.
    pub fn set_backend_failure(&self, f: Option<deermem_core::ports::BackendFailure>) {
        *self.backend_failure.lock() = f;
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    pub fn clear_calls(&self) {
        self.calls.lock().clear();
    }

    /// Makes `op` fail with the error `f` builds, until `heal(op)`.
    pub fn fail(&self, op: &'static str, f: impl Fn() -> ManagerError + Send + Sync + 'static) {
        self.errors.lock().insert(op, Box::new(f));
    }

    pub fn heal(&self, op: &'static str) {
        self.errors.lock().remove(op);
    }

    /// Makes `op` wait at a gate.
    pub fn pause(&self, op: &'static str) -> Arc<Gate> {
        let g = Gate::new();
        self.gates.lock().insert(op, Arc::clone(&g));
        g
    }

    pub fn set_warm_result(&self, r: Option<bool>) {
        *self.warm_result.lock() = r;
    }

    pub fn set_context_body(&self, body: &str) {
        *self.context_body.lock() = body.to_owned();
    }

    pub fn set_summary(&self, user: &str, text: &str) {
        self.store
            .lock()
            .summaries
            .insert(user.to_owned(), text.to_owned());
    }

    fn record(&self, call: Call) {
        self.calls.lock().push(call);
    }

    async fn enter(&self, op: &'static str) -> Result<(), ManagerError> {
        let gate = self.gates.lock().get(op).cloned();
        if let Some(g) = gate {
            g.entered.notify_one();
            let permit = g.release.acquire().await;
            drop(permit);
        }
        match self.errors.lock().get(op) {
            Some(f) => Err(f()),
            None => Ok(()),
        }
    }

    fn document(&self, scope: &MemoryScope) -> PublicMemoryDocument {
        let store = self.store.lock();
        let mut doc = PublicMemoryDocument::empty();
        doc.version = "2.0".into();
        doc.revision = Some(1);
        doc.last_updated = "2026-01-01T00:00:00Z".into();
        if let Some(s) = store.summaries.get(&user_of(scope).unwrap_or_default()) {
            doc.user.work_context.summary = s.clone();
        }
        doc.facts = store
            .buckets
            .get(&bucket_key(scope))
            .map(|b| b.values().cloned().collect())
            .unwrap_or_default();
        doc
    }

    fn public_fact(
        &self,
        id: String,
        content: &str,
        category: &str,
        confidence: f64,
        scope: &MemoryScope,
    ) -> PublicFact {
        let mut f: PublicFact =
            serde_json::from_value(json!({"id": id, "content": content})).expect("fact shape");
        f.category = category.to_owned();
        f.confidence = confidence;
        f.created_at = "2026-01-01T00:00:00Z".into();
        f.source = "manual".into();
        f.status = Some("active".into());
        f.revision = Some(1);
        f.scope = Some(FactScope {
            user_id: user_of(scope),
            agent_name: Some(bucket_key(scope).1),
        });
        // Manager-level fields the HTTP shape must drop.
        f.title = Some("manager-level title".into());
        f.confirmation_count = Some(2);
        f
    }
}

#[async_trait]
impl MemoryManager for FakeManager {
    fn allows_tool_mode(&self) -> bool {
        false
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn mode(&self) -> MemoryMode {
        MemoryMode::Middleware
    }

    async fn add(&self, r: AddRequest) -> Result<(), ManagerError> {
        self.record(Call::Add {
            thread_id: r.thread_id.clone(),
            user: user_of(&r.scope),
            agent: agent_of(&r.scope),
            messages: r.messages.len(),
            trace_id: r.trace_id.clone(),
        });
        self.enter("add").await
    }

    async fn get_context(&self, r: ContextRequest) -> Result<String, ManagerError> {
        self.record(Call::GetContext {
            user: user_of(&r.scope),
            agent: agent_of(&r.scope),
            thread_id: r.thread_id.clone(),
        });
        self.enter("get_context").await?;
        Ok(self.context_body.lock().clone())
    }

    async fn shutdown_flush(&self, timeout: Duration) -> bool {
        self.record(Call::ShutdownFlush(timeout));
        self.flush_result.load(Ordering::SeqCst)
    }

    async fn warm(&self) -> Option<bool> {
        self.record(Call::Warm);
        let gate = self.gates.lock().get("warm").cloned();
        if let Some(g) = gate {
            g.entered.notify_one();
            let permit = g.release.acquire().await;
            drop(permit);
        }
        *self.warm_result.lock()
    }

    async fn close(&self) {
        self.record(Call::Close);
    }

    fn last_backend_failure(&self) -> Option<deermem_core::ports::BackendFailure> {
        self.backend_failure.lock().clone()
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
}

#[async_trait]
impl MemorySearch for FakeManager {
    async fn search_scored(
        &self,
        request: SearchRequest,
    ) -> Result<Vec<deermem_core::ports::ScoredFact>, ManagerError> {
        Ok(MemorySearch::search(self, request)
            .await?
            .into_iter()
            .map(|fact| deermem_core::ports::ScoredFact {
                fact,
                score: None,
                match_type: deermem_core::search::MatchType::Remote,
            })
            .collect())
    }

    async fn search(&self, r: SearchRequest) -> Result<Vec<PublicFact>, ManagerError> {
        self.record(Call::Search {
            query: r.query.clone(),
            top_k: r.top_k,
            user: user_of(&r.scope),
            agent: agent_of(&r.scope),
            category: r.category.clone(),
        });
        self.enter("search").await?;
        let doc = self.document(&r.scope);
        let q = r.query.to_lowercase();
        Ok(doc
            .facts
            .into_iter()
            .filter(|f| r.category.as_ref().is_none_or(|c| &f.category == c))
            .filter(|f| !q.trim().is_empty() && f.content.to_lowercase().contains(&q))
            .take(r.top_k)
            .collect())
    }
}

#[async_trait]
impl MemoryReader for FakeManager {
    async fn get_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::GetMemory {
            user: user_of(&scope),
            agent: agent_of(&scope),
        });
        self.enter("get_memory").await?;
        Ok(self.document(&scope))
    }
}

#[async_trait]
impl MemoryAdmin for FakeManager {
    async fn clear_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::Clear {
            user: user_of(&scope),
            agent: agent_of(&scope),
        });
        self.enter("clear_memory").await?;
        {
            let mut store = self.store.lock();
            let user = user_of(&scope).unwrap_or_default();
            match &scope.agent {
                None => {
                    store.buckets.retain(|(u, _), _| u != &user);
                    store.summaries.remove(&user);
                }
                Some(_) => {
                    store.buckets.remove(&bucket_key(&scope));
                }
            }
        }
        Ok(self.document(&scope))
    }

    async fn import_memory(
        &self,
        document: PublicMemoryDocument,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::Import {
            user: user_of(&scope),
            agent: agent_of(&scope),
            fact_ids: document.facts.iter().map(|f| f.id.clone()).collect(),
        });
        self.enter("import_memory").await?;
        {
            let mut store = self.store.lock();
            let bucket: BTreeMap<String, PublicFact> = document
                .facts
                .iter()
                .map(|f| {
                    let mut f = f.clone();
                    f.scope = Some(FactScope {
                        user_id: user_of(&scope),
                        agent_name: Some(bucket_key(&scope).1),
                    });
                    (f.id.clone(), f)
                })
                .collect();
            store.buckets.insert(bucket_key(&scope), bucket);
            let summary = document.user.work_context.summary.clone();
            store
                .summaries
                .insert(user_of(&scope).unwrap_or_default(), summary);
        }
        Ok(self.document(&scope))
    }
}

#[async_trait]
impl MemoryReload for FakeManager {
    async fn reload_memory(
        &self,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::Reload {
            user: user_of(&scope),
            agent: agent_of(&scope),
        });
        self.enter("reload_memory").await?;
        Ok(self.document(&scope))
    }
}

#[async_trait]
impl FactAdmin for FakeManager {
    async fn create_fact(
        &self,
        fact: NewFact,
        scope: MemoryScope,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        self.record(Call::CreateFact {
            user: user_of(&scope),
            agent: agent_of(&scope),
            content: fact.content.clone(),
            category: fact.category.clone(),
            confidence: fact.confidence,
        });
        self.enter("create_fact").await?;
        let content = fact.content.trim();
        if content.is_empty() {
            return Err(ManagerError::invalid(InvalidInputCode::Content, "content"));
        }
        if !(0.0..=1.0).contains(&fact.confidence) {
            return Err(ManagerError::invalid(
                InvalidInputCode::Confidence,
                "confidence",
            ));
        }
        let duplicate = self
            .document(&scope)
            .facts
            .iter()
            .any(|f| f.content.trim().to_lowercase() == content.to_lowercase());
        if duplicate {
            return Err(ManagerError::invalid(
                InvalidInputCode::DuplicateFact,
                "Duplicate fact",
            ));
        }
        if self.evict_new_facts.load(Ordering::SeqCst) {
            return Ok((self.document(&scope), None));
        }
        let id = format!("fact_{:08x}", self.next_id.fetch_add(1, Ordering::SeqCst));
        let category = if fact.category.trim().is_empty() {
            "context"
        } else {
            fact.category.trim()
        };
        let f = self.public_fact(id.clone(), content, category, fact.confidence, &scope);
        self.store
            .lock()
            .buckets
            .entry(bucket_key(&scope))
            .or_default()
            .insert(id.clone(), f);
        Ok((self.document(&scope), Some(id)))
    }

    async fn update_fact(
        &self,
        fact_id: &str,
        patch: FactPatch,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::UpdateFact {
            user: user_of(&scope),
            agent: agent_of(&scope),
            fact_id: fact_id.to_owned(),
            content: patch.content.clone(),
            category: patch.category.clone(),
            confidence: patch.confidence,
        });
        self.enter("update_fact").await?;
        if let Some(c) = &patch.content
            && c.trim().is_empty()
        {
            return Err(ManagerError::invalid(InvalidInputCode::Content, "content"));
        }
        {
            let mut store = self.store.lock();
            let fact = store
                .buckets
                .get_mut(&bucket_key(&scope))
                .and_then(|b| b.get_mut(fact_id))
                .ok_or_else(|| ManagerError::NotFound {
                    fact_id: fact_id.to_owned(),
                })?;
            if let Some(c) = patch.content {
                fact.content = c.trim().to_owned();
            }
            if let Some(c) = patch.category {
                fact.category = c;
            }
            if let Some(c) = patch.confidence {
                fact.confidence = c;
            }
        }
        Ok(self.document(&scope))
    }

    async fn delete_fact(
        &self,
        fact_id: &str,
        _expected: Option<u64>,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::DeleteFact {
            user: user_of(&scope),
            agent: agent_of(&scope),
            fact_id: fact_id.to_owned(),
        });
        self.enter("delete_fact").await?;
        let removed = self
            .store
            .lock()
            .buckets
            .get_mut(&bucket_key(&scope))
            .and_then(|b| b.remove(fact_id));
        match removed {
            Some(_) => Ok(self.document(&scope)),
            None => Err(ManagerError::NotFound {
                fact_id: fact_id.to_owned(),
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Requests.

/// A response: status, headers, and the body as JSON (or as a JSON string when not JSON).
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Resp {
    pub fn detail(&self) -> &str {
        self.body["detail"].as_str().unwrap_or("")
    }
}

pub fn ready_state(
    manager: Arc<dyn MemoryManager>,
    memory: MemoryConfig,
    gateway: GatewayConfig,
) -> GatewayState {
    let s = GatewayState::new(manager, memory, gateway);
    s.mark_ready();
    s
}

/// A ready app with default config (no auth, loopback).
pub fn app(manager: Arc<dyn MemoryManager>) -> Router {
    router(ready_state(
        manager,
        MemoryConfig::default(),
        GatewayConfig::default(),
    ))
}

/// A ready app in token mode with these (token, user) pairs and an internal token.
pub fn token_app(manager: Arc<dyn MemoryManager>, tokens: &[(&str, &str)]) -> Router {
    let mut cfg = GatewayConfig::with_tokens(tokens.iter().copied()).expect("tokens");
    cfg.auth.internal_token = Some(deermem_core::config::ConfigSecret::new(INTERNAL_TOKEN));
    router(ready_state(manager, MemoryConfig::default(), cfg))
}

pub const INTERNAL_TOKEN: &str = "internal-secret-token";

pub fn req(method: Method, uri: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(uri)
}

pub fn empty(method: Method, uri: &str) -> Request<Body> {
    req(method, uri).body(Body::empty()).expect("request")
}

pub fn json_req(method: Method, uri: &str, body: &Value) -> Request<Body> {
    req(method, uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

pub fn with_bearer(mut r: Request<Body>, token: &str) -> Request<Body> {
    r.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    r
}

pub async fn send(app: &Router, request: Request<Body>) -> Resp {
    let resp = app
        .clone()
        .oneshot(request)
        .await
        .expect("infallible router");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(text.clone()));
    Resp {
        status,
        headers,
        body,
        text,
    }
}

pub fn fact_ids(body: &Value) -> Vec<String> {
    body["facts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub fn fact_contents(body: &Value) -> Vec<String> {
    body["facts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["content"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The backend-agnostic route suite: each function takes any manager that supports the
// whole contract (fact CRUD, get/clear/import, search) and asserts only what the contract
// promises. Run it against new backends from their own test file.

/// Create, read, patch and delete a fact through the routes.
pub async fn suite_fact_crud(manager: Arc<dyn MemoryManager>) {
    let app = app(manager);
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "I write Rust daily", "category": "context", "confidence": 0.9}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let created = r.body["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .find(|f| f["content"] == "I write Rust daily")
        .cloned()
        .expect("created fact");
    let id = created["id"].as_str().expect("id").to_owned();
    assert!(
        created["source"].is_string(),
        "source is projected to a string: {created}"
    );
    for dropped in [
        "title",
        "expected_valid_days",
        "lastConfirmedAt",
        "confirmationCount",
    ] {
        assert!(
            created.get(dropped).is_none(),
            "{dropped} must not be in the HTTP shape: {created}"
        );
    }
    let r = send(&app, empty(Method::GET, "/api/memory")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(fact_ids(&r.body).contains(&id));
    let r = send(
        &app,
        json_req(
            Method::PATCH,
            &format!("/api/memory/facts/{id}"),
            &json!({"content": "I write Rust and Go"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let patched = r.body["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .find(|f| f["id"] == id.as_str())
        .cloned()
        .expect("patched");
    assert_eq!(patched["content"], "I write Rust and Go");
    assert_eq!(patched["category"], "context", "omitted fields are kept");
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "  i write rust AND go "}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.detail(), "A fact with the same content already exists.");
    let r = send(
        &app,
        empty(Method::DELETE, &format!("/api/memory/facts/{id}")),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(!fact_ids(&r.body).contains(&id));
    let r = send(
        &app,
        empty(Method::DELETE, &format!("/api/memory/facts/{id}")),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.detail(), format!("Memory fact '{id}' not found."));
    let r = send(
        &app,
        json_req(
            Method::PATCH,
            "/api/memory/facts/fact_missing",
            &json!({"content": "x"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.detail(), "Memory fact 'fact_missing' not found.");
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "   "}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.detail(), "Memory fact content cannot be empty.");
}

/// Export, clear, import the export: the same facts come back.
pub async fn suite_export_clear_import(manager: Arc<dyn MemoryManager>) {
    let app = app(manager);
    for content in [
        "Prefers tea over coffee",
        "Lives in Lisbon",
        "Works on DeerMem",
    ] {
        let r = send(
            &app,
            json_req(
                Method::POST,
                "/api/memory/facts",
                &json!({"content": content}),
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let export = send(&app, empty(Method::GET, "/api/memory/export")).await;
    assert_eq!(export.status, StatusCode::OK);
    let mut before: Vec<(String, String)> = export.body["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap_or("").to_owned(),
                f["content"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    before.sort();
    assert_eq!(before.len(), 3);
    let cleared = send(&app, empty(Method::DELETE, "/api/memory")).await;
    assert_eq!(cleared.status, StatusCode::OK);
    assert_eq!(cleared.body["facts"], json!([]));
    assert_eq!(
        send(&app, empty(Method::GET, "/api/memory")).await.body["facts"],
        json!([])
    );
    let imported = send(
        &app,
        json_req(Method::POST, "/api/memory/import", &export.body),
    )
    .await;
    assert_eq!(imported.status, StatusCode::OK, "{}", imported.text);
    let after = send(&app, empty(Method::GET, "/api/memory")).await;
    let mut got: Vec<(String, String)> = after.body["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap_or("").to_owned(),
                f["content"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(got, before);
}

/// Agent buckets are separate, and `DELETE /api/memory?agent=` clears only that bucket.
pub async fn suite_agent_buckets(manager: Arc<dyn MemoryManager>) {
    let app = app(manager);
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts?agent=Coder",
            &json!({"content": "Uses vim"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Likes hiking"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let coder = send(&app, empty(Method::GET, "/api/memory?agent=coder")).await;
    assert_eq!(fact_contents(&coder.body), vec!["Uses vim".to_owned()]);
    let default = send(&app, empty(Method::GET, "/api/memory")).await;
    assert_eq!(
        fact_contents(&default.body),
        vec!["Likes hiking".to_owned()]
    );
    let r = send(&app, empty(Method::DELETE, "/api/memory?agent=coder")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        send(&app, empty(Method::GET, "/api/memory?agent=coder"))
            .await
            .body["facts"],
        json!([])
    );
    assert_eq!(
        fact_contents(&send(&app, empty(Method::GET, "/api/memory")).await.body),
        vec!["Likes hiking".to_owned()]
    );
}

/// Search finds a stored fact within the caller's scope only.
pub async fn suite_search(manager: Arc<dyn MemoryManager>) {
    let app = token_app(manager, &[("tok-a", "alice"), ("tok-b", "bob")]);
    let r = send(
        &app,
        with_bearer(
            json_req(
                Method::POST,
                "/api/memory/facts",
                &json!({"content": "Alice keeps bees", "category": "preference"}),
            ),
            "tok-a",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = send(
        &app,
        with_bearer(empty(Method::GET, "/api/memory/search?q=bees"), "tok-a"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["count"], 1);
    assert_eq!(r.body["results"][0]["content"], "Alice keeps bees");
    let r = send(
        &app,
        with_bearer(
            empty(Method::GET, "/api/memory/search?q=bees&category=goal"),
            "tok-a",
        ),
    )
    .await;
    assert_eq!(r.body["count"], 0, "category filter: {}", r.text);
    let r = send(
        &app,
        with_bearer(empty(Method::GET, "/api/memory/search?q=bees"), "tok-b"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.body["count"], 0,
        "bob must not find alice's fact: {}",
        r.text
    );
}

/// One user's token cannot read, export, patch or delete another user's facts.
pub async fn suite_user_isolation(manager: Arc<dyn MemoryManager>) {
    let app = token_app(manager, &[("tok-a", "alice"), ("tok-b", "bob")]);
    let r = send(
        &app,
        with_bearer(
            json_req(
                Method::POST,
                "/api/memory/facts",
                &json!({"content": "Alice's secret plan"}),
            ),
            "tok-a",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let id = fact_ids(&r.body).first().cloned().expect("id");
    for path in ["/api/memory", "/api/memory/export", "/api/memory/status"] {
        let r = send(&app, with_bearer(empty(Method::GET, path), "tok-b")).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert!(!r.text.contains("secret plan"), "{path} leaked: {}", r.text);
    }
    let r = send(
        &app,
        with_bearer(
            json_req(
                Method::PATCH,
                &format!("/api/memory/facts/{id}"),
                &json!({"content": "hijacked"}),
            ),
            "tok-b",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = send(
        &app,
        with_bearer(
            empty(Method::DELETE, &format!("/api/memory/facts/{id}")),
            "tok-b",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = send(
        &app,
        with_bearer(empty(Method::DELETE, "/api/memory"), "tok-b"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = send(
        &app,
        with_bearer(empty(Method::GET, "/api/memory"), "tok-a"),
    )
    .await;
    assert_eq!(
        fact_contents(&r.body),
        vec!["Alice's secret plan".to_owned()],
        "bob's clear must not touch alice"
    );
}

/// A turn journal served without an engine: its retry only makes the item pending (nothing
/// runs it). For the routes' shapes; the engine's retry is exercised in `turns_api.rs`.
#[derive(Debug)]
pub struct JournalOnly(pub Arc<dyn deermem_core::ports::TurnJournal>);

#[async_trait]
impl deermem_core::ports::TurnAdmin for JournalOnly {
    fn journal(&self) -> &Arc<dyn deermem_core::ports::TurnJournal> {
        &self.0
    }

    async fn retry_now(
        &self,
        id: &deermem_core::ports::turn_journal::TurnId,
    ) -> Result<
        Option<deermem_core::ports::turn_journal::TurnItem>,
        deermem_core::ports::turn_journal::TurnJournalError,
    > {
        self.0.retry(id).await
    }
}

/// Appends a turn of `user` to `journal` and dead-letters it; its id.
pub async fn dead_turn(
    journal: &dyn deermem_core::ports::TurnJournal,
    id: &str,
    user: &str,
    thread: &str,
) -> deermem_core::ports::turn_journal::TurnId {
    use deermem_core::ports::turn_journal::{NewTurn, TurnId, TurnIdentity};
    let id = TurnId::parse(id).expect("turn id");
    journal
        .append(NewTurn {
            identity: TurnIdentity {
                id: id.clone(),
                user: Some(deermem_core::UserId::new(user).expect("user")),
                agent: deermem_core::AgentName::default_bucket(),
                thread_id: thread.into(),
                trace_id: Some(format!("trace-{thread}")),
                signals: vec!["preference".into()],
                emergency: false,
            },
            messages: vec![
                deermem_core::Message::human("I prefer oolong tea."),
                deermem_core::Message::ai("Noted."),
            ],
            accepted_at: deermem_core::Timestamp::from_unix_seconds(1_700_000_000),
        })
        .await
        .expect("append");
    assert!(
        journal
            .dead_letter(&id, "gave up after 1 attempts over 0s: model down")
            .await
            .expect("dead-letter")
    );
    id
}
