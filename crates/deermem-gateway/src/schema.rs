//! The wire types of the gateway and the validation of its requests.
//!
//! Requests are validated by hand with pydantic's lax rules ([`deermem_pycompat::lax`]) and
//! error items (`type`, `loc`, `msg`): fact create and patch bodies, the import document (the `MemoryResponse`
//! shape), the conversation-turn body, and the search query. The validated bodies and every
//! response body are typed here (or in `deermem_core`), and their `JsonSchema` derivations are
//! the component schemas of `/openapi.json` (see [`crate::openapi`]).

use deermem_core::fact::{DEFAULT_CATEGORY, FactSource, PublicFact};
use deermem_core::ports::BackendFailure;
use deermem_core::search::MatchType;
use deermem_core::{CacheBound, MemoryMode, Message, PublicMemoryDocument};
use deermem_pycompat::lax::{self, LaxError};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::{GatewayError, ValidationItem};
use crate::extract::{QueryParams, shortened};

/// The longest accepted `thread_id`, in characters.
pub(crate) const MAX_THREAD_ID_CHARS: usize = 512;
/// The longest accepted `trace_id` / `run_id`, in characters.
pub(crate) const MAX_TRACE_ID_CHARS: usize = 256;
/// The largest accepted `top_k`.
pub(crate) const MAX_TOP_K: i64 = 100;

/// pydantic's item for a model (a request body) given something other than an object.
pub(crate) fn not_a_model(loc: Vec<Value>, input: &Value) -> ValidationItem {
    let msg = "Input should be a valid dictionary or object to extract fields from";
    ValidationItem::new("model_attributes_type", loc, msg).with_input(input)
}

/// Collects validation problems, pydantic style, so one response lists them all.
#[derive(Debug, Default)]
struct Checker {
    errors: Vec<ValidationItem>,
}

fn at(base: &[Value], key: impl Into<Value>) -> Vec<Value> {
    let mut l = base.to_vec();
    l.push(key.into());
    l
}

impl Checker {
    fn push(&mut self, item: ValidationItem) {
        self.errors.push(item);
    }

    /// A checker for a request body, which must be an object, and the object.
    fn body(body: &Value) -> Result<(Self, &Map<String, Value>), GatewayError> {
        let mut c = Self::default();
        match c.model(body, vec![json!("body")]) {
            Some(m) => Ok((c, m)),
            None => Err(GatewayError::Validation(c.errors)),
        }
    }

    fn finish<T>(self, value: T) -> Result<T, GatewayError> {
        self.finish_some(Some(value))
    }

    /// The value when every field was valid (`None` when a required one was not).
    fn finish_some<T>(self, value: Option<T>) -> Result<T, GatewayError> {
        match value {
            Some(v) if self.errors.is_empty() => Ok(v),
            _ => Err(GatewayError::Validation(self.errors)),
        }
    }

    /// Records a problem with `input` at `loc`; `None`, for the caller to return.
    fn fail<T>(
        &mut self,
        kind: &'static str,
        loc: Vec<Value>,
        msg: impl Into<String>,
        input: &Value,
    ) -> Option<T> {
        self.push(ValidationItem::new(kind, loc, msg).with_input(input));
        None
    }

    /// A pydantic `value_error` (the message gets its `Value error, ` prefix).
    fn value_error(&mut self, loc: Vec<Value>, msg: impl std::fmt::Display, input: &Value) {
        let msg = format!("Value error, {msg}");
        self.push(ValidationItem::new("value_error", loc, msg).with_input(input));
    }

    /// The body (or a nested model) as an object.
    fn model<'a>(&mut self, v: &'a Value, loc: Vec<Value>) -> Option<&'a Map<String, Value>> {
        match v {
            Value::Object(m) => Some(m),
            other => {
                self.push(not_a_model(loc, other));
                None
            }
        }
    }

    fn missing(&mut self, loc: Vec<Value>, parent: &Map<String, Value>) {
        self.push(
            ValidationItem::new("missing", loc, "Field required")
                .with_input(&Value::Object(parent.clone())),
        );
    }

    /// A coercion's result: the value, or its error recorded (with the constraint's `ctx`).
    fn lax<T>(
        &mut self,
        r: Result<T, LaxError>,
        loc: Vec<Value>,
        input: &Value,
        ctx: Option<Value>,
    ) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let item = ValidationItem::new(e.kind, loc, e.message).with_input(input);
                self.push(match ctx {
                    Some(ctx) => item.with_ctx(ctx),
                    None => item,
                });
                None
            }
        }
    }

    fn string(&mut self, v: &Value, loc: Vec<Value>) -> Option<String> {
        self.lax(lax::string(v).map(str::to_owned), loc, v, None)
    }

    /// A required string field.
    fn required_str(
        &mut self,
        m: &Map<String, Value>,
        key: &str,
        base: &[Value],
    ) -> Option<String> {
        match m.get(key) {
            None => {
                self.missing(at(base, key), m);
                None
            }
            Some(v) => self.string(v, at(base, key)),
        }
    }

    /// A string field with a default (`null` is an error, as for a non-optional pydantic
    /// field).
    fn str_or(
        &mut self,
        m: &Map<String, Value>,
        key: &str,
        base: &[Value],
        default: &str,
    ) -> Option<String> {
        match m.get(key) {
            None => Some(default.to_owned()),
            Some(v) => self.string(v, at(base, key)),
        }
    }

    /// An optional string field (`null` and absent are `None`). The outer `Option` is `None`
    /// when the field is invalid.
    fn opt_str(
        &mut self,
        m: &Map<String, Value>,
        key: &str,
        base: &[Value],
    ) -> Option<Option<String>> {
        match m.get(key) {
            None | Some(Value::Null) => Some(None),
            Some(v) => self.string(v, at(base, key)).map(Some),
        }
    }

    /// A string of `min` to `max` characters, checked as pydantic does; whether it is.
    fn chars(&mut self, s: &str, min: usize, max: usize, loc: Vec<Value>) -> bool {
        let (r, ctx) = match lax::min_chars(s, min) {
            Ok(_) => (lax::max_chars(s, max), json!({ "max_length": max })),
            short => (short, json!({ "min_length": min })),
        };
        let ok = r.is_ok();
        if !ok {
            self.lax(r, loc, &Value::String(s.to_owned()), Some(ctx));
        }
        ok
    }

    /// A float (lax: numbers and numeric strings), finite.
    fn float(&mut self, v: &Value, loc: Vec<Value>) -> Option<f64> {
        let f = self.any_float(v, loc.clone())?;
        if f.is_finite() {
            Some(f)
        } else {
            self.fail("finite_number", loc, "Input should be a finite number", v)
        }
    }

    /// A float (lax: numbers, booleans and numeric strings, `"inf"` and `"nan"` included, as
    /// pydantic's float fields allow them).
    fn any_float(&mut self, v: &Value, loc: Vec<Value>) -> Option<f64> {
        self.lax(lax::float(v), loc, v, None)
    }

    /// `n` (read from `input`) within `[lo, hi]`, checked as pydantic does (`nan` fails the
    /// upper bound), with the failed bound as `ctx`.
    fn bounded<T: PartialOrd + std::fmt::Display + Copy + Serialize>(
        &mut self,
        n: T,
        lo: T,
        hi: Option<T>,
        loc: Vec<Value>,
        input: &Value,
    ) -> Option<T> {
        let r = lax::bounded(n, Some(lo), hi);
        let ctx = match &r {
            Err(e) if e.kind == "less_than_equal" => json!({ "le": hi }),
            _ => json!({ "ge": lo }),
        };
        self.lax(r, loc, input, Some(ctx))
    }

    /// A float constrained to `[0, 1]`.
    fn unit_float(&mut self, v: &Value, loc: Vec<Value>) -> Option<f64> {
        let f = self.any_float(v, loc.clone())?;
        self.bounded(f, 0.0, Some(1.0), loc, v)
    }

    /// An integer (lax: booleans, integral floats and integer strings) from `lo` to `hi`
    /// (when given).
    fn int(&mut self, v: &Value, loc: Vec<Value>, lo: i64, hi: Option<u64>) -> Option<u64> {
        let i = self.lax(lax::int(v), loc.clone(), v, None)?;
        let hi = hi.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
        self.bounded(i, lo, hi, loc, v).map(i64::unsigned_abs)
    }

    fn list<'a>(&mut self, v: &'a Value, loc: Vec<Value>) -> Option<&'a [Value]> {
        self.lax(lax::list(v), loc, v, None)
    }

    fn string_list(&mut self, v: &Value, loc: Vec<Value>) -> Option<Vec<String>> {
        let items = self.list(v, loc.clone())?;
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            match self.string(item, at(&loc, i)) {
                Some(s) => out.push(s),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn dict<'a>(&mut self, v: &'a Value, loc: Vec<Value>) -> Option<&'a Map<String, Value>> {
        match v {
            Value::Object(m) => Some(m),
            other => self.fail(
                "dict_type",
                loc,
                "Input should be a valid dictionary",
                other,
            ),
        }
    }
}

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
    let base = [json!("body")];
    let (mut c, m) = Checker::body(body)?;
    let content = c.required_str(m, "content", &base);
    if let Some(s) = &content {
        c.chars(s, 1, usize::MAX, at(&base, "content"));
    }
    let category = c.str_or(m, "category", &base, DEFAULT_CATEGORY);
    let confidence = match m.get("confidence") {
        None => Some(DEFAULT_CONFIDENCE),
        Some(v) => c.unit_float(v, at(&base, "confidence")),
    };
    let out = match (content, category, confidence) {
        (Some(content), Some(category), Some(confidence)) => Some(FactCreateBody {
            content,
            category,
            confidence,
        }),
        _ => None,
    };
    c.finish_some(out)
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
    let base = [json!("body")];
    let (mut c, m) = Checker::body(body)?;
    let content = c.opt_str(m, "content", &base).flatten();
    if let Some(s) = &content {
        c.chars(s, 1, usize::MAX, at(&base, "content"));
    }
    let category = c.opt_str(m, "category", &base).flatten();
    let confidence = match m.get("confidence") {
        None | Some(Value::Null) => None,
        Some(v) => c.unit_float(v, at(&base, "confidence")),
    };
    c.finish(FactPatchBody {
        content,
        category,
        confidence,
    })
}

/// The public `source` of a fact whose source says nothing.
const UNKNOWN_SOURCE: &str = "unknown";

/// The only fact status storage keeps (a deleted fact has no file).
const ACTIVE_STATUS: &str = "active";

fn summary_section(
    c: &mut Checker,
    v: &Value,
    loc: &[Value],
    keys: &[&str],
) -> Option<Map<String, Value>> {
    let m = c.model(v, loc.to_vec())?;
    let mut out = Map::new();
    for key in keys {
        let Some(child) = m.get(*key) else { continue };
        let cloc = at(loc, *key);
        let Some(cm) = c.model(child, cloc.clone()) else {
            continue;
        };
        let mut entry = Map::new();
        for field in ["summary", "updatedAt"] {
            if let Some(s) = c.str_or(cm, field, &cloc, "") {
                entry.insert(field.into(), Value::String(s));
            }
        }
        out.insert((*key).to_owned(), Value::Object(entry));
    }
    Some(out)
}

fn import_fact(c: &mut Checker, v: &Value, loc: &[Value]) -> Option<Value> {
    let m = c.model(v, loc.to_vec())?;
    let before = c.errors.len();
    let mut out = Map::new();
    // A blank or absent id is generated by the manager, as the reference's import does.
    if let Some(id) = c.str_or(m, "id", loc, "") {
        out.insert("id".into(), Value::String(id));
    }
    if let Some(content) = c.required_str(m, "content", loc) {
        out.insert("content".into(), Value::String(content));
    }
    for (key, default) in [("category", "context"), ("createdAt", "")] {
        if let Some(s) = c.str_or(m, key, loc, default) {
            out.insert(key.into(), Value::String(s));
        }
    }
    for key in [
        "categoryExtension",
        "sourceError",
        "status",
        "updatedAt",
        "consolidatedAt",
    ] {
        if let Some(Some(s)) = c.opt_str(m, key, loc) {
            out.insert(key.into(), Value::String(s));
        }
    }
    for key in ["topics", "consolidatedFrom"] {
        if let Some(v) = m.get(key).filter(|v| !v.is_null())
            && let Some(list) = c.string_list(v, at(loc, key))
        {
            out.insert(key.into(), Value::from(list));
        }
    }
    // Out of range is clamped into [0, 1], as the reference's import does.
    match m.get("confidence") {
        None => {}
        Some(v) => {
            if let Some(f) = c.float(v, at(loc, "confidence")) {
                out.insert("confidence".into(), json!(f.clamp(0.0, 1.0)));
            }
        }
    }
    for key in ["schemaVersion", "revision"] {
        if let Some(v) = m.get(key).filter(|v| !v.is_null())
            && let Some(u) = c.int(v, at(loc, key), 0, None)
        {
            out.insert(key.into(), json!(u));
        }
    }
    // The reference's model forces `source` to its public string form: a string is kept, an
    // object is projected, anything else (`null`, a number, a list) becomes "unknown".
    match m.get("source") {
        None => {}
        Some(Value::String(s)) => {
            out.insert("source".into(), Value::String(s.clone()));
        }
        Some(v @ Value::Object(_)) => match FactSource::from_value(v) {
            Ok(src) => {
                out.insert("source".into(), Value::String(src.to_public_string()));
            }
            Err(e) => c.value_error(at(loc, "source"), e, v),
        },
        Some(_) => {
            out.insert("source".into(), Value::String(UNKNOWN_SOURCE.into()));
        }
    }
    if let Some(v) = m.get("scope").filter(|v| !v.is_null()) {
        let sloc = at(loc, "scope");
        if let Some(sm) = c.dict(v, sloc.clone()) {
            let mut scope = Map::new();
            for (k, x) in sm {
                match x {
                    Value::Null | Value::String(_) => {
                        scope.insert(k.clone(), x.clone());
                    }
                    other => {
                        c.string(other, at(&sloc, k.as_str()));
                    }
                }
            }
            out.insert("scope".into(), Value::Object(scope));
        }
    }
    // Only the reference's HTTP fields were copied: the manager-level ones (`title`,
    // `confirmationCount`...) are dropped.
    (c.errors.len() == before).then_some(Value::Object(out))
}

/// Storage keeps active facts only, so a fact with another `status` cannot be imported as it
/// is: a 400 naming the fact (the reference fails with a 500 there).
fn check_statuses(doc: &Map<String, Value>) -> Result<(), GatewayError> {
    let facts = doc.get("facts").and_then(Value::as_array);
    for (i, fact) in facts.into_iter().flatten().enumerate() {
        if let Some(status) = fact.get("status").and_then(Value::as_str)
            && status != ACTIVE_STATUS
        {
            let id = fact.get("id").and_then(Value::as_str).unwrap_or("");
            return Err(GatewayError::BadRequest(format!(
                "Invalid memory data: facts[{i}] ('{}') has status '{}'; only active facts can \
                 be imported (leave status out or set it to \"active\").",
                shortened(id, 64),
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
    let base = [json!("body")];
    let (mut c, m) = Checker::body(body)?;
    let mut out = Map::new();
    for (key, default) in [("version", "1.0"), ("lastUpdated", "")] {
        if let Some(s) = c.str_or(m, key, &base, default) {
            out.insert(key.into(), Value::String(s));
        }
    }
    if let Some(v) = m.get("revision").filter(|v| !v.is_null())
        && let Some(u) = c.int(v, at(&base, "revision"), 0, None)
    {
        out.insert("revision".into(), json!(u));
    }
    let sections: [(&str, &[&str]); 2] = [
        ("user", &deermem_core::document::USER_SECTION_KEYS),
        ("history", &deermem_core::document::HISTORY_SECTION_KEYS),
    ];
    for (key, children) in sections {
        if let Some(v) = m.get(key)
            && let Some(section) = summary_section(&mut c, v, &at(&base, key), children)
        {
            out.insert(key.into(), Value::Object(section));
        }
    }
    if let Some(v) = m.get("facts") {
        let floc = at(&base, "facts");
        if let Some(items) = c.list(v, floc.clone()) {
            let facts: Vec<Value> = items
                .iter()
                .enumerate()
                .filter_map(|(i, f)| import_fact(&mut c, f, &at(&floc, i)))
                .collect();
            out.insert("facts".into(), Value::Array(facts));
        }
    }
    if !c.errors.is_empty() {
        return Err(GatewayError::Validation(c.errors));
    }
    check_statuses(&out)?;
    serde_json::from_value(Value::Object(out)).map_err(|e| {
        GatewayError::validation(ValidationItem::new(
            "value_error",
            base.to_vec(),
            format!("Value error, {e}"),
        ))
    })
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

// The views below describe how `deermem_core`'s `CacheBound` and `BackendFailure` serialise
// themselves, for the document only.

/// What a cache's `bound` and `current` count.
#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub(crate) enum CacheUnitView {
    /// Entries (scopes, texts, users...).
    Entries,
    /// Bytes.
    Bytes,
}

/// One in-memory cache of the serving process and its bound.
#[derive(JsonSchema)]
#[allow(dead_code)]
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

/// The one status of [`Accepted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AcceptedStatus {
    /// The turn was queued.
    Accepted,
}

/// `POST /api/memory/messages` (202): the turn was queued for extraction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub(crate) struct Accepted {
    /// Always `accepted`.
    pub(crate) status: AcceptedStatus,
}

impl Accepted {
    pub(crate) const BODY: Self = Self {
        status: AcceptedStatus::Accepted,
    };
}

/// `GET /api/memory/context`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
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

/// The last failure a remote memory backend had reaching its server (a read answered with
/// empty memory under its fail-open policy, a capture that failed in the background...).
#[derive(JsonSchema)]
#[allow(dead_code)]
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
#[allow(dead_code)]
pub(crate) struct HttpError {
    /// The message (for 500s a fixed text; the private cause is only logged).
    pub(crate) detail: String,
}

/// DeerFlow's 401 detail in `auth.mode: deerflow_session`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[allow(dead_code)]
pub(crate) struct SessionErrorDetail {
    /// `not_authenticated`, `token_expired` or `token_invalid`.
    pub(crate) code: String,
    /// `Authentication required`, `Token error: expired`, `Token error: invalid_signature`,
    /// `Token error: malformed` or `Invalid bearer token`.
    pub(crate) message: String,
}

/// A 401 body in `auth.mode: deerflow_session`: `{"detail": {"code", "message"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[allow(dead_code)]
pub(crate) struct SessionError {
    /// What was wrong with the session.
    pub(crate) detail: SessionErrorDetail,
}

/// A 401 body: `{"detail": "<message>"}`, or DeerFlow's object in `deerflow_session` mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "HTTPUnauthorized")]
#[allow(dead_code)]
pub(crate) enum Unauthorized {
    /// Bearer or internal tokens.
    Message(HttpError),
    /// DeerFlow's session cookie.
    Session(SessionError),
}

/// A 422 body: `{"detail": [validation item, ...]}`, every problem at once.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[schemars(rename = "HTTPValidationError")]
#[allow(dead_code)]
pub(crate) struct HttpValidationError {
    /// The problems.
    pub(crate) detail: Vec<ValidationItem>,
}

// ---------------------------------------------------------------------------------------------
// Parameters, for the document only: the handlers read them with [`QueryParams`] and check
// them by hand (pydantic's error items); these types state the grammar those checks enforce.

/// `agent`, the query parameter of every memory route.
#[derive(JsonSchema)]
#[allow(dead_code)]
pub(crate) struct AgentQuery {
    /// Agent bucket (^[A-Za-z0-9-]+$, case-insensitive, or __default__). Absent: the default bucket.
    agent: Option<String>,
}

/// `{fact_id}`.
#[derive(JsonSchema)]
#[allow(dead_code)]
pub(crate) struct FactIdPath {
    /// Fact id: [A-Za-z0-9_-]+, at most 200 bytes.
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]+$"), length(max = 200))]
    fact_id: String,
}

/// The query of `GET /api/memory/context`.
#[derive(JsonSchema)]
#[allow(dead_code)]
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
#[allow(dead_code)]
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
#[allow(dead_code)]
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
#[allow(dead_code)]
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

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

pub(crate) fn messages_body(body: &Value) -> Result<MessagesBody, GatewayError> {
    let base = [json!("body")];
    let (mut c, m) = Checker::body(body)?;
    let thread_id = c.required_str(m, "thread_id", &base);
    if let Some(t) = &thread_id {
        let loc = at(&base, "thread_id");
        if c.chars(t, 1, MAX_THREAD_ID_CHARS, loc.clone()) && has_control(t) {
            c.value_error(
                loc,
                "thread_id must not contain control characters",
                &Value::String(t.clone()),
            );
        }
    }
    let agent = c.opt_str(m, "agent", &base).flatten();
    let trace_id = c.opt_str(m, "trace_id", &base).flatten();
    if let Some(t) = &trace_id {
        let loc = at(&base, "trace_id");
        if c.chars(t, 0, MAX_TRACE_ID_CHARS, loc.clone())
            && !t.chars().all(|ch| ch.is_ascii_graphic() || ch == ' ')
        {
            c.value_error(
                loc,
                "trace_id must be printable ASCII",
                &Value::String(t.clone()),
            );
        }
    }
    let mut messages = Vec::new();
    match m.get("messages") {
        None => c.missing(at(&base, "messages"), m),
        Some(v) => {
            let mloc = at(&base, "messages");
            if let Some(items) = c.list(v, mloc.clone()) {
                for (i, item) in items.iter().enumerate() {
                    match serde_json::from_value::<Message>(item.clone()) {
                        Ok(msg) => messages.push(msg),
                        Err(e) => c.value_error(at(&mloc, i), e, item),
                    }
                }
            }
        }
    }
    c.finish_some(thread_id.map(|thread_id| MessagesBody {
        thread_id,
        agent,
        messages,
        trace_id,
    }))
}

/// `GET /api/memory/search`: `q` (required), `top_k` (1–100, default 5), `category`, `mode`
/// (`bm25`, `vector` or `hybrid`; empty means unset).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SearchParams {
    pub(crate) query: String,
    pub(crate) top_k: usize,
    pub(crate) category: Option<String>,
    pub(crate) mode: Option<deermem_core::SearchMode>,
}

pub(crate) fn search_params(q: &QueryParams) -> Result<SearchParams, GatewayError> {
    let mut c = Checker::default();
    let query = q.get("q").map(str::to_owned);
    if query.is_none() {
        c.push(
            ValidationItem::new(
                "missing",
                vec![json!("query"), json!("q")],
                "Field required",
            )
            .with_input(&Value::Null),
        );
    }
    let mut top_k = 5usize;
    if let Some(raw) = q.get("top_k") {
        let loc = vec![json!("query"), json!("top_k")];
        let v = Value::String(raw.to_owned());
        if let Some(n) = c.int(&v, loc, 1, Some(MAX_TOP_K.unsigned_abs())) {
            top_k = usize::try_from(n).unwrap_or(5);
        }
    }
    let category = q
        .get("category")
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let mut mode = None;
    if let Some(raw) = q.get("mode").filter(|s| !s.is_empty()) {
        match raw.parse::<deermem_core::SearchMode>() {
            Ok(m) => mode = Some(m),
            Err(e) => c.value_error(
                vec![json!("query"), json!("mode")],
                e,
                &Value::String(raw.to_owned()),
            ),
        }
    }
    c.finish_some(query.map(|query| SearchParams {
        query,
        top_k,
        category,
        mode,
    }))
}

/// An optional integer query parameter from 1 to `max`; empty means absent.
pub(crate) fn positive_int_param(
    q: &QueryParams,
    key: &'static str,
    max: Option<u64>,
) -> Result<Option<u64>, GatewayError> {
    let Some(raw) = q.get(key).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let mut c = Checker::default();
    let v = Value::String(raw.to_owned());
    let n = c.int(&v, vec![json!("query"), json!(key)], 1, max);
    c.finish(n)
}

/// Validates an optional identifier query parameter (`thread_id`, `run_id`): at most `max`
/// characters, no control characters; empty means absent.
pub(crate) fn id_param(
    q: &QueryParams,
    key: &'static str,
    max: usize,
) -> Result<Option<String>, GatewayError> {
    let Some(v) = q.get(key).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let mut c = Checker::default();
    let loc = vec![json!("query"), json!(key)];
    if c.chars(v, 0, max, loc.clone()) && has_control(v) {
        c.value_error(
            loc,
            format_args!("{key} must not contain control characters"),
            &Value::String(v.to_owned()),
        );
    }
    c.finish(Some(v.to_owned()))
}

#[cfg(test)]
mod tests {
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
