//! The `Fact` domain type, its strict validation and normalisation (the reference's rules for
//! id, content, category, confidence, status, lists, timestamps, revision and source), the
//! structured `FactSource` with its public string projection, and the public fact shape.
//!
//! A fact keeps every key it was written with: the validated fields are typed, every other key
//! lives in `extra` in its original order, and the original key order is remembered so that a
//! file the Python reference wrote is rewritten with the same layout.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::FactError;
use crate::ids::FactId;
use crate::time::Timestamp;
use deermem_pycompat::py;

/// The storage schema version written into every fact.
pub const SCHEMA_VERSION: u64 = 2;
/// Longest title, in code points.
pub const TITLE_MAX_CHARS: usize = 160;
/// Title used when the content yields none.
pub const DEFAULT_TITLE: &str = "Memory fact";
/// The only persisted status; deletion is physical.
pub const ACTIVE_STATUS: &str = "active";
/// The default category consumers assume when a fact has none.
pub const DEFAULT_CATEGORY: &str = "context";
/// The longest manual fact content the embedded engine accepts, in code points (facts are
/// injected into prompts; one huge fact would crowd out every other). The memory tools declare
/// it in their schemas.
pub const MAX_MANUAL_CONTENT_CHARS: usize = 20_000;
/// The longest category accepted, in code points.
pub const MAX_CATEGORY_CHARS: usize = 128;
/// The longest search query accepted, in code points.
pub const MAX_QUERY_CHARS: usize = 4096;

/// The storage core categories; any other category is stored as `other` plus
/// `categoryExtension`.
pub const CORE_CATEGORIES: [&str; 9] = [
    "preference",
    "correction",
    "context",
    "goal",
    "behavior",
    "identity",
    "constraint",
    "decision",
    "other",
];

/// Whether `c` is one of [`CORE_CATEGORIES`] (case-sensitive, as the reference).
pub fn is_core_category(c: &str) -> bool {
    CORE_CATEGORIES.contains(&c)
}

/// Source types that a plain string maps to directly; any other string is a thread id.
pub const SOURCE_LITERALS: [&str; 4] = ["manual", "consolidation", "import", "unknown"];

mod draft;
pub use draft::FactDraft;

/// The scope recorded inside a fact: the raw user id and the agent name as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FactScope {
    /// The raw (unsanitised) user id, or `None` for the legacy no-user layout.
    #[serde(rename = "userId")]
    pub user_id: Option<String>,
    /// The agent bucket name as passed to storage.
    #[serde(rename = "agentName")]
    pub agent_name: Option<String>,
}

impl FactScope {
    /// Whether a loaded fact's scope matches the requested one: the user id exactly, the agent
    /// case-insensitively, as the reference checks every loaded fact.
    pub fn matches(&self, requested: &FactScope) -> bool {
        self.user_id == requested.user_id
            && match (&self.agent_name, &requested.agent_name) {
                (Some(a), Some(b)) => a.to_lowercase() == b.to_lowercase(),
                _ => false,
            }
    }

    pub(crate) fn to_value(&self) -> Value {
        serde_json::json!({"userId": self.user_id, "agentName": self.agent_name})
    }
}

/// The source key listing the journal turns whose commit wrote a fact.
pub const TURN_IDS_KEY: &str = "turnIds";

/// Where a fact came from, kept structured in storage (`{type, threadId, ...}`) and projected to
/// a single string for the public API.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FactSource(Map<String, Value>);

impl FactSource {
    fn literal(kind: &str) -> Self {
        let mut m = Map::new();
        m.insert("type".into(), Value::String(kind.into()));
        m.insert("threadId".into(), Value::Null);
        Self(m)
    }

    /// A source from a conversation thread.
    pub fn conversation(thread_id: &str) -> Self {
        let mut m = Map::new();
        m.insert("type".into(), Value::String("conversation".into()));
        m.insert("threadId".into(), Value::String(thread_id.into()));
        Self(m)
    }

    /// The same source carrying the journal turns whose commit wrote the fact (`turnIds`): a
    /// turn replayed after a crash between its commit and its done-mark finds its id here and
    /// is not extracted again. An empty list leaves the source as it is.
    #[must_use]
    pub fn with_turns(mut self, turns: &[String]) -> Self {
        if !turns.is_empty() {
            let ids = turns.iter().cloned().map(Value::String).collect();
            self.0.insert(TURN_IDS_KEY.into(), Value::Array(ids));
        }
        self
    }

    /// The journal turn ids recorded by [`FactSource::with_turns`] (strings only; anything else
    /// a hand edit left there is ignored).
    pub fn turn_ids(&self) -> impl Iterator<Item = &str> {
        self.0
            .get(TURN_IDS_KEY)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
    }

    /// A manually created fact.
    pub fn manual() -> Self {
        Self::literal("manual")
    }

    /// A fact written by consolidation.
    pub fn consolidation() -> Self {
        Self::literal("consolidation")
    }

    /// An imported fact.
    pub fn import() -> Self {
        Self::literal("import")
    }

    /// Unknown provenance.
    pub fn unknown() -> Self {
        Self::literal("unknown")
    }

    /// Normalises any JSON value the way the reference does: `manual`, `consolidation`, `import`
    /// and `unknown` become that type without a thread, any other string is a conversation's
    /// thread id, an object is kept (its `type` defaulting to `unknown`), anything else is
    /// `unknown`.
    ///
    /// # Errors
    /// A mapping whose `type` is not a string, or whose `threadId` is neither a string nor null.
    pub fn from_value(v: &Value) -> Result<Self, FactError> {
        match v {
            Value::String(s) => Ok(Self::from_public_string(s)),
            Value::Object(m) => {
                let mut m = m.clone();
                if !m.contains_key("type") {
                    m.insert("type".into(), Value::String("unknown".into()));
                }
                if !m.get("type").is_some_and(Value::is_string) {
                    return Err(FactError::SourceType);
                }
                if let Some(t) = m.get("threadId")
                    && !(t.is_null() || t.is_string())
                {
                    return Err(FactError::SourceThreadId);
                }
                Ok(Self(m))
            }
            _ => Ok(Self::unknown()),
        }
    }

    /// The structured form of a public source string: the four literals map to their type,
    /// anything else (including `""`) is a conversation thread id.
    pub fn from_public_string(s: &str) -> Self {
        if SOURCE_LITERALS.contains(&s) {
            Self::literal(s)
        } else {
            Self::conversation(s)
        }
    }

    /// The `type` field.
    pub fn kind(&self) -> &str {
        self.0
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
    }

    /// The `threadId` field, when it is a string.
    pub fn thread_id(&self) -> Option<&str> {
        self.0.get("threadId").and_then(Value::as_str)
    }

    /// The public string projection: a conversation's thread id, else a non-empty type, else a
    /// non-empty thread id, else `unknown`.
    pub fn to_public_string(&self) -> String {
        let kind = self.kind();
        let thread = self.thread_id().filter(|t| !t.is_empty());
        if kind == "conversation"
            && let Some(t) = thread
        {
            return t.to_owned();
        }
        if !kind.is_empty() {
            return kind.to_owned();
        }
        thread.map_or_else(|| "unknown".to_owned(), str::to_owned)
    }

    /// The stored mapping, in key order.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    fn py_eq(&self, other: &Self) -> bool {
        py::py_eq(
            &Value::Object(self.0.clone()),
            &Value::Object(other.0.clone()),
        )
    }
}

impl fmt::Debug for FactSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FactSource({})", Value::Object(self.0.clone()))
    }
}

/// A validated, normalised memory fact (the reference's internal fact schema).
#[derive(Clone, Debug)]
pub struct Fact {
    /// The fact id; also the file stem.
    pub id: FactId,
    /// The stripped, non-empty fact text (the Markdown body).
    pub content: String,
    /// The title (the Markdown H1), at most [`TITLE_MAX_CHARS`] code points.
    pub title: String,
    /// The category; `None` when the fact never had the key (consumers read it as `context`).
    pub category: Option<String>,
    /// Confidence in `[0, 1]`.
    pub confidence: f64,
    /// Creation time as written (ISO-Z by every writer, but any string is accepted).
    pub created_at: String,
    /// Last material change, as written.
    pub updated_at: String,
    /// Structured provenance.
    pub source: FactSource,
    /// Free-form topic labels.
    pub topics: Vec<String>,
    /// Ids this fact was consolidated from.
    pub consolidated_from: Vec<String>,
    /// Last explicit confirmation: absent, explicit `null`, or a timestamp string.
    pub last_confirmed_at: Option<Option<String>>,
    /// Number of explicit confirmations: absent, explicit `null`, or at least 1.
    pub confirmation_count: Option<Option<u64>>,
    /// Per-fact optimistic revision, at least 1.
    pub revision: u64,
    /// The owner scope recorded in the fact.
    pub scope: FactScope,
    /// Every other key (`categoryExtension`, `consolidatedAt`, `expected_valid_days`,
    /// `sourceError`, hand-added keys...), in order.
    pub extra: Map<String, Value>,
    /// Shared between clones: it never changes after normalisation, and cloning documents of
    /// many facts (every cache hit of a storage) should not copy it.
    key_order: Arc<[String]>,
}

/// Keys normalisation appends, in the order the reference appends them when absent.
const APPENDED_KEY_ORDER: [&str; 16] = [
    "id",
    "schemaVersion",
    "content",
    "category",
    "categoryExtension",
    "confidence",
    "status",
    "scope",
    "topics",
    "consolidatedFrom",
    "lastConfirmedAt",
    "confirmationCount",
    "source",
    "title",
    "createdAt",
    "updatedAt",
];

const TYPED_KEYS: [&str; 17] = [
    "id",
    "content",
    "title",
    "category",
    "confidence",
    "createdAt",
    "updatedAt",
    "source",
    "schemaVersion",
    "status",
    "topics",
    "consolidatedFrom",
    "lastConfirmedAt",
    "confirmationCount",
    "revision",
    "scope",
    // Consumed into the scope on read and overwritten by it on write.
    "user_id",
];

fn is_typed_key(k: &str) -> bool {
    TYPED_KEYS.contains(&k) || k == "agent_name"
}

/// Inputs to [`normalize_fact`] besides the draft itself.
pub struct NormalizeContext<'a> {
    /// The scope the fact is written to (replaces any scope in the draft).
    pub scope: &'a FactScope,
    /// The stored fact with the same id, for updates.
    pub existing: Option<&'a Fact>,
    /// The time used for `createdAt`/`updatedAt` defaults and bumps.
    pub now: Timestamp,
    /// Called when the draft has no id; storage makes `fact_<32 hex>` ids.
    pub new_id: &'a dyn Fn() -> FactId,
}

impl fmt::Debug for NormalizeContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NormalizeContext")
            .field("scope", self.scope)
            .field("existing", &self.existing.map(|e| &e.id))
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// The title the reference derives: an explicit non-blank title (newlines replaced by spaces;
/// a draft holds a non-string title as its Python `str()`), else the first line of the content, else [`DEFAULT_TITLE`]; at most 160 code points.
pub fn fact_title(explicit: Option<&str>, content: &str) -> String {
    if let Some(t) = explicit {
        let t = py::strip(t);
        if !t.is_empty() {
            return if t.contains('\n') {
                py::prefix_chars(&t.replace('\n', " "), TITLE_MAX_CHARS).to_owned()
            } else {
                py::prefix_chars(t, TITLE_MAX_CHARS).to_owned()
            };
        }
    }
    let first = py::splitlines(content)
        .first()
        .map(|l| py::strip(l))
        .unwrap_or("");
    let first = if first.is_empty() {
        DEFAULT_TITLE
    } else {
        first
    };
    py::prefix_chars(first, TITLE_MAX_CHARS).to_owned()
}

/// Validates and normalises a raw fact exactly as the reference's `_normalize_fact`
/// (deep copy, id check, stripped content, core category or `other`, confidence in [0, 1], title
/// and timestamps), including the update rules against an existing stored fact.
///
/// # Errors
/// A [`FactError`] naming the offending field, or a revision conflict for a stale update.
pub fn normalize_fact(draft: &FactDraft, ctx: &NormalizeContext<'_>) -> Result<Fact, FactError> {
    // Borrowed while normalising; interned into a shared `Arc` at the end (facts read from one
    // writer nearly all have the same order, so no string is copied for them).
    let mut key_order: Vec<&str> = Vec::with_capacity(draft.keys().count() + 4);
    key_order.extend(draft.keys());
    let push_key = |k: &'static str, order: &mut Vec<&str>| {
        if !order.contains(&k) {
            order.push(k);
        }
    };

    // The draft's keys were checked when it was built; what is left is defaults and the rules
    // that depend on the scope, the time and the stored fact.
    let id = draft.id.clone().unwrap_or_else(ctx.new_id);
    push_key("id", &mut key_order);
    push_key("schemaVersion", &mut key_order);
    let content = draft.content.clone();
    let mut extra = draft.extra.clone();

    // A non-core category is stored as `other` plus `categoryExtension`.
    let category = draft.category.as_ref().map(|s| {
        let c = if s.is_empty() {
            DEFAULT_CATEGORY
        } else {
            s.as_str()
        };
        if is_core_category(c) {
            s.clone()
        } else {
            if !extra.contains_key("categoryExtension") {
                extra.insert("categoryExtension".into(), Value::String(s.clone()));
                push_key("categoryExtension", &mut key_order);
            }
            "other".to_owned()
        }
    });
    let confidence = draft.confidence.unwrap_or(0.5);
    for k in [
        "confidence",
        "status",
        "scope",
        "topics",
        "consolidatedFrom",
    ] {
        push_key(k, &mut key_order);
    }
    let topics = draft.topics.clone().unwrap_or_default();
    let consolidated_from = draft.consolidated_from.clone().unwrap_or_default();
    let incoming_revision = draft.revision.unwrap_or(1);
    let source = draft.source.clone().unwrap_or_else(FactSource::unknown);
    push_key("source", &mut key_order);
    let title = fact_title(draft.title.as_deref(), &content);
    push_key("title", &mut key_order);
    let created_in = draft.created_at.clone();
    let updated_in = draft.updated_at.clone();

    // Formatted only when a default or a bump needs it.
    let now = || ctx.now.to_iso_z();
    let mut fact = Fact {
        id,
        content,
        title,
        category,
        confidence,
        created_at: String::new(),
        updated_at: String::new(),
        source,
        topics,
        consolidated_from,
        last_confirmed_at: draft.last_confirmed_at.clone(),
        confirmation_count: draft.confirmation_count,
        revision: incoming_revision,
        scope: ctx.scope.clone(),
        extra,
        key_order: Arc::from(Vec::new()),
    };

    // 15. timestamps and revision
    match ctx.existing {
        None => {
            fact.created_at = created_in.unwrap_or_else(now);
            fact.updated_at = updated_in.unwrap_or_else(|| fact.created_at.clone());
        }
        Some(existing) => {
            if incoming_revision != existing.revision {
                return Err(FactError::RevisionConflict {
                    id: fact.id.as_str().to_owned(),
                    expected: incoming_revision,
                    found: Some(existing.revision),
                });
            }
            fact.created_at = if !existing.created_at.is_empty() {
                existing.created_at.clone()
            } else {
                created_in.filter(|c| !c.is_empty()).unwrap_or_else(now)
            };
            // Compare with the updatedAt/revision of the candidate made irrelevant.
            fact.updated_at = existing.updated_at.clone();
            fact.revision = existing.revision;
            if fact.material_eq(existing) {
                fact.updated_at = if existing.updated_at.is_empty() {
                    existing.created_at.clone()
                } else {
                    existing.updated_at.clone()
                };
            } else {
                fact.revision = existing.revision + 1;
                fact.updated_at = now();
            }
        }
    }
    push_key("createdAt", &mut key_order);
    push_key("updatedAt", &mut key_order);
    push_key("revision", &mut key_order);

    // 16. consolidatedAt
    if !fact.consolidated_from.is_empty() && !fact.extra.contains_key("consolidatedAt") {
        fact.extra.insert(
            "consolidatedAt".into(),
            Value::String(fact.updated_at.clone()),
        );
        push_key("consolidatedAt", &mut key_order);
    }

    fact.key_order = intern_key_order(&key_order);
    Ok(fact)
}

/// The shared `Arc` of a key order: one of the orders this thread made recently when equal,
/// else a new one (remembered in place of the oldest).
fn intern_key_order(order: &[&str]) -> Arc<[String]> {
    const KEPT: usize = 8;
    thread_local! {
        static RECENT: std::cell::RefCell<Vec<Arc<[String]>>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let same =
        |a: &Arc<[String]>| a.len() == order.len() && a.iter().zip(order).all(|(x, y)| x == y);
    RECENT.with(|recent| {
        let Ok(mut recent) = recent.try_borrow_mut() else {
            return order.iter().map(|k| (*k).to_owned()).collect();
        };
        if let Some(i) = recent.iter().position(same) {
            let hit = Arc::clone(&recent[i]);
            // Most recently used first.
            recent[..=i].rotate_right(1);
            return hit;
        }
        let made: Arc<[String]> = order.iter().map(|k| (*k).to_owned()).collect();
        if recent.len() == KEPT {
            recent.pop();
        }
        recent.insert(0, Arc::clone(&made));
        made
    })
}

impl Fact {
    /// The category consumers see: the stored one, or `context` when absent or empty.
    pub fn category_or_default(&self) -> &str {
        match self.category.as_deref() {
            Some(c) if !c.is_empty() => c,
            _ => DEFAULT_CATEGORY,
        }
    }

    /// The original non-core category, when it is a string.
    pub fn category_extension(&self) -> Option<&str> {
        self.extra.get("categoryExtension").and_then(Value::as_str)
    }

    /// `sourceError`, when it is a string.
    pub fn source_error(&self) -> Option<&str> {
        self.extra.get("sourceError").and_then(Value::as_str)
    }

    /// `consolidatedAt`, when it is a string.
    pub fn consolidated_at(&self) -> Option<&str> {
        self.extra.get("consolidatedAt").and_then(Value::as_str)
    }

    /// `expected_valid_days` as the updater reads it: a positive integer (a float truncated
    /// toward zero), anything else is no value.
    pub fn expected_valid_days(&self) -> Option<i64> {
        match self.extra.get("expected_valid_days")? {
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    (i > 0).then_some(i)
                } else {
                    let f = n.as_f64()?;
                    let t = f.trunc();
                    (f.is_finite() && t > 0.0 && t < 9.2e18).then_some(t as i64)
                }
            }
            _ => None,
        }
    }

    /// Sets (or with `None` removes) an extra key, keeping key order.
    pub fn set_extra(&mut self, key: &str, value: Option<Value>) {
        match value {
            Some(v) => {
                self.extra.insert(key.to_owned(), v);
            }
            None => {
                self.extra.shift_remove(key);
            }
        }
    }

    /// Compares every field except `revision` and `updatedAt`, with Python equality
    /// (numbers by value, mappings regardless of key order).
    pub fn material_eq(&self, other: &Fact) -> bool {
        self.id == other.id
            && self.content == other.content
            && self.title == other.title
            && self.category == other.category
            && self.confidence == other.confidence
            && self.created_at == other.created_at
            && self.source.py_eq(&other.source)
            && self.topics == other.topics
            && self.consolidated_from == other.consolidated_from
            && self.last_confirmed_at == other.last_confirmed_at
            && self.confirmation_count == other.confirmation_count
            && self.scope == other.scope
            && py::py_eq(
                &Value::Object(self.extra.clone()),
                &Value::Object(other.extra.clone()),
            )
    }

    fn typed_value(&self, key: &str) -> Option<Value> {
        let opt_str = |o: &Option<Option<String>>| {
            o.as_ref()
                .map(|v| v.clone().map_or(Value::Null, Value::String))
        };
        match key {
            "id" => Some(Value::String(self.id.as_str().to_owned())),
            "content" => Some(Value::String(self.content.clone())),
            "title" => Some(Value::String(self.title.clone())),
            "category" => self.category.clone().map(Value::String),
            "confidence" => serde_json::Number::from_f64(self.confidence).map(Value::Number),
            "createdAt" => Some(Value::String(self.created_at.clone())),
            "updatedAt" => Some(Value::String(self.updated_at.clone())),
            "source" => Some(Value::Object(self.source.0.clone())),
            "schemaVersion" => Some(Value::from(SCHEMA_VERSION)),
            "status" => Some(Value::String(ACTIVE_STATUS.into())),
            "topics" => Some(Value::from(self.topics.clone())),
            "consolidatedFrom" => Some(Value::from(self.consolidated_from.clone())),
            "lastConfirmedAt" => opt_str(&self.last_confirmed_at),
            "confirmationCount" => self
                .confirmation_count
                .map(|v| v.map_or(Value::Null, Value::from)),
            "revision" => Some(Value::from(self.revision)),
            "scope" => Some(self.scope.to_value()),
            _ => None,
        }
    }

    /// Whether [`Self::typed_value`] has a value for `key`, without building it.
    fn has_typed(&self, key: &str) -> bool {
        match key {
            "id" | "content" | "title" | "createdAt" | "updatedAt" | "source" | "schemaVersion"
            | "status" | "topics" | "consolidatedFrom" | "revision" | "scope" => true,
            "category" => self.category.is_some(),
            "confidence" => self.confidence.is_finite(),
            "lastConfirmedAt" => self.last_confirmed_at.is_some(),
            "confirmationCount" => self.confirmation_count.is_some(),
            _ => false,
        }
    }

    fn ordered_keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = Vec::with_capacity(self.key_order.len() + 4);
        let known = |k: &str| {
            k == "user_id" || k == "agent_name" || self.extra.contains_key(k) || self.has_typed(k)
        };
        for k in self.key_order.iter() {
            if known(k) && !keys.contains(&k.as_str()) {
                keys.push(k);
            }
        }
        for k in APPENDED_KEY_ORDER
            .iter()
            .chain(["revision", "consolidatedAt"].iter())
        {
            if !keys.contains(k) && (self.has_typed(k) || self.extra.contains_key(*k)) {
                keys.push(k);
            }
        }
        for k in self.extra.keys() {
            if !keys.contains(&k.as_str()) {
                keys.push(k);
            }
        }
        keys
    }

    /// The internal fact object (structured `source`, `scope`, `title` and `content`), in key
    /// order: what the reference's storage returns from `load()`.
    pub fn to_internal_map(&self) -> Map<String, Value> {
        let mut out = Map::new();
        for k in self.ordered_keys() {
            if k == "user_id" || k == "agent_name" {
                continue;
            }
            if let Some(v) = self.typed_value(k).or_else(|| self.extra.get(k).cloned()) {
                out.insert(k.to_owned(), v);
            }
        }
        for k in ["title", "content", "scope"] {
            if !out.contains_key(k)
                && let Some(v) = self.typed_value(k)
            {
                out.insert(k.to_owned(), v);
            }
        }
        out
    }

    /// The front-matter mapping of the fact's Markdown file: every key except `content` and
    /// `title`, with the scope written as `user_id` and `agent_name` (at their old position
    /// when the fact had those keys, else at the end).
    pub fn front_matter(&self) -> Map<String, Value> {
        let mut out = Map::new();
        let user = self
            .scope
            .user_id
            .clone()
            .map_or(Value::Null, Value::String);
        let agent = self
            .scope
            .agent_name
            .clone()
            .map_or(Value::Null, Value::String);
        for k in self.ordered_keys() {
            match k {
                "content" | "title" | "scope" => {}
                "user_id" => {
                    out.insert(k.to_owned(), user.clone());
                }
                "agent_name" => {
                    out.insert(k.to_owned(), agent.clone());
                }
                _ => {
                    if let Some(v) = self.typed_value(k).or_else(|| self.extra.get(k).cloned()) {
                        out.insert(k.to_owned(), v);
                    }
                }
            }
        }
        if !out.contains_key("user_id") {
            out.insert("user_id".into(), user);
        }
        if !out.contains_key("agent_name") {
            out.insert("agent_name".into(), agent);
        }
        out
    }

    /// The public fact shape the reference's Gateway exposes, with `source` as a string. The
    /// category is the stored one, even when empty (`category: ''` on disk is `""`, as the
    /// reference reports it); `context` only when none is stored.
    pub fn to_public(&self) -> PublicFact {
        PublicFact {
            id: self.id.as_str().to_owned(),
            content: self.content.clone(),
            category: self
                .category
                .clone()
                .unwrap_or_else(|| DEFAULT_CATEGORY.to_owned()),
            category_extension: self.category_extension().map(str::to_owned),
            topics: Some(self.topics.clone()),
            confidence: self.confidence,
            created_at: self.created_at.clone(),
            source: self.source.to_public_string(),
            source_error: self.source_error().map(str::to_owned),
            schema_version: Some(SCHEMA_VERSION),
            status: Some(ACTIVE_STATUS.to_owned()),
            scope: Some(self.scope.clone()),
            revision: Some(self.revision),
            updated_at: Some(self.updated_at.clone()),
            consolidated_at: self.consolidated_at().map(str::to_owned),
            consolidated_from: Some(self.consolidated_from.clone()),
            title: Some(self.title.clone()),
            expected_valid_days: self.extra.get("expected_valid_days").cloned(),
            last_confirmed_at: self.last_confirmed_at.clone().flatten(),
            confirmation_count: self.confirmation_count.flatten(),
        }
    }
}

impl PartialEq for Fact {
    fn eq(&self, other: &Self) -> bool {
        self.material_eq(other)
            && self.revision == other.revision
            && self.updated_at == other.updated_at
    }
}

/// A fact in the public API shape: what the gateway, the tools and exports show.
///
/// Unknown keys are dropped on input, missing keys take the reference's defaults, and `None`
/// fields are left out of the output. Its JSON Schema (feature `schema`) is the HTTP shape: the
/// manager-level fields [`PublicFact::for_http`] drops are not in it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Fact"))]
pub struct PublicFact {
    /// Fact id. An import document may leave it blank (`""` or absent): the manager then
    /// generates one, as the reference does.
    #[serde(default)]
    pub id: String,
    /// Fact text.
    pub content: String,
    /// Category (`context` by default).
    #[serde(default = "default_category")]
    pub category: String,
    /// Original non-core category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category_extension: Option<String>,
    /// Topic labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<Vec<String>>,
    /// Confidence in `[0, 1]`.
    #[serde(default = "default_confidence")]
    pub confidence: f64,
    /// Creation time.
    #[serde(default)]
    pub created_at: String,
    /// Provenance as a string.
    #[serde(default = "default_source")]
    pub source: String,
    /// The earlier mistake a correction fixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_error: Option<String>,
    /// Storage schema version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u64>,
    /// Always `active` for stored facts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Owner scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<FactScope>,
    /// Per-fact revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// Last material change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// When the fact was consolidated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidated_at: Option<String>,
    /// Source ids of a consolidated fact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidated_from: Option<Vec<String>>,
    /// Title (manager level; the HTTP shape drops it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub title: Option<String>,
    /// Review window in days (manager level).
    #[serde(
        rename = "expected_valid_days",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub expected_valid_days: Option<Value>,
    /// Last explicit confirmation (manager level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub last_confirmed_at: Option<String>,
    /// Confirmation count (manager level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub confirmation_count: Option<u64>,
}

fn default_category() -> String {
    DEFAULT_CATEGORY.to_owned()
}
fn default_confidence() -> f64 {
    0.5
}
fn default_source() -> String {
    "unknown".to_owned()
}

impl PublicFact {
    /// The HTTP shape: the manager-level fields the reference's gateway drops are removed.
    pub fn for_http(mut self) -> Self {
        self.title = None;
        self.expected_valid_days = None;
        self.last_confirmed_at = None;
        self.confirmation_count = None;
        self
    }

    /// A draft for import: `source` goes back to its structured form, every present field is
    /// kept, and absent optional fields stay absent.
    ///
    /// # Errors
    /// The [`FactError`] of the first field the reference's rules refuse (blank content, a
    /// confidence outside `[0, 1]`, a revision or confirmation count of 0).
    pub fn to_draft(&self) -> Result<FactDraft, FactError> {
        // The serialised public shape has the draft's keys in the draft's order; only the
        // stored-only keys go, and `source` takes its structured form in place.
        let Ok(Value::Object(mut m)) = serde_json::to_value(self) else {
            return Err(FactError::NotAnObject);
        };
        for key in ["schemaVersion", "status", "scope"] {
            m.shift_remove(key);
        }
        if !self.confidence.is_finite() {
            m.shift_remove("confidence");
        }
        m.insert(
            "source".into(),
            Value::Object(FactSource::from_public_string(&self.source).0),
        );
        FactDraft::from_json(m)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn scope() -> FactScope {
        FactScope {
            user_id: Some("alice".into()),
            agent_name: Some("agent-a".into()),
        }
    }

    fn now() -> Timestamp {
        Timestamp::parse_iso("2026-12-02T09:02:11.221434Z").unwrap()
    }

    fn new_fact_id() -> FactId {
        FactId::new("fact_2766288f390348d2ac22202c35d20c58").unwrap()
    }

    fn norm(draft: Value, existing: Option<&Fact>) -> Result<Fact, FactError> {
        normalize_draft(&FactDraft::try_from(draft)?, existing)
    }

    fn normalize_draft(draft: &FactDraft, existing: Option<&Fact>) -> Result<Fact, FactError> {
        let s = scope();
        let ctx = NormalizeContext {
            scope: &s,
            existing,
            now: now(),
            new_id: &new_fact_id,
        };
        normalize_fact(draft, &ctx)
    }

    fn keys(m: &Map<String, Value>) -> Vec<&str> {
        m.keys().map(String::as_str).collect()
    }

    #[test]
    fn key_presence_check_agrees_with_the_values_it_stands_for() {
        let bare = norm(json!({"content": "x"}), None).unwrap();
        let full = norm(
            json!({"content": "x", "category": "goal", "confidence": 0.5, "topics": ["a"],
                   "lastConfirmedAt": null, "confirmationCount": 3, "extra_key": 1}),
            None,
        )
        .unwrap();
        let mut odd = full.clone();
        odd.confidence = f64::NAN;
        odd.category = None;
        odd.last_confirmed_at = None;
        odd.confirmation_count = None;
        for f in [&bare, &full, &odd] {
            for k in [
                "id",
                "content",
                "title",
                "category",
                "confidence",
                "createdAt",
                "updatedAt",
                "source",
                "schemaVersion",
                "status",
                "topics",
                "consolidatedFrom",
                "lastConfirmedAt",
                "confirmationCount",
                "revision",
                "scope",
                "user_id",
                "agent_name",
                "extra_key",
                "nope",
            ] {
                assert_eq!(f.has_typed(k), f.typed_value(k).is_some(), "{k} of {f:?}");
            }
        }
    }

    #[test]
    fn storage_created_fact_has_reference_key_order() {
        let f = norm(json!({"content": "x", "category": "weird-cat", "source": "thread-xyz", "confidence": 1}), None).unwrap();
        assert_eq!(
            keys(&f.front_matter()),
            vec![
                "category",
                "source",
                "confidence",
                "id",
                "schemaVersion",
                "categoryExtension",
                "status",
                "topics",
                "consolidatedFrom",
                "createdAt",
                "updatedAt",
                "revision",
                "user_id",
                "agent_name"
            ]
        );
        assert_eq!(f.category.as_deref(), Some("other"));
        assert_eq!(f.category_extension(), Some("weird-cat"));
        assert_eq!(f.source.kind(), "conversation");
        assert_eq!(f.source.thread_id(), Some("thread-xyz"));
        assert_eq!(f.created_at, "2026-12-02T09:02:11.221434Z");
        assert_eq!(f.updated_at, f.created_at);
        assert_eq!(f.revision, 1);
        assert_eq!(f.id.as_str(), "fact_2766288f390348d2ac22202c35d20c58");
    }

    #[test]
    fn explicit_input_order_is_kept() {
        let f = norm(
            json!({"id": "fact_01HZZZZZZZZZZZZZZZZZZZZZZZ", "content": "Project uses Python 3.12",
                   "category": "constraint", "topics": ["python", "runtime"], "confidence": 0.95,
                   "createdAt": "2026-07-17T00:00:00Z", "source": {"type": "manual", "threadId": "thread-1"},
                   "revision": 1}),
            None,
        )
        .unwrap();
        assert_eq!(
            keys(&f.front_matter()),
            vec![
                "id",
                "category",
                "topics",
                "confidence",
                "createdAt",
                "source",
                "revision",
                "schemaVersion",
                "status",
                "consolidatedFrom",
                "updatedAt",
                "user_id",
                "agent_name"
            ]
        );
        assert_eq!(f.title, "Project uses Python 3.12");
    }

    #[test]
    fn validation_rejects_malformed_facts_naming_the_field() {
        let cases = [
            (json!({"content": 5}), "fact.content must be a string"),
            (
                json!({"content": "  \u{3000} "}),
                "fact.content must not be empty",
            ),
            (
                json!({"content": "x", "category": null}),
                "fact.category must be a string",
            ),
            (
                json!({"content": "x", "confidence": 1.5}),
                "fact.confidence must be a number between 0 and 1",
            ),
            (
                json!({"content": "x", "confidence": -0.1}),
                "fact.confidence must be a number between 0 and 1",
            ),
            (
                json!({"content": "x", "confidence": true}),
                "fact.confidence must be a number between 0 and 1",
            ),
            (
                json!({"content": "x", "confidence": "0.5"}),
                "fact.confidence must be a number between 0 and 1",
            ),
            (
                json!({"content": "x", "status": "deleted"}),
                "fact.status must be 'active'; deletion is physical",
            ),
            (
                json!({"content": "x", "topics": "a"}),
                "fact.topics must be a list of strings",
            ),
            (
                json!({"content": "x", "topics": [1]}),
                "fact.topics must be a list of strings",
            ),
            (
                json!({"content": "x", "consolidatedFrom": [null]}),
                "fact.consolidatedFrom must be a list of strings",
            ),
            (
                json!({"content": "x", "lastConfirmedAt": 5}),
                "fact.lastConfirmedAt must be a string when present",
            ),
            (
                json!({"content": "x", "confirmationCount": 0}),
                "fact.confirmationCount must be an integer >= 1 when present",
            ),
            (
                json!({"content": "x", "confirmationCount": true}),
                "fact.confirmationCount must be an integer >= 1 when present",
            ),
            (
                json!({"content": "x", "confirmationCount": 2.0}),
                "fact.confirmationCount must be an integer >= 1 when present",
            ),
            (
                json!({"content": "x", "revision": 0}),
                "fact.revision must be an integer >= 1",
            ),
            (
                json!({"content": "x", "revision": null}),
                "fact.revision must be an integer >= 1",
            ),
            (
                json!({"content": "x", "revision": true}),
                "fact.revision must be an integer >= 1",
            ),
            (
                json!({"content": "x", "source": {"type": 5}}),
                "fact.source.type must be a string",
            ),
            (
                json!({"content": "x", "source": {"threadId": 5}}),
                "fact.source.threadId must be a string or null",
            ),
            (
                json!({"content": "x", "createdAt": 5}),
                "fact.createdAt and fact.updatedAt must be strings",
            ),
            (
                json!({"content": "x", "id": "a/b"}),
                "fact.id may contain only letters, numbers, '_' and '-'",
            ),
            (
                json!({"content": "x", "id": 1.5}),
                "fact.id may contain only letters, numbers, '_' and '-'",
            ),
        ];
        for (draft, msg) in cases {
            let err = norm(draft.clone(), None).unwrap_err();
            assert_eq!(err.to_string(), msg, "draft {draft}");
            assert!(
                msg.contains(err.field()),
                "field {} named in {msg}",
                err.field()
            );
        }
    }

    #[test]
    fn lenient_inputs_follow_the_reference() {
        // Missing category stays missing; "" stays "".
        assert_eq!(norm(json!({"content": "x"}), None).unwrap().category, None);
        assert_eq!(
            norm(json!({"content": "x", "category": ""}), None)
                .unwrap()
                .category
                .as_deref(),
            Some("")
        );
        // Falsy ids are replaced; ints are stringified; True is "True".
        assert_eq!(
            norm(json!({"content": "x", "id": ""}), None).unwrap().id,
            new_fact_id()
        );
        assert_eq!(
            norm(json!({"content": "x", "id": 0}), None).unwrap().id,
            new_fact_id()
        );
        assert_eq!(
            norm(json!({"content": "x", "id": 5}), None)
                .unwrap()
                .id
                .as_str(),
            "5"
        );
        // Sources.
        let s = |v: Value| {
            norm(json!({"content": "x", "source": v}), None)
                .unwrap()
                .source
        };
        assert_eq!(
            s(json!("manual")).as_map(),
            json!({"type": "manual", "threadId": null})
                .as_object()
                .unwrap()
        );
        assert_eq!(
            s(json!("")).as_map(),
            json!({"type": "conversation", "threadId": ""})
                .as_object()
                .unwrap()
        );
        assert_eq!(
            s(json!(null)).as_map(),
            json!({"type": "unknown", "threadId": null})
                .as_object()
                .unwrap()
        );
        assert_eq!(s(json!(3)).kind(), "unknown");
        assert_eq!(
            s(json!({"threadId": "t"})).as_map(),
            json!({"threadId": "t", "type": "unknown"})
                .as_object()
                .unwrap()
        );
        // Explicit null lastConfirmedAt is kept.
        assert_eq!(
            norm(json!({"content": "x", "lastConfirmedAt": null}), None)
                .unwrap()
                .last_confirmed_at,
            Some(None)
        );
        // Confidence ints become floats; content is stripped.
        let f = norm(json!({"content": "  hi \n", "confidence": 1}), None).unwrap();
        assert_eq!(f.confidence, 1.0);
        assert_eq!(f.content, "hi");
    }

    #[test]
    fn titles_follow_the_reference() {
        assert_eq!(fact_title(None, "first\nsecond"), "first");
        assert_eq!(fact_title(Some("  a\nb "), "x"), "a b");
        assert_eq!(fact_title(Some(""), "x"), "x");
        assert_eq!(fact_title(None, &"é".repeat(200)).chars().count(), 160);
        let five = FactDraft::try_from(json!({"content": "x", "title": 5})).unwrap();
        assert_eq!(five.title.as_deref(), Some("5"));
    }

    #[test]
    fn updates_bump_revision_only_on_material_change() {
        let stored = norm(
            json!({"id": "a", "content": "v1", "createdAt": "2026-01-01T00:00:00Z"}),
            None,
        )
        .unwrap();
        // Same content: no bump.
        let same = normalize_draft(&stored.to_draft(), Some(&stored)).unwrap();
        assert_eq!(same.revision, 1);
        assert_eq!(same.updated_at, stored.updated_at);
        // Numeric equality: 1 == 1.0.
        let d = stored.to_draft().with_confidence(0.5).unwrap();
        assert_eq!(normalize_draft(&d, Some(&stored)).unwrap().revision, 1);
        // Content change: bump, createdAt kept.
        let d = stored.to_draft().with_content("v2").unwrap();
        let d = d.with("title", json!("")).unwrap();
        let changed = normalize_draft(&d, Some(&stored)).unwrap();
        assert_eq!(changed.revision, 2);
        assert_eq!(changed.created_at, "2026-01-01T00:00:00Z");
        assert_eq!(changed.updated_at, now().to_iso_z());
        // A stale incoming revision conflicts, and a missing one defaults to 1.
        let d = changed.to_draft().with_revision(1).unwrap();
        let err = normalize_draft(&d, Some(&changed)).unwrap_err();
        assert_eq!(err.to_string(), "Expected fact 'a' revision 1, found 2");
        let mut d = changed.to_draft();
        d.remove("revision");
        assert!(matches!(
            normalize_draft(&d, Some(&changed)),
            Err(FactError::RevisionConflict { .. })
        ));
    }

    #[test]
    fn public_projection_of_sources() {
        let p = |v: Value| FactSource::from_value(&v).unwrap().to_public_string();
        assert_eq!(p(json!({"type": "conversation", "threadId": "t1"})), "t1");
        assert_eq!(
            p(json!({"type": "manual", "threadId": "thread-1"})),
            "manual"
        );
        assert_eq!(p(json!({"type": "", "threadId": "t2"})), "t2");
        assert_eq!(p(json!({"type": "", "threadId": null})), "unknown");
        assert_eq!(
            p(json!({"type": "conversation", "threadId": ""})),
            "conversation"
        );
        assert_eq!(p(json!("thread-9")), "thread-9");
    }

    #[test]
    fn public_fact_round_trips_through_draft() {
        let f = norm(
            json!({"content": "x", "category": "workflow", "source": "t-1", "sourceError": "old"}),
            None,
        )
        .unwrap();
        let public = f.to_public();
        assert_eq!(public.category, "other");
        assert_eq!(public.category_extension.as_deref(), Some("workflow"));
        assert_eq!(public.source, "t-1");
        let json = serde_json::to_value(public.clone().for_http()).unwrap();
        assert!(json.get("title").is_none());
        assert_eq!(json["sourceError"], "old");
        let back: PublicFact = serde_json::from_value(json).unwrap();
        let draft = back.to_draft().unwrap();
        assert_eq!(draft.source(), Some(&FactSource::conversation("t-1")));
    }

    #[test]
    fn the_public_category_is_the_stored_one_even_when_empty() {
        let empty = norm(json!({"content": "x", "category": ""}), None).unwrap();
        assert_eq!(empty.category.as_deref(), Some(""));
        assert_eq!(empty.to_public().category, "");
        // Internal consumers (search filters, eviction) still read an empty one as `context`.
        assert_eq!(empty.category_or_default(), "context");
        let absent = norm(json!({"content": "x"}), None).unwrap();
        assert_eq!(absent.to_public().category, "context");
    }

    #[test]
    fn consolidated_facts_get_consolidated_at() {
        let f = norm(
            json!({"content": "x", "consolidatedFrom": ["a", "b"]}),
            None,
        )
        .unwrap();
        assert_eq!(f.consolidated_at(), Some(f.updated_at.as_str()));
    }
}
