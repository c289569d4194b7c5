//! The retrieval contract suite and the in-memory substring index fake.
//!
//! Each `pub async fn` checks one sentence of the [`Retrieval`] contract against a fresh, empty
//! index. [`retrieval_contract!`](crate::retrieval_contract) expands one `#[test]` per
//! behaviour, so an adapter's `tests/contract.rs` is one line:
//!
//! ```text
//! deermem_testkit::retrieval_contract!(async { RetrievalFixture::new(MyIndex::new()) });
//! ```
//!
//! The suite only uses single-word or exact-phrase queries, so a substring index and a BM25
//! index both have one right answer.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Mutex;

use async_trait::async_trait;
use deermem_core::fact::{FactDraft, NormalizeContext, normalize_fact};
use deermem_core::policy::substring::{SubstringRules, substring_hits};
use deermem_core::ports::Retrieval;
use deermem_core::{
    AgentName, Fact, FactId, IndexedDoc, MatchType, RetrievalError, RetrievalStats, Scope,
    SearchHit, SearchQuery, Timestamp, UserId,
};
use serde_json::{Map, Value, json};

/// An index under test plus whatever must outlive it (a temporary directory...).
pub struct RetrievalFixture {
    index: Box<dyn Retrieval>,
    _guard: Option<Box<dyn Any + Send + Sync>>,
}

impl RetrievalFixture {
    /// A fixture owning only the index.
    pub fn new(index: impl Retrieval + 'static) -> Self {
        Self {
            index: Box::new(index),
            _guard: None,
        }
    }

    /// A fixture that also keeps `guard` alive (dropped after the index).
    pub fn with_guard(index: impl Retrieval + 'static, guard: impl Any + Send + Sync) -> Self {
        Self {
            index: Box::new(index),
            _guard: Some(Box::new(guard)),
        }
    }
}

impl fmt::Debug for RetrievalFixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetrievalFixture")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Deref for RetrievalFixture {
    type Target = dyn Retrieval;
    fn deref(&self) -> &Self::Target {
        &*self.index
    }
}

/// Expands one `#[test]` per retrieval contract behaviour, each on its own runtime
/// ([`block_on`](crate::block_on)). `$make` is an expression
/// evaluating to a future of a fresh, empty index (anything that derefs to `dyn Retrieval`,
/// such as [`RetrievalFixture`] or `Box<dyn Retrieval>`); it is evaluated once per test.
#[macro_export]
macro_rules! retrieval_contract {
    ($make:expr) => {
        $crate::retrieval_contract!(@tests $make;
            isolation_across_users_and_agents,
            upsert_replaces_the_same_id,
            remove_deletes_only_that_fact,
            blank_queries_and_zero_top_k_return_nothing,
            category_filter_applies_before_the_cut,
            hits_are_ordered_by_descending_score,
            hits_carry_the_indexed_fact,
            rebuild_replaces_listed_scopes_atomically,
            rebuild_of_everything_replaces_the_index,
            clear_listed_scopes_or_everything,
            hostile_queries_never_error,
            upsert_requires_an_agent,
            stats_count_documents,
            inventory_lists_every_document_with_its_scope_and_revision,
            close_is_idempotent_and_later_calls_fail,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::block_on(async {
                    let fixture = $make.await;
                    $crate::retrieval::$name(&*fixture).await;
                });
            }
        )*
    };
}

/// The creation time of every suite fact (all equal, so decay never decides an order).
pub const SUITE_CREATED_AT: &str = "2026-01-01T00:00:00Z";

/// A scope for a user (or the legacy no-user layout) and an agent.
///
/// # Panics
/// On an invalid user id or agent name (tests pass literals).
pub fn scope(user: Option<&str>, agent: &str) -> Scope {
    Scope::new(
        user.map(|u| UserId::new(u).unwrap_or_else(|e| panic!("user {u:?}: {e}"))),
        Some(AgentName::parse(agent).unwrap_or_else(|e| panic!("agent {agent:?}: {e}"))),
    )
}

/// A normalised fact with extra draft keys, recorded under `scope`.
///
/// # Panics
/// When the draft does not normalise (tests pass valid literals).
pub fn fact_with(scope: &Scope, id: &str, content: &str, extra: Value) -> Fact {
    let mut draft = Map::new();
    draft.insert("id".into(), json!(id));
    draft.insert("content".into(), json!(content));
    draft.insert("createdAt".into(), json!(SUITE_CREATED_AT));
    draft.insert("source".into(), json!("manual"));
    if let Value::Object(m) = extra {
        for (k, v) in m {
            draft.insert(k, v);
        }
    }
    let fs = scope.to_fact_scope();
    let fid = FactId::new(id).unwrap_or_else(|e| panic!("fact id {id:?}: {e}"));
    let new_id = move || fid.clone();
    let now = Timestamp::parse_iso(SUITE_CREATED_AT).unwrap_or_else(|| panic!("suite time"));
    let ctx = NormalizeContext {
        scope: &fs,
        existing: None,
        now,
        new_id: &new_id,
    };
    FactDraft::from_json(draft)
        .and_then(|d| normalize_fact(&d, &ctx))
        .unwrap_or_else(|e| panic!("fact {id:?}: {e}"))
}

/// A normalised fact with a category and confidence.
pub fn fact(scope: &Scope, id: &str, content: &str, category: &str, confidence: f64) -> Fact {
    fact_with(
        scope,
        id,
        content,
        json!({"category": category, "confidence": confidence}),
    )
}

async fn put(index: &dyn Retrieval, s: &Scope, f: &Fact) {
    index
        .upsert(s, f)
        .await
        .unwrap_or_else(|e| panic!("upsert {}: {e}", f.id));
}

async fn find(index: &dyn Retrieval, text: &str, scopes: &[Scope], top_k: usize) -> Vec<SearchHit> {
    let q = SearchQuery {
        text: text.to_owned(),
        scopes: scopes.to_vec(),
        top_k,
        category: None,
        mode: None,
    };
    index
        .search(&q)
        .await
        .unwrap_or_else(|e| panic!("search {text:?}: {e}"))
}

fn ids(hits: &[SearchHit]) -> Vec<&str> {
    hits.iter().map(|h| h.fact.id.as_str()).collect()
}

/// Isolation: a search returns only facts of the query's scopes, whatever the query; user ids
/// compare exactly (case, the no-user layout and a user literally named `null` are distinct).
pub async fn isolation_across_users_and_agents(index: &dyn Retrieval) {
    let scopes = [
        scope(Some("alice"), "coder"),
        scope(Some("bob"), "coder"),
        scope(Some("alice"), "researcher"),
        scope(None, "coder"),
        scope(Some("null"), "coder"),
        scope(Some("Alice"), "coder"),
        scope(Some("bob@example.com"), "__default__"),
    ];
    let tags = ["kiwi", "lime", "mango", "pear", "plum", "fig", "quince"];
    for (s, tag) in scopes.iter().zip(tags) {
        put(
            index,
            s,
            &fact(
                s,
                "shared-id",
                &format!("apple orchard note {tag}"),
                "context",
                0.8,
            ),
        )
        .await;
    }
    let hostile = [
        "apple",
        "orchard",
        "apple OR kiwi OR lime OR mango OR pear OR plum OR fig OR quince",
        "apple\" OR scope_user:*",
        "' OR 1=1 --",
        "*",
        "note",
        "alice",
        "null",
    ];
    for (i, s) in scopes.iter().enumerate() {
        let hits = find(index, "apple", std::slice::from_ref(s), 10).await;
        assert_eq!(
            hits.len(),
            1,
            "scope {s:?} sees exactly its own fact: {hits:?}"
        );
        assert!(
            hits[0].fact.content.ends_with(tags[i]),
            "scope {s:?}: {hits:?}"
        );
        assert_eq!(hits[0].fact.id.as_str(), "shared-id");
        for q in hostile {
            for h in find(index, q, std::slice::from_ref(s), 50).await {
                assert!(
                    h.fact.content.ends_with(tags[i]),
                    "query {q:?} in scope {s:?} leaked {:?}",
                    h.fact.content
                );
            }
        }
    }
    let both = find(index, "apple", &scopes[..2], 10).await;
    let mut got: Vec<&str> = both.iter().map(|h| h.fact.content.as_str()).collect();
    got.sort_unstable();
    assert_eq!(
        got,
        vec!["apple orchard note kiwi", "apple orchard note lime"]
    );
    let no_agent = Scope::new(
        Some(UserId::new("alice").unwrap_or_else(|e| panic!("{e}"))),
        None,
    );
    assert!(find(index, "apple", &[no_agent], 10).await.is_empty());
    let unknown = scope(Some("carol"), "coder");
    assert!(find(index, "apple", &[unknown], 10).await.is_empty());
}

/// Upsert replaces an earlier document with the same `(scope, id)`.
pub async fn upsert_replaces_the_same_id(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    put(index, &s, &fact(&s, "f1", "alpha keyword", "context", 0.5)).await;
    put(index, &s, &fact(&s, "f1", "bravo keyword", "context", 0.5)).await;
    assert!(
        find(index, "alpha", std::slice::from_ref(&s), 10)
            .await
            .is_empty()
    );
    let hits = find(index, "keyword", std::slice::from_ref(&s), 10).await;
    assert_eq!(ids(&hits), vec!["f1"], "one document per id");
    assert_eq!(hits[0].fact.content, "bravo keyword");
    assert_eq!(ids(&find(index, "bravo", &[s], 10).await), vec!["f1"]);
}

/// Remove deletes one document of one scope; removing an absent id is a no-op.
pub async fn remove_deletes_only_that_fact(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    let t = scope(Some("bob"), "coder");
    put(index, &s, &fact(&s, "a", "gamma one", "context", 0.5)).await;
    put(index, &s, &fact(&s, "b", "gamma two", "context", 0.5)).await;
    put(index, &t, &fact(&t, "a", "gamma three", "context", 0.5)).await;
    index
        .remove(&s, "a")
        .await
        .unwrap_or_else(|e| panic!("remove: {e}"));
    assert_eq!(
        ids(&find(index, "gamma", std::slice::from_ref(&s), 10).await),
        vec!["b"]
    );
    assert_eq!(
        ids(&find(index, "gamma", std::slice::from_ref(&t), 10).await),
        vec!["a"]
    );
    for absent in ["a", "missing", "../etc/passwd", "a\0b", ""] {
        index
            .remove(&s, absent)
            .await
            .unwrap_or_else(|e| panic!("removing absent {absent:?} must be a no-op: {e}"));
    }
    assert_eq!(ids(&find(index, "gamma", &[s], 10).await), vec!["b"]);
}

/// Blank queries, `top_k == 0` and no scopes return no hits.
pub async fn blank_queries_and_zero_top_k_return_nothing(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    put(
        index,
        &s,
        &fact(&s, "a", "word and more words", "context", 0.5),
    )
    .await;
    for blank in ["", "   ", "\u{3000}\n\t", "\u{85}"] {
        assert!(
            find(index, blank, std::slice::from_ref(&s), 10)
                .await
                .is_empty(),
            "{blank:?}"
        );
    }
    assert!(
        find(index, "word", std::slice::from_ref(&s), 0)
            .await
            .is_empty()
    );
    assert!(find(index, "word", &[], 10).await.is_empty());
    assert_eq!(find(index, "word", &[s], 10).await.len(), 1);
}

/// The category filter applies before the `top_k` cut; a fact without a category counts as
/// `context`.
pub async fn category_filter_applies_before_the_cut(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    put(index, &s, &fact(&s, "ctx", "tea tea tea", "context", 1.0)).await;
    put(index, &s, &fact(&s, "pref", "tea", "preference", 0.3)).await;
    put(
        index,
        &s,
        &fact_with(&s, "nocat", "tea maybe", json!({"confidence": 0.2})),
    )
    .await;
    let q = |category: Option<&str>, top_k: usize| SearchQuery {
        text: "tea".into(),
        scopes: vec![s.clone()],
        top_k,
        category: category.map(str::to_owned),
        mode: None,
    };
    let run = |q: SearchQuery| async move {
        index
            .search(&q)
            .await
            .unwrap_or_else(|e| panic!("search: {e}"))
    };
    assert_eq!(ids(&run(q(None, 1)).await), vec!["ctx"]);
    assert_eq!(ids(&run(q(Some("preference"), 1)).await), vec!["pref"]);
    assert!(run(q(Some("goal"), 5)).await.is_empty());
    let mut ctx = ids(&run(q(Some("context"), 5)).await)
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    ctx.sort();
    assert_eq!(ctx, vec!["ctx", "nocat"]);
}

/// Hits come by descending score, at most `top_k`; with equal text, higher confidence first.
pub async fn hits_are_ordered_by_descending_score(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    for (id, conf) in [
        ("c1", 0.1),
        ("c9", 0.9),
        ("c5", 0.5),
        ("c7", 0.7),
        ("c3", 0.3),
    ] {
        put(index, &s, &fact(&s, id, "delta report", "context", conf)).await;
    }
    let hits = find(index, "delta", std::slice::from_ref(&s), 3).await;
    assert_eq!(ids(&hits), vec!["c9", "c7", "c5"]);
    let all = find(index, "delta", &[s], 10).await;
    assert_eq!(all.len(), 5);
    assert!(
        all.windows(2).all(|w| w[0].score >= w[1].score),
        "scores must not increase: {:?}",
        all.iter().map(|h| h.score).collect::<Vec<_>>()
    );
}

/// A hit carries the fact as it was indexed, every field intact.
pub async fn hits_carry_the_indexed_fact(index: &dyn Retrieval) {
    let s = scope(Some("bob@example.com"), "researcher");
    let f = fact_with(
        &s,
        "fact_rich",
        "Prefers Rust for systems work.\nSecond line.",
        json!({
            "category": "workflow",
            "confidence": 0.75,
            "topics": ["rust", "lang"],
            "source": "thread-9",
            "lastConfirmedAt": "2026-02-01T00:00:00Z",
            "confirmationCount": 2,
            "expected_valid_days": 30,
            "custom": {"nested": [1, 2.5, null]}
        }),
    );
    put(index, &s, &f).await;
    let hits = find(index, "Rust", &[s], 5).await;
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].fact, f);
    assert_eq!(hits[0].fact.category_extension(), Some("workflow"));
    assert_ne!(hits[0].match_type, MatchType::Remote);
}

/// `rebuild(Some(scopes), facts)` replaces exactly those scopes; an unindexable fact fails it
/// as a whole with `InvalidInput`.
pub async fn rebuild_replaces_listed_scopes_atomically(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    let t = scope(Some("alice"), "researcher");
    put(index, &s, &fact(&s, "a", "echo one", "context", 0.5)).await;
    put(index, &s, &fact(&s, "b", "echo two", "context", 0.5)).await;
    put(index, &t, &fact(&t, "c", "echo three", "context", 0.5)).await;
    let n = index
        .rebuild(
            Some(std::slice::from_ref(&s)),
            &[(s.clone(), fact(&s, "d", "echo four", "context", 0.5))],
        )
        .await
        .unwrap_or_else(|e| panic!("rebuild: {e}"));
    assert_eq!(n, 1);
    assert_eq!(
        ids(&find(index, "echo", std::slice::from_ref(&s), 10).await),
        vec!["d"]
    );
    assert_eq!(
        ids(&find(index, "echo", std::slice::from_ref(&t), 10).await),
        vec!["c"]
    );

    let no_agent = Scope::new(
        Some(UserId::new("alice").unwrap_or_else(|e| panic!("{e}"))),
        None,
    );
    let bad = index
        .rebuild(
            Some(std::slice::from_ref(&s)),
            &[
                (s.clone(), fact(&s, "x", "echo five", "context", 0.5)),
                (no_agent.clone(), fact(&s, "y", "echo six", "context", 0.5)),
            ],
        )
        .await;
    assert!(
        matches!(bad, Err(RetrievalError::InvalidInput(_))),
        "{bad:?}"
    );
    assert_eq!(
        ids(&find(index, "echo", std::slice::from_ref(&s), 10).await),
        vec!["d"],
        "a failed rebuild replaces nothing"
    );
    // An empty rebuild of a scope empties it.
    index
        .rebuild(Some(std::slice::from_ref(&s)), &[])
        .await
        .unwrap_or_else(|e| panic!("rebuild: {e}"));
    assert!(
        find(index, "echo", std::slice::from_ref(&s), 10)
            .await
            .is_empty()
    );
    assert_eq!(ids(&find(index, "echo", &[t], 10).await), vec!["c"]);
}

/// `rebuild(None, facts)` replaces the whole index.
pub async fn rebuild_of_everything_replaces_the_index(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    let t = scope(None, "__default__");
    put(index, &s, &fact(&s, "a", "foxtrot one", "context", 0.5)).await;
    put(index, &t, &fact(&t, "b", "foxtrot two", "context", 0.5)).await;
    let facts = vec![
        (t.clone(), fact(&t, "c", "foxtrot three", "context", 0.5)),
        (t.clone(), fact(&t, "d", "foxtrot four", "context", 0.6)),
    ];
    let n = index
        .rebuild(None, &facts)
        .await
        .unwrap_or_else(|e| panic!("rebuild: {e}"));
    assert_eq!(n, 2);
    assert!(
        find(index, "foxtrot", std::slice::from_ref(&s), 10)
            .await
            .is_empty()
    );
    assert_eq!(ids(&find(index, "foxtrot", &[t], 10).await), vec!["d", "c"]);
    let stats = index.stats().await.unwrap_or_else(|e| panic!("stats: {e}"));
    assert_eq!(stats.total_docs, 2);
}

/// `clear(Some(scopes))` empties those scopes only; `clear(None)` empties everything.
pub async fn clear_listed_scopes_or_everything(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    let t = scope(Some("bob"), "coder");
    put(index, &s, &fact(&s, "a", "golf one", "context", 0.5)).await;
    put(index, &t, &fact(&t, "b", "golf two", "context", 0.5)).await;
    index
        .clear(Some(std::slice::from_ref(&s)))
        .await
        .unwrap_or_else(|e| panic!("clear: {e}"));
    assert!(
        find(index, "golf", std::slice::from_ref(&s), 10)
            .await
            .is_empty()
    );
    assert_eq!(
        ids(&find(index, "golf", std::slice::from_ref(&t), 10).await),
        vec!["b"]
    );
    index
        .clear(Some(&[]))
        .await
        .unwrap_or_else(|e| panic!("clear none: {e}"));
    assert_eq!(
        find(index, "golf", std::slice::from_ref(&t), 10)
            .await
            .len(),
        1
    );
    index
        .clear(None)
        .await
        .unwrap_or_else(|e| panic!("clear all: {e}"));
    assert!(
        find(index, "golf", &[s.clone(), t.clone()], 10)
            .await
            .is_empty()
    );
    assert_eq!(
        index
            .stats()
            .await
            .unwrap_or_else(|e| panic!("stats: {e}"))
            .total_docs,
        0
    );
    // The index still works afterwards.
    put(index, &s, &fact(&s, "c", "golf three", "context", 0.5)).await;
    assert_eq!(ids(&find(index, "golf", &[s], 10).await), vec!["c"]);
}

/// Query texts that hostile or confused callers send; none may be an error.
pub fn hostile_queries() -> Vec<String> {
    let mut v: Vec<String> = [
        "\"",
        "\"\"",
        "\"unbalanced",
        "unbalanced\"",
        "*",
        "**",
        "a*b*c",
        "NEAR",
        "NEAR(",
        "NEAR(a b",
        "a NEAR/3 b",
        "(",
        ")",
        "((a)",
        "a)",
        "AND",
        "OR OR",
        "NOT x",
        "x NOT",
        "^",
        "^x",
        "-x",
        "+",
        ":",
        "col:x",
        "content:x",
        "cjk:東",
        "{a b}: c",
        "\0",
        "a\0b",
        "!@#$%^&*()",
        "'; DROP TABLE docs; --",
        "🦌🚀",
        "שלום עולם",
        "e\u{301}\u{301}",
        "\u{FFFF}\u{10FFFF}",
        "\n\n\r\t",
        "東京*",
        "\"東京\" AND (",
        "乌龙茶 OR",
        "(東京)",
        "\"hello world\" NEAR",
        "x AND AND y",
        "x OR",
        "a\"b",
        "_",
        "___*",
        "\\",
        "%",
        "''",
        "\u{200b}",
        "ＡＮＤ",
        "echo\u{0}*",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.push("word ".repeat(20_000));
    v.push("(".repeat(50_000));
    v.push("\"a".repeat(30_000));
    v.push("東".repeat(40_000));
    v.push(format!("{}*", "x".repeat(100_000)));
    v
}

/// Any query text is accepted: invalid syntax is searched as words, never an error.
pub async fn hostile_queries_never_error(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    put(
        index,
        &s,
        &fact(&s, "a", "hello world of echo and x", "context", 0.5),
    )
    .await;
    put(
        index,
        &s,
        &fact(&s, "b", "東京に住んでいる。乌龙茶", "context", 0.5),
    )
    .await;
    for q in hostile_queries() {
        let query = SearchQuery::new(q.clone(), s.clone(), 10);
        let r = index.search(&query).await;
        let shown: String = q.chars().take(40).collect();
        let hits = r.unwrap_or_else(|e| panic!("query {shown:?} must not fail: {e}"));
        assert!(hits.len() <= 10, "query {shown:?}: top_k respected");
    }
    assert_eq!(ids(&find(index, "hello", &[s], 10).await), vec!["a"]);
}

/// Upsert needs an agent bucket in the scope.
pub async fn upsert_requires_an_agent(index: &dyn Retrieval) {
    let s = Scope::new(
        Some(UserId::new("alice").unwrap_or_else(|e| panic!("{e}"))),
        None,
    );
    let f = fact(&scope(Some("alice"), "coder"), "a", "hotel", "context", 0.5);
    let r = index.upsert(&s, &f).await;
    assert!(matches!(r, Err(RetrievalError::InvalidInput(_))), "{r:?}");
}

/// `stats` counts documents and names the adapter.
pub async fn stats_count_documents(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    let t = scope(Some("bob"), "coder");
    put(index, &s, &fact(&s, "a", "india one", "context", 0.5)).await;
    put(index, &s, &fact(&s, "b", "india two", "context", 0.5)).await;
    put(index, &t, &fact(&t, "a", "india three", "context", 0.5)).await;
    put(index, &s, &fact(&s, "a", "india one again", "context", 0.5)).await;
    let stats = index.stats().await.unwrap_or_else(|e| panic!("stats: {e}"));
    assert_eq!(stats.total_docs, 3);
    assert_eq!(stats.adapter, index.kind());
}

/// `inventory` lists every document once, under its scope, with the indexed revision; removals
/// and rebuilds are reflected (an adapter that cannot list answers `Unsupported`).
pub async fn inventory_lists_every_document_with_its_scope_and_revision(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    let t = scope(None, "__default__");
    put(index, &s, &fact(&s, "a", "lima one", "context", 0.5)).await;
    let mut b = fact_with(&s, "b", "lima two", json!({}));
    b.revision = 4;
    put(index, &s, &b).await;
    put(index, &t, &fact(&t, "a", "lima three", "context", 0.5)).await;
    put(index, &s, &fact(&s, "c", "lima four", "context", 0.5)).await;
    index
        .remove(&s, "c")
        .await
        .unwrap_or_else(|e| panic!("remove: {e}"));
    let mut docs = match index.inventory().await {
        Ok(d) => d,
        Err(RetrievalError::Unsupported { .. }) => return,
        Err(e) => panic!("inventory: {e}"),
    };
    docs.sort_by(|x, y| {
        (format!("{:?}", x.scope), &x.fact_id).cmp(&(format!("{:?}", y.scope), &y.fact_id))
    });
    let mut want = vec![
        IndexedDoc {
            scope: s.clone(),
            fact_id: "a".to_owned(),
            revision: Some(1),
        },
        IndexedDoc {
            scope: s.clone(),
            fact_id: "b".to_owned(),
            revision: Some(4),
        },
        IndexedDoc {
            scope: t.clone(),
            fact_id: "a".to_owned(),
            revision: Some(1),
        },
    ];
    want.sort_by(|x, y| {
        (format!("{:?}", x.scope), &x.fact_id).cmp(&(format!("{:?}", y.scope), &y.fact_id))
    });
    assert_eq!(docs, want);
}

/// `close` is idempotent and later calls fail with `Unavailable`.
pub async fn close_is_idempotent_and_later_calls_fail(index: &dyn Retrieval) {
    let s = scope(Some("alice"), "coder");
    put(index, &s, &fact(&s, "a", "juliet", "context", 0.5)).await;
    index.close().await;
    index.close().await;
    let r = index
        .search(&SearchQuery::new("juliet", s.clone(), 5))
        .await;
    assert!(matches!(r, Err(RetrievalError::Unavailable(_))), "{r:?}");
    let r = index
        .upsert(&s, &fact(&s, "b", "kilo", "context", 0.5))
        .await;
    assert!(matches!(r, Err(RetrievalError::Unavailable(_))), "{r:?}");
    assert!(matches!(
        index.stats().await,
        Err(RetrievalError::Unavailable(_))
    ));
}

#[derive(Debug, Default)]
struct SubstringState {
    docs: BTreeMap<Scope, BTreeMap<String, Fact>>,
    closed: bool,
}

/// An in-memory index that ranks case-insensitive substring matches by confidence, like the
/// reference's storage fallback: `0.0` (or a non-finite value) counts as `0.5`, ties keep scope
/// order then id order.
#[derive(Debug, Default)]
pub struct SubstringRetrieval {
    state: Mutex<SubstringState>,
}

impl SubstringRetrieval {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SubstringState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open(&self) -> Result<std::sync::MutexGuard<'_, SubstringState>, RetrievalError> {
        let st = self.lock();
        if st.closed {
            return Err(RetrievalError::Unavailable("substring index closed".into()));
        }
        Ok(st)
    }
}

fn need_agent(scope: &Scope) -> Result<(), RetrievalError> {
    if scope.agent.is_none() {
        return Err(RetrievalError::InvalidInput(
            "retrieval scope agentName must be set to index a fact".into(),
        ));
    }
    Ok(())
}

fn as_indexed(scope: &Scope, fact: &Fact) -> Fact {
    let mut f = fact.clone();
    f.scope = scope.to_fact_scope();
    f
}

#[async_trait]
impl Retrieval for SubstringRetrieval {
    fn kind(&self) -> &'static str {
        "substring"
    }

    async fn upsert(&self, scope: &Scope, fact: &Fact) -> Result<(), RetrievalError> {
        need_agent(scope)?;
        let mut st = self.open()?;
        st.docs
            .entry(scope.clone())
            .or_default()
            .insert(fact.id.as_str().to_owned(), as_indexed(scope, fact));
        Ok(())
    }

    async fn remove(&self, scope: &Scope, id: &str) -> Result<(), RetrievalError> {
        let mut st = self.open()?;
        if let Some(m) = st.docs.get_mut(scope) {
            m.remove(id);
        }
        Ok(())
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        if query.is_trivially_empty() {
            return Ok(Vec::new());
        }
        let st = self.open()?;
        let mut seen: Vec<&Scope> = Vec::new();
        let mut facts: Vec<&Fact> = Vec::new();
        for s in &query.scopes {
            if seen.contains(&s) {
                continue;
            }
            seen.push(s);
            facts.extend(st.docs.get(s).into_iter().flat_map(|docs| docs.values()));
        }
        Ok(substring_hits(facts, query, SubstringRules::INDEX))
    }

    async fn clear(&self, scopes: Option<&[Scope]>) -> Result<(), RetrievalError> {
        let mut st = self.open()?;
        match scopes {
            None => st.docs.clear(),
            Some(list) => {
                for s in list {
                    st.docs.remove(s);
                }
            }
        }
        Ok(())
    }

    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError> {
        for (s, _) in facts {
            need_agent(s)?;
        }
        let mut st = self.open()?;
        match scopes {
            None => st.docs.clear(),
            Some(list) => {
                for s in list {
                    st.docs.remove(s);
                }
            }
        }
        for (s, f) in facts {
            st.docs
                .entry(s.clone())
                .or_default()
                .insert(f.id.as_str().to_owned(), as_indexed(s, f));
        }
        Ok(facts.len())
    }

    async fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        let st = self.open()?;
        Ok(RetrievalStats {
            adapter: self.kind().to_owned(),
            total_docs: st.docs.values().map(|m| m.len() as u64).sum(),
            ..RetrievalStats::default()
        })
    }

    async fn inventory(&self) -> Result<Vec<IndexedDoc>, RetrievalError> {
        let st = self.open()?;
        Ok(st
            .docs
            .iter()
            .flat_map(|(scope, docs)| {
                docs.values().map(move |f| IndexedDoc {
                    scope: scope.clone(),
                    fact_id: f.id.as_str().to_owned(),
                    revision: Some(f.revision),
                })
            })
            .collect())
    }

    async fn close(&self) {
        self.lock().closed = true;
    }
}
