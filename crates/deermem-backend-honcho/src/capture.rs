//! Turning a raw host transcript into Honcho messages: keep user inputs and final assistant
//! answers, convert content to text the way the reference's Honcho backend does, cut each
//! message to the character limit, and sign each message (hash only) for the capture cursor.

use deermem_core::message::{Message, MessageKind};
use deermem_pycompat::py;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Honcho's largest message batch.
pub(crate) const MAX_BATCH: usize = 100;

/// Who a captured message is attributed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The user peer.
    User,
    /// The assistant peer.
    Assistant,
}

/// One message ready to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Captured {
    /// Whose message it is.
    pub(crate) side: Side,
    /// The stripped text, cut to the limit.
    pub(crate) content: String,
    /// Whether the text was cut.
    pub(crate) truncated: bool,
    /// A hash of the message identity and full text (never the text itself).
    pub(crate) signature: String,
}

/// The reference's Honcho text conversion: a string as is; a list joined with `"\n"` from its
/// string items and the string `text` of its mapping items; `null` as `""`; other scalars as
/// Python's `str()` shows them.
pub(crate) fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(|i| match i {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => o.get("text").and_then(Value::as_str),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null | Value::Bool(false) => String::new(),
        Value::Object(_) => content.to_string(),
        other => py::py_str(other).unwrap_or_default(),
    }
}

fn signature(side: Side, id: Option<&str>, text: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"honcho-capture-v1\0");
    h.update(match side {
        Side::User => b"u\0",
        Side::Assistant => b"a\0",
    });
    match id {
        Some(id) => {
            h.update(b"1");
            h.update((id.len() as u64).to_be_bytes());
            h.update(id.as_bytes());
        }
        None => h.update(b"0"),
    }
    h.update(text.as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// Selects and converts the messages to send.
///
/// Kept: human messages (hidden ones only when they are clarification responses) and AI
/// messages without tool calls; everything else (system, tool, tool-calling AI turns) is
/// dropped, as are messages whose stripped text is empty.
pub(crate) fn capture(messages: &[Message], char_limit: usize) -> Vec<Captured> {
    messages
        .iter()
        .filter_map(|m| {
            let side = match m.kind {
                MessageKind::Human => {
                    if m.is_hidden()
                        && !deermem_core::message::is_human_input_response(&m.additional_kwargs)
                    {
                        return None;
                    }
                    Side::User
                }
                MessageKind::Ai => {
                    if !m.tool_calls.is_empty() {
                        return None;
                    }
                    Side::Assistant
                }
                _ => return None,
            };
            let raw = content_text(&m.content);
            let text = py::strip(&raw);
            if text.is_empty() {
                return None;
            }
            let cut = py::prefix_chars(text, char_limit);
            Some(Captured {
                side,
                content: cut.to_owned(),
                truncated: cut.len() < text.len(),
                signature: signature(side, m.id.as_deref(), text),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn msg(v: Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn reference_capture_example() {
        let msgs = vec![
            Message::system("sys"),
            Message::human("  hello there, this is a long message  "),
            msg(
                json!({"type": "ai", "content": "", "tool_calls": [{"name": "search", "args": {}, "id": "c1"}]}),
            ),
            Message::tool("tool output"),
            msg(
                json!({"type": "ai", "content": [{"type": "text", "text": "part A"}, {"type": "text", "text": "part B"}]}),
            ),
        ];
        let out = capture(&msgs, 20);
        let got: Vec<(Side, &str, bool)> = out
            .iter()
            .map(|c| (c.side, c.content.as_str(), c.truncated))
            .collect();
        assert_eq!(
            got,
            vec![
                (Side::User, "hello there, this is", true),
                (Side::Assistant, "part A\npart B", false)
            ]
        );
    }

    #[test]
    fn drops_hidden_human_messages_and_tool_calling_turns() {
        let msgs = vec![
            msg(
                json!({"type": "human", "content": "<memory>x</memory>", "additional_kwargs": {"hide_from_ui": true}}),
            ),
            msg(
                json!({"type": "human", "content": "answer", "additional_kwargs": {"hide_from_ui": true,
                "human_input_response": {"version": 1, "kind": "human_input_response", "source": "s", "request_id": "r", "value": "v", "response_kind": "text"}}}),
            ),
            msg(json!({"type": "ai", "content": "calling a tool", "tool_calls": [{"name": "t"}]})),
            msg(
                json!({"type": "ai", "content": "hidden ai kept", "additional_kwargs": {"hide_from_ui": true}}),
            ),
            msg(json!({"type": "human", "content": "   "})),
            msg(json!({"type": "AIMessageChunk", "content": "chunk"})),
        ];
        let out = capture(&msgs, 100);
        let texts: Vec<&str> = out.iter().map(|c| c.content.as_str()).collect();
        assert_eq!(texts, vec!["answer", "hidden ai kept", "chunk"]);
    }

    #[test]
    fn content_conversion() {
        assert_eq!(content_text(&json!("x")), "x");
        assert_eq!(
            content_text(&json!(["a", {"text": "b"}, {"type": "image"}, 3])),
            "a\nb"
        );
        assert_eq!(content_text(&json!(null)), "");
        assert_eq!(content_text(&json!(42)), "42");
        assert_eq!(content_text(&json!(true)), "True");
    }

    #[test]
    fn truncation_is_on_char_boundaries() {
        let out = capture(&[Message::human("日本語のテキスト")], 3);
        assert_eq!(out[0].content, "日本語");
        assert!(out[0].truncated);
    }

    #[test]
    fn signatures_hash_identity_not_text_and_distinguish_ids() {
        let mut a = Message::human("same");
        a.id = Some("m1".into());
        let mut b = Message::human("same");
        b.id = Some("m2".into());
        let out = capture(&[a.clone(), b, Message::ai("same")], 100);
        assert_ne!(out[0].signature, out[1].signature);
        assert_ne!(out[0].signature, out[2].signature);
        assert_eq!(capture(&[a], 100)[0].signature, out[0].signature);
        assert_eq!(out[0].signature.len(), 32);
        assert!(!out[0].signature.contains("same"));
        // The signature covers the full text, not just the cut part.
        let long1 = capture(&[Message::human("abcdef-1")], 3);
        let long2 = capture(&[Message::human("abcdef-2")], 3);
        assert_eq!(long1[0].content, long2[0].content);
        assert_ne!(long1[0].signature, long2[0].signature);
    }
}
