//! The turn journal port: every conversation turn the engine accepts is written here durably
//! before it is acknowledged, and stays until its extraction is committed (or an operator drops
//! it), so a restart, a crash or a model outage loses no accepted turn.
//!
//! An item is pending (waiting for its first or next attempt) or dead (its attempts are spent;
//! kept for an operator to retry or drop). A shared adapter leases pending items to one replica
//! at a time ([`TurnJournal::claim`]); a single-process adapter may keep its leases in memory.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ids::{AgentName, UserId};
use crate::message::Message;
use crate::time::Timestamp;

/// The longest turn id accepted, in bytes.
pub const MAX_TURN_ID_BYTES: usize = 64;
/// The longest error text an item keeps, in bytes (longer texts are cut at a character
/// boundary).
pub const MAX_TURN_ERROR_BYTES: usize = 1024;

/// The stable identity of one accepted turn: ASCII letters, digits, `_` and `-`, at most
/// [`MAX_TURN_ID_BYTES`] bytes. The engine draws a fresh one per accepted turn.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TurnId(String);

/// Why a string is not a turn id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid turn id {0:?}: expected 1 to 64 ASCII letters, digits, '_' or '-'")]
pub struct TurnIdError(pub String);

impl TurnId {
    /// Checks a turn id.
    ///
    /// # Errors
    /// [`TurnIdError`] for an empty, too long or non-`[A-Za-z0-9_-]` id.
    pub fn parse(raw: &str) -> Result<Self, TurnIdError> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_TURN_ID_BYTES
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            let shown: String = raw.chars().take(80).collect();
            Err(TurnIdError(shown))
        }
    }

    /// The id made of 128 random bits: `turn_` and 32 hex digits.
    pub fn from_bits(bits: u128) -> Self {
        Self(format!("turn_{bits:032x}"))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TurnId {
    type Error = TurnIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<TurnId> for String {
    fn from(id: TurnId) -> Self {
        id.0
    }
}

impl fmt::Debug for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TurnId({})", self.0)
    }
}

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an item stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnState {
    /// Waiting for its first or next attempt.
    Pending,
    /// Its attempts are spent; kept until an operator retries or drops it.
    Dead,
}

impl TurnState {
    /// `pending` or `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Dead => "dead",
        }
    }
}

/// Who and where an accepted turn belongs to: everything a replay needs besides the messages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnIdentity {
    /// The item's id, stable across replays.
    pub id: TurnId,
    /// The user (absent for an anonymous host).
    pub user: Option<UserId>,
    /// The agent bucket.
    pub agent: AgentName,
    /// The host thread id.
    pub thread_id: String,
    /// The host's trace id.
    pub trace_id: Option<String>,
    /// Signal names seen at admission (`correction`, `preference`...).
    pub signals: Vec<String>,
    /// The emergency path (`add_nowait`): processed at once, ignoring the watermark.
    pub emergency: bool,
}

/// A turn to append.
#[derive(Clone, Debug, PartialEq)]
pub struct NewTurn {
    /// Its identity.
    pub identity: TurnIdentity,
    /// The admitted (filtered) messages.
    pub messages: Vec<Message>,
    /// When it was accepted.
    pub accepted_at: Timestamp,
}

/// One journal item.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnItem {
    /// Its identity.
    pub identity: TurnIdentity,
    /// The admitted messages.
    pub messages: Vec<Message>,
    /// When it was accepted.
    pub accepted_at: Timestamp,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Not before this instant (absent: at once).
    pub next_attempt_at: Option<Timestamp>,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// Pending or dead.
    pub state: TurnState,
}

impl TurnItem {
    /// A freshly appended item: pending, no attempt made.
    pub fn new(turn: NewTurn) -> Self {
        Self {
            identity: turn.identity,
            messages: turn.messages,
            accepted_at: turn.accepted_at,
            attempts: 0,
            next_attempt_at: None,
            last_error: None,
            state: TurnState::Pending,
        }
    }

    /// The item's id.
    pub fn id(&self) -> &TurnId {
        &self.identity.id
    }
}

/// Which items a listing returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TurnFilter {
    /// Only this user's items (`None`: everyone's, anonymous items included).
    pub user: Option<UserId>,
    /// Only items in this state (`None`: both).
    pub state: Option<TurnState>,
}

impl TurnFilter {
    /// Whether `item` passes the filter.
    pub fn matches(&self, item: &TurnItem) -> bool {
        self.user
            .as_ref()
            .is_none_or(|u| item.identity.user.as_ref() == Some(u))
            && self.state.is_none_or(|s| item.state == s)
    }
}

/// A lease request: `owner` takes up to `limit` pending items that no other live owner holds,
/// until `now + lease`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The claiming replica (stable for its lifetime, unique among replicas).
    pub owner: String,
    /// The current time as the claimer sees it.
    pub now: Timestamp,
    /// How long the lease lasts unless renewed by claiming again or released.
    pub lease: Duration,
    /// At most this many items (0: no limit).
    pub limit: usize,
}

/// What the journal holds, for limits and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnCounts {
    /// Pending items.
    pub pending: u64,
    /// Dead items.
    pub dead: u64,
}

/// Why a journal operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TurnJournalError {
    /// The journal could not be read or written; nothing was acknowledged.
    #[error("turn journal unavailable: {message}")]
    Unavailable {
        /// What failed (no secrets).
        message: String,
        /// The cause.
        #[source]
        source: Option<crate::error::ErrorSource>,
    },
    /// The journal is full: its bound would be passed.
    #[error("turn journal is full: {message}")]
    Full {
        /// Which bound.
        message: String,
    },
    /// The item to append carries an id the journal already holds.
    #[error("turn {0} is already in the journal")]
    Duplicate(TurnId),
    /// Bad input (an item that cannot be stored).
    #[error("invalid turn: {0}")]
    Invalid(String),
}

impl TurnJournalError {
    /// An I/O or connection failure.
    pub fn unavailable(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(std::sync::Arc::new(source)),
        }
    }
}

/// Cuts an error text to [`MAX_TURN_ERROR_BYTES`] at a character boundary.
pub fn bounded_error(text: &str) -> String {
    if text.len() <= MAX_TURN_ERROR_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_TURN_ERROR_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The durable record of accepted turns.
///
/// Contract (asserted by `deermem-testkit::turn_journal`):
/// - `append` returns only once the item would survive a crash of the process (and of the
///   machine, for a disk-backed adapter); the item is then pending with no attempt made. An id
///   already held is refused with [`TurnJournalError::Duplicate`].
/// - `complete` removes an item for good (its extraction was committed); `false` when the
///   journal does not hold it. Completing twice is harmless.
/// - `record_failure` counts one failed attempt, keeps the error text (bounded) and the time
///   before which the item is not tried again, and releases any lease on it.
/// - `dead_letter` makes a pending item dead (kept, never tried automatically again).
/// - `retry` makes a dead item pending again with its attempts reset; `false` when there is no
///   such dead item.
/// - `drop_turn` removes an item in any state; `false` when it is not held.
/// - `list` returns the items passing the filter, oldest accepted first, each with its original
///   identity and messages; `counts` the number of pending and dead items.
/// - `claim` leases pending items not leased by another owner (or whose lease has ended by
///   `now`) to the claimer and returns them, oldest first; claiming again renews the claimer's
///   own leases. `release` gives a lease back. Dead items are never claimed. An item whose owner
///   died becomes claimable once its lease has ended.
/// - `append_leased` appends as `append` and leases the item to `owner` until
///   `accepted_at + lease`, as a claim by `owner` would (so another replica's claim round does
///   not take a turn its appender has queued).
/// - Every operation on an unknown id is a no-op reporting `false`, never an error.
#[async_trait]
pub trait TurnJournal: Send + Sync + fmt::Debug {
    /// Appends an accepted turn durably.
    async fn append(&self, turn: NewTurn) -> Result<TurnItem, TurnJournalError>;
    /// Appends an accepted turn durably, leased to `owner` until `accepted_at + lease` (the
    /// appender queues it at once; a shared adapter must not let another owner claim it
    /// meanwhile). The default appends without a lease, which is right only for an adapter
    /// that one claimer uses.
    async fn append_leased(
        &self,
        turn: NewTurn,
        owner: &str,
        lease: Duration,
    ) -> Result<TurnItem, TurnJournalError> {
        let _ = (owner, lease);
        self.append(turn).await
    }
    /// Removes an item whose extraction was committed.
    async fn complete(&self, id: &TurnId) -> Result<bool, TurnJournalError>;
    /// Records a failed attempt; the item stays pending until `next_attempt_at`.
    async fn record_failure(
        &self,
        id: &TurnId,
        error: &str,
        next_attempt_at: Timestamp,
    ) -> Result<Option<TurnItem>, TurnJournalError>;
    /// Makes a pending item dead, keeping `error` as its last error.
    async fn dead_letter(&self, id: &TurnId, error: &str) -> Result<bool, TurnJournalError>;
    /// Makes a dead item pending again, its attempts reset.
    async fn retry(&self, id: &TurnId) -> Result<Option<TurnItem>, TurnJournalError>;
    /// Removes an item in any state.
    async fn drop_turn(&self, id: &TurnId) -> Result<bool, TurnJournalError>;
    /// The items passing `filter`, oldest accepted first.
    async fn list(&self, filter: &TurnFilter) -> Result<Vec<TurnItem>, TurnJournalError>;
    /// How many items are pending and dead.
    async fn counts(&self) -> Result<TurnCounts, TurnJournalError>;
    /// Leases pending items to `request.owner`.
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<TurnItem>, TurnJournalError>;
    /// Gives a lease back (a no-op when `owner` does not hold it).
    async fn release(&self, id: &TurnId, owner: &str) -> Result<(), TurnJournalError>;
}

/// The turn journal of a running engine as an operator drives it through a server (the
/// gateway's `/api/memory/turns` routes): the journal itself, and a retry that queues the
/// retried item in the running engine at once instead of at its next claim round.
#[async_trait]
pub trait TurnAdmin: Send + Sync + fmt::Debug {
    /// The journal (listing, counts, dropping).
    fn journal(&self) -> &Arc<dyn TurnJournal>;

    /// Makes the dead item `id` pending again, its attempts reset, and queues it in this
    /// process for an attempt now. `None` when the journal holds no dead item with this id.
    ///
    /// # Errors
    /// The journal's error when it cannot make the item pending. Once the item is pending,
    /// a failure to queue it at once is not an error: the engine's next claim round takes it.
    async fn retry_now(&self, id: &TurnId) -> Result<Option<TurnItem>, TurnJournalError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_ids_are_checked() {
        assert!(TurnId::parse("turn_0123abcd-x").is_ok());
        for bad in ["", "a/b", "../x", "a b", "é", &"x".repeat(65)] {
            assert!(TurnId::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(TurnId::parse(&"x".repeat(64)).is_ok());
        let fresh = TurnId::from_bits(u128::MAX);
        assert_eq!(TurnId::parse(fresh.as_str()).unwrap(), fresh);
    }

    #[test]
    fn errors_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_TURN_ERROR_BYTES);
        let cut = bounded_error(&long);
        assert!(cut.len() <= MAX_TURN_ERROR_BYTES);
        assert!(cut.len() >= MAX_TURN_ERROR_BYTES - 1);
        assert_eq!(bounded_error("short"), "short");
    }

    #[test]
    fn filters_match_user_and_state() {
        let alice = UserId::new("alice").unwrap();
        let item = TurnItem::new(NewTurn {
            identity: TurnIdentity {
                id: TurnId::parse("t1").unwrap(),
                user: Some(alice.clone()),
                agent: AgentName::default_bucket(),
                thread_id: "th".into(),
                trace_id: None,
                signals: vec![],
                emergency: false,
            },
            messages: vec![],
            accepted_at: Timestamp::from_unix_seconds(0),
        });
        assert!(TurnFilter::default().matches(&item));
        let bob = TurnFilter {
            user: Some(UserId::new("bob").unwrap()),
            state: None,
        };
        assert!(!bob.matches(&item));
        let dead = TurnFilter {
            user: Some(alice),
            state: Some(TurnState::Dead),
        };
        assert!(!dead.matches(&item));
    }
}
