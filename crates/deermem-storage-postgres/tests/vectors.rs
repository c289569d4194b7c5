//! Vectors beside the storage's facts (`PgFactIndex`, the `fact_vectors` table) against a real
//! server: the storage's commits are the documents, so a changed text makes a vector stale,
//! and deleting a fact, clearing a user or replacing a bucket with a snapshot (`deermem
//! migrate`) deletes its vector; a second replica reads the same vectors; a damaged row or a
//! fact written before schema version 4 is listed as missing; hostile ids are data.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deermem_core::document::{ApplyOptions, ChangeSet};
use deermem_core::ports::{Clock, FactRepository, ScopedSearch, VectorIndex};
use deermem_core::{AgentName, Fact, FactId, Scope, UserId};
use deermem_storage_postgres::{
    PgDatabase, PgFactIndex, PgIndexedStorage, PgStorage, PostgresConfig,
};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::pgcluster::PgCluster;
use serde_json::{Value, json};

const MODEL: &str = "test:model@3";

fn next_schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "vectors_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::at("2026-12-03T00:00:00Z"))
}

async fn store(url: &str, schema: &str) -> PgDatabase {
    let mut c = PostgresConfig::new(url);
    c.schema = schema.into();
    c.pool_size = 4;
    let store = PgDatabase::connect(&c).await.unwrap();
    store.migrate().await.unwrap();
    store
}

/// One replica: the storage and the index over its facts.
async fn replica(url: &str, schema: &str) -> (Arc<PgStorage>, PgFactIndex, PgDatabase) {
    let store = store(url, schema).await;
    let storage = Arc::new(PgStorage::new(store.clone(), clock(), 30.0, 200));
    let index = PgFactIndex::new(Arc::clone(&storage), store.clone(), clock());
    (storage, index, store)
}

async fn put(storage: &PgStorage, user: &UserId, agent: &AgentName, draft: Value) -> Fact {
    storage
        .apply_changes(
            Some(user),
            Some(agent),
            ChangeSet {
                upserts: vec![deermem_core::FactDraft::try_from(draft).unwrap()],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap()
        .upserted_facts
        .into_iter()
        .next()
        .unwrap()
}

/// Replaces the content (and `extra` fields) of an existing fact at its current revision.
async fn update(
    storage: &PgStorage,
    user: &UserId,
    agent: &AgentName,
    fact: &Fact,
    draft: Value,
) -> Fact {
    let mut draft = draft.as_object().unwrap().clone();
    draft.insert("id".into(), json!(fact.id.as_str()));
    let fact = storage
        .get_fact(Some(user), agent, &fact.id)
        .await
        .unwrap()
        .unwrap();
    draft.insert("revision".into(), json!(fact.revision));
    storage
        .apply_changes(
            Some(user),
            Some(agent),
            ChangeSet {
                upserts: vec![deermem_core::FactDraft::from_json(draft).unwrap()],
                upsert_revisions: Some(
                    [(fact.id.clone(), Some(fact.revision))]
                        .into_iter()
                        .collect(),
                ),
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap()
        .upserted_facts
        .into_iter()
        .next()
        .unwrap()
}

async fn delete(storage: &PgStorage, user: &UserId, agent: &AgentName, id: &FactId) {
    storage
        .apply_changes(
            Some(user),
            Some(agent),
            ChangeSet {
                deletes: vec![id.clone()],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
}

fn unit(axis: usize) -> Vec<f32> {
    let mut v = vec![0.0; 3];
    v[axis % 3] = 1.0;
    v
}

/// Embeds everything missing with unit vectors; returns how many were stored.
async fn embed_all(index: &PgFactIndex) -> usize {
    let tasks = index.missing_vectors(MODEL, None, 1000).await.unwrap();
    let vectors: Vec<Vec<f32>> = (0..tasks.len()).map(unit).collect();
    index.put_vectors(MODEL, &tasks, &vectors).await.unwrap()
}

async fn vector_rows(store: &PgDatabase) -> i64 {
    store
        .client()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM fact_vectors", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_follow_the_storage_commits_on_every_replica() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (storage, index, store) = replica(cluster.url(), &schema).await;
    let (_, other, _) = replica(cluster.url(), &schema).await;
    let alice = UserId::new("alice").unwrap();
    let coder = AgentName::parse("coder").unwrap();
    let scope = Scope::new(Some(alice.clone()), Some(coder.clone()));

    let tea = put(
        &storage,
        &alice,
        &coder,
        json!({"content": "Prefers oolong tea", "category": "preference"}),
    )
    .await;
    let job = put(
        &storage,
        &alice,
        &coder,
        json!({"content": "Backend engineer"}),
    )
    .await;
    let tasks = index.missing_vectors(MODEL, None, 10).await.unwrap();
    let mut texts: Vec<&str> = tasks.iter().map(|t| t.text.as_str()).collect();
    texts.sort_unstable();
    assert_eq!(texts, ["Backend engineer", "Prefers oolong tea"]);
    assert!(tasks.iter().all(|t| t.scope == scope));
    assert_eq!(embed_all(&index).await, 2);

    // The other replica sees the vectors at once, with the facts as stored.
    assert_eq!(other.vector_coverage(MODEL).await.unwrap(), (2, 2));
    let got = other
        .scope_vectors(std::slice::from_ref(&scope), MODEL)
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    let (fact, vector) = got.iter().find(|(f, _)| f.id == tea.id).unwrap();
    assert_eq!(fact.content, "Prefers oolong tea");
    assert_eq!(fact.category.as_deref(), Some("preference"));
    assert_eq!(fact.scope.user_id.as_deref(), Some("alice"));
    assert_eq!(vector.len(), 3);

    // A new text makes the vector stale (listed with the new text); other metadata does not.
    let tea = update(
        &storage,
        &alice,
        &coder,
        &tea,
        json!({"content": "Prefers oolong tea", "confidence": 0.3}),
    )
    .await;
    assert!(
        index
            .missing_vectors(MODEL, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let tea = update(
        &storage,
        &alice,
        &coder,
        &tea,
        json!({"content": "Prefers green tea"}),
    )
    .await;
    let tasks = other.missing_vectors(MODEL, None, 10).await.unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].text, "Prefers green tea");
    assert_eq!(other.vector_coverage(MODEL).await.unwrap(), (1, 2));
    // A task listed before the text changed again stores nothing.
    update(
        &storage,
        &alice,
        &coder,
        &tea,
        json!({"content": "Prefers black tea"}),
    )
    .await;
    assert_eq!(
        other.put_vectors(MODEL, &tasks, &[unit(0)]).await.unwrap(),
        0
    );
    assert_eq!(embed_all(&other).await, 1);

    // Deleting a fact deletes its vector row.
    assert_eq!(vector_rows(&store).await, 2);
    delete(&storage, &alice, &coder, &job.id).await;
    assert_eq!(vector_rows(&store).await, 1);
    assert_eq!(index.vector_coverage(MODEL).await.unwrap(), (1, 1));

    // Replacing the bucket with a snapshot (what `deermem migrate` writes) leaves no vector
    // for the facts it replaced, even one with the same id and text.
    let now = clock().now();
    let snap = store
        .read_snapshot(alice.bucket(), now)
        .await
        .unwrap()
        .unwrap();
    store.write_snapshot(&snap).await.unwrap();
    assert_eq!(vector_rows(&store).await, 0);
    assert_eq!(index.vector_coverage(MODEL).await.unwrap(), (0, 1));
    assert_eq!(embed_all(&index).await, 1);

    // Clearing the user deletes every vector of it.
    storage.clear_all(Some(&alice)).await.unwrap();
    assert_eq!(vector_rows(&store).await, 0);
    assert_eq!(index.vector_coverage(MODEL).await.unwrap(), (0, 0));
    drop((index, other, storage, store));
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_rows_and_facts_from_before_the_digest_are_embedded_again() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (storage, index, store) = replica(cluster.url(), &schema).await;
    let user = UserId::new("o'brien\"; DROP TABLE facts; --").unwrap();
    let agent = AgentName::parse("coder").unwrap();
    let scope = Scope::new(Some(user.clone()), Some(agent.clone()));
    let fact = put(
        &storage,
        &user,
        &agent,
        json!({"content": "it's a '; DELETE FROM fact_vectors; -- test"}),
    )
    .await;
    assert_eq!(embed_all(&index).await, 1);
    let client = store.client().await.unwrap();

    // A damaged vector (a NULL component, the wrong length, NaN) is missing, never returned.
    for damage in [
        "UPDATE fact_vectors SET vec = '{1,NULL,0}'",
        "UPDATE fact_vectors SET vec = '{1,0}'",
        "UPDATE fact_vectors SET vec = '{NaN,0,0}'",
    ] {
        embed_all(&index).await;
        client.execute(damage, &[]).await.unwrap();
        assert!(
            index
                .scope_vectors(std::slice::from_ref(&scope), MODEL)
                .await
                .unwrap()
                .is_empty(),
            "{damage}"
        );
        assert_eq!(
            index.vector_coverage(MODEL).await.unwrap(),
            (0, 1),
            "{damage}"
        );
        let tasks = index.missing_vectors(MODEL, None, 10).await.unwrap();
        assert_eq!(tasks.len(), 1, "{damage}");
        assert_eq!(tasks[0].fact_id, fact.id.as_str());
    }
    assert_eq!(embed_all(&index).await, 1);

    // A fact written before schema version 4 has no digest (and no vector): it is listed, and
    // embedded.
    client
        .batch_execute("UPDATE facts SET content_digest = NULL; DELETE FROM fact_vectors")
        .await
        .unwrap();
    assert_eq!(index.vector_coverage(MODEL).await.unwrap(), (0, 1));
    let tasks = index
        .missing_vectors(MODEL, Some(std::slice::from_ref(&scope)), 10)
        .await
        .unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].text, "it's a '; DELETE FROM fact_vectors; -- test");
    assert_eq!(tasks[0].scope, scope);
    assert_eq!(
        index.put_vectors(MODEL, &tasks, &[unit(1)]).await.unwrap(),
        1
    );
    let got = index
        .scope_vectors(std::slice::from_ref(&scope), MODEL)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].0.content,
        "it's a '; DELETE FROM fact_vectors; -- test"
    );
    assert_eq!(got[0].1, unit(1));
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 12, "no table was dropped");
    drop(client);
    drop((index, storage, store));
    drop(cluster);
}

/// The storage behind a retrieval: a failing index answers with the storage's own search.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_indexed_storage_searches_through_the_index_and_reports_its_status() {
    use deermem_core::ports::Retrieval;
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (storage, index, _store) = replica(cluster.url(), &schema).await;
    let index = Arc::new(index);
    let indexed = PgIndexedStorage::new(
        Arc::clone(&storage),
        Arc::clone(&index) as Arc<dyn Retrieval>,
    );
    let user = UserId::new("alice").unwrap();
    let agent = AgentName::parse("coder").unwrap();
    put(
        &storage,
        &user,
        &agent,
        json!({"content": "Prefers oolong tea"}),
    )
    .await;
    let query = deermem_core::SearchQuery {
        text: "oolong".into(),
        scopes: vec![Scope::new(Some(user.clone()), Some(agent.clone()))],
        top_k: 5,
        category: None,
        mode: None,
    };
    assert_eq!(indexed.search_facts(&query).await.unwrap().len(), 1);
    let status = indexed.retrieval_status().await;
    assert_eq!(status.adapter.as_deref(), Some("postgres"));
    assert_eq!(status.total_docs, Some(1));
    // A closed index fails; the storage's own search answers.
    index.close().await;
    assert!(index.search(&query).await.is_err());
    assert_eq!(indexed.search_facts(&query).await.unwrap().len(), 1);
    drop((indexed, index, storage));
    drop(cluster);
}
