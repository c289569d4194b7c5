//! [`OpenAiChatModel`]: the HTTP client behind the `LanguageModel` port, with bounded retries,
//! typed errors and secret-free logging.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deermem_core::ports::{ChatRequest, ChatResponse, LanguageModel};
use deermem_core::{ConfigError, LlmError, ModelConfig};
use deermem_remote::Secret;
use deermem_remote::http::{self, Profile, excerpt};
use deermem_remote::retry::{self, RetryPolicy, Sleeper};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use reqwest::{StatusCode, Url};
use serde_json::Value;

use crate::wire::{parse_response, request_body};

/// The base URL used when the configuration names none.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The largest successful response body we read (a chat completion is far smaller).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
/// How much of an error body we read for the error message.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
/// How many characters of an error body end up in an error message.
const ERROR_EXCERPT_CHARS: usize = 300;

const KEY: &str = "memory.backend_config.model";

/// A chat model behind an OpenAI-compatible `/chat/completions` endpoint.
///
/// Build it with [`OpenAiChatModel::from_config`]. `Debug` shows whether a key is set, never
/// the key.
pub struct OpenAiChatModel {
    http: reqwest::Client,
    endpoint: Url,
    /// The endpoint as logs and `Debug` show it: no user info, no query string.
    endpoint_display: String,
    model: String,
    auth: Option<HeaderValue>,
    /// The key, kept only to scrub it from server error bodies that echo it.
    secret: Option<Secret>,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    timeout: Duration,
    max_retries: u32,
    policy: RetryPolicy,
    sleeper: Arc<dyn Sleeper>,
}

impl fmt::Debug for OpenAiChatModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiChatModel")
            .field("endpoint", &self.endpoint_display)
            .field("model", &self.model)
            .field("api_key", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

fn seconds(key: &str, v: f64) -> Result<Duration, ConfigError> {
    if !v.is_finite() || v <= 0.0 {
        return Err(ConfigError::new(
            format!("{KEY}.{key}"),
            format!("must be a finite number of seconds > 0 (got {v})"),
        ));
    }
    Duration::try_from_secs_f64(v)
        .map_err(|e| ConfigError::new(format!("{KEY}.{key}"), format!("is out of range: {e}")))
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
        let base = config
            .base_url
            .as_deref()
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .unwrap_or(DEFAULT_BASE_URL);
        let mut endpoint = Url::parse(base).map_err(|e| {
            ConfigError::new(
                format!("{KEY}.base_url"),
                format!("is not a valid URL ({e})"),
            )
        })?;
        let path = format!("{}/chat/completions", endpoint.path().trim_end_matches('/'));
        endpoint.set_path(&path);
        if !matches!(endpoint.scheme(), "http" | "https") {
            return Err(ConfigError::new(
                format!("{KEY}.base_url"),
                format!(
                    "must be an http or https URL (got scheme {:?})",
                    endpoint.scheme()
                ),
            ));
        }
        let mut shown = endpoint.clone();
        // Both calls only fail for URLs that cannot carry user info, which then has none.
        let _ = shown.set_password(None);
        let _ = shown.set_username("");
        shown.set_query(None);
        let endpoint_display = shown.to_string();

        let secret = config
            .api_key
            .as_deref()
            .filter(|k| !k.is_empty())
            .map(Secret::new);
        let auth = secret
            .as_ref()
            .map(Secret::bearer)
            .transpose()
            .map_err(|_| {
                ConfigError::new(
                    format!("{KEY}.api_key"),
                    "contains characters that cannot be sent in an HTTP header",
                )
            })?;
        let timeout = seconds("timeout_seconds", config.timeout_seconds)?;
        let connect = seconds("connect_timeout_seconds", config.connect_timeout_seconds)?;
        let http = http::client(timeout, connect, Profile::Standard)
            .map_err(|e| ConfigError::new(KEY, format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            endpoint,
            endpoint_display,
            model,
            auth,
            secret,
            temperature: config.temperature,
            max_tokens: config.max_tokens,
            timeout,
            max_retries: config.max_retries,
            policy: RetryPolicy::default(),
            sleeper: retry::tokio_sleeper(),
        })
    }

    /// Replaces the backoff timing.
    #[must_use]
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Replaces how the client waits between attempts (tests record the delays instead).
    #[must_use]
    pub fn with_sleeper(mut self, sleeper: Arc<dyn Sleeper>) -> Self {
        self.sleeper = sleeper;
        self
    }

    /// The endpoint requests go to, without user info or query string.
    pub fn endpoint(&self) -> &str {
        &self.endpoint_display
    }

    /// The configured number of retries after the first attempt.
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    fn scrub(&self, text: &str) -> String {
        match &self.secret {
            Some(k) => k.scrub(text),
            None => text.to_owned(),
        }
    }

    fn transport_error(&self, e: &reqwest::Error) -> LlmError {
        if e.is_timeout() {
            return LlmError::Timeout(self.timeout);
        }
        // reqwest errors may carry the URL; show the sanitised endpoint instead.
        let msg = http::error_chain(e).replace(self.endpoint.as_str(), &self.endpoint_display);
        LlmError::Transport(self.scrub(&msg))
    }

    fn error_message(&self, body: &[u8]) -> String {
        let text = String::from_utf8_lossy(body);
        let detail = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| {
                let e = v.get("error")?;
                e.get("message")
                    .and_then(Value::as_str)
                    .or_else(|| e.as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| text.trim().to_owned());
        self.scrub(&excerpt(&detail, ERROR_EXCERPT_CHARS))
    }

    /// One HTTP attempt.
    async fn attempt(&self, body: &[u8], attempt: u32) -> Result<ChatResponse, LlmError> {
        let started = Instant::now();
        let mut req = self
            .http
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let reply = http::exchange(req, MAX_RESPONSE_BYTES, MAX_ERROR_BODY_BYTES)
            .await
            .map_err(|e| self.transport_error(&e))?;
        let (status, retry_after, bytes) = (reply.status, reply.retry_after, reply.body);
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::debug!(
            model = %self.model,
            endpoint = %self.endpoint_display,
            attempt,
            status = status.as_u16(),
            latency_ms,
            response_bytes = bytes.len(),
            "chat completion response"
        );
        if status.is_success() {
            if reply.truncated {
                return Err(LlmError::InvalidResponse(format!(
                    "response body exceeds {MAX_RESPONSE_BYTES} bytes"
                )));
            }
            return parse_response(&bytes).map_err(|e| match e {
                LlmError::InvalidResponse(m) => LlmError::InvalidResponse(self.scrub(&m)),
                other => other,
            });
        }
        Err(self.status_error(status, retry_after, &bytes))
    }

    fn status_error(
        &self,
        status: StatusCode,
        retry_after: Option<Duration>,
        body: &[u8],
    ) -> LlmError {
        let code = status.as_u16();
        match code {
            429 => LlmError::RateLimited { retry_after },
            401 | 403 => LlmError::Auth { status: code },
            500..=599 => LlmError::Server {
                status: code,
                message: self.error_message(body),
            },
            300..=399 => LlmError::InvalidRequest {
                status: code,
                message:
                    "the server answered with a redirect; point base_url at the final API location"
                        .into(),
            },
            _ => LlmError::InvalidRequest {
                status: code,
                message: self.error_message(body),
            },
        }
    }
}

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
        let result = retry::retry(
            self.policy,
            self.max_retries,
            Arc::clone(&self.sleeper),
            || {
                let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
                tracing::debug!(
                    model = %self.model,
                    endpoint = %self.endpoint_display,
                    attempt,
                    messages = request.messages.len(),
                    request_bytes = body.len(),
                    json_response = request.json_response,
                    "chat completion request"
                );
                self.attempt(&body, attempt)
            },
            |e: &LlmError| {
                let hint = match e {
                    LlmError::RateLimited { retry_after } => *retry_after,
                    _ => None,
                };
                e.is_retryable().then_some(hint)
            },
            |e, delay| {
                tracing::warn!(
                    model = %self.model,
                    attempt = attempts.load(Ordering::SeqCst),
                    max_attempts = self.max_retries + 1,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    error = %e,
                    "chat completion failed; retrying"
                );
            },
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
