//! DeerMem storage on PostgreSQL, so that any number of `deermem serve` processes on any number
//! of hosts serve one memory. This crate is being built in steps; what exists today:
//!
//! - [`PostgresConfig`]: the `backend_config.postgres` keys, validated, the URL never shown;
//! - [`PgStore`]: the connection pool (deadpool over tokio-postgres) whose connections work in
//!   the configured schema under the statement timeout, and the versioned schema migrations
//!   (refinery, files under `migrations/`), applied under an advisory lock, with a refusal to
//!   run against a schema newer than this build.
//!
//! The storage ports (`FactRepository`, `FactMetadata`, `ScopedSearch`), the retrieval port and
//! the run journal on these tables come next; until then the facade does not offer
//! `storage_class: postgres`.

mod config;
mod error;
mod store;

pub use config::{MAX_POOL_SIZE, PostgresConfig, TlsConfig, TlsMode};
pub use error::PgError;
pub use store::{MigrationOutcome, PgStore, known_schema_version};

/// The adapter kind.
pub const KIND: &str = "postgres";
