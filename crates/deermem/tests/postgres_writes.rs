//! Truthful writes with `storage_class: postgres`: a create whose commit succeeded is answered
//! with the created fact even when the database goes away right after it (while the write
//! waits for a dead replica's lease, and before the document is read again); a create retried
//! under the same idempotency key returns the stored fact instead of a duplicate or a
//! conflict; and creates of distinct facts through several replicas never surface a conflict.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "storage-postgres")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deermem::Backend;
use deermem_core::ports::{FactRepository as _, MemoryManagerExt as _};
use deermem_core::ports::{MemoryManager as _, MemoryScope, NewFact};
use deermem_core::{AgentName, ManagerError, MemoryConfig, UserId};
use deermem_engine::DeerMemManager;
use deermem_storage_postgres::{Coherence, PgDatabase, PgStorage, PostgresConfig};
use deermem_testkit::pgcluster::PgCluster;

fn schema(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn config(url: &str, schema: &str, lease_seconds: f64) -> MemoryConfig {
    let yaml = format!(
        "memory:\n  backend_config:\n    storage_class: postgres\n    max_facts: 500\n    postgres:\n      url: {url}\n      schema: {schema}\n      pool_size: 3\n      connect_timeout_seconds: 1\n      coherence: lease\n      lease_seconds: {lease_seconds}\n"
    );
    deermem::load_config_text(&yaml, &|_| None)
        .unwrap_or_else(|e| panic!("config does not load: {e}\n{yaml}"))
        .memory
}

fn build(cfg: &MemoryConfig) -> Arc<DeerMemManager> {
    let env = |_: &str| None;
    let dir = std::env::temp_dir();
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(dir);
    match deermem::build_backend(cfg, opts).unwrap_or_else(|e| panic!("build: {e}")) {
        Backend::DeerMem(m, _) => m,
        other => panic!("expected DeerMem, got {}", other.class()),
    }
}

fn scope(user: &str) -> MemoryScope {
    MemoryScope::new(Some(UserId::new(user).unwrap()), None)
}

fn count_content(doc: &deermem_core::PublicMemoryDocument, content: &str) -> usize {
    doc.facts.iter().filter(|f| f.content == content).count()
}

/// The reproduction: lease mode; replica B reads user U and is killed (its lease row stays,
/// nobody answers for it); a create for U on replica A; the database stopped 0.5 s later,
/// while A waits out B's lease. The commit happened, so the answer is the created fact; the
/// fact is stored; a retry under the same idempotency key returns it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_create_is_answered_with_its_fact_when_the_database_goes_away() {
    let cluster = Arc::new(PgCluster::start_fresh().unwrap_or_else(|e| panic!("{e}")));
    let schema = schema("writes");
    let lease = 2.0;
    let a = build(&config(cluster.url(), &schema, lease));
    let user = UserId::new("u").unwrap();
    a.create_fact(NewFact::new("first"), scope("u"))
        .await
        .unwrap();

    // Replica B: reads U under a lease, then dies without a word.
    let mut c = PostgresConfig::new(cluster.url());
    c.schema.clone_from(&schema);
    c.coherence = Coherence::Lease;
    c.lease_seconds = lease;
    let b_store = PgDatabase::connect(&c).await.unwrap();
    let b = PgStorage::new(b_store.clone(), Arc::new(deermem::SystemClock), 30.0, 200);
    for _ in 0..200 {
        b.load(Some(&user), Some(&AgentName::default_bucket()))
            .await
            .unwrap();
        if b_store.lease_stats().grants > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(b_store.lease_stats().grants > 0, "B holds a lease");
    drop((b, b_store));

    let stopper = {
        let cluster = Arc::clone(&cluster);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            tokio::task::spawn_blocking(move || cluster.stop().unwrap())
                .await
                .unwrap();
        })
    };
    let answer = a
        .create_fact_once(NewFact::new("second"), scope("u"), Some("key-2"))
        .await;
    stopper.await.unwrap();
    let (doc, id) = answer.unwrap_or_else(|e| panic!("a committed create was answered {e:?}"));
    let id = id.expect("the fact is kept");
    assert_eq!(count_content(&doc, "second"), 1, "{doc:?}");
    assert!(doc.facts.iter().any(|f| f.id == id));

    // While the database is down the manager says "unavailable", not a failure.
    match a.get_memory(scope("u")).await {
        Err(ManagerError::Unavailable { .. }) => {}
        other => panic!("with the database down: {other:?}"),
    }

    cluster.start_again().unwrap();
    let mut retried = None;
    for _ in 0..50 {
        match a
            .create_fact_once(NewFact::new("second"), scope("u"), Some("key-2"))
            .await
        {
            Ok(r) => {
                retried = Some(r);
                break;
            }
            Err(ManagerError::Unavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the retry: {e:?}"),
        }
    }
    let (doc, again) = retried.expect("the database is back");
    assert_eq!(
        again.as_deref(),
        Some(id.as_str()),
        "the retry names the stored fact"
    );
    assert_eq!(count_content(&doc, "second"), 1, "no duplicate: {doc:?}");
    // The same key for another content is refused, and creates nothing.
    let other = a
        .create_fact_once(NewFact::new("third"), scope("u"), Some("key-2"))
        .await;
    assert!(
        matches!(other, Err(ManagerError::InvalidInput { .. })),
        "{other:?}"
    );
    let doc = a.get_memory(scope("u")).await.unwrap();
    assert_eq!(count_content(&doc, "third"), 0);
    a.close().await;
}

/// Creates of distinct facts commute: 8 writers creating facts for one user through 3
/// replicas (each its own storage and lease holder on one database) get no conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_writers_creating_through_three_replicas_see_no_conflict() {
    let per_writer: usize = if std::env::var_os("DEERMEM_LONG").is_some() {
        60
    } else {
        20
    };
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = schema("commute");
    let cfg = config(cluster.url(), &schema, 2.0);
    let replicas: Vec<Arc<DeerMemManager>> = (0..3).map(|_| build(&cfg)).collect();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let replicas = replicas.clone();
        tasks.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            for i in 0..per_writer {
                let m = &replicas[(w + i) % replicas.len()];
                let content = format!("writer {w} fact {i}");
                if let Err(e) = m.create_fact(NewFact::new(content), scope("shared")).await {
                    failures.push(format!("{e:?}"));
                }
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        failures.extend(t.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} creates failed: {failures:?}",
        failures.len()
    );
    let doc = replicas[0].get_memory(scope("shared")).await.unwrap();
    assert_eq!(doc.facts.len(), 8 * per_writer);
    for m in &replicas {
        m.close().await;
    }
}
