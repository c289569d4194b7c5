//! The turn journal's routes and gauges over the real DeerMem engine on a temporary file root,
//! wired as `deermem serve` wires them (`DeerMemManager::turn_admin`): with the model down and
//! `queue.retry.max_attempts: 1`, a turn is dead-lettered and shows in its own user's
//! `GET /api/memory/turns` only; another user's retry or drop of it is a 404; a retry with the
//! model back applies it at once (no claim round runs in these tests) and it leaves the list; a
//! drop removes it without running it; `/metrics` counts pending and dead items; bad `state`
//! and ids are 400s; without a durable journal the routes answer 501 and the gauges are absent,
//! and a journal that cannot be counted leaves the gauges out without failing the scrape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::http::{Method, StatusCode};
use common::{FakeManager, Resp, empty, json_req, ready_state, send, with_bearer};
use deermem_core::ports::turn_journal::{
    ClaimRequest, NewTurn, TurnCounts, TurnFilter, TurnId, TurnItem, TurnJournalError,
};
use deermem_core::ports::{ChatRequest, ChatResponse, LanguageModel, TurnAdmin, TurnJournal};
use deermem_core::{LlmError, MemoryConfig, Timestamp};
use deermem_gateway::{GatewayConfig, router};
use serde_json::{Value, json};

const FACT: &str = "User prefers oolong tea";

/// A model that is down (a 503 from its server) until switched up; then every extraction
/// proposes one durable preference fact.
#[derive(Debug, Default)]
struct SwitchModel {
    up: AtomicBool,
    calls: AtomicUsize,
}

#[async_trait]
impl LanguageModel for SwitchModel {
    fn model_name(&self) -> &str {
        "switch"
    }

    async fn complete(&self, _request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.up.load(Ordering::SeqCst) {
            return Err(LlmError::Server {
                status: 503,
                message: "model down".into(),
            });
        }
        let answer = json!({"user": {}, "history": {}, "newFacts": [{
            "content": FACT, "category": "preference", "confidence": 0.9,
            "scope": "user", "durability": "durable", "authority": "descriptive"}]});
        Ok(ChatResponse {
            content: answer.to_string(),
            model: Some("switch".into()),
            usage: None,
        })
    }
}

fn memory_config(durable: bool, debounce_seconds: u64) -> MemoryConfig {
    let backend = json!({
        "debounce_seconds": debounce_seconds,
        "queue": {
            "durable": durable,
            "retry": {"max_attempts": 1, "initial_backoff_ms": 1, "max_backoff": 1}
        }
    });
    MemoryConfig {
        backend_config: backend.as_object().cloned().expect("object"),
        ..MemoryConfig::default()
    }
}

fn gateway() -> GatewayConfig {
    GatewayConfig::with_tokens([("tok-alice", "alice"), ("tok-bob", "bob")]).expect("tokens")
}

/// The engine on `root` with `model`, and the gateway over it wired as `deermem serve` does.
/// No background claim loop: only the routes can queue a retried turn.
fn served(
    root: &Path,
    model: Arc<SwitchModel>,
    durable: bool,
    debounce_seconds: u64,
) -> (deermem::Backend, Router) {
    let memory = memory_config(durable, debounce_seconds);
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    opts.llm = Some(model);
    opts.recover_turns = false;
    let backend = deermem::build_backend(&memory, opts).expect("DeerMem builds on a temp root");
    let mut state = ready_state(backend.manager(), memory, gateway());
    if let Some(turns) = backend.deermem().and_then(|dm| dm.turn_admin()) {
        state = state.with_turn_journal(turns);
    }
    (backend, router(state))
}

async fn call(app: &Router, method: Method, uri: &str, token: &str) -> Resp {
    send(app, with_bearer(empty(method, uri), token)).await
}

async fn post_turn(app: &Router, token: &str, thread: &str) {
    let body = json!({"thread_id": thread, "messages": [
        {"role": "user", "content": "Please remember: I prefer oolong tea over coffee."},
        {"type": "ai", "content": "Noted, oolong tea it is."}
    ]});
    let r = send(
        app,
        with_bearer(json_req(Method::POST, "/api/memory/messages", &body), token),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
}

fn turns(r: &Resp) -> Vec<Value> {
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.body["turns"].as_array().cloned().expect("turns list")
}

async fn list(app: &Router, token: &str) -> Vec<Value> {
    turns(&call(app, Method::GET, "/api/memory/turns", token).await)
}

async fn facts(app: &Router, token: &str) -> Vec<String> {
    let r = call(app, Method::GET, "/api/memory", token).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    common::fact_contents(&r.body)
}

/// The value of an unlabelled gauge in the exposition, if present.
fn gauge(text: &str, name: &str) -> Option<i64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

async fn scrape(app: &Router) -> String {
    let r = send(app, empty(Method::GET, "/metrics")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.text
}

async fn turn_gauges(app: &Router) -> (Option<i64>, Option<i64>) {
    let text = scrape(app).await;
    (
        gauge(&text, "deermem_turns_pending"),
        gauge(&text, "deermem_turns_dead"),
    )
}

/// Polls until `cond` holds (a guard against a hang, not a speed assertion).
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    for _ in 0..1500 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_turns_are_listed_retried_and_dropped_by_their_own_user_only() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = Arc::new(SwitchModel::default());
    let (backend, app) = served(tmp.path(), Arc::clone(&model), true, 1);

    post_turn(&app, "tok-alice", "thread-alice").await;
    post_turn(&app, "tok-bob", "thread-bob").await;
    // While queued (debounce) or failing, the turns are pending; then both are dead-lettered.
    eventually("both turns dead-lettered", async || {
        turn_gauges(&app).await == (Some(0), Some(2))
    })
    .await;
    assert!(model.calls.load(Ordering::SeqCst) >= 2);

    // Each user sees their own item only, with what an operator needs.
    let alice = list(&app, "tok-alice").await;
    assert_eq!(alice.len(), 1, "{alice:?}");
    let item = &alice[0];
    assert_eq!(item["state"], "dead");
    assert_eq!(item["user_id"], "alice");
    assert_eq!(item["thread_id"], "thread-alice");
    assert_eq!(item["agent"], "__default__");
    assert_eq!(item["attempts"], 1);
    assert_eq!(item["message_count"], 2);
    assert!(item["message_bytes"].as_u64() > Some(40), "{item}");
    assert!(
        item["messages"][0]["content"]
            .as_str()
            .is_some_and(|c| c.contains("oolong")),
        "{item}"
    );
    assert!(
        item["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("model down")),
        "{item}"
    );
    assert!(
        item["accepted_at"]
            .as_str()
            .is_some_and(|t| Timestamp::parse_iso(t).is_some()),
        "{item}"
    );
    let alice_id = item["id"].as_str().expect("id").to_owned();
    let bob = list(&app, "tok-bob").await;
    assert_eq!(bob.len(), 1, "{bob:?}");
    assert_eq!(bob[0]["user_id"], "bob");
    let bob_id = bob[0]["id"].as_str().expect("id").to_owned();
    assert_ne!(alice_id, bob_id);
    assert!(
        bob.iter().all(|t| t["id"] != alice_id.as_str()),
        "bob sees alice's turn"
    );

    // The state filter.
    let r = call(
        &app,
        Method::GET,
        "/api/memory/turns?state=dead",
        "tok-alice",
    )
    .await;
    assert_eq!(turns(&r).len(), 1);
    assert_eq!(r.body["total"], 1);
    let r = call(
        &app,
        Method::GET,
        "/api/memory/turns?state=pending",
        "tok-alice",
    )
    .await;
    assert!(turns(&r).is_empty(), "{}", r.text);
    let r = call(
        &app,
        Method::GET,
        "/api/memory/turns?state=stuck",
        "tok-alice",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(
        r.detail(),
        "Invalid state 'stuck': expected 'pending' or 'dead'."
    );
    let r = call(&app, Method::GET, "/api/memory/turns?limit=0", "tok-alice").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    // Authentication is required.
    let r = send(&app, empty(Method::GET, "/api/memory/turns")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);

    // Bob cannot act on alice's turn: 404, as for an unknown id.
    let retry_alice = format!("/api/memory/turns/{alice_id}/retry");
    let drop_alice = format!("/api/memory/turns/{alice_id}");
    let r = call(&app, Method::POST, &retry_alice, "tok-bob").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_eq!(r.detail(), format!("Turn '{alice_id}' not found."));
    let r = call(&app, Method::DELETE, &drop_alice, "tok-bob").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let unknown = "turn_0123456789abcdef0123456789abcdef";
    let r = call(
        &app,
        Method::POST,
        &format!("/api/memory/turns/{unknown}/retry"),
        "tok-alice",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_eq!(r.detail(), format!("Turn '{unknown}' not found."));
    // Bad ids.
    for bad in ["bad.id", "a%20b", &"x".repeat(65)] {
        for (method, uri) in [
            (Method::POST, format!("/api/memory/turns/{bad}/retry")),
            (Method::DELETE, format!("/api/memory/turns/{bad}")),
        ] {
            let r = call(&app, method.clone(), &uri, "tok-alice").await;
            assert_eq!(
                r.status,
                StatusCode::BAD_REQUEST,
                "{method} {uri}: {}",
                r.text
            );
            assert!(r.detail().starts_with("Invalid turn id"), "{}", r.text);
        }
    }
    // Nothing changed.
    assert_eq!(list(&app, "tok-alice").await.len(), 1);
    assert_eq!(turn_gauges(&app).await, (Some(0), Some(2)));

    // The model is back: alice's retry runs her turn at once (no claim round in this test).
    model.up.store(true, Ordering::SeqCst);
    let r = call(&app, Method::POST, &retry_alice, "tok-alice").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["id"], alice_id.as_str());
    assert_eq!(r.body["state"], "pending");
    assert_eq!(r.body["attempts"], 0);
    eventually("alice's retried turn applied", async || {
        facts(&app, "tok-alice").await.iter().any(|f| f == FACT)
    })
    .await;
    eventually("alice's turn left the journal", async || {
        list(&app, "tok-alice").await.is_empty()
    })
    .await;
    assert_eq!(turn_gauges(&app).await, (Some(0), Some(1)));
    // Gone: a second retry is a 404.
    let r = call(&app, Method::POST, &retry_alice, "tok-alice").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    // Bob drops his: it is removed and never runs.
    let r = call(
        &app,
        Method::DELETE,
        &format!("/api/memory/turns/{bob_id}"),
        "tok-bob",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["id"], bob_id.as_str());
    assert_eq!(r.body["state"], "dead");
    assert!(list(&app, "tok-bob").await.is_empty());
    assert_eq!(turn_gauges(&app).await, (Some(0), Some(0)));
    let r = call(
        &app,
        Method::DELETE,
        &format!("/api/memory/turns/{bob_id}"),
        "tok-bob",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(facts(&app, "tok-bob").await.is_empty());
    // The journal on disk agrees.
    let left = deermem_storage_file::FileTurnJournal::read_items(tmp.path()).expect("read");
    assert!(left.is_empty(), "{left:?}");
    backend.manager().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_turn_counts_and_cannot_be_retried() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = Arc::new(SwitchModel::default());
    // A debounce of five minutes: the turn stays queued, pending, for the whole test.
    let (backend, app) = served(tmp.path(), Arc::clone(&model), true, 300);
    post_turn(&app, "tok-alice", "thread-1").await;
    let items = list(&app, "tok-alice").await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["state"], "pending");
    assert_eq!(items[0]["attempts"], 0);
    assert_eq!(turn_gauges(&app).await, (Some(1), Some(0)));
    let id = items[0]["id"].as_str().expect("id").to_owned();
    let r = call(
        &app,
        Method::POST,
        &format!("/api/memory/turns/{id}/retry"),
        "tok-alice",
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.detail().contains("pending, not dead"), "{}", r.text);
    assert_eq!(model.calls.load(Ordering::SeqCst), 0);
    backend.manager().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_durable_journal_the_routes_answer_501_and_the_gauges_are_absent() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = Arc::new(SwitchModel::default());
    let (backend, app) = served(tmp.path(), model, false, 1);
    assert!(backend.deermem().expect("engine").turn_admin().is_none());
    for (method, uri) in [
        (Method::GET, "/api/memory/turns".to_owned()),
        (Method::POST, "/api/memory/turns/turn_x/retry".to_owned()),
        (Method::DELETE, "/api/memory/turns/turn_x".to_owned()),
    ] {
        let r = call(&app, method.clone(), &uri, "tok-alice").await;
        assert_eq!(
            r.status,
            StatusCode::NOT_IMPLEMENTED,
            "{method} {uri}: {}",
            r.text
        );
        assert!(
            r.detail().starts_with("The turn journal is not in use"),
            "{}",
            r.text
        );
    }
    let text = scrape(&app).await;
    assert!(!text.contains("deermem_turns_"), "{text}");
    assert!(text.ends_with("# EOF\n"));
    backend.manager().close().await;
}

/// A journal whose every call fails.
#[derive(Debug)]
struct Broken;

fn broken() -> TurnJournalError {
    TurnJournalError::Unavailable {
        message: "disk gone".into(),
        source: None,
    }
}

#[async_trait]
impl TurnJournal for Broken {
    async fn append(&self, _: NewTurn) -> Result<TurnItem, TurnJournalError> {
        Err(broken())
    }
    async fn complete(&self, _: &TurnId) -> Result<bool, TurnJournalError> {
        Err(broken())
    }
    async fn record_failure(
        &self,
        _: &TurnId,
        _: &str,
        _: Timestamp,
    ) -> Result<Option<TurnItem>, TurnJournalError> {
        Err(broken())
    }
    async fn dead_letter(&self, _: &TurnId, _: &str) -> Result<bool, TurnJournalError> {
        Err(broken())
    }
    async fn retry(&self, _: &TurnId) -> Result<Option<TurnItem>, TurnJournalError> {
        Err(broken())
    }
    async fn drop_turn(&self, _: &TurnId) -> Result<bool, TurnJournalError> {
        Err(broken())
    }
    async fn list(&self, _: &TurnFilter) -> Result<Vec<TurnItem>, TurnJournalError> {
        Err(broken())
    }
    async fn counts(&self) -> Result<TurnCounts, TurnJournalError> {
        Err(broken())
    }
    async fn claim(&self, _: &ClaimRequest) -> Result<Vec<TurnItem>, TurnJournalError> {
        Err(broken())
    }
    async fn release(&self, _: &TurnId, _: &str) -> Result<(), TurnJournalError> {
        Err(broken())
    }
}

#[tokio::test]
async fn a_failing_journal_leaves_the_gauges_out_and_the_routes_answer_500() {
    let admin: Arc<dyn TurnAdmin> = Arc::new(common::JournalOnly(Arc::new(Broken)));
    let app = router(
        ready_state(
            FakeManager::new(),
            MemoryConfig::default(),
            GatewayConfig::default(),
        )
        .with_turn_journal(admin),
    );
    let text = scrape(&app).await;
    assert!(!text.contains("deermem_turns_"), "{text}");
    assert!(text.contains("deermem_gateway_ready 1"), "{text}");
    let r = send(&app, empty(Method::GET, "/api/memory/turns")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text);
    assert_eq!(r.detail(), "Failed to read the turn journal.");
    assert!(
        !r.text.contains("disk gone"),
        "the cause leaked: {}",
        r.text
    );
}
