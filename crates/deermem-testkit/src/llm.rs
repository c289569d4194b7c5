//! `ScriptedLlm`: a language model that answers from a script and records every request.

use std::collections::VecDeque;
use std::sync::Mutex;

use async_trait::async_trait;
use deermem_core::LlmError;
use deermem_core::ports::{ChatRequest, ChatResponse, LanguageModel};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// Reply with this text.
    Reply(String),
    /// Fail with this error.
    Fail(LlmError),
}

/// A language model that replays a script, stricter than a real one: a call past the end of
/// the script fails with [`LlmError::InvalidResponse`] so tests notice unexpected calls.
#[derive(Debug, Default)]
pub struct ScriptedLlm {
    script: Mutex<VecDeque<Scripted>>,
    requests: Mutex<Vec<ChatRequest>>,
    repeat_last: bool,
    last: Mutex<Option<Scripted>>,
}

impl ScriptedLlm {
    /// A model that answers the given replies in order.
    pub fn new<I, S>(replies: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            script: Mutex::new(
                replies
                    .into_iter()
                    .map(|r| Scripted::Reply(r.into()))
                    .collect(),
            ),
            ..Self::default()
        }
    }

    /// A model that answers every call with the same reply.
    pub fn always(reply: impl Into<String>) -> Self {
        let reply = Scripted::Reply(reply.into());
        Self {
            script: Mutex::new(VecDeque::new()),
            requests: Mutex::new(Vec::new()),
            repeat_last: true,
            last: Mutex::new(Some(reply)),
        }
    }

    /// Appends an answer (a reply or an error) to the script.
    pub fn push(&self, item: Scripted) {
        self.script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(item);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many calls were made.
    pub fn calls(&self) -> usize {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The concatenated text of the last request's messages (for prompt assertions).
    pub fn last_prompt(&self) -> Option<String> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .map(|r| {
                r.messages
                    .iter()
                    .map(|m| m.content.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
    }
}

#[async_trait]
impl LanguageModel for ScriptedLlm {
    fn model_name(&self) -> &str {
        "scripted"
    }

    async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request.clone());
        let next = self
            .script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        let item = match next {
            Some(item) => item,
            None if self.repeat_last => self
                .last
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .ok_or_else(|| LlmError::InvalidResponse("scripted model has no reply".into()))?,
            None => {
                return Err(LlmError::InvalidResponse(
                    "scripted model: no more replies in the script".into(),
                ));
            }
        };
        match item {
            Scripted::Reply(content) => Ok(ChatResponse {
                content,
                model: Some("scripted".into()),
                usage: None,
            }),
            Scripted::Fail(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use deermem_core::ports::ChatMessage;

    use super::*;

    #[tokio::test]
    async fn replays_script_then_fails() {
        let llm = ScriptedLlm::new(["a"]);
        llm.push(Scripted::Fail(LlmError::RateLimited { retry_after: None }));
        let req = ChatRequest {
            messages: vec![ChatMessage::user("hi")],
            ..ChatRequest::default()
        };
        assert_eq!(llm.complete(&req).await.unwrap().content, "a");
        assert!(matches!(
            llm.complete(&req).await,
            Err(LlmError::RateLimited { .. })
        ));
        assert!(llm.complete(&req).await.is_err());
        assert_eq!(llm.calls(), 3);
        assert_eq!(llm.last_prompt().as_deref(), Some("hi"));
    }

    #[tokio::test]
    async fn always_repeats() {
        let llm = ScriptedLlm::always("x");
        let req = ChatRequest::default();
        for _ in 0..3 {
            assert_eq!(llm.complete(&req).await.unwrap().content, "x");
        }
    }
}
