//! Search by meaning through the facade: with `embedding: {provider: local, model_path}` the
//! embedded engine wraps its FTS5 index in the hybrid retrieval and finds a paraphrase; without
//! an embedder it does not. The local model comes from `cargo xtask model fetch`, named by
//! `DEERMEM_TEST_MODEL_DIR` (set by `cargo xtask ci`).

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "embedded")]

use std::path::Path;
use std::sync::Arc;

use deermem::Backend;
use deermem_core::ports::MemoryManagerExt as _;
use deermem_core::ports::{MemoryManager as _, MemoryScope, NewFact, SearchRequest};
use deermem_core::{MemoryConfig, UserId};
use deermem_engine::DeerMemManager;

fn config(yaml: &str) -> MemoryConfig {
    deermem::load_config_text(yaml, &|_| None)
        .expect("config parses")
        .memory
}

fn build(cfg: &MemoryConfig, root: &Path) -> Result<Arc<DeerMemManager>, deermem::BuildError> {
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    match deermem::build_backend(cfg, opts)? {
        Backend::DeerMem(m, _) => Ok(m),
        other => panic!("expected DeerMem, got {}", other.class()),
    }
}

fn scope() -> MemoryScope {
    MemoryScope::new(Some(UserId::new("u1").expect("user id")), None)
}

/// Adds the facts, then answers the contents `query` finds (mode left to the configuration).
async fn add_and_search(m: &DeerMemManager, query: &str) -> Vec<String> {
    for (content, category) in [
        ("Prefers oolong tea", "preference"),
        ("Backend engineer at a robotics startup", "context"),
        ("Has a cat called Miso", "context"),
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
        .expect("create_fact");
    }
    m.search_scored(SearchRequest {
        query: query.into(),
        top_k: 2,
        scope: scope(),
        category: None,
        mode: None,
    })
    .await
    .expect("search")
    .into_iter()
    .map(|h| h.fact.content)
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_embedder_a_paraphrase_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let m = build(&MemoryConfig::default(), dir.path()).unwrap();
    let found = add_and_search(&m, "what does the user drink").await;
    assert!(
        !found.contains(&"Prefers oolong tea".to_owned()),
        "{found:?}"
    );
    m.close().await;
}

#[cfg(feature = "embed-local")]
fn model_dir() -> String {
    std::env::var("DEERMEM_TEST_MODEL_DIR").unwrap_or_else(|_| {
        panic!(
            "DEERMEM_TEST_MODEL_DIR is not set: run `cargo xtask model fetch` and set it to \
             target/models/all-MiniLM-L6-v2 (cargo xtask ci does both)"
        )
    })
}

#[cfg(feature = "embed-local")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_local_model_a_paraphrase_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&format!(
        "memory:\n  backend_config:\n    embedding:\n      provider: local\n      model_path: {}\n",
        model_dir()
    ));
    let m = build(&cfg, dir.path()).unwrap();
    let found = add_and_search(&m, "what does the user drink").await;
    assert_eq!(
        found.first().map(String::as_str),
        Some("Prefers oolong tea"),
        "{found:?}"
    );
    // The coverage is in the index status once the worker (or that search) embedded them.
    let status = m.storage().retrieval_status().await;
    let coverage = status.vectors.expect("coverage in the index status");
    assert_eq!(coverage.total, 3);
    assert_eq!(coverage.embedded, 3);
    assert!(
        coverage.model_id.starts_with("local:"),
        "{}",
        coverage.model_id
    );
    assert_eq!(coverage.dimension, 384);
    // The ranking went through the index's own `nearest` (every layer forwards it), which
    // keeps the scope's decoded vectors; the port's default would not.
    let held = m
        .cache_bounds()
        .into_iter()
        .find(|c| c.name == "fts5.scope_vectors")
        .and_then(|c| c.current);
    assert!(held.is_some_and(|b| b > 0), "{held:?}");
    m.close().await;
}

#[cfg(feature = "embed-local")]
#[tokio::test]
async fn a_model_directory_missing_files_fails_the_start_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("no-model-here");
    std::fs::create_dir_all(&empty).unwrap();
    let cfg = config(&format!(
        "memory:\n  backend_config:\n    embedding:\n      provider: local\n      model_path: {}\n",
        empty.display()
    ));
    let err = build(&cfg, &dir.path().join("root"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("embedding.model_path") && err.contains(&empty.display().to_string()),
        "{err}"
    );
}

#[cfg(not(feature = "embed-local"))]
#[tokio::test]
async fn a_provider_left_out_of_the_build_names_its_feature() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        "memory:\n  backend_config:\n    embedding:\n      provider: local\n      model_path: /nowhere\n",
    );
    let err = build(&cfg, dir.path()).unwrap_err().to_string();
    assert!(err.contains("embed-local"), "{err}");
}
