//! DeerMem memory-update pipeline: message filtering and signal detection, the extraction
//! prompt and the model-response parser, the fail-closed gates that turn a proposal into a
//! change set, staleness and consolidation lifecycle, the debounced per-conversation queue, and
//! the injection formatter with its token budgets.
//!
//! How a `MemoryManager` sits on top:
//! - `add` / `add_nowait`: [`pipeline::UpdatePipeline::submit`] and
//!   [`pipeline::UpdatePipeline::submit_emergency`] (admission by [`filter::admit`], then the
//!   [`queue::UpdateQueue`]);
//! - the queue's worker: [`updater::MemoryUpdater`] (watermark → signals → proposer → gates in
//!   [`apply::apply_update`] → [`diff::change_set`] → commit with conflict retry);
//! - `get_context`: [`inject::format_memory_for_injection`] (or
//!   [`pipeline::UpdatePipeline::context`]);
//! - `shutdown_flush`: [`queue::UpdateQueue::shutdown_flush`].
//!
//! [`manager::DeerMemManager`] is that manager: the `MemoryManager` contract over any storage.
//!
//! The model is behind the [`proposer::Proposer`] seam: [`proposer::LlmProposer`] (prompt →
//! `LanguageModel` → parse) or, with no model configured, [`proposer::OfflineProposer`].

pub mod apply;
pub mod consolidation;
pub mod diff;
pub mod facts;
pub mod filter;
pub mod inject;
pub mod manager;
pub mod observe;
pub mod offline;
pub mod parse;
pub mod pipeline;
pub mod prompt;
pub mod proposer;
pub mod queue;
pub mod signals;
pub mod staleness;
pub mod text;
pub mod tokens;
pub mod updater;
pub mod uploads;
pub mod watermark;

#[cfg(test)]
mod testutil;

pub use apply::{
    ApplyContext, ApplyOutcome, ProposalKind, RejectReason, Rejection, UpdateMetrics, apply_update,
};
pub use filter::{HiddenMessagePolicy, admit};
pub use inject::{InjectionOptions, format_memory_for_injection};
pub use manager::{
    AddedFact, DeerMemManager, DeerMemParts, IngestReport, IngestStatus, RemovalReason, RemovedFact,
};
pub use parse::{ParseError, ProposedUpdate, parse_update_response};
pub use pipeline::{Submission, SubmitOutcome, UpdatePipeline};
pub use prompt::{PromptError, TemplateStore};
pub use proposer::{LlmProposer, OfflineProposer, Proposal, ProposalOrigin, Proposer};
pub use queue::{QueueConfig, QueueError, UpdateQueue};
pub use signals::{PatternSet, Signal, SignalSet};
pub use tokens::TokenCounter;
pub use updater::{MemoryUpdater, UpdateOutcome, UpdateRequest, UpdateStatus, UpdaterError};
