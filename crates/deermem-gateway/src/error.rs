//! The gateway's error type and its one mapping to HTTP: every status code and `detail` string
//! a route can answer with is decided here, in [`GatewayError::into_response`].

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use deermem_core::{InvalidInputCode, ManagerError, OverloadScope};
use deermem_pycompat::lax::model::Issue;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

/// The fixed body of a corruption error: the private detail is never shown.
pub const CORRUPTED_DETAIL: &str = "Stored memory data is corrupted.";
/// The detail of a concurrency conflict.
pub const CONFLICT_DETAIL: &str = "Memory changed concurrently; reload and retry.";
/// The detail when a created fact was evicted at once by the capacity policy.
pub const CAPACITY_EVICTED_DETAIL: &str =
    "Fact was not stored because the configured memory.max_facts capacity policy evicted it";
/// The detail when authentication is missing or wrong.
pub const NOT_AUTHENTICATED_DETAIL: &str = "Not authenticated";
/// The detail when an `X-DeerFlow-Internal-Token` header does not match.
pub const INVALID_INTERNAL_TOKEN_DETAIL: &str = "Invalid internal token";
/// The detail when a fact's content is empty (the reference's text).
pub const EMPTY_CONTENT_DETAIL: &str = "Memory fact content cannot be empty.";
/// The detail when the memory backend (its database, its server) cannot be reached.
pub const UNAVAILABLE_DETAIL: &str = "Memory backend is unavailable; retry later.";
/// The `Retry-After` seconds of an unavailable backend.
pub const UNAVAILABLE_RETRY_AFTER_SECONDS: u64 = 2;
/// The detail of every route when `memory.enabled` is false.
pub const DISABLED_DETAIL: &str = "Memory is disabled (memory.enabled is false).";

/// A manager operation a route performs; names the operation in 501 and 500 messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `GET /api/memory`.
    GetMemory,
    /// `POST /api/memory/reload`.
    ReloadMemory,
    /// `DELETE /api/memory`.
    ClearMemory,
    /// `POST /api/memory/facts`.
    CreateFact,
    /// `DELETE /api/memory/facts/{id}`.
    DeleteFact,
    /// `PATCH /api/memory/facts/{id}`.
    UpdateFact,
    /// `GET /api/memory/export`.
    ExportMemory,
    /// `POST /api/memory/import`.
    ImportMemory,
    /// `GET /api/memory/status`.
    GetMemoryStatus,
    /// `POST /api/memory/messages`.
    AddMessages,
    /// `GET /api/memory/context`.
    GetContext,
    /// `GET /api/memory/search`.
    Search,
}

/// The 500 detail of a failed read.
const READ_FAILED: &str = "Failed to read memory data.";

impl Operation {
    /// The label (`Operation '<label>' not supported by memory backend '<Name>'.`) and the 500
    /// detail for a persistence failure (the reference's `OSError` messages where it has one).
    fn texts(self) -> (&'static str, &'static str) {
        match self {
            Self::GetMemory => ("get memory", READ_FAILED),
            Self::ReloadMemory => ("reload memory", "Failed to reload memory data."),
            Self::ClearMemory => ("clear memory", "Failed to clear memory data."),
            Self::CreateFact => ("create fact", "Failed to create memory fact."),
            Self::DeleteFact => ("delete fact", "Failed to delete memory fact."),
            Self::UpdateFact => ("update fact", "Failed to update memory fact."),
            Self::ExportMemory => ("export memory", READ_FAILED),
            Self::ImportMemory => ("import memory", "Failed to import memory data."),
            Self::GetMemoryStatus => ("get memory status", READ_FAILED),
            Self::AddMessages => (
                "add messages",
                "Failed to queue the conversation for memory.",
            ),
            Self::GetContext => ("get memory context", "Failed to build the memory context."),
            Self::Search => ("search memory", "Failed to search memory."),
        }
    }

    /// The label used in `Operation '<label>' not supported by memory backend '<Name>'.`
    pub fn label(self) -> &'static str {
        self.texts().0
    }

    /// The 500 detail for a persistence failure.
    pub fn storage_failure_detail(self) -> &'static str {
        self.texts().1
    }
}

/// One pydantic-style validation problem (`{"type", "loc", "msg", "input"?, "ctx"?}`); its
/// serialisation is the item of a 422 body.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[schemars(rename = "ValidationError")]
pub struct ValidationItem {
    /// Machine-readable kind (`missing`, `string_type`, `json_invalid`...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Where: `["body", "content"]`, `["query", "top_k"]`...
    #[schemars(schema_with = "loc_schema")]
    pub loc: Vec<Value>,
    /// Human-readable message.
    pub msg: String,
    /// The offending input, when small enough to echo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Constraint parameters (`{"le": 1.0}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub ctx: Option<Value>,
}

/// A `loc`: field names and list indexes.
fn loc_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "anyOf": [{ "type": "string" }, { "type": "integer", "minimum": 0 }] }
    })
}

impl ValidationItem {
    /// A new item.
    pub fn new(kind: &'static str, loc: Vec<Value>, msg: impl Into<String>) -> Self {
        Self {
            kind,
            loc,
            msg: msg.into(),
            input: None,
            ctx: None,
        }
    }

    /// Attaches the input, unless it is too large to echo back.
    #[must_use]
    pub fn with_input(mut self, input: &Value) -> Self {
        const MAX_ECHO: usize = 256;
        if serde_json::to_string(input).is_ok_and(|s| s.len() <= MAX_ECHO) {
            self.input = Some(input.clone());
        }
        self
    }

    /// Attaches the constraint parameters.
    #[must_use]
    pub fn with_ctx(mut self, ctx: Value) -> Self {
        self.ctx = Some(ctx);
        self
    }
}

impl From<Issue> for ValidationItem {
    fn from(i: Issue) -> Self {
        let item = Self::new(i.kind, i.loc, i.msg).with_input(&i.input);
        Self { ctx: i.ctx, ..item }
    }
}

/// Everything a gateway route can fail with.
#[derive(Debug)]
#[non_exhaustive]
pub enum GatewayError {
    /// The manager failed; mapped by variant and, for invalid input, by code.
    Manager {
        /// What the route was doing.
        op: Operation,
        /// The backend's name, for 501 messages.
        backend: String,
        /// The error.
        error: ManagerError,
    },
    /// `create_fact` stored nothing because the capacity policy evicted the new fact (409).
    CapacityEvicted,
    /// The request does not match the schema (422).
    Validation(Vec<ValidationItem>),
    /// A bad id, agent name or argument (400).
    BadRequest(String),
    /// No valid bearer token (401).
    NotAuthenticated,
    /// `auth.mode: deerflow_session` refused the caller (401 with DeerFlow's `{"code",
    /// "message"}` detail).
    Session(crate::session::SessionRejection),
    /// An `X-DeerFlow-Internal-Token` that does not match the configured one (401).
    InvalidInternalToken,
    /// The request is refused (403), e.g. a non-loopback `Host` in unauthenticated mode.
    Forbidden(String),
    /// `memory.enabled` is false (503).
    Disabled,
    /// The body is larger than `gateway.max_body_bytes` (413).
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// An index rebuild is already running (409).
    RebuildRunning,
    /// `warm()` reported failure (500).
    RebuildFailed,
    /// No such resource for this caller (404), e.g. a thread without run events.
    NotFound(String),
    /// The request conflicts with recorded state (409), e.g. a run that already saw another
    /// memory block.
    Conflict(String),
    /// The gateway was built without the feature the route needs (501).
    NotImplemented(String),
    /// The run journal or the turn journal failed (500); `detail` is shown, `message` only
    /// logged.
    Journal {
        /// The public detail.
        detail: &'static str,
        /// The private cause.
        message: String,
    },
    /// Too much work of this kind is running, for the caller's user (429) or for everyone
    /// (503); answered with `Retry-After`.
    Busy {
        /// Which limit was reached.
        scope: OverloadScope,
        /// The public detail.
        detail: String,
        /// Seconds for `Retry-After`.
        retry_after_seconds: u64,
    },
    /// A bug or a panicking backend (500); the detail is logged, never shown.
    Internal(String),
}

impl From<Vec<Issue>> for GatewayError {
    fn from(issues: Vec<Issue>) -> Self {
        Self::Validation(issues.into_iter().map(ValidationItem::from).collect())
    }
}

impl GatewayError {
    /// Wraps a manager error for an operation.
    pub fn manager(op: Operation, backend: impl Into<String>, error: ManagerError) -> Self {
        Self::Manager {
            op,
            backend: backend.into(),
            error,
        }
    }

    /// A single validation problem.
    pub fn validation(item: ValidationItem) -> Self {
        Self::Validation(vec![item])
    }

    /// The `Retry-After` seconds of a refusal that asks the caller to come back later.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        match self {
            Self::Busy {
                retry_after_seconds,
                ..
            } => Some(*retry_after_seconds),
            Self::Manager {
                error: ManagerError::Overloaded { retry_after, .. },
                ..
            } => Some((retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).max(1)),
            Self::Manager {
                error: ManagerError::Unavailable { .. },
                ..
            } => Some(UNAVAILABLE_RETRY_AFTER_SECONDS),
            _ => None,
        }
    }

    /// The status code and the `detail` value.
    pub fn status_and_detail(&self) -> (StatusCode, Value) {
        match self {
            Self::Manager { op, backend, error } => manager_status(*op, backend, error),
            Self::CapacityEvicted => plain(StatusCode::CONFLICT, CAPACITY_EVICTED_DETAIL),
            // Strings and JSON values: serialising cannot fail.
            Self::Validation(items) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                serde_json::to_value(items).unwrap_or_default(),
            ),
            Self::BadRequest(m) => plain(StatusCode::BAD_REQUEST, m),
            Self::NotAuthenticated => plain(StatusCode::UNAUTHORIZED, NOT_AUTHENTICATED_DETAIL),
            Self::Session(r) => (
                StatusCode::UNAUTHORIZED,
                json!({ "code": r.code(), "message": r.message() }),
            ),
            Self::InvalidInternalToken => {
                plain(StatusCode::UNAUTHORIZED, INVALID_INTERNAL_TOKEN_DETAIL)
            }
            Self::Forbidden(m) => plain(StatusCode::FORBIDDEN, m),
            Self::Disabled => plain(StatusCode::SERVICE_UNAVAILABLE, DISABLED_DETAIL),
            Self::PayloadTooLarge { limit } => plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("Request body is larger than the limit of {limit} bytes."),
            ),
            Self::RebuildRunning => plain(
                StatusCode::CONFLICT,
                "An index rebuild is already running; try again when it finishes.",
            ),
            Self::RebuildFailed => plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Memory index rebuild failed; see the server log.",
            ),
            Self::NotFound(m) => plain(StatusCode::NOT_FOUND, m),
            Self::Conflict(m) => plain(StatusCode::CONFLICT, m),
            Self::NotImplemented(m) => plain(StatusCode::NOT_IMPLEMENTED, m),
            Self::Journal { detail, .. } => plain(StatusCode::INTERNAL_SERVER_ERROR, *detail),
            Self::Busy { scope, detail, .. } => plain(busy_status(*scope), detail),
            Self::Internal(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error"),
        }
    }
}

fn manager_status(op: Operation, backend: &str, error: &ManagerError) -> (StatusCode, Value) {
    match error {
        ManagerError::Unsupported { .. } => plain(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "Operation '{}' not supported by memory backend '{backend}'.",
                op.label()
            ),
        ),
        ManagerError::Conflict { .. } => plain(StatusCode::CONFLICT, CONFLICT_DETAIL),
        ManagerError::Corruption { .. } => {
            plain(StatusCode::INTERNAL_SERVER_ERROR, CORRUPTED_DETAIL)
        }
        ManagerError::NotFound { fact_id } => plain(
            StatusCode::NOT_FOUND,
            format!("Memory fact '{fact_id}' not found."),
        ),
        ManagerError::InvalidInput { code, message } => invalid_input(*code, message),
        ManagerError::Unavailable { .. } => {
            plain(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE_DETAIL)
        }
        ManagerError::Timeout { .. } => plain(
            StatusCode::GATEWAY_TIMEOUT,
            "Memory backend timed out; retry later.",
        ),
        ManagerError::Overloaded { scope, message, .. } => {
            plain(busy_status(*scope), format!("Memory is busy: {message}."))
        }
        // `Storage`, and whatever a later version adds.
        _ => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            op.storage_failure_detail(),
        ),
    }
}

/// A status code with a text `detail`.
fn plain(code: StatusCode, detail: impl Into<String>) -> (StatusCode, Value) {
    (code, Value::String(detail.into()))
}

/// 429 when the caller's own user reached a limit, 503 when everyone's did.
fn busy_status(scope: OverloadScope) -> StatusCode {
    match scope {
        OverloadScope::User => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn invalid_input(code: InvalidInputCode, message: &str) -> (StatusCode, Value) {
    let bad = |d: String| plain(StatusCode::BAD_REQUEST, d);
    match code {
        InvalidInputCode::Confidence => {
            bad("Invalid confidence value; must be between 0 and 1.".into())
        }
        InvalidInputCode::Content => bad(content_detail(message)),
        InvalidInputCode::AgentName => bad(
            "An agent name is required for fact operations; user-global memory stores summaries only."
                .into(),
        ),
        InvalidInputCode::DuplicateFact => plain(
            StatusCode::CONFLICT,
            "A fact with the same content already exists.",
        ),
        InvalidInputCode::MemoryData => bad(format!("Invalid memory data: {message}")),
        InvalidInputCode::UserId => bad(format!("Invalid user id: {message}")),
        InvalidInputCode::FactId => bad(format!("Invalid fact id: {message}")),
        _ => bad(format!("Invalid input: {message}")),
    }
}

/// The detail of a content error: the reference's text when the content is empty (the only
/// content error it has), otherwise what is wrong, from the backend's message
/// (`content is too long (at most 20000 characters)` → `Memory fact content is too long (at
/// most 20000 characters).`).
fn content_detail(message: &str) -> String {
    let m = message.trim().trim_end_matches('.');
    let m = m.strip_prefix("fact.").unwrap_or(m);
    // A bare `content` is the reference's `ValueError("content")`: empty content.
    if m.is_empty() || m == "content" || m.contains("empty") {
        return EMPTY_CONTENT_DETAIL.to_owned();
    }
    match m.strip_prefix("content ") {
        Some(rest) => format!("Memory fact content {rest}."),
        None => format!("Invalid memory fact content: {m}."),
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let (status, detail) = self.status_and_detail();
        let retry_after = self.retry_after_seconds();
        // 501 is an expected answer (the backend does not offer the operation), not a fault;
        // neither is a refusal under load (503 with Retry-After).
        if let Self::Manager {
            op,
            error: error @ ManagerError::Unavailable { .. },
            ..
        } = &self
        {
            tracing::warn!(operation = op.label(), error = %error, "memory backend unavailable");
        } else if retry_after.is_some() {
            tracing::info!(status = status.as_u16(), detail = %detail, "request refused under load");
        } else if status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED {
            // The private detail goes to the log (with the request id of the current span),
            // never to the client.
            match &self {
                Self::Manager { op, error, .. } => {
                    tracing::error!(operation = op.label(), error = %error, "memory operation failed");
                }
                Self::Internal(d) => tracing::error!(error = %d, "internal error"),
                Self::Journal { detail, message } => {
                    tracing::error!(error = %message, detail, "journal failed");
                }
                other => tracing::error!(error = ?other, "request failed"),
            }
        } else if let Self::Manager { op, error, .. } = &self {
            tracing::debug!(operation = op.label(), error = %error, "memory operation refused");
        }
        let mut resp = (status, axum::Json(json!({ "detail": detail }))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(e: GatewayError) -> (u16, String) {
        let (s, d) = e.status_and_detail();
        (s.as_u16(), d.as_str().unwrap_or_default().to_owned())
    }

    #[test]
    fn invalid_input_codes_map_precisely() {
        let m = |code| {
            detail(GatewayError::manager(
                Operation::DeleteFact,
                "X",
                ManagerError::invalid(code, "bad thing"),
            ))
        };
        assert_eq!(m(InvalidInputCode::DuplicateFact).0, 409);
        // A content error says what is wrong; only emptiness has the reference's text.
        assert_eq!(
            m(InvalidInputCode::Content),
            (400, "Invalid memory fact content: bad thing.".into())
        );
        let content = |msg: &str| {
            detail(GatewayError::manager(
                Operation::CreateFact,
                "X",
                ManagerError::invalid(InvalidInputCode::Content, msg),
            ))
            .1
        };
        assert_eq!(
            content("content must not be empty"),
            "Memory fact content cannot be empty."
        );
        assert_eq!(
            content("fact.content must not be empty"),
            "Memory fact content cannot be empty."
        );
        assert_eq!(
            content("content is too long (at most 20000 characters)"),
            "Memory fact content is too long (at most 20000 characters)."
        );
        assert_eq!(
            content("fact.content must be a string"),
            "Memory fact content must be a string."
        );
        assert_eq!(
            m(InvalidInputCode::Other),
            (400, "Invalid input: bad thing".into())
        );
        assert_eq!(
            m(InvalidInputCode::FactId),
            (400, "Invalid fact id: bad thing".into())
        );
        assert_eq!(
            m(InvalidInputCode::MemoryData).1,
            "Invalid memory data: bad thing"
        );
        assert_eq!(m(InvalidInputCode::UserId).1, "Invalid user id: bad thing");
    }

    #[test]
    fn private_details_never_reach_the_body() {
        for error in [
            ManagerError::corruption("private /secret/path"),
            ManagerError::storage("private /secret/path"),
            ManagerError::backend("private /secret/path"),
            ManagerError::unavailable("private /secret/path"),
            ManagerError::timeout("private /secret/path"),
            ManagerError::conflict("private /secret/path"),
        ] {
            let (_, d) = detail(GatewayError::manager(Operation::GetMemory, "X", error));
            assert!(!d.contains("private"), "{d}");
        }
        let (s, d) = detail(GatewayError::Internal("private".into()));
        assert_eq!((s, d.as_str()), (500, "Internal Server Error"));
    }

    #[test]
    fn validation_items_serialise_like_fastapi() {
        let item = ValidationItem::new(
            "missing",
            vec!["body".into(), "content".into()],
            "Field required",
        )
        .with_input(&json!({"category": "x"}));
        let (s, d) = GatewayError::validation(item).status_and_detail();
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            d,
            json!([{"type": "missing", "loc": ["body", "content"], "msg": "Field required",
                    "input": {"category": "x"}}])
        );
        let big =
            ValidationItem::new("string_type", vec![], "x").with_input(&json!("y".repeat(1000)));
        assert!(big.input.is_none());
    }
}
