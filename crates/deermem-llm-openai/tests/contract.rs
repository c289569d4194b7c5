//! Runs the language-model contract suite from deermem-testkit against the OpenAI-compatible
//! client talking to a fake chat-completions server on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use deermem_core::ModelConfig;
use deermem_core::ports::{ChatMessage, ChatRequest};
use deermem_llm_openai::fake::{self, Reply, Seen};
use deermem_llm_openai::{OpenAiChatModel, RetryPolicy};
use deermem_testkit::llm::{FakeAnswer, LlmFixture};
use serde_json::Value;

fn to_chat_request(seen: &Seen) -> ChatRequest {
    let messages: Vec<ChatMessage> =
        serde_json::from_value(seen.body["messages"].clone()).unwrap_or_default();
    ChatRequest {
        messages,
        temperature: seen.body.get("temperature").and_then(Value::as_f64),
        max_tokens: seen
            .body
            .get("max_tokens")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok()),
        json_response: seen.body.get("response_format").is_some(),
    }
}

async fn fixture() -> LlmFixture {
    let (fake, url) = fake::start(Vec::new()).await;
    let config = ModelConfig {
        model: Some("contract-model".into()),
        base_url: Some(url),
        timeout_seconds: 10.0,
        connect_timeout_seconds: 5.0,
        max_retries: 2,
        ..ModelConfig::default()
    };
    let model = OpenAiChatModel::from_config(&config)
        .unwrap_or_else(|e| panic!("config: {e}"))
        .with_retry_policy(RetryPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            retry_after_cap: Duration::from_millis(5),
        });
    let pusher = fake.clone();
    let reader = fake.clone();
    LlmFixture {
        model: Arc::new(model),
        push: Box::new(move |answer| {
            pusher.push(match answer {
                FakeAnswer::Reply(text) => Reply::ok(&text),
                FakeAnswer::RateLimited => Reply::raw(429, "slow down"),
                FakeAnswer::ServerError => Reply::raw(500, "boom"),
                FakeAnswer::AuthError => Reply::raw(401, "bad key"),
                FakeAnswer::Malformed => Reply::raw(200, "<html>not json</html>"),
            });
        }),
        requests: Box::new(move || reader.requests().iter().map(to_chat_request).collect()),
        retries_internally: true,
        guard: Box::new(fake),
    }
}

deermem_testkit::llm_contract!(fixture());
