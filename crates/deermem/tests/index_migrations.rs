//! Issue 4 "Lifecycle": the search index follows the storage's v1 → v2 migrations. The
//! embedded storage (file storage + FTS5, composed by the facade) migrates a copy of the Python
//! reference's `v1-root` lazily (on a read) and explicitly (`migrate`), and the migrated facts are
//! then found by index search without any rebuild; moving the old implicit `lead-agent` bucket
//! into `__default__` removes its documents from the index.
//!
//! Searches go to the storage directly (not the manager), because the manager re-indexes a scope
//! on its first search and would hide a missing notification.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "embedded")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deermem_core::prelude::*;
use deermem_core::{AgentName, MatchType, Scope, SearchQuery, UserId};
use deermem_storage_file::FileStorage;
use deermem_testkit::clock::ManualClock;
use deermem_updater::DeerMemConfig;
use serde_json::json;

fn fixtures() -> PathBuf {
    deermem_testkit::fixtures::python_deermem()
}

fn copy_dir(src: &Path, dst: &Path) {
    deermem_testkit::fixtures::copy_tree(src, dst);
}

/// A temp copy of `v1-root` and the facade's embedded storage over it, with its FTS5 index.
fn v1_storage() -> (tempfile::TempDir, FileStorage) {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_dir(&fixtures().join("v1-root"), dir.path());
    let clock = Arc::new(ManualClock::at("2026-06-01T00:00:00Z"));
    let storage = deermem::embedded::open_storage(
        &DeerMemConfig::default(),
        dir.path().to_path_buf(),
        clock,
        true,
    )
    .expect("storage opens");
    (dir, storage)
}

fn user(raw: &str) -> UserId {
    UserId::new(raw).expect("user id")
}

fn agent(name: &str) -> AgentName {
    AgentName::parse(name).expect("agent name")
}

fn default() -> AgentName {
    AgentName::default_bucket()
}

/// Index search in one scope: (content, match type) of every hit.
async fn search(s: &FileStorage, u: &UserId, a: &AgentName, q: &str) -> Vec<(String, MatchType)> {
    s.search_facts(&SearchQuery {
        text: q.into(),
        scopes: vec![Scope::new(Some(u.clone()), Some(a.clone()))],
        top_k: 10,
        category: None,
        mode: None,
    })
    .await
    .expect("search")
    .into_iter()
    .map(|h| (h.fact.content, h.match_type))
    .collect()
}

async fn indexed_docs(s: &FileStorage) -> u64 {
    let status = s.retrieval_status().await;
    assert!(status.dirty_scopes.is_empty(), "{status:?}");
    assert_eq!(status.last_error, None);
    status.total_docs.expect("the index is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_migration_on_read_indexes_the_migrated_facts() {
    let (_dir, s) = v1_storage();
    let carol = user("carol");
    let researcher = agent("researcher");
    // Nothing is indexed before the legacy documents are read.
    assert_eq!(indexed_docs(&s).await, 0);
    assert!(search(&s, &carol, &researcher, "marathon").await.is_empty());

    // One read of carol's researcher bucket migrates her global v1 manifest and the agent's
    // legacy document; the storage notifies the index of every migrated fact.
    let doc = s
        .load(Some(&carol), Some(&researcher))
        .await
        .expect("lazy migration");
    assert_eq!(doc.version, "2.0");
    assert_eq!(doc.facts.len(), 3);
    assert_eq!(
        indexed_docs(&s).await,
        3 + 6,
        "researcher + default buckets"
    );
    assert_eq!(
        search(&s, &carol, &researcher, "marathon hours").await,
        vec![(
            "Goal: run a marathon under 4 hours in 2027.".to_owned(),
            MatchType::Fts5
        )]
    );
    assert_eq!(
        search(&s, &carol, &researcher, "pgvector").await,
        vec![(
            "Works with PostgreSQL 16 and pgvector for embeddings.".to_owned(),
            MatchType::Fts5
        )]
    );
    // The global manifest's facts went to carol's default bucket.
    let vim = search(&s, &carol, &default(), "vim keybindings").await;
    assert_eq!(vim.len(), 1, "{vim:?}");
    assert!(vim[0].0.starts_with("Uses vim keybindings everywhere"));
    assert_eq!(vim[0].1, MatchType::Fts5);
    // Dave's documents were not read, so nothing of his is indexed yet; carol's facts never
    // show up in his scopes.
    let dave = user("dave@corp.example");
    assert!(search(&s, &dave, &researcher, "marathon").await.is_empty());
    assert!(search(&s, &dave, &researcher, "peanuts").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_migration_indexes_the_migrated_facts_and_a_dry_run_indexes_nothing() {
    let (_dir, s) = v1_storage();
    let dave = user("dave@corp.example");
    let researcher = agent("researcher");

    let dry = s
        .migrate(Some(&dave), &researcher, true)
        .await
        .expect("dry run");
    assert!(dry.dry_run && dry.migrated, "{dry:?}");
    assert_eq!(indexed_docs(&s).await, 0, "a dry run changes nothing");

    let report = s
        .migrate(Some(&dave), &researcher, false)
        .await
        .expect("migration");
    assert!(report.migrated && !report.dry_run, "{report:?}");
    // The agent's legacy document (3 facts) and the global v1 manifest (6): an explicit
    // migration moves the global facts into the NAMED agent, as the reference's explicit
    // `migrate` does, unlike the lazy path which uses `__default__`.
    assert_eq!(report.migrated_facts, 3 + 6);
    assert_eq!(indexed_docs(&s).await, 3 + 6);
    assert_eq!(
        search(&s, &dave, &researcher, "peanuts recipes").await,
        vec![(
            "Is allergic to peanuts; never suggest recipes with peanuts.".to_owned(),
            MatchType::Fts5
        )]
    );
    let berlin = search(&s, &dave, &researcher, "Berlin robotics").await;
    assert_eq!(berlin.len(), 1, "{berlin:?}");
    assert_eq!(berlin[0].1, MatchType::Fts5);
    // CJK text from the migrated manifest is found through the bigram column.
    let tea = search(&s, &dave, &researcher, "乌龙茶").await;
    assert_eq!(tea.len(), 1, "{tea:?}");
    assert!(tea[0].0.contains("乌龙茶"));
    assert!(search(&s, &dave, &default(), "Berlin").await.is_empty());
    // Nothing is left to migrate; a second run sends nothing to the index.
    let again = s
        .migrate(Some(&dave), &researcher, false)
        .await
        .expect("second migration");
    assert!(!again.migrated, "{again:?}");
    assert_eq!(indexed_docs(&s).await, 3 + 6);
    // Carol was not migrated: nothing of hers is indexed.
    assert!(
        search(&s, &user("carol"), &researcher, "marathon")
            .await
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_the_old_lead_agent_bucket_reindexes_its_facts_under_the_default_bucket() {
    let (dir, s) = v1_storage();
    let carol = user("carol");
    let lead = agent("lead-agent");
    // A fact in the old implicit `lead-agent` bucket (no agent config.yaml), indexed there.
    let draft = json!({"id": "fact_lighthouse01", "content": "User restores an old lighthouse on weekends",
                       "category": "context", "confidence": 0.9, "source": "manual"});
    s.upsert_fact(
        Some(&carol),
        &lead,
        deermem_core::FactDraft::try_from(draft).expect("draft"),
        None,
        None,
    )
    .await
    .expect("write into lead-agent");
    assert_eq!(
        search(&s, &carol, &lead, "lighthouse").await,
        vec![(
            "User restores an old lighthouse on weekends".to_owned(),
            MatchType::Fts5
        )]
    );
    assert!(
        search(&s, &carol, &default(), "lighthouse")
            .await
            .is_empty()
    );
    let before = indexed_docs(&s).await;

    // Reading the default bucket moves the old bucket into it: the index gets the fact under
    // `__default__` and loses it under `lead-agent`.
    let doc = s
        .load(Some(&carol), Some(&default()))
        .await
        .expect("default bucket read migrates lead-agent");
    assert!(
        doc.facts
            .iter()
            .any(|f| f.content == "User restores an old lighthouse on weekends")
    );
    assert!(
        !dir.path().join("users/carol/agents/lead-agent").exists(),
        "the old bucket is gone"
    );
    assert!(
        search(&s, &carol, &lead, "lighthouse").await.is_empty(),
        "the removed bucket's documents left the index"
    );
    assert_eq!(
        search(&s, &carol, &default(), "lighthouse weekends").await,
        vec![(
            "User restores an old lighthouse on weekends".to_owned(),
            MatchType::Fts5
        )]
    );
    assert_eq!(indexed_docs(&s).await, before, "moved, not duplicated");
}
