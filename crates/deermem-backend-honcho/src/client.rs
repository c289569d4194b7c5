//! The Honcho v3 HTTP client: JSON POSTs under `{base_url}/v3/...` with percent-encoded path
//! segments, connect and read timeouts, bearer auth only when a key is set, typed errors, and
//! logs that carry sizes and statuses but never bodies or the key.

use std::fmt;
use std::time::{Duration, Instant};

use deermem_core::ManagerError;
use deermem_core::config::ConfigSecret;
use deermem_remote::http::{self, Profile, excerpt};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::Value;

use crate::config::HonchoConfig;

/// The largest response body read.
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// A failed Honcho call. Server text in it has the key scrubbed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum HonchoError {
    /// An id cannot be used as a path segment (empty, `.` or `..`).
    #[error(
        "Honcho request refused: the {what} id cannot be used in a URL path (empty, '.' or '..')"
    )]
    InvalidId { what: &'static str },
    /// The request timed out.
    #[error("Honcho request failed: POST {path}: timed out after {after:?}")]
    Timeout { path: String, after: Duration },
    /// Connecting or reading failed.
    #[error("Honcho request failed: POST {path}: {message}")]
    Transport { path: String, message: String },
    /// A non-2xx status.
    #[error("Honcho request failed: POST {path}: HTTP {status}: {detail}")]
    Status {
        path: String,
        status: u16,
        detail: String,
        retry_after: Option<Duration>,
    },
    /// A 2xx body that is not JSON (or too large).
    #[error("Honcho returned an invalid response for POST {path}: {message}")]
    InvalidBody { path: String, message: String },
}

impl HonchoError {
    /// Whether trying again may help (timeouts, transport errors, 429 and 5xx).
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            Self::Timeout { .. } | Self::Transport { .. } => true,
            Self::Status { status, .. } => *status == 429 || *status >= 500,
            Self::InvalidId { .. } | Self::InvalidBody { .. } => false,
        }
    }

    /// The HTTP status, for status errors.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The server's `Retry-After` hint.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether this is a timeout.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }
}

/// Percent-encodes one path segment; refuses segments URL parsers treat specially.
pub(crate) fn encode_segment(id: &str, what: &'static str) -> Result<String, HonchoError> {
    if id.is_empty() || id == "." || id == ".." {
        return Err(HonchoError::InvalidId { what });
    }
    Ok(http::encode_segment(id))
}

/// The HTTP client. `Debug` never shows the key.
pub(crate) struct HonchoClient {
    http: reqwest::Client,
    base_url: String,
    auth: Option<HeaderValue>,
    /// Kept only to scrub it from server messages that might echo it.
    secret: Option<ConfigSecret>,
    timeout: Duration,
}

impl fmt::Debug for HonchoClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HonchoClient")
            .field("base_url", &self.base_url)
            .field("api_key", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HonchoClient {
    /// Builds the client.
    pub(crate) fn new(config: &HonchoConfig) -> Result<Self, ManagerError> {
        let auth = config.api_key.as_ref().map(http::bearer).transpose().map_err(|_| {
            ManagerError::backend("memory.backend_config.api_key contains characters that cannot be sent in an HTTP header")
        })?;
        let http = http::client(
            config.timeout(),
            config.connect_timeout(),
            Profile::Standard,
        )
        .map_err(|e| {
            ManagerError::backend(format!("cannot build the Honcho HTTP client: {e}")).caused_by(e)
        })?;
        Ok(Self {
            http,
            base_url: config.base_url.clone(),
            auth,
            secret: config.api_key.clone(),
            timeout: config.timeout(),
        })
    }

    /// POSTs `body` to `/v3/{segments...}` (each segment already encoded). Returns the JSON
    /// response, or `None` for an empty 2xx body.
    pub(crate) async fn post(
        &self,
        encoded_segments: &[&str],
        body: &Value,
    ) -> Result<Option<Value>, HonchoError> {
        let path = format!("/v3/{}", encoded_segments.join("/"));
        let url = format!("{}{path}", self.base_url);
        let payload = serde_json::to_vec(body).map_err(|e| HonchoError::InvalidBody {
            path: path.clone(),
            message: format!("cannot encode the request: {e}"),
        })?;
        let started = Instant::now();
        let mut req = self
            .http
            .post(&url)
            .header(CONTENT_TYPE, "application/json")
            .body(payload.clone());
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let result = self.exchange(req, &path).await;
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match &result {
            Ok((status, bytes, _)) => tracing::debug!(
                path = %path,
                status,
                latency_ms,
                request_bytes = payload.len(),
                response_bytes = bytes,
                "honcho request"
            ),
            Err(e) => tracing::debug!(
                path = %path,
                status = e.status().unwrap_or(0),
                latency_ms,
                request_bytes = payload.len(),
                error = %e,
                "honcho request failed"
            ),
        }
        result.map(|(_, _, v)| v)
    }

    /// `text` without the key.
    fn scrub(&self, text: &str) -> String {
        self.secret
            .as_ref()
            .map_or_else(|| text.to_owned(), |k| k.scrub(text))
    }

    async fn exchange(
        &self,
        req: reqwest::RequestBuilder,
        path: &str,
    ) -> Result<(u16, usize, Option<Value>), HonchoError> {
        let reply = http::exchange(req, MAX_BODY_BYTES, MAX_BODY_BYTES)
            .await
            .map_err(|e| {
                let path = path.to_owned();
                if e.is_timeout() {
                    HonchoError::Timeout {
                        path,
                        after: self.timeout,
                    }
                } else {
                    let message = self.scrub(&http::error_chain(&e.without_url()));
                    HonchoError::Transport { path, message }
                }
            })?;
        let status = reply.status.as_u16();
        let buf = reply.body;
        if !reply.status.is_success() {
            let text = String::from_utf8_lossy(&buf);
            let detail = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("detail").cloned())
                .map(|d| match d {
                    Value::String(s) => s,
                    other => other.to_string(),
                })
                .unwrap_or_else(|| text.trim().to_owned());
            return Err(HonchoError::Status {
                path: path.to_owned(),
                status,
                detail: self.scrub(&excerpt(&detail, 300)),
                retry_after: reply.retry_after,
            });
        }
        if reply.truncated {
            return Err(HonchoError::InvalidBody {
                path: path.to_owned(),
                message: format!("response body exceeds {MAX_BODY_BYTES} bytes"),
            });
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            return Ok((status, buf.len(), None));
        }
        serde_json::from_slice(&buf)
            .map(|v| (status, buf.len(), Some(v)))
            .map_err(|e| HonchoError::InvalidBody {
                path: path.to_owned(),
                message: self.scrub(&format!(
                    "non-JSON response ({e}): {}",
                    excerpt(&String::from_utf8_lossy(&buf), 120)
                )),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(encode_segment("team ws?x", "w").unwrap(), "team%20ws%3Fx");
        assert_eq!(encode_segment("alice/b", "p").unwrap(), "alice%2Fb");
        assert_eq!(encode_segment("../etc", "p").unwrap(), "..%2Fetc");
        assert_eq!(encode_segment("a\0b", "p").unwrap(), "a%00b");
        assert_eq!(encode_segment("日本", "p").unwrap(), "%E6%97%A5%E6%9C%AC");
        assert_eq!(encode_segment("ok-id_1.~", "p").unwrap(), "ok-id_1.~");
        for bad in ["", ".", ".."] {
            assert!(matches!(
                encode_segment(bad, "peer"),
                Err(HonchoError::InvalidId { what: "peer" })
            ));
        }
    }

    #[test]
    fn retryable_classification() {
        let status = |s| HonchoError::Status {
            path: String::new(),
            status: s,
            detail: String::new(),
            retry_after: None,
        };
        assert!(status(500).is_retryable());
        assert!(status(429).is_retryable());
        assert!(!status(422).is_retryable());
        assert!(!status(401).is_retryable());
        assert!(
            HonchoError::Timeout {
                path: String::new(),
                after: Duration::ZERO
            }
            .is_retryable()
        );
    }
}
