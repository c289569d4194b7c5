//! Errors of the PostgreSQL adapter: configuration, connection, schema version, and what a
//! statement reported. The connection URL never appears in any of them. A server that cannot
//! be reached becomes the storage port's `StorageError::Unavailable` (see [`storage_error`]).

use deermem_core::StorageError;

/// What went wrong talking to PostgreSQL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// A `backend_config.postgres` key is missing, mistyped or out of range.
    #[error("memory.backend_config.{key}: {message}")]
    Config {
        /// The key, e.g. `postgres.pool_size`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The URL does not parse (the URL itself is not repeated: it may hold a password).
    #[error(
        "memory.backend_config.postgres.url is not a valid PostgreSQL connection string: {reason}"
    )]
    Url {
        /// The driver's reason, which does not quote the URL.
        reason: String,
    },
    /// TLS could not be set up or the handshake failed: the server's certificate was refused
    /// (unknown issuer, a name it does not hold, expired) or the server does not offer TLS.
    #[error("TLS to PostgreSQL failed: {message}")]
    Tls {
        /// What failed, with the handshake's reason.
        message: String,
    },
    /// No connection could be opened or taken from the pool in time.
    #[error("cannot connect to PostgreSQL: {message}")]
    Connect {
        /// What the driver or pool said.
        message: String,
        /// The driver's error, when there is one.
        #[source]
        source: Option<tokio_postgres::Error>,
    },
    /// The database holds a schema this build does not know (written by a newer DeerMem).
    #[error(
        "the PostgreSQL schema {schema:?} is at version {found}, newer than this build's {known}; upgrade DeerMem instead of starting against it"
    )]
    SchemaTooNew {
        /// The configured schema.
        schema: String,
        /// The newest version applied in the database.
        found: i64,
        /// The newest version this build carries.
        known: i64,
    },
    /// Applying the schema migrations failed.
    #[error("PostgreSQL schema migration failed: {message}")]
    Migration {
        /// The runner's report.
        message: String,
    },
    /// A user bucket cannot be moved: a stored value does not read back, or a value does not
    /// fit the database.
    #[error("user bucket {bucket:?}: {message}")]
    Snapshot {
        /// The bucket.
        bucket: String,
        /// What is wrong.
        message: String,
    },
    /// A statement failed.
    #[error("PostgreSQL statement failed ({context}): {}", db_message(source))]
    Statement {
        /// What was being done.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl From<deermem_core::ConfigError> for PgError {
    fn from(e: deermem_core::ConfigError) -> Self {
        Self::Config {
            key: e.key,
            message: e.message,
        }
    }
}

impl PgError {
    /// Whether this error means the server cannot be reached now (no connection could be
    /// made or kept, the server is shutting down or starting): retrying later may succeed.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Tls { .. } => true,
            Self::Statement { source, .. } => is_unavailable(source),
            _ => false,
        }
    }
}

/// Whether a driver error means the server cannot be reached now: the connection is closed or
/// broke (an I/O error underneath), or the server says it is shutting down, starting, out of
/// connections or that the connection failed (SQLSTATE class 08, 57P01–57P03, 53300).
pub(crate) fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300");
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    // Without a server message or a cause, the driver's own connection failures.
    let text = e.to_string();
    text.starts_with("error connecting to server") || text.starts_with("connection closed")
}

/// A driver error as the storage port's error: [`StorageError::Unavailable`] when the server
/// cannot be reached, else an I/O error naming what was being done and the server's reason.
pub(crate) fn storage_error(context: &'static str, e: tokio_postgres::Error) -> StorageError {
    if is_unavailable(&e) {
        StorageError::Unavailable {
            context: format!("PostgreSQL: {context}"),
            message: db_message(&e),
        }
    } else {
        StorageError::Io {
            context: format!("PostgreSQL: {context}"),
            source: std::io::Error::other(e),
        }
    }
}

impl From<PgError> for StorageError {
    fn from(e: PgError) -> Self {
        if e.is_unavailable() {
            StorageError::Unavailable {
                context: "PostgreSQL: take a connection".into(),
                message: e.to_string(),
            }
        } else {
            StorageError::Io {
                context: "PostgreSQL".into(),
                source: std::io::Error::other(e),
            }
        }
    }
}

/// The server's message for a database error (the driver's `Display` says only "db error"),
/// else the driver's text.
pub(crate) fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => e.to_string(),
    }
}
