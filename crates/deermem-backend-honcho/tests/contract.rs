//! Runs the `MemoryManager` contract suite from deermem-testkit against the Honcho backend
//! talking to the fake Honcho v3 server on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem_backend_honcho::fake::FakeHoncho;
use deermem_backend_honcho::from_backend_config;
use deermem_core::config::MemoryMode;
use deermem_testkit::clock::ManualClock;
use deermem_testkit::manager::ManagerFixture;
use serde_json::json;

async fn fixture() -> ManagerFixture {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let manager = from_backend_config(
        json!({"base_url": fake.url, "failure_policy": {"read": "fail_closed"}})
            .as_object()
            .unwrap_or_else(|| panic!("object literal")),
        MemoryMode::Middleware,
        root.path().to_path_buf(),
        Arc::new(ManualClock::at("2026-01-01T00:00:00Z")),
    )
    .unwrap_or_else(|e| panic!("honcho backend: {e}"));
    ManagerFixture {
        manager: Arc::new(manager),
        guard: Box::new((fake, root)),
    }
}

deermem_testkit::manager_contract!(fixture(), [searcher, reader]);
