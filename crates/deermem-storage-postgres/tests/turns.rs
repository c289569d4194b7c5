//! The turn journal on PostgreSQL: the port's contract suite (a throwaway cluster per test, or
//! `DEERMEM_TEST_POSTGRES_URL` with a schema per test), and what only a journal shared by
//! replicas must add: two replicas claiming at the same time never lease the same turn, the
//! turns of a replica that stopped renewing its leases go to the other once they end, and a
//! database that cannot be reached is `Unavailable` without the password in the message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deermem_core::Timestamp;
use deermem_core::ports::TurnJournal;
use deermem_core::ports::turn_journal::{
    ClaimRequest, TurnFilter, TurnId, TurnJournalError, TurnState,
};
use deermem_storage_postgres::{PgDatabase, PgTurnJournal, PgTurnJournalOptions, PostgresConfig};
use deermem_testkit::pgcluster::PgCluster;
use deermem_testkit::turn_journal::{T0, TurnJournalFixture, turn};

/// A schema of its own for each test, so tests sharing an external server do not meet.
fn next_schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "turns_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn config(url: &str, schema: &str) -> PostgresConfig {
    let mut c = PostgresConfig::new(url);
    c.schema = schema.into();
    c.pool_size = 4;
    c.connect_timeout_seconds = 2.0;
    c
}

/// A replica's journal: a pool of its own on `schema`, migrated.
async fn replica(url: &str, schema: &str, options: PgTurnJournalOptions) -> PgTurnJournal {
    let store = PgDatabase::connect(&config(url, schema))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
    PgTurnJournal::new(store, options)
}

async fn fixture() -> TurnJournalFixture {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let url = cluster.url().to_owned();
    let schema = next_schema();
    let journal = replica(&url, &schema, PgTurnJournalOptions::default()).await;
    TurnJournalFixture {
        journal: Arc::new(journal),
        // A new pool on the same schema: what another process would see.
        reopen: Box::new(move || {
            let (url, schema) = (url.clone(), schema.clone());
            Box::pin(async move {
                Arc::new(replica(&url, &schema, PgTurnJournalOptions::default()).await)
                    as Arc<dyn TurnJournal>
            })
        }),
        guard: Box::new(cluster),
    }
}

deermem_testkit::turn_journal_contract!(fixture());

fn at(secs: i64) -> Timestamp {
    Timestamp::from_unix_seconds(T0 + secs)
}

fn claim(owner: &str, secs: i64, lease_secs: u64, limit: usize) -> ClaimRequest {
    ClaimRequest {
        owner: owner.into(),
        now: at(secs),
        lease: Duration::from_secs(lease_secs),
        limit,
    }
}

fn id_list(items: &[deermem_core::ports::turn_journal::TurnItem]) -> Vec<String> {
    items.iter().map(|i| i.id().as_str().to_owned()).collect()
}

/// Two replicas (two pools), four claimers each, all claiming at once: every turn is leased to
/// exactly one of them, in one round where each takes everything it can, and in rounds of small
/// claims where each claimer completes what it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_claiming_at_once_never_lease_the_same_turn() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let a = Arc::new(replica(cluster.url(), &schema, PgTurnJournalOptions::default()).await);
    let b = Arc::new(replica(cluster.url(), &schema, PgTurnJournalOptions::default()).await);
    const TURNS: usize = 240;
    for n in 0..TURNS {
        let j = if n % 2 == 0 { &a } else { &b };
        j.append(turn(&format!("t{n}"), Some("alice"), n as i64))
            .await
            .unwrap();
    }
    let claimers = |round: &str| -> Vec<(String, Arc<PgTurnJournal>)> {
        (0..8)
            .map(|c| {
                let j = Arc::clone(if c % 2 == 0 { &a } else { &b });
                (
                    format!("{round}-{}-{c}", if c % 2 == 0 { "a" } else { "b" }),
                    j,
                )
            })
            .collect()
    };

    // One round: everything each can take, at the same instant.
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = claimers("all")
        .into_iter()
        .map(|(owner, j)| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let got = j.claim(&claim(&owner, TURNS as i64, 600, 0)).await.unwrap();
                (owner, id_list(&got))
            })
        })
        .collect();
    let mut holder: BTreeMap<String, String> = BTreeMap::new();
    for t in tasks {
        let (owner, ids) = t.await.unwrap();
        for id in ids {
            if let Some(other) = holder.insert(id.clone(), owner.clone()) {
                panic!("{id} was leased to both {other} and {owner}");
            }
        }
    }
    assert_eq!(holder.len(), TURNS, "every pending turn is leased once");

    // Rounds of small claims after those leases ended, each claimer completing what it got.
    let tasks: Vec<_> = claimers("small")
        .into_iter()
        .map(|(owner, j)| {
            tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let got = j
                        .claim(&claim(&owner, TURNS as i64 + 1000, 600, 3))
                        .await
                        .unwrap();
                    if got.is_empty() {
                        return done;
                    }
                    for item in got {
                        assert!(j.complete(item.id()).await.unwrap(), "{:?}", item.id());
                        done.push(item.id().as_str().to_owned());
                    }
                }
            })
        })
        .collect();
    let mut completed: BTreeMap<String, usize> = BTreeMap::new();
    let mut busy = 0;
    for t in tasks {
        let done = t.await.unwrap();
        busy += usize::from(!done.is_empty());
        for id in done {
            *completed.entry(id).or_default() += 1;
        }
    }
    assert_eq!(completed.len(), TURNS);
    assert!(completed.values().all(|n| *n == 1), "{completed:?}");
    assert!(busy >= 2, "the claimers took turns in parallel");
    assert_eq!(a.counts().await.unwrap().pending, 0);
}

/// Replica A appends turns leased to itself and renews them by claiming; B gets none of them.
/// A stops renewing (it died): once its lease has ended B claims them all, oldest first, and
/// A's late release does not take them from B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_owner_stops_renewing_goes_to_the_other_replica_when_its_lease_ends() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    let a = replica(cluster.url(), &schema, PgTurnJournalOptions::default()).await;
    let b = replica(cluster.url(), &schema, PgTurnJournalOptions::default()).await;
    let lease = Duration::from_secs(4);
    for n in 0..5 {
        a.append_leased(turn(&format!("t{n}"), Some("bob"), n), "replica-a", lease)
            .await
            .unwrap();
    }
    // B's rounds while A renews every second.
    for s in 5..12 {
        let renewed = a.claim(&claim("replica-a", s, 4, 0)).await.unwrap();
        assert_eq!(renewed.len(), 5);
        let got = b.claim(&claim("replica-b", s, 4, 0)).await.unwrap();
        assert!(got.is_empty(), "B took {:?} from a live A", id_list(&got));
    }
    // A's last renewal was at 11: its leases end at 15.
    let got = b.claim(&claim("replica-b", 14, 4, 0)).await.unwrap();
    assert!(
        got.is_empty(),
        "B took {:?} before the lease ended",
        id_list(&got)
    );
    let got = b.claim(&claim("replica-b", 15, 4, 0)).await.unwrap();
    assert_eq!(id_list(&got), ["t0", "t1", "t2", "t3", "t4"]);
    assert!(
        got.iter()
            .all(|i| i.identity.user.is_some() && i.messages.len() == 2)
    );
    // A's release after the fact is a no-op: B keeps them.
    a.release(&TurnId::parse("t0").unwrap(), "replica-a")
        .await
        .unwrap();
    let got = a.claim(&claim("replica-a", 16, 4, 0)).await.unwrap();
    assert!(got.is_empty(), "A took back {:?}", id_list(&got));
    // B's failure gives t0 back: A may take it.
    b.record_failure(&TurnId::parse("t0").unwrap(), "boom", at(17))
        .await
        .unwrap();
    let got = a.claim(&claim("replica-a", 17, 4, 0)).await.unwrap();
    assert_eq!(id_list(&got), ["t0"]);
}

/// The byte bound refuses an append that would pass it (`Full`), counting what the whole table
/// holds, and a completed turn makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_bound_refuses_an_append_past_it() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = next_schema();
    // Room for two of the suite's turns, not three.
    let one = turn("t1", Some("alice"), 1);
    let texts = [
        "t1",
        "alice",
        "coder",
        "thread t1",
        "trace-t1",
        "preference",
    ];
    let weight = serde_json::to_string(&one.messages).unwrap().len()
        + texts.iter().map(|t| t.len()).sum::<usize>();
    let max_bytes = (weight * 5 / 2) as u64;
    let options = PgTurnJournalOptions { max_bytes };
    let a = replica(cluster.url(), &schema, options).await;
    let b = replica(cluster.url(), &schema, options).await;
    a.append(turn("t1", Some("alice"), 1)).await.unwrap();
    a.append(turn("t2", Some("alice"), 2)).await.unwrap();
    let mut refused = None;
    for n in 3..20 {
        match b.append(turn(&format!("t{n}"), Some("alice"), n)).await {
            Ok(_) => {}
            Err(e) => {
                refused = Some((n, e));
                break;
            }
        }
    }
    let (n, e) = refused.expect("the bound is reached");
    assert!(matches!(e, TurnJournalError::Full { .. }), "{e:?}");
    assert_eq!(n, 3, "two turns fit, the third does not");
    assert!(e.to_string().contains(&max_bytes.to_string()), "{e}");
    // A duplicate past the bound is still a duplicate.
    let dup = b.append(turn("t1", None, 1)).await;
    assert!(
        matches!(dup, Err(TurnJournalError::Duplicate(_))),
        "{dup:?}"
    );
    assert!(a.complete(&TurnId::parse("t1").unwrap()).await.unwrap());
    b.append(turn(&format!("t{n}"), Some("alice"), n))
        .await
        .unwrap();
}

/// Texts a JSON string may carry but a PostgreSQL `text` may not (NUL) are kept in the
/// messages; in an identity text they are refused as invalid input, not as an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_the_messages_round_trips_and_one_in_the_thread_id_is_invalid() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let j = replica(
        cluster.url(),
        &next_schema(),
        PgTurnJournalOptions::default(),
    )
    .await;
    let mut t = turn("t1", Some("alice"), 1);
    t.messages[0].content = serde_json::Value::String("nul \u{0} here".into());
    let kept = j.append(t.clone()).await.unwrap();
    let listed = j.list(&TurnFilter::default()).await.unwrap();
    assert_eq!(listed, vec![kept]);
    let mut bad = turn("t2", None, 2);
    bad.identity.thread_id = "thread\u{0}".into();
    let e = j.append(bad).await.expect_err("a NUL in a text column");
    assert!(matches!(e, TurnJournalError::Invalid(_)), "{e:?}");
    assert_eq!(j.counts().await.unwrap().pending, 1);
}

/// With the server stopped every operation is `Unavailable` and no message shows the password;
/// once it is back the same journal works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_unavailable_without_the_password_and_the_journal_recovers() {
    let cluster = PgCluster::start_fresh().unwrap_or_else(|e| panic!("{e}"));
    let password = "turns-s3cret-never-shown";
    cluster
        .require_password("turns_user", password)
        .unwrap_or_else(|e| panic!("{e}"));
    let url = cluster
        .url()
        .replacen("://deermem@", &format!("://turns_user:{password}@"), 1);
    let mut c = config(&url, &next_schema());
    c.connect_timeout_seconds = 1.0;
    let store = PgDatabase::connect(&c)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
    let j = PgTurnJournal::new(store, PgTurnJournalOptions::default());
    j.append(turn("t1", Some("alice"), 1)).await.unwrap();

    cluster.stop().unwrap_or_else(|e| panic!("{e}"));
    let t1 = TurnId::parse("t1").unwrap();
    let results: Vec<(&str, Result<(), TurnJournalError>)> = vec![
        ("append", j.append(turn("t2", None, 2)).await.map(|_| ())),
        ("list", j.list(&TurnFilter::default()).await.map(|_| ())),
        ("counts", j.counts().await.map(|_| ())),
        ("claim", j.claim(&claim("a", 3, 60, 0)).await.map(|_| ())),
        ("complete", j.complete(&t1).await.map(|_| ())),
        (
            "record_failure",
            j.record_failure(&t1, "e", at(4)).await.map(|_| ()),
        ),
    ];
    for (what, r) in results {
        match r {
            Err(e @ TurnJournalError::Unavailable { .. }) => {
                let shown = format!("{e} / {e:?}");
                assert!(!shown.contains(password), "{what}: {shown}");
            }
            other => panic!("{what} with the database down: {other:?}"),
        }
    }

    cluster.start_again().unwrap_or_else(|e| panic!("{e}"));
    let mut listed = None;
    for _ in 0..50 {
        match j.list(&TurnFilter::default()).await {
            Ok(items) => {
                listed = Some(items);
                break;
            }
            Err(TurnJournalError::Unavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("after the restart: {e:?}"),
        }
    }
    let listed = listed.expect("the journal works again once the database is back");
    assert_eq!(id_list(&listed), ["t1"]);
    assert_eq!(listed[0].state, TurnState::Pending);
    j.append(turn("t2", None, 2)).await.unwrap();
}
