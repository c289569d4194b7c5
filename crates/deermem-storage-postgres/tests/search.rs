//! Full-text search in PostgreSQL against the FTS5 adapter and against hostile input: the
//! reference's fixture facts indexed in both find the same facts for English, Chinese and
//! Japanese queries; the storage's search sees every commit at once, reports its match types and
//! status truthfully, and takes SQL metacharacters in queries, content and categories as data.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deermem_core::document::{ApplyOptions, ChangeSet};
use deermem_core::ports::{Clock, FactRepository, Retrieval, ScopedSearch};
use deermem_core::{
    AgentName, Fact, MatchType, Scope, SearchHit, SearchQuery, StorageError, UserId,
};
use deermem_retrieval_fts5::Fts5Retrieval;
use deermem_storage_file::{FileStorage, FileStorageConfig};
use deermem_storage_postgres::{PgDatabase, PgRetrieval, PgStorage, PostgresConfig};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::pgcluster::PgCluster;
use serde_json::{Value, json};

fn next_schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "search_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::at("2026-12-03T00:00:00Z"))
}

async fn store(cluster: &PgCluster, schema: &str) -> PgDatabase {
    let mut c = PostgresConfig::new(cluster.url());
    c.schema = schema.into();
    c.pool_size = 4;
    let store = PgDatabase::connect(&c).await.unwrap();
    store.migrate().await.unwrap();
    store
}

/// Every fact of the reference's `v2-root`, with its scope (a scratch copy is read, so the
/// committed fixture is never touched).
async fn fixture_facts() -> (Vec<(Scope, Fact)>, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    deermem_testkit::fixtures::copy_tree(
        &deermem_testkit::fixtures::python_deermem_path("v2-root"),
        tmp.path(),
    );
    let files = FileStorage::new(FileStorageConfig::new(tmp.path()), clock(), None).unwrap();
    let expected = deermem_testkit::fixtures::python_expected();
    let mut out = Vec::new();
    for key in expected["v2"].as_object().unwrap().keys() {
        // Keys are `user|agent`.
        let (u, a) = key.split_once('|').unwrap();
        let user = Some(UserId::new(u).unwrap());
        let agent = AgentName::parse(a).unwrap();
        let scope = Scope::new(user.clone(), Some(agent.clone()));
        for f in files
            .load(user.as_ref(), Some(&agent))
            .await
            .unwrap()
            .facts
            .iter()
        {
            out.push((scope.clone(), f.clone()));
        }
    }
    (out, tmp)
}

fn ids(hits: &[SearchHit]) -> BTreeSet<String> {
    hits.iter().map(|h| h.fact.id.to_string()).collect()
}

fn query(text: &str, scopes: &[Scope], top_k: usize) -> SearchQuery {
    SearchQuery {
        text: text.into(),
        scopes: scopes.to_vec(),
        top_k,
        category: None,
        mode: None,
    }
}

/// The queries of the recall test: every word of the English facts, pairs of them, a few
/// written as people type them, and misses.
fn english_queries(facts: &[(Scope, Fact)]) -> Vec<String> {
    let mut words = BTreeSet::new();
    for (_, f) in facts {
        if f.content
            .chars()
            .any(deermem_core::policy::text::cjk::is_cjk)
        {
            continue;
        }
        for w in f.content.split(|c: char| !c.is_ascii_alphanumeric()) {
            if w.len() > 1 {
                words.insert(w.to_ascii_lowercase());
            }
        }
    }
    let words: Vec<String> = words.into_iter().collect();
    assert!(words.len() > 40, "the fixture has English facts: {words:?}");
    let mut queries: Vec<String> = words.clone();
    for pair in words.chunks(2) {
        queries.push(pair.join(" "));
    }
    for q in [
        "Rust python",
        "async-std",
        "2027-03-01",
        "PostgreSQL 16",
        "Café",
        "cafe",
        "naive",
        "ZÜRICH",
        "dog's name",
        "back\\slash",
        "user's",
        "'single'",
        "peanuts;",
        "marathon hours",
        "zebra",
        "quantum entanglement",
        "xylophone",
    ] {
        queries.push(q.to_owned());
    }
    queries
}

/// The recall test: FTS5 and PostgreSQL (the retrieval port and the storage's own search)
/// over the same facts find the same facts for every query, in every scope and in all scopes
/// at once, with `top_k` above the number of facts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_recall_equals_fts5_on_the_reference_fixtures() {
    let (facts, _tmp) = fixture_facts().await;
    assert!(facts.len() >= 40, "{} fixture facts", facts.len());
    let fts5 = Fts5Retrieval::in_memory(clock()).unwrap();
    let cluster = PgCluster::start().unwrap();
    let schema = next_schema();
    let pg = PgRetrieval::new(store(&cluster, &schema).await, clock());
    let storage = PgStorage::new(store(&cluster, &schema).await, clock(), 30.0, 200);
    let mut scopes: Vec<Scope> = Vec::new();
    for (scope, fact) in &facts {
        fts5.upsert(scope, fact).await.unwrap();
        pg.upsert(scope, fact).await.unwrap();
        // A create: the draft carries no expected revision.
        let mut draft = fact.to_draft();
        draft.remove("revision");
        storage
            .apply_changes(
                scope.user.as_ref(),
                scope.agent.as_ref(),
                ChangeSet {
                    upserts: vec![draft],
                    ..ChangeSet::default()
                },
                ApplyOptions::default(),
            )
            .await
            .unwrap();
        if !scopes.contains(scope) {
            scopes.push(scope.clone());
        }
    }
    let top_k = facts.len() + 1;
    let mut compared = 0;
    let mut found = 0;
    let cjk_queries = [
        "乌龙茶",
        "咖啡",
        "喜欢",
        "茶",
        "東京",
        "住んでいる",
        "日本語",
        "テキスト",
        "用户 Rust",
    ];
    let english = english_queries(&facts);
    for text in english.iter().map(String::as_str).chain(cjk_queries) {
        let mut groups: Vec<Vec<Scope>> = scopes.iter().map(|s| vec![s.clone()]).collect();
        groups.push(scopes.clone());
        for group in &groups {
            let q = query(text, group, top_k);
            let want = fts5.search(&q).await.unwrap();
            let from_index = pg.search(&q).await.unwrap();
            let from_storage = storage.search_facts(&q).await.unwrap();
            assert_eq!(
                ids(&from_index),
                ids(&want),
                "retrieval port, {text:?} in {group:?}"
            );
            assert_eq!(
                ids(&from_storage),
                ids(&want),
                "storage, {text:?} in {group:?}"
            );
            for h in from_index.iter().chain(&from_storage) {
                let same = want.iter().find(|x| x.fact.id == h.fact.id).unwrap();
                assert_eq!(h.match_type, same.match_type, "{text:?}: {}", h.fact.id);
            }
            compared += 1;
            found += want.len();
        }
    }
    assert!(
        compared > 500 && found > 500,
        "{compared} searches, {found} hits"
    );
    // The CJK queries find their facts.
    let all = scopes.clone();
    for (text, needle) in [
        ("乌龙茶", "乌龙茶"),
        ("東京", "東京に住んでいる"),
        ("住んでいる", "東京に住んでいる"),
        ("咖啡", "不喜欢咖啡"),
    ] {
        let hits = storage.search_facts(&query(text, &all, 10)).await.unwrap();
        assert!(
            hits.iter().any(|h| h.fact.content.contains(needle)),
            "{text:?}: {:?}",
            hits.iter().map(|h| &h.fact.content).collect::<Vec<_>>()
        );
        assert!(
            hits.iter().all(|h| h.match_type == MatchType::Cjk),
            "{text:?}"
        );
    }
    pg.close().await;
    drop((pg, storage));
    drop(cluster);
}

async fn put(storage: &PgStorage, user: &UserId, agent: &AgentName, draft: Value) -> Fact {
    let r = storage
        .apply_changes(
            Some(user),
            Some(agent),
            ChangeSet {
                upserts: vec![deermem_core::FactDraft::try_from(draft.clone()).unwrap()],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    r.upserted_facts.into_iter().next().unwrap()
}

/// Commits `drafts` to one scope in one change set.
async fn put_all(storage: &PgStorage, user: &UserId, agent: &AgentName, drafts: Vec<Value>) {
    storage
        .apply_changes(
            Some(user),
            Some(agent),
            ChangeSet {
                upserts: drafts
                    .into_iter()
                    .map(|d| deermem_core::FactDraft::try_from(d).unwrap())
                    .collect(),
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
}

/// BM25's document frequencies count every match of the scope: from the candidates when they
/// are all the matches, from the scope when a category filter or the candidate cap (1,000)
/// leaves some out. Each hit's `bm25` is compared with FTS5's formula over the scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_frequencies_count_every_match_of_the_scope() {
    use deermem_core::policy::text::rank::{bm25_idf, bm25_term};
    let cluster = PgCluster::start().unwrap();
    let schema = next_schema();
    let storage = PgStorage::new(store(&cluster, &schema).await, clock(), 30.0, 200);
    let user = UserId::new("frequencies").unwrap();
    let agent = AgentName::parse("coder").unwrap();
    // 12 facts of three words each; "alpha" in 4 of them, 3 of those in `goal`.
    let mut drafts = Vec::new();
    for i in 0..4 {
        let category = if i < 3 { "goal" } else { "context" };
        drafts.push(json!({"content": format!("alpha beta g{i}"), "category": category}));
    }
    for i in 0..8 {
        drafts.push(json!({"content": format!("delta epsilon d{i}"), "category": "goal"}));
    }
    put_all(&storage, &user, &agent, drafts).await;
    let scope = Scope::new(Some(user.clone()), Some(agent.clone()));
    let want = bm25_term(bm25_idf(12, 4), 1, 3, 3.0);
    let hits = storage
        .search_facts(&query("alpha", std::slice::from_ref(&scope), 10))
        .await
        .unwrap();
    assert_eq!(hits.len(), 4);
    for h in &hits {
        assert!(
            (h.bm25.unwrap() - want).abs() < 1e-12,
            "{:?} vs {want}",
            h.bm25
        );
    }
    let mut goal = query("alpha", std::slice::from_ref(&scope), 10);
    goal.category = Some("goal".into());
    let hits = storage.search_facts(&goal).await.unwrap();
    assert_eq!(hits.len(), 3, "the filter applies before the cut");
    for h in &hits {
        // Frequencies of the whole scope (4 of 12), not of the 3 filtered candidates.
        assert!(
            (h.bm25.unwrap() - want).abs() < 1e-12,
            "{:?} vs {want}",
            h.bm25
        );
    }

    // 1,001 matches of "omega" among 2,100 facts: the candidates stop at 1,000.
    let bulk = AgentName::parse("bulk").unwrap();
    let drafts = (0..2100)
        .map(|i| {
            let word = if i < 1001 { "omega" } else { "filler" };
            json!({"content": format!("{word} n{i}")})
        })
        .collect();
    put_all(&storage, &user, &bulk, drafts).await;
    let bulk_scope = Scope::new(Some(user.clone()), Some(bulk));
    let hits = storage
        .search_facts(&query("omega", std::slice::from_ref(&bulk_scope), 1))
        .await
        .unwrap();
    let want = bm25_term(bm25_idf(2100, 1001), 1, 2, 2.0);
    let cut = bm25_term(bm25_idf(2100, 1000), 1, 2, 2.0);
    assert!((want - cut).abs() > 1e-6, "the test tells 1,001 from 1,000");
    assert_eq!(hits.len(), 1);
    assert!(
        (hits[0].bm25.unwrap() - want).abs() < 1e-12,
        "{:?} vs {want} (cut: {cut})",
        hits[0].bm25
    );
    storage.close().await;
    drop(storage);
    drop(cluster);
}

/// The storage's search: a commit is searchable from another replica at once and a delete
/// disappears; English hits are `fts5`, CJK-only hits `cjk`, a query without an indexable term
/// falls back to the substring scan; the category filters before the cut; the status names
/// the adapter and counts the facts; a rebuild recomputes the search columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_search_follows_commits_and_reports_the_truth() {
    let cluster = PgCluster::start().unwrap();
    let schema = next_schema();
    let a = PgStorage::new(store(&cluster, &schema).await, clock(), 30.0, 200);
    let b = PgStorage::new(store(&cluster, &schema).await, clock(), 30.0, 200);
    let user = UserId::new("alice").unwrap();
    let agent = AgentName::parse("coder").unwrap();
    let scope = Scope::new(Some(user.clone()), Some(agent.clone()));
    let tea = put(&a, &user, &agent, json!({"content": "Drinks oolong tea 乌龙茶 daily", "category": "preference", "confidence": 0.9})).await;
    let cpp = put(
        &a,
        &user,
        &agent,
        json!({"content": "Writes C++ at work", "category": "context", "confidence": 0.5}),
    )
    .await;
    let q = |text: &str, top_k: usize| query(text, std::slice::from_ref(&scope), top_k);
    // Replica b sees a's commits.
    let hits = b.search_facts(&q("oolong", 5)).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].fact, tea);
    assert_eq!(hits[0].match_type, MatchType::Fts5);
    assert!(hits[0].bm25.unwrap() > 0.0);
    let hits = b.search_facts(&q("乌龙茶", 5)).await.unwrap();
    assert_eq!((hits.len(), hits[0].match_type), (1, MatchType::Cjk));
    // Both kinds of term: the word decides.
    let hits = b.search_facts(&q("tea 乌龙", 5)).await.unwrap();
    assert_eq!(hits[0].match_type, MatchType::Fts5);
    // No indexable term: the substring scan.
    let hits = b.search_facts(&q("++", 5)).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(
        (hits[0].fact.id.clone(), hits[0].match_type),
        (cpp.id.clone(), MatchType::Substring)
    );
    // Category before the cut.
    let mut by_cat = q("tea work", 1);
    by_cat.category = Some("context".into());
    assert_eq!(
        ids(&b.search_facts(&by_cat).await.unwrap()),
        BTreeSet::from([cpp.id.to_string()])
    );
    // A delete disappears from search in the same commit.
    a.apply_changes(
        Some(&user),
        Some(&agent),
        ChangeSet {
            deletes: vec![tea.id.clone()],
            ..ChangeSet::default()
        },
        ApplyOptions::default(),
    )
    .await
    .unwrap();
    assert!(
        b.search_facts(&q("oolong 乌龙茶", 5))
            .await
            .unwrap()
            .is_empty()
    );
    // Status: the adapter and the count.
    let status = b.retrieval_status().await;
    assert!(status.configured);
    assert_eq!(status.adapter.as_deref(), Some("postgres"));
    assert_eq!(status.total_docs, Some(1));
    assert!(b.capabilities().retrieval);
    // A rebuild recomputes the columns of every fact.
    let client = a_client(&cluster, &schema).await;
    client
        .execute("UPDATE facts SET search_text = '', search_tokens = 0", &[])
        .await
        .unwrap();
    assert!(b.search_facts(&q("work", 5)).await.unwrap().is_empty());
    let report = b.rebuild_index(None).await.unwrap();
    assert!(report.supported);
    assert_eq!((report.indexed, report.failed), (1, 0));
    assert_eq!(b.search_facts(&q("work", 5)).await.unwrap().len(), 1);
    // With nothing stale a rebuild (the manager's lazy warm-up) rewrites no row.
    let xmin = "SELECT xmin::text FROM facts ORDER BY id";
    let before: Vec<String> = client
        .query(xmin, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let report = b
        .rebuild_index(Some(&[(Some(user.clone()), agent.clone())]))
        .await
        .unwrap();
    assert_eq!((report.indexed, report.failed), (1, 0));
    let after: Vec<String> = client
        .query(xmin, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(before, after);
    drop((a, b, client));
    drop(cluster);
}

async fn a_client(cluster: &PgCluster, schema: &str) -> deadpool_postgres::Object {
    store(cluster, schema).await.client().await.unwrap()
}

/// SQL metacharacters in content, ids, users, agents, queries and categories are data: facts
/// are stored and found verbatim, nothing else changes, and a NUL in the category is refused
/// by a typed error (in the query it separates words, as in FTS5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_metacharacters_in_search_are_data() {
    let cluster = PgCluster::start().unwrap();
    let schema = next_schema();
    let s = PgStorage::new(store(&cluster, &schema).await, clock(), 30.0, 200);
    let index = PgRetrieval::new(store(&cluster, &schema).await, clock());
    let user = UserId::new("o'brien\"; DROP TABLE facts; --").unwrap();
    let agent = AgentName::parse("coder").unwrap();
    let scope = Scope::new(Some(user.clone()), Some(agent.clone()));
    let contents = [
        "O'Brien's \"quoted\" note; -- not a comment",
        "path C:\\temp\\new and 100% of a_b",
        "tsquery :* & | ! ( ) operators <-> here",
        "dollar $$quoted$$ body and $1 params",
        "semicolon; DROP TABLE users; -- end",
    ];
    let mut stored = Vec::new();
    for c in contents {
        let f = put(
            &s,
            &user,
            &agent,
            json!({"content": c, "category": "context", "confidence": 0.5}),
        )
        .await;
        index.upsert(&scope, &f).await.unwrap();
        stored.push(f);
    }
    let queries: [(&str, Option<usize>); 14] = [
        ("O'Brien's", Some(0)),
        ("\"quoted\"", Some(0)),
        ("C:\\temp\\new", Some(1)),
        ("100%", Some(1)),
        ("a_b", Some(1)),
        ("operators :*", Some(2)),
        ("&|!() <->", None),
        ("$$quoted$$", Some(3)),
        ("$1", Some(3)),
        ("'; DROP TABLE users; --", Some(4)),
        ("' OR 1=1 --", None),
        ("\\", None),
        ("%_", None),
        ("\0semicolon\0", Some(4)),
    ];
    for (text, expect) in queries {
        for hits in [
            s.search_facts(&query(text, std::slice::from_ref(&scope), 10))
                .await
                .unwrap(),
            index
                .search(&query(text, std::slice::from_ref(&scope), 10))
                .await
                .unwrap(),
        ] {
            for h in &hits {
                assert!(
                    contents.contains(&h.fact.content.as_str()),
                    "{text:?}: verbatim"
                );
            }
            if let Some(i) = expect {
                assert!(
                    hits.iter()
                        .any(|h| h.fact.id == stored[i].id && h.fact.content == contents[i]),
                    "{text:?} finds {:?}: {:?}",
                    contents[i],
                    hits.iter().map(|h| &h.fact.content).collect::<Vec<_>>()
                );
            }
        }
    }
    // The retrieval suite's hostile queries are no error for the storage's search either.
    for text in deermem_testkit::retrieval::hostile_queries() {
        let shown: String = text.chars().take(40).collect();
        let hits = s
            .search_facts(&query(&text, std::slice::from_ref(&scope), 10))
            .await
            .unwrap_or_else(|e| panic!("{shown:?}: {e}"));
        assert!(hits.len() <= 10);
    }
    // Categories with metacharacters match nothing and break nothing; NUL is refused.
    for cat in ["context'; --", "%", "_", "context\\", "$$"] {
        let mut q = query("note", std::slice::from_ref(&scope), 10);
        q.category = Some(cat.into());
        assert!(s.search_facts(&q).await.unwrap().is_empty(), "{cat:?}");
        assert!(index.search(&q).await.unwrap().is_empty(), "{cat:?}");
    }
    let mut q = query("note", std::slice::from_ref(&scope), 10);
    q.category = Some("context\0".into());
    assert!(matches!(
        s.search_facts(&q).await,
        Err(StorageError::InvalidInput { ref field, .. }) if field == "category"
    ));
    assert!(matches!(
        index.search(&q).await,
        Err(deermem_core::RetrievalError::InvalidInput(_))
    ));
    // Nothing else changed: every fact is there, verbatim, under its odd user.
    let doc = s.load(Some(&user), Some(&agent)).await.unwrap();
    let mut got: Vec<&str> = doc.facts.iter().map(|f| f.content.as_str()).collect();
    got.sort_unstable();
    let mut want = contents.to_vec();
    want.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(doc.revision, 5);
    assert_eq!(index.stats().await.unwrap().total_docs, 5);
    drop((s, index));
    drop(cluster);
}
