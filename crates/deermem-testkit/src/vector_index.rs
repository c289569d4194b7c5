//! The `VectorIndex` port's contract suite: vectors kept beside a retrieval index, current only
//! for their document's text and their model. [`vector_index_contract!`](crate::vector_index_contract)
//! expands one `#[test]` per behaviour; an adapter runs it from its `tests/contract.rs` with a
//! [`VectorIndexFixture`] over a fresh, empty index.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use deermem_core::policy::fusion::nearest_calibrated;
use deermem_core::policy::language::ScriptGroup;
use deermem_core::ports::{EmbedTask, MeaningHit, MeaningQuery, Retrieval, VectorIndex};
use deermem_core::{MatchType, RetrievalError, Scope, SearchMode, SearchQuery};
use serde_json::json;

use crate::retrieval::{fact, fact_with, scope};

/// The model id the suite stores vectors under.
pub const MODEL: &str = "suite:model@3";
/// Another model's id (a model change).
pub const OTHER_MODEL: &str = "suite:other@3";

/// An index under test, seen through both ports, plus whatever must outlive it.
pub struct VectorIndexFixture {
    /// The index as a retrieval adapter (documents are written through it).
    pub index: Arc<dyn Retrieval>,
    /// The same index as a vector store.
    pub vectors: Arc<dyn VectorIndex>,
    _guard: Option<Box<dyn Any + Send + Sync>>,
}

impl VectorIndexFixture {
    /// A fixture over one adapter implementing both ports.
    pub fn new<T: Retrieval + VectorIndex + 'static>(index: T) -> Self {
        let index = Arc::new(index);
        Self {
            index: Arc::clone(&index) as Arc<dyn Retrieval>,
            vectors: index as Arc<dyn VectorIndex>,
            _guard: None,
        }
    }

    /// A fixture that also keeps `guard` alive (a temporary directory...).
    pub fn with_guard<T: Retrieval + VectorIndex + 'static>(
        index: T,
        guard: impl Any + Send + Sync,
    ) -> Self {
        let mut me = Self::new(index);
        me._guard = Some(Box::new(guard));
        me
    }
}

impl fmt::Debug for VectorIndexFixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VectorIndexFixture")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

/// Expands one `#[test]` per vector-index behaviour; `$make` evaluates to a future of a
/// [`VectorIndexFixture`] over a fresh, empty index.
#[macro_export]
macro_rules! vector_index_contract {
    ($make:expr) => {
        $crate::vector_index_contract!(@tests $make;
            new_documents_are_missing_until_their_vectors_are_put,
            a_changed_text_makes_the_vector_stale,
            put_ignores_documents_that_vanished_or_changed,
            another_model_is_missing_and_replaces_the_vector,
            remove_and_clear_delete_vectors,
            rebuild_keeps_unchanged_texts_and_drops_the_rest,
            scopes_and_limits_are_respected,
            mismatched_or_invalid_vectors_are_refused,
            nearest_ranks_by_the_policy_and_reads_only_the_kept_facts,
            word_ranking_is_the_bm25_search_unread,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::block_on(async {
                    let fixture = $make.await;
                    $crate::vector_index::$name(&fixture).await;
                });
            }
        )*
    };
}

/// A unit vector of 3 components pointing along `axis` (mod 3).
fn axis(axis: usize) -> Vec<f32> {
    let mut v = vec![0.0; 3];
    v[axis % 3] = 1.0;
    v
}

fn ids(tasks: &[EmbedTask]) -> Vec<String> {
    let mut out: Vec<String> = tasks.iter().map(|t| t.fact_id.clone()).collect();
    out.sort();
    out
}

async fn put_all(f: &VectorIndexFixture, model: &str) -> usize {
    let tasks = f
        .vectors
        .missing_vectors(model, None, 1000)
        .await
        .expect("missing");
    let vectors: Vec<Vec<f32>> = (0..tasks.len()).map(axis).collect();
    f.vectors
        .put_vectors(model, &tasks, &vectors)
        .await
        .expect("put")
}

/// Documents written through the index are listed (with their text) until a vector of the
/// model is stored; then they are covered and returned with their fact and vector.
pub async fn new_documents_are_missing_until_their_vectors_are_put(f: &VectorIndexFixture) {
    let s = scope(Some("alice"), "coder");
    f.index
        .upsert(&s, &fact(&s, "f1", "Prefers oolong tea", "preference", 0.9))
        .await
        .unwrap();
    f.index
        .upsert(&s, &fact(&s, "f2", "Lives in Lisbon", "context", 0.8))
        .await
        .unwrap();
    let tasks = f.vectors.missing_vectors(MODEL, None, 100).await.unwrap();
    assert_eq!(ids(&tasks), vec!["f1", "f2"]);
    let t1 = tasks.iter().find(|t| t.fact_id == "f1").unwrap();
    assert_eq!(t1.text, "Prefers oolong tea");
    assert_eq!(t1.scope, s);
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (0, 2));
    assert!(
        f.vectors
            .scope_vectors(std::slice::from_ref(&s), MODEL)
            .await
            .unwrap()
            .is_empty()
    );
    let vectors: Vec<Vec<f32>> = tasks
        .iter()
        .map(|t| axis(usize::from(t.fact_id == "f2")))
        .collect();
    assert_eq!(
        f.vectors
            .put_vectors(MODEL, &tasks, &vectors)
            .await
            .unwrap(),
        2
    );
    assert!(
        f.vectors
            .missing_vectors(MODEL, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (2, 2));
    let mut got = f
        .vectors
        .scope_vectors(std::slice::from_ref(&s), MODEL)
        .await
        .unwrap();
    got.sort_by(|a, b| a.0.id.as_str().cmp(b.0.id.as_str()));
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0.content, "Prefers oolong tea");
    assert_eq!(got[0].0.category.as_deref(), Some("preference"));
    assert_eq!(got[0].1, axis(0));
    assert_eq!(got[1].1, axis(1));
}

/// Re-indexing a document with another text makes its vector stale (listed again with the
/// new text, not returned); the same text again keeps it current.
pub async fn a_changed_text_makes_the_vector_stale(f: &VectorIndexFixture) {
    let s = scope(Some("alice"), "coder");
    f.index
        .upsert(&s, &fact(&s, "f1", "Prefers oolong tea", "preference", 0.9))
        .await
        .unwrap();
    assert_eq!(put_all(f, MODEL).await, 1);
    // Same text, other metadata: still current.
    f.index
        .upsert(&s, &fact(&s, "f1", "Prefers oolong tea", "preference", 0.5))
        .await
        .unwrap();
    assert!(
        f.vectors
            .missing_vectors(MODEL, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    f.index
        .upsert(&s, &fact(&s, "f1", "Prefers green tea", "preference", 0.9))
        .await
        .unwrap();
    let tasks = f.vectors.missing_vectors(MODEL, None, 100).await.unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].text, "Prefers green tea");
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (0, 1));
    assert!(
        f.vectors
            .scope_vectors(std::slice::from_ref(&s), MODEL)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A task listed before its document was removed or changed stores nothing; the newer text is
/// listed again.
pub async fn put_ignores_documents_that_vanished_or_changed(f: &VectorIndexFixture) {
    let s = scope(Some("alice"), "coder");
    for (id, text) in [("f1", "first text"), ("f2", "second text"), ("f3", "third")] {
        f.index
            .upsert(&s, &fact(&s, id, text, "context", 0.5))
            .await
            .unwrap();
    }
    let tasks = f.vectors.missing_vectors(MODEL, None, 100).await.unwrap();
    assert_eq!(tasks.len(), 3);
    f.index.remove(&s, "f1").await.unwrap();
    f.index
        .upsert(&s, &fact(&s, "f2", "second text, edited", "context", 0.5))
        .await
        .unwrap();
    let vectors: Vec<Vec<f32>> = (0..3).map(axis).collect();
    assert_eq!(
        f.vectors
            .put_vectors(MODEL, &tasks, &vectors)
            .await
            .unwrap(),
        1,
        "only f3 is stored"
    );
    let again = f.vectors.missing_vectors(MODEL, None, 100).await.unwrap();
    assert_eq!(ids(&again), vec!["f2"]);
    assert_eq!(again[0].text, "second text, edited");
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (1, 2));
}

/// Vectors of another model do not count: every document is missing for the new model, and
/// storing the new model's vectors replaces the old ones.
pub async fn another_model_is_missing_and_replaces_the_vector(f: &VectorIndexFixture) {
    let s = scope(Some("alice"), "coder");
    f.index
        .upsert(&s, &fact(&s, "f1", "Prefers oolong tea", "preference", 0.9))
        .await
        .unwrap();
    assert_eq!(put_all(f, MODEL).await, 1);
    assert_eq!(
        ids(&f
            .vectors
            .missing_vectors(OTHER_MODEL, None, 100)
            .await
            .unwrap()),
        vec!["f1"]
    );
    assert_eq!(
        f.vectors.vector_coverage(OTHER_MODEL).await.unwrap(),
        (0, 1)
    );
    assert!(
        f.vectors
            .scope_vectors(std::slice::from_ref(&s), OTHER_MODEL)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(put_all(f, OTHER_MODEL).await, 1);
    assert_eq!(
        f.vectors.vector_coverage(OTHER_MODEL).await.unwrap(),
        (1, 1)
    );
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (0, 1));
}

/// Removing a document or clearing its scope (or everything) deletes its vector: the same
/// text indexed again is missing.
pub async fn remove_and_clear_delete_vectors(f: &VectorIndexFixture) {
    let a = scope(Some("alice"), "coder");
    let b = scope(Some("bob"), "coder");
    let fa = fact(&a, "f1", "alpha text", "context", 0.5);
    let fb = fact(&b, "f1", "beta text", "context", 0.5);
    f.index.upsert(&a, &fa).await.unwrap();
    f.index.upsert(&b, &fb).await.unwrap();
    assert_eq!(put_all(f, MODEL).await, 2);

    f.index.remove(&a, "f1").await.unwrap();
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (1, 1));
    f.index.upsert(&a, &fa).await.unwrap();
    assert_eq!(
        f.vectors.missing_vectors(MODEL, None, 100).await.unwrap()[0].scope,
        a
    );
    assert_eq!(put_all(f, MODEL).await, 1);

    f.index.clear(Some(std::slice::from_ref(&a))).await.unwrap();
    f.index.upsert(&a, &fa).await.unwrap();
    let missing = f.vectors.missing_vectors(MODEL, None, 100).await.unwrap();
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].scope, a, "bob's vector is untouched");
    assert_eq!(put_all(f, MODEL).await, 1);

    f.index.clear(None).await.unwrap();
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (0, 0));
    f.index.upsert(&b, &fb).await.unwrap();
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (0, 1));
}

/// A rebuild keeps the vectors of documents that come back with the same text, makes changed
/// ones stale and deletes those of documents it dropped (indexed again later, they are missing).
pub async fn rebuild_keeps_unchanged_texts_and_drops_the_rest(f: &VectorIndexFixture) {
    let s = scope(Some("alice"), "coder");
    let other = scope(Some("bob"), "coder");
    let keep = fact(&s, "keep", "unchanged text", "context", 0.5);
    let edit = fact(&s, "edit", "old text", "context", 0.5);
    let gone = fact(&s, "gone", "dropped text", "context", 0.5);
    let bob = fact(&other, "b1", "bob's text", "context", 0.5);
    for (sc, fa) in [(&s, &keep), (&s, &edit), (&s, &gone), (&other, &bob)] {
        f.index.upsert(sc, fa).await.unwrap();
    }
    assert_eq!(put_all(f, MODEL).await, 4);
    let edited = fact(&s, "edit", "new text", "context", 0.5);
    f.index
        .rebuild(
            Some(std::slice::from_ref(&s)),
            &[(s.clone(), keep.clone()), (s.clone(), edited)],
        )
        .await
        .unwrap();
    let missing = f.vectors.missing_vectors(MODEL, None, 100).await.unwrap();
    assert_eq!(ids(&missing), vec!["edit"]);
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (2, 3));
    f.index.upsert(&s, &gone).await.unwrap();
    assert_eq!(
        ids(&f.vectors.missing_vectors(MODEL, None, 100).await.unwrap()),
        vec!["edit", "gone"]
    );
    // A full rebuild: bob's document is dropped, keep stays current.
    f.index
        .rebuild(None, &[(s.clone(), keep.clone())])
        .await
        .unwrap();
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (1, 1));
    f.index.upsert(&other, &bob).await.unwrap();
    assert_eq!(
        ids(&f.vectors.missing_vectors(MODEL, None, 100).await.unwrap()),
        vec!["b1"]
    );
}

/// `missing_vectors` lists only the given scopes and at most `limit`; `scope_vectors` never
/// returns another scope's documents.
pub async fn scopes_and_limits_are_respected(f: &VectorIndexFixture) {
    let a = scope(Some("alice"), "coder");
    let a2 = scope(Some("alice"), "writer");
    let b = scope(Some("bob"), "coder");
    for (sc, n) in [(&a, 3), (&a2, 2), (&b, 4)] {
        for i in 0..n {
            f.index
                .upsert(
                    sc,
                    &fact_with(sc, &format!("f{i}"), &format!("text {i}"), json!({})),
                )
                .await
                .unwrap();
        }
    }
    let only_a = f
        .vectors
        .missing_vectors(MODEL, Some(std::slice::from_ref(&a)), 100)
        .await
        .unwrap();
    assert_eq!(only_a.len(), 3);
    assert!(only_a.iter().all(|t| t.scope == a));
    let two = f
        .vectors
        .missing_vectors(MODEL, Some(&[a.clone(), b.clone()]), 5)
        .await
        .unwrap();
    assert_eq!(two.len(), 5);
    assert!(two.iter().all(|t| t.scope == a || t.scope == b));
    assert!(
        f.vectors
            .missing_vectors(MODEL, None, 0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        f.vectors
            .missing_vectors(MODEL, Some(&[]), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(put_all(f, MODEL).await, 9);
    let got = f
        .vectors
        .scope_vectors(&[a.clone(), a2.clone()], MODEL)
        .await
        .unwrap();
    assert_eq!(got.len(), 5);
    let a_scope = a.to_fact_scope();
    let a2_scope = a2.to_fact_scope();
    assert!(
        got.iter()
            .all(|(fact, _)| fact.scope == a_scope || fact.scope == a2_scope)
    );
    let unknown = scope(Some("carol"), "coder");
    assert!(
        f.vectors
            .scope_vectors(&[unknown], MODEL)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Task and vector counts that differ, or a vector with a non-finite component, are
/// `InvalidInput` and store nothing.
pub async fn mismatched_or_invalid_vectors_are_refused(f: &VectorIndexFixture) {
    let s: Scope = scope(Some("alice"), "coder");
    f.index
        .upsert(&s, &fact(&s, "f1", "text", "context", 0.5))
        .await
        .unwrap();
    let tasks = f.vectors.missing_vectors(MODEL, None, 10).await.unwrap();
    let err = f
        .vectors
        .put_vectors(MODEL, &tasks, &[])
        .await
        .expect_err("lengths differ");
    assert!(matches!(err, RetrievalError::InvalidInput(_)), "{err:?}");
    let err = f
        .vectors
        .put_vectors(MODEL, &tasks, &[vec![f32::NAN, 0.0, 1.0]])
        .await
        .expect_err("NaN");
    assert!(matches!(err, RetrievalError::InvalidInput(_)), "{err:?}");
    assert_eq!(f.vectors.vector_coverage(MODEL).await.unwrap(), (0, 1));
    assert_eq!(f.vectors.put_vectors(MODEL, &[], &[]).await.unwrap(), 0);
}

/// A deterministic unit vector of 4 components for fact number `i` (distinct directions, so
/// the ranking has no ties).
fn spread(i: usize) -> Vec<f32> {
    let x = i as f32;
    let v = [
        1.0 + (x * 0.7).sin(),
        (x * 1.3).cos(),
        0.2 * x,
        1.0 / (1.0 + x),
    ];
    let norm = v.iter().map(|c| c * c).sum::<f32>().sqrt();
    v.iter().map(|c| c / norm).collect()
}

/// `nearest` ranks the scopes' current vectors as `policy::fusion::nearest_calibrated` does
/// over `scope_vectors_tagged` (hub correction, script calibration, category filter, query
/// dimension), says `missing` while a document of the scopes has no vector, and `read_hits`
/// reads the facts of the hits it is given, dropping one whose document is gone.
pub async fn nearest_ranks_by_the_policy_and_reads_only_the_kept_facts(f: &VectorIndexFixture) {
    let a = scope(Some("alice"), "coder");
    let b = scope(Some("bob"), "coder");
    let scopes = [a.clone(), b.clone()];
    for i in 0..14 {
        let (sc, category) = if i < 11 {
            (&a, if i % 3 == 0 { "preference" } else { "context" })
        } else {
            (&b, "context")
        };
        let content = if i % 4 == 0 {
            format!("会弹古典吉他 {i}")
        } else {
            format!("plays basketball {i}")
        };
        f.index
            .upsert(sc, &fact(sc, &format!("f{i}"), &content, category, 0.5))
            .await
            .unwrap();
    }
    let tasks = f.vectors.missing_vectors(MODEL, None, 100).await.unwrap();
    let vectors: Vec<Vec<f32>> = tasks
        .iter()
        .map(|t| spread(t.fact_id[1..].parse().unwrap()))
        .collect();
    assert_eq!(
        f.vectors
            .put_vectors(MODEL, &tasks, &vectors)
            .await
            .unwrap(),
        14
    );
    let query_vector = spread(5);
    for (category, group) in [
        (None, ScriptGroup::Other),
        (Some("preference"), ScriptGroup::Cjk),
    ] {
        let tagged = f
            .vectors
            .scope_vectors_tagged(&scopes, MODEL)
            .await
            .unwrap();
        let candidates: Vec<((String, ScriptGroup), Vec<f32>)> = tagged
            .into_iter()
            .filter(|(fact, _, _)| category.is_none_or(|c| fact.category_or_default() == c))
            .map(|(fact, v, g)| ((fact.id.as_str().to_owned(), g), v))
            .collect();
        let expected: Vec<(String, f32)> =
            nearest_calibrated(&query_vector, group, &candidates, |(_, g)| *g, 6)
                .into_iter()
                .map(|((id, _), score)| (id.clone(), score))
                .collect();
        let asked = MeaningQuery {
            scopes: &scopes,
            model_id: MODEL,
            vector: &query_vector,
            group,
            category,
            limit: 6,
        };
        let got = f.vectors.nearest(&asked).await.unwrap();
        let got_ids: Vec<(String, f32)> = got
            .hits
            .iter()
            .map(|h| (h.fact_id.clone(), h.score))
            .collect();
        assert_eq!(
            got_ids.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            expected.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            "category {category:?}"
        );
        for ((_, g), (_, e)) in got_ids.iter().zip(&expected) {
            assert!((g - e).abs() < 1e-5, "score {g} against {e}");
        }
        assert!(!expected.is_empty());
    }
    // Another dimension ranks nothing; an unknown scope holds nothing.
    let short = [1.0f32, 0.0];
    let other_dim = MeaningQuery {
        scopes: &scopes,
        model_id: MODEL,
        vector: &short,
        group: ScriptGroup::Other,
        category: None,
        limit: 6,
    };
    assert!(f.vectors.nearest(&other_dim).await.unwrap().hits.is_empty());
    let carol = [scope(Some("carol"), "coder")];
    let unknown = MeaningQuery {
        scopes: &carol,
        ..other_dim
    };
    assert!(f.vectors.nearest(&unknown).await.unwrap().hits.is_empty());

    // The hits' facts are read. An index that ranks without reading them reads them now, so
    // one removed meanwhile is dropped; one that answered them with the ranking (the default)
    // read them in the ranking's snapshot and keeps them.
    let asked = MeaningQuery {
        vector: &query_vector,
        ..other_dim
    };
    let mut hits = f.vectors.nearest(&asked).await.unwrap().hits;
    assert_eq!(hits.len(), 6);
    let read_at_ranking = hits.iter().all(|h| h.fact.is_some());
    assert!(read_at_ranking || hits.iter().all(|h| h.fact.is_none()));
    let gone = hits[2].clone();
    f.index.remove(&gone.scope, &gone.fact_id).await.unwrap();
    f.vectors.read_hits(&mut hits).await.unwrap();
    if read_at_ranking {
        hits.retain(|h| h.fact_id != gone.fact_id);
    }
    assert_eq!(hits.len(), 5);
    for h in &hits {
        let fact = h.fact.as_ref().expect("read");
        assert_eq!(fact.id.as_str(), h.fact_id);
        assert_eq!(fact.scope, h.scope.to_fact_scope());
        let n: usize = h.fact_id[1..].parse().unwrap();
        assert!(fact.content.ends_with(&format!(" {n}")), "{}", fact.content);
    }
    assert!(hits.iter().all(|h| h.fact_id != gone.fact_id));

    // A document without a vector of the model is reported missing.
    f.index
        .upsert(
            &a,
            &fact(&a, "late", "written after the vectors", "context", 0.5),
        )
        .await
        .unwrap();
    assert!(f.vectors.nearest(&asked).await.unwrap().missing);
}

/// `word_ranking`, when an index answers it, lists what `search` answers in `bm25` mode: the
/// same facts of the same scopes in the same order, with the same BM25 relevance and match type
/// (across scopes, with a category, for CJK text, for no match at all); `read_hits` then reads
/// the same facts. The default answers `None` (the caller searches).
pub async fn word_ranking_is_the_bm25_search_unread(f: &VectorIndexFixture) {
    let a = scope(Some("alice"), "coder");
    let b = scope(Some("bob"), "coder");
    let scopes = vec![a.clone(), b.clone()];
    for i in 0..12u32 {
        let sc = if i % 3 == 0 { &b } else { &a };
        let category = if i % 2 == 0 { "preference" } else { "context" };
        let content = match i % 4 {
            0 => format!("会弹古典吉他 guitar {i}"),
            1 => format!("plays basketball every Sunday {i}"),
            2 => format!("basketball and guitar lessons {i}"),
            _ => format!("drinks oolong tea {i}"),
        };
        let confidence = 0.3 + 0.05 * f64::from(i);
        let written = fact(sc, &format!("w{i}"), &content, category, confidence);
        f.index.upsert(sc, &written).await.unwrap();
    }
    let cases = [
        ("basketball guitar", None, 10, true),
        ("guitar", Some("preference"), 3, true),
        ("古典吉他", None, 10, true),
        ("nothing here matches", None, 5, false),
    ];
    for (text, category, top_k, finds) in cases {
        let q = SearchQuery {
            text: text.into(),
            scopes: scopes.clone(),
            top_k,
            category: category.map(str::to_owned),
            mode: Some(SearchMode::Bm25),
        };
        let Some(words) = f.vectors.word_ranking(&q).await.unwrap() else {
            return;
        };
        let searched = f.index.search(&q).await.unwrap();
        assert_eq!(!searched.is_empty(), finds, "{text}: {searched:?}");
        let listed: Vec<_> = words
            .iter()
            .map(|w| (w.scope.to_fact_scope(), w.fact_id.clone(), w.match_type))
            .collect();
        let expected: Vec<_> = searched
            .iter()
            .map(|h| {
                (
                    h.fact.scope.clone(),
                    h.fact.id.as_str().to_owned(),
                    h.match_type,
                )
            })
            .collect();
        assert_eq!(listed, expected, "{text}");
        for (w, h) in words.iter().zip(&searched) {
            let bm25 = h.bm25.expect("a BM25 hit carries its relevance");
            assert!(
                (w.bm25 - bm25).abs() < 1e-9,
                "{text}: {} against {bm25}",
                w.bm25
            );
        }
        if text == "古典吉他" {
            assert!(
                words.iter().all(|w| w.match_type == MatchType::Cjk),
                "{words:?}"
            );
        }
        let mut hits: Vec<MeaningHit> = words
            .into_iter()
            .map(|w| MeaningHit {
                scope: w.scope,
                fact_id: w.fact_id,
                score: 0.0,
                fact: None,
            })
            .collect();
        f.vectors.read_hits(&mut hits).await.unwrap();
        let read: Vec<_> = hits.into_iter().map(|h| h.fact.expect("read")).collect();
        let facts: Vec<_> = searched.into_iter().map(|h| h.fact).collect();
        assert_eq!(read, facts, "{text}");
    }
}
