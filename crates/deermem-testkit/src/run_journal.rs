//! The contract suite of the run journal port (`RunEventStore`): what every implementation
//! (the file journal, a database table) must do, as `pub async fn`s plus a macro that expands
//! one named `#[test]` per behaviour.

use crate::fixtures::user;
use std::sync::Arc;

use deermem_core::ports::RunEventStore;
use deermem_core::ports::run_journal::{
    CONTEXT_CATEGORY, CONTEXT_MEMORY_EVENT, EventQuery, EventsLookup, JournalError, RecordOutcome,
};
use deermem_core::{AgentName, UserId};

/// A store under test; `guard` keeps its resources (a temporary directory) alive.
pub struct RunJournalFixture {
    /// The store.
    pub store: Arc<dyn RunEventStore>,
    /// Dropped after the test.
    pub guard: Box<dyn std::any::Any>,
}

impl std::fmt::Debug for RunJournalFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunJournalFixture")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

fn hash(c: char) -> String {
    std::iter::repeat_n(c, 64).collect()
}

async fn events(store: &dyn RunEventStore, u: &UserId, t: &str, r: &str) -> EventsLookup {
    store
        .events(u, t, r, &EventQuery::default())
        .await
        .unwrap_or_else(|e| panic!("events: {e}"))
}

/// The first record appends one `context:memory` event with the hash, the agent and `seq` 1;
/// the same hash again writes nothing and returns the first event.
pub async fn record_then_repeat(f: RunJournalFixture) {
    let s = f.store.as_ref();
    let alice = user("alice");
    let agent = AgentName::parse("coder").unwrap_or_else(|e| panic!("agent: {e}"));
    let first = s
        .record_context(&alice, Some(&agent), "t-1", "r-1", &hash('a'))
        .await
        .unwrap_or_else(|e| panic!("record: {e}"));
    let RecordOutcome::Recorded(event) = first else {
        panic!("first record was {first:?}");
    };
    assert_eq!(event.seq, 1);
    assert_eq!(event.event_type, CONTEXT_MEMORY_EVENT);
    assert_eq!(event.category, CONTEXT_CATEGORY);
    assert_eq!(event.content_sha256(), Some(hash('a').as_str()));
    assert_eq!(
        event.metadata.get("agent_name").and_then(|v| v.as_str()),
        Some("coder")
    );
    let again = s
        .record_context(&alice, Some(&agent), "t-1", "r-1", &hash('a'))
        .await
        .unwrap_or_else(|e| panic!("repeat: {e}"));
    assert_eq!(again, RecordOutcome::AlreadyRecorded(event.clone()));
    assert_eq!(
        events(s, &alice, "t-1", "r-1").await,
        EventsLookup::Events(vec![event])
    );
}

/// A different hash for a run that already recorded one is a conflict and writes nothing.
pub async fn different_block_is_a_conflict(f: RunJournalFixture) {
    let s = f.store.as_ref();
    let u = user("bob");
    s.record_context(&u, None, "t", "r", &hash('b'))
        .await
        .unwrap_or_else(|e| panic!("record: {e}"));
    let err = s
        .record_context(&u, None, "t", "r", &hash('c'))
        .await
        .expect_err("a second block for one run must be refused");
    assert!(matches!(err, JournalError::Conflict { .. }), "{err:?}");
    let EventsLookup::Events(list) = events(s, &u, "t", "r").await else {
        panic!("the run must be known");
    };
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].content_sha256(), Some(hash('b').as_str()));
    assert_eq!(
        list[0].metadata.get("agent_name").and_then(|v| v.as_str()),
        Some(deermem_core::DEFAULT_AGENT_BUCKET)
    );
}

/// Unknown threads and runs are told apart; `seq` grows per user; queries filter and cut.
pub async fn lookups_and_queries(f: RunJournalFixture) {
    let s = f.store.as_ref();
    let u = user("carol");
    assert_eq!(events(s, &u, "t", "r").await, EventsLookup::UnknownThread);
    for (i, run) in ["r1", "r2", "r3"].iter().enumerate() {
        let out = s
            .record_context(&u, None, "t", run, &hash('d'))
            .await
            .unwrap_or_else(|e| panic!("record: {e}"));
        assert_eq!(out.event().seq, u64::try_from(i + 1).unwrap_or(u64::MAX));
    }
    assert_eq!(events(s, &u, "t", "nope").await, EventsLookup::UnknownRun);
    assert_eq!(
        events(s, &u, "other", "r1").await,
        EventsLookup::UnknownThread
    );
    let q = |after: Option<u64>, types: Option<Vec<String>>, limit: usize| EventQuery {
        event_types: types,
        after_seq: after,
        limit,
    };
    let found = async |query: EventQuery| match s.events(&u, "t", "r2", &query).await {
        Ok(EventsLookup::Events(list)) => list.len(),
        other => panic!("events: {other:?}"),
    };
    assert_eq!(found(q(None, None, 10)).await, 1);
    assert_eq!(found(q(Some(2), None, 10)).await, 0);
    assert_eq!(found(q(Some(1), None, 10)).await, 1);
    assert_eq!(found(q(None, Some(vec!["other:type".into()]), 10)).await, 0);
    assert_eq!(
        found(q(None, Some(vec![CONTEXT_MEMORY_EVENT.into()]), 10)).await,
        1
    );
    assert_eq!(found(q(None, None, 0)).await, 0);
}

/// One user's events are invisible to another, even for the same thread and run ids.
pub async fn users_are_isolated(f: RunJournalFixture) {
    let s = f.store.as_ref();
    let (a, b) = (user("dave"), user("erin"));
    s.record_context(&a, None, "t", "r", &hash('e'))
        .await
        .unwrap_or_else(|e| panic!("record: {e}"));
    assert_eq!(events(s, &b, "t", "r").await, EventsLookup::UnknownThread);
    let out = s
        .record_context(&b, None, "t", "r", &hash('f'))
        .await
        .unwrap_or_else(|e| panic!("record for b: {e}"));
    assert!(
        matches!(out, RecordOutcome::Recorded(ref e) if e.seq == 1),
        "{out:?}"
    );
}

/// Hostile ids and malformed hashes are refused before anything is stored.
pub async fn invalid_input_is_refused(f: RunJournalFixture) {
    let s = f.store.as_ref();
    let u = user("frank");
    let long = "x".repeat(10_000);
    for (t, r) in [
        ("../x", "r"),
        ("t", ".."),
        ("", "r"),
        ("t", "a\0b"),
        (long.as_str(), "r"),
    ] {
        let err = s
            .record_context(&u, None, t, r, &hash('a'))
            .await
            .expect_err("hostile id accepted");
        assert!(
            matches!(err, JournalError::InvalidId { .. }),
            "{t:?} {r:?}: {err:?}"
        );
        assert!(matches!(
            s.events(&u, t, r, &EventQuery::default()).await,
            Err(JournalError::InvalidId { .. })
        ));
    }
    for bad in ["", "ABC", "g".repeat(64).as_str(), &hash('A')] {
        let err = s
            .record_context(&u, None, "t", "r", bad)
            .await
            .expect_err("bad hash accepted");
        assert!(matches!(
            err,
            JournalError::InvalidId {
                field: "content_sha256",
                ..
            }
        ));
    }
    assert_eq!(events(s, &u, "t", "r").await, EventsLookup::UnknownThread);
}

/// Expands one `#[test]` per run journal behaviour. `$fixture` is an expression evaluating to
/// a future of a [`RunJournalFixture`].
#[macro_export]
macro_rules! run_journal_contract {
    ($fixture:expr) => {
        $crate::run_journal_contract!(@tests $fixture;
            record_then_repeat,
            different_block_is_a_conflict,
            lookups_and_queries,
            users_are_isolated,
            invalid_input_is_refused,
        );
    };
    (@tests $fixture:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::block_on(async {
                    let fixture = $fixture.await;
                    $crate::run_journal::$name(fixture).await;
                });
            }
        )*
    };
}
