//! The `LanguageModel` port: one chat-completion call, messages in, text out.

use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::LlmError;

/// The role of a chat message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatRole {
    /// Instructions.
    System,
    /// The user turn.
    User,
    /// A model turn.
    Assistant,
}

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: ChatRole,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: ChatRole::System,
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: ChatRole::User,
            content: content.into(),
        }
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: ChatRole::Assistant,
            content: content.into(),
        }
    }
}

/// A chat-completion request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation to complete.
    pub messages: Vec<ChatMessage>,
    /// Sampling temperature, when the caller wants one.
    pub temperature: Option<f64>,
    /// Output token cap.
    pub max_tokens: Option<u32>,
    /// Ask the server for a JSON object response when it supports that.
    pub json_response: bool,
}

/// Token accounting, when the server reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

/// A chat-completion response.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The model's text.
    pub content: String,
    /// The model that answered, when reported.
    pub model: Option<String>,
    /// Token usage, when reported.
    pub usage: Option<TokenUsage>,
}

/// A chat model.
///
/// # Contract
/// - `complete` sends the messages once per attempt and returns the model's text; adapters may
///   retry internally, but only for errors where [`LlmError::is_retryable`] is true, with a
///   bounded number of attempts.
/// - Errors say whether a retry can help; an adapter never panics on a malformed response, it
///   returns [`LlmError::InvalidResponse`].
/// - Secrets (API keys) never appear in `Debug` output or logs.
#[async_trait]
pub trait LanguageModel: Send + Sync + Debug {
    /// The configured model name (for metrics and logs).
    fn model_name(&self) -> &str;

    /// Completes the chat.
    ///
    /// # Errors
    /// A typed [`LlmError`].
    async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError>;
}
