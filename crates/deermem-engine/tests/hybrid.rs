//! `HybridRetrieval` over the FTS5 index with the testkit's fake embedder: search by meaning in
//! the `vector` and `hybrid` modes, the BM25 fallback and retry when the embedder fails,
//! re-embedding on a model change, category filters before the cut, scope isolation, rebuild
//! and the retrieval contract.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::ports::{
    EmbedTask, Embedder, MeaningHit, MeaningQuery, MeaningRanking, Retrieval, VectorIndex,
};
use deermem_core::{
    EmbedError, Fact, MatchType, RetrievalError, Scope, SearchHit, SearchMode, SearchQuery,
};
use deermem_engine::hybrid::HybridRetrieval;
use deermem_retrieval_fts5::Fts5Retrieval;
use deermem_testkit::clock::ManualClock;
use deermem_testkit::embedder::FakeEmbedder;
use deermem_testkit::retrieval::{fact, scope};

/// The fake's notion of meaning: drinks are one concept, work another.
const CONCEPTS: &[(&str, &str)] = &[
    ("drink", "beverage"),
    ("drinks", "beverage"),
    ("tea", "beverage"),
    ("oolong", "beverage"),
    ("coffee", "beverage"),
    ("work", "job"),
    ("engineer", "job"),
];

const QUERY: &str = "what does the user drink in the morning";

/// A fake embedder that fails every call while `failing` is set.
#[derive(Debug, Clone)]
struct Switchable {
    inner: FakeEmbedder,
    failing: Arc<AtomicBool>,
}

impl Switchable {
    fn new(inner: FakeEmbedder) -> Self {
        Self {
            inner,
            failing: Arc::new(AtomicBool::new(true)),
        }
    }
}

#[async_trait]
impl Embedder for Switchable {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn dimension(&self) -> usize {
        self.inner.dimension()
    }
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if self.failing.load(Ordering::SeqCst) && !texts.is_empty() {
            return Err(EmbedError::Unavailable("the model server is down".into()));
        }
        self.inner.embed(texts).await
    }
}

fn index() -> Fts5Retrieval {
    Fts5Retrieval::in_memory(Arc::new(ManualClock::at("2026-01-02T00:00:00Z"))).unwrap()
}

fn hybrid(index: &Fts5Retrieval, embedder: Arc<dyn Embedder>, mode: SearchMode) -> HybridRetrieval {
    HybridRetrieval::new(
        Arc::new(index.clone()),
        Arc::new(index.clone()),
        embedder,
        mode,
    )
}

fn fake() -> Arc<FakeEmbedder> {
    Arc::new(FakeEmbedder::new(64).with_concepts(CONCEPTS))
}

fn alice() -> Scope {
    scope(Some("alice"), "coder")
}

async fn seed(r: &dyn Retrieval, s: &Scope) {
    for (id, text, category) in [
        ("tea", "Prefers oolong tea", "preference"),
        ("job", "Backend engineer at a robotics startup", "context"),
        ("city", "Lives in Lisbon", "context"),
        ("pet", "Has a cat called Miso", "context"),
    ] {
        r.upsert(s, &fact(s, id, text, category, 0.8))
            .await
            .unwrap();
    }
}

fn query(text: &str, s: &Scope, top_k: usize, mode: Option<SearchMode>) -> SearchQuery {
    SearchQuery {
        text: text.into(),
        scopes: vec![s.clone()],
        top_k,
        category: None,
        mode,
    }
}

fn ids(hits: &[SearchHit]) -> Vec<&str> {
    hits.iter().map(|h| h.fact.id.as_str()).collect()
}

/// Polls `cond` for up to twenty seconds (the worker runs behind); `false` when it never held.
async fn eventually<F, Fut>(mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..2000 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paraphrase_is_found_by_meaning_in_hybrid_and_vector_modes_but_not_bm25() {
    let idx = index();
    let r = hybrid(&idx, fake(), SearchMode::Hybrid);
    let s = alice();
    seed(&r, &s).await;

    let bm25 = r
        .search(&query(QUERY, &s, 5, Some(SearchMode::Bm25)))
        .await
        .unwrap();
    assert!(!ids(&bm25).contains(&"tea"), "{:?}", ids(&bm25));
    assert!(bm25.iter().all(|h| h.match_type == MatchType::Fts5));

    // Written a moment ago: embedded inline before the search answers.
    let vector = r
        .search(&query(QUERY, &s, 2, Some(SearchMode::Vector)))
        .await
        .unwrap();
    assert_eq!(ids(&vector)[0], "tea");
    assert_eq!(vector.len(), 2);
    assert!(
        vector
            .iter()
            .all(|h| h.match_type == MatchType::Vector && h.bm25.is_none())
    );
    assert!(vector[0].score > vector[1].score && vector[0].score <= 1.0);

    // The default mode is hybrid: the paraphrase is found, and a fact both rankings found is
    // `hybrid`.
    let fused = r.search(&query(QUERY, &s, 5, None)).await.unwrap();
    assert!(ids(&fused).contains(&"tea"), "{:?}", ids(&fused));
    let tea = fused.iter().find(|h| h.fact.id.as_str() == "tea").unwrap();
    assert_eq!(tea.match_type, MatchType::Vector);
    let city = fused.iter().find(|h| h.fact.id.as_str() == "city").unwrap();
    assert_eq!(city.match_type, MatchType::Hybrid, "BM25 finds 'in'");
    assert!(city.bm25.is_some());
    for w in fused.windows(2) {
        assert!(w[0].score >= w[1].score);
    }
    // A lexical query still ranks its word match first.
    let lexical = r.search(&query("Lisbon", &s, 3, None)).await.unwrap();
    assert_eq!(ids(&lexical)[0], "city");
    r.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_embedder_never_fails_writes_or_searches_and_is_retried() {
    let idx = index();
    let embedder = Switchable::new(FakeEmbedder::new(64).with_concepts(CONCEPTS));
    let failing = Arc::clone(&embedder.failing);
    let r = hybrid(&idx, Arc::new(embedder), SearchMode::Hybrid);
    let s = alice();
    seed(&r, &s).await;

    let bm25 = r
        .search(&query(QUERY, &s, 5, Some(SearchMode::Bm25)))
        .await
        .unwrap();
    for mode in [None, Some(SearchMode::Vector), Some(SearchMode::Hybrid)] {
        let got = r.search(&query(QUERY, &s, 5, mode)).await.unwrap();
        assert_eq!(got, bm25, "{mode:?} falls back to BM25");
    }
    let stats = r.stats().await.unwrap();
    let cov = stats.vectors.expect("coverage");
    assert_eq!((cov.embedded, cov.total), (0, 4));
    assert_eq!(cov.pending_scopes, vec!["alice|coder"]);
    assert!(cov.last_error.unwrap().contains("model server is down"));
    assert_eq!(cov.model_id, "fake:hashed-words@64");
    assert_eq!(cov.dimension, 64);

    // Recovered: the next search of the scope embeds it and ranks by meaning again.
    failing.store(false, Ordering::SeqCst);
    let got = r
        .search(&query(QUERY, &s, 2, Some(SearchMode::Vector)))
        .await
        .unwrap();
    assert_eq!(ids(&got)[0], "tea");
    let cov = r.stats().await.unwrap().vectors.unwrap();
    assert_eq!((cov.embedded, cov.total), (4, 4));
    assert!(cov.pending_scopes.is_empty());
    assert_eq!(cov.last_error, None);

    // Failing again, then recovering with no search: the worker's retry fills the vectors.
    failing.store(true, Ordering::SeqCst);
    let bob = scope(Some("bob"), "coder");
    r.upsert(
        &bob,
        &fact(&bob, "b1", "Drinks black coffee", "preference", 0.9),
    )
    .await
    .unwrap();
    assert!(
        eventually(|| async {
            let c = r.stats().await.unwrap().vectors.unwrap();
            c.pending_scopes.contains(&"bob|coder".to_owned()) && c.last_error.is_some()
        })
        .await,
        "the worker's failure is recorded"
    );
    failing.store(false, Ordering::SeqCst);
    assert!(
        eventually(|| async {
            let c = r.stats().await.unwrap().vectors.unwrap();
            c.embedded == 5 && c.pending_scopes.is_empty()
        })
        .await,
        "the worker retries after its backoff"
    );
    r.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_embeds_behind_writes_and_a_model_change_re_embeds() {
    let idx = index();
    let first = fake();
    let r = hybrid(&idx, first.clone(), SearchMode::Hybrid);
    assert!(r.has_worker());
    let s = alice();
    seed(&r, &s).await;
    assert!(
        eventually(|| async { idx.vector_coverage(first.model_id()).await.unwrap() == (4, 4) })
            .await,
        "the worker embeds what was written"
    );
    drop(r);

    let second = Arc::new(FakeEmbedder::new(128).with_concepts(CONCEPTS));
    assert_ne!(first.model_id(), second.model_id());
    assert_eq!(
        idx.vector_coverage(second.model_id()).await.unwrap(),
        (0, 4)
    );
    let r2 = hybrid(&idx, second.clone(), SearchMode::Vector);
    assert!(
        eventually(|| async { idx.vector_coverage(second.model_id()).await.unwrap() == (4, 4) })
            .await,
        "the backfill at start re-embeds with the new model"
    );
    assert_eq!(second.texts_embedded(), 4);
    let got = r2.search(&query(QUERY, &s, 1, None)).await.unwrap();
    assert_eq!(ids(&got), vec!["tea"]);
    assert_eq!(got[0].match_type, MatchType::Vector);
    r2.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_category_filter_applies_before_the_cut() {
    let idx = index();
    let r = hybrid(&idx, fake(), SearchMode::Hybrid);
    let s = alice();
    for i in 0..8 {
        r.upsert(
            &s,
            &fact(
                &s,
                &format!("c{i}"),
                "Likes tea and coffee with tea",
                "context",
                0.5,
            ),
        )
        .await
        .unwrap();
    }
    r.upsert(
        &s,
        &fact(
            &s,
            "pref",
            "Usually has a cat nearby, and tea",
            "preference",
            0.5,
        ),
    )
    .await
    .unwrap();
    for mode in [SearchMode::Vector, SearchMode::Hybrid] {
        let mut q = query("tea", &s, 1, Some(mode));
        q.category = Some("preference".into());
        let got = r.search(&q).await.unwrap();
        assert_eq!(ids(&got), vec!["pref"], "{mode:?}");
        q.category = Some("nonexistent".into());
        assert!(r.search(&q).await.unwrap().is_empty(), "{mode:?}");
    }
    r.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_never_leave_the_query_scopes() {
    let idx = index();
    let r = hybrid(&idx, fake(), SearchMode::Hybrid);
    let a = alice();
    let a_writer = scope(Some("alice"), "writer");
    let b = scope(Some("bob"), "coder");
    seed(&r, &a).await;
    r.upsert(
        &b,
        &fact(
            &b,
            "b-tea",
            "Drinks oolong tea every morning",
            "preference",
            0.9,
        ),
    )
    .await
    .unwrap();
    r.upsert(
        &a_writer,
        &fact(&a_writer, "w-tea", "Drinks tea", "preference", 0.9),
    )
    .await
    .unwrap();
    for mode in [SearchMode::Bm25, SearchMode::Vector, SearchMode::Hybrid] {
        let got = r.search(&query(QUERY, &a, 50, Some(mode))).await.unwrap();
        assert!(!got.is_empty());
        let fs = a.to_fact_scope();
        assert!(got.iter().all(|h| h.fact.scope == fs), "{mode:?}");
        let both = SearchQuery {
            scopes: vec![a.clone(), b.clone()],
            ..query(QUERY, &a, 50, Some(mode))
        };
        let got = r.search(&both).await.unwrap();
        assert!(
            got.iter().any(|h| h.fact.id.as_str() == "b-tea"),
            "{mode:?}"
        );
        assert!(
            !got.iter().any(|h| h.fact.id.as_str() == "w-tea"),
            "{mode:?}"
        );
    }
    r.close().await;
}

#[test]
fn without_a_runtime_rebuild_embeds_synchronously_and_failures_do_not_fail_it() {
    let idx = index();
    let embedder = Switchable::new(FakeEmbedder::new(16));
    let failing = Arc::clone(&embedder.failing);
    let model = embedder.model_id().to_owned();
    // Built outside any runtime: no worker.
    let r = hybrid(&idx, Arc::new(embedder), SearchMode::Hybrid);
    assert!(!r.has_worker());
    let s = alice();
    let facts: Vec<_> = (0..70)
        .map(|i| {
            (
                s.clone(),
                fact(&s, &format!("f{i}"), &format!("note {i}"), "context", 0.5),
            )
        })
        .collect();
    deermem_testkit::block_on(async {
        assert_eq!(r.rebuild(None, &facts).await.unwrap(), 70);
        let cov = r.stats().await.unwrap().vectors.unwrap();
        assert_eq!((cov.embedded, cov.total), (0, 70));
        assert_eq!(cov.pending_scopes, vec!["alice|coder"]);
        failing.store(false, Ordering::SeqCst);
        assert_eq!(
            r.rebuild(Some(std::slice::from_ref(&s)), &facts)
                .await
                .unwrap(),
            70
        );
        assert_eq!(idx.vector_coverage(&model).await.unwrap(), (70, 70));
        let cov = r.stats().await.unwrap().vectors.unwrap();
        assert!(cov.pending_scopes.is_empty() && cov.last_error.is_none());
        r.close().await;
        assert!(
            idx.search(&query("note", &s, 1, None)).await.is_err(),
            "closed"
        );
    });
}

/// The retrieval contract holds for the hybrid adapter with `bm25` as its default mode: the
/// contract's statements are about word matches (a removed fact is not found, a query word
/// selects its facts), while a vector ranking returns the nearest facts of the scope whatever
/// the query. The modes by meaning are covered by the tests above.
mod contract {
    deermem_testkit::retrieval_contract!(async {
        let idx = deermem_retrieval_fts5::Fts5Retrieval::in_memory(std::sync::Arc::new(
            deermem_testkit::clock::ManualClock::at("2026-01-02T00:00:00Z"),
        ))
        .expect("in-memory index");
        deermem_testkit::retrieval::RetrievalFixture::new(
            deermem_engine::hybrid::HybridRetrieval::new(
                std::sync::Arc::new(idx.clone()),
                std::sync::Arc::new(idx),
                std::sync::Arc::new(deermem_testkit::embedder::FakeEmbedder::new(32)),
                deermem_core::SearchMode::Bm25,
            ),
        )
    });
}

/// A repeated query costs no embedding request: its vector comes from the in-process cache
/// (built outside a runtime, so no worker embeds behind the test's back).
#[test]
fn a_repeated_query_is_answered_from_the_query_embedding_cache() {
    let idx = index();
    let embedder = fake();
    let r = hybrid(&idx, embedder.clone(), SearchMode::Hybrid);
    assert!(!r.has_worker());
    let s = alice();
    deermem_testkit::block_on(async {
        seed(&r, &s).await;
        let first = r.search(&query(QUERY, &s, 2, None)).await.unwrap();
        // The four facts, embedded inline, and the query.
        assert_eq!(embedder.texts_embedded(), 5);
        let calls = embedder.calls();
        let again = r.search(&query(QUERY, &s, 2, None)).await.unwrap();
        assert_eq!(ids(&again), ids(&first));
        assert_eq!(embedder.calls(), calls);
        let vector = r
            .search(&query(QUERY, &s, 2, Some(SearchMode::Vector)))
            .await
            .unwrap();
        assert_eq!(ids(&vector)[0], "tea");
        assert_eq!(embedder.calls(), calls);
        // Another text is embedded once.
        r.search(&query("where does the user live", &s, 2, None))
            .await
            .unwrap();
        assert_eq!(embedder.calls(), calls + 1);
        assert_eq!(embedder.texts_embedded(), 6);
    });
}

/// The FTS5 index as a vector store without its own `word_ranking` (the port's default), so
/// the hybrid search reads every BM25 candidate's fact.
#[derive(Debug)]
struct NoWordRanking(Fts5Retrieval);

#[async_trait]
impl VectorIndex for NoWordRanking {
    async fn missing_vectors(
        &self,
        model_id: &str,
        scopes: Option<&[Scope]>,
        limit: usize,
    ) -> Result<Vec<EmbedTask>, RetrievalError> {
        self.0.missing_vectors(model_id, scopes, limit).await
    }
    async fn put_vectors(
        &self,
        model_id: &str,
        tasks: &[EmbedTask],
        vectors: &[Vec<f32>],
    ) -> Result<usize, RetrievalError> {
        self.0.put_vectors(model_id, tasks, vectors).await
    }
    async fn scope_vectors(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>)>, RetrievalError> {
        self.0.scope_vectors(scopes, model_id).await
    }
    async fn nearest(&self, query: &MeaningQuery<'_>) -> Result<MeaningRanking, RetrievalError> {
        self.0.nearest(query).await
    }
    async fn read_hits(&self, hits: &mut Vec<MeaningHit>) -> Result<(), RetrievalError> {
        self.0.read_hits(hits).await
    }
    async fn vector_coverage(&self, model_id: &str) -> Result<(u64, u64), RetrievalError> {
        self.0.vector_coverage(model_id).await
    }
}

/// An embedder whose vectors depend on the whole text and not on its words: meaning's list is
/// unrelated to BM25's, so word matches outside it (decisive, or filling a short list) occur.
#[derive(Debug)]
struct Scattered;

#[async_trait]
impl Embedder for Scattered {
    fn model_id(&self) -> &str {
        "test:scattered@16"
    }
    fn dimension(&self) -> usize {
        16
    }
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        use std::hash::{Hash, Hasher};
        Ok(texts
            .iter()
            .map(|t| {
                (0..16u8)
                    .map(|i| {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        (i, t).hash(&mut h);
                        (h.finish() % 2001) as f32 / 1000.0 - 1.0
                    })
                    .collect()
            })
            .collect())
    }
}

/// The hybrid search that ranks words without reading the facts (reading only those the
/// fusion weighs and keeps) answers exactly what the one reading every BM25 candidate answers:
/// the same facts, order, scores, match types and BM25 relevance, for every `top_k`, with and
/// without a category, for questions, names and CJK text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lean_word_ranking_answers_what_reading_every_candidate_answers() {
    let idx = index();
    let lean = hybrid(&idx, Arc::new(Scattered), SearchMode::Hybrid);
    let full = HybridRetrieval::new(
        Arc::new(idx.clone()),
        Arc::new(NoWordRanking(idx.clone())),
        Arc::new(Scattered),
        SearchMode::Hybrid,
    );
    let s = alice();
    seed(&lean, &s).await;
    lean.upsert(&s, &fact(&s, "zh", "会弹古典吉他", "preference", 0.8))
        .await
        .unwrap();
    let subjects = ["tea", "coffee", "work", "Lisbon", "吉他课", "the morning"];
    for i in 0..200usize {
        let text = format!(
            "{} and {} note {i}",
            subjects[i % subjects.len()],
            subjects[(i / 3) % subjects.len()]
        );
        let category = if i % 4 == 0 { "preference" } else { "context" };
        lean.upsert(&s, &fact(&s, &format!("n{i}"), &text, category, 0.5))
            .await
            .unwrap();
    }
    let mut compared = 0;
    let mut kinds = std::collections::HashSet::new();
    for text in [
        QUERY,
        "oolong tea",
        "Lisbon",
        "古典吉他",
        "what about work",
        "note 7",
    ] {
        for top_k in [1, 3, 10, 60] {
            for category in [None, Some("preference")] {
                let mut q = query(text, &s, top_k, None);
                q.category = category.map(str::to_owned);
                let a = lean.search(&q).await.unwrap();
                let b = full.search(&q).await.unwrap();
                let seen = |hits: &[SearchHit]| -> Vec<(String, MatchType, Option<f64>, f64)> {
                    hits.iter()
                        .map(|h| (h.fact.id.as_str().to_owned(), h.match_type, h.bm25, h.score))
                        .collect()
                };
                assert_eq!(seen(&a), seen(&b), "{text:?}, top_k {top_k}, {category:?}");
                assert_eq!(
                    a.iter().map(|h| &h.fact).collect::<Vec<_>>(),
                    b.iter().map(|h| &h.fact).collect::<Vec<_>>()
                );
                compared += a.len();
                kinds.extend(a.iter().map(|h| h.match_type));
            }
        }
    }
    assert!(compared > 100, "{compared}");
    for kind in [
        MatchType::Hybrid,
        MatchType::Vector,
        MatchType::Fts5,
        MatchType::Cjk,
    ] {
        assert!(kinds.contains(&kind), "no {kind:?} hit compared: {kinds:?}");
    }
    lean.close().await;
    full.close().await;
}
