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

/// Scripted server behaviour for the language-model contract suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeAnswer {
    /// Answer with this text.
    Reply(String),
    /// HTTP 429 (or the adapter's equivalent).
    RateLimited,
    /// HTTP 5xx.
    ServerError,
    /// HTTP 401.
    AuthError,
    /// A response the adapter cannot parse.
    Malformed,
}

/// A language model under test plus handles to script its server and read what it sent.
pub struct LlmFixture {
    /// The adapter.
    pub model: std::sync::Arc<dyn LanguageModel>,
    /// Queues the next server answer (answers are consumed in order, one per HTTP attempt).
    pub push: Box<dyn Fn(FakeAnswer) + Send + Sync>,
    /// The chat requests the server received, in order.
    pub requests: Box<dyn Fn() -> Vec<ChatRequest> + Send + Sync>,
    /// Whether the adapter retries retryable errors internally (then a transient error
    /// followed by a reply must succeed).
    pub retries_internally: bool,
    /// Keeps servers and temp state alive.
    pub guard: Box<dyn std::any::Any + Send>,
}

impl std::fmt::Debug for LlmFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmFixture")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

fn chat(text: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![
            deermem_core::ports::ChatMessage::system("sys"),
            deermem_core::ports::ChatMessage::user(text),
        ],
        ..ChatRequest::default()
    }
}

/// The reply text comes back and the messages reach the server unchanged.
pub async fn reply_text_is_returned(f: LlmFixture) {
    (f.push)(FakeAnswer::Reply("hello 世界".into()));
    let resp = f
        .model
        .complete(&chat("hi"))
        .await
        .unwrap_or_else(|e| panic!("complete failed: {e}"));
    assert_eq!(resp.content, "hello 世界");
    let sent = (f.requests)();
    let last = sent.last().expect("the server saw the request");
    assert_eq!(last.messages, chat("hi").messages);
}

/// Refused credentials are an `Auth` error, which is not retryable.
pub async fn auth_errors_are_not_retryable(f: LlmFixture) {
    for _ in 0..8 {
        (f.push)(FakeAnswer::AuthError);
    }
    let err = f.model.complete(&chat("hi")).await.expect_err("must fail");
    assert!(matches!(err, LlmError::Auth { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(
        (f.requests)().len(),
        1,
        "a non-retryable error is not retried"
    );
}

/// Persistent server errors end in a retryable `Server` error after a bounded number of tries.
pub async fn server_errors_are_retryable(f: LlmFixture) {
    for _ in 0..16 {
        (f.push)(FakeAnswer::ServerError);
    }
    let err = f.model.complete(&chat("hi")).await.expect_err("must fail");
    assert!(matches!(err, LlmError::Server { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!((f.requests)().len() < 16, "retries are bounded");
}

/// Persistent rate limiting ends in a `RateLimited` error.
pub async fn rate_limits_are_reported(f: LlmFixture) {
    for _ in 0..16 {
        (f.push)(FakeAnswer::RateLimited);
    }
    let err = f.model.complete(&chat("hi")).await.expect_err("must fail");
    assert!(matches!(err, LlmError::RateLimited { .. }), "{err:?}");
}

/// An unparseable response is `InvalidResponse`, never a panic.
pub async fn malformed_responses_are_invalid(f: LlmFixture) {
    for _ in 0..8 {
        (f.push)(FakeAnswer::Malformed);
    }
    let err = f.model.complete(&chat("hi")).await.expect_err("must fail");
    assert!(matches!(err, LlmError::InvalidResponse(_)), "{err:?}");
}

/// A transient error followed by a reply: adapters that retry succeed; others report the error.
pub async fn transient_errors_follow_the_retry_policy(f: LlmFixture) {
    (f.push)(FakeAnswer::ServerError);
    (f.push)(FakeAnswer::Reply("recovered".into()));
    let result = f.model.complete(&chat("hi")).await;
    if f.retries_internally {
        assert_eq!(result.map(|r| r.content).ok().as_deref(), Some("recovered"));
        assert_eq!((f.requests)().len(), 2);
    } else {
        assert!(matches!(result, Err(LlmError::Server { .. })));
    }
}

/// Expands one `#[tokio::test]` per language-model behaviour; `$fixture` evaluates to a future
/// of [`LlmFixture`].
#[macro_export]
macro_rules! llm_contract {
    ($fixture:expr) => {
        $crate::llm_contract!(@tests $fixture;
            reply_text_is_returned,
            auth_errors_are_not_retryable,
            server_errors_are_retryable,
            rate_limits_are_reported,
            malformed_responses_are_invalid,
            transient_errors_follow_the_retry_policy,
        );
    };
    (@tests $fixture:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::block_on(async {
                let fixture = $fixture.await;
                $crate::llm::$name(fixture).await;
                });
            }
        )*
    };
}
