//! The adapter's detailed error type and its conversion into the port's `StorageError`.
//! Corruption messages follow the reference's wording so operators recognise them.

use std::path::{Path, PathBuf};

use deermem_core::{FactError, IdError, StorageError};

/// Everything that can go wrong inside the file storage.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A fact file could not be read or parsed.
    #[error("Failed to parse canonical fact {path}: {reason}")]
    FactParse { path: PathBuf, reason: String },
    /// A fact file's `id` differs from its file stem.
    #[error("Fact id mismatch for {path}")]
    FactIdMismatch { path: PathBuf },
    /// A fact file belongs to another user or agent.
    #[error("Fact scope mismatch for {path}: expected {expected}, found {found}")]
    ScopeMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },
    /// A fact file parsed but fails validation.
    #[error("Invalid canonical fact {path}: {reason}")]
    InvalidFact { path: PathBuf, reason: String },
    /// The manifest is unreadable.
    #[error("Failed to load global memory JSON {path}: {reason}")]
    ManifestParse { path: PathBuf, reason: String },
    /// The manifest is not an object or holds unusable values.
    #[error("Global memory JSON {path} {reason}")]
    ManifestShape { path: PathBuf, reason: String },
    /// The operation journal is unreadable or inconsistent.
    #[error("Invalid memory operation journal {path}: {reason}")]
    Journal { path: PathBuf, reason: String },
    /// Any other corruption (migration conflicts, mismatched backups, escaping paths).
    #[error("{0}")]
    Corrupt(String),
    /// The caller's input is invalid.
    #[error("{message}")]
    Invalid { field: String, message: String },
    /// A filesystem operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The per-user lock was not acquired in time.
    #[error("Timed out acquiring memory scope lock {}", lock.display())]
    LockTimeout { lock: PathBuf },
    /// The shared revision is not the expected one.
    #[error("Expected user-memory revision {expected}, found {found}")]
    ManifestConflict { expected: u64, found: u64 },
    /// A per-fact precondition failed.
    #[error("{message}")]
    FactConflict { id: String, message: String },
}

/// Result alias of the crate.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error with context naming the path.
    pub(crate) fn io(what: &str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            context: format!("{what} {}", path.display()),
            source,
        }
    }

    /// An invalid-input error.
    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

impl From<IdError> for Error {
    fn from(e: IdError) -> Self {
        StorageError::from(e).into()
    }
}

impl From<StorageError> for Error {
    /// The refusals of the shared commit decision (and, like [`FactError`], anything else as
    /// corruption).
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::FactConflict { id, message } => Self::FactConflict { id, message },
            StorageError::InvalidInput { field, message } => Self::Invalid { field, message },
            StorageError::ManifestConflict { expected, found } => {
                Self::ManifestConflict { expected, found }
            }
            other => Self::Corrupt(other.to_string()),
        }
    }
}

impl From<FactError> for Error {
    fn from(e: FactError) -> Self {
        StorageError::from(e).into()
    }
}

impl From<Error> for StorageError {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid { field, message } => StorageError::InvalidInput { field, message },
            Error::Io { context, source } => StorageError::Io { context, source },
            Error::LockTimeout { lock } => StorageError::LockTimeout {
                lock: lock.display().to_string(),
            },
            Error::ManifestConflict { expected, found } => {
                StorageError::ManifestConflict { expected, found }
            }
            Error::FactConflict { id, message } => StorageError::FactConflict { id, message },
            other => StorageError::Corrupt {
                message: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corruption_messages_follow_the_reference() {
        let e: StorageError = Error::ScopeMismatch {
            path: PathBuf::from("/r/a.md"),
            expected: "x".into(),
            found: "y".into(),
        }
        .into();
        assert!(matches!(e, StorageError::Corrupt { .. }));
        assert_eq!(
            e.to_string(),
            "Fact scope mismatch for /r/a.md: expected x, found y"
        );
        let e: StorageError = Error::Journal {
            path: PathBuf::from("/r/.memory.journal.json"),
            reason: "bad".into(),
        }
        .into();
        assert_eq!(
            e.to_string(),
            "Invalid memory operation journal /r/.memory.journal.json: bad"
        );
        let e: StorageError = Error::from(FactError::Confidence).into();
        assert!(
            matches!(e, StorageError::InvalidInput { ref field, .. } if field == "fact.confidence")
        );
        let e: StorageError = Error::LockTimeout {
            lock: PathBuf::from("/r/.memory.lock"),
        }
        .into();
        assert!(matches!(e, StorageError::LockTimeout { .. }));
    }
}
