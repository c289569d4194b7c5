//! The backend-agnostic route suite run against the in-test recording manager. A real backend
//! runs the same functions from its own test file (see `common::suite_*`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::FakeManager;

#[tokio::test]
async fn fact_crud() {
    common::suite_fact_crud(FakeManager::new()).await;
}

#[tokio::test]
async fn export_clear_import_round_trip() {
    common::suite_export_clear_import(FakeManager::new()).await;
}

#[tokio::test]
async fn agent_buckets() {
    common::suite_agent_buckets(FakeManager::new()).await;
}

#[tokio::test]
async fn search() {
    common::suite_search(FakeManager::new()).await;
}

#[tokio::test]
async fn user_isolation() {
    common::suite_user_isolation(FakeManager::new()).await;
}
