//! Issue 4 "Robustness" through the facade: a search index that cannot be opened at start-up
//! does not leave the process on the substring scan until a restart. Search falls back and
//! still answers, the index status names the cause and the dirty scopes, a rebuild reports the
//! failure, and once the path is usable again the next search (or a rebuild) uses the index.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "embedded")]

use deermem_core::ports::MemoryManagerExt as _;
use std::path::Path;
use std::sync::Arc;

use deermem::Backend;
use deermem_core::ports::{MemoryScope, NewFact, SearchRequest};
use deermem_core::{AgentName, MatchType, MemoryConfig, Scope, SearchQuery, UserId};
use deermem_engine::DeerMemManager;

const INDEX_FILE: &str = "deermem-fts5-v1.sqlite3";

fn build(root: &Path) -> Arc<DeerMemManager> {
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    match deermem::build_backend(&MemoryConfig::default(), opts).expect("DeerMem builds") {
        Backend::DeerMem(m, _) => m,
        other => panic!("expected DeerMem, got {}", other.class()),
    }
}

fn user() -> UserId {
    UserId::new("frank@example.com").expect("user id")
}

fn scope() -> MemoryScope {
    MemoryScope::new(Some(user()), None)
}

async fn add_facts(m: &DeerMemManager) {
    for (content, category) in [
        ("User drinks black coffee every morning", "preference"),
        ("User lives in Lisbon near the river", "context"),
    ] {
        m.create_fact(
            NewFact {
                content: content.into(),
                category: category.into(),
                confidence: 0.9,
            },
            scope(),
        )
        .await
        .expect("create_fact works without an index");
    }
}

/// Ranked search through the manager: (content, match type) of every hit.
async fn search(m: &DeerMemManager, q: &str) -> Vec<(String, MatchType)> {
    m.search_scored(SearchRequest {
        query: q.into(),
        top_k: 5,
        scope: scope(),
        category: None,
        mode: None,
    })
    .await
    .expect("search never fails because of the index")
    .into_iter()
    .map(|h| (h.fact.content, h.match_type))
    .collect()
}

fn default_scope_label() -> String {
    format!(
        "{}|{}",
        user().as_str(),
        AgentName::default_bucket().as_str()
    )
}

/// `{root}/.retrieval` is a file where the index folder should be: the folder cannot be
/// created, so the index cannot be opened at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_index_folder_falls_back_then_recovers_on_the_next_search() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    std::fs::write(root.join(".retrieval"), b"not a folder").expect("block the folder");
    let m = build(root);
    let storage = m.storage();

    // Writes still work; their index notifications fail, so the scope is marked dirty.
    add_facts(&m).await;
    let status = storage.retrieval_status().await;
    assert!(
        status.configured,
        "the index is configured, just unavailable: {status:?}"
    );
    assert_eq!(status.adapter.as_deref(), Some("fts5"));
    assert_eq!(status.total_docs, None, "{status:?}");
    let err = status.last_error.expect("the status names the failure");
    assert!(err.contains(".retrieval"), "{err}");
    assert_eq!(status.dirty_scopes, vec![default_scope_label()]);

    // Search answers with the canonical substring scan: a substring is found, a query only
    // the word index would match (words out of order) is not.
    assert_eq!(
        search(&m, "black coffee").await,
        vec![(
            "User drinks black coffee every morning".to_owned(),
            MatchType::Substring
        )]
    );
    assert!(search(&m, "morning coffee").await.is_empty());

    // A rebuild fails as a whole (and says so) while the folder is blocked; the scope stays dirty.
    let report = storage
        .rebuild_index(None)
        .await
        .expect("a report, not an error");
    assert!(report.supported && report.fatal, "{report:?}");
    assert_eq!(
        storage.retrieval_status().await.dirty_scopes,
        vec![default_scope_label()]
    );

    // The operator removes the blocking file; the next search opens the index, re-indexes the
    // dirty scope from the Markdown files and ranks with FTS5.
    std::fs::remove_file(root.join(".retrieval")).expect("unblock");
    let hits = search(&m, "morning coffee").await;
    assert_eq!(
        hits,
        vec![(
            "User drinks black coffee every morning".to_owned(),
            MatchType::Fts5
        )]
    );
    assert!(root.join(".retrieval").join(INDEX_FILE).is_file());
    let status = storage.retrieval_status().await;
    assert_eq!(status.total_docs, Some(2), "{status:?}");
    assert_eq!(status.last_error, None);
    assert!(status.dirty_scopes.is_empty(), "{status:?}");

    // New writes reach the index directly again.
    {
        m.create_fact(NewFact::new("User collects vintage fountain pens"), scope())
            .await
            .expect("create_fact");
    }
    let direct = storage
        .search_facts(&SearchQuery {
            text: "pens vintage".into(),
            scopes: vec![Scope::new(Some(user()), Some(AgentName::default_bucket()))],
            top_k: 5,
            category: None,
            mode: None,
        })
        .await
        .expect("index search");
    assert_eq!(direct.len(), 1);
    assert_eq!(direct[0].match_type, MatchType::Fts5);
    assert_eq!(storage.retrieval_status().await.total_docs, Some(3));
}

/// The index file itself is a directory: the adapter cannot delete and recreate it. Facts that
/// were on disk before start-up are still searchable by substring; after the operator removes
/// the obstruction an explicit rebuild fills the index from the canonical files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_file_that_cannot_be_recreated_recovers_through_a_rebuild() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    {
        // A first process writes facts with a working index.
        let m = build(root);
        add_facts(&m).await;
        deermem_core::ports::MemoryManager::close(m.as_ref()).await;
    }
    let index = root.join(".retrieval").join(INDEX_FILE);
    for side in ["", "-wal", "-shm"] {
        let p = format!("{}{side}", index.display());
        let _ = std::fs::remove_file(p);
    }
    std::fs::create_dir_all(index.join("obstruction")).expect("a directory at the file's path");

    let m = build(root);
    let storage = m.storage();
    let status = storage.retrieval_status().await;
    assert!(status.configured);
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(INDEX_FILE)),
        "{status:?}"
    );
    assert_eq!(
        search(&m, "lisbon").await,
        vec![(
            "User lives in Lisbon near the river".to_owned(),
            MatchType::Substring
        )]
    );
    assert!(storage.rebuild_index(None).await.expect("report").fatal);

    std::fs::remove_dir_all(&index).expect("remove the obstruction");
    let report = storage.rebuild_index(None).await.expect("report");
    assert!(!report.fatal && report.failed == 0, "{report:?}");
    assert_eq!(report.indexed, 2);
    let status = storage.retrieval_status().await;
    assert_eq!((status.total_docs, status.last_error), (Some(2), None));
    assert_eq!(
        search(&m, "river Lisbon").await,
        vec![(
            "User lives in Lisbon near the river".to_owned(),
            MatchType::Fts5
        )]
    );
}

/// A corrupt index file is deleted and recreated once at start-up: search uses the index at
/// once, with no error left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_index_file_is_recreated_at_start_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    std::fs::create_dir_all(root.join(".retrieval")).expect("folder");
    let index = root.join(".retrieval").join(INDEX_FILE);
    std::fs::write(&index, vec![0xA5_u8; 8192]).expect("garbage index");
    let m = build(root);
    let status = m.storage().retrieval_status().await;
    assert_eq!((status.total_docs, status.last_error), (Some(0), None));
    let header = std::fs::read(&index).expect("recreated");
    assert!(
        header.starts_with(b"SQLite format 3\0"),
        "a new SQLite file"
    );
    add_facts(&m).await;
    assert_eq!(
        search(&m, "morning coffee").await,
        vec![(
            "User drinks black coffee every morning".to_owned(),
            MatchType::Fts5
        )]
    );
}
