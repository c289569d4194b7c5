//! DeerMem core: the domain types, the ports adapters implement, and the pure policies of the
//! memory engine. This crate performs no I/O and reads neither the clock nor the environment.
//!
//! - [`ids`]: user ids and buckets, agent names, fact ids, scopes.
//! - [`fact`]: the fact type, its validation and normalisation, the public fact shape.
//! - [`document`]: summaries, memory documents, change sets.
//! - [`ports`]: `MemoryStorage`, `Retrieval`, `LanguageModel`, `Clock`, `MemoryManager`.
//! - [`config`]: the host's `memory:` section, the model and embedding settings, the lax loader.
//! - [`policy`]: capacity eviction and other pure decisions.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

pub mod caches;
pub mod config;
pub mod document;
pub mod error;
pub mod fact;
pub mod ids;
pub mod import;
pub mod message;
pub mod policy;
pub mod ports;
/// The storage traits in scope without their names: `use deermem_core::prelude::*;` lets code
/// call every storage operation on a concrete adapter or a `dyn MemoryStorage`.
pub mod prelude {
    pub use crate::ports::{
        FactMetadata as _, FactRepository as _, MemoryManager as _, MemoryManagerExt as _,
        MemoryStorageExt as _, ScopedSearch as _,
    };
}
pub mod search;
pub mod snapshot;
pub mod time;

pub use caches::{CacheBound, CacheUnit};
pub use config::{MemoryConfig, MemoryMode, ModelConfig};
pub use document::{
    ApplyOptions, ChangeResult, ChangeSet, Facts, MemoryDocument, PublicMemoryDocument,
    SummariesSnapshot, SummaryEntry, SummaryPatch, SummarySection,
};
pub use error::{
    ConfigError, EmbedError, ErrorSource, FactError, IdError, InvalidInputCode, LlmError,
    ManagerError, OverloadScope, RetrievalError, StorageError,
};
pub use fact::{Fact, FactDraft, FactScope, FactSource, PublicFact};
pub use ids::{AgentName, DEFAULT_AGENT_BUCKET, DEFAULT_USER_ID, FactId, Scope, UserId};
pub use import::MAX_IMPORT_FACTS;
pub use message::{Message, MessageKind};
pub use search::{
    IndexedDoc, MatchType, RebuildReport, RetrievalStats, RetrievalStatus, SearchHit, SearchMode,
    SearchQuery, UnknownSearchMode, VectorCoverage,
};
pub use time::Timestamp;
