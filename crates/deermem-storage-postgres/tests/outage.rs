//! What the adapter says when the database cannot be reached, and that it recovers: with the
//! server stopped every storage operation fails with the storage port's `Unavailable` (never
//! an I/O error a gateway would turn into a 500), the reachability check fails, and once the
//! server is back the same storage works again without being rebuilt. A connection refused by
//! the server names PostgreSQL's own reason (a wrong password, a missing database) and never
//! the password.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use deermem_core::ports::{FactRepository, MemoryStorageExt as _, ScopedSearch};
use deermem_core::{AgentName, StorageError, UserId};
use deermem_storage_postgres::{Coherence, PgDatabase, PgError, PgStorage, PostgresConfig};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::pgcluster::PgCluster;
use deermem_testkit::storage::START;
use serde_json::json;

fn config(url: &str, coherence: Coherence) -> PostgresConfig {
    let mut c = PostgresConfig::new(url);
    c.schema = format!("outage_{}", std::process::id());
    c.pool_size = 2;
    c.connect_timeout_seconds = 1.0;
    c.coherence = coherence;
    c
}

fn draft(content: &str) -> deermem_core::FactDraft {
    deermem_core::FactDraft::try_from(
        json!({"content": content, "category": "context", "confidence": 0.9}),
    )
    .unwrap()
}

fn assert_unavailable<T: std::fmt::Debug>(what: &str, r: Result<T, StorageError>) {
    match r {
        Err(StorageError::Unavailable { .. }) => {}
        other => panic!("{what} with the database down: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_unavailable_and_the_storage_recovers_when_it_returns() {
    for coherence in [Coherence::Lease, Coherence::RevisionCheck] {
        let cluster = PgCluster::start_fresh().unwrap_or_else(|e| panic!("{e}"));
        let c = config(cluster.url(), coherence);
        let store = PgDatabase::connect(&c)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
        let storage = PgStorage::new(store.clone(), Arc::new(ManualClock::at(START)), 30.0, 200);
        let user = UserId::new("alice").unwrap();
        let agent = AgentName::default_bucket();
        storage
            .upsert_fact(Some(&user), &agent, draft("before"), None, None)
            .await
            .unwrap();
        store.ping().await.unwrap();

        cluster.stop().unwrap_or_else(|e| panic!("{e}"));
        let down = store.ping().await.expect_err("the server is stopped");
        assert!(down.is_unavailable(), "{down:?}");
        // A user never leased (every load reads the database) and a write.
        let other = UserId::new("bob").unwrap();
        assert_unavailable("a load", storage.load(Some(&other), Some(&agent)).await);
        assert_unavailable(
            "a create",
            storage
                .upsert_fact(Some(&user), &agent, draft("during"), None, None)
                .await,
        );
        assert_unavailable(
            "a search",
            storage
                .search_facts(&deermem_core::search::SearchQuery::new(
                    "before",
                    deermem_core::Scope::new(Some(user.clone()), Some(agent.clone())),
                    5,
                ))
                .await,
        );

        cluster.start_again().unwrap_or_else(|e| panic!("{e}"));
        // The pool replaces its broken connections: the same storage serves again.
        let mut recovered = None;
        for _ in 0..50 {
            match storage.load(Some(&user), Some(&agent)).await {
                Ok(doc) => {
                    recovered = Some(doc);
                    break;
                }
                Err(StorageError::Unavailable { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("after the restart: {e:?}"),
            }
        }
        let doc = recovered.expect("the storage serves again once the database is back");
        let contents: Vec<&str> = doc.facts.iter().map(|f| f.content.as_str()).collect();
        assert_eq!(contents, ["before"], "{coherence:?}");
        store.ping().await.unwrap();
        storage
            .upsert_fact(Some(&user), &agent, draft("after"), None, None)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_names_postgresqls_reason_without_the_password() {
    let cluster = PgCluster::start_fresh().unwrap_or_else(|e| panic!("{e}"));

    let missing = config(&cluster.database_url("no_such_db"), Coherence::Lease);
    let e = PgDatabase::connect(&missing)
        .await
        .expect_err("no such database");
    assert!(matches!(e, PgError::Connect { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("database \"no_such_db\" does not exist"),
        "{e}"
    );

    let password = "s3cret-never-shown";
    cluster
        .require_password("pw_user", password)
        .unwrap_or_else(|e| panic!("{e}"));
    let wrong = "wrong-pass-never-shown";
    let url = cluster
        .url()
        .replacen("://deermem@", &format!("://pw_user:{wrong}@"), 1);
    // The server reloads its configuration asynchronously: until it has, trust lets anyone in.
    let mut message = String::new();
    for _ in 0..50 {
        match PgDatabase::connect(&config(&url, Coherence::Lease)).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                message = e.to_string();
                break;
            }
        }
    }
    assert!(
        message.contains("password authentication failed for user \"pw_user\""),
        "{message}"
    );
    assert!(
        !message.contains(wrong) && !message.contains(password),
        "{message}"
    );

    // The right password connects.
    let right = cluster
        .url()
        .replacen("://deermem@", &format!("://pw_user:{password}@"), 1);
    PgDatabase::connect(&config(&right, Coherence::Lease))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}
