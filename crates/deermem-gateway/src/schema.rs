//! The wire types of the gateway and the validation of its requests.
//!
//! Requests are validated as pydantic would, with the field readers of
//! [`deermem_pycompat::lax::model`] (lax coercions, constraints, every error item at once):
//! fact create and patch bodies, the import document (the `MemoryResponse` shape), the
//! conversation-turn body, and the query parameters. The validated bodies and every response
//! body are typed here (or in `deermem_core`), and their `JsonSchema` derivations are the
//! component schemas of `/openapi.json` (see [`crate::openapi`]).

use deermem_core::document::{HISTORY_SECTION_KEYS, USER_SECTION_KEYS};
use deermem_core::fact::{DEFAULT_CATEGORY, FactSource, PublicFact};
use deermem_core::ports::{BackendFailure, MemoryScope, SearchRequest};
use deermem_core::search::MatchType;
use deermem_core::{CacheBound, MemoryMode, Message, PublicMemoryDocument};
use deermem_pycompat::lax::model::Presence::{Blank, Defaulted, Nullable, Required};
use deermem_pycompat::lax::model::{Checker, Field};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{GatewayError, ValidationItem};
use crate::extract::{QueryParams, shortened};

/// The longest accepted `thread_id`, in characters.
pub(crate) const MAX_THREAD_ID_CHARS: usize = 512;
/// The longest accepted `trace_id` / `run_id`, in characters.
pub(crate) const MAX_TRACE_ID_CHARS: usize = 256;
/// The largest accepted `top_k`.
pub(crate) const MAX_TOP_K: i64 = 100;

/// The confidence of a created fact when the body has none.
const DEFAULT_CONFIDENCE: f64 = 0.5;

fn default_category() -> String {
    DEFAULT_CATEGORY.to_owned()
}

fn default_confidence() -> f64 {
    DEFAULT_CONFIDENCE
}

/// `POST /api/memory/facts`: `{content (min 1 char), category = "context", confidence = 0.5
/// in [0, 1]}`.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(rename = "FactCreateRequest")]
pub(crate) struct FactCreateBody {
    /// The fact text (whitespace-only content is refused by the manager with a 400).
    #[schemars(length(min = 1))]
    pub(crate) content: String,
    /// The category; a non-core one is stored as `other` plus `categoryExtension`.
    #[schemars(default = "default_category")]
    pub(crate) category: String,
    /// Confidence in [0, 1].
    #[schemars(default = "default_confidence", range(min = 0.0, max = 1.0))]
    pub(crate) confidence: f64,
}

pub(crate) fn fact_create(body: &Value) -> Result<FactCreateBody, GatewayError> {
    let (mut c, m) = Checker::body(body)?;
    let content = c.field(m, "content", Required, |c, v| c.chars(v, 1, usize::MAX));
    let category = c.field(m, "category", Defaulted, Checker::string);
    let confidence = c.field(m, "confidence", Defaulted, unit_float);
    Ok(c.finish(content.map(|content| FactCreateBody {
        content,
        category: category.unwrap_or_else(default_category),
        confidence: confidence.unwrap_or(DEFAULT_CONFIDENCE),
    }))?)
}

/// A float in [0, 1] (`nan` and the infinities fail the bounds, as in pydantic).
fn unit_float(c: &mut Checker, v: &Value) -> Option<f64> {
    c.float_in(v, Some(0.0), Some(1.0))
}

/// `PATCH /api/memory/facts/{id}`: every field optional; `null` or absent keeps the value.
#[derive(Clone, Debug, Default, PartialEq, JsonSchema)]
#[schemars(rename = "FactPatchRequest")]
pub(crate) struct FactPatchBody {
    /// New fact text.
    #[schemars(length(min = 1))]
    pub(crate) content: Option<String>,
    /// New category.
    pub(crate) category: Option<String>,
    /// New confidence in [0, 1].
    #[schemars(range(min = 0.0, max = 1.0))]
    pub(crate) confidence: Option<f64>,
}

pub(crate) fn fact_patch(body: &Value) -> Result<FactPatchBody, GatewayError> {
    let (mut c, m) = Checker::body(body)?;
    let content = c.field(m, "content", Nullable, |c, v| c.chars(v, 1, usize::MAX));
    let category = c.field(m, "category", Nullable, Checker::string);
    let confidence = c.field(m, "confidence", Nullable, unit_float);
    Ok(c.finish(Some(FactPatchBody {
        content,
        category,
        confidence,
    }))?)
}

/// The public `source` of a fact whose source says nothing.
const UNKNOWN_SOURCE: &str = "unknown";

/// The only fact status storage keeps (a deleted fact has no file).
const ACTIVE_STATUS: &str = "active";

/// A string.
fn text(c: &mut Checker, v: &Value) -> Option<Value> {
    c.string(v).map(Value::from)
}

/// A list of strings.
fn texts(c: &mut Checker, v: &Value) -> Option<Value> {
    c.strings(v).map(Value::from)
}

/// A revision or schema version: an integer >= 0.
fn unsigned(c: &mut Checker, v: &Value) -> Option<Value> {
    c.int_in(v, Some(0), None).map(Value::from)
}

/// A finite confidence; out of range is clamped into [0, 1], as the reference's import does.
fn clamped(c: &mut Checker, v: &Value) -> Option<Value> {
    c.finite(v).map(|f| Value::from(f.clamp(0.0, 1.0)))
}

/// The reference's model forces `source` to its public string form: a string is kept, an
/// object is projected, anything else (`null`, a number, a list) becomes "unknown".
fn source(c: &mut Checker, v: &Value) -> Option<Value> {
    match v {
        Value::String(_) => Some(v.clone()),
        Value::Object(_) => c
            .valid(FactSource::from_value(v), v)
            .map(|s| s.to_public_string().into()),
        _ => Some(UNKNOWN_SOURCE.into()),
    }
}

/// `scope`: a dictionary of strings (or `null`s).
fn scope(c: &mut Checker, v: &Value) -> Option<Value> {
    let mut out = Map::new();
    for (k, x) in c.dict(v)? {
        if x.is_null() || c.at(k.as_str(), |c| c.string(x)).is_some() {
            out.insert(k.clone(), x.clone());
        }
    }
    Some(Value::Object(out))
}

/// The fields of an imported fact: only the reference's HTTP fields (the manager-level ones,
/// `title`, `confirmationCount`..., are dropped). A blank or absent id is generated by the
/// manager, as the reference's import does.
const FACT: [Field; 16] = [
    ("id", Defaulted, text),
    ("content", Required, text),
    ("category", Defaulted, text),
    ("createdAt", Defaulted, text),
    ("categoryExtension", Nullable, text),
    ("sourceError", Nullable, text),
    ("status", Nullable, text),
    ("updatedAt", Nullable, text),
    ("consolidatedAt", Nullable, text),
    ("topics", Nullable, texts),
    ("consolidatedFrom", Nullable, texts),
    ("confidence", Defaulted, clamped),
    ("schemaVersion", Nullable, unsigned),
    ("revision", Nullable, unsigned),
    ("source", Defaulted, source),
    ("scope", Nullable, scope),
];

/// A summary entry.
const ENTRY: [Field; 2] = [("summary", Defaulted, text), ("updatedAt", Defaulted, text)];

/// The import document.
const DOCUMENT: [Field; 6] = [
    ("version", Defaulted, text),
    ("lastUpdated", Defaulted, text),
    ("revision", Nullable, unsigned),
    ("user", Defaulted, |c, v| section(c, v, &USER_SECTION_KEYS)),
    ("history", Defaulted, |c, v| {
        section(c, v, &HISTORY_SECTION_KEYS)
    }),
    ("facts", Defaulted, |c, v| {
        c.each(v, |c, f| c.model(f, &FACT)).map(Value::from)
    }),
];

/// A summary section (`user`, `history`): its entries.
fn section(c: &mut Checker, v: &Value, keys: &[&'static str]) -> Option<Value> {
    let entry: fn(&mut Checker, &Value) -> Option<Value> = |c, v| c.model(v, &ENTRY);
    let fields: Vec<Field> = keys.iter().map(|&key| (key, Defaulted, entry)).collect();
    c.model(v, &fields)
}

/// Storage keeps active facts only, so a fact with another `status` cannot be imported as it
/// is: a 400 naming the fact (the reference fails with a 500 there).
fn check_statuses(doc: &PublicMemoryDocument) -> Result<(), GatewayError> {
    for (i, fact) in doc.facts.iter().enumerate() {
        if let Some(status) = fact.status.as_deref()
            && status != ACTIVE_STATUS
        {
            return Err(GatewayError::BadRequest(format!(
                "Invalid memory data: facts[{i}] ('{}') has status '{}'; only active facts can \
                 be imported (leave status out or set it to \"active\").",
                shortened(&fact.id, 64),
                shortened(status, 64)
            )));
        }
    }
    Ok(())
}

/// `POST /api/memory/import`: the `MemoryResponse` shape. Unknown keys are dropped, `null`
/// optional fields are removed, `source` objects are projected to their string form (other
/// non-strings become `unknown`), a finite confidence is clamped into [0, 1], and each fact
/// needs `content` (a blank or absent `id` is generated); a fact whose `status` is not `active` is a 400.
pub(crate) fn import_document(body: &Value) -> Result<PublicMemoryDocument, GatewayError> {
    let (mut c, m) = Checker::body(body)?;
    let doc = c.fields(m, &DOCUMENT);
    c.finish(Some(()))?;
    let doc = serde_json::from_value(Value::Object(doc)).map_err(|e| {
        let item = ValidationItem::new(
            "value_error",
            vec!["body".into()],
            format!("Value error, {e}"),
        );
        GatewayError::validation(item)
    })?;
    check_statuses(&doc)?;
    Ok(doc)
}

/// `POST /api/memory/messages`: one conversation turn to remember.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(rename = "MessagesRequest")]
pub(crate) struct MessagesBody {
    /// The conversation (no control characters).
    #[schemars(length(min = 1, max = MAX_THREAD_ID_CHARS))]
    pub(crate) thread_id: String,
    /// The agent bucket; must equal the `agent` query parameter when both are given.
    pub(crate) agent: Option<String>,
    /// The turn's messages.
    pub(crate) messages: Vec<Message>,
    /// A trace id for the logs (no control characters).
    #[schemars(length(max = MAX_TRACE_ID_CHARS))]
    pub(crate) trace_id: Option<String>,
}

/// `GET /api/memory/config`: the `memory:` section, secrets in `backend_config` redacted.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub(crate) struct MemoryConfigResponse {
    /// `memory.enabled`.
    pub(crate) enabled: bool,
    /// `memory.mode`.
    pub(crate) mode: MemoryMode,
    /// `memory.injection_enabled`.
    pub(crate) injection_enabled: bool,
    /// `memory.shutdown_flush_timeout_seconds`.
    pub(crate) shutdown_flush_timeout_seconds: f64,
    /// `memory.manager_class`.
    pub(crate) manager_class: String,
    /// `memory.backend_config` with secret values replaced by `"***"`.
    #[schemars(with = "Map<String, Value>")]
    pub(crate) backend_config: Value,
}

/// `GET /api/memory/status`: the configuration plus the caller's document.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub(crate) struct MemoryStatusResponse {
    /// As `GET /api/memory/config`.
    pub(crate) config: MemoryConfigResponse,
    /// As `GET /api/memory`.
    pub(crate) data: PublicMemoryDocument,
    /// The memory backend's last failure reaching its server, when it had one (an extension;
    /// absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<BackendFailureView>")]
    pub(crate) last_backend_failure: Option<BackendFailure>,
    /// The bounds of the serving process's in-memory caches and tables (an extension; absent
    /// for a backend that keeps none in this process, such as a remote server's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<CacheBoundView>")]
    pub(crate) caches: Vec<CacheBound>,
}

/// The one status of [`Accepted`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AcceptedStatus {
    /// The turn was queued.
    #[default]
    Accepted,
}

/// `POST /api/memory/messages` (202): the turn was queued for extraction.
// Its one value is the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, JsonSchema)]
pub(crate) struct Accepted {
    /// Always `accepted`.
    pub(crate) status: AcceptedStatus,
}

/// `GET /api/memory/context`.
// The default is the answer when nothing is injected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, JsonSchema)]
pub(crate) struct ContextResponse {
    /// The exact block, `<memory>` wrapper included; empty when nothing is injected.
    pub(crate) context: String,
    /// SHA-256 (hex) of `context`; `null` when nothing is injected.
    pub(crate) content_sha256: Option<String>,
}

/// One search result: the fact in its HTTP shape plus its ranking.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub(crate) struct SearchHit {
    /// The fact.
    #[serde(flatten)]
    pub(crate) fact: PublicFact,
    /// The backend's relevance score (higher is better), when it has one.
    pub(crate) score: Option<f64>,
    /// How the fact matched.
    #[serde(rename = "matchType")]
    pub(crate) match_type: MatchType,
}

/// `GET /api/memory/search`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub(crate) struct SearchResponse {
    /// Best first.
    pub(crate) results: Vec<SearchHit>,
    /// `results.len()`.
    pub(crate) count: usize,
}

/// The outcome of an index rebuild.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RebuildStatus {
    /// The backend rebuilt its derived data.
    Ok,
    /// The backend has nothing to rebuild.
    NothingToWarm,
}

/// `POST /api/memory/index/rebuild`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub(crate) struct RebuildResponse {
    /// What happened.
    pub(crate) status: RebuildStatus,
    /// `true` after a rebuild, `null` when there was nothing to rebuild.
    pub(crate) warmed: Option<bool>,
}

/// The state `GET /healthz` and `GET /readyz` report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HealthStatus {
    /// `/healthz`: the process is up.
    Ok,
    /// `/readyz`: serving.
    Ready,
    /// `/readyz` (503): starting up.
    Starting,
    /// `/readyz` (503): shutting down.
    Stopping,
    /// `/readyz` (503): the memory storage cannot be reached (a database down).
    Unavailable,
}

/// `GET /healthz`, `GET /readyz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub(crate) struct Health {
    /// The state.
    pub(crate) status: HealthStatus,
    /// `/readyz`: the memory backend's last failure reaching its server, when it had one
    /// (absent otherwise). Readiness does not depend on it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<BackendFailureView>")]
    pub(crate) last_backend_failure: Option<BackendFailure>,
}

pub(crate) use shapes::*;

/// The types that exist only for the document and are never built: how `deermem_core`'s
/// `CacheBound` and `BackendFailure` serialise themselves, the error bodies (written as
/// `{"detail": ...}` by [`GatewayError`]'s response and by the layers), and the parameters (the
/// handlers read them with [`QueryParams`] and check them by hand, with pydantic's error items;
/// these types state the grammar those checks enforce).
#[allow(dead_code)]
mod shapes {
    use super::*;

    /// What a cache's `bound` and `current` count.
    #[derive(JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub(crate) enum CacheUnitView {
        /// Entries (scopes, texts, users...).
        Entries,
        /// Bytes.
        Bytes,
    }

    /// One in-memory cache of the serving process and its bound.
    #[derive(JsonSchema)]
    pub(crate) struct CacheBoundView {
        /// A stable name, `component.cache` (e.g. `file_storage.scopes`).
        pub(crate) name: String,
        /// The most it holds, in `unit`, from the configured value; `null` only when the operator
        /// configured it unbounded (`watermark_max_keys: 0`).
        pub(crate) bound: Option<u64>,
        /// What `bound` and `current` count.
        pub(crate) unit: CacheUnitView,
        /// What it holds now, when cheaply known; `null` otherwise.
        pub(crate) current: Option<u64>,
    }

    /// The last failure a remote memory backend had reaching its server (a read answered with
    /// empty memory under its fail-open policy, a capture that failed in the background...).
    #[derive(JsonSchema)]
    pub(crate) struct BackendFailureView {
        /// What failed: `recall`, `search` or `capture`.
        pub(crate) operation: String,
        /// The backend's error, with the server's code and message (never a credential or a URL).
        pub(crate) message: String,
        /// When it happened (ISO 8601, UTC).
        pub(crate) at: String,
        /// How many failures the backend has had since it started.
        pub(crate) count: u64,
    }

    /// Every error body but validation: `{"detail": "<message>"}`.
    ///
    /// Written by [`GatewayError`]'s response and by the router-error normaliser in `layers.rs`
    /// as `{"detail": ...}`; this type names the shape for the document, and the conformance
    /// tests check every error response against it.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
    #[schemars(rename = "HTTPError")]
    pub(crate) struct HttpError {
        /// The message (for 500s a fixed text; the private cause is only logged).
        pub(crate) detail: String,
    }

    /// DeerFlow's 401 detail in `auth.mode: deerflow_session`.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
    pub(crate) struct SessionErrorDetail {
        /// `not_authenticated`, `token_expired` or `token_invalid`.
        pub(crate) code: String,
        /// `Authentication required`, `Token error: expired`, `Token error: invalid_signature`,
        /// `Token error: malformed` or `Invalid bearer token`.
        pub(crate) message: String,
    }

    /// A 401 body in `auth.mode: deerflow_session`: `{"detail": {"code", "message"}}`.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
    pub(crate) struct SessionError {
        /// What was wrong with the session.
        pub(crate) detail: SessionErrorDetail,
    }

    /// A 401 body: `{"detail": "<message>"}`, or DeerFlow's object in `deerflow_session` mode.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
    #[serde(untagged)]
    #[schemars(rename = "HTTPUnauthorized")]
    pub(crate) enum Unauthorized {
        /// Bearer or internal tokens.
        Message(HttpError),
        /// DeerFlow's session cookie.
        Session(SessionError),
    }

    /// A 422 body: `{"detail": [validation item, ...]}`, every problem at once.
    #[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
    #[schemars(rename = "HTTPValidationError")]
    pub(crate) struct HttpValidationError {
        /// The problems.
        pub(crate) detail: Vec<ValidationItem>,
    }

    /// `agent`, the query parameter of every memory route.
    #[derive(JsonSchema)]
    pub(crate) struct AgentQuery {
        /// Agent bucket (^[A-Za-z0-9-]+$, case-insensitive, or __default__). Absent: the default bucket.
        agent: Option<String>,
    }

    /// `{fact_id}`.
    #[derive(JsonSchema)]
    pub(crate) struct FactIdPath {
        /// Fact id: [A-Za-z0-9_-]+, at most 200 bytes.
        #[schemars(regex(pattern = r"^[A-Za-z0-9_-]+$"), length(max = 200))]
        fact_id: String,
    }

    /// The query of `GET /api/memory/context`.
    #[derive(JsonSchema)]
    pub(crate) struct ContextQuery {
        /// The thread the block is for.
        #[schemars(length(max = MAX_THREAD_ID_CHARS))]
        thread_id: Option<String>,
        /// The run (needs thread_id).
        #[schemars(length(max = MAX_TRACE_ID_CHARS))]
        run_id: Option<String>,
    }

    /// The query of `GET /api/memory/search`.
    #[derive(JsonSchema)]
    pub(crate) struct SearchQuery {
        /// Query text.
        q: String,
        /// Result cap.
        #[schemars(range(min = 1, max = MAX_TOP_K), extend("default" = 5))]
        top_k: Option<i64>,
        /// Only this category (applied before the cap).
        category: Option<String>,
        /// How to rank: `bm25` (words), `vector` (meaning) or `hybrid` (both: reciprocal rank
        /// fusion where a decisive word match stays first and words re-rank meaning's shortlist). Unset or empty takes the configured `search.mode`. The vector modes need
        /// an embedder (`backend_config.embedding`, 400 otherwise); the remote backends rank on
        /// their own server and accept only `hybrid`.
        #[schemars(extend("enum" = ["bm25", "vector", "hybrid"]))]
        mode: Option<String>,
    }

    /// `{thread_id}` and `{run_id}` of the run-events route.
    #[derive(JsonSchema)]
    pub(crate) struct RunPath {
        /// The thread: 1-256 characters of [A-Za-z0-9._:@+=~-].
        #[schemars(regex(pattern = r"^[A-Za-z0-9._:@+=~-]+$"), length(max = 256))]
        thread_id: String,
        /// The run: 1-256 characters of [A-Za-z0-9._:@+=~-].
        #[schemars(regex(pattern = r"^[A-Za-z0-9._:@+=~-]+$"), length(max = 256))]
        run_id: String,
    }

    /// The query of the run-events route.
    #[derive(JsonSchema)]
    pub(crate) struct EventsQuery {
        /// Comma-separated event types to keep (e.g. context:memory).
        event_types: Option<String>,
        /// At most this many events, oldest first.
        #[schemars(range(min = 1, max = 2000), extend("default" = 500))]
        limit: Option<i64>,
        /// Only events with a larger seq.
        #[schemars(range(min = 1))]
        after_seq: Option<i64>,
    }
}

/// An identifier of at most `max` characters (at least `min`) without control characters.
fn id_text(c: &mut Checker, v: &Value, key: &str, min: usize, max: usize) -> Option<String> {
    let s = c.chars(v, min, max)?;
    let msg = format!("{key} must not contain control characters");
    c.check(s, |s| !s.chars().any(char::is_control), &msg)
}

pub(crate) fn messages_body(body: &Value) -> Result<MessagesBody, GatewayError> {
    let (mut c, m) = Checker::body(body)?;
    let thread_id = c.field(m, "thread_id", Required, |c, v| {
        id_text(c, v, "thread_id", 1, MAX_THREAD_ID_CHARS)
    });
    let agent = c.field(m, "agent", Nullable, Checker::string);
    let trace_id = c.field(m, "trace_id", Nullable, |c, v| {
        let t = c.chars(v, 0, MAX_TRACE_ID_CHARS)?;
        let printable = |t: &str| t.chars().all(|ch| ch.is_ascii_graphic() || ch == ' ');
        c.check(t, printable, "trace_id must be printable ASCII")
    });
    let messages = c.field(m, "messages", Required, |c, v| {
        c.each(v, Checker::serde::<Message>)
    });
    Ok(c.finish(
        thread_id
            .zip(messages)
            .map(|(thread_id, messages)| MessagesBody {
                thread_id,
                agent,
                messages,
                trace_id,
            }),
    )?)
}

/// `GET /api/memory/search`: `q` (required), `top_k` (1–100, default 5), `category`, `mode`
/// (`bm25`, `vector` or `hybrid`; empty means unset). The scope is left for the caller to set.
pub(crate) fn search_request(q: &QueryParams) -> Result<SearchRequest, GatewayError> {
    let (mut c, m) = (Checker::query(), q.to_map());
    let query = c.field(&m, "q", Required, Checker::string);
    let top_k = c.field(&m, "top_k", Defaulted, |c, v| {
        c.int_in(v, Some(1), Some(MAX_TOP_K))
    });
    let category = c.field(&m, "category", Blank, Checker::string);
    let mode = c.field(&m, "mode", Blank, Checker::parse);
    Ok(c.finish(query.map(|query| SearchRequest {
        query,
        top_k: top_k.map_or(5, |n| usize::try_from(n).unwrap_or(5)),
        scope: MemoryScope::new(None, None),
        category,
        mode,
    }))?)
}

/// An optional integer query parameter from 1 to `max`; empty means absent.
pub(crate) fn positive_int_param(
    q: &QueryParams,
    key: &'static str,
    max: Option<i64>,
) -> Result<Option<u64>, GatewayError> {
    let mut c = Checker::query();
    let n = c.field(&q.to_map(), key, Blank, |c, v| c.int_in(v, Some(1), max));
    Ok(c.finish(Some(n.map(i64::unsigned_abs)))?)
}

/// Validates an optional identifier query parameter (`thread_id`, `run_id`): at most `max`
/// characters, no control characters; empty means absent.
pub(crate) fn id_param(
    q: &QueryParams,
    key: &'static str,
    max: usize,
) -> Result<Option<String>, GatewayError> {
    let mut c = Checker::query();
    let id = c.field(&q.to_map(), key, Blank, |c, v| id_text(c, v, key, 0, max));
    Ok(c.finish(Some(id))?)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn items(r: Result<impl std::fmt::Debug, GatewayError>) -> Vec<(String, Vec<Value>)> {
        match r {
            Err(GatewayError::Validation(items)) => items
                .into_iter()
                .map(|i| (i.kind.to_owned(), i.loc))
                .collect(),
            other => panic!("expected validation error, got {other:?}"),
        }
    }

    #[test]
    fn fact_create_defaults_and_errors() {
        let ok = fact_create(&json!({"content": "x"})).unwrap();
        assert_eq!(
            ok,
            FactCreateBody {
                content: "x".into(),
                category: "context".into(),
                confidence: 0.5
            }
        );
        let lax = fact_create(&json!({"content": "x", "confidence": "0.25"})).unwrap();
        assert_eq!(lax.confidence, 0.25);
        assert_eq!(
            items(fact_create(&json!({}))),
            vec![("missing".into(), vec![json!("body"), json!("content")])]
        );
        assert_eq!(
            items(fact_create(&json!({"content": ""})))[0].0,
            "string_too_short"
        );
        assert_eq!(
            items(fact_create(&json!({"content": 5})))[0].0,
            "string_type"
        );
        assert_eq!(
            items(fact_create(&json!({"content": "x", "confidence": 1.5})))[0].0,
            "less_than_equal"
        );
        assert_eq!(
            items(fact_create(&json!({"content": "x", "confidence": -0.1})))[0].0,
            "greater_than_equal"
        );
        // pydantic's float takes a boolean (`true` is 1.0).
        let from_bool = fact_create(&json!({"content": "x", "confidence": true})).unwrap();
        assert_eq!(from_bool.confidence, 1.0);
        assert_eq!(
            items(fact_create(&json!({"content": "x", "confidence": [1]})))[0].0,
            "float_type"
        );
        assert_eq!(
            items(fact_create(&json!({"content": "x", "confidence": "abc"})))[0].0,
            "float_parsing"
        );
        assert_eq!(
            items(fact_create(&json!({"content": "x", "category": null})))[0].0,
            "string_type"
        );
        assert_eq!(
            items(fact_create(&json!([1])))[0].0,
            "model_attributes_type"
        );
        // Every problem is reported at once.
        assert_eq!(
            items(fact_create(&json!({"category": 1, "confidence": 9}))).len(),
            3
        );
    }

    #[test]
    fn fact_patch_keeps_omitted_and_null_fields() {
        assert_eq!(fact_patch(&json!({})).unwrap(), FactPatchBody::default());
        let p =
            fact_patch(&json!({"content": "new", "category": null, "confidence": null})).unwrap();
        assert_eq!(
            p,
            FactPatchBody {
                content: Some("new".into()),
                ..FactPatchBody::default()
            }
        );
        assert_eq!(
            items(fact_patch(&json!({"content": ""})))[0].0,
            "string_too_short"
        );
        assert_eq!(
            items(fact_patch(&json!({"confidence": 2})))[0].0,
            "less_than_equal"
        );
    }

    #[test]
    fn import_document_normalises_like_the_reference_model() {
        let doc = import_document(&json!({
            "version": "2.0", "revision": 4, "lastUpdated": "t", "bogus": 1,
            "user": {"workContext": {"summary": "Rust", "updatedAt": "u", "extra": 1}},
            "facts": [
                {"id": "fact_a", "content": "A", "source": {"type": "conversation", "threadId": "th-1"},
                 "sourceError": null, "title": "dropped", "confirmationCount": 3, "scope": {"userId": "u", "agentName": null}},
                {"id": "fact_b", "content": "B", "source": "manual", "confidence": "0.9", "revision": 2}
            ]
        }))
        .unwrap();
        assert_eq!(doc.version, "2.0");
        assert_eq!(doc.revision, Some(4));
        assert_eq!(doc.user.work_context.summary, "Rust");
        assert_eq!(doc.facts[0].source, "th-1");
        assert_eq!(doc.facts[0].title, None);
        assert_eq!(doc.facts[0].confirmation_count, None);
        assert_eq!(doc.facts[0].source_error, None);
        assert_eq!(doc.facts[1].confidence, 0.9);
        assert_eq!(doc.facts[1].revision, Some(2));
        let errs = items(import_document(
            &json!({"facts": [{"content": "no id"}, {"id": "x"}, 5]}),
        ));
        assert_eq!(
            errs,
            vec![
                // A fact without an id is accepted: the import generates one.
                (
                    "missing".into(),
                    vec![json!("body"), json!("facts"), json!(1), json!("content")]
                ),
                (
                    "model_attributes_type".into(),
                    vec![json!("body"), json!("facts"), json!(2)]
                ),
            ]
        );
        assert_eq!(
            items(import_document(&json!({"facts": {}})))[0].0,
            "list_type"
        );
        assert_eq!(
            items(import_document(&json!({"revision": -1})))[0].0,
            "greater_than_equal"
        );
        assert_eq!(
            items(import_document(
                &json!({"facts": [{"id": "a", "content": "b", "topics": [1]}]})
            ))[0]
                .1,
            vec![
                json!("body"),
                json!("facts"),
                json!(0),
                json!("topics"),
                json!(0)
            ]
        );
    }

    #[test]
    fn messages_body_accepts_every_message_spelling() {
        let b = messages_body(&json!({"thread_id": "t1", "agent": "coder", "messages": [
            {"role": "user", "content": "hi"},
            {"type": "ai", "content": "hello"},
            {"type": "human", "data": {"content": "dumped"}}
        ]}))
        .unwrap();
        assert_eq!(b.messages.len(), 3);
        assert_eq!(b.agent.as_deref(), Some("coder"));
        let errs = items(messages_body(
            &json!({"thread_id": "", "messages": [{"content": "no role"}]}),
        ));
        assert_eq!(errs[0].0, "string_too_short");
        assert_eq!(
            errs[1],
            (
                "value_error".into(),
                vec![json!("body"), json!("messages"), json!(0)]
            )
        );
        assert_eq!(
            items(messages_body(&json!({"thread_id": "a\nb", "messages": []})))[0].0,
            "value_error"
        );
        assert_eq!(
            items(messages_body(&json!({"thread_id": "t"})))[0].0,
            "missing"
        );
        assert_eq!(
            items(messages_body(
                &json!({"thread_id": "t", "messages": [], "trace_id": "\u{7}"})
            ))[0]
                .0,
            "value_error"
        );
    }
}
