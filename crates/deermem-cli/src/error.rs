//! CLI errors and their exit codes (documented in `deermem --help`).

use std::fmt;
use std::process::ExitCode;

use deermem_core::{ManagerError, StorageError};

/// What kind of failure, deciding the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// I/O or unexpected failure (1).
    Failure,
    /// A stale revision or concurrent change (3).
    Conflict,
    /// No such fact (4).
    NotFound,
    /// Invalid input (5).
    Invalid,
    /// The backend does not support the operation (6).
    Unsupported,
    /// Stored data is corrupted (7).
    Corrupt,
    /// The backend is unavailable or timed out (8).
    Unavailable,
    /// The database schema is newer than this build (9); nothing was changed.
    SchemaTooNew,
}

impl Kind {
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Failure => 1,
            Self::Conflict => 3,
            Self::NotFound => 4,
            Self::Invalid => 5,
            Self::Unsupported => 6,
            Self::Corrupt => 7,
            Self::Unavailable => 8,
            Self::SchemaTooNew => 9,
        }
    }
}

/// A failure to report on stderr.
#[derive(Debug)]
pub(crate) struct CliError {
    pub(crate) kind: Kind,
    pub(crate) message: String,
}

impl CliError {
    pub(crate) fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(Kind::Invalid, message)
    }

    pub(crate) fn failure(message: impl Into<String>) -> Self {
        Self::new(Kind::Failure, message)
    }

    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.kind.code())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = match self.kind {
            Kind::Failure => "error",
            Kind::Conflict => "conflict",
            Kind::NotFound => "not found",
            Kind::Invalid => "invalid input",
            Kind::Unsupported => "not supported",
            Kind::Corrupt => "corrupted memory",
            Kind::Unavailable => "unavailable",
            Kind::SchemaTooNew => "schema too new",
        };
        write!(f, "{label}: {}", self.message)
    }
}

impl From<ManagerError> for CliError {
    fn from(e: ManagerError) -> Self {
        let kind = match &e {
            ManagerError::Conflict { .. } => Kind::Conflict,
            ManagerError::NotFound { .. } => Kind::NotFound,
            ManagerError::InvalidInput { .. } => Kind::Invalid,
            ManagerError::Unsupported { .. } => Kind::Unsupported,
            ManagerError::Corruption { .. } => Kind::Corrupt,
            ManagerError::Unavailable { .. }
            | ManagerError::Timeout { .. }
            | ManagerError::Overloaded { .. } => Kind::Unavailable,
            _ => Kind::Failure,
        };
        let message = match e {
            ManagerError::Unsupported { operation, backend } => {
                format!("{operation} is not supported by the memory backend {backend}")
            }
            ManagerError::Conflict { message, .. } => {
                format!("memory changed concurrently; reload and retry ({message})")
            }
            other => other.to_string(),
        };
        Self::new(kind, message)
    }
}

impl From<StorageError> for CliError {
    fn from(e: StorageError) -> Self {
        ManagerError::from(e).into()
    }
}

impl From<deermem::embedded::EmbeddedError> for CliError {
    fn from(e: deermem::embedded::EmbeddedError) -> Self {
        use deermem::embedded::EmbeddedError as E;
        use deermem_storage_postgres::PgError;
        match e {
            E::Config(c) => Self::invalid(c.to_string()),
            E::Storage(s) => s.into(),
            e @ E::NotAvailable { .. } => Self::new(Kind::Unsupported, e.to_string()),
            e @ E::NotCompiled { .. } => Self::new(Kind::Unsupported, e.to_string()),
            E::Postgres(p) => {
                let kind = match &p {
                    PgError::SchemaTooNew { .. } => Kind::SchemaTooNew,
                    PgError::Config { .. } | PgError::Url { .. } => Kind::Invalid,
                    PgError::Connect { .. } | PgError::Tls { .. } => Kind::Unavailable,
                    _ => Kind::Failure,
                };
                Self::new(kind, p.to_string())
            }
            other => Self::failure(other.to_string()),
        }
    }
}

impl From<deermem_core::IdError> for CliError {
    fn from(e: deermem_core::IdError) -> Self {
        Self::invalid(format!("{}: {e}", e.field()))
    }
}
