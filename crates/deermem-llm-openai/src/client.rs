//! [`OpenAiChatModel`]: the chat client behind the `LanguageModel` port, with bounded retries,
//! typed errors and secret-free logging.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use deermem_core::ports::{ChatRequest, ChatResponse, LanguageModel};
use deermem_core::{ConfigError, LlmError, ModelConfig};

use crate::endpoint::{Endpoint, EndpointConfig, shared};
use crate::wire::{parse_response, request_body};

/// The largest successful response body we read (a chat completion is far smaller).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

const KEY: &str = "memory.backend_config.model";

/// A chat model behind an OpenAI-compatible `/chat/completions` endpoint.
///
/// Build it with [`OpenAiChatModel::from_config`]. `Debug` shows whether a key is set, never
/// the key.
pub struct OpenAiChatModel {
    endpoint: Endpoint,
    model: String,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
}

impl fmt::Debug for OpenAiChatModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiChatModel")
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .finish_non_exhaustive()
    }
}

impl OpenAiChatModel {
    /// Builds the client from a parsed (and `$VAR`-resolved) model configuration.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key when no model is configured, the base URL is not an
    /// `http(s)` URL, a timeout is not a positive finite number, or the API key holds
    /// characters an HTTP header cannot carry (the key itself is never echoed).
    pub fn from_config(config: &ModelConfig) -> Result<Self, ConfigError> {
        let model = config
            .model
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                ConfigError::new(format!("{KEY}.model"), "no language model is configured")
            })?
            .to_owned();
        let endpoint = Endpoint::new(&EndpointConfig {
            key: KEY,
            base_url: config.base_url.as_deref(),
            path: "chat/completions",
            api_key: config
                .api_key
                .as_ref()
                .map(deermem_core::config::ConfigSecret::expose),
            timeout_seconds: config.timeout_seconds,
            connect_timeout_seconds: config.connect_timeout_seconds,
            max_retries: config.max_retries,
        })?;
        Ok(Self {
            endpoint,
            model,
            temperature: config.temperature,
            max_tokens: config.max_tokens,
        })
    }

    shared!(setters);

    /// One HTTP attempt.
    async fn attempt(&self, body: &[u8], attempt: u32) -> Result<ChatResponse, LlmError> {
        let started = Instant::now();
        let reply = self.endpoint.post(body, MAX_RESPONSE_BYTES).await;
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (status, response_bytes) = match &reply {
            Ok((status, body)) => (*status, body.len()),
            Err(f) => (f.status().unwrap_or(0), 0),
        };
        tracing::debug!(
            model = %self.model,
            endpoint = %self.endpoint.display(),
            attempt,
            status,
            latency_ms,
            response_bytes,
            "chat completion response"
        );
        let (_, bytes) = reply.map_err(port_error)?;
        parse_response(&bytes).map_err(|e| match e {
            LlmError::InvalidResponse(m) => LlmError::InvalidResponse(self.endpoint.scrub(&m)),
            other => other,
        })
    }
}

shared!(port_error LlmError);

#[async_trait]
impl LanguageModel for OpenAiChatModel {
    fn model_name(&self) -> &str {
        &self.model
    }

    async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let body = serde_json::to_vec(&request_body(
            &self.model,
            request,
            self.temperature,
            self.max_tokens,
        ))
        .map_err(|e| LlmError::InvalidRequest {
            status: 0,
            message: format!("cannot encode the request: {e}"),
        })?;
        let started = Instant::now();
        let attempts = AtomicU32::new(0);
        let result = self
            .endpoint
            .with_retries(
                "chat completion",
                &attempts,
                |attempt| {
                    tracing::debug!(
                        model = %self.model,
                        endpoint = %self.endpoint.display(),
                        attempt,
                        messages = request.messages.len(),
                        request_bytes = body.len(),
                        json_response = request.json_response,
                        "chat completion request"
                    );
                    self.attempt(&body, attempt)
                },
                retry_hint,
            )
            .await;
        let attempts = attempts.load(Ordering::SeqCst);
        match &result {
            Ok(resp) => tracing::info!(
                model = %self.model,
                served_by = resp.model.as_deref().unwrap_or(""),
                attempts,
                total_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                content_chars = resp.content.chars().count(),
                prompt_tokens = resp.usage.map_or(0, |u| u.prompt_tokens),
                completion_tokens = resp.usage.map_or(0, |u| u.completion_tokens),
                "chat completion succeeded"
            ),
            Err(e) => tracing::warn!(
                model = %self.model,
                attempts,
                error = %e,
                "chat completion failed"
            ),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        ModelConfig {
            model: Some("m".into()),
            timeout_seconds: 5.0,
            connect_timeout_seconds: 1.0,
            max_retries: 2,
            ..ModelConfig::default()
        }
    }

    #[test]
    fn config_validation_names_keys() {
        let mut c = cfg();
        c.model = Some("  ".into());
        assert_eq!(
            OpenAiChatModel::from_config(&c).unwrap_err().key,
            "memory.backend_config.model.model"
        );
        let mut c = cfg();
        c.base_url = Some("ftp://x".into());
        assert_eq!(
            OpenAiChatModel::from_config(&c).unwrap_err().key,
            "memory.backend_config.model.base_url"
        );
        let mut c = cfg();
        c.timeout_seconds = f64::NAN;
        assert_eq!(
            OpenAiChatModel::from_config(&c).unwrap_err().key,
            "memory.backend_config.model.timeout_seconds"
        );
        let mut c = cfg();
        c.connect_timeout_seconds = 0.0;
        assert_eq!(
            OpenAiChatModel::from_config(&c).unwrap_err().key,
            "memory.backend_config.model.connect_timeout_seconds"
        );
        let mut c = cfg();
        c.api_key = Some("bad\nkey-secret".into());
        let e = OpenAiChatModel::from_config(&c).unwrap_err();
        assert_eq!(e.key, "memory.backend_config.model.api_key");
        assert!(!e.to_string().contains("key-secret"));
    }

    #[test]
    fn endpoint_defaults_and_hides_credentials() {
        let m = OpenAiChatModel::from_config(&cfg()).unwrap();
        assert_eq!(m.endpoint(), "https://api.openai.com/v1/chat/completions");
        let mut c = cfg();
        c.base_url = Some("http://user:pw@127.0.0.1:9/v1/?api-key=zzz".into());
        c.api_key = Some("sk-hidden".into());
        let m = OpenAiChatModel::from_config(&c).unwrap();
        assert_eq!(m.endpoint(), "http://127.0.0.1:9/v1/chat/completions");
        let dbg = format!("{m:?}");
        assert!(!dbg.contains("sk-hidden") && !dbg.contains("pw") && !dbg.contains("zzz"));
        assert!(dbg.contains("<redacted>"));
    }
}
