//! One OpenAI-compatible endpoint (`{base_url}/chat/completions`, `{base_url}/embeddings`): the
//! URL rules, the bearer key kept out of logs and errors, one bounded HTTP attempt, and the
//! retry loop; the chat and embedding clients map its neutral [`Failure`] to their port's error.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use deermem_core::ConfigError;
use deermem_core::config::ConfigSecret;
use deermem_remote::http::{self, Profile, excerpt};
use deermem_remote::retry::{self, RetryPolicy, Sleeper};
use reqwest::Url;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::Value;

/// The base URL used when the configuration names none.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How much of an error body we read for the error message.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
/// How many characters of an error body end up in an error message.
const ERROR_EXCERPT_CHARS: usize = 300;

/// The parts the chat and embedding clients share word for word: for a client struct with an
/// `endpoint` field, the retry setters and the endpoint getter (`setters`); for a port error with
/// the same variants as the other (`port_error`), the mapping from a [`Failure`] and the retry
/// hint (`Some(server hint)` for an error worth another attempt).
macro_rules! shared {
    (setters) => {
        /// Replaces the backoff timing.
        #[must_use]
        pub fn with_retry_policy(mut self, policy: deermem_remote::retry::RetryPolicy) -> Self {
            self.endpoint.policy = policy;
            self
        }

        /// Replaces how the client waits between attempts (tests record the delays instead).
        #[must_use]
        pub fn with_sleeper(
            mut self,
            sleeper: std::sync::Arc<dyn deermem_remote::retry::Sleeper>,
        ) -> Self {
            self.endpoint.sleeper = sleeper;
            self
        }

        /// The endpoint requests go to, without user info or query string.
        pub fn endpoint(&self) -> &str {
            self.endpoint.display()
        }
    };
    (port_error $error:ident) => {
        /// The port's name for a failed attempt.
        fn port_error(f: $crate::endpoint::Failure) -> $error {
            use $crate::endpoint::Failure;
            match f {
                Failure::Timeout(d) => $error::Timeout(d),
                Failure::Transport(m) => $error::Transport(m),
                Failure::TooLarge(n) => {
                    $error::InvalidResponse(format!("response body exceeds {n} bytes"))
                }
                Failure::Status {
                    status,
                    retry_after,
                    message,
                } => match status {
                    429 => $error::RateLimited { retry_after },
                    401 | 403 => $error::Auth { status },
                    500..=599 => $error::Server { status, message },
                    _ => $error::InvalidRequest { status, message },
                },
            }
        }

        /// `Some(the server's hint)` when `e` is worth another attempt.
        fn retry_hint(e: &$error) -> Option<Option<std::time::Duration>> {
            let hint = match e {
                $error::RateLimited { retry_after } => *retry_after,
                _ => None,
            };
            e.is_retryable().then_some(hint)
        }
    };
}
pub(crate) use shared;

/// Why one attempt failed, before a port gives it its own name.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The request timed out.
    Timeout(Duration),
    /// The connection failed (message scrubbed of the URL and the key).
    Transport(String),
    /// A non-2xx answer; `message` is the server's error text, scrubbed and cut.
    Status {
        status: u16,
        retry_after: Option<Duration>,
        message: String,
    },
    /// A 2xx body longer than the limit.
    TooLarge(usize),
}

/// The settings an endpoint is built from; `key` prefixes configuration errors.
pub(crate) struct EndpointConfig<'a> {
    pub key: &'a str,
    pub base_url: Option<&'a str>,
    pub path: &'a str,
    pub api_key: Option<&'a str>,
    pub timeout_seconds: f64,
    pub connect_timeout_seconds: f64,
    pub max_retries: u32,
}

/// An endpoint with its client, key and retry settings.
pub(crate) struct Endpoint {
    http: reqwest::Client,
    url: Url,
    /// The URL as logs and `Debug` show it: no user info, no query string.
    display: String,
    auth: Option<HeaderValue>,
    /// The key, kept only to scrub it from server error bodies that echo it.
    secret: Option<ConfigSecret>,
    pub(crate) timeout: Duration,
    pub(crate) max_retries: u32,
    pub(crate) policy: RetryPolicy,
    pub(crate) sleeper: Arc<dyn Sleeper>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.display)
            .field("api_key", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

fn seconds(prefix: &str, key: &str, v: f64) -> Result<Duration, ConfigError> {
    if !v.is_finite() || v <= 0.0 {
        return Err(ConfigError::new(
            format!("{prefix}.{key}"),
            format!("must be a finite number of seconds > 0 (got {v})"),
        ));
    }
    Duration::try_from_secs_f64(v)
        .map_err(|e| ConfigError::new(format!("{prefix}.{key}"), format!("is out of range: {e}")))
}

impl Failure {
    /// The HTTP status, when the server answered.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl Endpoint {
    /// Builds the endpoint `{base_url}/{path}`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key when the base URL is not an `http(s)` URL, a timeout
    /// is not a positive finite number, or the API key holds characters an HTTP header cannot
    /// carry (the key itself is never echoed).
    pub(crate) fn new(c: &EndpointConfig<'_>) -> Result<Self, ConfigError> {
        let key = c.key;
        let base = c
            .base_url
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .unwrap_or(DEFAULT_BASE_URL);
        let mut url = Url::parse(base).map_err(|e| {
            ConfigError::new(
                format!("{key}.base_url"),
                format!("is not a valid URL ({e})"),
            )
        })?;
        let path = format!("{}/{}", url.path().trim_end_matches('/'), c.path);
        url.set_path(&path);
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ConfigError::new(
                format!("{key}.base_url"),
                format!(
                    "must be an http or https URL (got scheme {:?})",
                    url.scheme()
                ),
            ));
        }
        let mut shown = url.clone();
        // Both calls only fail for URLs that cannot carry user info, which then has none.
        let _ = shown.set_password(None);
        let _ = shown.set_username("");
        shown.set_query(None);
        let secret = c.api_key.filter(|k| !k.is_empty()).map(ConfigSecret::new);
        let auth = secret.as_ref().map(http::bearer).transpose().map_err(|_| {
            ConfigError::new(
                format!("{key}.api_key"),
                "contains characters that cannot be sent in an HTTP header",
            )
        })?;
        let timeout = seconds(key, "timeout_seconds", c.timeout_seconds)?;
        let connect = seconds(key, "connect_timeout_seconds", c.connect_timeout_seconds)?;
        let http = http::client(timeout, connect, Profile::Standard)
            .map_err(|e| ConfigError::new(key, format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            url,
            display: shown.to_string(),
            auth,
            secret,
            timeout,
            max_retries: c.max_retries,
            policy: RetryPolicy::default(),
            sleeper: retry::tokio_sleeper(),
        })
    }

    /// The URL requests go to, without user info or query string.
    pub(crate) fn display(&self) -> &str {
        &self.display
    }

    /// `text` with the API key replaced.
    pub(crate) fn scrub(&self, text: &str) -> String {
        match &self.secret {
            Some(k) => k.scrub(text),
            None => text.to_owned(),
        }
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

    /// One POST of a JSON `body`: the 2xx status and body (at most `max_bytes`), or the failure.
    pub(crate) async fn post(
        &self,
        body: &[u8],
        max_bytes: usize,
    ) -> Result<(u16, Vec<u8>), Failure> {
        let mut req = self
            .http
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let reply = http::exchange(req, max_bytes, MAX_ERROR_BODY_BYTES)
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    return Failure::Timeout(self.timeout);
                }
                // reqwest errors may carry the URL; show the sanitised one instead.
                let msg = http::error_chain(&e).replace(self.url.as_str(), &self.display);
                Failure::Transport(self.scrub(&msg))
            })?;
        if reply.status.is_success() {
            if reply.truncated {
                return Err(Failure::TooLarge(max_bytes));
            }
            return Ok((reply.status.as_u16(), reply.body));
        }
        let status = reply.status.as_u16();
        let message = if (300..400).contains(&status) {
            "the server answered with a redirect; point base_url at the final API location".into()
        } else {
            self.error_message(&reply.body)
        };
        Err(Failure::Status {
            status,
            retry_after: reply.retry_after,
            message,
        })
    }

    /// Runs `attempt` (given its 1-based number) under the retry policy: errors for which
    /// `retry_hint` answers `Some(server hint)` are tried again, at most `max_retries` times;
    /// each retry is logged with `what`.
    pub(crate) async fn with_retries<'a, T, E, Fut>(
        &'a self,
        what: &'static str,
        attempts: &'a AtomicU32,
        mut attempt: impl FnMut(u32) -> Fut + Send + 'a,
        retry_hint: impl Fn(&E) -> Option<Option<Duration>> + Send + Sync + 'a,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>> + Send + 'a,
        T: Send + 'a,
        E: fmt::Display + Send + 'a,
    {
        retry::retry(
            self.policy,
            self.max_retries,
            Arc::clone(&self.sleeper),
            || attempt(attempts.fetch_add(1, Ordering::SeqCst) + 1),
            retry_hint,
            |e, delay| {
                tracing::warn!(
                    endpoint = %self.display,
                    attempt = attempts.load(Ordering::SeqCst),
                    max_attempts = self.max_retries + 1,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    error = %e,
                    "{what} failed; retrying"
                );
            },
        )
        .await
    }
}
