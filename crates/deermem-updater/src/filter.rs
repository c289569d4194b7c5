//! Message filtering before extraction, as the reference filters: hidden messages, tool-calling
//! turns, upload blocks, trivial acknowledgements, and the admission rule that decides whether a
//! conversation is queued at all.

use std::fmt;
use std::sync::Arc;

use deermem_core::{Message, MessageKind};
use deermem_pycompat::py;
use serde_json::{Map, Value};

use crate::signals::{PatternSet, SignalSet};
use crate::uploads;

/// A host hook deciding whether a hidden (`hide_from_ui`) user message is kept, given its
/// `additional_kwargs`.
pub(crate) type HiddenMessageHook = Arc<dyn Fn(&Map<String, Value>) -> bool + Send + Sync>;

/// What to do with hidden user messages.
#[derive(Clone, Default)]
pub struct HiddenMessagePolicy {
    hook: Option<HiddenMessageHook>,
}

impl fmt::Debug for HiddenMessagePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HiddenMessagePolicy")
            .field("hook", &self.hook.as_ref().map(|_| "<fn>"))
            .finish()
    }
}

impl HiddenMessagePolicy {
    /// The default rule: keep only structured human-input responses (a clarification answer
    /// the host asked for).
    pub fn structural() -> Self {
        Self { hook: None }
    }

    /// A host hook replaces the default rule.
    pub fn with_hook(hook: HiddenMessageHook) -> Self {
        Self { hook: Some(hook) }
    }

    /// Whether a hidden message with these kwargs is kept.
    pub fn keeps(&self, kwargs: &Map<String, Value>) -> bool {
        match &self.hook {
            Some(h) => h(kwargs),
            None => is_human_input_response(kwargs),
        }
    }
}

/// The default keep rule for hidden messages (a version-1 structured answer to a clarification
/// request: a text answer, or an option with an id).
pub use deermem_core::message::is_human_input_response;

/// Keeps user turns and final assistant answers: hidden user messages go unless the policy keeps
/// them, upload blocks are stripped (an upload-only turn and the assistant reply to it are
/// dropped), tool-calling assistant turns and every other message type are dropped.
pub(crate) fn filter_messages_for_memory(
    messages: &[Message],
    hidden: &HiddenMessagePolicy,
) -> Vec<Message> {
    let mut out = Vec::new();
    let mut skip_next_ai = false;
    for msg in messages {
        match msg.kind {
            MessageKind::Human => {
                if msg.is_hidden() && !hidden.keeps(&msg.additional_kwargs) {
                    continue;
                }
                let text = msg.text();
                if uploads::mentions_upload_block(&text) {
                    let rest = uploads::strip_upload_blocks(&text);
                    if rest.is_empty() {
                        skip_next_ai = true;
                        continue;
                    }
                    let mut copy = msg.clone();
                    copy.content = Value::String(rest);
                    out.push(copy);
                } else {
                    out.push(msg.clone());
                }
                skip_next_ai = false;
            }
            MessageKind::Ai if keep_ai(msg, &mut skip_next_ai) => out.push(msg.clone()),
            _ => {}
        }
    }
    out
}

/// Whether an assistant turn is kept: never one that calls tools, nor the reply to a dropped
/// user turn (which `skip_next_ai` marks, and this call clears).
fn keep_ai(msg: &Message, skip_next_ai: &mut bool) -> bool {
    msg.tool_calls.is_empty() && !std::mem::take(skip_next_ai)
}

/// Characters trimmed from the end of a user turn before the trivial patterns are tried.
const TRIVIAL_TRAILING: &[char] = &[
    ' ', '\t', '\n', '\r', '.', '。', ',', '，', '!', '！', '?', '？', ';', '；',
];

/// Drops trivial acknowledgements ("ok", "thanks", "好的") and the assistant reply to each
/// (a user turn is trivial when a pattern matches all of it once trailing punctuation is
/// trimmed). With no trivial patterns the input is returned unchanged.
pub(crate) fn filter_trivial(messages: &[Message], patterns: &PatternSet) -> Vec<Message> {
    if patterns.trivial_is_empty() {
        return messages.to_vec();
    }
    let mut out = Vec::new();
    let mut skip_next_ai = false;
    for msg in messages {
        match msg.kind {
            MessageKind::Human => {
                let text = msg.text();
                let t = py::strip(&text).trim_end_matches(TRIVIAL_TRAILING);
                if !t.is_empty() && patterns.is_trivial(t) {
                    skip_next_ai = true;
                } else {
                    out.push(msg.clone());
                    skip_next_ai = false;
                }
            }
            MessageKind::Ai if keep_ai(msg, &mut skip_next_ai) => out.push(msg.clone()),
            _ => {}
        }
    }
    out
}

/// A conversation admitted for extraction: the filtered messages and their signals.
#[derive(Clone, Debug, PartialEq)]
pub struct Admitted {
    /// The filtered conversation (this, not the raw one, is queued).
    pub messages: Vec<Message>,
    /// Signals of the last six filtered messages.
    pub signals: SignalSet,
}

/// The admission rule: filter, drop trivial turns, and admit only a conversation that still holds
/// at least one user turn and one assistant turn.
pub fn admit(
    messages: &[Message],
    hidden: &HiddenMessagePolicy,
    patterns: &PatternSet,
) -> Option<Admitted> {
    let filtered = filter_trivial(&filter_messages_for_memory(messages, hidden), patterns);
    let has_human = filtered.iter().any(|m| m.kind == MessageKind::Human);
    let has_ai = filtered.iter().any(|m| m.kind == MessageKind::Ai);
    if !(has_human && has_ai) {
        return None;
    }
    let signals = patterns.detect_recent(&filtered);
    Some(Admitted {
        messages: filtered,
        signals,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn hidden(text: &str, kwargs: Value) -> Message {
        let mut m = Message::human(text);
        let mut k = kwargs.as_object().cloned().unwrap_or_default();
        k.insert("hide_from_ui".into(), json!(true));
        m.additional_kwargs = k;
        m
    }

    fn texts(ms: &[Message]) -> Vec<String> {
        ms.iter().map(Message::text).collect()
    }

    fn tool_ai() -> Message {
        let mut m = Message::ai("");
        m.tool_calls = vec![json!({"name": "search"})];
        m
    }

    fn response(kind: &str, option_id: Option<&str>) -> Value {
        let mut r = json!({"version": 1, "kind": "human_input_response", "source": "ask",
                           "request_id": "r1", "value": "B", "response_kind": kind});
        if let Some(o) = option_id {
            r["option_id"] = json!(o);
        }
        json!({ "human_input_response": r })
    }

    #[test]
    fn upload_only_turn_and_its_reply_are_dropped() {
        for tag in ["uploaded_files", "current_uploads"] {
            let msgs = vec![
                Message::human(format!("<{tag}>\n/mnt/user-data/uploads/a.csv\n</{tag}>")),
                Message::ai("I see the file."),
            ];
            assert!(
                filter_messages_for_memory(&msgs, &HiddenMessagePolicy::structural()).is_empty()
            );
        }
    }

    #[test]
    fn upload_with_question_keeps_the_question_as_plain_text() {
        let mut h = Message::human("");
        h.content = json!([{"type": "text", "text": "<uploaded_files>/mnt/user-data/uploads/a.csv</uploaded_files>\nSummarise it"}]);
        h.id = Some("m1".into());
        let out = filter_messages_for_memory(
            &[h, Message::ai("Sure")],
            &HiddenMessagePolicy::structural(),
        );
        assert_eq!(texts(&out), vec!["Summarise it", "Sure"]);
        assert_eq!(out[0].content, json!("Summarise it"));
        assert_eq!(out[0].id.as_deref(), Some("m1"));
        assert!(
            !texts(&out)
                .iter()
                .any(|t| t.contains("/mnt/user-data/uploads/"))
        );
    }

    #[test]
    fn tool_turns_and_other_types_are_dropped() {
        let msgs = vec![
            Message::human("q"),
            tool_ai(),
            Message::tool("result"),
            Message::system("sys"),
            Message::ai("answer"),
            Message::ai(""),
        ];
        let out = filter_messages_for_memory(&msgs, &HiddenMessagePolicy::structural());
        assert_eq!(texts(&out), vec!["q", "answer", ""]);
    }

    #[test]
    fn multi_turn_with_upload_in_the_middle() {
        let msgs = vec![
            Message::human("first"),
            Message::ai("a1"),
            Message::human("<uploaded_files>x</uploaded_files>"),
            Message::ai("a2"),
            Message::human("third"),
            Message::ai("a3"),
        ];
        let out = filter_messages_for_memory(&msgs, &HiddenMessagePolicy::structural());
        assert_eq!(texts(&out), vec!["first", "a1", "third", "a3"]);
    }

    #[test]
    fn hidden_messages_follow_the_keep_rule() {
        let p = HiddenMessagePolicy::structural();
        let msgs = vec![
            hidden("<memory>User likes tea</memory>", json!({})),
            Message::ai("a1"),
            hidden("B", response("option", Some("opt-b"))),
            hidden("C", response("option", None)),
            hidden("D", response("text", None)),
        ];
        assert_eq!(
            texts(&filter_messages_for_memory(&msgs, &p)),
            vec!["a1", "B", "D"]
        );
        let mut shown = Message::human("visible");
        shown
            .additional_kwargs
            .insert("hide_from_ui".into(), json!(false));
        assert_eq!(
            texts(&filter_messages_for_memory(&[shown], &p)),
            vec!["visible"]
        );
        // A host hook replaces the default rule.
        let keep_all = HiddenMessagePolicy::with_hook(Arc::new(|_| true));
        assert_eq!(filter_messages_for_memory(&msgs[..1], &keep_all).len(), 1);
    }

    #[test]
    fn human_input_response_versions_compare_like_python() {
        for v in [json!(1), json!(1.0), json!(true)] {
            let mut r = response("text", None);
            r["human_input_response"]["version"] = v.clone();
            assert!(is_human_input_response(r.as_object().unwrap()), "{v}");
        }
        let mut r = response("text", None);
        r["human_input_response"]["value"] = json!("  ");
        assert!(!is_human_input_response(r.as_object().unwrap()));
    }

    #[test]
    fn verified_sequence_from_the_reference() {
        let msgs = vec![
            Message::human("<uploaded_files>x</uploaded_files>"),
            hidden("reminder", json!({})),
            Message::ai("reply1"),
            Message::ai("reply2"),
        ];
        let out = filter_messages_for_memory(&msgs, &HiddenMessagePolicy::structural());
        assert_eq!(texts(&out), vec!["reply2"]);
    }

    #[test]
    fn trivial_turns_are_dropped_with_their_reply() {
        let p = PatternSet::bundled();
        let seq = [
            "ok.",
            "a1",
            "OK!! ",
            "a2",
            "Okay then",
            "a3",
            "!!!",
            "a4",
            "嗯嗯",
            "a5",
        ];
        let msgs: Vec<Message> = seq
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if i % 2 == 0 {
                    Message::human(*t)
                } else {
                    Message::ai(*t)
                }
            })
            .collect();
        assert_eq!(
            texts(&filter_trivial(&msgs, &p)),
            vec!["Okay then", "a3", "!!!", "a4"]
        );
        let empty = PatternSet::empty();
        assert_eq!(filter_trivial(&msgs, &empty).len(), msgs.len());
    }

    #[test]
    fn admission_needs_a_user_and_an_assistant_turn() {
        let p = PatternSet::bundled();
        let hp = HiddenMessagePolicy::structural();
        assert!(admit(&[Message::human("I prefer tabs")], &hp, &p).is_none());
        assert!(admit(&[Message::human("thanks"), Message::ai("welcome")], &hp, &p).is_none());
        let a = admit(
            &[Message::human("I prefer tabs"), Message::ai("Noted")],
            &hp,
            &p,
        )
        .unwrap();
        assert_eq!(a.messages.len(), 2);
        assert!(a.signals.contains(crate::signals::Signal::Preference));
    }
}
