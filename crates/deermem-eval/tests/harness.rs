//! The harness on the committed development set: the CI slice with the fake embedder (every
//! mode runs, figures are fractions, hybrid is never below BM25 on lexical queries of the slice),
//! and BM25 over the whole set (lexical queries are found; paraphrases mostly are not, which is
//! why the set exists).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem_eval::{Dataset, Mode, Ranker, evaluate};
use deermem_testkit::embedder::FakeEmbedder;

fn dev_set() -> Dataset {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/dev.jsonl");
    Dataset::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_development_set_has_the_promised_shape() {
    let d = dev_set();
    let users: std::collections::HashSet<_> = d.facts.iter().map(|f| &f.user).collect();
    assert!(users.len() >= 10, "{} users", users.len());
    assert!(d.facts.len() >= 300, "{} facts", d.facts.len());
    assert!(d.queries.len() >= 200, "{} queries", d.queries.len());
    for kind in ["lexical", "paraphrase"] {
        for lang in ["en", "zh"] {
            assert!(
                d.queries
                    .iter()
                    .any(|q| q.kind == kind && q.lang.as_deref() == Some(lang)),
                "no {kind} {lang} query"
            );
        }
    }
}

#[test]
fn bm25_finds_lexical_queries_on_the_whole_set() {
    deermem_testkit::block_on(async {
        let d = dev_set();
        let ranker = Ranker::build(&d, None).await.unwrap();
        assert_eq!(ranker.modes(), vec![Mode::Bm25]);
        let report = evaluate(&d, &ranker).await.unwrap();
        let lexical = report.get(Mode::Bm25, "lexical", "all").unwrap();
        let paraphrase = report.get(Mode::Bm25, "paraphrase", "all").unwrap();
        assert_eq!(lexical.queries, 100);
        assert!(lexical.recall_at_5 >= 0.95, "{lexical:?}");
        assert!(
            paraphrase.recall_at_5 < lexical.recall_at_5,
            "{paraphrase:?}"
        );
        assert!(report.table().contains("bm25"));
    });
}

#[test]
fn the_ci_slice_runs_every_mode() {
    deermem_testkit::block_on(async {
        let d = dev_set().slice(3, 8);
        assert_eq!(d.queries.len(), 24);
        let fake = Arc::new(FakeEmbedder::new(128));
        let ranker = Ranker::build(&d, Some(fake.clone())).await.unwrap();
        let report = evaluate(&d, &ranker).await.unwrap();
        for mode in [Mode::Bm25, Mode::Vector, Mode::Hybrid] {
            let all = report.get(mode, "all", "all").unwrap();
            assert_eq!(all.queries, 24, "{mode:?}");
            for x in [all.recall_at_1, all.recall_at_5, all.mrr] {
                assert!((0.0..=1.0).contains(&x), "{mode:?} {all:?}");
            }
        }
        // The fake shares words like BM25 does, so fusion must not lose lexical hits.
        let bm25 = report.get(Mode::Bm25, "lexical", "all").unwrap();
        let hybrid = report.get(Mode::Hybrid, "lexical", "all").unwrap();
        assert!(
            hybrid.recall_at_5 >= bm25.recall_at_5,
            "{hybrid:?} < {bm25:?}"
        );
        // Facts embedded once, then one query embedding per query: the hybrid ranking reuses
        // the vector ranking's through the query-embedding cache.
        assert_eq!(fake.texts_embedded(), d.facts.len() + d.queries.len());
    });
}
