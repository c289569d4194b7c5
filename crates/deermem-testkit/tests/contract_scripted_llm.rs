//! The language-model contract suite run against the scripted fake.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem_core::LlmError;
use deermem_testkit::llm::{FakeAnswer, LlmFixture, Scripted, ScriptedLlm};

async fn fixture() -> LlmFixture {
    let llm = Arc::new(ScriptedLlm::default());
    let pusher = Arc::clone(&llm);
    let reader = Arc::clone(&llm);
    LlmFixture {
        model: llm,
        push: Box::new(move |a| {
            pusher.push(match a {
                FakeAnswer::Reply(t) => Scripted::Reply(t),
                FakeAnswer::RateLimited => {
                    Scripted::Fail(LlmError::RateLimited { retry_after: None })
                }
                FakeAnswer::ServerError => Scripted::Fail(LlmError::Server {
                    status: 500,
                    message: "boom".into(),
                }),
                FakeAnswer::AuthError => Scripted::Fail(LlmError::Auth { status: 401 }),
                FakeAnswer::Malformed => {
                    Scripted::Fail(LlmError::InvalidResponse("not json".into()))
                }
            })
        }),
        requests: Box::new(move || reader.requests()),
        retries_internally: false,
        guard: Box::new(()),
    }
}

deermem_testkit::llm_contract!(fixture());
