//! Optional smoke test against a real OpenViking server. It runs only when
//! `DEERMEM_OPENVIKING_TEST_URL` and `DEERMEM_OPENVIKING_TEST_KEY` are set (a USER key, or any
//! value for a dev-mode server); otherwise it prints why it was skipped.
//!
//! It checks the health probe, a capture (batch plus commit), a second capture that sends
//! nothing, and that recall and search answer with valid envelopes (a dev server without an
//! extraction model returns no memories, so their content is not asserted).

mod support;

use std::time::Duration;

use deermem_backend_openviking::OpenVikingManager;
use deermem_core::ports::{AddRequest, ContextRequest, MemoryManager, MemoryScope, SearchRequest};
use deermem_core::{MemoryMode, Message};
use serde_json::json;

#[tokio::test]
async fn real_server_smoke() {
    let (Ok(url), Ok(key)) = (
        std::env::var("DEERMEM_OPENVIKING_TEST_URL"),
        std::env::var("DEERMEM_OPENVIKING_TEST_KEY"),
    ) else {
        println!(
            "skipped: set DEERMEM_OPENVIKING_TEST_URL and DEERMEM_OPENVIKING_TEST_KEY to run against a real OpenViking server"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = json!({
        "base_url": url,
        "owner_user_id": "default",
        "api_key_env": "DEERMEM_OPENVIKING_TEST_KEY",
        "failure_policy": {"read": "raise", "write": "raise"},
        "allow_insecure_http": true,
    });
    let env = move |name: &str| (name == "DEERMEM_OPENVIKING_TEST_KEY").then(|| key.clone());
    let m = OpenVikingManager::from_backend_config(
        cfg.as_object().unwrap(),
        MemoryMode::Middleware,
        dir.path().to_path_buf(),
        support::clock(),
        &env,
    )
    .unwrap();
    assert!(m.startup_check().await.unwrap(), "server is not healthy");
    let thread = format!("deermem-rs-smoke-{}", std::process::id());
    let req = AddRequest {
        thread_id: thread.clone(),
        messages: vec![
            Message::human("Remember that I use Vim."),
            Message::ai("Noted: you use Vim."),
        ],
        scope: MemoryScope::default(),
        trace_id: None,
    };
    m.capture(req.clone()).await.unwrap();
    let sid = m.session_for(&req).unwrap().1;
    let cursor = std::fs::read_to_string(m.cursor_dir().join(format!("{sid}.json"))).unwrap();
    assert!(cursor.contains("\"submitted_prefix_count\": 2"), "{cursor}");
    assert!(!cursor.contains("Vim"));
    m.capture(req).await.unwrap();
    m.get_context(ContextRequest {
        scope: MemoryScope::default(),
        thread_id: None,
    })
    .await
    .unwrap();
    m.get_context(ContextRequest {
        scope: MemoryScope::default(),
        thread_id: Some(thread),
    })
    .await
    .unwrap();
    m.search(SearchRequest {
        query: "editor".into(),
        top_k: 5,
        scope: MemoryScope::default(),
        category: Some("preferences".into()),
    })
    .await
    .unwrap();
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);
}
