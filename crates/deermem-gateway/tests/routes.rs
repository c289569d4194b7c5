//! Route tests: every route of the reference's memory router and the extensions against the
//! recording manager (asserting the exact manager calls), the reference's router tests, the
//! error mapping table on every route, and the 501 paths against `deermem::NoopManager` and a
//! tier-1-only backend.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use deermem_core::ports::{FactAdmin, MemoryAdmin, MemoryReader, MemoryReload, MemorySearch};
use std::sync::Arc;

use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use common::{Call, FakeManager, app, empty, json_req, ready_state, send};
use deermem::NoopManager;
use deermem_core::ports::{AddRequest, ContextRequest, MemoryManager};
use deermem_core::{InvalidInputCode, ManagerError, MemoryConfig, MemoryMode};
use deermem_gateway::{ContextObserver, ContextServed, GatewayConfig, ObserverError, router};
use parking_lot::Mutex;
use serde_json::{Value, json};

fn default_user() -> Option<String> {
    Some("default".into())
}

// ----------------------------------------------------------------------------------------
// The reference router's routes.

#[tokio::test]
async fn get_memory_returns_the_document_for_the_caller() {
    let m = FakeManager::new();
    m.set_summary("default", "Writes Rust");
    let a = app(m.clone());
    let r = send(&a, empty(Method::GET, "/api/memory")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        m.calls(),
        vec![Call::GetMemory {
            user: default_user(),
            agent: None
        }]
    );
    assert_eq!(r.body["version"], "2.0");
    assert_eq!(r.body["revision"], 1);
    assert_eq!(r.body["user"]["workContext"]["summary"], "Writes Rust");
    assert_eq!(
        r.body["history"]["recentMonths"],
        json!({"summary": "", "updatedAt": ""})
    );
    assert_eq!(r.body["facts"], json!([]));
}

#[tokio::test]
async fn reload_calls_reload_memory() {
    let m = FakeManager::new();
    let r = send(&app(m.clone()), empty(Method::POST, "/api/memory/reload")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        m.calls(),
        vec![Call::Reload {
            user: default_user(),
            agent: None
        }]
    );
}

#[tokio::test]
async fn reload_falls_back_to_get_memory_when_unsupported() {
    let m = FakeManager::new();
    m.fail("reload_memory", || {
        ManagerError::unsupported("reload memory", "FakeMemoryManager")
    });
    let r = send(&app(m.clone()), empty(Method::POST, "/api/memory/reload")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        m.calls(),
        vec![
            Call::Reload {
                user: default_user(),
                agent: None
            },
            Call::GetMemory {
                user: default_user(),
                agent: None
            }
        ]
    );
}

#[tokio::test]
async fn reload_is_501_only_when_reading_is_also_unsupported() {
    let m = FakeManager::new();
    m.fail("reload_memory", || {
        ManagerError::unsupported("reload memory", "FakeMemoryManager")
    });
    m.fail("get_memory", || {
        ManagerError::unsupported("get memory", "FakeMemoryManager")
    });
    let r = send(&app(m), empty(Method::POST, "/api/memory/reload")).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(
        r.detail(),
        "Operation 'reload memory' not supported by memory backend 'FakeMemoryManager'."
    );
}

#[tokio::test]
async fn reload_does_not_fall_back_on_other_errors() {
    let m = FakeManager::new();
    m.fail("reload_memory", || ManagerError::corruption("x"));
    let r = send(&app(m.clone()), empty(Method::POST, "/api/memory/reload")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(m.calls().len(), 1);
}

#[tokio::test]
async fn clear_without_agent_clears_everything_and_returns_the_document() {
    let m = FakeManager::new();
    let a = app(m.clone());
    send(
        &a,
        json_req(Method::POST, "/api/memory/facts", &json!({"content": "a"})),
    )
    .await;
    m.clear_calls();
    let r = send(&a, empty(Method::DELETE, "/api/memory")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["facts"], json!([]));
    assert_eq!(
        m.calls(),
        vec![Call::Clear {
            user: default_user(),
            agent: None
        }]
    );
}

#[tokio::test]
async fn create_fact_passes_defaults_and_returns_the_whole_document() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Likes tea"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        m.calls(),
        vec![Call::CreateFact {
            user: default_user(),
            agent: None,
            content: "Likes tea".into(),
            category: "context".into(),
            confidence: 0.5
        }]
    );
    assert!(
        r.body.get("version").is_some() && r.body.get("user").is_some(),
        "whole document: {}",
        r.text
    );
    let fact = &r.body["facts"][0];
    assert_eq!(fact["content"], "Likes tea");
    assert_eq!(fact["source"], "manual");
    assert!(
        fact.get("title").is_none() && fact.get("confirmationCount").is_none(),
        "{fact}"
    );
    assert!(
        fact.get("sourceError").is_none(),
        "None fields are omitted: {fact}"
    );
}

#[tokio::test]
async fn create_fact_evicted_by_capacity_is_409() {
    let m = FakeManager::new();
    m.evict_new_facts
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let r = send(
        &app(m),
        json_req(Method::POST, "/api/memory/facts", &json!({"content": "x"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        r.detail(),
        "Fact was not stored because the configured memory.max_facts capacity policy evicted it"
    );
}

#[tokio::test]
async fn patch_with_only_content_passes_none_for_the_other_fields() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let created = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "old", "category": "goal", "confidence": 0.8}),
        ),
    )
    .await;
    let id = common::fact_ids(&created.body)[0].clone();
    m.clear_calls();
    let r = send(
        &a,
        json_req(
            Method::PATCH,
            &format!("/api/memory/facts/{id}"),
            &json!({"content": "new"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        m.calls(),
        vec![Call::UpdateFact {
            user: default_user(),
            agent: None,
            fact_id: id.clone(),
            content: Some("new".into()),
            category: None,
            confidence: None
        }]
    );
    assert_eq!(r.body["facts"][0]["category"], "goal");
    // `{}` is a valid no-op patch; explicit nulls mean "keep" too.
    m.clear_calls();
    let r = send(
        &a,
        json_req(
            Method::PATCH,
            &format!("/api/memory/facts/{id}"),
            &json!({"category": null}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(matches!(
        &m.calls()[0],
        Call::UpdateFact {
            content: None,
            category: None,
            confidence: None,
            ..
        }
    ));
}

#[tokio::test]
async fn delete_fact_returns_the_document() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let created = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "gone soon"}),
        ),
    )
    .await;
    let id = common::fact_ids(&created.body)[0].clone();
    m.clear_calls();
    let r = send(
        &a,
        empty(Method::DELETE, &format!("/api/memory/facts/{id}")),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["facts"], json!([]));
    assert_eq!(
        m.calls(),
        vec![Call::DeleteFact {
            user: default_user(),
            agent: None,
            fact_id: id
        }]
    );
}

#[tokio::test]
async fn export_reads_with_get_memory_and_keeps_source_error() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let doc = json!({"facts": [{"id": "fact_fix", "content": "Uses Postgres, not MySQL", "category": "correction",
                                 "sourceError": "Said MySQL", "source": "thread-9"}]});
    assert_eq!(
        send(&a, json_req(Method::POST, "/api/memory/import", &doc))
            .await
            .status,
        StatusCode::OK
    );
    m.clear_calls();
    let r = send(&a, empty(Method::GET, "/api/memory/export")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        m.calls(),
        vec![Call::GetMemory {
            user: default_user(),
            agent: None
        }],
        "export uses get_memory"
    );
    assert_eq!(r.body["facts"][0]["sourceError"], "Said MySQL");
    assert_eq!(r.body["facts"][0]["source"], "thread-9");
}

#[tokio::test]
async fn import_passes_the_validated_document_and_returns_the_result() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let doc = json!({"version": "2.0", "unknown": true, "user": {"workContext": {"summary": "Rust"}},
                     "facts": [{"id": "fact_gateway_import", "content": "Imported", "sourceError": "was wrong",
                                "source": {"type": "conversation", "threadId": "t-1"}, "title": "dropped"}]});
    let r = send(&a, json_req(Method::POST, "/api/memory/import", &doc)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        m.calls(),
        vec![Call::Import {
            user: default_user(),
            agent: None,
            fact_ids: vec!["fact_gateway_import".into()]
        }]
    );
    assert_eq!(
        common::fact_ids(&r.body),
        vec!["fact_gateway_import".to_owned()]
    );
    assert_eq!(r.body["facts"][0]["sourceError"], "was wrong");
    assert_eq!(
        r.body["facts"][0]["source"], "t-1",
        "source objects are projected to strings"
    );
    assert_eq!(r.body["user"]["workContext"]["summary"], "Rust");
}

#[tokio::test]
async fn import_schema_errors_are_422_and_never_reach_the_manager() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/import",
            &json!({"facts": [{"id": "fact_no_content"}]}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        r.body["detail"][0]["loc"],
        json!(["body", "facts", 0, "content"])
    );
    assert_eq!(r.body["detail"][0]["type"], "missing");
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn config_echoes_the_memory_section_with_secrets_redacted() {
    let m = FakeManager::new();
    let backend_config = json!({
        "storage_path": "/data/mem", "max_facts": 50,
        "model": {"model": "gpt-x", "api_key": "sk-live-SECRET", "base_url": "http://llm"},
        "honcho": {"api_key": "hk-SECRET", "workspace_token": "wt-SECRET"}
    });
    let memory = MemoryConfig {
        backend_config: backend_config.as_object().cloned().unwrap_or_default(),
        ..MemoryConfig::default()
    };
    let a = router(ready_state(m.clone(), memory, GatewayConfig::default()));
    let r = send(&a, empty(Method::GET, "/api/memory/config")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(m.calls().is_empty(), "config does not call the manager");
    assert_eq!(r.body["enabled"], true);
    assert_eq!(r.body["mode"], "middleware");
    assert_eq!(r.body["injection_enabled"], true);
    assert_eq!(r.body["shutdown_flush_timeout_seconds"], 30.0);
    assert_eq!(r.body["manager_class"], "deermem");
    assert_eq!(r.body["backend_config"]["storage_path"], "/data/mem");
    assert_eq!(r.body["backend_config"]["model"]["api_key"], "***");
    assert_eq!(r.body["backend_config"]["model"]["model"], "gpt-x");
    assert!(!r.text.contains("SECRET"), "{}", r.text);
    let s = send(&a, empty(Method::GET, "/api/memory/status")).await;
    assert_eq!(s.status, StatusCode::OK);
    assert!(!s.text.contains("SECRET"), "{}", s.text);
    assert_eq!(s.body["config"], r.body);
    assert_eq!(s.body["data"]["facts"], json!([]));
    assert_eq!(
        m.calls(),
        vec![Call::GetMemory {
            user: default_user(),
            agent: None
        }]
    );
}

#[tokio::test]
async fn config_and_status_show_only_the_backends_own_settings() {
    let m = FakeManager::new();
    let backend_config = json!({
        "max_facts": 50,
        "api-key": "dash-SECRET",
        "access_key_id": "AKIA-SECRET",
        "bearer": "bearer-SECRET",
        "my_llm_credential": "cred-SECRET",
        "apiKey": "camel-SECRET",
        "model": {"model": "gpt-x", "base_url": "http://svcuser:PASSWORD-SECRET@llm.internal/v1?key=q-SECRET",
                  "api_key": "sk-SECRET", "bearer": "nested-SECRET"},
        "base_url": "https://ov-user:ov-SECRET@openviking:1933",
        "postgres": {"url": "postgres://pg-user:pg-SECRET@db.internal/mem", "pool_size": 4},
    });
    let memory = MemoryConfig {
        backend_config: backend_config.as_object().cloned().unwrap_or_default(),
        ..MemoryConfig::default()
    };
    let a = router(ready_state(m.clone(), memory, GatewayConfig::default()));
    let r = send(&a, empty(Method::GET, "/api/memory/config")).await;
    assert_eq!(r.status, StatusCode::OK);
    let shown = &r.body["backend_config"];
    // DeerMem's settings type: its keys with their values or defaults, nothing else.
    assert_eq!(shown["max_facts"], 50);
    assert_eq!(shown["debounce_seconds"], 30, "defaults are shown");
    assert_eq!(
        (
            &shown["model"]["model"],
            &shown["model"]["api_key"],
            &shown["model"]["base_url"]
        ),
        (
            &json!("gpt-x"),
            &json!("***"),
            &json!("http://llm.internal/v1")
        )
    );
    for key in [
        "api-key",
        "access_key_id",
        "bearer",
        "my_llm_credential",
        "apiKey",
        "base_url",
    ] {
        assert!(shown.get(key).is_none(), "{key} shown: {shown}");
    }
    assert!(shown["model"].get("bearer").is_none(), "{shown}");
    // The PostgreSQL section is its adapter's to show (the URL as "***"), or not shown at all
    // in a build without that adapter.
    let pg = &shown["postgres"];
    assert!(pg["url"] == "***" || pg.get("not_shown").is_some(), "{pg}");
    let s = send(&a, empty(Method::GET, "/api/memory/status")).await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.body["config"], r.body);
    for text in [&r.text, &s.text] {
        assert!(
            !text.contains("SECRET")
                && !text.contains("svcuser")
                && !text.contains("ov-user")
                && !text.contains("pg-user")
                && !text.contains("db.internal"),
            "{text}"
        );
    }
}

/// Each `manager_class` shows its own settings type, and one this build cannot show (not
/// compiled in, unknown, or a configuration that does not parse, as the gateway may still
/// answer `/api/memory/config` with memory disabled) shows only a fixed reason.
#[tokio::test]
async fn config_shows_each_manager_class_without_secrets() {
    let secret_keys = json!({
        "api_key": "sk-SECRET", "my_llm_credential": "cred-SECRET",
        "base_url": "https://svcuser:PASSWORD-SECRET@remote.internal/v1?key=q-SECRET",
        "owner_user_id": "alice",
    });
    for class in [
        "deermem",
        "honcho",
        "openviking",
        "noop",
        "pkg.module:Manager",
    ] {
        for enabled in [true, false] {
            let memory = MemoryConfig {
                enabled,
                manager_class: class.into(),
                backend_config: secret_keys.as_object().cloned().unwrap_or_default(),
                ..MemoryConfig::default()
            };
            let a = router(ready_state(
                FakeManager::new(),
                memory,
                GatewayConfig::default(),
            ));
            let r = send(&a, empty(Method::GET, "/api/memory/config")).await;
            assert_eq!(r.status, StatusCode::OK, "{class}");
            assert!(
                !r.text.contains("SECRET") && !r.text.contains("svcuser"),
                "{class}: {}",
                r.text
            );
            let shown = &r.body["backend_config"];
            assert!(shown.get("my_llm_credential").is_none(), "{class}: {shown}");
            match class {
                "noop" => assert_eq!(shown, &json!({}), "noop reads no key"),
                "pkg.module:Manager" => assert_eq!(
                    shown,
                    &json!({"not_shown": "memory.manager_class names no known backend"})
                ),
                // OpenViking refuses the unknown keys: nothing but the reason.
                "openviking" => assert_eq!(
                    shown
                        .as_object()
                        .map(|o| o.keys().cloned().collect::<Vec<_>>()),
                    Some(vec!["not_shown".to_owned()]),
                    "{shown}"
                ),
                // Shown by its type (`api_key` as "***", the URL without credentials), or,
                // in a build without the adapter, not shown.
                _ => assert!(
                    shown.get("not_shown").is_some()
                        || (shown["api_key"] == "***"
                            && shown["base_url"] == "https://remote.internal/v1")
                        || (class == "deermem" && shown.get("api_key").is_none()),
                    "{class}: {shown}"
                ),
            }
        }
    }
}

// ----------------------------------------------------------------------------------------
// The `agent` parameter on every memory route.

#[tokio::test]
async fn agent_parameter_reaches_every_memory_route_canonicalised() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let created = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts?agent=Coder",
            &json!({"content": "c"}),
        ),
    )
    .await;
    let id = common::fact_ids(&created.body)[0].clone();
    let requests = vec![
        empty(Method::GET, "/api/memory?agent=Coder"),
        empty(Method::POST, "/api/memory/reload?agent=Coder"),
        json_req(
            Method::PATCH,
            &format!("/api/memory/facts/{id}?agent=Coder"),
            &json!({"content": "d"}),
        ),
        empty(Method::GET, "/api/memory/export?agent=Coder"),
        empty(
            Method::DELETE,
            &format!("/api/memory/facts/{id}?agent=Coder"),
        ),
        json_req(
            Method::POST,
            "/api/memory/import?agent=Coder",
            &json!({"facts": []}),
        ),
        empty(Method::GET, "/api/memory/status?agent=Coder"),
        json_req(
            Method::POST,
            "/api/memory/messages?agent=Coder",
            &json!({"thread_id": "t", "messages": []}),
        ),
        empty(Method::GET, "/api/memory/context?agent=Coder"),
        empty(Method::GET, "/api/memory/search?q=x&agent=Coder"),
        empty(Method::DELETE, "/api/memory?agent=Coder"),
    ];
    for r in requests {
        let uri = r.uri().to_string();
        let resp = send(&a, r).await;
        assert!(
            resp.status.is_success(),
            "{uri}: {} {}",
            resp.status,
            resp.text
        );
    }
    let calls = m.calls();
    assert_eq!(calls.len(), 12);
    for c in &calls {
        let agent = match c {
            Call::Add { agent, .. }
            | Call::GetContext { agent, .. }
            | Call::Search { agent, .. }
            | Call::GetMemory { agent, .. }
            | Call::Reload { agent, .. }
            | Call::Clear { agent, .. }
            | Call::Import { agent, .. }
            | Call::CreateFact { agent, .. }
            | Call::UpdateFact { agent, .. }
            | Call::DeleteFact { agent, .. } => agent.clone(),
            other => panic!("unexpected call {other:?}"),
        };
        assert_eq!(agent.as_deref(), Some("coder"), "{c:?}");
    }
}

#[tokio::test]
async fn explicit_default_agent_is_the_default_bucket_only() {
    let m = FakeManager::new();
    let r = send(
        &app(m.clone()),
        empty(Method::DELETE, "/api/memory?agent=__default__"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        m.calls(),
        vec![Call::Clear {
            user: default_user(),
            agent: Some("__default__".into())
        }]
    );
}

// ----------------------------------------------------------------------------------------
// Extensions.

#[tokio::test]
async fn messages_are_queued_with_202() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let body = json!({"thread_id": "thread-1", "agent": "Researcher", "trace_id": "trace-7", "messages": [
        {"role": "user", "content": "I moved to Porto."},
        {"type": "ai", "content": "Noted."},
        {"type": "human", "data": {"content": "dumped form"}}
    ]});
    let r = send(&a, json_req(Method::POST, "/api/memory/messages", &body)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.body, json!({"status": "accepted"}));
    assert_eq!(
        m.calls(),
        vec![Call::Add {
            thread_id: "thread-1".into(),
            user: default_user(),
            agent: Some("researcher".into()),
            messages: 3,
            trace_id: Some("trace-7".into())
        }]
    );
    let r = send(
        &a,
        json_req(Method::POST, "/api/memory/messages?agent=other", &body),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "conflicting agents: {}",
        r.text
    );
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/messages",
            &json!({"thread_id": "t", "messages": [{"content": "no role"}]}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["detail"][0]["loc"], json!(["body", "messages", 0]));
    assert_eq!(m.calls().len(), 1, "invalid bodies never reach the manager");
}

#[derive(Debug, Default)]
struct RecordingObserver(Mutex<Vec<Served>>);

/// (user, agent, thread, run, sha256) of one served block.
type Served = (String, Option<String>, String, String, String);

#[async_trait]
impl ContextObserver for RecordingObserver {
    async fn context_served(&self, e: &ContextServed) -> Result<(), ObserverError> {
        self.0.lock().push((
            e.user.as_str().to_owned(),
            e.agent.as_ref().map(|a| a.as_str().to_owned()),
            e.thread_id.clone(),
            e.run_id.clone(),
            e.content_sha256.clone(),
        ));
        Ok(())
    }
}

#[tokio::test]
async fn context_returns_the_wrapped_block_and_its_hash() {
    let m = FakeManager::new();
    m.set_context_body("User Context:\n- Work: Rust");
    let observer = Arc::new(RecordingObserver::default());
    let state = ready_state(m.clone(), MemoryConfig::default(), GatewayConfig::default())
        .with_context_observer(observer.clone());
    let a = router(state);
    let r = send(
        &a,
        empty(
            Method::GET,
            "/api/memory/context?agent=coder&thread_id=t-1&run_id=r-1",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let block = "<memory>\nUser Context:\n- Work: Rust\n</memory>\n";
    assert_eq!(r.body["context"], block);
    let sha = deermem_core::ports::wrap_memory_block("User Context:\n- Work: Rust").content_sha256;
    assert_eq!(r.body["content_sha256"].as_str(), sha.as_deref());
    assert_eq!(
        m.calls(),
        vec![Call::GetContext {
            user: default_user(),
            agent: Some("coder".into()),
            thread_id: Some("t-1".into())
        }]
    );
    assert_eq!(
        observer.0.lock().clone(),
        vec![(
            "default".into(),
            Some("coder".into()),
            "t-1".into(),
            "r-1".into(),
            sha.unwrap_or_default()
        )]
    );
    // Without a run id nothing is recorded; a run id without a thread is refused.
    send(&a, empty(Method::GET, "/api/memory/context?thread_id=t-1")).await;
    assert_eq!(observer.0.lock().len(), 1);
    let r = send(&a, empty(Method::GET, "/api/memory/context?run_id=r-1")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    // An empty body gives an empty block and no hash.
    m.set_context_body("  ");
    let r = send(&a, empty(Method::GET, "/api/memory/context")).await;
    assert_eq!(r.body, json!({"context": "", "content_sha256": null}));
}

#[tokio::test]
async fn context_is_empty_without_calling_the_manager_when_injection_is_disabled() {
    let m = FakeManager::new();
    let memory = MemoryConfig {
        injection_enabled: false,
        ..MemoryConfig::default()
    };
    let a = router(ready_state(m.clone(), memory, GatewayConfig::default()));
    let r = send(&a, empty(Method::GET, "/api/memory/context")).await;
    assert_eq!(r.body, json!({"context": "", "content_sha256": null}));
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn search_forwards_query_top_k_and_category() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let r = send(&a, empty(Method::GET, "/api/memory/search?q=tea%20time")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, json!({"results": [], "count": 0}));
    let r = send(
        &a,
        empty(
            Method::GET,
            "/api/memory/search?q=tea&top_k=10&category=preference",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        m.calls(),
        vec![
            Call::Search {
                query: "tea time".into(),
                top_k: 5,
                user: default_user(),
                agent: None,
                category: None
            },
            Call::Search {
                query: "tea".into(),
                top_k: 10,
                user: default_user(),
                agent: None,
                category: Some("preference".into())
            },
        ]
    );
}

#[tokio::test]
async fn search_hits_are_http_facts_with_score_and_match_type() {
    let m = FakeManager::new();
    let a = app(m.clone());
    send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Drinks green tea"}),
        ),
    )
    .await;
    let r = send(&a, empty(Method::GET, "/api/memory/search?q=tea")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["count"], 1);
    let hit = &r.body["results"][0];
    assert_eq!(hit["content"], "Drinks green tea");
    assert_eq!(
        hit["matchType"], "remote",
        "the port's default for backends without scores"
    );
    assert_eq!(hit["score"], Value::Null);
    assert!(
        hit.get("title").is_none() && hit.get("confirmationCount").is_none(),
        "{hit}"
    );
}

#[tokio::test]
async fn search_query_validation_is_422() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let cases = [
        ("/api/memory/search", "missing", json!(["query", "q"])),
        (
            "/api/memory/search?q=x&top_k=abc",
            "int_parsing",
            json!(["query", "top_k"]),
        ),
        (
            "/api/memory/search?q=x&top_k=0",
            "greater_than_equal",
            json!(["query", "top_k"]),
        ),
        (
            "/api/memory/search?q=x&top_k=101",
            "less_than_equal",
            json!(["query", "top_k"]),
        ),
        (
            "/api/memory/search?q=x&mode=semantic",
            "value_error",
            json!(["query", "mode"]),
        ),
    ];
    for (uri, kind, loc) in cases {
        let r = send(&a, empty(Method::GET, uri)).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{uri}");
        assert_eq!(r.body["detail"][0]["type"], kind, "{uri}: {}", r.text);
        assert_eq!(r.body["detail"][0]["loc"], loc, "{uri}");
    }
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn index_rebuild_reports_the_warm_outcome() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let r = send(&a, empty(Method::POST, "/api/memory/index/rebuild")).await;
    assert_eq!(
        (r.status, r.body.clone()),
        (StatusCode::OK, json!({"status": "ok", "warmed": true}))
    );
    m.set_warm_result(None);
    let r = send(&a, empty(Method::POST, "/api/memory/index/rebuild")).await;
    assert_eq!(r.body, json!({"status": "nothing_to_warm", "warmed": null}));
    m.set_warm_result(Some(false));
    let r = send(&a, empty(Method::POST, "/api/memory/index/rebuild")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(m.calls(), vec![Call::Warm, Call::Warm, Call::Warm]);
}

#[tokio::test]
async fn a_second_rebuild_while_one_runs_is_409() {
    let m = FakeManager::new();
    let gate = m.pause("warm");
    let a = app(m.clone());
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, empty(Method::POST, "/api/memory/index/rebuild")).await }
    });
    gate.entered.notified().await;
    let second = send(&a, empty(Method::POST, "/api/memory/index/rebuild")).await;
    assert_eq!(second.status, StatusCode::CONFLICT);
    gate.open();
    let first = first.await.expect("first request");
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(m.calls(), vec![Call::Warm]);
}

// ----------------------------------------------------------------------------------------
// Error mapping, on every route that calls the manager.

fn routes_calling(op: &str, fact_id: &str) -> Vec<(Method, String, Option<Value>)> {
    let f = |m: Method, p: &str, b: Option<Value>| (m, p.to_owned(), b);
    match op {
        "get_memory" => vec![
            f(Method::GET, "/api/memory", None),
            f(Method::GET, "/api/memory/export", None),
            f(Method::GET, "/api/memory/status", None),
        ],
        "reload_memory" => vec![f(Method::POST, "/api/memory/reload", None)],
        "clear_memory" => vec![f(Method::DELETE, "/api/memory", None)],
        "create_fact" => vec![f(
            Method::POST,
            "/api/memory/facts",
            Some(json!({"content": "x"})),
        )],
        "update_fact" => vec![f(
            Method::PATCH,
            &format!("/api/memory/facts/{fact_id}"),
            Some(json!({"content": "x"})),
        )],
        "delete_fact" => vec![f(
            Method::DELETE,
            &format!("/api/memory/facts/{fact_id}"),
            None,
        )],
        "import_memory" => vec![f(
            Method::POST,
            "/api/memory/import",
            Some(json!({"facts": []})),
        )],
        "add" => vec![f(
            Method::POST,
            "/api/memory/messages",
            Some(json!({"thread_id": "t", "messages": []})),
        )],
        "get_context" => vec![f(Method::GET, "/api/memory/context", None)],
        "search" => vec![f(Method::GET, "/api/memory/search?q=x", None)],
        other => panic!("no route for {other}"),
    }
}

fn request(m: Method, uri: &str, body: Option<&Value>) -> axum::http::Request<axum::body::Body> {
    match body {
        Some(b) => json_req(m, uri, b),
        None => empty(m, uri),
    }
}

#[tokio::test]
async fn manager_errors_map_to_the_reference_statuses_on_every_route() {
    const OPS: [&str; 10] = [
        "get_memory",
        "reload_memory",
        "clear_memory",
        "create_fact",
        "update_fact",
        "delete_fact",
        "import_memory",
        "add",
        "get_context",
        "search",
    ];
    type Case = (fn() -> ManagerError, u16, Option<&'static str>);
    let cases: Vec<Case> = vec![
        (
            || ManagerError::conflict("private"),
            409,
            Some("Memory changed concurrently; reload and retry."),
        ),
        (
            || ManagerError::corruption("private"),
            500,
            Some("Stored memory data is corrupted."),
        ),
        (
            || ManagerError::invalid(InvalidInputCode::Confidence, "confidence"),
            400,
            Some("Invalid confidence value; must be between 0 and 1."),
        ),
        (
            || ManagerError::invalid(InvalidInputCode::AgentName, "agent_name"),
            400,
            Some(
                "An agent name is required for fact operations; user-global memory stores summaries only.",
            ),
        ),
        (
            || ManagerError::invalid(InvalidInputCode::DuplicateFact, "Duplicate fact"),
            409,
            Some("A fact with the same content already exists."),
        ),
        (
            || ManagerError::invalid(InvalidInputCode::Content, "content"),
            400,
            Some("Memory fact content cannot be empty."),
        ),
        (
            || {
                ManagerError::invalid(
                    InvalidInputCode::Other,
                    "manifest_filename must be a plain name",
                )
            },
            400,
            Some("Invalid input: manifest_filename must be a plain name"),
        ),
        (
            || ManagerError::invalid(InvalidInputCode::FactId, "bad id"),
            400,
            Some("Invalid fact id: bad id"),
        ),
        (|| ManagerError::unavailable("private"), 503, None),
        (|| ManagerError::timeout("private"), 504, None),
        (|| ManagerError::backend("private"), 500, None),
    ];
    for op in OPS {
        for (make, status, detail) in &cases {
            let m = FakeManager::new();
            m.fail(op, *make);
            // reload falls back only on Unsupported: script both so the route surfaces it.
            let a = app(m.clone());
            if op == "update_fact" {
                // The fact exists: a patch of a missing fact is a 404 whatever its values.
                let seed = json!({"facts": [{"id": "fact_x", "content": "x"}]});
                let r = send(&a, json_req(Method::POST, "/api/memory/import", &seed)).await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            }
            for (method, uri, body) in routes_calling(op, "fact_x") {
                let r = send(&a, request(method.clone(), &uri, body.as_ref())).await;
                assert_eq!(
                    r.status.as_u16(),
                    *status,
                    "{op} {method} {uri}: {}",
                    r.text
                );
                if let Some(d) = detail {
                    assert_eq!(r.detail(), *d, "{op} {method} {uri}");
                }
                assert!(
                    !r.text.contains("private"),
                    "private detail leaked: {}",
                    r.text
                );
            }
        }
    }
}

#[tokio::test]
async fn not_found_maps_to_404_with_the_fact_id() {
    for op in ["update_fact", "delete_fact"] {
        let m = FakeManager::new();
        let a = app(m);
        for (method, uri, body) in routes_calling(op, "fact_missing") {
            let r = send(&a, request(method, &uri, body.as_ref())).await;
            assert_eq!(r.status, StatusCode::NOT_FOUND);
            assert_eq!(r.detail(), "Memory fact 'fact_missing' not found.");
        }
    }
}

#[tokio::test]
async fn storage_failures_give_the_reference_messages() {
    let expected = [
        ("clear_memory", "Failed to clear memory data."),
        ("create_fact", "Failed to create memory fact."),
        ("delete_fact", "Failed to delete memory fact."),
        ("update_fact", "Failed to update memory fact."),
        ("import_memory", "Failed to import memory data."),
        ("get_memory", "Failed to read memory data."),
    ];
    for (op, detail) in expected {
        let m = FakeManager::new();
        m.fail(op, || ManagerError::storage("disk full at /private/path"));
        let a = app(m);
        for (method, uri, body) in routes_calling(op, "fact_x") {
            let r = send(&a, request(method, &uri, body.as_ref())).await;
            assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{op}");
            assert_eq!(r.detail(), detail, "{op}");
        }
    }
}

#[tokio::test]
async fn unsupported_operations_name_the_route_label() {
    let labels = [
        (
            "get_memory",
            vec!["get memory", "export memory", "get memory status"],
        ),
        ("clear_memory", vec!["clear memory"]),
        ("create_fact", vec!["create fact"]),
        ("update_fact", vec!["update fact"]),
        ("delete_fact", vec!["delete fact"]),
        ("import_memory", vec!["import memory"]),
        ("search", vec!["search memory"]),
    ];
    for (op, route_labels) in labels {
        let m = FakeManager::new();
        m.fail(op, || ManagerError::unsupported("x", "FakeMemoryManager"));
        let a = app(m);
        for ((method, uri, body), label) in
            routes_calling(op, "fact_x").into_iter().zip(route_labels)
        {
            let r = send(&a, request(method, &uri, body.as_ref())).await;
            assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{uri}");
            assert_eq!(
                r.detail(),
                format!("Operation '{label}' not supported by memory backend 'FakeMemoryManager'.")
            );
        }
    }
}

// ----------------------------------------------------------------------------------------
// Request validation (FastAPI/pydantic style 422).

#[tokio::test]
async fn fact_bodies_are_validated_before_the_manager_is_called() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let cases = [
        (
            Method::POST,
            "/api/memory/facts",
            json!({}),
            "missing",
            json!(["body", "content"]),
        ),
        (
            Method::POST,
            "/api/memory/facts",
            json!({"content": ""}),
            "string_too_short",
            json!(["body", "content"]),
        ),
        (
            Method::POST,
            "/api/memory/facts",
            json!({"content": 7}),
            "string_type",
            json!(["body", "content"]),
        ),
        (
            Method::POST,
            "/api/memory/facts",
            json!({"content": "x", "confidence": 1.01}),
            "less_than_equal",
            json!(["body", "confidence"]),
        ),
        (
            Method::POST,
            "/api/memory/facts",
            json!({"content": "x", "confidence": -1}),
            "greater_than_equal",
            json!(["body", "confidence"]),
        ),
        (
            Method::POST,
            "/api/memory/facts",
            json!({"content": "x", "confidence": "high"}),
            "float_parsing",
            json!(["body", "confidence"]),
        ),
        (
            Method::POST,
            "/api/memory/facts",
            json!("just a string"),
            "model_attributes_type",
            json!(["body"]),
        ),
        (
            Method::PATCH,
            "/api/memory/facts/fact_a",
            json!({"confidence": 3}),
            "less_than_equal",
            json!(["body", "confidence"]),
        ),
        (
            Method::PATCH,
            "/api/memory/facts/fact_a",
            json!({"content": ""}),
            "string_too_short",
            json!(["body", "content"]),
        ),
    ];
    for (method, uri, body, kind, loc) in cases {
        let r = send(&a, json_req(method.clone(), uri, &body)).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method} {uri} {body}"
        );
        assert_eq!(r.body["detail"][0]["type"], kind, "{body}: {}", r.text);
        assert_eq!(r.body["detail"][0]["loc"], loc, "{body}");
        assert!(r.body["detail"][0]["msg"].is_string());
    }
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn malformed_missing_and_non_json_bodies_are_422() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let bad_json = common::req(Method::POST, "/api/memory/facts")
        .header("content-type", "application/json")
        .body(axum::body::Body::from("{\"content\": "))
        .expect("request");
    let r = send(&a, bad_json).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["detail"][0]["type"], "json_invalid");
    assert_eq!(r.body["detail"][0]["loc"][0], "body");
    let r = send(&a, empty(Method::POST, "/api/memory/facts")).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["detail"][0]["type"], "missing");
    assert_eq!(r.body["detail"][0]["loc"], json!(["body"]));
    // A simple cross-site form post (text/plain) is not decoded as JSON.
    let form = common::req(Method::POST, "/api/memory/facts")
        .header("content-type", "text/plain")
        .body(axum::body::Body::from("{\"content\": \"x\"}"))
        .expect("request");
    let r = send(&a, form).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["detail"][0]["type"], "model_attributes_type");
    // No content type at all: decoded as JSON, like FastAPI.
    let bare = common::req(Method::POST, "/api/memory/facts")
        .body(axum::body::Body::from("{\"content\": \"no content type\"}"))
        .expect("request");
    assert_eq!(send(&a, bare).await.status, StatusCode::OK);
    assert_eq!(m.calls().len(), 1);
}

// ----------------------------------------------------------------------------------------
// 501 paths: deermem::NoopManager and a tier-1-only backend.

#[tokio::test]
async fn noop_backend_answers_501_for_fact_crud_and_empty_reads() {
    let a = app(Arc::new(NoopManager::new(MemoryMode::Middleware)));
    for (method, uri, body, label) in [
        (
            Method::POST,
            "/api/memory/facts",
            Some(json!({"content": "x"})),
            "create fact",
        ),
        (
            Method::PATCH,
            "/api/memory/facts/fact_a",
            Some(json!({"content": "x"})),
            "update fact",
        ),
        (
            Method::DELETE,
            "/api/memory/facts/fact_a",
            None,
            "delete fact",
        ),
    ] {
        let r = send(&a, request(method, uri, body.as_ref())).await;
        assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{uri}");
        assert_eq!(
            r.detail(),
            format!("Operation '{label}' not supported by memory backend 'NoopMemoryManager'.")
        );
    }
    for uri in ["/api/memory", "/api/memory/export", "/api/memory/status"] {
        let r = send(&a, empty(Method::GET, uri)).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}");
    }
    let r = send(&a, empty(Method::POST, "/api/memory/reload")).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "reload falls back to get_memory: {}",
        r.text
    );
    assert_eq!(r.body["facts"], json!([]));
    let r = send(&a, empty(Method::GET, "/api/memory/search?q=x")).await;
    assert_eq!(r.body, json!({"results": [], "count": 0}));
    let r = send(&a, empty(Method::POST, "/api/memory/index/rebuild")).await;
    assert_eq!(r.body["status"], "nothing_to_warm");
    let r = send(&a, empty(Method::GET, "/api/memory/context")).await;
    assert_eq!(r.body, json!({"context": "", "content_sha256": null}));
}

/// A backend with only tier 1: every management route is 501.
#[derive(Debug)]
struct MinimalManager;

#[async_trait]
impl MemoryManager for MinimalManager {
    fn name(&self) -> &str {
        "MinimalManager"
    }

    fn mode(&self) -> MemoryMode {
        MemoryMode::Middleware
    }

    async fn add(&self, _r: AddRequest) -> Result<(), ManagerError> {
        Ok(())
    }

    async fn get_context(&self, _r: ContextRequest) -> Result<String, ManagerError> {
        Ok(String::new())
    }

    fn searcher(&self) -> Option<&dyn MemorySearch> {
        None
    }

    fn reader(&self) -> Option<&dyn MemoryReader> {
        None
    }

    fn admin(&self) -> Option<&dyn MemoryAdmin> {
        None
    }

    fn reloader(&self) -> Option<&dyn MemoryReload> {
        None
    }

    fn facts(&self) -> Option<&dyn FactAdmin> {
        None
    }
}

#[tokio::test]
async fn unsupported_backend_gives_501_on_every_management_route() {
    let a = app(Arc::new(MinimalManager));
    let cases = [
        (Method::GET, "/api/memory", None, "get memory"),
        (Method::GET, "/api/memory/export", None, "export memory"),
        (Method::GET, "/api/memory/status", None, "get memory status"),
        (Method::DELETE, "/api/memory", None, "clear memory"),
        (
            Method::POST,
            "/api/memory/import",
            Some(json!({"facts": []})),
            "import memory",
        ),
        (Method::POST, "/api/memory/reload", None, "reload memory"),
        (
            Method::POST,
            "/api/memory/facts",
            Some(json!({"content": "x"})),
            "create fact",
        ),
        (Method::GET, "/api/memory/search?q=x", None, "search memory"),
    ];
    for (method, uri, body, label) in cases {
        let r = send(&a, request(method, uri, body.as_ref())).await;
        assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{uri}");
        assert!(r.detail().contains("not supported"), "{uri}: {}", r.text);
        assert_eq!(
            r.detail(),
            format!("Operation '{label}' not supported by memory backend 'MinimalManager'.")
        );
    }
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/messages",
            &json!({"thread_id": "t", "messages": []}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "tier 1 works");
}
