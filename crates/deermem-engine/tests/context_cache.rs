//! The `get_context` block cache: an unchanged scope is answered from the cache, and every kind
//! of write invalidates it (fact create, update and delete, summaries, import, clear, a write by
//! another storage instance on the same root as another process makes it), with the block always
//! equal to a fresh rendering.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod manager_support;

use std::sync::Arc;

use deermem_core::SummaryPatch;
use deermem_core::ports::MemoryManagerExt as _;
use deermem_core::ports::{
    ContextRequest, FactPatch, MemoryManager, MemoryScope, MemoryStorage, NewFact,
};
use deermem_core::prelude::*;
use deermem_core::{AgentName, ApplyOptions, ChangeSet, FactDraft, PublicMemoryDocument};
use deermem_engine::DeerMemManager;
use deermem_updater::DeerMemConfig;
use manager_support::{FileEnv, clock, config, file_env, file_storage, parts, scope, user};
use serde_json::json;

fn request(s: &MemoryScope) -> ContextRequest {
    ContextRequest {
        scope: s.clone(),
        thread_id: None,
    }
}

/// A manager with no cache history over the same storage: what the block must be.
fn fresh_manager(env: &FileEnv, cfg: DeerMemConfig) -> DeerMemManager {
    let storage: Arc<dyn MemoryStorage> = Arc::new(file_storage(&env.root(), clock()));
    DeerMemManager::new(parts(cfg, storage, clock(), None)).unwrap()
}

/// The block, checked against a fresh rendering, and the cache's entry count after it.
async fn context(env: &FileEnv, s: &MemoryScope) -> String {
    let text = env.manager.get_context(request(s)).await.unwrap();
    let fresh = fresh_manager(env, config())
        .get_context(request(s))
        .await
        .unwrap();
    assert_eq!(
        text, fresh,
        "the cached block differs from a fresh rendering"
    );
    text
}

fn entries(env: &FileEnv) -> usize {
    env.manager.pipeline().rendered_cache_usage().entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_write_invalidates_the_block() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    assert_eq!(context(&env, &s).await, "");
    let (_, id) = m
        .create_fact(NewFact::new("Likes green tea"), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();
    // Created.
    let block = context(&env, &s).await;
    assert!(block.contains("Likes green tea"), "{block}");
    assert_eq!(entries(&env), 1);
    // Unchanged: the same text (from the cache).
    assert_eq!(context(&env, &s).await, block);
    // Updated.
    m.update_fact(
        &id,
        FactPatch {
            content: Some("Likes black tea".into()),
            ..FactPatch::default()
        },
        s.clone(),
    )
    .await
    .unwrap();
    let block = context(&env, &s).await;
    assert!(
        block.contains("Likes black tea") && !block.contains("green"),
        "{block}"
    );
    // Summaries only (the facts unchanged).
    let mut children = serde_json::Map::new();
    children.insert(
        "workContext".into(),
        json!({"summary": "Builds compilers", "updatedAt": "2026-05-01T00:00:00Z"}),
    );
    env.storage
        .update_summaries(
            Some(&user("alice")),
            SummaryPatch {
                user: Some(children),
                history: None,
            },
            None,
        )
        .await
        .unwrap();
    let block = context(&env, &s).await;
    assert!(block.contains("Builds compilers"), "{block}");
    // Deleted.
    m.delete_fact(&id, None, s.clone()).await.unwrap();
    let block = context(&env, &s).await;
    assert!(!block.contains("tea"), "{block}");
    // Imported.
    let doc: PublicMemoryDocument = serde_json::from_value(json!({
        "version": "2.0", "revision": 0, "lastUpdated": "x",
        "facts": [{"id": "fact_import_a", "content": "Plays the cello", "category": "context",
                   "confidence": 0.9}]
    }))
    .unwrap();
    m.import_memory(doc, s.clone()).await.unwrap();
    let block = context(&env, &s).await;
    assert!(
        block.contains("Plays the cello") && !block.contains("compilers"),
        "{block}"
    );
    // A point write straight through the storage.
    env.storage
        .apply_changes(
            Some(&user("alice")),
            Some(&AgentName::default_bucket()),
            ChangeSet {
                upserts: vec![FactDraft::new("Runs marathons").unwrap()],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    let block = context(&env, &s).await;
    assert!(block.contains("Runs marathons"), "{block}");
    // Cleared.
    m.clear_memory(s.clone()).await.unwrap();
    assert_eq!(context(&env, &s).await, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_by_another_process_invalidates_the_block() {
    let env = file_env(config(), None);
    let s = scope("bob", None);
    env.manager
        .create_fact(NewFact::new("Lives in Lyon"), s.clone())
        .await
        .unwrap();
    let block = context(&env, &s).await;
    assert!(block.contains("Lives in Lyon"), "{block}");
    // Another storage instance on the same root: another process as far as this one can tell.
    let other = file_storage(&env.root(), clock());
    for (i, text) in ["Moved to Porto", "Learns Portuguese"].iter().enumerate() {
        other
            .apply_changes(
                Some(&user("bob")),
                Some(&AgentName::default_bucket()),
                ChangeSet {
                    upserts: vec![FactDraft::new(text).unwrap()],
                    ..ChangeSet::default()
                },
                ApplyOptions::default(),
            )
            .await
            .unwrap();
        let block = context(&env, &s).await;
        assert!(block.contains(text), "write {i} unseen: {block}");
    }
    // Once the manifest is older than the time-stamp window the storage trusts `stat` alone;
    // a later write by the other instance is still seen.
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    assert_eq!(context(&env, &s).await, context(&env, &s).await);
    other.clear_all(Some(&user("bob"))).await.unwrap();
    let block = context(&env, &s).await;
    assert!(!block.contains("Lyon"), "{block}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_are_cached_apart_and_each_manager_honours_its_budget() {
    let env = file_env(config(), None);
    let s = scope("carol", None);
    for i in 0..20 {
        env.manager
            .create_fact(
                NewFact::new(format!("Fact number {i} about a long topic")),
                s.clone(),
            )
            .await
            .unwrap();
    }
    let full = context(&env, &s).await;
    // Another manager with a small budget over the same storage shares nothing with this one,
    // and its block honours its own budget.
    let small = DeerMemConfig {
        max_injection_tokens: 40,
        ..config()
    };
    let cut = fresh_manager(&env, small.clone())
        .get_context(request(&s))
        .await
        .unwrap();
    assert!(cut.len() < full.len(), "{cut}");
    let again = fresh_manager(&env, small)
        .get_context(request(&s))
        .await
        .unwrap();
    assert_eq!(cut, again);
    // Scopes are apart.
    let other = scope("carol", Some("coder"));
    assert_eq!(context(&env, &other).await, "");
    assert_eq!(context(&env, &s).await, full);
}
