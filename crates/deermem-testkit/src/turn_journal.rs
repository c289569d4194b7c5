//! The contract suite of the turn journal port (`TurnJournal`): what every implementation (the
//! file journal under the storage root, a database table shared by replicas) must do, as
//! `pub async fn`s plus a macro that expands one named `#[test]` per behaviour.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use deermem_core::ports::TurnJournal;
use deermem_core::ports::turn_journal::{
    ClaimRequest, MAX_TURN_ERROR_BYTES, NewTurn, TurnCounts, TurnFilter, TurnId, TurnIdentity,
    TurnItem, TurnJournalError, TurnState,
};
use deermem_core::{AgentName, Message, Timestamp};

use crate::fixtures::user;

/// Opens the journal again over the same durable state (a new process would see this).
pub type Reopen =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Arc<dyn TurnJournal>> + Send>> + Send + Sync>;

/// A journal under test over a fresh, empty state.
pub struct TurnJournalFixture {
    /// The journal.
    pub journal: Arc<dyn TurnJournal>,
    /// Opens it again over the same state; the suite drops `journal` first.
    pub reopen: Reopen,
    /// Dropped after the test (a temporary directory, a cluster).
    pub guard: Box<dyn Any + Send>,
}

impl fmt::Debug for TurnJournalFixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnJournalFixture")
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

/// The instant the suite's items are accepted at.
pub const T0: i64 = 1_780_000_000;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_unix_seconds(T0 + secs)
}

fn id(s: &str) -> TurnId {
    TurnId::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

/// A turn of `user` (or an anonymous one) accepted `secs` after [`T0`].
pub fn turn(turn_id: &str, owner: Option<&str>, secs: i64) -> NewTurn {
    let agent = AgentName::parse("coder").unwrap_or_else(|e| panic!("agent: {e}"));
    let mut hello = Message::human(format!("hello from {turn_id}: I prefer tea, 你好"));
    hello.id = Some(format!("m-{turn_id}"));
    hello
        .additional_kwargs
        .insert("hide_from_ui".into(), serde_json::Value::Bool(false));
    NewTurn {
        identity: TurnIdentity {
            id: id(turn_id),
            user: owner.map(user),
            agent,
            thread_id: format!("thread {turn_id}"),
            trace_id: Some(format!("trace-{turn_id}")),
            signals: vec!["preference".into()],
            emergency: turn_id.ends_with('e'),
        },
        messages: vec![hello, Message::ai("noted")],
        accepted_at: at(secs),
    }
}

async fn append(j: &dyn TurnJournal, t: NewTurn) -> TurnItem {
    j.append(t).await.unwrap_or_else(|e| panic!("append: {e}"))
}

async fn list(j: &dyn TurnJournal, filter: TurnFilter) -> Vec<TurnItem> {
    j.list(&filter)
        .await
        .unwrap_or_else(|e| panic!("list: {e}"))
}

fn ids(items: &[TurnItem]) -> Vec<&str> {
    items.iter().map(|i| i.id().as_str()).collect()
}

fn of_user(u: &str) -> TurnFilter {
    TurnFilter {
        user: Some(user(u)),
        state: None,
    }
}

fn in_state(state: TurnState) -> TurnFilter {
    TurnFilter {
        user: None,
        state: Some(state),
    }
}

async fn counts(j: &dyn TurnJournal) -> TurnCounts {
    j.counts().await.unwrap_or_else(|e| panic!("counts: {e}"))
}

fn claim(owner: &str, secs: i64) -> ClaimRequest {
    ClaimRequest {
        owner: owner.into(),
        now: at(secs),
        lease: Duration::from_secs(30),
        limit: 0,
    }
}

/// Appended items are pending with no attempt, listed oldest accepted first with their whole
/// identity and messages, filtered by user; anonymous items are listed only without a user.
pub async fn append_then_list(f: TurnJournalFixture) {
    let j = f.journal.as_ref();
    let second = append(j, turn("t2", Some("bob"), 2)).await;
    let first = append(j, turn("t1", Some("alice"), 1)).await;
    append(j, turn("t3e", None, 3)).await;
    assert_eq!(first, TurnItem::new(turn("t1", Some("alice"), 1)));
    assert_eq!(second.state, TurnState::Pending);
    assert_eq!(second.attempts, 0);
    let all = list(j, TurnFilter::default()).await;
    assert_eq!(ids(&all), ["t1", "t2", "t3e"]);
    assert_eq!(all[0], TurnItem::new(turn("t1", Some("alice"), 1)));
    assert_eq!(all[2], TurnItem::new(turn("t3e", None, 3)));
    assert!(all[2].identity.emergency);
    assert_eq!(ids(&list(j, of_user("alice")).await), ["t1"]);
    assert_eq!(ids(&list(j, of_user("carol")).await), Vec::<&str>::new());
    assert_eq!(
        counts(j).await,
        TurnCounts {
            pending: 3,
            dead: 0
        }
    );
}

/// An id the journal holds is refused, and the first item stays as it was.
pub async fn duplicate_ids_are_refused(f: TurnJournalFixture) {
    let j = f.journal.as_ref();
    append(j, turn("t1", Some("alice"), 1)).await;
    let again = j.append(turn("t1", Some("bob"), 5)).await;
    assert!(
        matches!(again, Err(TurnJournalError::Duplicate(ref d)) if d.as_str() == "t1"),
        "{again:?}"
    );
    let all = list(j, TurnFilter::default()).await;
    assert_eq!(all, vec![TurnItem::new(turn("t1", Some("alice"), 1))]);
}

/// `complete` removes an item for good; completing it again, or an unknown id, reports false.
pub async fn complete_removes_the_item(f: TurnJournalFixture) {
    let j = f.journal.as_ref();
    append(j, turn("t1", Some("alice"), 1)).await;
    append(j, turn("t2", Some("alice"), 2)).await;
    assert!(
        j.complete(&id("t1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert!(
        !j.complete(&id("t1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert!(
        !j.complete(&id("nope"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert_eq!(ids(&list(j, TurnFilter::default()).await), ["t2"]);
    assert_eq!(
        counts(j).await,
        TurnCounts {
            pending: 1,
            dead: 0
        }
    );
}

/// Failures count attempts and keep the error and the next attempt time; a dead item is listed
/// as dead, `retry` makes it pending with no attempt, `drop_turn` removes it in any state.
pub async fn failures_dead_letters_retries_and_drops(f: TurnJournalFixture) {
    let j = f.journal.as_ref();
    append(j, turn("t1", Some("alice"), 1)).await;
    append(j, turn("t2", Some("alice"), 2)).await;
    let once = j
        .record_failure(&id("t1"), "model returned 503", at(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("t1 is held"));
    assert_eq!(once.attempts, 1);
    let twice = j
        .record_failure(&id("t1"), "model returned 429", at(20))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("t1 is held"));
    assert_eq!(twice.attempts, 2);
    assert_eq!(twice.next_attempt_at, Some(at(20)));
    assert_eq!(twice.last_error.as_deref(), Some("model returned 429"));
    assert_eq!(twice.state, TurnState::Pending);
    assert!(
        j.dead_letter(&id("t1"), "gave up after 2 attempts")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert_eq!(
        counts(j).await,
        TurnCounts {
            pending: 1,
            dead: 1
        }
    );
    let dead = list(j, in_state(TurnState::Dead)).await;
    assert_eq!(ids(&dead), ["t1"]);
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(
        dead[0].last_error.as_deref(),
        Some("gave up after 2 attempts")
    );
    assert_eq!(dead[0].messages, turn("t1", None, 0).messages);
    assert_eq!(ids(&list(j, in_state(TurnState::Pending)).await), ["t2"]);
    // A pending item is not retried; a dead one is, with its attempts reset.
    assert!(
        j.retry(&id("t2"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none()
    );
    let back = j
        .retry(&id("t1"))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("t1 is dead"));
    assert_eq!((back.state, back.attempts), (TurnState::Pending, 0));
    assert_eq!(back.next_attempt_at, None);
    assert_eq!(
        counts(j).await,
        TurnCounts {
            pending: 2,
            dead: 0
        }
    );
    assert!(
        j.dead_letter(&id("t2"), "x")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert!(
        j.drop_turn(&id("t2"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert!(
        j.drop_turn(&id("t1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert!(
        !j.drop_turn(&id("t1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert_eq!(counts(j).await, TurnCounts::default());
}

/// Operations on ids the journal does not hold change nothing and are not errors; an error
/// text is kept bounded.
pub async fn unknown_ids_are_no_ops_and_errors_are_bounded(f: TurnJournalFixture) {
    let j = f.journal.as_ref();
    let ghost = id("ghost");
    assert!(
        j.record_failure(&ghost, "e", at(1))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none()
    );
    assert!(
        !j.dead_letter(&ghost, "e")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert!(
        j.retry(&ghost)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none()
    );
    j.release(&ghost, "me")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    append(j, turn("t1", None, 1)).await;
    let long = "x".repeat(MAX_TURN_ERROR_BYTES * 4);
    let item = j
        .record_failure(&id("t1"), &long, at(2))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("t1 is held"));
    assert!(
        item.last_error
            .is_some_and(|e| e.len() <= MAX_TURN_ERROR_BYTES)
    );
    assert_eq!(
        counts(j).await,
        TurnCounts {
            pending: 1,
            dead: 0
        }
    );
}

/// What was acknowledged survives a reopen: pending and dead items with their attempts, and
/// nothing that was completed or dropped.
pub async fn state_survives_a_reopen(f: TurnJournalFixture) {
    {
        let j = f.journal.as_ref();
        for (n, t) in ["t1", "t2", "t3", "t4"].into_iter().enumerate() {
            append(j, turn(t, Some("alice"), n as i64)).await;
        }
        j.record_failure(&id("t1"), "boom", at(9))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            j.dead_letter(&id("t2"), "dead")
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        );
        assert!(
            j.complete(&id("t3"))
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        );
    }
    let TurnJournalFixture {
        journal,
        reopen,
        guard,
    } = f;
    drop(journal);
    let j = reopen().await;
    let all = list(j.as_ref(), TurnFilter::default()).await;
    assert_eq!(ids(&all), ["t1", "t2", "t4"]);
    assert_eq!((all[0].attempts, all[0].next_attempt_at), (1, Some(at(9))));
    assert_eq!(all[0].last_error.as_deref(), Some("boom"));
    assert_eq!(all[1].state, TurnState::Dead);
    assert_eq!(all[2], TurnItem::new(turn("t4", Some("alice"), 3)));
    // It keeps working after the reopen.
    append(j.as_ref(), turn("t5", None, 5)).await;
    assert!(
        j.complete(&id("t1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    assert_eq!(
        counts(j.as_ref()).await,
        TurnCounts {
            pending: 2,
            dead: 1
        }
    );
    drop(guard);
}

/// A claim leases pending items to one owner: another owner gets none of them until the lease
/// ends or is released, the holder renews by claiming again, dead items are never claimed,
/// and a failure releases the lease.
pub async fn claims_lease_items_to_one_owner(f: TurnJournalFixture) {
    let j = f.journal.as_ref();
    append(j, turn("t1", Some("alice"), 1)).await;
    append(j, turn("t2", Some("bob"), 2)).await;
    append(j, turn("t3", Some("bob"), 3)).await;
    assert!(
        j.dead_letter(&id("t3"), "dead")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    let claim_ids = |items: Vec<TurnItem>| -> Vec<String> {
        items.iter().map(|i| i.id().as_str().to_owned()).collect()
    };
    let a = j
        .claim(&claim("a", 0))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claim_ids(a), ["t1", "t2"]);
    let b = j
        .claim(&claim("b", 10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(b.is_empty(), "b claimed {:?}", claim_ids(b));
    // The holder renews its leases: they now last until 20 + 30.
    let a = j
        .claim(&claim("a", 20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claim_ids(a), ["t1", "t2"]);
    let b = j
        .claim(&claim("b", 40))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(b.is_empty(), "b claimed {:?}", claim_ids(b));
    // Released, an item is claimable at once; the other one once a's lease has ended.
    j.release(&id("t2"), "b")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    j.release(&id("t2"), "a")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = j
        .claim(&claim("b", 41))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claim_ids(b), ["t2"]);
    let b = j
        .claim(&claim("b", 51))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claim_ids(b), ["t1", "t2"]);
    // A failed attempt gives the lease back.
    j.record_failure(&id("t1"), "boom", at(52))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let a = j
        .claim(&claim("a", 53))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claim_ids(a), ["t1"]);
    // A limit caps one claim.
    append(j, turn("t4", None, 4)).await;
    let limited = ClaimRequest {
        limit: 1,
        ..claim("c", 200)
    };
    let c = j.claim(&limited).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claim_ids(c), ["t1"]);
}

/// An item appended with a lease is held by its appender: another owner's claim gets it only
/// once that lease has ended (or the appender renewed it by claiming and then let it end).
pub async fn leased_appends_are_held_by_their_appender(f: TurnJournalFixture) {
    let j = f.journal.as_ref();
    let lease = Duration::from_secs(30);
    j.append_leased(turn("t1", Some("alice"), 1), "a", lease)
        .await
        .unwrap_or_else(|e| panic!("append_leased: {e}"));
    append(j, turn("t2", Some("alice"), 2)).await;
    let b = j
        .claim(&claim("b", 10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ids(&b), ["t2"]);
    let a = j
        .claim(&claim("a", 20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ids(&a), ["t1"]);
    // a renewed until 20 + 30: not b's at 45, b's at 50.
    let b = j
        .claim(&claim("b", 45))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ids(&b), ["t2"]);
    let b = j
        .claim(&claim("b", 50))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ids(&b), ["t1", "t2"]);
    // A leased append of a held id is refused like any other.
    let again = j.append_leased(turn("t1", None, 3), "c", lease).await;
    assert!(
        matches!(again, Err(TurnJournalError::Duplicate(_))),
        "{again:?}"
    );
}

/// Expands one `#[test]` per turn-journal behaviour; `$make` evaluates to a future of a
/// [`TurnJournalFixture`] over a fresh, empty journal.
#[macro_export]
macro_rules! turn_journal_contract {
    ($make:expr) => {
        $crate::turn_journal_contract!(@tests $make;
            append_then_list,
            duplicate_ids_are_refused,
            complete_removes_the_item,
            failures_dead_letters_retries_and_drops,
            unknown_ids_are_no_ops_and_errors_are_bounded,
            state_survives_a_reopen,
            claims_lease_items_to_one_owner,
            leased_appends_are_held_by_their_appender,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::block_on(async {
                    let fixture = $make.await;
                    $crate::turn_journal::$name(fixture).await;
                });
            }
        )*
    };
}
