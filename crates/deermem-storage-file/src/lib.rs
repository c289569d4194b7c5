//! DeerMem file storage: Markdown facts and JSON summaries, byte-compatible with the Python
//! reference. [`FileStorage`] implements the [`deermem_core::ports::MemoryStorage`] port over
//! the reference's on-disk layout, with its journaled commit protocol, its `flock(2)` locking, lazy
//! v1 → v2 migration, the usage and audit sidecars, and the retrieval-index notifications.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

mod commit;
mod error;
pub mod fault;
mod fsutil;
mod group;
pub mod isolation;
mod journal;
mod lock;
mod manifest;
mod markdown;
mod migrate;
mod par;
pub mod paths;
pub mod probe;
pub mod run_journal;
mod sidecar;
mod storage;
pub mod turn_journal;
mod walk;

pub use paths::resolve_root;
pub use run_journal::{RUN_JOURNAL_CACHE_NAME, RunJournal, RunJournalOptions};
pub use storage::{
    CacheUsage, DEFAULT_CACHE_MAX_SCOPES, DEFAULT_REBUILD_BATCH_FACTS, FileStorage,
    FileStorageConfig, INCOMPLETE_MARKER, IndexVerification, SCOPE_CACHE_NAME, StaleScope,
};
pub use turn_journal::{DeferredFileTurnJournal, FileTurnJournal, FileTurnJournalOptions};

/// Renders a fact as the exact bytes of its Markdown file (what the storage writes).
///
/// # Errors
/// `InvalidInput` when a value cannot be written as YAML that the reference reads back.
pub fn render_fact_markdown(
    fact: &deermem_core::Fact,
) -> Result<String, deermem_core::StorageError> {
    markdown::render(fact).map_err(Into::into)
}

/// The adapter kind.
pub const KIND: &str = "file";

/// A fresh storage-style fact id: `fact_` followed by 32 random hex digits.
pub(crate) fn fresh_fact_id() -> deermem_core::FactId {
    deermem_core::FactId::long_from_bits(uuid::Uuid::new_v4().as_u128())
}
