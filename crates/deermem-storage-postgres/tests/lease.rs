//! Read leases between replicas (`coherence: lease`): a replica serves a user from its cache
//! without a statement while it holds a lease, and every write path revokes the other
//! replicas' leases and waits for them before it returns, so a write acknowledged on one
//! replica is seen at once on every other. A replica that dies delays writes by at most its
//! lease; one whose listener connection fails drops its leases and renews them later. A write
//! that skips the revocation is refused by the database.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deermem_core::document::{ApplyOptions, ChangeSet, SummaryPatch};
use deermem_core::ports::{FactRepository, MemoryStorageExt as _};
use deermem_core::{AgentName, MemoryDocument, Timestamp, UserId};
use deermem_storage_postgres::{Coherence, PgDatabase, PgStorage, PostgresConfig};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::pgcluster::PgCluster;
use deermem_testkit::storage::START;
use serde_json::json;

/// How long a slow holder takes to answer a revocation in these tests: a writer that did not
/// wait for the answer would return well before the holder drops its lease.
const SLOW_HOLDER: Duration = Duration::from_millis(400);

fn next_schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "lease_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

async fn replica(url: &str, schema: &str, lease_seconds: f64) -> (PgDatabase, Arc<PgStorage>) {
    let mut c = PostgresConfig::new(url);
    c.schema = schema.into();
    c.pool_size = 3;
    c.connect_timeout_seconds = 1.0;
    c.coherence = Coherence::Lease;
    c.lease_seconds = lease_seconds;
    let store = PgDatabase::connect(&c)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
    let storage = PgStorage::new(store.clone(), Arc::new(ManualClock::at(START)), 30.0, 200);
    (store, Arc::new(storage))
}

fn draft(content: &str) -> deermem_core::FactDraft {
    deermem_core::FactDraft::try_from(
        json!({"content": content, "category": "context", "confidence": 0.9}),
    )
    .unwrap()
}

fn contents(doc: &MemoryDocument) -> Vec<String> {
    let mut v: Vec<String> = doc.facts.iter().map(|f| f.content.clone()).collect();
    v.sort();
    v
}

/// Loads until `store`'s replica holds a lease on the user and serves a load without a
/// statement (the listener connects in the background after the first load).
async fn until_warm(store: &PgDatabase, s: &PgStorage, user: &UserId, agent: &AgentName) {
    for _ in 0..500 {
        let before = store.lease_stats().warm_reads;
        s.load(Some(user), Some(agent)).await.unwrap();
        if store.lease_stats().warm_reads > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no lease after 500 loads: {:?}", store.lease_stats());
}

/// One write path of B's, and what A must see right after it.
type Check = fn(&MemoryDocument) -> bool;

/// For every write path: A holds a lease and answers revocations slowly; B writes; A's very
/// next load shows B's write. Fails when a writer returns before the holders have dropped
/// their leases (A would serve its cached scope for another `SLOW_HOLDER`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_path_revokes_the_other_replicas_leases_before_it_returns() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store_a, a) = replica(cluster.url(), &schema, 30.0).await;
    let (store_b, b) = replica(cluster.url(), &schema, 30.0).await;
    let user = UserId::new("alice").unwrap();
    let agent = AgentName::default_bucket();
    b.upsert_fact(Some(&user), &agent, draft("one"), None, None)
        .await
        .unwrap();
    store_a.delay_revocations_for_tests(SLOW_HOLDER);

    let now = Timestamp::parse_iso(START).unwrap();
    let mut step = 0;
    loop {
        until_warm(&store_a, &a, &user, &agent).await;
        let cached = a.load(Some(&user), Some(&agent)).await.unwrap();
        let revocations = store_a.lease_stats().revocations;
        let (name, check): (&str, Check) = match step {
            0 => {
                b.upsert_fact(Some(&user), &agent, draft("two"), None, None)
                    .await
                    .unwrap();
                ("commit (create)", |d| contents(d) == ["one", "two"])
            }
            1 => {
                let id = cached
                    .facts
                    .iter()
                    .find(|f| f.content == "one")
                    .unwrap()
                    .id
                    .clone();
                b.delete_fact(Some(&user), &agent, &id, None, None)
                    .await
                    .unwrap();
                ("commit (delete)", |d| contents(d) == ["two"])
            }
            2 => {
                b.apply_changes(
                    Some(&user),
                    None,
                    ChangeSet {
                        summaries: Some(SummaryPatch {
                            user: Some(
                                json!({"workContext": {"summary": "writes Rust", "updatedAt": ""}})
                                    .as_object()
                                    .cloned()
                                    .unwrap(),
                            ),
                            history: None,
                        }),
                        ..ChangeSet::default()
                    },
                    ApplyOptions::default(),
                )
                .await
                .unwrap();
                ("summaries", |d| {
                    d.user.0.get("workContext").and_then(|w| w.get("summary"))
                        == Some(&json!("writes Rust"))
                })
            }
            3 => {
                // An import saves a whole document: here one fact in place of the scope's.
                let mut doc = b.load(Some(&user), Some(&agent)).await.unwrap();
                let mut f = doc.facts[0].clone();
                f.id = b.new_fact_id();
                f.content = "imported".into();
                doc.facts = vec![f].into();
                b.save(Some(&user), Some(&agent), &doc, None).await.unwrap();
                ("import (whole document)", |d| contents(d) == ["imported"])
            }
            4 => {
                let mut snap = store_b
                    .read_snapshot(user.bucket(), now)
                    .await
                    .unwrap()
                    .unwrap();
                // The same revision, other facts: what `deermem migrate` may write.
                for f in &mut snap.agents[0].facts {
                    f.content = "migrated".into();
                }
                store_b.write_snapshot(&snap).await.unwrap();
                ("snapshot replace", |d| contents(d) == ["migrated"])
            }
            5 => {
                b.clear_all(Some(&user)).await.unwrap();
                ("clear", |d| d.facts.is_empty())
            }
            _ => break,
        };
        let seen = a.load(Some(&user), Some(&agent)).await.unwrap();
        let fresh = b.load(Some(&user), Some(&agent)).await.unwrap();
        assert!(
            check(&seen),
            "{name}: A serves a scope older than B's acknowledged write: {:?} (B: {:?})",
            contents(&seen),
            contents(&fresh)
        );
        assert_eq!(seen.revision, fresh.revision, "{name}: the revision");
        assert_eq!(seen.user, fresh.user, "{name}: the summaries");
        assert!(
            store_a.lease_stats().revocations > revocations,
            "{name}: A's lease was revoked: {:?}",
            store_a.lease_stats()
        );
        step += 1;
    }
    assert!(store_b.lease_stats().fenced_writes >= 6);
    drop((a, b, store_a, store_b));
    drop(cluster);
}

/// A warm load runs no statement: with every pooled connection taken, a replica holding a
/// lease still serves the user (a load of a user it holds no lease on needs a connection and
/// fails when none comes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_load_under_a_lease_needs_no_connection() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store, s) = replica(cluster.url(), &schema, 60.0).await;
    let user = UserId::new("bob").unwrap();
    let agent = AgentName::parse("coder").unwrap();
    s.upsert_fact(Some(&user), &agent, draft("kept"), None, None)
        .await
        .unwrap();
    until_warm(&store, &s, &user, &agent).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(store.client().await.unwrap());
    }
    let doc = s.load(Some(&user), Some(&agent)).await.unwrap();
    assert_eq!(contents(&doc), ["kept"]);
    let other = UserId::new("carol").unwrap();
    assert!(s.load(Some(&other), Some(&agent)).await.is_err());
    drop(held);
    // What `/api/memory/status` shows of this replica: the scope cache and the lease table
    // hold the warm user, within their bounds.
    let bounds = s.cache_bounds();
    let find = |name: &str| {
        bounds
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("{name} missing from {bounds:?}"))
            .clone()
    };
    let scopes = find("postgres.scopes");
    assert_eq!(scopes.bound, Some(4096));
    assert!(scopes.current.is_some_and(|n| n >= 1), "{scopes:?}");
    let leases = find("postgres.leases");
    assert_eq!(leases.bound, Some(8192));
    assert!(leases.current.is_some_and(|n| n >= 1), "{leases:?}");
    assert_eq!(find("postgres.revocations").bound, Some(8192));
}

/// The decoded-scope cache keeps to the bound it is given (`cache_max_scopes` in a served
/// configuration) however many users are read, and `/status` shows that bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scope_cache_keeps_to_its_configured_bound() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store, _) = replica(cluster.url(), &schema, 60.0).await;
    let s = PgStorage::new(store.clone(), Arc::new(ManualClock::at(START)), 30.0, 200)
        .with_cache_max_scopes(2);
    let agent = AgentName::default_bucket();
    let mut peak = 0;
    for n in 0..6 {
        let user = UserId::new(format!("user{n}")).unwrap();
        s.upsert_fact(Some(&user), &agent, draft("kept"), None, None)
            .await
            .unwrap();
        let doc = s.load(Some(&user), Some(&agent)).await.unwrap();
        assert_eq!(contents(&doc), ["kept"]);
        let scopes = s
            .cache_bounds()
            .into_iter()
            .find(|b| b.name == "postgres.scopes")
            .unwrap();
        assert_eq!(scopes.bound, Some(2));
        let current = scopes.current.unwrap();
        assert!(current <= 2, "{scopes:?}");
        peak = peak.max(current);
    }
    assert!(peak >= 1, "the cache was used");
}

/// A holder that dies holding a lease (its listener gone, its lease row left behind) delays a
/// write to that user until the lease runs out, and no longer: the write completes, and a new
/// replica reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_delays_a_write_by_its_lease_at_most() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store_a, a) = replica(cluster.url(), &schema, 1.0).await;
    let (store_b, b) = replica(cluster.url(), &schema, 1.0).await;
    let user = UserId::new("dana").unwrap();
    let agent = AgentName::default_bucket();
    b.upsert_fact(Some(&user), &agent, draft("one"), None, None)
        .await
        .unwrap();
    until_warm(&store_a, &a, &user, &agent).await;
    let holder = store_a.lease_holder().to_owned();
    // A dies: its storage and store go, the lease row stays.
    drop((a, store_a));
    let client = store_b.client().await.unwrap();
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM scope_leases WHERE holder = $1 AND expires_at > now()",
            &[&holder],
        )
        .await
        .unwrap()
        .get(0);
    let before = store_b.lease_stats();
    let write = b.upsert_fact(Some(&user), &agent, draft("two"), None, None);
    // Generous: the lease is 1 s; a write that waited for an answer forever would hang here.
    tokio::time::timeout(Duration::from_secs(30), write)
        .await
        .expect("the write completes once the dead holder's lease has run out")
        .unwrap();
    if left == 1 {
        assert_eq!(
            store_b.lease_stats().expired_waits,
            before.expired_waits + 1,
            "B waited out the unanswered lease"
        );
    }
    let (_, successor) = replica(cluster.url(), &schema, 1.0).await;
    assert_eq!(
        contents(&successor.load(Some(&user), Some(&agent)).await.unwrap()),
        ["one", "two"]
    );
    let gone: i64 = client
        .query_one(
            "SELECT count(*) FROM scope_leases WHERE holder = $1",
            &[&holder],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(gone, 0, "the write deleted the dead holder's lease");
}

/// A holder whose listener connection fails drops every lease at once (its loads read the
/// user's row again), listens again, answers writes, and renews its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_listener_drops_the_leases_and_they_are_renewed() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store_a, a) = replica(cluster.url(), &schema, 2.0).await;
    let (store_b, b) = replica(cluster.url(), &schema, 2.0).await;
    let user = UserId::new("erin").unwrap();
    let agent = AgentName::default_bucket();
    b.upsert_fact(Some(&user), &agent, draft("one"), None, None)
        .await
        .unwrap();
    until_warm(&store_a, &a, &user, &agent).await;
    let listens = store_a.lease_stats().listens;
    let client = store_b.client().await.unwrap();
    let killed: i64 = client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&format!("deermem-lease-{}", store_a.lease_holder())],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "A's listener connection");
    // B writes while A's listener is down or reconnecting (A's lease row is still there):
    // the write returns once A answered or its lease ran out; either way A then serves it.
    b.upsert_fact(Some(&user), &agent, draft("two"), None, None)
        .await
        .unwrap();
    assert_eq!(
        contents(&a.load(Some(&user), Some(&agent)).await.unwrap()),
        ["one", "two"]
    );
    // A listens again and renews its lease: loads are served warm again.
    until_warm(&store_a, &a, &user, &agent).await;
    assert!(
        store_a.lease_stats().listens > listens,
        "{:?}",
        store_a.lease_stats()
    );
    // And the renewed lease is revoked by the next write like the first.
    let revocations = store_a.lease_stats().revocations;
    b.upsert_fact(Some(&user), &agent, draft("three"), None, None)
        .await
        .unwrap();
    assert_eq!(
        contents(&a.load(Some(&user), Some(&agent)).await.unwrap()),
        ["one", "three", "two"]
    );
    assert!(store_a.lease_stats().revocations > revocations);
}

/// A write to what a leased read serves (the user's row, the facts) that does not revoke the
/// leases first is refused by the database, so no write path can forget it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_the_fence_is_refused() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store, s) = replica(cluster.url(), &schema, 30.0).await;
    let user = UserId::new("frank").unwrap();
    let agent = AgentName::default_bucket();
    s.upsert_fact(Some(&user), &agent, draft("one"), None, None)
        .await
        .unwrap();
    let client = store.client().await.unwrap();
    for sql in [
        "UPDATE users SET revision = revision + 1 WHERE bucket = 'frank'",
        "UPDATE users SET summaries = '{}' WHERE bucket = 'frank'",
        "UPDATE facts SET fact = fact WHERE bucket = 'frank'",
        "DELETE FROM facts WHERE bucket = 'frank'",
        "DELETE FROM users WHERE bucket = 'frank'",
        "INSERT INTO users (bucket, revision) VALUES ('gina', 3)",
    ] {
        let err = client.batch_execute(sql).await.unwrap_err();
        assert!(
            err.as_db_error()
                .is_some_and(|e| e.message().contains("deermem_fence")),
            "{sql}: {err:?}"
        );
    }
    // Derived columns and empty user rows need no fence.
    client
        .batch_execute(
            "UPDATE facts SET search_text = search_text WHERE bucket = 'frank'; \
             INSERT INTO users (bucket) VALUES ('gina')",
        )
        .await
        .unwrap();
    // A fence for another bucket does not cover this one.
    let err = client
        .batch_execute(
            "BEGIN; SELECT * FROM deermem_fence('gina', 'x', 'r x 1 gina'); \
             UPDATE users SET revision = 9 WHERE bucket = 'frank'",
        )
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("deermem_fence"), "{err:?}");
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        contents(&s.load(Some(&user), Some(&agent)).await.unwrap()),
        ["one"]
    );
}

/// The lease of the stall tests: a write that waited out a lease would take this long, far
/// past what the holders' answers take.
const LONG_LEASE: f64 = 20.0;

/// A process that takes no leases (the CLI: `coherence` forced to `revision_check`).
async fn short_lived(url: &str, schema: &str) -> (PgDatabase, Arc<PgStorage>) {
    let mut c = PostgresConfig::new(url);
    c.schema = schema.into();
    c.pool_size = 2;
    c.connect_timeout_seconds = 1.0;
    c.coherence = Coherence::RevisionCheck;
    let store = PgDatabase::connect(&c)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let storage = PgStorage::new(store.clone(), Arc::new(ManualClock::at(START)), 30.0, 200);
    (store, Arc::new(storage))
}

async fn lease_rows(store: &PgDatabase, holder: &str) -> i64 {
    store
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM scope_leases WHERE holder = $1",
            &[&holder],
        )
        .await
        .unwrap()
        .get(0)
}

/// No waiting on a lease: the write revoked holders, heard every answer, and its time is well
/// under the lease it would otherwise have waited out.
fn assert_no_lease_waited(
    store: &PgDatabase,
    before: deermem_storage_postgres::LeaseStats,
    took: Duration,
    holders: u64,
) {
    let after = store.lease_stats();
    assert_eq!(
        after.expired_waits, before.expired_waits,
        "a write waited out a lease: {after:?}"
    );
    assert_eq!(
        after.fenced_writes,
        before.fenced_writes + u64::from(holders > 0),
        "{after:?}"
    );
    assert!(
        took < Duration::from_secs_f64(LONG_LEASE / 4.0),
        "the write took {took:?}, not well under the {LONG_LEASE} s lease"
    );
}

/// With two replicas holding leases on a user, a short-lived process (as the CLI) writes to
/// that user: it listens before it commits, so it hears both answers and waits out no lease;
/// its own reads take no lease, and after it has exited a replica's write waits for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lived_writer_waits_out_no_lease_and_leaves_none() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store_a, a) = replica(cluster.url(), &schema, LONG_LEASE).await;
    let (store_b, b) = replica(cluster.url(), &schema, LONG_LEASE).await;
    let user = UserId::new("erin").unwrap();
    let agent = AgentName::default_bucket();
    b.upsert_fact(Some(&user), &agent, draft("one"), None, None)
        .await
        .unwrap();
    until_warm(&store_a, &a, &user, &agent).await;
    until_warm(&store_b, &b, &user, &agent).await;

    let (store_c, c) = short_lived(cluster.url(), &schema).await;
    let before = store_c.lease_stats();
    let (rev_a, rev_b) = (
        store_a.lease_stats().revocations,
        store_b.lease_stats().revocations,
    );
    let started = std::time::Instant::now();
    c.upsert_fact(Some(&user), &agent, draft("two"), None, None)
        .await
        .unwrap();
    assert_no_lease_waited(&store_c, before, started.elapsed(), 2);
    assert_eq!(store_a.lease_stats().revocations, rev_a + 1);
    assert_eq!(store_b.lease_stats().revocations, rev_b + 1);
    assert_eq!(
        contents(&a.load(Some(&user), Some(&agent)).await.unwrap()),
        ["one", "two"]
    );

    // The short-lived process reads: no lease, no row; it exits (closes its storage).
    c.load(Some(&user), Some(&agent)).await.unwrap();
    assert_eq!(store_c.lease_stats().grants, 0);
    assert_eq!(lease_rows(&store_c, store_c.lease_holder()).await, 0);
    c.close().await;
    drop((c, store_c));

    // A replica's write after it: only the other replica's lease to revoke, answered at once.
    until_warm(&store_b, &b, &user, &agent).await;
    let before = store_a.lease_stats();
    let started = std::time::Instant::now();
    a.upsert_fact(Some(&user), &agent, draft("three"), None, None)
        .await
        .unwrap();
    assert_no_lease_waited(&store_a, before, started.elapsed(), 1);
}

/// A replica listens as soon as it has connected, so its first write, to a user two other
/// replicas hold leases on, hears their answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_replicas_first_write_waits_out_no_lease() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store_a, a) = replica(cluster.url(), &schema, LONG_LEASE).await;
    let (store_b, b) = replica(cluster.url(), &schema, LONG_LEASE).await;
    let user = UserId::new("fay").unwrap();
    let agent = AgentName::default_bucket();
    a.upsert_fact(Some(&user), &agent, draft("one"), None, None)
        .await
        .unwrap();
    until_warm(&store_a, &a, &user, &agent).await;
    until_warm(&store_b, &b, &user, &agent).await;

    let (store_d, d) = replica(cluster.url(), &schema, LONG_LEASE).await;
    assert_eq!(store_d.lease_stats().listens, 1, "listening once connected");
    let before = store_d.lease_stats();
    let started = std::time::Instant::now();
    d.upsert_fact(Some(&user), &agent, draft("two"), None, None)
        .await
        .unwrap();
    assert_no_lease_waited(&store_d, before, started.elapsed(), 2);
}

/// A replica that stops (its storage closed, as `deermem serve` does on SIGTERM) deletes its
/// lease rows: the next write to that user revokes nothing and waits for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_replica_releases_its_leases() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store_a, a) = replica(cluster.url(), &schema, LONG_LEASE).await;
    let (store_b, b) = replica(cluster.url(), &schema, LONG_LEASE).await;
    let user = UserId::new("gus").unwrap();
    let agent = AgentName::default_bucket();
    b.upsert_fact(Some(&user), &agent, draft("one"), None, None)
        .await
        .unwrap();
    until_warm(&store_a, &a, &user, &agent).await;
    let holder = store_a.lease_holder().to_owned();
    assert_eq!(lease_rows(&store_b, &holder).await, 1);
    a.close().await;
    assert_eq!(
        lease_rows(&store_b, &holder).await,
        0,
        "closing released the lease"
    );
    drop((a, store_a));

    let before = store_b.lease_stats();
    let started = std::time::Instant::now();
    b.upsert_fact(Some(&user), &agent, draft("two"), None, None)
        .await
        .unwrap();
    assert_no_lease_waited(&store_b, before, started.elapsed(), 0);
}

/// Lease rows that ran out are swept by the listeners, whoever left them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_rows_are_swept() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let (store_a, _a) = replica(cluster.url(), &schema, LONG_LEASE).await;
    store_a
        .client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO scope_leases (bucket, holder, expires_at) \
             VALUES ('ghost-bucket', 'ghost', now() - interval '1 minute')",
            &[],
        )
        .await
        .unwrap();
    // A listener sweeps when it starts listening, then every few seconds.
    let (_store_b, _b) = replica(cluster.url(), &schema, LONG_LEASE).await;
    let mut left = 1;
    for _ in 0..300 {
        left = lease_rows(&store_a, "ghost").await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 0, "the expired row is still there");
}

/// A replica in lease mode holds at most `pool_size` pooled connections plus its listener's:
/// the connection of the start-up migration went back to the pool (docs/postgres.md,
/// "Connections"; it once stayed open beside the pool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_mode_replica_holds_its_pool_and_one_listener_connection_at_most() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    // `replica` migrates the schema first, as a replica starting up does; pool of 3.
    let (store, s) = replica(cluster.url(), &schema, 60.0).await;
    let user = UserId::new("dora").unwrap();
    let agent = AgentName::parse("coder").unwrap();
    s.upsert_fact(Some(&user), &agent, draft("kept"), None, None)
        .await
        .unwrap();
    until_warm(&store, &s, &user, &agent).await;
    // Every pooled connection in use at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(store.client().await.unwrap());
    }
    let open: i64 = held[0]
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'deermem%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 3 + 1, "pool_size 3 plus the lease listener");
    drop(held);
}
