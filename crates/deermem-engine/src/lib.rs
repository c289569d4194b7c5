//! DeerMem's application service: [`DeerMemManager`], the backend-neutral `MemoryManager`
//! contract over any `MemoryStorage`, and the debounced per-conversation [`UpdateQueue`] that
//! feeds the update pipeline of `deermem-updater`.
//!
//! - `add` / `add_nowait`: [`UpdatePipeline::submit`] and [`UpdatePipeline::submit_emergency`]
//!   (admission by `deermem_updater::admit`, then the queue);
//! - the queue's worker: `deermem_updater::MemoryUpdater`;
//! - `get_context`: [`UpdatePipeline::context`] (the injection formatter off the async workers);
//! - `shutdown_flush`: [`UpdateQueue::shutdown_flush`].

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod hybrid;
mod manager;
mod pipeline;
mod queue;
mod rendered;

pub use manager::{
    AddedFact, DeerMemManager, DeerMemParts, IngestReport, IngestStatus, RemovalReason, RemovedFact,
};
pub use pipeline::{Submission, SubmitOutcome, UpdatePipeline};
pub use queue::{QueueConfig, QueueError, UpdateQueue, request_bytes};
pub use rendered::{
    MAX_ENTRIES as RENDERED_MAX_ENTRIES, MAX_TEXT_BYTES as RENDERED_MAX_TEXT_BYTES,
    RenderedCacheUsage,
};
