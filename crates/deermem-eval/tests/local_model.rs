//! The harness with the real local model (all-MiniLM-L6-v2) on a slice of the development set:
//! two users, one writing English and one Chinese, every query of theirs. On that slice the
//! engine's hybrid search must never be worse than BM25 alone on lexical queries (recall@1,
//! recall@5, MRR) and must find paraphrases BM25 cannot. The model is read from
//! `$DEERMEM_TEST_MODEL_DIR` (`cargo xtask ci` fetches it and sets the variable); without it the
//! test fails saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem_eval::{Dataset, Mode, Ranker, evaluate};

/// The local model's directory, or a failure naming the command that provides it.
fn model_dir() -> String {
    match std::env::var("DEERMEM_TEST_MODEL_DIR") {
        Ok(dir) if !dir.is_empty() => dir,
        _ => panic!(
            "DEERMEM_TEST_MODEL_DIR is not set: run `cargo xtask model fetch` and set it to the \
             directory it prints (target/models/all-MiniLM-L6-v2); `cargo xtask ci` does both"
        ),
    }
}

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
fn with_the_local_model_hybrid_keeps_bm25_on_words_and_finds_paraphrases() {
    let dir = model_dir();
    let embedder =
        deermem_embed_local::LocalEmbedder::load(&dir, 32).expect("load the local model");
    // wanglei's lexical query 硬件工程师 is one plain reciprocal rank fusion ranks second.
    let d = slice_of(&["maya", "wanglei"]);
    assert_eq!((d.facts.len(), d.queries.len()), (60, 40));
    deermem_testkit::block_on(async {
        let ranker = Ranker::build(&d, Some(Arc::new(embedder))).await.unwrap();
        let report = evaluate(&d, &ranker).await.unwrap();
        for lang in ["all", "en", "zh"] {
            let bm25 = report.get(Mode::Bm25, "lexical", lang).unwrap();
            let hybrid = report.get(Mode::Hybrid, "lexical", lang).unwrap();
            assert!(bm25.queries > 0, "{lang}");
            assert!(
                hybrid.recall_at_1 >= bm25.recall_at_1
                    && hybrid.recall_at_5 >= bm25.recall_at_5
                    && hybrid.mrr >= bm25.mrr,
                "lexical {lang}: hybrid {hybrid:?} is worse than bm25 {bm25:?}\n{}",
                report.table()
            );
        }
        let bm25 = report.get(Mode::Bm25, "paraphrase", "all").unwrap();
        let hybrid = report.get(Mode::Hybrid, "paraphrase", "all").unwrap();
        assert!(
            hybrid.recall_at_5 > bm25.recall_at_5,
            "paraphrase: hybrid {hybrid:?} not above bm25 {bm25:?}\n{}",
            report.table()
        );
        // English paraphrases are what the model is for: most are found in the top five.
        let en = report.get(Mode::Hybrid, "paraphrase", "en").unwrap();
        assert!(en.recall_at_5 >= 0.6, "{en:?}\n{}", report.table());
    });
}
