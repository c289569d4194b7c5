//! DeerMem storage on PostgreSQL, so that any number of `deermem serve` processes on any number
//! of hosts serve one memory. This crate is being built in steps; what exists today:
//!
//! - [`PostgresConfig`]: the `backend_config.postgres` keys, validated, the URL never shown;
//! - [`PgDatabase`]: the connection pool (deadpool over tokio-postgres) whose connections work in
//!   the configured schema under the statement timeout, and the versioned schema migrations
//!   (refinery, files under `migrations/`), applied under an advisory lock, with a refusal to
//!   run against a schema newer than this build; TLS (`tls.mode` require / verify-full) on
//!   rustls with the ring provider;
//! - [`PgRunJournal`]: the run journal port (`RunEventStore`) on the `run_events` table, so
//!   "one memory block per run" holds across replicas;
//! - [`PgStorage`]: the storage ports (`FactRepository`, `FactMetadata`, `ScopedSearch`), one
//!   transaction per commit with the user's row locked, decided by the core's shared commit
//!   policy; each fact's search columns are written in the same transaction, and search runs
//!   in the database (`tsvector` with the `simple` configuration, a GIN index, CJK bigrams,
//!   FTS5's BM25; see `search`); each storage keeps the decoded facts of the scopes it read,
//!   labelled with the user's row (its revision and `xmin`) they were read under, and serves
//!   them under a read lease without a statement ([`Coherence::Lease`]: every write revokes
//!   the other replicas' leases and waits for them before it returns) or after reading the
//!   row on every load ([`Coherence::RevisionCheck`]), so a replica never serves a scope
//!   older than a write another replica acknowledged;
//! - [`PgRetrieval`]: the retrieval port on its own `search_docs` table, searched the same way,
//!   and a `VectorIndex` with its vectors in `doc_vectors`;
//! - [`PgFactIndex`]: the storage's facts as a retrieval index with vectors (`fact_vectors`),
//!   for search by meaning, and [`PgIndexedStorage`], the storage with its search answered by
//!   a retrieval over it (the engine's hybrid retrieval over a [`PgFactIndex`]);
//! - [`PgTurnJournal`]: the turn journal port (`TurnJournal`) on the `turn_journal` table, with
//!   leases in the rows, so an accepted turn outlives the replica that acknowledged it;
//! - [`PgCursors`]: the remote backends' cursor store (`deermem_core::ports::CursorStorage`) on the
//!   `remote_cursors` table, so Honcho and OpenViking cursors are shared by the replicas;
//! - administrative reads that are not ports: the users the database holds, a user's agents.
//!
//! The facade selects it with `storage_class: postgres`; `deermem db migrate` applies the
//! schema and `deermem migrate --from/--to` moves memory between files and the database.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod admin;
mod config;
mod cursors;
mod error;
mod indexed;
mod lease;
mod repository;
mod retrieval;
mod run_journal;
mod search;
mod snapshot;
mod store;
mod stored;
mod tls;
mod turn_journal;
mod vectors;

pub use config::{
    Coherence, MAX_LEASE_SECONDS, MAX_POOL_SIZE, MIN_LEASE_SECONDS, PostgresConfig, TlsConfig,
    TlsMode,
};
pub use cursors::PgCursors;
pub use error::PgError;
pub use indexed::PgIndexedStorage;
pub use lease::LeaseStats;
pub use repository::PgStorage;
pub use retrieval::PgRetrieval;
pub use run_journal::PgRunJournal;
pub use store::{MigrationOutcome, PgDatabase, known_schema_version};
pub use turn_journal::{PgTurnJournal, PgTurnJournalOptions};
pub use vectors::PgFactIndex;

/// The adapter kind.
pub const KIND: &str = "postgres";
