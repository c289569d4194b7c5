//! Tool mode: the four memory tools (`memory_search`, `memory_add`, `memory_update`,
//! `memory_delete`) as JSON-schema tool definitions, a dispatcher that runs one tool call against
//! any [`MemoryManager`], and the small mode-gating helpers a host needs (which of the tools,
//! the passive per-turn writes and the injected facts each memory mode turns on, as the
//! reference's host decides).
//!
//! The dispatcher never panics and never returns a Rust error: every outcome is the JSON string
//! the model sees, `{"error": "..."}` for failures. The scope (user and agent) always comes from
//! the host, never from the model's arguments.

use deermem_core::fact::{
    DEFAULT_CATEGORY, MAX_CATEGORY_CHARS, MAX_MANUAL_CONTENT_CHARS, MAX_QUERY_CHARS,
};
use deermem_core::ports::MemoryManagerExt as _;
use deermem_core::ports::{FactPatch, MemoryManager, MemoryScope, NewFact, SearchRequest};
use deermem_core::{ManagerError, MemoryConfig, MemoryMode};
use deermem_pycompat::py;
use serde::Serialize;
use serde_json::{Map, Value, json};

/// Name of the search tool.
pub const MEMORY_SEARCH: &str = "memory_search";
/// Name of the add tool.
pub const MEMORY_ADD: &str = "memory_add";
/// Name of the update tool.
pub const MEMORY_UPDATE: &str = "memory_update";
/// Name of the delete tool.
pub const MEMORY_DELETE: &str = "memory_delete";
/// The four tool names, in registration order.
pub const TOOL_NAMES: [&str; 4] = [MEMORY_SEARCH, MEMORY_ADD, MEMORY_UPDATE, MEMORY_DELETE];

/// `memory_search`'s default result count.
pub const DEFAULT_SEARCH_LIMIT: u64 = 10;
/// The largest `limit` passed to the backend; larger requests are clamped (the gateway's
/// `top_k` bound).
pub const MAX_SEARCH_LIMIT: u64 = 100;
/// `memory_add`'s default confidence.
pub const DEFAULT_ADD_CONFIDENCE: f64 = 0.7;

/// The error text when a manual fact was evicted at once by the capacity policy.
pub const EVICTED_MESSAGE: &str =
    "Fact was not stored because the configured memory.max_facts capacity policy evicted it";

/// The warning a host logs when `memory.mode` is `tool` but memory is disabled.
pub const TOOL_MODE_DISABLED_WARNING: &str = "memory.mode is 'tool' but memory.enabled is false";

/// The longest id or tool name echoed back in an error message, in characters.
const ECHO_MAX_CHARS: usize = 200;

/// A tool as a host presents it to a model: name, description and JSON Schema of the arguments.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolDefinition {
    /// The tool name (`memory_search`...).
    pub name: String,
    /// What the tool does and when to call it, for the model.
    pub description: String,
    /// A JSON Schema object (`type: object`, `properties`, `required`) for the arguments.
    pub input_schema: Value,
}

/// The result of one tool call: the JSON string the model sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    /// The JSON text: the success object, or `{"error": "..."}`.
    pub text: String,
    /// Whether `text` is an error object.
    pub is_error: bool,
}

impl ToolOutput {
    fn ok(value: &Value) -> Self {
        match serde_json::to_string(value) {
            Ok(text) => Self {
                text,
                is_error: false,
            },
            Err(e) => Self::error(format!("could not encode the tool result as JSON: {e}")),
        }
    }

    /// An error output: `{"error": message}`.
    pub fn error(message: impl Into<String>) -> Self {
        let body = json!({ "error": message.into() });
        Self {
            // Serialising a map holding one string cannot fail; fall back to a fixed text anyway.
            text: serde_json::to_string(&body)
                .unwrap_or_else(|_| "{\"error\":\"internal error\"}".to_owned()),
            is_error: true,
        }
    }

    /// The output parsed back as JSON (`Null` if it is not JSON, which does not happen for
    /// outputs this module builds).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
}

/// The four tool definitions, in the order `memory_search`, `memory_add`, `memory_update`,
/// `memory_delete`.
pub fn tool_definitions() -> Vec<ToolDefinition> {
    vec![
        search_definition(),
        add_definition(),
        update_definition(),
        delete_definition(),
    ]
}

/// The definition of one tool by name.
pub fn tool_definition(name: &str) -> Option<ToolDefinition> {
    tool_definitions().into_iter().find(|t| t.name == name)
}

fn search_definition() -> ToolDefinition {
    ToolDefinition {
        name: MEMORY_SEARCH.to_owned(),
        description: "Look up facts remembered about the user in long-term memory. Results are \
            ranked by relevance: full-text (BM25) ranking weighted by recency and confidence, \
            by meaning as well when an embedding model is configured, with a plain text match \
            as a fallback when nothing ranks. Call this before answering \
            anything that depends on the user's preferences, background, goals or earlier \
            decisions. Returns {\"results\": [fact...], \"count\": n}."
            .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "What to look for, in natural language or keywords.",
                    "maxLength": MAX_QUERY_CHARS
                },
                "category": {
                    "type": "string",
                    "description": "Only return facts of this category (preference, correction, \
                        context, goal, behavior, identity, constraint, decision, other); omit it \
                        to search every category.",
                    "maxLength": MAX_CATEGORY_CHARS
                },
                "limit": {
                    "type": "integer",
                    "description": "Maximum number of facts to return.",
                    "minimum": 1,
                    "maximum": MAX_SEARCH_LIMIT,
                    "default": DEFAULT_SEARCH_LIMIT
                },
                "mode": {
                    "type": "string",
                    "enum": ["bm25", "vector", "hybrid"],
                    "description": "How to rank: bm25 (shared words), vector (meaning, needs an \
                        embedding model) or hybrid (both). Omit it to use the configured default."
                }
            },
            "required": ["query"],
            "additionalProperties": false
        }),
    }
}

fn add_definition() -> ToolDefinition {
    ToolDefinition {
        name: MEMORY_ADD.to_owned(),
        description: "Remember a new fact about the user for future conversations: a stable \
            preference, a correction of something wrong, a goal, a decision or useful context. \
            Write one self-contained statement per call. Exact duplicates of a stored fact are \
            refused. Returns {\"fact_id\": id, \"status\": \"added\"}."
            .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "content": {
                    "type": "string",
                    "description": "The fact, as one self-contained sentence.",
                    "maxLength": MAX_MANUAL_CONTENT_CHARS
                },
                "category": {
                    "type": "string",
                    "description": "preference, correction, context, goal, behavior, identity, \
                        constraint, decision or other.",
                    "maxLength": MAX_CATEGORY_CHARS,
                    "default": DEFAULT_CATEGORY
                },
                "confidence": {
                    "type": "number",
                    "description": "How sure you are that the fact is true and lasting, 0 to 1.",
                    "minimum": 0,
                    "maximum": 1,
                    "default": DEFAULT_ADD_CONFIDENCE
                }
            },
            "required": ["content"],
            "additionalProperties": false
        }),
    }
}

fn update_definition() -> ToolDefinition {
    ToolDefinition {
        name: MEMORY_UPDATE.to_owned(),
        description: "Change a remembered fact, for example when the user corrects it or it \
            became more precise. Only the fields you pass change; take the fact_id from \
            memory_search. Returns {\"fact_id\": id, \"status\": \"updated\"}."
            .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "fact_id": {
                    "type": "string",
                    "description": "The id of the fact to change."
                },
                "content": {
                    "type": "string",
                    "description": "The new statement; omit it to keep the current one.",
                    "maxLength": MAX_MANUAL_CONTENT_CHARS
                },
                "category": {
                    "type": "string",
                    "description": "The new category; omit it to keep the current one.",
                    "maxLength": MAX_CATEGORY_CHARS
                },
                "confidence": {
                    "type": "number",
                    "description": "The new confidence (0 to 1); omit it to keep the current one.",
                    "minimum": 0,
                    "maximum": 1
                }
            },
            "required": ["fact_id"],
            "additionalProperties": false
        }),
    }
}

fn delete_definition() -> ToolDefinition {
    ToolDefinition {
        name: MEMORY_DELETE.to_owned(),
        description: "Forget a remembered fact that is wrong or no longer true, or that the user \
            asked you to forget. Take the fact_id from memory_search. Returns \
            {\"fact_id\": id, \"status\": \"deleted\"}."
            .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "fact_id": {
                    "type": "string",
                    "description": "The id of the fact to forget."
                }
            },
            "required": ["fact_id"],
            "additionalProperties": false
        }),
    }
}

const INSTRUCTIONS_HEAD: &str =
    "You have a long-term memory about the user, reached through tools.";
const INSTRUCTIONS_TAIL: &str =
    "Do not store secrets, passwords or one-off details of the current task.";

/// When the model should call one memory tool, as a line of the instructions (`None` for a
/// name that is not a memory tool).
pub fn tool_instruction(name: &str) -> Option<&'static str> {
    match name {
        MEMORY_SEARCH => Some(
            "- memory_search: before answering anything that may depend on what you know about \
             the user (preferences, background, goals, past decisions), search for it.",
        ),
        MEMORY_ADD => Some(
            "- memory_add: when the user states something lasting about themselves or asks you \
             to remember something, store it as one self-contained fact.",
        ),
        MEMORY_UPDATE => Some(
            "- memory_update: when a stored fact turns out to be outdated or imprecise, correct \
             it.",
        ),
        MEMORY_DELETE => Some(
            "- memory_delete: when a stored fact is wrong or the user asks you to forget it, \
             delete it.",
        ),
        _ => None,
    }
}

/// Guidance for the system prompt in tool mode: when the model should call each of the four
/// tools.
pub fn tool_mode_instructions() -> String {
    instructions_for(&TOOL_NAMES, &[])
}

/// The instructions for the memory tools a host actually offers (`offered`, in order; names
/// that are not memory tools are skipped), followed by `extra` lines of the host's own. The
/// advice against storing secrets is kept only when a tool that writes is offered.
pub fn instructions_for<S: AsRef<str>>(offered: &[S], extra: &[&str]) -> String {
    let mut lines = vec![INSTRUCTIONS_HEAD];
    lines.extend(offered.iter().filter_map(|n| tool_instruction(n.as_ref())));
    lines.extend_from_slice(extra);
    if offered
        .iter()
        .any(|n| [MEMORY_ADD, MEMORY_UPDATE].contains(&n.as_ref()))
    {
        lines.push(INSTRUCTIONS_TAIL);
    }
    lines.join("\n")
}

/// Whether the host registers the memory tools: memory is enabled and `mode` is `tool`.
pub fn should_use_memory_tools(config: &MemoryConfig) -> bool {
    config.enabled && config.mode == MemoryMode::Tool
}

/// Whether the passive per-turn write path (the memory middleware) is installed: always
/// outside tool mode (it no-ops at runtime when memory is disabled), and in tool mode only for
/// backends that ask for passive writes.
pub fn installs_passive_writes(config: &MemoryConfig, manager: &dyn MemoryManager) -> bool {
    !should_use_memory_tools(config) || manager.passive_writes_in_tool_mode()
}

/// Whether the injection block carries facts in this mode: in tool mode only summaries are
/// injected and facts are reached through `memory_search`.
pub fn mode_injects_facts(mode: MemoryMode) -> bool {
    mode == MemoryMode::Middleware
}

/// The warning to log for this configuration, if any (`mode: tool` with memory disabled).
pub fn mode_warning(config: &MemoryConfig) -> Option<&'static str> {
    (config.mode == MemoryMode::Tool && !config.enabled).then_some(TOOL_MODE_DISABLED_WARNING)
}

/// The memory tools to append to an agent whose tools already have `existing_names`: a memory
/// tool whose name is taken is skipped with a warning; other tools are not touched.
pub fn memory_tools_to_append<S: AsRef<str>>(existing_names: &[S]) -> Vec<ToolDefinition> {
    tool_definitions()
        .into_iter()
        .filter(|tool| {
            let taken = existing_names.iter().any(|n| n.as_ref() == tool.name);
            if taken {
                tracing::warn!(tool = %tool.name, "a tool with this name is already configured; skipping the memory tool");
            }
            !taken
        })
        .collect()
}

/// Runs one tool call against `manager` for `scope` and returns the JSON string the model sees.
///
/// `arguments` is the model's argument object (`null` counts as `{}`); unknown keys are
/// ignored. Bad arguments, unknown tool names and backend failures become `{"error": "..."}`.
pub async fn dispatch(
    manager: &dyn MemoryManager,
    scope: &MemoryScope,
    tool_name: &str,
    arguments: &Value,
) -> ToolOutput {
    let empty = Map::new();
    let args = match arguments {
        Value::Object(map) => map,
        Value::Null => &empty,
        other => {
            return ToolOutput::error(format!(
                "invalid arguments for {}: expected a JSON object, got {}",
                shorten(tool_name),
                json_type(other)
            ));
        }
    };
    match tool_name {
        MEMORY_SEARCH => search(manager, scope, args).await,
        MEMORY_ADD => add(manager, scope, args).await,
        MEMORY_UPDATE => update(manager, scope, args).await,
        MEMORY_DELETE => delete(manager, scope, args).await,
        other => ToolOutput::error(format!(
            "Unknown tool: {}. Available tools: {}",
            shorten(other),
            TOOL_NAMES.join(", ")
        )),
    }
}

async fn search(
    manager: &dyn MemoryManager,
    scope: &MemoryScope,
    args: &Map<String, Value>,
) -> ToolOutput {
    let parsed = (|| {
        let query = required_str(args, "query")?;
        let category = optional_str(args, "category")?;
        let limit = optional_int(args, "limit")?;
        let mode = optional_mode(args)?;
        check_length("query", query, MAX_QUERY_CHARS)?;
        check_optional_length("category", category, MAX_CATEGORY_CHARS)?;
        Ok::<_, ArgError>((query, category, limit, mode))
    })();
    let (query, category, limit, mode) = match parsed {
        Ok(p) => p,
        Err(e) => return invalid_arguments(MEMORY_SEARCH, &e),
    };
    let limit = match limit {
        None => DEFAULT_SEARCH_LIMIT,
        Some(n) if n <= 0 => 0,
        Some(n) => u64::try_from(n)
            .unwrap_or(MAX_SEARCH_LIMIT)
            .min(MAX_SEARCH_LIMIT),
    };
    let category = category
        .filter(|c| !py::strip(c).is_empty())
        .map(str::to_owned);
    let request = SearchRequest {
        query: query.to_owned(),
        top_k: usize::try_from(limit).unwrap_or(0),
        scope: scope.clone(),
        category,
        mode,
    };
    match manager.search(request).await {
        Ok(facts) => {
            let count = facts.len();
            match serde_json::to_value(&facts) {
                Ok(results) => ToolOutput::ok(&json!({ "results": results, "count": count })),
                Err(e) => ToolOutput::error(format!("could not encode the search results: {e}")),
            }
        }
        Err(e) => ToolOutput::error(e.to_string()),
    }
}

async fn add(
    manager: &dyn MemoryManager,
    scope: &MemoryScope,
    args: &Map<String, Value>,
) -> ToolOutput {
    let parsed = (|| {
        let content = required_str(args, "content")?;
        let category = optional_str(args, "category")?;
        let confidence = optional_number(args, "confidence")?;
        check_length("content", content, MAX_MANUAL_CONTENT_CHARS)?;
        check_optional_length("category", category, MAX_CATEGORY_CHARS)?;
        Ok::<_, ArgError>((content, category, confidence))
    })();
    let (content, category, confidence) = match parsed {
        Ok(p) => p,
        Err(e) => return invalid_arguments(MEMORY_ADD, &e),
    };
    let content = py::strip(content);
    if content.is_empty() {
        return ToolOutput::error("empty content");
    }
    // The fast duplicate check reads the whole bucket, not a capped search. A backend that
    // cannot read its memory still runs its own check inside `create_fact`.
    match manager.get_memory(scope.clone()).await {
        Ok(document) => {
            let wanted = py::casefold(content);
            if document
                .facts
                .iter()
                .any(|f| py::casefold(py::strip(&f.content)) == wanted)
            {
                return ToolOutput::error("Duplicate fact");
            }
        }
        Err(ManagerError::Unsupported { .. }) => {}
        Err(e) => return ToolOutput::error(e.to_string()),
    }
    let fact = NewFact {
        content: content.to_owned(),
        category: category.unwrap_or(DEFAULT_CATEGORY).to_owned(),
        confidence: confidence.unwrap_or(DEFAULT_ADD_CONFIDENCE),
    };
    match manager.create_fact(fact, scope.clone()).await {
        Ok((_, Some(id))) => ToolOutput::ok(&json!({ "fact_id": id, "status": "added" })),
        Ok((_, None)) => ToolOutput::error(EVICTED_MESSAGE),
        Err(ManagerError::Unsupported { .. }) => unsupported(manager, "create_fact"),
        Err(e) => ToolOutput::error(e.to_string()),
    }
}

async fn update(
    manager: &dyn MemoryManager,
    scope: &MemoryScope,
    args: &Map<String, Value>,
) -> ToolOutput {
    let parsed = (|| {
        let fact_id = required_str(args, "fact_id")?;
        let content = optional_str(args, "content")?;
        let category = optional_str(args, "category")?;
        let confidence = optional_number(args, "confidence")?;
        check_optional_length("content", content, MAX_MANUAL_CONTENT_CHARS)?;
        check_optional_length("category", category, MAX_CATEGORY_CHARS)?;
        Ok::<_, ArgError>((fact_id, content, category, confidence))
    })();
    let (fact_id, content, category, confidence) = match parsed {
        Ok(p) => p,
        Err(e) => return invalid_arguments(MEMORY_UPDATE, &e),
    };
    let patch = FactPatch {
        content: content.map(str::to_owned),
        category: category.map(str::to_owned),
        confidence,
        expected_revision: None,
    };
    match manager.update_fact(fact_id, patch, scope.clone()).await {
        Ok(_) => ToolOutput::ok(&json!({ "fact_id": fact_id, "status": "updated" })),
        Err(ManagerError::NotFound { .. }) => not_found(fact_id),
        Err(ManagerError::Unsupported { .. }) => unsupported(manager, "update_fact"),
        Err(e) => ToolOutput::error(e.to_string()),
    }
}

async fn delete(
    manager: &dyn MemoryManager,
    scope: &MemoryScope,
    args: &Map<String, Value>,
) -> ToolOutput {
    let fact_id = match required_str(args, "fact_id") {
        Ok(id) => id,
        Err(e) => return invalid_arguments(MEMORY_DELETE, &e),
    };
    match manager.delete_fact(fact_id, None, scope.clone()).await {
        Ok(_) => ToolOutput::ok(&json!({ "fact_id": fact_id, "status": "deleted" })),
        Err(ManagerError::NotFound { .. }) => not_found(fact_id),
        Err(ManagerError::Unsupported { .. }) => unsupported(manager, "delete_fact"),
        Err(e) => ToolOutput::error(e.to_string()),
    }
}

fn not_found(fact_id: &str) -> ToolOutput {
    ToolOutput::error(format!("Fact not found: {}", shorten(fact_id)))
}

fn unsupported(manager: &dyn MemoryManager, operation: &str) -> ToolOutput {
    ToolOutput::error(format!(
        "memory backend {} does not support {operation}",
        manager.name()
    ))
}

fn invalid_arguments(tool: &str, detail: &ArgError) -> ToolOutput {
    ToolOutput::error(format!("invalid arguments for {tool}: {detail}"))
}

/// Why a tool's arguments were refused; its text is what the tool answers with.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum ArgError {
    #[error("missing required argument '{key}'")]
    Missing { key: String },
    #[error("'{key}' must be {expected}, got {got}")]
    WrongType {
        key: String,
        expected: &'static str,
        got: String,
    },
    #[error("'{key}' is not a representable number")]
    Unrepresentable { key: String },
    #[error("'{key}' must be an integer")]
    NotInteger { key: String },
    #[error("'{key}' is too long (at most {max} characters)")]
    TooLong { key: String, max: usize },
    #[error("'mode': {0}")]
    Mode(#[from] deermem_core::UnknownSearchMode),
}

impl ArgError {
    fn wrong_type(key: &str, expected: &'static str, got: &Value) -> Self {
        Self::WrongType {
            key: key.to_owned(),
            expected,
            got: json_type(got).to_owned(),
        }
    }
}

/// Refuses a string longer than `max` code points (the `maxLength` the schema declares).
fn check_length(key: &str, value: &str, max: usize) -> Result<(), ArgError> {
    if value.chars().nth(max).is_some() {
        Err(ArgError::TooLong {
            key: key.to_owned(),
            max,
        })
    } else {
        Ok(())
    }
}

fn check_optional_length(key: &str, value: Option<&str>, max: usize) -> Result<(), ArgError> {
    value.map_or(Ok(()), |v| check_length(key, v, max))
}

/// A present, non-null value for `key`.
fn present<'a>(args: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    args.get(key).filter(|v| !v.is_null())
}

fn required_str<'a>(args: &'a Map<String, Value>, key: &str) -> Result<&'a str, ArgError> {
    match present(args, key) {
        None => Err(ArgError::Missing {
            key: key.to_owned(),
        }),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ArgError::wrong_type(key, "a string", other)),
    }
}

fn optional_str<'a>(args: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ArgError> {
    match present(args, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ArgError::wrong_type(key, "a string or null", other)),
    }
}

/// `mode`: `bm25`, `vector` or `hybrid` (any case); absent, null or blank means the configured
/// default.
fn optional_mode(args: &Map<String, Value>) -> Result<Option<deermem_core::SearchMode>, ArgError> {
    match optional_str(args, "mode")? {
        Some(m) if !py::strip(m).is_empty() => {
            let mode = m.parse().map_err(|e: deermem_core::UnknownSearchMode| {
                ArgError::Mode(deermem_core::UnknownSearchMode(shorten(&e.0)))
            })?;
            Ok(Some(mode))
        }
        _ => Ok(None),
    }
}

/// A number (or a numeric string, as models sometimes send); `NaN` and infinities are passed on
/// for the backend to refuse with its own message.
fn optional_number(args: &Map<String, Value>, key: &str) -> Result<Option<f64>, ArgError> {
    match present(args, key) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .map(Some)
            .ok_or_else(|| ArgError::Unrepresentable {
                key: key.to_owned(),
            }),
        Some(Value::String(s)) => py::parse_float(s)
            .map(Some)
            .ok_or_else(|| ArgError::WrongType {
                key: key.to_owned(),
                expected: "a number",
                got: format!("the string {:?}", shorten(s)),
            }),
        Some(other) => Err(ArgError::wrong_type(key, "a number", other)),
    }
}

/// An integer: a JSON integer, a float with no fractional part, or a string of digits.
fn optional_int(args: &Map<String, Value>, key: &str) -> Result<Option<i64>, ArgError> {
    let not_int = || ArgError::NotInteger {
        key: key.to_owned(),
    };
    match present(args, key) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                Ok(Some(i))
            } else if n.as_u64().is_some() {
                Ok(Some(i64::MAX))
            } else {
                match n.as_f64() {
                    // `as` saturates; the value is clamped to the search bounds anyway.
                    Some(f) if f.is_finite() && f.fract() == 0.0 => Ok(Some(f as i64)),
                    _ => Err(not_int()),
                }
            }
        }
        Some(Value::String(s)) => py::strip(s).parse::<i64>().map(Some).map_err(|_| not_int()),
        Some(_) => Err(not_int()),
    }
}

/// A JSON value's type as error messages name it (`null`, `a string`, `an object`...).
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `s`, cut to [`ECHO_MAX_CHARS`] characters with an ellipsis, for echoing in messages.
fn shorten(s: &str) -> String {
    if py::char_len(s) <= ECHO_MAX_CHARS {
        s.to_owned()
    } else {
        format!("{}…", py::prefix_chars(s, ECHO_MAX_CHARS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn integers_accept_lax_forms_and_refuse_fractions() {
        let a =
            args(json!({"a": 5, "b": 5.0, "c": " 7 ", "d": 5.5, "e": "x", "f": true, "g": 1e300}));
        assert_eq!(optional_int(&a, "a"), Ok(Some(5)));
        assert_eq!(optional_int(&a, "b"), Ok(Some(5)));
        assert_eq!(optional_int(&a, "c"), Ok(Some(7)));
        assert!(optional_int(&a, "d").is_err());
        assert!(optional_int(&a, "e").is_err());
        assert!(optional_int(&a, "f").is_err());
        assert_eq!(optional_int(&a, "g"), Ok(Some(i64::MAX)));
        assert_eq!(optional_int(&a, "missing"), Ok(None));
    }

    #[test]
    fn numbers_accept_numeric_strings() {
        let a = args(json!({"a": 0.25, "b": "0.5", "c": "high", "d": [1]}));
        assert_eq!(optional_number(&a, "a"), Ok(Some(0.25)));
        assert_eq!(optional_number(&a, "b"), Ok(Some(0.5)));
        assert!(optional_number(&a, "c").is_err());
        assert!(optional_number(&a, "d").is_err());
    }

    #[test]
    fn long_echoes_are_shortened() {
        let long = "x".repeat(10_000);
        let short = shorten(&long);
        assert_eq!(py::char_len(&short), ECHO_MAX_CHARS + 1);
        assert!(short.ends_with('…'));
        assert_eq!(shorten("fact_1"), "fact_1");
    }
}
