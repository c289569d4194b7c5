//! DeerMem LanguageModel adapter for OpenAI-compatible chat-completions servers.
//!
//! [`OpenAiChatModel`] implements [`deermem_core::ports::LanguageModel`] over
//! `POST {base_url}/chat/completions`, the dialect spoken by OpenAI, DeepSeek, vLLM, llama.cpp's
//! server and Ollama's OpenAI-compatible endpoint.
//!
//! - Configuration comes from [`deermem_core::ModelConfig`] (already `$VAR`-resolved).
//! - Bounded retries with exponential backoff and jitter happen only for 429 (honouring a capped
//!   `Retry-After`), 5xx, transport errors and timeouts; other 4xx answers fail at once.
//! - Every failure is a typed [`deermem_core::LlmError`]; a malformed body is
//!   [`deermem_core::LlmError::InvalidResponse`], never a panic.
//! - The API key never appears in `Debug` output, logs or error messages.
//! - With the Cargo feature `fake-server`, `fake` is a fake chat-completions server on
//!   127.0.0.1 for tests (this crate's and the facade's).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

mod client;
mod embeddings;
mod endpoint;
/// A fake chat-completions server on 127.0.0.1 for tests (feature `fake-server`; it lives in
/// the testkit, `deermem_testkit::http::openai`).
#[cfg(feature = "fake-server")]
pub mod fake {
    pub use deermem_testkit::http::openai::*;
}
mod wire;

pub use client::OpenAiChatModel;
pub use deermem_remote::{RetryPolicy, Sleeper, TokioSleeper};
pub use embeddings::{DEFAULT_EMBEDDING_MODEL, MAX_BATCH, OpenAiEmbedder};
pub use endpoint::DEFAULT_BASE_URL;
