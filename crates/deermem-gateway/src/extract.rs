//! Request extraction with FastAPI's conventions: a JSON body (read under the size limit,
//! decoded only for a JSON or missing `Content-Type`, with FastAPI's answers for what does not
//! decode), query parameters, and the validated `agent` and fact-id parameters (400 for bad
//! ids, before any manager call).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use deermem_core::MAX_IMPORT_FACTS;
use deermem_core::{AgentName, FactId, IdError};
use deermem_pycompat::lax::model::Checker;
use serde_json::{Map, Value, json};

use http_body_util::BodyExt as _;

use crate::auth::Caller;
use crate::error::{GatewayError, ValidationItem};
use crate::limits::BulkPermit;
use crate::state::GatewayState;
use deermem_pycompat::json::python_decode_error;

/// FastAPI's 400 detail for a body that is not text it can decode (invalid UTF-8) or that its
/// parser gives up on (nesting too deep).
pub(crate) const BODY_PARSE_ERROR_DETAIL: &str = "There was an error parsing the body";

/// A request body parsed as JSON; failures are 413 (too large) or 422 (pydantic-style).
#[derive(Debug)]
pub(crate) struct JsonBody(pub(crate) Value);

/// Whether `err` or one of its sources is the body limit's error.
fn is_length_limit(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |e| e.source())
        .any(|e| e.is::<http_body_util::LengthLimitError>())
}

/// Whether FastAPI would decode the body as JSON: no content type, or `application/json` /
/// `application/*+json`.
fn is_json_content_type(ct: Option<&str>) -> bool {
    let Some(ct) = ct else { return true };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.split_once('/') {
        Some(("application", sub)) => sub == "json" || sub.ends_with("+json"),
        _ => false,
    }
}

/// The offset, in code points, of a serde_json error (line and column are 1-based; the
/// column counts bytes).
fn error_offset(text: &str, line: usize, column: usize) -> usize {
    let mut offset = 0;
    for (i, l) in text.split('\n').enumerate() {
        if i + 1 == line {
            let upto = column.saturating_sub(1).min(l.len());
            let chars = l.char_indices().take_while(|(b, _)| *b < upto).count();
            return offset + chars;
        }
        offset += l.chars().count() + 1;
    }
    offset
}

/// The body missing (empty, or JSON `null`): FastAPI's `missing` item.
fn body_missing() -> GatewayError {
    GatewayError::validation(
        ValidationItem::new("missing", vec![json!("body")], "Field required")
            .with_input(&Value::Null),
    )
}

/// Decodes a JSON body as FastAPI does (Python's `json.loads` on the bytes): a leading UTF-8
/// BOM is skipped; bytes that are not UTF-8 and nesting too deep to parse are a 400; a syntax
/// error is a 422 `json_invalid` item at Python's position with Python's message; `null` is a
/// missing body.
fn decode_json(bytes: &[u8]) -> Result<Value, GatewayError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes)
        .map_err(|_| GatewayError::BadRequest(BODY_PARSE_ERROR_DETAIL.into()))?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Null) => Err(body_missing()),
        Ok(v) => Ok(v),
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
            Err(GatewayError::BadRequest(BODY_PARSE_ERROR_DETAIL.into()))
        }
        Err(e) => {
            let (pos, msg) = match python_decode_error(text) {
                Some(p) => (p.offset, p.message.to_owned()),
                // Python would have accepted it (NaN, a lone surrogate): serde_json's words.
                None => (error_offset(text, e.line(), e.column()), e.to_string()),
            };
            Err(GatewayError::validation(
                ValidationItem::new(
                    "json_invalid",
                    vec![json!("body"), json!(pos)],
                    "JSON decode error",
                )
                .with_input(&json!({}))
                .with_ctx(json!({ "error": msg })),
            ))
        }
    }
}

/// Reads a JSON request body under the size limit: 413 when too large, the missing-body item
/// when empty, FastAPI's dictionary item for a content type it would not decode as JSON.
async fn json_bytes(req: Request, state: &GatewayState) -> Result<Bytes, GatewayError> {
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("application/octet-stream").to_owned());
    let limit = state.gateway_config().max_body_bytes;
    let bytes = axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|e| {
            if is_length_limit(&e) {
                GatewayError::PayloadTooLarge { limit }
            } else {
                GatewayError::BadRequest("Failed to read the request body.".into())
            }
        })?;
    if bytes.is_empty() {
        return Err(body_missing());
    }
    if !is_json_content_type(content_type.as_deref()) {
        // FastAPI validates the text as the body model: a string is not an object.
        let text = Value::String(String::from_utf8_lossy(&bytes).into_owned());
        return Err(Checker::body(&text).err().unwrap_or_default().into());
    }
    Ok(bytes)
}

impl FromRequest<GatewayState> for JsonBody {
    type Rejection = GatewayError;

    async fn from_request(req: Request, state: &GatewayState) -> Result<Self, Self::Rejection> {
        let bytes = json_bytes(req, state).await?;
        decode_json(&bytes).map(JsonBody)
    }
}

/// The body of `POST /api/memory/import` with its bulk slot. The slot is taken first: a
/// refused request's body is read and discarded, never kept (so the client, still sending,
/// gets the 429 / 503 rather than a reset connection). Then as [`JsonBody`], but a document
/// whose `facts` list holds more than [`MAX_IMPORT_FACTS`] items is refused (422, pydantic's
/// `too_long` item) from a scan of the text, before any of its facts is built.
#[derive(Debug)]
pub(crate) struct ImportBody {
    /// The bulk slot, held until the import ends.
    pub(crate) permit: BulkPermit,
    /// The decoded document.
    pub(crate) body: Value,
}

/// Reads and drops a request body, at most `limit` bytes of it, keeping none of it.
async fn discard_body(req: Request, limit: usize) {
    let mut body = req.into_body();
    let mut seen = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        seen = seen.saturating_add(frame.data_ref().map_or(0, |d| d.len()));
        if seen > limit {
            return;
        }
    }
}

/// The 422 of an import document with too many facts.
pub(crate) fn too_many_import_facts(count: usize) -> GatewayError {
    GatewayError::validation(
        ValidationItem::new(
            "too_long",
            vec![json!("body"), json!("facts")],
            format!(
                "List should have at most {MAX_IMPORT_FACTS} items after validation, not {count}"
            ),
        )
        .with_ctx(json!({
            "field_type": "List",
            "max_length": MAX_IMPORT_FACTS,
            "actual_length": count,
        })),
    )
}

impl FromRequest<GatewayState> for ImportBody {
    type Rejection = GatewayError;

    async fn from_request(req: Request, state: &GatewayState) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let acquired = BulkPermit::from_request_parts(&mut parts, state).await;
        let req = Request::from_parts(parts, body);
        let permit = match acquired {
            Ok(p) => p,
            Err(refused) => {
                discard_body(req, state.gateway_config().max_body_bytes).await;
                return Err(refused);
            }
        };
        let bytes = json_bytes(req, state).await?;
        if let Some(count) = deermem::import_fact_count(&bytes).filter(|n| *n > MAX_IMPORT_FACTS) {
            return Err(too_many_import_facts(count));
        }
        let body = decode_json(&bytes)?;
        Ok(ImportBody { permit, body })
    }
}

/// The decoded query string (repeated keys: the last value wins).
#[derive(Debug, Default)]
pub(crate) struct QueryParams(Vec<(String, String)>);

impl QueryParams {
    /// The value of `key`, if present.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The parameters as an object of strings, for [`Checker::query`].
    pub(crate) fn to_map(&self) -> Map<String, Value> {
        let pairs = self
            .0
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())));
        pairs.collect()
    }

    /// The `agent` parameter: absent or empty means the default bucket (`None`); anything
    /// else must be a valid agent name (400 otherwise).
    pub(crate) fn agent(&self) -> Result<Option<AgentName>, GatewayError> {
        parse_agent(self.get("agent"))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for QueryParams {
    type Rejection = GatewayError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default().as_bytes();
        Ok(Self(
            url::form_urlencoded::parse(query).into_owned().collect(),
        ))
    }
}

/// What a memory route reads first: the state, the caller (set by the authentication layer)
/// and the query.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) state: GatewayState,
    pub(crate) caller: Caller,
    pub(crate) q: QueryParams,
}

impl FromRequestParts<GatewayState> for Call {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &GatewayState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let q = QueryParams::from_request_parts(parts, state).await?;
        let state = state.clone();
        Ok(Self { state, caller, q })
    }
}

/// Validates an optional agent name (`None` or `""`: the default bucket). Every refusal reads
/// `Invalid agent name '<name>': <why>`.
pub(crate) fn parse_agent(raw: Option<&str>) -> Result<Option<AgentName>, GatewayError> {
    match raw {
        None | Some("") => Ok(None),
        Some(name) => AgentName::parse(name).map(Some).map_err(|e| {
            GatewayError::BadRequest(match e {
                IdError::AgentNameTooLong { len, max } => format!(
                    "Invalid agent name '{}': names must be at most {max} bytes (got {len})",
                    shortened(name, 32)
                ),
                other => other.to_string(),
            })
        }),
    }
}

/// The first `keep` characters of a long value, for messages.
pub(crate) fn shortened(s: &str, keep: usize) -> String {
    if s.chars().count() <= keep {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(keep).collect::<String>())
    }
}

/// Validates a fact id taken from the path.
pub(crate) fn parse_fact_id(raw: &str) -> Result<FactId, GatewayError> {
    FactId::new(raw).map_err(|e| GatewayError::BadRequest(format!("Invalid fact id: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_follow_fastapi() {
        assert!(is_json_content_type(None));
        assert!(is_json_content_type(Some("application/json")));
        assert!(is_json_content_type(Some(
            "Application/JSON; charset=utf-8"
        )));
        assert!(is_json_content_type(Some("application/merge-patch+json")));
        assert!(!is_json_content_type(Some("text/plain")));
        assert!(!is_json_content_type(Some(
            "application/x-www-form-urlencoded"
        )));
    }

    #[test]
    fn error_offsets_count_code_points() {
        assert_eq!(error_offset("{\n  x", 2, 3), 4);
        assert_eq!(error_offset("{x", 1, 2), 1);
        assert_eq!(error_offset("[\"é\", x", 1, 8), 6);
    }

    #[test]
    fn nesting_is_parsed_up_to_127_levels() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(decode_json(nested(127).as_bytes()).is_ok());
        assert!(matches!(
            decode_json(nested(128).as_bytes()),
            Err(GatewayError::BadRequest(d)) if d == BODY_PARSE_ERROR_DETAIL
        ));
    }

    #[test]
    fn agent_parameter_validation() {
        assert_eq!(parse_agent(None).unwrap(), None);
        assert_eq!(parse_agent(Some("")).unwrap(), None);
        assert_eq!(
            parse_agent(Some("Coder")).unwrap().unwrap().as_str(),
            "coder"
        );
        assert!(
            parse_agent(Some("__default__"))
                .unwrap()
                .unwrap()
                .is_default()
        );
        for bad in ["../x", "a/b", "a\0", "a_b", "agent\n"] {
            assert!(
                matches!(parse_agent(Some(bad)), Err(GatewayError::BadRequest(_))),
                "{bad:?}"
            );
        }
        assert!(parse_fact_id("fact_ok-1").is_ok());
        for bad in ["../etc", "a.b", "x\0", &"a".repeat(500)] {
            assert!(matches!(
                parse_fact_id(bad),
                Err(GatewayError::BadRequest(_))
            ));
        }
    }
}
