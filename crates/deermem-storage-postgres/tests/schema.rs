//! The PostgreSQL adapter against a real server (a throwaway cluster from the testkit, or
//! `DEERMEM_TEST_POSTGRES_URL`): connecting, migrating a fresh schema, migrating again, replicas
//! migrating at once, refusing a newer schema, and typed errors for bad configuration.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use deermem_storage_postgres::{PgDatabase, PgError, PostgresConfig, known_schema_version};
use deermem_testkit::pgcluster::PgCluster;

fn config(url: &str, schema: &str) -> PostgresConfig {
    let mut c = PostgresConfig::new(url);
    c.schema = schema.into();
    c.pool_size = 2;
    c
}

async fn tables(store: &PgDatabase) -> Vec<String> {
    let client = store.client().await.unwrap();
    client
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 \
             ORDER BY 1",
            &[&store.schema()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn fresh_schema_is_created_and_migrated_once(url: &str) {
    let store = PgDatabase::connect(&config(url, "fresh")).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), None);
    let first = store.migrate().await.unwrap();
    assert_eq!(first.version, known_schema_version());
    assert_eq!(
        first.applied,
        (1..=known_schema_version()).collect::<Vec<_>>()
    );
    assert_eq!(
        tables(&store).await,
        [
            "doc_vectors",
            "fact_metadata",
            "fact_vectors",
            "facts",
            "refinery_schema_history",
            "remote_cursors",
            "run_event_counters",
            "run_events",
            "scope_leases",
            "search_docs",
            "turn_journal",
            "users"
        ]
    );
    // Pooled connections work in the configured schema: unqualified names resolve there.
    let client = store.client().await.unwrap();
    client
        .execute("INSERT INTO users (bucket) VALUES ($1)", &[&"alice"])
        .await
        .unwrap();
    let again = store.migrate().await.unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(again.version, known_schema_version());
    let n: i64 = client
        .query_one("SELECT count(*) FROM users", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "a second migration keeps the data");
}

async fn replicas_starting_together_take_turns(url: &str) {
    let stores: Vec<PgDatabase> = futures_join(url).await;
    let outcomes = {
        let mut handles = Vec::new();
        for s in stores {
            handles.push(tokio::spawn(async move { s.migrate().await }));
        }
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap().unwrap());
        }
        out
    };
    let applied: usize = outcomes.iter().map(|o| o.applied.len()).sum();
    assert_eq!(
        applied as i64,
        known_schema_version(),
        "each migration applied exactly once: {outcomes:?}"
    );
    assert!(outcomes.iter().all(|o| o.version == known_schema_version()));
}

async fn futures_join(url: &str) -> Vec<PgDatabase> {
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(PgDatabase::connect(&config(url, "racing")).await.unwrap());
    }
    stores
}

async fn a_newer_schema_is_refused_and_left_alone(url: &str) {
    let store = PgDatabase::connect(&config(url, "newer")).await.unwrap();
    store.migrate().await.unwrap();
    let client = store.client().await.unwrap();
    client
        .execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) \
             VALUES (999, 'from_the_future', '2030-01-01T00:00:00Z', '0')",
            &[],
        )
        .await
        .unwrap();
    match store.migrate().await {
        Err(PgError::SchemaTooNew {
            schema,
            found,
            known,
        }) => {
            assert_eq!(
                (schema.as_str(), found, known),
                ("newer", 999, known_schema_version())
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.schema_version().await.unwrap(),
        Some(999),
        "nothing changed"
    );
}

async fn hostile_schema_names_never_reach_sql(url: &str) {
    let mut c = config(url, "ok");
    c.schema = "x\"; DROP SCHEMA fresh CASCADE; --".into();
    assert!(matches!(
        PgDatabase::connect(&c).await,
        Err(PgError::Config { .. })
    ));
    // The schema of the first scenario is still there.
    let store = PgDatabase::connect(&config(url, "fresh")).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        Some(known_schema_version())
    );
}

async fn bad_urls_and_unreachable_servers_are_typed_errors() {
    let err = PgDatabase::connect(&PostgresConfig::new("postgres://u:hunter2@[::1"))
        .await
        .unwrap_err();
    assert!(matches!(err, PgError::Url { .. }), "{err:?}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    // A port nothing listens on: refused at once, or cut by the connect timeout.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = PostgresConfig::new(format!("postgres://u:hunter2@127.0.0.1:{port}/db"));
    c.connect_timeout_seconds = 2.0;
    let err = tokio::time::timeout(Duration::from_secs(30), PgDatabase::connect(&c))
        .await
        .expect("the connect timeout bounds the attempt")
        .unwrap_err();
    assert!(matches!(err, PgError::Connect { .. }), "{err:?}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

/// One cluster for every scenario (starting one takes seconds); it stops when the test ends,
/// also when a scenario fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_lifecycle_against_a_real_server() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let url = cluster.url().to_owned();
    fresh_schema_is_created_and_migrated_once(&url).await;
    replicas_starting_together_take_turns(&url).await;
    a_newer_schema_is_refused_and_left_alone(&url).await;
    hostile_schema_names_never_reach_sql(&url).await;
    bad_urls_and_unreachable_servers_are_typed_errors().await;
}

#[test]
fn the_throwaway_cluster_is_removed_when_dropped() {
    let cluster = PgCluster::start_fresh().unwrap_or_else(|e| panic!("{e}"));
    assert!(cluster.started_here());
    let url = cluster.url().to_owned();
    let port: u16 = url
        .rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "the server listens"
    );
    assert_eq!(
        cluster.database_url("other"),
        format!("postgres://deermem@127.0.0.1:{port}/other")
    );
    drop(cluster);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server is stopped"
    );
}
