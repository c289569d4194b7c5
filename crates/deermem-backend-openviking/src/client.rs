//! A small typed client for the seven OpenViking endpoints the backend uses, with the
//! reference's requests and headers: `X-API-Key` with the USER key, the per-request
//! `X-OpenViking-Actor-Peer`, the `{status, result|error}` envelope, and one retry of reads on
//! recoverable errors (writes are never retried).
//!
//! The client reads no ambient configuration: no proxy variables, no `OPENVIKING_*` identity
//! variables, no `ovcli.conf`, and it sends no header beyond the key, the actor peer and the
//! JSON content type.

use deermem_core::ManagerError;
use deermem_core::config::ConfigSecret;
use deermem_remote::http::{self, Profile};
use deermem_remote::retry::{self, RetryPolicy};
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value, json};

/// The header carrying the USER API key.
pub const API_KEY_HEADER: &str = "X-API-Key";
/// The header naming the actor peer of session and retrieval requests.
pub const ACTOR_PEER_HEADER: &str = "X-OpenViking-Actor-Peer";

/// Largest response body read (bigger bodies are an error, not an out-of-memory).
const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;
/// Longest server text quoted in an error message.
const MAX_ERROR_TEXT_CHARS: usize = 500;

/// What went wrong with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The server answered with an error envelope (or a non-2xx status).
    Server,
    /// No connection could be made: the request never reached the server.
    Connect,
    /// The connection broke after the request may have been sent.
    Transport,
    /// The request timed out.
    Timeout,
    /// The response could not be understood.
    InvalidResponse,
}

/// An OpenViking request failure with the server's error code when there is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("[{code}] {message}")]
pub struct OpenVikingError {
    /// The failure class.
    pub kind: ErrorKind,
    /// The server's code (`NOT_FOUND`, `UNAVAILABLE`...), `INTERNAL` for a non-JSON error body,
    /// `UNKNOWN` for a JSON error body without one, or `CONNECT` / `TRANSPORT` / `TIMEOUT` /
    /// `INVALID_RESPONSE`.
    pub code: String,
    /// Human-readable detail (never the API key).
    pub message: String,
    /// The HTTP status, when a response arrived.
    pub status: Option<u16>,
}

impl OpenVikingError {
    fn new(kind: ErrorKind, code: &str, message: impl Into<String>, status: Option<u16>) -> Self {
        Self {
            kind,
            code: code.to_owned(),
            message: message.into(),
            status,
        }
    }

    /// Whether one retry may help: `UNAVAILABLE`, `DEADLINE_EXCEEDED`, connection errors and
    /// timeouts.
    pub fn is_recoverable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Connect | ErrorKind::Transport | ErrorKind::Timeout
        ) || self.code == "UNAVAILABLE"
            || self.code == "DEADLINE_EXCEEDED"
    }

    /// Whether a write that failed this way may still have been applied by the server: the
    /// request timed out, the connection broke after it was sent, or the server's own deadline
    /// passed. A refused connection or an error answer means it was not.
    pub fn may_have_been_applied(&self) -> bool {
        matches!(self.kind, ErrorKind::Transport | ErrorKind::Timeout)
            || self.code == "DEADLINE_EXCEEDED"
    }

    /// Whether the server said the resource does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code == "NOT_FOUND"
    }

    /// The manager error for this failure, with `context` prefixed to the message.
    pub fn to_manager_error(&self, context: &str) -> ManagerError {
        let message = format!("{context}: {self}");
        let error = match self.kind {
            ErrorKind::Timeout => ManagerError::timeout(message),
            ErrorKind::Connect | ErrorKind::Transport => ManagerError::unavailable(message),
            _ if self.code == "DEADLINE_EXCEEDED" => ManagerError::timeout(message),
            _ if self.code == "UNAVAILABLE" || self.code == "RESOURCE_EXHAUSTED" => {
                ManagerError::unavailable(message)
            }
            _ => ManagerError::backend(message),
        };
        error.caused_by(self.clone())
    }
}

/// The body of a `find` or `search` request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RetrievalRequest {
    /// The query text.
    pub query: String,
    /// The memory trees searched.
    pub target_uri: Vec<String>,
    /// `Some` switches to `/search/search` with this session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Result cap.
    pub limit: usize,
    /// Minimum score, left out when `None` (or not finite).
    #[serde(skip_serializing_if = "not_finite")]
    pub score_threshold: Option<f64>,
    /// Metadata filter, left out when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
    /// `key=value` tags every hit must carry (the server's `tags`), left out when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
}

fn not_finite(f: &Option<f64>) -> bool {
    !f.is_some_and(f64::is_finite)
}

impl RetrievalRequest {
    /// The JSON body, keys in the order the reference's SDK sends them.
    pub fn body(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Map::new()));
        if let Some(m) = v.as_object_mut() {
            m.insert("telemetry".into(), Value::Bool(false));
        }
        v
    }
}

/// The OpenViking HTTP client. `Debug` shows the server, never the key.
#[derive(Clone, Debug)]
pub struct OpenVikingClient {
    http: reqwest::Client,
    base_url: String,
    api_key: ConfigSecret,
}

impl OpenVikingClient {
    /// A client for `base_url` (no trailing `/`) with one timeout for connecting and for the
    /// whole request.
    ///
    /// # Errors
    /// The HTTP stack cannot be initialised (no TLS roots...).
    pub fn new(
        base_url: &str,
        api_key: ConfigSecret,
        timeout: std::time::Duration,
    ) -> Result<Self, ManagerError> {
        let http = http::client(timeout, timeout, Profile::Bare).map_err(|e| {
            ManagerError::backend(format!("cannot build the OpenViking HTTP client: {e}"))
                .caused_by(e)
        })?;
        Ok(Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
        })
    }

    /// The server root.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    fn session_path(session_id: &str, suffix: &str) -> String {
        format!(
            "/api/v1/sessions/{}{suffix}",
            http::encode_segment(session_id)
        )
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        peer: Option<&str>,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Option<Value>, OpenVikingError> {
        let url = format!("{}{path}", self.base_url);
        let mut req = self
            .http
            .request(method, &url)
            .header(API_KEY_HEADER, self.api_key.expose());
        if let Some(p) = peer {
            req = req.header(ACTOR_PEER_HEADER, p);
        }
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let (status, bytes) = exchange(req).await?;
        parse_envelope(status, &bytes)
    }

    async fn read_once_retried(
        &self,
        method: reqwest::Method,
        path: &str,
        peer: Option<&str>,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Option<Value>, OpenVikingError> {
        retry_once(
            || self.send(method.clone(), path, peer, query, body),
            |e| tracing::info!(path, error = %e, "OpenViking read failed with a recoverable error; retrying once"),
        )
        .await
    }

    /// `GET /health` (no actor peer): true when the server answers `status: ok`. Any failure,
    /// after one retry of a recoverable one, is `false`.
    pub async fn health(&self) -> bool {
        let url = format!("{}/health", self.base_url);
        let check = || async {
            let req = self
                .http
                .get(&url)
                .header(API_KEY_HEADER, self.api_key.expose());
            let (status, bytes) = exchange(req).await?;
            parse_envelope(status, &bytes)?;
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            Ok::<bool, OpenVikingError>(v.get("status").and_then(Value::as_str) == Some("ok"))
        };
        match retry_once(check, |e| {
            tracing::info!(error = %e, "OpenViking health check failed; retrying once");
        })
        .await
        {
            Ok(healthy) => healthy,
            Err(e) => {
                tracing::warn!(error = %e, "OpenViking health check failed");
                false
            }
        }
    }

    /// `POST /api/v1/sessions/{id}/messages/batch` (never retried). The session is created by
    /// the server on first use. Returns the session's uncommitted message count after the batch
    /// (`message_count`), when the server reports it.
    ///
    /// # Errors
    /// Any failure.
    pub async fn add_messages(
        &self,
        session_id: &str,
        peer: &str,
        messages: &[Value],
    ) -> Result<Option<u64>, OpenVikingError> {
        self.send(
            reqwest::Method::POST,
            &Self::session_path(session_id, "/messages/batch"),
            Some(peer),
            &[],
            Some(&json!({ "messages": messages })),
        )
        .await
        .map(|r| r.as_ref().and_then(|r| count_field(r, "message_count")))
    }

    /// `POST /api/v1/sessions/{id}/commit` with `keep_recent_count: 0` (never retried, never
    /// polled).
    ///
    /// # Errors
    /// Any failure.
    pub async fn commit(&self, session_id: &str, peer: &str) -> Result<(), OpenVikingError> {
        self.send(
            reqwest::Method::POST,
            &Self::session_path(session_id, "/commit"),
            Some(peer),
            &[],
            Some(&json!({ "keep_recent_count": 0, "telemetry": false })),
        )
        .await
        .map(|_| ())
    }

    /// `GET /api/v1/sessions/{id}`: the session's counters; a missing session is `None`.
    ///
    /// # Errors
    /// Any failure but `NOT_FOUND`.
    pub async fn session_info(
        &self,
        session_id: &str,
        peer: &str,
    ) -> Result<Option<SessionInfo>, OpenVikingError> {
        match self
            .read_once_retried(
                reqwest::Method::GET,
                &Self::session_path(session_id, ""),
                Some(peer),
                &[],
                None,
            )
            .await
        {
            Ok(result) => {
                let r = result.unwrap_or(Value::Null);
                Ok(Some(SessionInfo {
                    pending_tokens: count_field(&r, "pending_tokens").unwrap_or(0),
                    message_count: count_field(&r, "message_count"),
                }))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `POST /api/v1/search/find`, or `/search/search` when the request names a session.
    /// Returns the `result` object (`{}` when absent).
    ///
    /// # Errors
    /// Any failure (after one retry of a recoverable one).
    pub async fn retrieve(
        &self,
        peer: &str,
        request: &RetrievalRequest,
    ) -> Result<Value, OpenVikingError> {
        let path = if request.session_id.is_some() {
            "/api/v1/search/search"
        } else {
            "/api/v1/search/find"
        };
        let body = request.body();
        self.read_once_retried(reqwest::Method::POST, path, Some(peer), &[], Some(&body))
            .await
            .map(|r| r.unwrap_or_else(|| Value::Object(Map::new())))
    }

    /// `GET /api/v1/content/read?uri=…&offset=0&limit=-1`: the full content of a memory.
    ///
    /// # Errors
    /// Any failure (after one retry of a recoverable one).
    pub async fn read_content(&self, peer: &str, uri: &str) -> Result<Value, OpenVikingError> {
        self.read_once_retried(
            reqwest::Method::GET,
            "/api/v1/content/read",
            Some(peer),
            &[("uri", uri), ("offset", "0"), ("limit", "-1")],
            None,
        )
        .await
        .map(|r| r.unwrap_or(Value::Null))
    }
}

/// What `GET /api/v1/sessions/{id}` reports about a session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionInfo {
    /// Tokens of the messages not yet committed.
    pub pending_tokens: u64,
    /// Messages added since the last commit (a commit resets it), when reported.
    pub message_count: Option<u64>,
}

/// A non-negative count field of a result object (a positive float is rounded up).
fn count_field(result: &Value, key: &str) -> Option<u64> {
    let v = result.get(key)?;
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| *f > 0.0).map(|f| f.ceil() as u64))
}

/// Runs `op`, and once more at once when it failed with a recoverable error.
async fn retry_once<T, Fut>(
    op: impl FnMut() -> Fut + Send,
    mut notify: impl FnMut(&OpenVikingError) + Send,
) -> Result<T, OpenVikingError>
where
    Fut: Future<Output = Result<T, OpenVikingError>> + Send,
    T: Send,
{
    retry::retry(
        RetryPolicy::IMMEDIATE,
        1,
        retry::tokio_sleeper(),
        op,
        |e: &OpenVikingError| e.is_recoverable().then_some(None),
        move |e, _| notify(e),
    )
    .await
}

fn transport_error(e: &reqwest::Error) -> OpenVikingError {
    // The message names neither the key (reqwest errors never carry headers) nor the URL
    // (hosts show these messages, e.g. on an open readiness page, and the URL can name an
    // internal host): the cause chain below reqwest's own error does not include it.
    let cause =
        std::error::Error::source(e).map_or_else(|| "no detail".to_owned(), http::error_chain);
    let (kind, code, what) = if e.is_timeout() {
        (ErrorKind::Timeout, "TIMEOUT", "request timed out")
    } else if e.is_connect() {
        (
            ErrorKind::Connect,
            "CONNECT",
            "cannot connect to the server",
        )
    } else {
        (ErrorKind::Transport, "TRANSPORT", "request failed")
    };
    OpenVikingError::new(kind, code, excerpt(&format!("{what}: {cause}")), None)
}

fn excerpt(s: &str) -> String {
    http::excerpt(s, MAX_ERROR_TEXT_CHARS)
}

/// One exchange with a bounded body: a larger body is an `INVALID_RESPONSE`.
async fn exchange(req: reqwest::RequestBuilder) -> Result<(StatusCode, Vec<u8>), OpenVikingError> {
    let reply = http::exchange(req, MAX_RESPONSE_BYTES, MAX_RESPONSE_BYTES)
        .await
        .map_err(|e| transport_error(&e))?;
    if reply.truncated {
        return Err(OpenVikingError::new(
            ErrorKind::InvalidResponse,
            "INVALID_RESPONSE",
            format!("response body exceeds {MAX_RESPONSE_BYTES} bytes"),
            Some(reply.status.as_u16()),
        ));
    }
    Ok((reply.status, reply.body))
}

/// Reads the `{status, result|error}` envelope: an error envelope raises its code whatever the
/// HTTP status; a non-JSON body is an `INTERNAL` error on non-2xx and an empty success on 2xx;
/// other non-2xx JSON is `UNKNOWN`. Returns the `result`, `None` when absent.
pub(crate) fn parse_envelope(
    status: StatusCode,
    bytes: &[u8],
) -> Result<Option<Value>, OpenVikingError> {
    let code = status.as_u16();
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        if status.is_success() {
            return Ok(Some(Value::Object(Map::new())));
        }
        let text = String::from_utf8_lossy(bytes);
        return Err(OpenVikingError::new(
            ErrorKind::Server,
            "INTERNAL",
            format!("HTTP {code}: {}", excerpt(&text)),
            Some(code),
        ));
    };
    if v.get("status").and_then(Value::as_str) == Some("error") {
        let err_code = v.pointer("/error/code").and_then(Value::as_str);
        let message = v.pointer("/error/message").and_then(Value::as_str);
        let message = message.map_or_else(|| format!("HTTP {code}"), excerpt);
        return Err(OpenVikingError::new(
            ErrorKind::Server,
            &excerpt(err_code.unwrap_or("UNKNOWN")),
            message,
            Some(code),
        ));
    }
    if !status.is_success() {
        let detail = v
            .get("detail")
            .map(|d| match d {
                Value::String(s) => excerpt(s),
                other => excerpt(&other.to_string()),
            })
            .unwrap_or_else(|| format!("HTTP {code}"));
        return Err(OpenVikingError::new(
            ErrorKind::Server,
            "UNKNOWN",
            detail,
            Some(code),
        ));
    }
    Ok(v.get("result").filter(|r| !r.is_null()).cloned())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn envelope_rules() {
        let ok = parse_envelope(StatusCode::OK, br#"{"status":"ok","result":{"a":1}}"#).unwrap();
        assert_eq!(ok, Some(json!({"a": 1})));
        assert_eq!(
            parse_envelope(StatusCode::OK, br#"{"status":"ok"}"#).unwrap(),
            None
        );
        assert_eq!(
            parse_envelope(StatusCode::OK, b"<html>ok</html>").unwrap(),
            Some(json!({}))
        );
        let e =
            parse_envelope(StatusCode::INTERNAL_SERVER_ERROR, b"<html>boom</html>").unwrap_err();
        assert_eq!(e.code, "INTERNAL");
        assert_eq!(e.message, "HTTP 500: <html>boom</html>");
        assert!(!e.is_recoverable());
        let e = parse_envelope(
            StatusCode::OK,
            br#"{"status":"error","error":{"code":"UNAVAILABLE","message":"busy"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, "UNAVAILABLE");
        assert!(e.is_recoverable(), "an error envelope wins over a 200");
        let e =
            parse_envelope(StatusCode::BAD_GATEWAY, br#"{"detail":"bad gateway"}"#).unwrap_err();
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("UNKNOWN", "bad gateway")
        );
        let e = parse_envelope(
            StatusCode::NOT_FOUND,
            br#"{"status":"error","error":{"code":"NOT_FOUND","message":"no"}}"#,
        )
        .unwrap_err();
        assert!(e.is_not_found());
        let huge = format!("{{\"detail\":\"{}\"}}", "x".repeat(100_000));
        let e = parse_envelope(StatusCode::BAD_REQUEST, huge.as_bytes()).unwrap_err();
        assert!(e.message.chars().count() <= MAX_ERROR_TEXT_CHARS + 1);
    }

    #[test]
    fn error_mapping_to_manager_errors() {
        let e = |kind, code: &str| OpenVikingError::new(kind, code, "m", None);
        assert!(matches!(
            e(ErrorKind::Timeout, "TIMEOUT").to_manager_error("x"),
            ManagerError::Timeout { .. }
        ));
        assert!(matches!(
            e(ErrorKind::Server, "DEADLINE_EXCEEDED").to_manager_error("x"),
            ManagerError::Timeout { .. }
        ));
        assert!(matches!(
            e(ErrorKind::Transport, "TRANSPORT").to_manager_error("x"),
            ManagerError::Unavailable { .. }
        ));
        assert!(matches!(
            e(ErrorKind::Server, "UNAVAILABLE").to_manager_error("x"),
            ManagerError::Unavailable { .. }
        ));
        assert!(matches!(
            e(ErrorKind::Connect, "CONNECT").to_manager_error("x"),
            ManagerError::Unavailable { .. }
        ));
        // Only a request that may have reached the server is in doubt.
        assert!(e(ErrorKind::Timeout, "TIMEOUT").may_have_been_applied());
        assert!(e(ErrorKind::Transport, "TRANSPORT").may_have_been_applied());
        assert!(e(ErrorKind::Server, "DEADLINE_EXCEEDED").may_have_been_applied());
        assert!(!e(ErrorKind::Connect, "CONNECT").may_have_been_applied());
        assert!(!e(ErrorKind::Server, "UNAVAILABLE").may_have_been_applied());
        assert!(e(ErrorKind::Connect, "CONNECT").is_recoverable());
        let b = e(ErrorKind::Server, "PERMISSION_DENIED").to_manager_error("find");
        assert!(matches!(b, ManagerError::Backend { .. }));
        assert!(b.to_string().contains("find: [PERMISSION_DENIED] m"));
    }

    #[test]
    fn retrieval_body_key_order_and_optional_fields() {
        let mut r = RetrievalRequest {
            query: "q".into(),
            target_uri: vec!["u1".into(), "u2".into()],
            session_id: Some("df_1".into()),
            limit: 8,
            score_threshold: Some(0.5),
            filter: Some(json!({"op": "must", "field": "category", "conds": ["x"]})),
            tags: Some(vec!["memory_type=x".into()]),
        };
        let keys: Vec<String> = r.body().as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            [
                "query",
                "target_uri",
                "session_id",
                "limit",
                "score_threshold",
                "filter",
                "tags",
                "telemetry"
            ]
        );
        r.session_id = None;
        r.score_threshold = None;
        r.filter = None;
        r.tags = None;
        assert_eq!(
            r.body().to_string(),
            r#"{"query":"q","target_uri":["u1","u2"],"limit":8,"telemetry":false}"#
        );
    }

    #[test]
    fn session_paths_are_escaped() {
        assert_eq!(
            OpenVikingClient::session_path("df_ab12", "/commit"),
            "/api/v1/sessions/df_ab12/commit"
        );
        assert_eq!(
            OpenVikingClient::session_path("a/../b c", ""),
            "/api/v1/sessions/a%2F..%2Fb%20c"
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let c = OpenVikingClient::new(
            "http://127.0.0.1:1",
            ConfigSecret::new("sk-very-secret"),
            std::time::Duration::from_secs(1),
        )
        .unwrap();
        let d = format!("{c:?}");
        assert!(!d.contains("sk-very-secret"), "{d}");
        assert!(d.contains("127.0.0.1"));
    }
}
