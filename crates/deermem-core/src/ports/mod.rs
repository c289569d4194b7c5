//! The ports: the traits adapters implement. Each trait's doc comment is its contract, and the
//! contract suites in `deermem-testkit` assert exactly those sentences.

mod clock;
pub mod cursors;
mod embedder;
mod llm;
mod manager;
mod retrieval;
pub mod run_journal;
mod storage;
pub mod turn_journal;
mod vector_index;

pub use clock::Clock;
pub use cursors::CursorStorage;
pub use embedder::{Embedder, check_vectors};
pub use llm::{ChatMessage, ChatRequest, ChatResponse, ChatRole, LanguageModel, TokenUsage};
pub use manager::{
    AddRequest, BackendFailure, ContextRequest, FAIL_OPEN_LOG_TARGET, FactAdmin, FactPatch,
    MemoryAdmin, MemoryContext, MemoryManager, MemoryManagerExt, MemoryReader, MemoryReload,
    MemoryScope, MemorySearch, NewFact, ScoredFact, SearchRequest, wrap_memory_block,
};
pub use retrieval::Retrieval;
pub use run_journal::RunEventStore;
pub use storage::{
    FactMetadata, FactRepository, ListQuery, MemoryStorage, MemoryStorageExt, MigrationReport,
    ScopedSearch, StorageCapabilities,
};
pub use turn_journal::{TurnAdmin, TurnJournal};
pub use vector_index::{
    EmbedTask, MeaningHit, MeaningQuery, MeaningRanking, VectorIndex, WordHit, check_put_vectors,
};
