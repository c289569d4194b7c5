//! Bounds against floods through the router: import documents with too many facts are refused
//! before they are built (422), bulk requests (import, export) are limited per user (429) and
//! for everyone (503) with `Retry-After`, and a backend that refuses a turn for its pending
//! bytes answers 429 / 503 with `Retry-After`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::{Call, FakeManager, empty, json_req, ready_state, send, with_bearer};
use deermem_core::{ManagerError, MemoryConfig, OverloadScope};
use deermem_gateway::{GatewayConfig, router};
use serde_json::json;

fn import_text(facts: usize) -> String {
    let items: Vec<String> = (0..facts)
        .map(|i| format!(r#"{{"id":"f{i}","content":"x"}}"#))
        .collect();
    format!(r#"{{"version":"2.0","facts":[{}]}}"#, items.join(","))
}

fn raw_post(uri: &str, text: String) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(text))
        .unwrap()
}

#[tokio::test]
async fn an_import_with_more_than_2000_facts_is_refused_before_the_backend() {
    let m = FakeManager::new();
    let a = common::app(m.clone());
    let r = send(&a, raw_post("/api/memory/import", import_text(2001))).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(
        r.body["detail"],
        json!([{
            "type": "too_long",
            "loc": ["body", "facts"],
            "msg": "List should have at most 2000 items after validation, not 2001",
            "ctx": {"field_type": "List", "max_length": 2000, "actual_length": 2001},
        }])
    );
    // A list cut off by a syntax error is counted as far as it goes.
    let mut cut = import_text(5000);
    cut.truncate(cut.len() - 10);
    let r = send(&a, raw_post("/api/memory/import", cut)).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["detail"][0]["type"], "too_long", "{}", r.text);
    assert!(m.calls().is_empty(), "{:?}", m.calls());
    // 2000 facts are imported.
    let r = send(&a, raw_post("/api/memory/import", import_text(2000))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        matches!(&m.calls()[..], [Call::Import { fact_ids, .. }] if fact_ids.len() == 2000),
        "{:?}",
        m.calls().len()
    );
}

/// Waits until the fake manager has recorded `n` calls.
async fn calls_reach(m: &FakeManager, n: usize) {
    for _ in 0..2000 {
        if m.calls().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("only {} calls: {:?}", m.calls().len(), m.calls());
}

fn assert_busy(r: &common::Resp, status: StatusCode, words: &str) {
    assert_eq!(r.status, status, "{}", r.text);
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1"),
        "{:?}",
        r.headers
    );
    assert!(r.detail().contains(words), "{}", r.text);
}

#[tokio::test]
async fn bulk_requests_are_limited_per_user_then_globally() {
    let m = FakeManager::new();
    let mut cfg =
        GatewayConfig::with_tokens([("tok-a", "alice"), ("tok-b", "bob"), ("tok-c", "carol")])
            .unwrap();
    cfg.max_bulk_requests_per_user = 1;
    cfg.max_bulk_requests = 2;
    let a = router(ready_state(m.clone(), MemoryConfig::default(), cfg));
    let gate = m.pause("import_memory");
    let doc = json!({"facts": [{"id": "f1", "content": "x"}]});
    // Alice and Bob each hold their one slot with an import that waits in the backend.
    let running: Vec<_> = ["tok-a", "tok-b"]
        .into_iter()
        .map(|t| {
            let (a, req) = (
                a.clone(),
                with_bearer(json_req(Method::POST, "/api/memory/import", &doc), t),
            );
            tokio::spawn(async move { send(&a, req).await })
        })
        .collect();
    calls_reach(&m, 2).await;
    // Alice's second bulk request: 429; its body is discarded, not decoded (an invalid body
    // is not reported).
    let bad_body = with_bearer(raw_post("/api/memory/import", "{not json".into()), "tok-a");
    assert_busy(
        &send(&a, bad_body).await,
        StatusCode::TOO_MANY_REQUESTS,
        "for this user",
    );
    let export = with_bearer(empty(Method::GET, "/api/memory/export"), "tok-a");
    assert_busy(
        &send(&a, export).await,
        StatusCode::TOO_MANY_REQUESTS,
        "for this user",
    );
    // Carol has no running request, but everyone's two slots are taken: 503.
    let export = with_bearer(empty(Method::GET, "/api/memory/export"), "tok-c");
    assert_busy(
        &send(&a, export).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "for all users",
    );
    // Other routes are not bulk requests.
    let r = send(&a, with_bearer(empty(Method::GET, "/api/memory"), "tok-c")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        m.calls().len(),
        3,
        "refused requests never reach the backend"
    );
    // Slots are released when the imports end.
    gate.open();
    for t in running {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    let export = with_bearer(empty(Method::GET, "/api/memory/export"), "tok-c");
    assert_eq!(send(&a, export).await.status, StatusCode::OK);
    let r = send(
        &a,
        with_bearer(json_req(Method::POST, "/api/memory/import", &doc), "tok-a"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn turns_refused_for_pending_bytes_are_429_or_503_with_retry_after() {
    let m = FakeManager::new();
    let a = common::app(m.clone());
    let turn = json!({"thread_id": "t1", "messages": [
        {"role": "user", "content": "I prefer tea"}, {"role": "assistant", "content": "ok"}]});
    for (scope, status) in [
        (OverloadScope::User, StatusCode::TOO_MANY_REQUESTS),
        (OverloadScope::Global, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        m.fail("add", move || ManagerError::Overloaded {
            scope,
            message: "the turn was not queued".into(),
            retry_after: Duration::from_millis(30_500),
        });
        let r = send(&a, json_req(Method::POST, "/api/memory/messages", &turn)).await;
        assert_eq!(r.status, status, "{}", r.text);
        assert_eq!(
            r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
            Some("31")
        );
        assert_eq!(
            r.body,
            json!({"detail": "Memory is busy: the turn was not queued."})
        );
    }
    m.heal("add");
    let r = send(&a, json_req(Method::POST, "/api/memory/messages", &turn)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert!(r.headers.get("retry-after").is_none());
}
