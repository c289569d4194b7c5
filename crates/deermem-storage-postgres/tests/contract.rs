//! The storage, retrieval, vector-index and run journal contract suites against PostgreSQL (a throwaway
//! cluster per test, or `DEERMEM_TEST_POSTGRES_URL` with a schema per test), and what only a
//! shared database must add: two replicas recording the same runs at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deermem_core::ports::run_journal::{EventQuery, EventsLookup, JournalError, RecordOutcome};
use deermem_core::ports::{Clock, RunEventStore};
use deermem_core::{Timestamp, UserId};
use deermem_storage_postgres::{PgRunJournal, PostgresConfig};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::pgcluster::PgCluster;
use deermem_testkit::run_journal::RunJournalFixture;

/// A schema of its own for each journal, so tests sharing an external server do not meet.
fn next_schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "journal_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A pool of `pool_size` connections on `schema`, migrated.
async fn migrated(
    url: &str,
    schema: &str,
    pool_size: usize,
) -> deermem_storage_postgres::PgDatabase {
    let mut c = PostgresConfig::new(url);
    c.schema = schema.into();
    c.pool_size = pool_size;
    let store = deermem_storage_postgres::PgDatabase::connect(&c)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
    store
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::new(
        Timestamp::parse_iso("2026-06-01T00:00:00Z").unwrap(),
    ))
}

async fn open(url: &str, schema: &str) -> PgRunJournal {
    let mut c = PostgresConfig::new(url);
    c.schema = schema.into();
    c.pool_size = 4;
    PgRunJournal::open(&c, clock())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn fixture() -> RunJournalFixture {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let journal = open(cluster.url(), &next_schema()).await;
    RunJournalFixture {
        store: Arc::new(journal),
        // The journal is dropped before the cluster (the fixture's store goes first).
        guard: Box::new(cluster),
    }
}

deermem_testkit::run_journal_contract!(fixture());

/// The storage port's contract.
mod storage {
    use std::sync::Arc;

    use deermem_storage_postgres::PgStorage;
    use deermem_testkit::clock::ManualClock;
    use deermem_testkit::pgcluster::PgCluster;
    use deermem_testkit::storage::{START, StorageFixture};

    async fn fixture() -> StorageFixture {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
        let store = super::migrated(cluster.url(), &super::next_schema(), 4).await;
        let clock = Arc::new(ManualClock::at(START));
        StorageFixture {
            storage: Arc::new(PgStorage::new(store, clock.clone(), 30.0, 200)),
            clock,
            guard: Box::new(cluster),
        }
    }

    deermem_testkit::storage_contract!(fixture());
}

/// The storage port's contract with `coherence: revision_check` (the user's row read on every
/// load; the suite above runs with the default, read leases).
mod storage_revision_check {
    use std::sync::Arc;

    use deermem_storage_postgres::{Coherence, PgDatabase, PgStorage, PostgresConfig};
    use deermem_testkit::clock::ManualClock;
    use deermem_testkit::pgcluster::PgCluster;
    use deermem_testkit::storage::{START, StorageFixture};

    async fn fixture() -> StorageFixture {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
        let mut c = PostgresConfig::new(cluster.url());
        c.schema = super::next_schema();
        c.pool_size = 4;
        c.coherence = Coherence::RevisionCheck;
        let store = PgDatabase::connect(&c)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
        let clock = Arc::new(ManualClock::at(START));
        StorageFixture {
            storage: Arc::new(PgStorage::new(store, clock.clone(), 30.0, 200)),
            clock,
            guard: Box::new(cluster),
        }
    }

    deermem_testkit::storage_contract!(fixture());
}

/// The retrieval port's contract, on the `search_docs` table.
mod retrieval {
    use std::sync::Arc;

    use deermem_storage_postgres::PgRetrieval;
    use deermem_testkit::pgcluster::PgCluster;
    use deermem_testkit::retrieval::RetrievalFixture;

    async fn fixture() -> RetrievalFixture {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
        let store = super::migrated(cluster.url(), &super::next_schema(), 4).await;
        let index = PgRetrieval::new(
            store,
            Arc::new(deermem_testkit::clock::ManualClock::at(
                deermem_testkit::storage::START,
            )),
        );
        // The index is dropped before the cluster.
        RetrievalFixture::with_guard(index, cluster)
    }

    deermem_testkit::retrieval_contract!(fixture());
}

/// The vector-index contract, on `search_docs` with its `doc_vectors`.
mod vectors {
    use std::sync::Arc;

    use deermem_storage_postgres::PgRetrieval;
    use deermem_testkit::pgcluster::PgCluster;
    use deermem_testkit::vector_index::VectorIndexFixture;

    async fn fixture() -> VectorIndexFixture {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
        let store = super::migrated(cluster.url(), &super::next_schema(), 4).await;
        let index = PgRetrieval::new(
            store,
            Arc::new(deermem_testkit::clock::ManualClock::at(
                deermem_testkit::storage::START,
            )),
        );
        // The index is dropped before the cluster.
        VectorIndexFixture::with_guard(index, cluster)
    }

    deermem_testkit::vector_index_contract!(fixture());
}

/// Two replicas (two journals on one database) record the same 20 runs at the same time: each
/// run gets exactly one event, the replicas agree on it, and the user's sequence numbers are
/// 1..=20 without gaps or reuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_record_each_run_once_with_gap_free_sequence_numbers() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let a = Arc::new(open(cluster.url(), &schema).await);
    let b = Arc::new(open(cluster.url(), &schema).await);
    let user = UserId::new("alice").unwrap();
    let hash = "ab".repeat(32);
    let mut handles = Vec::new();
    for journal in [a.clone(), b.clone()] {
        let (user, hash) = (user.clone(), hash.clone());
        handles.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..20 {
                out.push(
                    journal
                        .record_context(&user, None, "t", &format!("r{i}"), &hash)
                        .await
                        .unwrap(),
                );
            }
            out
        }));
    }
    let mut results: Vec<Vec<RecordOutcome>> = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    let mut seqs = Vec::new();
    for (i, (x, y)) in results[0].iter().zip(&results[1]).enumerate() {
        assert_eq!(
            x.event(),
            y.event(),
            "run r{i}: both replicas see the one event"
        );
        let recorded = [x, y]
            .iter()
            .filter(|o| matches!(o, RecordOutcome::Recorded(_)))
            .count();
        assert_eq!(recorded, 1, "run r{i} recorded once: {x:?} {y:?}");
        seqs.push(x.event().seq);
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=20).collect::<Vec<u64>>());
    // A different block for a recorded run is a conflict on either replica.
    let other = "cd".repeat(32);
    for j in [&a, &b] {
        assert!(matches!(
            j.record_context(&user, None, "t", "r3", &other).await,
            Err(JournalError::Conflict { .. })
        ));
    }
    match b
        .events(&user, "t", "r7", &EventQuery::default())
        .await
        .unwrap()
    {
        EventsLookup::Events(events) => assert_eq!(events.len(), 1),
        other => panic!("{other:?}"),
    }
    drop((a, b));
    drop(cluster);
}

/// SQL metacharacters in ids reach PostgreSQL only as bind parameters: they are refused by the
/// id grammar or stored and found verbatim.
#[tokio::test]
async fn sql_metacharacters_are_data() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let j = open(cluster.url(), &next_schema()).await;
    let user = UserId::new("o'brien\"; DROP TABLE run_events; --").unwrap();
    let hash = "ef".repeat(32);
    for (t, r) in [
        ("t'--", "r;x"),
        ("t%_", "r$1"),
        ("t\"x", "r*"),
        ("t:@+=~", "r.-_"),
    ] {
        match j.record_context(&user, None, t, r, &hash).await {
            Ok(RecordOutcome::Recorded(e)) => {
                assert_eq!((e.thread_id.as_str(), e.run_id.as_str()), (t, r));
                match j.events(&user, t, r, &EventQuery::default()).await.unwrap() {
                    EventsLookup::Events(found) => assert_eq!(found, vec![e]),
                    other => panic!("{other:?}"),
                }
            }
            Err(JournalError::InvalidId { .. }) => {}
            other => panic!("{t:?} {r:?}: {other:?}"),
        }
    }
    // `_` is not a pattern: a lookup of "t_" never finds "tX".
    let plain = UserId::new("plain").unwrap();
    j.record_context(&plain, None, "tX", "r", &hash)
        .await
        .unwrap();
    assert_eq!(
        j.events(&plain, "t_", "r", &EventQuery::default())
            .await
            .unwrap(),
        EventsLookup::UnknownThread
    );
}

/// Two replicas (two storages with their own pools on one database) commit to one user at the
/// same time: every acknowledged create is there, and the user's revision counts every commit
/// exactly once (no lost update, no gap).
#[test]
fn replicas_commit_to_one_user_without_losing_updates() {
    use deermem_core::document::{ApplyOptions, ChangeSet};
    use deermem_core::ports::FactRepository;
    use deermem_core::{AgentName, UserId};
    use deermem_storage_postgres::{PgDatabase, PgStorage};
    use serde_json::json;

    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let storage = |rt: &tokio::runtime::Runtime| {
        let mut c = PostgresConfig::new(cluster.url());
        c.schema = schema.clone();
        c.pool_size = 4;
        rt.block_on(async {
            let store = PgDatabase::connect(&c).await.unwrap();
            store.migrate().await.unwrap();
            Arc::new(PgStorage::new(store, clock(), 30.0, 200))
        })
    };
    let (a, b) = (storage(&rt), storage(&rt));
    let user = UserId::new("o'brien; DROP TABLE facts; --").unwrap();
    let agent = AgentName::parse("coder").unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for (r, s) in [(0, a.clone()), (1, b.clone())] {
            let (user, agent) = (user.clone(), agent.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..20 {
                    let draft = json!({"id": format!("fact_r{r}_{i:02}"),
                        "content": format!("It's 100% \"quoted\" -- fact {r}/{i}; DROP TABLE users"),
                        "category": "preference", "confidence": 0.9});
                    s.apply_changes(
                        Some(&user),
                        Some(&agent),
                        ChangeSet {
                            upserts: vec![deermem_core::FactDraft::try_from(draft.clone()).unwrap()],
                            ..ChangeSet::default()
                        },
                        ApplyOptions::default(),
                    )
                    .await
                    .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        for s in [&a, &b] {
            let doc = s.load(Some(&user), Some(&agent)).await.unwrap();
            assert_eq!(doc.revision, 40, "one revision per commit");
            assert_eq!(doc.facts.len(), 40, "no acknowledged create lost");
            let f = doc.facts.iter().find(|f| f.id.as_str() == "fact_r1_07").unwrap();
            assert_eq!(f.content, "It's 100% \"quoted\" -- fact 1/7; DROP TABLE users");
            assert_eq!(f.category.as_deref(), Some("preference"));
            assert_eq!(f.scope.user_id.as_deref(), Some(user.as_str()));
        }
        // A stale expected revision is a conflict on either replica.
        let stale = b
            .apply_changes(
                Some(&user),
                Some(&agent),
                ChangeSet {
                    deletes: vec![deermem_core::FactId::new("fact_r0_00").unwrap()],
                    ..ChangeSet::default()
                },
                ApplyOptions {
                    expected_manifest_revision: Some(39),
                    allow_manifest_rebase: false,
                },
            )
            .await;
        assert!(
            matches!(stale, Err(deermem_core::StorageError::ManifestConflict { expected: 39, found: 40 })),
            "{stale:?}"
        );
    });
    drop((a, b));
    rt.shutdown_background();
    drop(cluster);
}

/// The remote backends' cursor-store port, on the `remote_cursors` table: the behaviour the
/// cursor files also pass, with the two handles on one database as two replicas (two pools).
mod cursors {
    use deermem_storage_postgres::PgCursors;
    use deermem_testkit::pgcluster::PgCluster;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_port_contract_holds_across_two_replicas() {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
        let schema = super::next_schema();
        let a = super::migrated(cluster.url(), &schema, 2).await;
        let b = super::migrated(cluster.url(), &schema, 2).await;
        let (a, b) = (PgCursors::new(a), PgCursors::new(b));
        deermem_testkit::cursors::check(&a, &b).await;
        // Hostile keys are bind parameters: stored and found verbatim, nothing else touched.
        use deermem_core::ports::CursorStorage as _;
        let hostile = "x'); DROP TABLE remote_cursors; --";
        a.write(hostile, hostile, b"'\"\\".to_vec()).await.unwrap();
        assert_eq!(
            b.read(hostile, hostile, 8).await.unwrap().as_deref(),
            Some(&b"'\"\\"[..])
        );
        assert!(
            b.read("contract/cursors", "one.json", 64)
                .await
                .unwrap()
                .is_some(),
            "the table is still there"
        );
        assert!(
            a.location("honcho/cursors", "n.json")
                .contains("remote_cursors")
        );
    }
}

/// The replica cache: each storage keeps the decoded facts of a scope and serves them only
/// while the user's row is the one they were read under.
mod replica_cache {
    use std::sync::Arc;

    use deermem_core::ports::{FactRepository, MemoryStorageExt as _};
    use deermem_core::{AgentName, UserId};
    use deermem_storage_postgres::{PgDatabase, PgStorage};
    use deermem_testkit::clock::ManualClock;
    use deermem_testkit::pgcluster::PgCluster;
    use deermem_testkit::storage::START;

    async fn replica(url: &str, schema: &str) -> (PgDatabase, PgStorage) {
        let store = super::migrated(url, schema, 2).await;
        let storage = PgStorage::new(store.clone(), Arc::new(ManualClock::at(START)), 30.0, 200);
        (store, storage)
    }

    fn draft(content: &str) -> deermem_core::FactDraft {
        deermem_core::FactDraft::new(content)
            .and_then(|d| d.with_category("context").with_confidence(0.9))
            .unwrap()
    }

    fn contents(doc: &deermem_core::MemoryDocument) -> Vec<String> {
        let mut v: Vec<String> = doc.facts.iter().map(|f| f.content.clone()).collect();
        v.sort();
        v
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_never_serves_a_scope_older_than_another_replicas_write() {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
        let schema = super::next_schema();
        let (_, a) = replica(cluster.url(), &schema).await;
        let (store_b, b) = replica(cluster.url(), &schema).await;
        let user = UserId::new("alice").unwrap();
        let agent = AgentName::default_bucket();

        b.upsert_fact(Some(&user), &agent, draft("one"), None, None)
            .await
            .unwrap();
        // A reads twice: the second read is served from A's cache.
        let first = a.load(Some(&user), Some(&agent)).await.unwrap();
        let again = a.load(Some(&user), Some(&agent)).await.unwrap();
        assert_eq!(contents(&first), ["one"]);
        assert_eq!(again, first);

        // B writes; A's next read sees it, at B's revision.
        let written = b
            .upsert_fact(Some(&user), &agent, draft("two"), None, None)
            .await
            .unwrap();
        let seen = a.load(Some(&user), Some(&agent)).await.unwrap();
        assert_eq!(contents(&seen), ["one", "two"]);
        assert_eq!(seen.revision, written.revision);

        // A bucket replaced wholesale at the same revision (what `deermem migrate` does) is
        // a different row too: A does not serve the facts it cached.
        let now = deermem_core::Timestamp::parse_iso(START).unwrap();
        let mut snap = store_b
            .read_snapshot(user.bucket(), now)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(snap.revision, seen.revision);
        snap.agents[0].facts.retain(|f| f.content == "two");
        store_b.write_snapshot(&snap).await.unwrap();
        let replaced = a.load(Some(&user), Some(&agent)).await.unwrap();
        assert_eq!(replaced.revision, seen.revision, "the same revision");
        assert_eq!(contents(&replaced), ["two"], "and the replaced facts");

        // A delete through B is seen too; A's own writes as well.
        let id = replaced.facts[0].id.clone();
        b.delete_fact(Some(&user), &agent, &id, None, None)
            .await
            .unwrap();
        assert!(
            a.load(Some(&user), Some(&agent))
                .await
                .unwrap()
                .facts
                .is_empty()
        );
        a.upsert_fact(Some(&user), &agent, draft("three"), None, None)
            .await
            .unwrap();
        assert_eq!(
            contents(&b.load(Some(&user), Some(&agent)).await.unwrap()),
            ["three"]
        );
        assert_eq!(
            contents(&a.load(Some(&user), Some(&agent)).await.unwrap()),
            ["three"]
        );
    }
}
