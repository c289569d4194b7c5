//! DeerMem memory-update pipeline: message filtering and signal detection, the extraction
//! prompt and the model-response parser, the fail-closed gates that turn a proposal into a
//! change set, staleness and consolidation lifecycle, and the injection formatter with its token
//! budgets. The application service on top of it (the manager and the debounced queue) is the
//! `deermem-engine` crate.
//!
//! What the engine calls:
//! - admission of a raw turn: [`admit`] with a [`HiddenMessagePolicy`];
//! - one update: [`MemoryUpdater`] (watermark → signals → [`Proposer`] → gates in
//!   [`apply_update`] → [`change_set`] → commit with conflict retry), driven by the queue through
//!   [`UpdateProcessor`];
//! - the `<memory>` block: [`format_memory_for_injection`] with [`InjectionOptions`] and the
//!   [`TokenCounter`].
//!
//! Its settings, the DeerMem `backend_config` keys, are [`DeerMemConfig`].
//!
//! The model is behind the [`Proposer`] seam: [`LlmProposer`] (prompt → `LanguageModel` →
//! parse) or, with no model configured, [`OfflineProposer`]. Modules are private: this list of
//! re-exports is the whole public surface.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod apply;
mod config;
mod consolidation;
mod diff;
mod facts;
mod filter;
mod inject;
mod observe;
mod offline;
mod parse;
mod prompt;
mod proposer;
mod signals;
mod staleness;
mod text;
mod tokens;
mod updater;
mod uploads;
mod watermark;

#[cfg(test)]
mod testutil;

pub use apply::{
    ApplyContext, ApplyOutcome, ApplyReport, CapacityDecision, ProposalKind, RejectReason,
    Rejection, UpdateMetrics, apply_update, capacity_decision,
};
pub use config::{
    DEFAULT_CACHE_MAX_SCOPES, DEFAULT_CLAIM_INTERVAL_SECONDS, DEFAULT_QUEUE_MAX_PENDING_BYTES,
    DEFAULT_QUEUE_MAX_PENDING_BYTES_PER_USER, DEFAULT_TURN_LEASE_SECONDS, DeerMemConfig,
    QueueSettings, RetrySettings, SearchSettings, TokenCounting,
};
pub use diff::change_set;
pub use facts::{FactIdSource, display_category};
pub use filter::{HiddenMessagePolicy, admit, is_human_input_response};
pub use inject::{InjectionOptions, format_memory_for_injection};
pub use observe::{ExtractionReport, LlmCallInfo, LlmResultInfo, UpdateObserver};
pub use parse::{MAX_RESPONSE_BYTES, ParseError, ProposedUpdate, parse_update_response};
pub use prompt::{
    CHAT_TEMPLATE_FILE, CONSOLIDATION_TEMPLATE_FILE, PromptError, PromptInput, PromptTemplates,
    STALENESS_TEMPLATE_FILE, TEMPLATE_CACHE_NAME, TemplateStore, build_update_prompt,
};
pub use proposer::{
    LlmProposer, OfflineProposer, Proposal, ProposalOrigin, ProposeError, Proposer,
};
pub use signals::{PATTERN_FILES, PatternError, PatternSet, Signal, SignalSet};
pub use text::content_key;
#[cfg(feature = "test-probe")]
pub use tokens::probe;
pub use tokens::{
    MEMO_BYTES_NAME, MEMO_ENTRIES_NAME, TokenCounter, char_estimate, memo_bounds, memo_only,
};
pub use updater::{
    BuildError, MemoryUpdater, UpdateOutcome, UpdateProcessor, UpdateRequest, UpdateStatus,
    UpdaterError,
};
pub use watermark::{ConversationKey, WATERMARK_CACHE_NAME};
