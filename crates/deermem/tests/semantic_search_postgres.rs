//! Search by meaning with `storage_class: postgres`: the facade wraps the storage's search in
//! the hybrid retrieval over the facts, with the vectors in the database. Two facades on one
//! database (two replicas) share the vectors; a failing embedder falls back to BM25; deleting
//! a fact takes its vector with it; the index status shows the coverage and a rebuild embeds.
//! The embedder is the OpenAI-compatible fake of the testkit (its vectors are the testkit
//! fake embedder's), and the done-when sentence of search by meaning runs with the local model
//! (`DEERMEM_TEST_MODEL_DIR`, set by `cargo xtask ci` after `cargo xtask model fetch`).

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(all(feature = "storage-postgres", feature = "embed-openai"))]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deermem::Backend;
use deermem_core::ports::MemoryManagerExt as _;
use deermem_core::ports::{MemoryManager as _, MemoryScope, NewFact, ScoredFact, SearchRequest};
use deermem_core::{MatchType, MemoryConfig, SearchMode, UserId};
use deermem_engine::DeerMemManager;
use deermem_llm_openai::fake::{FakeOpenAi, Reply};
use deermem_testkit::pgcluster::PgCluster;
use serde_json::json;

fn schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "semantic_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn config(yaml: &str) -> MemoryConfig {
    deermem::load_config_text(yaml, &|_| None)
        .unwrap_or_else(|e| panic!("config does not load: {e}\n{yaml}"))
        .memory
}

fn postgres_yaml(url: &str, schema: &str, embedding: &str) -> String {
    format!(
        "memory:\n  backend_config:\n    storage_class: postgres\n    postgres:\n      url: {url}\n      schema: {schema}\n    embedding:\n{embedding}"
    )
}

fn fake_embedding(base_url: &str) -> String {
    format!(
        "      provider: openai\n      base_url: {base_url}\n      model: fake-embed\n      dimensions: 32\n      max_retries: 0\n"
    )
}

fn build(cfg: &MemoryConfig, root: &Path) -> Arc<DeerMemManager> {
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    match deermem::build_backend(cfg, opts).unwrap_or_else(|e| panic!("build: {e}")) {
        Backend::DeerMem(m, _) => m,
        other => panic!("expected DeerMem, got {}", other.class()),
    }
}

fn scope() -> MemoryScope {
    MemoryScope::new(Some(UserId::new("u1").expect("user id")), None)
}

async fn create(m: &DeerMemManager, content: &str, category: &str) -> String {
    m.create_fact(
        NewFact {
            content: content.into(),
            category: category.into(),
            confidence: 0.9,
        },
        scope(),
    )
    .await
    .expect("create_fact")
    .1
    .expect("the fact is kept")
}

async fn search(m: &DeerMemManager, query: &str, mode: Option<SearchMode>) -> Vec<ScoredFact> {
    m.search_scored(SearchRequest {
        query: query.into(),
        top_k: 3,
        scope: scope(),
        category: None,
        mode,
    })
    .await
    .expect("search")
}

fn contents(hits: &[ScoredFact]) -> Vec<&str> {
    hits.iter().map(|h| h.fact.content.as_str()).collect()
}

/// The texts the fake embedding server was asked to embed, in order.
fn embedded_texts(fake: &FakeOpenAi) -> Vec<String> {
    fake.requests()
        .iter()
        .filter_map(|r| r.body.get("input").cloned())
        .flat_map(|input| match input {
            serde_json::Value::String(s) => vec![s],
            serde_json::Value::Array(items) => items
                .into_iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_vectors_and_search_falls_back_to_bm25_when_the_embedder_fails() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    // One embedding server per replica (the same model), so what each replica embeds is seen
    // apart.
    let fake_a = FakeOpenAi::start(Vec::new()).await;
    let fake = FakeOpenAi::start(Vec::new()).await;
    let schema = schema();
    let (root_a, root_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = build(
        &config(&postgres_yaml(
            cluster.url(),
            &schema,
            &fake_embedding(fake_a.base_url()),
        )),
        root_a.path(),
    );
    let b = build(
        &config(&postgres_yaml(
            cluster.url(),
            &schema,
            &fake_embedding(fake.base_url()),
        )),
        root_b.path(),
    );

    let tea = create(&a, "Prefers oolong tea in the morning", "preference").await;
    create(&a, "Backend engineer at a robotics startup", "context").await;
    create(&a, "Has a cat called Miso", "context").await;

    // A rebuild through replica A embeds every fact now (its worker may already have).
    let report = a.storage().rebuild_index(None).await.expect("rebuild");
    assert_eq!(report.indexed, 3);
    let status = a.storage().retrieval_status().await;
    let coverage = status.vectors.expect("coverage in the index status");
    assert_eq!((coverage.embedded, coverage.total), (3, 3), "{coverage:?}");
    assert!(
        coverage.model_id.contains("fake-embed"),
        "{}",
        coverage.model_id
    );
    assert_eq!(coverage.dimension, 32);
    assert_eq!(coverage.last_error, None);

    assert!(embedded_texts(&fake_a).contains(&"Has a cat called Miso".to_owned()));
    // Replica B ranks by A's vectors: the only text it embeds is its query.
    let hits = search(&b, "oolong morning", Some(SearchMode::Vector)).await;
    assert_eq!(
        contents(&hits).first(),
        Some(&"Prefers oolong tea in the morning")
    );
    assert!(
        hits.iter().all(|h| h.match_type == MatchType::Vector),
        "{hits:?}"
    );
    assert_eq!(embedded_texts(&fake), ["oolong morning".to_owned()]);
    // Hybrid: BM25 and the vectors agree on the fact.
    let hits = search(&b, "oolong tea", Some(SearchMode::Hybrid)).await;
    assert_eq!(hits[0].fact.id, tea);
    assert_eq!(hits[0].match_type, MatchType::Hybrid);

    // The embedder fails: a hybrid search answers BM25, the status names the error. (A query
    // not asked before: a repeated one is answered from the query-embedding cache.)
    fake.push(Reply::json(
        500,
        json!({"error": {"message": "the model is down", "type": "server_error"}}),
    ));
    let hits = search(&b, "tea oolong", Some(SearchMode::Hybrid)).await;
    assert_eq!(contents(&hits), vec!["Prefers oolong tea in the morning"]);
    assert_eq!(hits[0].match_type, MatchType::Fts5);
    let status = b.storage().retrieval_status().await;
    let err = status
        .vectors
        .expect("coverage")
        .last_error
        .expect("the error is kept");
    assert!(err.contains("500") || err.contains("down"), "{err}");
    // And works again on the next search (a new query, so the embedder is asked).
    let hits = search(&b, "morning oolong", Some(SearchMode::Vector)).await;
    assert_eq!(hits[0].match_type, MatchType::Vector);

    // Deleting the fact through A deletes its vector: B no longer finds it by meaning, and the
    // coverage counts one document less on both replicas.
    a.delete_fact(&tea, None, scope()).await.expect("delete");
    let hits = search(&b, "oolong morning", Some(SearchMode::Vector)).await;
    assert!(
        !contents(&hits).contains(&"Prefers oolong tea in the morning"),
        "{hits:?}"
    );
    for m in [&a, &b] {
        let c = m
            .storage()
            .retrieval_status()
            .await
            .vectors
            .expect("coverage");
        assert_eq!((c.embedded, c.total), (2, 2), "{c:?}");
    }
    a.close().await;
    b.close().await;
    drop(cluster);
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

/// The done-when sentence of search by meaning, on PostgreSQL: "what does the user drink"
/// finds "Prefers oolong tea" with the local model.
#[cfg(feature = "embed-local")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_local_model_what_does_the_user_drink_finds_the_tea() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(&postgres_yaml(
        cluster.url(),
        &schema(),
        &format!("      provider: local\n      model_path: {}\n", model_dir()),
    ));
    let root = tempfile::tempdir().unwrap();
    let m = build(&cfg, root.path());
    create(&m, "Prefers oolong tea", "preference").await;
    create(&m, "Backend engineer at a robotics startup", "context").await;
    create(&m, "Has a cat called Miso", "context").await;
    let hits = search(&m, "what does the user drink", None).await;
    assert_eq!(
        contents(&hits).first(),
        Some(&"Prefers oolong tea"),
        "{hits:?}"
    );
    let coverage = m
        .storage()
        .retrieval_status()
        .await
        .vectors
        .expect("coverage");
    assert_eq!((coverage.embedded, coverage.total), (3, 3));
    assert_eq!(coverage.dimension, 384);
    m.close().await;
    drop(cluster);
}
