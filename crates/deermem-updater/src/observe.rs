//! Observability hooks of the pipeline: the model call before and after (for tracing systems
//! such as Langfuse), and the extraction report with its gate metrics. Every method has a no-op
//! default; the updater logs the reference's rejection-rate warnings itself.

use std::fmt::Debug;
use std::time::Duration;

use deermem_core::ports::TokenUsage;
use serde::Serialize;

use crate::apply::UpdateMetrics;

/// A model call about to be made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LlmCallInfo {
    /// The conversation.
    pub thread_id: String,
    /// The raw user id, if any.
    pub user_id: Option<String>,
    /// The host's trace id, if any.
    pub trace_id: Option<String>,
    /// The model.
    pub model_name: String,
}

/// A finished model call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LlmResultInfo {
    /// The call.
    pub call: LlmCallInfo,
    /// How long it took.
    pub duration: Duration,
    /// The error, when it failed.
    pub error: Option<String>,
    /// The size of the answer, when it succeeded.
    pub response_chars: Option<usize>,
    /// Token usage, when reported.
    pub token_usage: Option<TokenUsage>,
}

/// The outcome of one extraction attempt (sent whenever a proposer was asked).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExtractionReport {
    /// The conversation.
    pub thread_id: String,
    /// The raw user id, if any.
    pub user_id: Option<String>,
    /// The host's trace id, if any.
    pub trace_id: Option<String>,
    /// The model (`None` for the offline rules).
    pub model_name: Option<String>,
    /// Whether the update was committed (or had nothing to change).
    pub success: bool,
    /// Token usage, when reported.
    pub token_usage: Option<TokenUsage>,
    /// Gate metrics of the last apply attempt (absent when parsing failed).
    pub metrics: Option<UpdateMetrics>,
    /// The error, when it failed.
    pub error: Option<String>,
}

/// Receives pipeline events. Implementations must be cheap and must not panic.
pub trait UpdateObserver: Send + Sync + Debug {
    /// Before a model call.
    fn on_llm_call(&self, _call: &LlmCallInfo) {}

    /// After a model call, success or failure.
    fn on_llm_result(&self, _result: &LlmResultInfo) {}

    /// After an extraction attempt.
    fn on_extraction(&self, _report: &ExtractionReport) {}
}
