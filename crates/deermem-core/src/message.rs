//! Conversation messages as hosts hand them to the engine: LangChain-like objects with a type,
//! string-or-blocks content, extra keyword arguments and tool calls.
//!
//! Three JSON spellings are accepted: `{"role": "user", "content": ...}` (chat-completions),
//! `{"type": "human", "content": ..., "additional_kwargs": ...}` (a LangChain message), and
//! `{"type": "human", "data": {...}}` (LangChain's `messages_to_dict` dump).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Who produced a message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// The user (`human`, role `user`).
    Human,
    /// The assistant (`ai`, role `assistant`).
    Ai,
    /// A system prompt.
    System,
    /// A tool result.
    Tool,
    /// Anything else, by name.
    Other(String),
}

impl MessageKind {
    /// Parses a LangChain type or a chat-completions role.
    pub fn parse(s: &str) -> Self {
        match s.to_ascii_lowercase().as_str() {
            "human" | "user" | "humanmessage" | "humanmessagechunk" => Self::Human,
            "ai" | "assistant" | "aimessage" | "aimessagechunk" => Self::Ai,
            "system" | "systemmessage" | "developer" => Self::System,
            "tool" | "function" | "toolmessage" => Self::Tool,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The LangChain type name.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Human => "human",
            Self::Ai => "ai",
            Self::System => "system",
            Self::Tool => "tool",
            Self::Other(s) => s,
        }
    }
}

/// One conversation message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Who produced it.
    pub kind: MessageKind,
    /// A string, or a list of content blocks (`{"type": "text", "text": ...}`, images...).
    pub content: Value,
    /// Host metadata (`hide_from_ui`, `human_input_response`...).
    pub additional_kwargs: Map<String, Value>,
    /// Tool calls of an AI turn; a non-empty list marks an intermediate turn.
    pub tool_calls: Vec<Value>,
    /// Message id.
    pub id: Option<String>,
    /// Optional author name.
    pub name: Option<String>,
    /// The tool call a tool result answers (`tool_call_id` of a LangChain `ToolMessage` or a
    /// chat-completions `{"role": "tool"}` message).
    pub tool_call_id: Option<String>,
    /// A tool result's status (`success` or `error` in LangChain's `ToolMessage`).
    pub status: Option<String>,
}

impl Message {
    fn with(kind: MessageKind, text: impl Into<String>) -> Self {
        Self {
            kind,
            content: Value::String(text.into()),
            additional_kwargs: Map::new(),
            tool_calls: Vec::new(),
            id: None,
            name: None,
            tool_call_id: None,
            status: None,
        }
    }

    /// A user message.
    pub fn human(text: impl Into<String>) -> Self {
        Self::with(MessageKind::Human, text)
    }

    /// An assistant message.
    pub fn ai(text: impl Into<String>) -> Self {
        Self::with(MessageKind::Ai, text)
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::with(MessageKind::System, text)
    }

    /// A tool result.
    pub fn tool(text: impl Into<String>) -> Self {
        Self::with(MessageKind::Tool, text)
    }

    /// The message text for filtering and signals (the reference's `extract_message_text`):
    /// string content as is; for a list, string items and the `text` of block items joined by
    /// one space; anything else as Python's `str()` would show it.
    pub fn text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            Value::Array(items) => items
                .iter()
                .filter_map(|i| match i {
                    Value::String(s) => Some(s.clone()),
                    Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_owned),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join(" "),
            Value::Null => "None".to_owned(),
            other => deermem_pycompat::py::py_str(other).unwrap_or_else(|| other.to_string()),
        }
    }

    /// Whether the host hid this message from its UI.
    pub fn is_hidden(&self) -> bool {
        self.additional_kwargs
            .get("hide_from_ui")
            .is_some_and(deermem_pycompat::py::truthy)
    }
}

fn empty_content() -> Value {
    Value::String(String::new())
}

/// The accepted spellings of a message: `{"role": ..., "content": ...}` (chat completions),
/// `{"type": "human"|"ai"|..., "content": ...}` (LangChain), or a LangChain dump
/// `{"type": ..., "data": {...}}`. One of `role` / `type` is needed.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Message"))]
struct RawMessage {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default = "empty_content")]
    content: Value,
    #[serde(default)]
    additional_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tool_call_id: Option<Value>,
    #[serde(default)]
    status: Option<Value>,
    #[serde(default)]
    data: Option<Box<RawMessage>>,
}

/// An id given as a string, or as another JSON value (rendered as JSON text); `null` is none.
fn id_text(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawMessage::deserialize(d)?;
        let (outer_kind, raw) = match raw.data {
            Some(inner) => (raw.kind.or(raw.role), *inner),
            None => (None, raw),
        };
        let kind_name = raw
            .kind
            .or(raw.role)
            .or(outer_kind)
            .ok_or_else(|| serde::de::Error::custom("message needs a \"role\" or \"type\""))?;
        let mut additional_kwargs = raw.additional_kwargs.unwrap_or_default();
        // Chat-completions tool calls may also sit in additional_kwargs.
        let mut tool_calls = raw.tool_calls.unwrap_or_default();
        if tool_calls.is_empty()
            && let Some(Value::Array(calls)) = additional_kwargs.get("tool_calls")
        {
            tool_calls = calls.clone();
        }
        additional_kwargs.shift_remove("tool_calls");
        Ok(Self {
            kind: MessageKind::parse(&kind_name),
            content: raw.content,
            additional_kwargs,
            tool_calls,
            id: raw.id.and_then(id_text),
            name: raw.name,
            tool_call_id: raw.tool_call_id.and_then(id_text),
            // A status that is not a string carries nothing the backends can use.
            status: raw.status.and_then(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            }),
        })
    }
}

impl Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("type", self.kind.as_str())?;
        m.serialize_entry("content", &self.content)?;
        if !self.additional_kwargs.is_empty() {
            m.serialize_entry("additional_kwargs", &self.additional_kwargs)?;
        }
        if !self.tool_calls.is_empty() {
            m.serialize_entry("tool_calls", &self.tool_calls)?;
        }
        let optional = [
            ("id", &self.id),
            ("name", &self.name),
            ("tool_call_id", &self.tool_call_id),
            ("status", &self.status),
        ];
        for (key, value) in optional {
            if let Some(v) = value {
                m.serialize_entry(key, v)?;
            }
        }
        m.end()
    }
}

/// A message's JSON Schema is the schema of what its `Deserialize` accepts.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Message {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Message".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        generator.subschema_for::<RawMessage>()
    }
}

/// Whether a hidden (`hide_from_ui`) message is a human-input clarification answer, which
/// DeerFlow keeps: `additional_kwargs.human_input_response` with version 1 (as Python's `==`
/// sees it), kind `human_input_response`, non-blank `source`, `request_id` and `value` (blank as
/// Python's `str.strip` sees it), and either `response_kind == "text"` or
/// `response_kind == "option"` with a non-blank `option_id`. The updater's default filter and
/// the remote backends' capture share it.
pub fn is_human_input_response(kwargs: &Map<String, Value>) -> bool {
    let Some(Value::Object(r)) = kwargs.get("human_input_response") else {
        return false;
    };
    let non_blank = |k: &str| {
        r.get(k)
            .and_then(Value::as_str)
            .is_some_and(|s| !deermem_pycompat::py::strip(s).is_empty())
    };
    let response_ok = match r.get("response_kind").and_then(Value::as_str) {
        Some("text") => true,
        Some("option") => non_blank("option_id"),
        _ => false,
    };
    r.get("version")
        .is_some_and(|v| deermem_pycompat::py::py_eq(v, &Value::from(1)))
        && r.get("kind").and_then(Value::as_str) == Some("human_input_response")
        && non_blank("source")
        && non_blank("request_id")
        && non_blank("value")
        && response_ok
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_all_three_spellings() {
        let msgs: Vec<Message> = serde_json::from_value(json!([
            {"role": "user", "content": "hi"},
            {"type": "ai", "content": [{"type": "text", "text": "a"}, "b"], "tool_calls": [{"name": "x"}]},
            {"type": "human", "data": {"content": "dumped", "additional_kwargs": {"hide_from_ui": true}}},
            {"role": "assistant", "content": null, "additional_kwargs": {"tool_calls": [{"id": 1}]}}
        ]))
        .unwrap();
        assert_eq!(msgs[0].kind, MessageKind::Human);
        assert_eq!(msgs[0].text(), "hi");
        assert_eq!(msgs[1].kind, MessageKind::Ai);
        assert_eq!(msgs[1].text(), "a b");
        assert_eq!(msgs[1].tool_calls.len(), 1);
        assert_eq!(msgs[2].kind, MessageKind::Human);
        assert!(msgs[2].is_hidden());
        assert_eq!(msgs[3].tool_calls.len(), 1);
        assert_eq!(msgs[3].text(), "None");
    }

    #[test]
    fn tool_results_keep_their_call_id_and_status() {
        let msgs: Vec<Message> = serde_json::from_value(json!([
            {"type": "tool", "data": {"content": "out", "tool_call_id": "call-1", "status": "error", "name": "search"}},
            {"role": "tool", "tool_call_id": "call-2", "content": "ok"},
            {"role": "tool", "tool_call_id": 7, "content": "n", "status": 3}
        ]))
        .unwrap();
        assert_eq!(msgs[0].tool_call_id.as_deref(), Some("call-1"));
        assert_eq!(msgs[0].status.as_deref(), Some("error"));
        assert_eq!(msgs[1].tool_call_id.as_deref(), Some("call-2"));
        assert_eq!(msgs[1].status, None);
        assert_eq!(msgs[2].tool_call_id.as_deref(), Some("7"));
        assert_eq!(msgs[2].status, None);
        let v = serde_json::to_value(&msgs[0]).unwrap();
        assert_eq!(
            v,
            json!({"type": "tool", "content": "out", "name": "search", "tool_call_id": "call-1", "status": "error"})
        );
        let back: Message = serde_json::from_value(v).unwrap();
        assert_eq!(back, msgs[0]);
    }

    #[test]
    fn rejects_messages_without_role() {
        assert!(serde_json::from_value::<Message>(json!({"content": "x"})).is_err());
    }

    #[test]
    fn serializes_as_langchain_shape() {
        let v = serde_json::to_value(Message::human("x")).unwrap();
        assert_eq!(v, json!({"type": "human", "content": "x"}));
    }
}
