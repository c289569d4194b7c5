//! The proposal seam: something that looks at the memory and the new messages and proposes an
//! update. [`LlmProposer`] builds the prompt, calls the language model once and parses its
//! answer; [`OfflineProposer`] applies deterministic rules when no model is configured. Both
//! produce the same [`ProposedUpdate`], which then goes through the same gates.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::DeerMemConfig;
use async_trait::async_trait;
use deermem_core::ports::{ChatRequest, LanguageModel, TokenUsage};
use deermem_core::{AgentName, LlmError, MemoryDocument, Message, Timestamp, UserId};

use crate::observe::{LlmCallInfo, LlmResultInfo, UpdateObserver};
use crate::offline::propose_offline_with_memory;
use crate::parse::{ParseError, ProposedUpdate, parse_update_response};
use crate::prompt::{PromptError, PromptInput, TemplateStore, build_update_prompt};
use crate::signals::SignalSet;

/// What a proposer is asked about.
#[derive(Debug, Clone, Copy)]
pub struct ProposalRequest<'a> {
    /// The memory snapshot.
    pub memory: &'a MemoryDocument,
    /// The new messages (after the watermark).
    pub feed: &'a [Message],
    /// Signals of the feed.
    pub signals: SignalSet,
    /// The agent bucket.
    pub agent: &'a AgentName,
    /// The configuration.
    pub config: &'a DeerMemConfig,
    /// Now.
    pub now: Timestamp,
    /// The conversation.
    pub thread_id: &'a str,
    /// The user, if any.
    pub user: Option<&'a UserId>,
    /// The host's trace id, if any.
    pub trace_id: Option<&'a str>,
}

/// Who produced a proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposalOrigin {
    /// A language model, by name.
    Model(String),
    /// The offline rules.
    Offline,
}

impl ProposalOrigin {
    /// The model name for metrics (`None` for the offline rules).
    pub fn model_name(&self) -> Option<&str> {
        match self {
            Self::Model(m) => Some(m),
            Self::Offline => None,
        }
    }
}

/// A proposed update and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    /// The normalised update.
    pub update: ProposedUpdate,
    /// Who proposed it.
    pub origin: ProposalOrigin,
    /// The fact ids the prompt offered for consolidation (merges may consume only these).
    pub consolidation_shown: Option<BTreeSet<String>>,
    /// Token usage of the model call, when reported.
    pub token_usage: Option<TokenUsage>,
}

/// Why no proposal could be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// The prompt template failed.
    #[error(transparent)]
    Prompt(#[from] PromptError),
    /// The model call failed.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// The model's answer held no acceptable update.
    #[error(transparent)]
    Parse(#[from] ParseError),
}

/// Proposes memory updates.
///
/// # Contract
/// `propose` returns `Ok(None)` when the messages hold nothing to learn from (no text), a
/// normalised update otherwise, or a typed error; it never panics on model output. It does not
/// touch storage.
#[async_trait]
pub trait Proposer: Send + Sync + fmt::Debug {
    /// Who this proposer is.
    fn origin(&self) -> ProposalOrigin;

    /// Proposes an update.
    ///
    /// # Errors
    /// A [`ProposeError`].
    async fn propose(&self, request: ProposalRequest<'_>)
    -> Result<Option<Proposal>, ProposeError>;
}

/// The model-backed proposer: prompt → one model call → parse.
#[derive(Clone)]
pub struct LlmProposer {
    llm: Arc<dyn LanguageModel>,
    templates: Arc<TemplateStore>,
    observer: Option<Arc<dyn UpdateObserver>>,
}

impl fmt::Debug for LlmProposer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmProposer")
            .field("model", &self.llm.model_name())
            .finish_non_exhaustive()
    }
}

impl LlmProposer {
    /// A proposer over a model and templates that reports every model call and its result to
    /// `observer`, when there is one.
    pub fn new(
        llm: Arc<dyn LanguageModel>,
        templates: Arc<TemplateStore>,
        observer: Option<Arc<dyn UpdateObserver>>,
    ) -> Self {
        Self {
            llm,
            templates,
            observer,
        }
    }
}

#[async_trait]
impl Proposer for LlmProposer {
    fn origin(&self) -> ProposalOrigin {
        ProposalOrigin::Model(self.llm.model_name().to_owned())
    }

    async fn propose(&self, req: ProposalRequest<'_>) -> Result<Option<Proposal>, ProposeError> {
        let templates = self.templates.for_agent(req.agent).await?;
        let input = PromptInput {
            memory: req.memory,
            feed: req.feed,
            signals: req.signals,
            config: req.config,
            now: req.now,
        };
        let Some(prompt) = build_update_prompt(&templates, &input)? else {
            return Ok(None);
        };
        let request = ChatRequest {
            messages: prompt.messages,
            temperature: req.config.model.temperature,
            max_tokens: req.config.model.max_tokens,
            json_response: true,
        };
        let model = self.llm.model_name().to_owned();
        let call = LlmCallInfo {
            thread_id: req.thread_id.to_owned(),
            user_id: req.user.map(|u| u.as_str().to_owned()),
            trace_id: req.trace_id.map(str::to_owned),
            model_name: model.clone(),
        };
        if let Some(o) = &self.observer {
            o.on_llm_call(&call);
        }
        let started = Instant::now();
        let result = self.llm.complete(&request).await;
        if let Some(o) = &self.observer {
            o.on_llm_result(&LlmResultInfo {
                call,
                duration: started.elapsed(),
                error: result.as_ref().err().map(ToString::to_string),
                response_chars: result.as_ref().ok().map(|r| r.content.chars().count()),
                token_usage: result.as_ref().ok().and_then(|r| r.usage),
            });
        }
        let response = result?;
        let update = parse_update_response(&response.content)?;
        Ok(Some(Proposal {
            update,
            origin: ProposalOrigin::Model(model),
            consolidation_shown: prompt.consolidation_shown,
            token_usage: response.usage,
        }))
    }
}

/// The rule-based proposer used when no model is configured.
#[derive(Clone, Copy, Debug, Default)]
pub struct OfflineProposer;

#[async_trait]
impl Proposer for OfflineProposer {
    fn origin(&self) -> ProposalOrigin {
        ProposalOrigin::Offline
    }

    async fn propose(&self, req: ProposalRequest<'_>) -> Result<Option<Proposal>, ProposeError> {
        if req
            .feed
            .iter()
            .all(|m| deermem_pycompat::py::strip(&m.text()).is_empty())
        {
            return Ok(None);
        }
        Ok(Some(Proposal {
            update: propose_offline_with_memory(req.feed, Some(req.memory)),
            origin: ProposalOrigin::Offline,
            consolidation_shown: None,
            token_usage: None,
        }))
    }
}
