//! Error types: one `thiserror` enum per port, plus the validation errors of ids, facts and
//! configuration. Variants are the decisions a caller can act on; adapters keep their detailed
//! private errors and convert into these.

use std::time::Duration;

use thiserror::Error;

/// Invalid user ids, agent names and fact ids. Messages match the reference's where it has one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum IdError {
    /// An empty user id.
    #[error("user_id must be a non-empty string.")]
    EmptyUserId,
    /// A user id containing NUL.
    #[error("user_id must not contain NUL characters")]
    UserIdNul,
    /// A user id too long to map to a directory name.
    #[error("user_id is too long ({len} bytes; at most {max})")]
    UserIdTooLong {
        /// Length given.
        len: usize,
        /// Longest accepted.
        max: usize,
    },
    /// An empty agent name.
    #[error("Agent name must be a non-empty string.")]
    EmptyAgentName,
    /// An agent name outside the grammar.
    #[error("Invalid agent name '{name}': names must match ^[A-Za-z0-9-]+$")]
    InvalidAgentName {
        /// The rejected name (shortened).
        name: String,
    },
    /// An over-long agent name.
    #[error("agent name is too long ({len} bytes; at most {max})")]
    AgentNameTooLong {
        /// Length given.
        len: usize,
        /// Longest accepted.
        max: usize,
    },
    /// An empty fact id.
    #[error("Fact id must be a non-empty string.")]
    EmptyFactId,
    /// A fact id outside `[A-Za-z0-9_-]+`.
    #[error("Fact id may contain only letters, numbers, '_' and '-'.")]
    InvalidFactId {
        /// The rejected id (shortened).
        id: String,
    },
    /// An over-long fact id.
    #[error("fact id is too long ({len} bytes; at most {max})")]
    FactIdTooLong {
        /// Length given.
        len: usize,
        /// Longest accepted.
        max: usize,
    },
}

impl IdError {
    /// The input field the error is about: `user_id`, `agent_name` or `fact_id`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::EmptyUserId | Self::UserIdNul | Self::UserIdTooLong { .. } => "user_id",
            Self::EmptyAgentName
            | Self::InvalidAgentName { .. }
            | Self::AgentNameTooLong { .. } => "agent_name",
            Self::EmptyFactId | Self::InvalidFactId { .. } | Self::FactIdTooLong { .. } => {
                "fact_id"
            }
        }
    }
}

/// Fact validation failures of the strict write-time checks, with the reference's messages.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FactError {
    /// The fact is not a mapping.
    #[error("fact must be an object")]
    NotAnObject,
    /// Bad id characters.
    #[error("fact.id may contain only letters, numbers, '_' and '-'")]
    InvalidId,
    /// An id longer than ids may be here (the Python reference stores ids up to its file-name
    /// limit, about 251 bytes).
    #[error(
        "fact.id is {len} bytes; fact ids are at most {max} bytes here (the Python DeerMem accepts longer ones)"
    )]
    IdTooLong {
        /// The id's length in bytes.
        len: usize,
        /// The most bytes an id may have.
        max: usize,
    },
    /// `content` is not a string.
    #[error("fact.content must be a string")]
    ContentNotString,
    /// `content` is blank.
    #[error("fact.content must not be empty")]
    ContentEmpty,
    /// `category` is not a string.
    #[error("fact.category must be a string")]
    CategoryNotString,
    /// `confidence` is not a number in `[0, 1]`.
    #[error("fact.confidence must be a number between 0 and 1")]
    Confidence,
    /// `status` is not `active`.
    #[error("fact.status must be 'active'; deletion is physical")]
    Status,
    /// `topics` is not a list of strings.
    #[error("fact.topics must be a list of strings")]
    Topics,
    /// `consolidatedFrom` is not a list of strings.
    #[error("fact.consolidatedFrom must be a list of strings")]
    ConsolidatedFrom,
    /// `lastConfirmedAt` is neither null nor a string.
    #[error("fact.lastConfirmedAt must be a string when present")]
    LastConfirmedAt,
    /// `confirmationCount` is neither null nor an integer ≥ 1.
    #[error("fact.confirmationCount must be an integer >= 1 when present")]
    ConfirmationCount,
    /// `revision` is not an integer ≥ 1.
    #[error("fact.revision must be an integer >= 1")]
    Revision,
    /// `source.type` is not a string.
    #[error("fact.source.type must be a string")]
    SourceType,
    /// `source.threadId` is neither null nor a string.
    #[error("fact.source.threadId must be a string or null")]
    SourceThreadId,
    /// `createdAt` / `updatedAt` are not strings.
    #[error("fact.createdAt and fact.updatedAt must be strings")]
    Timestamps,
    /// An update carried a revision different from the stored one.
    #[error("Expected fact '{id}' revision {expected}, found {}", found.map_or("None".to_owned(), |f| f.to_string()))]
    RevisionConflict {
        /// The fact id.
        id: String,
        /// The revision the writer expected.
        expected: u64,
        /// The stored revision (`None` when the fact is absent).
        found: Option<u64>,
    },
}

impl FactError {
    /// The fact field the error names.
    pub fn field(&self) -> &'static str {
        match self {
            Self::NotAnObject => "fact",
            Self::InvalidId | Self::IdTooLong { .. } => "id",
            Self::ContentNotString | Self::ContentEmpty => "content",
            Self::CategoryNotString => "category",
            Self::Confidence => "confidence",
            Self::Status => "status",
            Self::Topics => "topics",
            Self::ConsolidatedFrom => "consolidatedFrom",
            Self::LastConfirmedAt => "lastConfirmedAt",
            Self::ConfirmationCount => "confirmationCount",
            Self::Revision | Self::RevisionConflict { .. } => "revision",
            Self::SourceType => "source.type",
            Self::SourceThreadId => "source.threadId",
            Self::Timestamps => "createdAt",
        }
    }
}

/// Errors of the [`crate::ports::MemoryStorage`] port.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The shared user revision differs from the expected one.
    #[error("Expected user-memory revision {expected}, found {found}")]
    ManifestConflict {
        /// Expected revision.
        expected: u64,
        /// Stored revision.
        found: u64,
    },
    /// A per-fact revision precondition failed.
    #[error("{message}")]
    FactConflict {
        /// The fact id.
        id: String,
        /// The reference-style message ("Expected fact 'x' revision R, found S", "Fact 'x'
        /// must not already exist").
        message: String,
    },
    /// Persisted memory cannot be read safely; manual repair is needed.
    #[error("{message}")]
    Corrupt {
        /// What is wrong and where (private detail, never shown over HTTP).
        message: String,
    },
    /// The caller's input is invalid.
    #[error("{message}")]
    InvalidInput {
        /// The field or argument at fault (`agent_name`, `fact.content`, `change_set.upserts`...).
        field: String,
        /// Human-readable message.
        message: String,
    },
    /// A fact that must exist does not.
    #[error("Memory fact '{id}' not found")]
    NotFound {
        /// The fact id.
        id: String,
    },
    /// The per-user lock was not acquired in time.
    #[error("Timed out acquiring memory scope lock {lock}")]
    LockTimeout {
        /// The lock file.
        lock: String,
    },
    /// The adapter does not support the operation.
    #[error("{operation} not supported by {adapter}")]
    Unsupported {
        /// Operation name.
        operation: &'static str,
        /// Adapter name.
        adapter: &'static str,
    },
    /// The storage cannot be reached now (a database that refuses or drops connections);
    /// nothing is known to have been written, and retrying later may succeed.
    #[error("storage unavailable ({context}): {message}")]
    Unavailable {
        /// What was being done.
        context: String,
        /// Why it cannot be reached (never a credential).
        message: String,
    },
    /// An I/O failure while persisting (disk full, EIO, read-only folder...).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    /// A corruption error.
    pub fn corrupt(message: impl Into<String>) -> Self {
        Self::Corrupt {
            message: message.into(),
        }
    }

    /// An invalid-input error naming a field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidInput {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Whether this is a manifest or fact revision conflict.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Self::ManifestConflict { .. } | Self::FactConflict { .. }
        )
    }
}

impl From<IdError> for StorageError {
    fn from(e: IdError) -> Self {
        Self::InvalidInput {
            field: e.field().to_owned(),
            message: e.to_string(),
        }
    }
}

impl From<FactError> for StorageError {
    fn from(e: FactError) -> Self {
        match e {
            FactError::RevisionConflict { ref id, .. } => Self::FactConflict {
                id: id.clone(),
                message: e.to_string(),
            },
            other => Self::InvalidInput {
                field: format!("fact.{}", other.field()),
                message: other.to_string(),
            },
        }
    }
}

/// Errors of the [`crate::ports::Retrieval`] port.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RetrievalError {
    /// The input cannot be indexed or searched (bad scope value, blank content...).
    #[error("{0}")]
    InvalidInput(String),
    /// The index is corrupt or unreadable; callers fall back to the substring scan.
    #[error("retrieval index unavailable: {0}")]
    Unavailable(String),
    /// The adapter does not support the operation.
    #[error("{operation} not supported by {adapter}")]
    Unsupported {
        /// Operation name.
        operation: &'static str,
        /// Adapter name.
        adapter: &'static str,
    },
    /// Any other adapter failure.
    #[error("retrieval backend error: {0}")]
    Backend(String),
}

/// Errors of the [`crate::ports::Embedder`] port. A failing embedder never fails a write or a
/// search: callers fall back to lexical ranking and embed again later.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum EmbedError {
    /// The request timed out.
    #[error("embedding request timed out after {0:?}")]
    Timeout(Duration),
    /// The server rate-limited us (HTTP 429).
    #[error("embedding server rate limited (retry after {retry_after:?})")]
    RateLimited {
        /// Server's hint, when given.
        retry_after: Option<Duration>,
    },
    /// A server-side failure (5xx).
    #[error("embedding server error {status}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// Body excerpt.
        message: String,
    },
    /// The connection failed.
    #[error("embedding transport error: {0}")]
    Transport(String),
    /// Authentication was refused (401/403).
    #[error("embedding server refused the credentials ({status})")]
    Auth {
        /// HTTP status.
        status: u16,
    },
    /// The request was rejected (4xx other than 401/403/429).
    #[error("embedding server rejected the request {status}: {message}")]
    InvalidRequest {
        /// HTTP status.
        status: u16,
        /// Body excerpt.
        message: String,
    },
    /// The answer could not be used: malformed, a vector missing, of the wrong dimension or
    /// not finite.
    #[error("embedding model returned an invalid response: {0}")]
    InvalidResponse(String),
    /// The model cannot run (files missing or unreadable, a load failure).
    #[error("embedding model unavailable: {0}")]
    Unavailable(String),
}

impl EmbedError {
    /// Whether trying the same request again may succeed (429, 5xx, transport, timeout).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Timeout(_) | Self::RateLimited { .. } | Self::Server { .. } | Self::Transport(_)
        )
    }
}

/// Errors of the [`crate::ports::LanguageModel`] port.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The request timed out.
    #[error("language model request timed out after {0:?}")]
    Timeout(Duration),
    /// The server rate-limited us (HTTP 429).
    #[error("language model rate limited (retry after {retry_after:?})")]
    RateLimited {
        /// Server's hint, when given.
        retry_after: Option<Duration>,
    },
    /// A server-side failure (5xx).
    #[error("language model server error {status}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// Body excerpt.
        message: String,
    },
    /// The connection failed.
    #[error("language model transport error: {0}")]
    Transport(String),
    /// Authentication was refused (401/403).
    #[error("language model refused the credentials ({status})")]
    Auth {
        /// HTTP status.
        status: u16,
    },
    /// The request was rejected (4xx other than 401/403/429).
    #[error("language model rejected the request {status}: {message}")]
    InvalidRequest {
        /// HTTP status.
        status: u16,
        /// Body excerpt.
        message: String,
    },
    /// The response could not be understood.
    #[error("language model returned an invalid response: {0}")]
    InvalidResponse(String),
    /// No model is configured.
    #[error("no language model configured")]
    NotConfigured,
}

impl LlmError {
    /// Whether retrying the same request can help (429, 5xx, transport errors and timeouts).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Timeout(_) | Self::RateLimited { .. } | Self::Server { .. } | Self::Transport(_)
        )
    }
}

/// The stable reason code of an invalid-input manager error; the gateway maps these to HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InvalidInputCode {
    /// Confidence outside `[0, 1]` or not finite (`ValueError("confidence")`).
    Confidence,
    /// Empty content (`ValueError("content")`).
    Content,
    /// Agent name required or invalid (`ValueError("agent_name")`).
    AgentName,
    /// Same content already stored (`ValueError("Duplicate fact")`).
    DuplicateFact,
    /// The import document is malformed (`memory_data...`).
    MemoryData,
    /// A user id is invalid.
    UserId,
    /// A fact id is invalid.
    FactId,
    /// Anything else.
    Other,
}

/// Which limit refused work in [`ManagerError::Overloaded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OverloadScope {
    /// The caller's user holds as much pending work as one user may (HTTP 429).
    User,
    /// The process holds as much pending work as it allows for everyone (HTTP 503).
    Global,
}

/// The lower-level error a [`ManagerError`] was made from, kept so that `Error::source` chains
/// reach the storage, HTTP or I/O failure underneath (shared, so the error stays cheap to pass on).
pub type ErrorSource = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the [`crate::ports::MemoryManager`] port: the backend-neutral contract.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The backend does not implement the operation (HTTP 501).
    #[error("{operation} not supported by {backend}")]
    Unsupported {
        /// Operation label (`get memory`, `create fact`...).
        operation: &'static str,
        /// Backend name.
        backend: String,
    },
    /// A write lost an optimistic-concurrency race (HTTP 409).
    #[error("memory changed concurrently: {message}")]
    Conflict {
        /// Private detail.
        message: String,
        /// The lower-level error this one was made from, if any (`Error::source`).
        #[source]
        source: Option<ErrorSource>,
    },
    /// Persisted memory cannot be read safely (HTTP 500 with a fixed body).
    #[error("stored memory is corrupted: {message}")]
    Corruption {
        /// Private detail, never shown to HTTP clients.
        message: String,
        /// The lower-level error this one was made from, if any (`Error::source`).
        #[source]
        source: Option<ErrorSource>,
    },
    /// The fact does not exist (HTTP 404).
    #[error("Memory fact '{fact_id}' not found")]
    NotFound {
        /// The fact id.
        fact_id: String,
    },
    /// The input is invalid (HTTP 400, or 409 for duplicates).
    #[error("{message}")]
    InvalidInput {
        /// Stable reason code.
        code: InvalidInputCode,
        /// Human-readable message.
        message: String,
    },
    /// A persistence write failed (the reference's `OSError`).
    #[error("memory persistence failed: {message}")]
    Storage {
        /// Detail.
        message: String,
        /// The lower-level error this one was made from, if any (`Error::source`).
        #[source]
        source: Option<ErrorSource>,
    },
    /// A remote backend or model is unavailable; retrying later may help.
    #[error("memory backend unavailable: {message}")]
    Unavailable {
        /// Detail.
        message: String,
        /// The lower-level error this one was made from, if any (`Error::source`).
        #[source]
        source: Option<ErrorSource>,
    },
    /// Too much work is pending (queued conversation bytes) for the user or for everyone;
    /// nothing was accepted, and retrying after `retry_after` may succeed (HTTP 429 for
    /// [`OverloadScope::User`], 503 for [`OverloadScope::Global`], with `Retry-After`).
    #[error("memory backend is busy: {message}")]
    Overloaded {
        /// Which limit was reached.
        scope: OverloadScope,
        /// What was refused and which limit (no private data).
        message: String,
        /// When pending work is expected to have drained.
        retry_after: Duration,
    },
    /// The operation did not finish in time.
    #[error("memory operation timed out: {message}")]
    Timeout {
        /// Detail.
        message: String,
        /// The lower-level error this one was made from, if any (`Error::source`).
        #[source]
        source: Option<ErrorSource>,
    },
    /// Any other backend failure.
    #[error("memory backend error: {message}")]
    Backend {
        /// Detail.
        message: String,
        /// The lower-level error this one was made from, if any (`Error::source`).
        #[source]
        source: Option<ErrorSource>,
    },
}

/// One constructor per `ManagerError` variant that carries a message and an optional source:
/// the message, and no source.
macro_rules! sourceless_constructors {
    ($($(#[$doc:meta])* $name:ident => $variant:ident,)*) => {$(
        $(#[$doc])*
        pub fn $name(message: impl Into<String>) -> Self {
            Self::$variant {
                message: message.into(),
                source: None,
            }
        }
    )*};
}

impl ManagerError {
    /// An unsupported-operation error.
    pub fn unsupported(operation: &'static str, backend: impl Into<String>) -> Self {
        Self::Unsupported {
            operation,
            backend: backend.into(),
        }
    }

    /// An invalid-input error.
    pub fn invalid(code: InvalidInputCode, message: impl Into<String>) -> Self {
        Self::InvalidInput {
            code,
            message: message.into(),
        }
    }

    sourceless_constructors! {
        /// A lost optimistic-concurrency race, without a lower-level cause.
        conflict => Conflict,
        /// Stored memory that cannot be read safely, without a lower-level cause.
        corruption => Corruption,
        /// A failed persistence write, without a lower-level cause.
        storage => Storage,
        /// An unavailable backend or model, without a lower-level cause.
        unavailable => Unavailable,
        /// An operation that did not finish in time, without a lower-level cause.
        timeout => Timeout,
        /// Any other backend failure, without a lower-level cause.
        backend => Backend,
    }

    /// This error with `cause` as its `Error::source` (variants without a source field are
    /// returned unchanged: their meaning is complete without one).
    #[must_use]
    pub fn caused_by(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        if let Self::Conflict { source, .. }
        | Self::Corruption { source, .. }
        | Self::Storage { source, .. }
        | Self::Unavailable { source, .. }
        | Self::Timeout { source, .. }
        | Self::Backend { source, .. } = &mut self
        {
            *source = Some(std::sync::Arc::new(cause));
        }
        self
    }
}

impl From<IdError> for ManagerError {
    fn from(e: IdError) -> Self {
        let code = match e.field() {
            "user_id" => InvalidInputCode::UserId,
            "agent_name" => InvalidInputCode::AgentName,
            _ => InvalidInputCode::FactId,
        };
        Self::InvalidInput {
            code,
            message: e.to_string(),
        }
    }
}

impl From<StorageError> for ManagerError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::ManifestConflict { .. } | StorageError::FactConflict { .. } => {
                Self::conflict(e.to_string()).caused_by(e)
            }
            StorageError::Corrupt { message } => Self::corruption(message),
            StorageError::NotFound { id } => Self::NotFound { fact_id: id },
            StorageError::InvalidInput { field, message } => {
                let code = match field.as_str() {
                    "fact.confidence" | "confidence" => InvalidInputCode::Confidence,
                    "fact.content" | "content" => InvalidInputCode::Content,
                    "agent_name" => InvalidInputCode::AgentName,
                    "user_id" => InvalidInputCode::UserId,
                    "fact_id" | "fact.id" => InvalidInputCode::FactId,
                    _ => InvalidInputCode::Other,
                };
                Self::InvalidInput { code, message }
            }
            StorageError::LockTimeout { .. } => Self::timeout(e.to_string()).caused_by(e),
            StorageError::Unsupported { operation, adapter } => Self::Unsupported {
                operation,
                backend: adapter.to_owned(),
            },
            StorageError::Unavailable { .. } => Self::unavailable(e.to_string()).caused_by(e),
            StorageError::Io { .. } => Self::storage(e.to_string()).caused_by(e),
        }
    }
}

/// A configuration value that failed validation, naming the key.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    /// Dotted key path, e.g. `memory.backend_config.max_facts`.
    pub key: String,
    /// What is wrong, including the valid range.
    pub message: String,
}

impl ConfigError {
    /// A new error for `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_errors_map_to_manager_contract() {
        let c: ManagerError = StorageError::ManifestConflict {
            expected: 1,
            found: 2,
        }
        .into();
        assert!(matches!(c, ManagerError::Conflict { .. }));
        let c: ManagerError = StorageError::corrupt("bad").into();
        assert!(matches!(c, ManagerError::Corruption { .. }));
        let c: ManagerError = StorageError::Unavailable {
            context: "read the user".into(),
            message: "connection refused".into(),
        }
        .into();
        assert!(matches!(c, ManagerError::Unavailable { .. }), "{c:?}");
        let c: ManagerError = StorageError::from(FactError::Confidence).into();
        assert!(matches!(
            c,
            ManagerError::InvalidInput {
                code: InvalidInputCode::Confidence,
                ..
            }
        ));
        let e: StorageError = FactError::RevisionConflict {
            id: "a".into(),
            expected: 1,
            found: None,
        }
        .into();
        assert_eq!(e.to_string(), "Expected fact 'a' revision 1, found None");
        assert!(e.is_conflict());
    }

    #[test]
    fn manager_errors_keep_the_storage_error_underneath() {
        use std::error::Error as _;
        let io = StorageError::Io {
            context: "write fact".into(),
            source: std::io::Error::other("disk full"),
        };
        let shown = io.to_string();
        let m: ManagerError = io.into();
        assert!(matches!(m, ManagerError::Storage { .. }));
        assert_eq!(m.to_string(), format!("memory persistence failed: {shown}"));
        let cause = m.source().expect("the storage error is kept");
        assert_eq!(cause.to_string(), shown);
        let root = cause.source().expect("and the OS error under it");
        assert_eq!(root.to_string(), "disk full");

        let conflict: ManagerError = StorageError::ManifestConflict {
            expected: 1,
            found: 2,
        }
        .into();
        assert!(conflict.source().is_some());
        // Built without a cause: no source; `caused_by` adds one, and leaves variants without a
        // source field as they are.
        assert!(ManagerError::backend("x").source().is_none());
        let with = ManagerError::backend("x").caused_by(std::io::Error::other("y"));
        assert_eq!(with.source().map(|s| s.to_string()).as_deref(), Some("y"));
        let nf = ManagerError::NotFound {
            fact_id: "f".into(),
        }
        .caused_by(std::io::Error::other("y"));
        assert!(nf.source().is_none());
    }

    #[test]
    fn retryable_llm_errors() {
        assert!(LlmError::RateLimited { retry_after: None }.is_retryable());
        assert!(
            LlmError::Server {
                status: 503,
                message: String::new()
            }
            .is_retryable()
        );
        assert!(!LlmError::Auth { status: 401 }.is_retryable());
        assert!(
            !LlmError::InvalidRequest {
                status: 400,
                message: String::new()
            }
            .is_retryable()
        );
    }
}
