//! Optional check against a real Honcho v3 server, run only when `DEERMEM_HONCHO_TEST_URL`
//! names one (with `DEERMEM_HONCHO_TEST_API_KEY` when it needs a key); otherwise it prints why
//! it skipped. Reads are fail-closed here so any server-side rejection fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use deermem_core::ports::MemoryManagerExt as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deermem_backend_honcho::from_backend_config;
use deermem_core::config::MemoryMode;
use deermem_core::ids::UserId;
use deermem_core::message::Message;
use deermem_core::ports::{AddRequest, ContextRequest, MemoryManager, MemoryScope, SearchRequest};
use deermem_testkit::clock::ManualClock;
use serde_json::json;

#[tokio::test]
async fn real_honcho_server_round_trip() {
    let Ok(url) = std::env::var("DEERMEM_HONCHO_TEST_URL") else {
        eprintln!(
            "skipped: set DEERMEM_HONCHO_TEST_URL (and DEERMEM_HONCHO_TEST_API_KEY if needed) to run against a real Honcho server"
        );
        return;
    };
    let mut bc = json!({
        "base_url": url,
        "allow_insecure_http": true,
        "failure_policy": {"read": "fail_closed"},
        "timeout_seconds": 30
    });
    if let Ok(key) = std::env::var("DEERMEM_HONCHO_TEST_API_KEY") {
        bc["api_key"] = json!(key);
    }
    let root = tempfile::tempdir().unwrap();
    let m = from_backend_config(
        bc.as_object().unwrap(),
        MemoryMode::Middleware,
        root.path().to_path_buf(),
        Arc::new(ManualClock::at("2026-01-01T00:00:00Z")),
    )
    .unwrap();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let user = UserId::new(format!("deermem-test-{nanos}@example.com")).unwrap();
    let scope = MemoryScope::user(user);
    let turn = vec![
        Message::human("I am testing DeerMem against Honcho and I like green tea."),
        Message::ai("Noted: you like green tea."),
    ];
    m.add(AddRequest {
        thread_id: format!("thread-{nanos}"),
        messages: turn,
        scope: scope.clone(),
        trace_id: None,
    })
    .await
    .unwrap();
    assert!(m.shutdown_flush(Duration::from_secs(60)).await);
    let dir = root.path().join("honcho").join("cursors");
    let cursor = std::fs::read_dir(&dir)
        .expect("the capture was accepted, so a cursor was written")
        .next()
        .expect("one cursor file")
        .unwrap()
        .path();
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cursor).unwrap()).unwrap();
    assert_eq!(state["prefix_count"], 2, "both messages were accepted");
    m.get_context(ContextRequest {
        scope: scope.clone(),
        thread_id: None,
    })
    .await
    .expect("representation request accepted");
    m.search(SearchRequest {
        query: "green tea".into(),
        top_k: 5,
        scope: scope.clone(),
        category: None,
        mode: None,
    })
    .await
    .expect("search request accepted");
    m.get_memory(scope).await.expect("get_memory accepted");
}
