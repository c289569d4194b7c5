//! The run journal port: a bounded, append-only record of run events per user, so a host can
//! prove afterwards which memory block an agent run saw (through the block's SHA-256), with the
//! event types, the id grammar and the errors every implementation shares.

use std::fmt;
use std::io;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::ids::{AgentName, DEFAULT_AGENT_BUCKET, UserId};

/// The event type of a run's memory identity.
pub const CONTEXT_MEMORY_EVENT: &str = "context:memory";
/// The category of [`CONTEXT_MEMORY_EVENT`].
pub const CONTEXT_CATEGORY: &str = "context";
/// The longest thread or run id the journal accepts, in characters.
pub const MAX_RUN_KEY_CHARS: usize = 256;
/// The longest event type accepted in a filter, in characters.
pub const MAX_EVENT_TYPE_CHARS: usize = 64;

/// One recorded run event, in the reference's run-event shape (its JSON is the body of the
/// events route: fields in this order).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunEvent {
    /// The thread the run belongs to.
    pub thread_id: String,
    /// The run.
    pub run_id: String,
    /// The event type, e.g. `context:memory`.
    pub event_type: String,
    /// The event category, e.g. `context`.
    pub category: String,
    /// For `context:memory`: exactly `{"content_sha256": "<hex>"}`.
    pub content: Map<String, Value>,
    /// Extra facts (`agent_name`).
    pub metadata: Map<String, Value>,
    /// Position in the user's journal (increasing from 1, never reused).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub seq: u64,
    /// When it was recorded (ISO-Z).
    pub created_at: String,
}

impl RunEvent {
    /// The public JSON shape (`thread_id`, `run_id`, `event_type`, `category`, `content`,
    /// `metadata`, `seq`, `created_at`).
    pub fn to_json(&self) -> Value {
        // Strings, integers and maps of JSON values: serialising cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The recorded block hash of a `context:memory` event.
    pub fn content_sha256(&self) -> Option<&str> {
        self.content.get("content_sha256").and_then(Value::as_str)
    }

    /// The `context:memory` event every journal records for a served block: category
    /// `context`, content exactly `{"content_sha256"}`, metadata `{"agent_name"}` (the default
    /// bucket's name when no agent is given).
    pub fn context_memory(
        seq: u64,
        thread_id: &str,
        run_id: &str,
        agent: Option<&AgentName>,
        content_sha256: &str,
        created_at: String,
    ) -> Self {
        let agent = agent.map_or(DEFAULT_AGENT_BUCKET, AgentName::as_str);
        let content = Map::from_iter([("content_sha256".to_owned(), Value::from(content_sha256))]);
        let metadata = Map::from_iter([("agent_name".to_owned(), Value::from(agent))]);
        Self {
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            event_type: CONTEXT_MEMORY_EVENT.to_owned(),
            category: CONTEXT_CATEGORY.to_owned(),
            content,
            metadata,
            seq,
            created_at,
        }
    }
}

/// Checks the arguments of [`RunEventStore::record_context`] the way every journal must.
///
/// # Errors
/// `InvalidId` naming the bad thread id, run id or block hash.
pub fn check_record_args(
    thread_id: &str,
    run_id: &str,
    content_sha256: &str,
) -> Result<(), JournalError> {
    validate_run_key("thread_id", thread_id)?;
    validate_run_key("run_id", run_id)?;
    if !is_sha256_hex(content_sha256) {
        return Err(JournalError::InvalidId {
            field: "content_sha256",
            reason: "must be 64 lowercase hexadecimal digits".into(),
        });
    }
    Ok(())
}

/// The outcome of recording `offered` for a run whose `context:memory` event is `existing`:
/// the same block is [`RecordOutcome::AlreadyRecorded`], a different one a conflict.
///
/// # Errors
/// [`JournalError::Conflict`] with both hashes.
pub fn settle_recorded(existing: RunEvent, offered: &str) -> Result<RecordOutcome, JournalError> {
    let recorded = existing.content_sha256().unwrap_or_default().to_owned();
    if recorded == offered {
        Ok(RecordOutcome::AlreadyRecorded(existing))
    } else {
        Err(JournalError::Conflict {
            thread_id: existing.thread_id,
            run_id: existing.run_id,
            recorded,
            offered: offered.to_owned(),
        })
    }
}

/// What [`RunEventStore::record_context`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordOutcome {
    /// A new `context:memory` event was appended.
    Recorded(RunEvent),
    /// The run already had this block's event; nothing was written.
    AlreadyRecorded(RunEvent),
}

impl RecordOutcome {
    /// The run's event.
    pub fn event(&self) -> &RunEvent {
        match self {
            Self::Recorded(e) | Self::AlreadyRecorded(e) => e,
        }
    }
}

/// What [`RunEventStore::events`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum EventsLookup {
    /// The user has no (retained) event in this thread.
    UnknownThread,
    /// The thread is known but this run has no (retained) event.
    UnknownRun,
    /// The run's events matching the query, in `seq` order.
    Events(Vec<RunEvent>),
}

/// Which of a run's events [`RunEventStore::events`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventQuery {
    /// Only these event types (`None`: all).
    pub event_types: Option<Vec<String>>,
    /// Only events with a larger `seq`.
    pub after_seq: Option<u64>,
    /// At most this many (the oldest first).
    pub limit: usize,
}

impl Default for EventQuery {
    fn default() -> Self {
        Self {
            event_types: None,
            after_seq: None,
            limit: 500,
        }
    }
}

/// Run journal failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// A thread or run id, or a block hash, is not acceptable.
    #[error("Invalid {field}: {reason}")]
    InvalidId {
        /// `thread_id`, `run_id` or `content_sha256`.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The run already recorded a different memory block.
    #[error(
        "Run '{run_id}' of thread '{thread_id}' already recorded a different memory block \
         (content_sha256 {recorded}); a run sees one memory block."
    )]
    Conflict {
        /// The thread.
        thread_id: String,
        /// The run.
        run_id: String,
        /// The hash already recorded.
        recorded: String,
        /// The hash offered now.
        offered: String,
    },
    /// Another journal (this or another process) holds the store.
    #[error("run journal {} is in use by another process or journal", lock.display())]
    Busy {
        /// What is held (the lock file of a file journal).
        lock: PathBuf,
    },
    /// A filesystem operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The OS error.
        source: io::Error,
    },
}

/// Checks a thread or run id for the journal: 1 to [`MAX_RUN_KEY_CHARS`] characters of
/// `[A-Za-z0-9._:@+=~-]`, and not `.` or `..`.
///
/// # Errors
/// [`JournalError::InvalidId`] naming the field.
pub fn validate_run_key(field: &'static str, value: &str) -> Result<(), JournalError> {
    let bad = |reason: &str| {
        Err(JournalError::InvalidId {
            field,
            reason: reason.to_owned(),
        })
    };
    if value.is_empty() {
        return bad("must not be empty");
    }
    if value.len() > MAX_RUN_KEY_CHARS {
        return bad(&format!("must be at most {MAX_RUN_KEY_CHARS} characters"));
    }
    if value == "." || value == ".." {
        return bad("must not be '.' or '..'");
    }
    let ok = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._:@+=~-".contains(&b));
    if !ok {
        return bad("may contain only letters, digits and . _ : @ + = ~ -");
    }
    Ok(())
}

/// Whether `t` is an acceptable event type: 1 to [`MAX_EVENT_TYPE_CHARS`] characters of
/// letters, digits and `. _ : -`.
pub fn valid_event_type(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= MAX_EVENT_TYPE_CHARS
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// Checks an event-type filter value.
///
/// # Errors
/// [`JournalError::InvalidId`] for an empty, too long or oddly spelled type.
pub fn validate_event_type(value: &str) -> Result<(), JournalError> {
    if valid_event_type(value) {
        Ok(())
    } else {
        Err(JournalError::InvalidId {
            field: "event_types",
            reason: format!(
                "each type must be 1 to {MAX_EVENT_TYPE_CHARS} characters of letters, digits and . _ : -"
            ),
        })
    }
}

/// Whether `s` is a block hash as recorded: 64 lowercase hexadecimal digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A store of run events (the file journal beside the file storage; a database table in a
/// shared deployment).
///
/// # Contract
/// - `record_context` appends one `context:memory` event (category `context`, content exactly
///   `{"content_sha256": …}`, metadata `agent_name`, the default bucket name for no agent) per
///   (user, thread, run); recording the same hash again writes nothing and answers
///   `AlreadyRecorded` with the first event; a different hash is a `Conflict` and writes
///   nothing. `seq` increases from 1 per user and is never reused.
/// - `events` answers `UnknownThread` when the user has no retained event in the thread,
///   `UnknownRun` when the thread is known but the run is not, else the run's events in `seq`
///   order after `after_seq`, of the requested types, at most `limit`.
/// - Ids are checked with [`validate_run_key`] and hashes with [`is_sha256_hex`] before anything
///   is read or written (`InvalidId`). One user's events are never visible to another user.
#[async_trait::async_trait]
pub trait RunEventStore: Send + Sync + fmt::Debug {
    /// Records that `user`'s run `run_id` of `thread_id` saw the block whose SHA-256 is
    /// `content_sha256`.
    ///
    /// # Errors
    /// `InvalidId`, `Conflict` (nothing written), `Io` (nothing recorded).
    async fn record_context(
        &self,
        user: &UserId,
        agent: Option<&AgentName>,
        thread_id: &str,
        run_id: &str,
        content_sha256: &str,
    ) -> Result<RecordOutcome, JournalError>;

    /// The events `user` recorded for `run_id` of `thread_id`, filtered by `query`.
    ///
    /// # Errors
    /// `InvalidId` for a bad thread or run id; `Io` when the store cannot be read.
    async fn events(
        &self,
        user: &UserId,
        thread_id: &str,
        run_id: &str,
        query: &EventQuery,
    ) -> Result<EventsLookup, JournalError>;

    /// The bounds of the store's in-process caches (users' event indexes kept in memory; see
    /// [`crate::CacheBound`]). Empty by default.
    fn cache_bounds(&self) -> Vec<crate::CacheBound> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_keys_are_validated() {
        for ok in [
            "t-1",
            "2f1c6a3e-9b1d-4e6f-8a8a-0c2d1e3f4a5b",
            "run_01HZ:x@y+z=~.",
        ] {
            assert!(validate_run_key("run_id", ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(MAX_RUN_KEY_CHARS + 1);
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "a\0b",
            "a b",
            "é",
            "a\nb",
            long.as_str(),
        ] {
            assert!(
                matches!(
                    validate_run_key("run_id", bad),
                    Err(JournalError::InvalidId {
                        field: "run_id",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert!(validate_event_type("context:memory").is_ok());
        assert!(validate_event_type("").is_err());
        assert!(validate_event_type("a b").is_err());
    }
}
