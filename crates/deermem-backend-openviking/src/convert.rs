//! Message handling of the capture path: the hidden message filter, which messages are
//! recorded, their conversion to OpenViking `{role, parts, peer_id}` payloads, and the content
//! hash each cursor entry holds (a SHA-256 of the message's canonical JSON).

use std::sync::Arc;

use deermem_core::{Message, MessageKind};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The host hook deciding whether a `hide_from_ui` message is still captured; it receives the
/// message's `additional_kwargs`. The default keeps a hidden message only when it is a
/// human-input clarification answer ([`deermem_core::message::is_human_input_response`], the
/// rule the updater's filter also applies).
pub type HiddenMessageFilter = Arc<dyn Fn(&Map<String, Value>) -> bool + Send + Sync>;

/// The messages DeerFlow lets through to the recorder: everything but `hide_from_ui` messages
/// the hook does not keep. Tool calls and tool results are kept.
pub(crate) fn captureable(
    messages: Vec<Message>,
    keep_hidden: &HiddenMessageFilter,
) -> Vec<Message> {
    messages
        .into_iter()
        .filter(|m| !m.is_hidden() || keep_hidden(&m.additional_kwargs))
        .collect()
}

/// The recorder's text of a message: a string as is; for a list, string items, `text` of
/// `type: text` blocks and string `content` of blocks, joined by `\n`, empty chunks dropped.
pub(crate) fn message_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(items) => items
            .iter()
            .filter_map(|item| match item {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => {
                    if o.get("type").and_then(Value::as_str) == Some("text")
                        && let Some(t) = o.get("text").and_then(Value::as_str)
                    {
                        return Some(t);
                    }
                    o.get("content").and_then(Value::as_str)
                }
                _ => None,
            })
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// Whether the recorder records a message at all.
pub(crate) fn is_recordable(m: &Message) -> bool {
    if m.kind == MessageKind::System {
        return false;
    }
    if m.additional_kwargs.get("lc_source").and_then(Value::as_str) == Some("summarization") {
        return false;
    }
    if m.kind == MessageKind::Ai && message_text(&m.content).is_empty() && m.tool_calls.is_empty() {
        return false;
    }
    true
}

fn kwarg_str<'a>(m: &'a Message, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|k| m.additional_kwargs.get(*k).and_then(Value::as_str))
}

/// The tool call a tool result answers: the message's `tool_call_id`, else
/// `additional_kwargs.tool_call_id` / `tool_id`.
fn tool_call_id(m: &Message) -> Option<&str> {
    m.tool_call_id
        .as_deref()
        .or_else(|| kwarg_str(m, &["tool_call_id", "tool_id"]))
}

/// A tool result's status: the message's `status`, else `additional_kwargs.status` /
/// `tool_status`.
fn tool_status(m: &Message) -> Option<&str> {
    m.status
        .as_deref()
        .or_else(|| kwarg_str(m, &["status", "tool_status"]))
}

fn py_str_or_empty(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => deermem_pycompat::py::py_str(other).unwrap_or_else(|| other.to_string()),
    }
}

fn text_part(text: String) -> Value {
    json!({"type": "text", "text": text})
}

/// One tool-call part of an assistant turn; accepts LangChain (`name`, `args`) and
/// chat-completions (`function.name`, `function.arguments`) spellings.
fn tool_call_part(call: &Value) -> Value {
    let empty = Map::new();
    let obj = call.as_object().unwrap_or(&empty);
    let function = obj.get("function").and_then(Value::as_object);
    let name = obj
        .get("name")
        .filter(|v| !v.is_null())
        .or_else(|| function.and_then(|f| f.get("name")));
    let raw_args = match obj.get("args") {
        Some(a) => Some(a.clone()),
        None => function.and_then(|f| f.get("arguments")).map(|a| match a {
            Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or_else(|_| a.clone()),
            other => other.clone(),
        }),
    };
    let args = match raw_args {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::Object(o)) => Value::Object(o),
        Some(other) => json!({ "value": other }),
    };
    json!({
        "type": "tool",
        "tool_id": py_str_or_empty(obj.get("id")),
        "tool_name": py_str_or_empty(name),
        "tool_input": args,
        "tool_status": "pending",
    })
}

/// Converts one message to a batch payload (without `peer_id`), or `None` when it is skipped.
pub(crate) fn to_payload(m: &Message) -> Option<Value> {
    if !is_recordable(m) {
        return None;
    }
    let text = message_text(&m.content);
    match &m.kind {
        MessageKind::Human => Some(json!({"role": "user", "parts": [text_part(text)]})),
        MessageKind::Ai => {
            let mut parts = Vec::new();
            if !text.is_empty() {
                parts.push(text_part(text));
            }
            parts.extend(m.tool_calls.iter().map(tool_call_part));
            if parts.is_empty() {
                parts.push(text_part(String::new()));
            }
            Some(json!({"role": "assistant", "parts": parts}))
        }
        MessageKind::Tool => {
            let status = tool_status(m);
            Some(json!({
                "role": "assistant",
                "parts": [{
                    "type": "tool",
                    "tool_id": tool_call_id(m).unwrap_or_default(),
                    "tool_name": m.name.as_deref().or_else(|| kwarg_str(m, &["tool_name"])).unwrap_or_default(),
                    "tool_output": text,
                    "tool_status": if status == Some("error") { "error" } else { "completed" },
                }]
            }))
        }
        MessageKind::System => None,
        MessageKind::Other(_) => {
            if text.is_empty() {
                None
            } else {
                Some(json!({"role": "assistant", "parts": [text_part(text)]}))
            }
        }
    }
}

/// Converts the pending messages; each payload carries the index of its input message.
pub(crate) fn to_payloads(messages: &[Message], peer: &str) -> Vec<(usize, Value)> {
    messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            to_payload(m).map(|mut p| {
                if let Value::Object(o) = &mut p {
                    o.insert("peer_id".into(), Value::String(peer.to_owned()));
                }
                (i, p)
            })
        })
        .collect()
}

/// Python's `json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":"))` for the
/// JSON values a message holds.
fn canonical_json(v: &Value, out: &mut String) {
    match v {
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(x) = o.get(k) {
                    canonical_json(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The content hash of a message, as the cursor stores it (hex SHA-256 of its canonical JSON).
///
/// The hashed fields are the reference's: id, role, content, tool calls, tool call id, tool name
/// and tool status; a message without tool data hashes exactly as in the reference.
pub fn message_signature(m: &Message) -> String {
    let tool_call_id = tool_call_id(m);
    let tool_name = m.name.as_deref().or_else(|| kwarg_str(m, &["tool_name"]));
    // LangChain's `ToolMessage.status` defaults to `success`; other messages have none.
    let tool_status = tool_status(m).or((m.kind == MessageKind::Tool).then_some("success"));
    let v = json!({
        "id": m.id,
        "role": m.kind.as_str(),
        "content": m.content,
        "tool_calls": m.tool_calls,
        "tool_call_id": tool_call_id,
        "tool_name": tool_name,
        "tool_status": tool_status,
    });
    let mut out = String::new();
    canonical_json(&v, &mut out);
    hex::encode(Sha256::digest(out.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(v: Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn signature_matches_the_reference_capture() {
        let mut h = Message::human("Remember Vim.");
        h.id = Some("h1".into());
        assert_eq!(
            message_signature(&h),
            "9bc605b3f5585428ef012494676db93783edbc3e060cf551458c4b0cdc1faf04"
        );
        let mut other = h.clone();
        other.content = Value::String("Remember Emacs.".into());
        assert_ne!(message_signature(&h), message_signature(&other));
    }

    #[test]
    fn canonical_json_sorts_nested_keys() {
        let mut out = String::new();
        canonical_json(
            &json!({"b": {"z": 1, "a": [true, null, "é\n"]}, "a": 1.5}),
            &mut out,
        );
        assert_eq!(out, r#"{"a":1.5,"b":{"a":[true,null,"é\n"],"z":1}}"#);
    }

    #[test]
    fn reference_batch_example_converts_exactly() {
        let messages = vec![
            Message::system("You are helpful."),
            Message::human("Remember I use Vim."),
            msg(json!({"type": "ai", "content": "", "tool_calls": [
                {"name": "web_search", "args": {"q": "vim"}, "id": "call-1", "type": "tool_call"}
            ]})),
            msg(
                json!({"type": "tool", "content": "search output", "name": "web_search",
                        "additional_kwargs": {"tool_call_id": "call-1"}}),
            ),
            Message::ai("Noted."),
        ];
        let payloads: Vec<Value> = to_payloads(&messages, "deerflow")
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        assert_eq!(
            Value::Array(payloads),
            json!([
             {"role":"user","parts":[{"type":"text","text":"Remember I use Vim."}],"peer_id":"deerflow"},
             {"role":"assistant","parts":[{"type":"tool","tool_id":"call-1","tool_name":"web_search","tool_input":{"q":"vim"},"tool_status":"pending"}],"peer_id":"deerflow"},
             {"role":"assistant","parts":[{"type":"tool","tool_id":"call-1","tool_name":"web_search","tool_output":"search output","tool_status":"completed"}],"peer_id":"deerflow"},
             {"role":"assistant","parts":[{"type":"text","text":"Noted."}],"peer_id":"deerflow"}
            ])
        );
        let indices: Vec<usize> = to_payloads(&messages, "p")
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(indices, vec![1, 2, 3, 4]);
    }

    #[test]
    fn recordable_rules() {
        assert!(!is_recordable(&Message::system("s")));
        assert!(!is_recordable(&Message::ai("")));
        assert!(!is_recordable(&msg(
            json!({"type": "human", "content": "x", "additional_kwargs": {"lc_source": "summarization"}})
        )));
        assert!(is_recordable(&Message::human("")));
        assert_eq!(
            to_payload(&Message::human("")).unwrap(),
            json!({"role": "user", "parts": [{"type": "text", "text": ""}]})
        );
        assert!(to_payload(&msg(json!({"type": "chat", "content": ""}))).is_none());
        assert_eq!(
            to_payload(&msg(json!({"type": "chat", "content": "hi"}))).unwrap(),
            json!({"role": "assistant", "parts": [{"type": "text", "text": "hi"}]})
        );
    }

    #[test]
    fn ai_text_and_tool_calls_and_odd_args() {
        let m = msg(
            json!({"role": "assistant", "content": [{"type": "text", "text": "a"}, "", {"content": "b"}, 3],
            "additional_kwargs": {"tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
                {"id": 7, "type": "function", "function": {"name": "g", "arguments": "[1]"}}
            ]}}),
        );
        let p = to_payload(&m).unwrap();
        assert_eq!(p["parts"][0], json!({"type": "text", "text": "a\nb"}));
        assert_eq!(p["parts"][1]["tool_input"], json!({"x": 1}));
        assert_eq!(p["parts"][1]["tool_name"], "f");
        assert_eq!(p["parts"][2]["tool_input"], json!({"value": [1]}));
        assert_eq!(p["parts"][2]["tool_id"], "7");
        let none_args =
            msg(json!({"type": "ai", "content": "", "tool_calls": [{"name": "n", "args": null}]}));
        let p = to_payload(&none_args).unwrap();
        assert_eq!(
            p["parts"],
            json!([{"type":"tool","tool_id":"","tool_name":"n","tool_input":{},"tool_status":"pending"}])
        );
        let err_tool = msg(
            json!({"type": "tool", "content": "boom", "additional_kwargs": {"status": "error"}}),
        );
        assert_eq!(
            to_payload(&err_tool).unwrap()["parts"][0]["tool_status"],
            "error"
        );
    }

    #[test]
    fn hidden_messages_are_dropped_unless_kept() {
        let keep: HiddenMessageFilter = Arc::new(deermem_core::message::is_human_input_response);
        let hidden = msg(
            json!({"type": "human", "content": "<memory>x</memory>", "additional_kwargs": {"hide_from_ui": true}}),
        );
        let answer = msg(
            json!({"type": "human", "content": "B", "additional_kwargs": {"hide_from_ui": true,
            "human_input_response": {"version": 1, "kind": "human_input_response", "source": "ui",
            "request_id": "r1", "value": "B", "response_kind": "option", "option_id": "o2"}}}),
        );
        let mut bad_answer = answer.clone();
        if let Some(Value::Object(r)) = bad_answer.additional_kwargs.get_mut("human_input_response")
        {
            r.remove("option_id");
        }
        let out = captureable(
            vec![Message::human("a"), hidden, answer.clone(), bad_answer],
            &keep,
        );
        assert_eq!(out, vec![Message::human("a"), answer]);
    }
}
