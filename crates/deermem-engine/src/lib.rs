//! DeerMem's application service: [`DeerMemManager`], the backend-neutral `MemoryManager`
//! contract over any `MemoryStorage`, and the debounced per-conversation [`UpdateQueue`] that
//! feeds the update pipeline of `deermem-updater`.
//!
//! - `add` / `add_nowait`: [`UpdatePipeline::submit`] and [`UpdatePipeline::submit_emergency`]
//!   (admission by `deermem_updater::admit`, then the queue);
//! - the queue's worker: `deermem_updater::MemoryUpdater`;
//! - `get_context`: [`UpdatePipeline::context`] (the injection formatter off the async workers);
//! - `shutdown_flush`: [`UpdateQueue::shutdown_flush`];
//! - the turn journal (`queue.durable`): an accepted turn is appended to a
//!   `deermem_core::ports::TurnJournal` before `add` returns, marked done after its commit,
//!   retried with backoff and dead-lettered after `queue.retry` ([`turns`]), and replayed at
//!   start ([`DeerMemManager::recover_turns`]).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod fault;
pub mod hybrid;
mod manager;
mod pipeline;
mod queue;
mod rendered;
pub mod turns;

pub use manager::{
    AddedFact, CLAIM_INTERVAL, DeerMemManager, DeerMemParts, ImportTrim, IngestReport,
    IngestStatus, RemovalReason, RemovedFact, TURN_LEASE,
};
pub use pipeline::{Submission, SubmitOutcome, UpdatePipeline};
pub use queue::{QueueConfig, QueueError, UpdateQueue, request_bytes};
pub use rendered::{
    ENTRIES_NAME as RENDERED_ENTRIES_NAME, MAX_ENTRIES as RENDERED_MAX_ENTRIES,
    MAX_TEXT_BYTES as RENDERED_MAX_TEXT_BYTES, RenderedCacheUsage, TEXT_NAME as RENDERED_TEXT_NAME,
};
