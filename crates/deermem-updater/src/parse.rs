//! The model's response → a typed, normalised update, following the reference's JSON contract.
//!
//! The first JSON object in the text that holds the keys `user`, `history` and `newFacts` is
//! taken, wherever it sits (code fences, `<think>` blocks, prose before or after, unrelated
//! earlier objects). Values are normalised item by item: a malformed item is dropped, never the
//! whole update, except for the unsafe-partial guard: removals together with a malformed new
//! fact reject the update, so that "remove and replace" can never degrade into "remove".

use indexmap::IndexMap;
use serde::Serialize;
#[cfg(test)]
use serde_json::Value;

use crate::text::normalize_label;
use deermem_pycompat::json::{Budget, ErrorKind, PyJson, decode_prefix};
use deermem_pycompat::py;

/// Responses longer than this are refused (no model answer to a memory prompt is this large).
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Bytes the scanner may examine in total, across every candidate object.
const SCAN_BUDGET_BYTES: u64 = 64 * 1024 * 1024;

/// New or consolidated fact content longer than this many code points is malformed: a fact is
/// one idea, and an oversized fact would crowd every other fact out of the injection budget.
pub(crate) const MAX_FACT_CONTENT_CHARS: usize = 2000;

/// The default confidence of a new fact without one.
pub(crate) const DEFAULT_NEW_FACT_CONFIDENCE: f64 = 0.5;

/// The default confidence of a consolidated fact without one (capped by its sources).
pub(crate) const DEFAULT_CONSOLIDATION_CONFIDENCE: f64 = 0.9;

/// Why a response could not be turned into an update.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// No JSON object with `user`, `history` and `newFacts` was found.
    #[error("No valid memory update JSON object found")]
    NoUpdateObject,
    /// Removals came with a malformed new fact; the whole update is refused.
    #[error("Unsafe partial memory update: factsToRemove with malformed newFacts")]
    UnsafePartialUpdate,
    /// The response is larger than [`MAX_RESPONSE_BYTES`].
    #[error("memory update response too large ({len} bytes; at most {max})")]
    TooLarge {
        /// Response size.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Scanning the response for a JSON object exceeded its work budget.
    #[error("memory update response too complex to scan")]
    TooComplex,
}

/// The two summary sections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SectionKind {
    /// `user`.
    User,
    /// `history`.
    History,
}

impl SectionKind {
    /// The section's key.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::History => "history",
        }
    }
}

/// A proposed summary replacement.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryProposal {
    /// `user` or `history`.
    pub section: SectionKind,
    /// The child key (`workContext`, `recentMonths`...).
    pub key: String,
    /// The new summary (kept as written, not stripped).
    pub summary: String,
    /// The `scope` label.
    pub scope: Option<String>,
    /// The `authority` label.
    pub authority: Option<String>,
}

/// A proposed new fact, normalised.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProposedFact {
    /// The item's index in the model's `newFacts` array (what `replacementFactIndex` refers
    /// to).
    pub index: usize,
    /// Stripped, non-empty content.
    pub content: String,
    /// Stripped category (`context` when missing or blank).
    pub category: String,
    /// Confidence in `[0, 1]`.
    pub confidence: f64,
    /// Stripped non-blank `sourceError`.
    pub source_error: Option<String>,
    /// A positive review window in days.
    pub expected_valid_days: Option<i128>,
    /// `scope` label.
    pub scope: Option<String>,
    /// `durability` label.
    pub durability: Option<String>,
    /// `authority` label.
    pub authority: Option<String>,
}

/// A proposed explicit confirmation of an existing fact.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReinforceEntry {
    /// Fact id (stripped).
    pub id: String,
    /// `scope` label.
    pub scope: Option<String>,
    /// Stripped non-blank reason.
    pub reason: Option<String>,
}

/// What a removal's `replacementFactIndex` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ReplacementRef {
    /// The key is absent: a pure retraction.
    None,
    /// A zero-based index into the model's `newFacts`.
    Index(usize),
    /// Present but not a non-negative integer (`null`, a float, a bool, a string...).
    Invalid,
}

/// A proposed contradiction removal.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RemovalEntry {
    /// Fact id (stripped).
    pub id: String,
    /// `scope` label.
    pub scope: Option<String>,
    /// Stripped non-blank reason.
    pub reason: Option<String>,
    /// The replacement fact, if any.
    pub replacement: ReplacementRef,
}

/// A proposed staleness removal.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StaleRemoval {
    /// Fact id (as written, not stripped).
    pub id: String,
    /// Reason (empty when absent).
    pub reason: String,
}

/// A proposed staleness extension.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StaleExtension {
    /// Fact id (as written).
    pub id: String,
    /// Positive number of days (floats truncated toward zero).
    pub extend_by_days: i128,
    /// Reason (empty when absent).
    pub reason: String,
}

/// A proposed merge of several facts into one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConsolidationProposal {
    /// Distinct non-empty source ids, in order (at least two).
    pub source_ids: Vec<String>,
    /// Stripped merged content.
    pub content: String,
    /// Stripped category (`context` when missing or blank).
    pub category: String,
    /// The model's confidence, when it gave a finite number.
    pub confidence: Option<f64>,
    /// `scope` label.
    pub scope: Option<String>,
    /// `durability` label.
    pub durability: Option<String>,
    /// `authority` label.
    pub authority: Option<String>,
}

/// A normalised update: what either proposer (model or offline rules) produces and what the
/// gates consume.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProposedUpdate {
    /// Summary replacements that asked to be applied (`shouldUpdate` and `summary` truthy).
    pub summaries: Vec<SummaryProposal>,
    /// New facts that survived normalisation, in the model's order.
    pub new_facts: Vec<ProposedFact>,
    /// How many `newFacts` items were dropped as malformed.
    pub dropped_new_facts: usize,
    /// Summary proposals dropped as malformed (a non-string summary).
    pub dropped_summaries: usize,
    /// Explicit confirmations.
    pub facts_to_reinforce: Vec<ReinforceEntry>,
    /// Contradiction removals.
    pub facts_to_remove: Vec<RemovalEntry>,
    /// Staleness removals.
    pub stale_facts_to_remove: Vec<StaleRemoval>,
    /// Staleness extensions.
    pub stale_facts_to_extend: Vec<StaleExtension>,
    /// Consolidations.
    pub facts_to_consolidate: Vec<ConsolidationProposal>,
}

impl ProposedUpdate {
    /// Whether the update proposes nothing at all.
    pub fn is_empty(&self) -> bool {
        self.summaries.is_empty()
            && self.new_facts.is_empty()
            && self.facts_to_reinforce.is_empty()
            && self.facts_to_remove.is_empty()
            && self.stale_facts_to_remove.is_empty()
            && self.stale_facts_to_extend.is_empty()
            && self.facts_to_consolidate.is_empty()
    }
}

#[cfg(test)]
/// The text of a chat-model response whose content may be a list of blocks: strings are
/// concatenated without separator into one piece, each `{"text": ...}` block is its own piece,
/// pieces are joined with newlines; any other value is shown as Python would.
pub(crate) fn response_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let mut pieces: Vec<String> = Vec::new();
            let mut run: Option<String> = None;
            for item in items {
                match item {
                    Value::String(s) => run.get_or_insert_with(String::new).push_str(s),
                    Value::Object(o) => {
                        if let Some(t) = o.get("text").and_then(Value::as_str) {
                            if let Some(r) = run.take() {
                                pieces.push(r);
                            }
                            pieces.push(t.to_owned());
                        }
                    }
                    _ => {}
                }
            }
            if let Some(r) = run {
                pieces.push(r);
            }
            pieces.join("\n")
        }
        Value::Null => "None".to_owned(),
        other => py::py_str(other).unwrap_or_else(|| other.to_string()),
    }
}

/// Finds and normalises the memory update in a model response.
///
/// # Errors
/// [`ParseError::NoUpdateObject`] when no acceptable object exists (truncated JSON is never
/// repaired), [`ParseError::UnsafePartialUpdate`] for the guard, and the size limits.
pub fn parse_update_response(response: &str) -> Result<ProposedUpdate, ParseError> {
    if response.len() > MAX_RESPONSE_BYTES {
        return Err(ParseError::TooLarge {
            len: response.len(),
            max: MAX_RESPONSE_BYTES,
        });
    }
    let text = py::strip(response);
    let mut budget = Budget::new(SCAN_BUDGET_BYTES);
    for (pos, _) in text.match_indices('{') {
        match decode_prefix(text, pos, &mut budget) {
            Ok((PyJson::Object(obj), _)) => {
                if ["user", "history", "newFacts"]
                    .iter()
                    .all(|k| obj.contains_key(*k))
                {
                    return normalize_update(&obj);
                }
            }
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::BudgetExhausted => return Err(ParseError::TooComplex),
            Err(_) => {}
        }
    }
    Err(ParseError::NoUpdateObject)
}

fn stripped_non_blank(v: Option<&PyJson>) -> Option<String> {
    let s = py::strip(v?.as_str()?);
    (!s.is_empty()).then(|| s.to_owned())
}

fn label(v: Option<&PyJson>) -> Option<String> {
    normalize_label(v?.as_str()?)
}

fn category(v: Option<&PyJson>) -> String {
    stripped_non_blank(v).unwrap_or_else(|| "context".to_owned())
}

/// `expected_valid_days` as the reference reads it: bools are not numbers, ints count when
/// positive, finite floats are truncated toward zero first; anything else is no value.
pub(crate) fn read_expected_valid_days(v: &PyJson) -> Option<i128> {
    match v {
        PyJson::Int(i) if *i > 0 => Some(*i),
        // `as` saturates at `i128::MAX`.
        PyJson::Float(f) if f.is_finite() && f.trunc() >= 1.0 => Some(f.trunc() as i128),
        _ => None,
    }
}

/// A new fact's confidence: missing is 0.5; numbers and numeric strings (Python `float()`
/// syntax) are read; bools, other types, non-finite values and values outside `[0, 1]` make
/// the item malformed.
fn new_fact_confidence(v: Option<&PyJson>) -> Option<f64> {
    let c = match v {
        None => DEFAULT_NEW_FACT_CONFIDENCE,
        Some(PyJson::Int(i)) => *i as f64,
        Some(PyJson::Float(f)) => *f,
        Some(PyJson::Str(s)) => {
            let t = py::strip(s);
            if t.is_empty() {
                return None;
            }
            py::parse_float(t)?
        }
        Some(_) => return None,
    };
    (c.is_finite() && (0.0..=1.0).contains(&c)).then_some(c)
}

fn fact_content(v: Option<&PyJson>) -> Option<String> {
    stripped_non_blank(v).filter(|c| py::char_len(c) <= MAX_FACT_CONTENT_CHARS)
}

fn normalize_new_fact(index: usize, v: &PyJson) -> Option<ProposedFact> {
    let o = v.as_object()?;
    let content = fact_content(o.get("content"))?;
    let confidence = new_fact_confidence(o.get("confidence"))?;
    Some(ProposedFact {
        index,
        content,
        category: category(o.get("category")),
        confidence,
        source_error: stripped_non_blank(o.get("sourceError")),
        expected_valid_days: o
            .get("expected_valid_days")
            .and_then(read_expected_valid_days),
        scope: label(o.get("scope")),
        durability: label(o.get("durability")),
        authority: label(o.get("authority")),
    })
}

const USER_KEYS: [&str; 3] = ["workContext", "personalContext", "topOfMind"];
const HISTORY_KEYS: [&str; 3] = ["recentMonths", "earlierContext", "longTermBackground"];

fn normalize_summaries(
    obj: &IndexMap<String, PyJson>,
    out: &mut Vec<SummaryProposal>,
    dropped: &mut usize,
) {
    for (kind, keys) in [
        (SectionKind::User, USER_KEYS),
        (SectionKind::History, HISTORY_KEYS),
    ] {
        let Some(section) = obj.get(kind.as_str()).and_then(PyJson::as_object) else {
            continue;
        };
        for key in keys {
            let Some(child) = section.get(key).and_then(PyJson::as_object) else {
                continue;
            };
            let wants = child.get("shouldUpdate").is_some_and(PyJson::truthy);
            let summary = child.get("summary");
            if !wants || !summary.is_some_and(PyJson::truthy) {
                continue;
            }
            let Some(text) = summary.and_then(PyJson::as_str) else {
                // In the reference a number or list here aborted every later update.
                *dropped += 1;
                continue;
            };
            out.push(SummaryProposal {
                section: kind,
                key: key.to_owned(),
                summary: text.to_owned(),
                scope: label(child.get("scope")),
                authority: label(child.get("authority")),
            });
        }
    }
}

fn replacement_ref(v: Option<&PyJson>) -> ReplacementRef {
    match v {
        None => ReplacementRef::None,
        Some(PyJson::Int(i)) if *i >= 0 => {
            usize::try_from(*i).map_or(ReplacementRef::Invalid, ReplacementRef::Index)
        }
        Some(_) => ReplacementRef::Invalid,
    }
}

fn string_or_empty(v: Option<&PyJson>) -> String {
    v.and_then(PyJson::as_str).unwrap_or("").to_owned()
}

fn raw_non_empty_id(o: &IndexMap<String, PyJson>) -> Option<String> {
    o.get("id")
        .and_then(PyJson::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// Normalises an accepted update object into the eight keys of a proposed update.
///
/// # Errors
/// [`ParseError::UnsafePartialUpdate`] when removals come with any malformed new fact.
pub(crate) fn normalize_update(
    obj: &IndexMap<String, PyJson>,
) -> Result<ProposedUpdate, ParseError> {
    let mut up = ProposedUpdate::default();
    normalize_summaries(obj, &mut up.summaries, &mut up.dropped_summaries);

    match obj.get("newFacts") {
        Some(PyJson::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                match normalize_new_fact(i, item) {
                    Some(f) => up.new_facts.push(f),
                    None => up.dropped_new_facts += 1,
                }
            }
        }
        // `newFacts` is present (the object was accepted) but not a list.
        _ => up.dropped_new_facts += 1,
    }

    if let Some(PyJson::Array(items)) = obj.get("factsToRemove") {
        for item in items {
            match item {
                PyJson::Str(s) => {
                    let id = py::strip(s);
                    if !id.is_empty() {
                        up.facts_to_remove.push(RemovalEntry {
                            id: id.to_owned(),
                            scope: None,
                            reason: None,
                            replacement: ReplacementRef::None,
                        });
                    }
                }
                PyJson::Object(o) => {
                    if let Some(id) = stripped_non_blank(o.get("id")) {
                        up.facts_to_remove.push(RemovalEntry {
                            id,
                            scope: label(o.get("scope")),
                            reason: stripped_non_blank(o.get("reason")),
                            replacement: replacement_ref(o.get("replacementFactIndex")),
                        });
                    }
                }
                _ => {}
            }
        }
    }
    if !up.facts_to_remove.is_empty() && up.dropped_new_facts > 0 {
        return Err(ParseError::UnsafePartialUpdate);
    }

    if let Some(PyJson::Array(items)) = obj.get("factsToReinforce") {
        for o in items.iter().filter_map(PyJson::as_object) {
            if let Some(id) = stripped_non_blank(o.get("id")) {
                up.facts_to_reinforce.push(ReinforceEntry {
                    id,
                    scope: label(o.get("scope")),
                    reason: stripped_non_blank(o.get("reason")),
                });
            }
        }
    }

    if let Some(PyJson::Array(items)) = obj.get("staleFactsToRemove") {
        for o in items.iter().filter_map(PyJson::as_object) {
            if let Some(id) = raw_non_empty_id(o) {
                up.stale_facts_to_remove.push(StaleRemoval {
                    id,
                    reason: string_or_empty(o.get("reason")),
                });
            }
        }
    }

    if let Some(PyJson::Array(items)) = obj.get("staleFactsToExtend") {
        for o in items.iter().filter_map(PyJson::as_object) {
            let Some(id) = raw_non_empty_id(o) else {
                continue;
            };
            let days = match o.get("extend_by_days") {
                Some(PyJson::Int(i)) => *i,
                // In the reference non-finite values aborted the whole update.
                // `as` saturates at the i128 bounds.
                Some(PyJson::Float(f)) if f.is_finite() => f.trunc() as i128,
                _ => continue,
            };
            if days > 0 {
                up.stale_facts_to_extend.push(StaleExtension {
                    id,
                    extend_by_days: days,
                    reason: string_or_empty(o.get("reason")),
                });
            }
        }
    }

    if let Some(PyJson::Array(items)) = obj.get("factsToConsolidate") {
        for o in items.iter().filter_map(PyJson::as_object) {
            let Some(ids) = o.get("sourceIds").and_then(PyJson::as_array) else {
                continue;
            };
            let mut source_ids: Vec<String> = Vec::new();
            for id in ids.iter().filter_map(PyJson::as_str) {
                if !id.is_empty() && !source_ids.iter().any(|x| x == id) {
                    source_ids.push(id.to_owned());
                }
            }
            if source_ids.len() < 2 {
                continue;
            }
            let Some(c) = o.get("consolidated").and_then(PyJson::as_object) else {
                continue;
            };
            let Some(content) = fact_content(c.get("content")) else {
                continue;
            };
            let confidence = match c.get("confidence") {
                Some(PyJson::Int(i)) => Some(*i as f64),
                Some(PyJson::Float(f)) if f.is_finite() => Some(*f),
                _ => None,
            };
            up.facts_to_consolidate.push(ConsolidationProposal {
                source_ids,
                content,
                category: category(c.get("category")),
                confidence,
                scope: label(c.get("scope")),
                durability: label(c.get("durability")),
                authority: label(c.get("authority")),
            });
        }
    }
    Ok(up)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const MINIMAL: &str = r#"{"user": {}, "history": {}, "newFacts": [{"content": "User prefers tabs", "category": "preference", "confidence": 0.9, "scope": "user", "durability": "durable", "authority": "descriptive"}]}"#;

    fn parse(s: &str) -> ProposedUpdate {
        parse_update_response(s).unwrap()
    }

    #[test]
    fn response_text_joins_blocks_like_the_reference() {
        assert_eq!(response_text(&json!("x")), "x");
        assert_eq!(
            response_text(&json!([{"type": "text", "text": "hello"}])),
            "hello"
        );
        assert_eq!(
            response_text(&json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])),
            "a\nb"
        );
        assert_eq!(response_text(&json!(["raw string"])), "raw string");
        assert_eq!(
            response_text(&json!(["{\"user\"", ": \"alice\"}"])),
            "{\"user\": \"alice\"}"
        );
        assert_eq!(
            response_text(&json!(["prefix", "-continued", {"text": "block text"}])),
            "prefix-continued\nblock text"
        );
        assert_eq!(
            response_text(&json!(["a", {"type": "image_url", "image_url": {}}, "b"])),
            "ab"
        );
        assert_eq!(response_text(&json!([])), "");
        assert_eq!(response_text(&json!([{"type": "image_url"}])), "");
        assert_eq!(response_text(&json!(42)), "42");
    }

    #[test]
    fn finds_the_update_through_wrappers() {
        for wrapped in [
            MINIMAL.to_owned(),
            format!("<think>let me see {{draft}}</think>\n{MINIMAL}"),
            format!("<think>unclosed reasoning {MINIMAL}"),
            format!("Here is the update:\n{MINIMAL}\nDone."),
            format!("```json\n{MINIMAL}\n```"),
            format!("{{\"user\": \"alice\"}} then {MINIMAL}"),
        ] {
            let up = parse(&wrapped);
            assert_eq!(up.new_facts.len(), 1, "{wrapped}");
            assert_eq!(up.new_facts[0].content, "User prefers tabs");
        }
    }

    #[test]
    fn inner_object_is_accepted_when_the_outer_lacks_the_keys() {
        let up = parse(&format!("{{\"memory_update\": {MINIMAL}}}"));
        assert_eq!(up.new_facts.len(), 1);
    }

    #[test]
    fn truncated_or_decoy_json_is_refused() {
        let truncated = &MINIMAL[..MINIMAL.len() - 5];
        assert_eq!(
            parse_update_response(truncated),
            Err(ParseError::NoUpdateObject)
        );
        assert_eq!(
            parse_update_response(r#"{"user": "alice"}"#),
            Err(ParseError::NoUpdateObject)
        );
        assert_eq!(
            parse_update_response("no json"),
            Err(ParseError::NoUpdateObject)
        );
        assert_eq!(parse_update_response(""), Err(ParseError::NoUpdateObject));
    }

    #[test]
    fn facts_to_remove_is_optional() {
        let up = parse(r#"{"user": {}, "history": {}, "newFacts": []}"#);
        assert!(up.is_empty());
    }

    #[test]
    fn schema_guard_coerces_invalid_fields() {
        let up = parse(
            r#"{"user": "bad", "history": [], "factsToRemove": "bad",
                "newFacts": ["a string", {"content": "Valid fact", "confidence": 0.9}]}"#,
        );
        assert!(up.summaries.is_empty());
        assert_eq!(up.new_facts.len(), 1);
        assert_eq!(up.new_facts[0].index, 1);
        assert_eq!(up.dropped_new_facts, 1);
        assert!(up.facts_to_remove.is_empty());
    }

    #[test]
    fn new_fact_fields_are_coerced_item_by_item() {
        let up = parse(
            r#"{"user": {}, "history": {}, "newFacts": [
                {"content": " A ", "category": 9, "confidence": "0.91", "sourceError": "  old  "},
                {"content": "B", "confidence": "high"},
                {"content": 5},
                {"content": "   "},
                {"content": "C", "confidence": true},
                {"content": "D", "confidence": null},
                {"content": "E", "confidence": 1.5},
                {"content": "F", "confidence": "1_0"},
                {"content": "G", "confidence": NaN},
                {"content": "H", "confidence": " 1e-1 ", "category": "  knowledge  ", "expected_valid_days": 90.7},
                {"content": "I", "sourceError": "   ", "expected_valid_days": true, "scope": " USER ", "durability": "", "authority": 3}
            ]}"#,
        );
        let got: Vec<(&str, &str, f64)> = up
            .new_facts
            .iter()
            .map(|f| (f.content.as_str(), f.category.as_str(), f.confidence))
            .collect();
        assert_eq!(
            got,
            vec![
                ("A", "context", 0.91),
                ("H", "knowledge", 0.1),
                ("I", "context", 0.5)
            ]
        );
        assert_eq!(up.new_facts[0].source_error.as_deref(), Some("old"));
        assert_eq!(up.new_facts[1].expected_valid_days, Some(90));
        let i = &up.new_facts[2];
        assert_eq!(i.source_error, None);
        assert_eq!(i.expected_valid_days, None);
        assert_eq!(i.scope.as_deref(), Some("user"));
        assert_eq!(i.durability, None);
        assert_eq!(i.authority, None);
        assert_eq!(up.dropped_new_facts, 8);
        assert_eq!(i.index, 10);
    }

    #[test]
    fn unsafe_partial_update_is_refused() {
        let s = r#"{"user": {}, "history": {}, "newFacts": [{"content": "new", "confidence": 2}],
                    "factsToRemove": [{"id": "f1", "scope": "user", "reason": "outdated", "replacementFactIndex": 0}]}"#;
        assert_eq!(
            parse_update_response(s),
            Err(ParseError::UnsafePartialUpdate)
        );
        let ok = r#"{"user": {}, "history": {}, "newFacts": [{"content": "new"}],
                    "factsToRemove": [{"id": "f1", "scope": "user", "reason": "outdated", "replacementFactIndex": 0}]}"#;
        assert_eq!(
            parse(ok).facts_to_remove[0].replacement,
            ReplacementRef::Index(0)
        );
    }

    #[test]
    fn removal_entries_normalise() {
        let up = parse(
            r#"{"user": {}, "history": {}, "newFacts": [], "factsToRemove": [
                " fact_api ", {"id": " f2 ", "scope": " User ", "reason": "  r  ", "replacementFactIndex": null},
                {"id": "f3", "replacementFactIndex": 0.0}, {"id": "f4", "replacementFactIndex": true},
                {"id": "f5", "replacementFactIndex": -1}, {"id": "  "}, 7, {"id": "f6"}]}"#,
        );
        let r = &up.facts_to_remove;
        assert_eq!(r.len(), 6);
        assert_eq!(
            r[0],
            RemovalEntry {
                id: "fact_api".into(),
                scope: None,
                reason: None,
                replacement: ReplacementRef::None
            }
        );
        assert_eq!(r[1].id, "f2");
        assert_eq!(r[1].scope.as_deref(), Some("user"));
        assert_eq!(r[1].reason.as_deref(), Some("r"));
        assert_eq!(r[1].replacement, ReplacementRef::Invalid);
        assert_eq!(r[2].replacement, ReplacementRef::Invalid);
        assert_eq!(r[3].replacement, ReplacementRef::Invalid);
        assert_eq!(r[4].replacement, ReplacementRef::Invalid);
        assert_eq!(r[5].replacement, ReplacementRef::None);
    }

    #[test]
    fn reinforcement_entries_normalise() {
        let up = parse(
            r#"{"user": {}, "history": {}, "newFacts": [], "factsToReinforce": [
                {"id": " f1 ", "scope": " USER ", "reason": " confirmed "}, {"id": "  ", "scope": "user"},
                {"id": "f2", "scope": "thread", "reason": "x"}, "f3"]}"#,
        );
        assert_eq!(up.facts_to_reinforce.len(), 2);
        assert_eq!(
            up.facts_to_reinforce[0],
            ReinforceEntry {
                id: "f1".into(),
                scope: Some("user".into()),
                reason: Some("confirmed".into())
            }
        );
        assert_eq!(up.facts_to_reinforce[1].scope.as_deref(), Some("thread"));
    }

    #[test]
    fn stale_removals_normalise() {
        let up = parse(
            r#"{"user": {}, "history": {}, "newFacts": [], "staleFactsToRemove": [
                {"id": "a", "reason": "old"}, {"id": "b"}, {"id": "c", "reason": 123}, {"id": ""}, "d", {"id": " "}]}"#,
        );
        let got: Vec<(&str, &str)> = up
            .stale_facts_to_remove
            .iter()
            .map(|s| (s.id.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(got, vec![("a", "old"), ("b", ""), ("c", ""), (" ", "")]);
        assert!(
            parse(r#"{"user": {}, "history": {}, "newFacts": [], "staleFactsToRemove": "x"}"#)
                .stale_facts_to_remove
                .is_empty()
        );
    }

    #[test]
    fn stale_extensions_normalise_and_never_abort() {
        let up = parse(
            r#"{"user": {}, "history": {}, "newFacts": [{"content": "kept"}], "staleFactsToExtend": [
                {"id": "a", "extend_by_days": 365, "reason": "still true"}, {"id": "b", "extend_by_days": 90.7},
                {"id": "c", "extend_by_days": 0.9}, {"id": "d", "extend_by_days": 0}, {"id": "e", "extend_by_days": -5},
                {"id": 123, "extend_by_days": 10}, {"id": "f"}, {"id": "g", "extend_by_days": NaN},
                {"id": "h", "extend_by_days": Infinity}, {"id": "i", "extend_by_days": 1e400}, {"id": "j", "extend_by_days": true}]}"#,
        );
        let got: Vec<(&str, i128)> = up
            .stale_facts_to_extend
            .iter()
            .map(|s| (s.id.as_str(), s.extend_by_days))
            .collect();
        assert_eq!(got, vec![("a", 365), ("b", 90)]);
        assert_eq!(up.new_facts.len(), 1, "the rest of the update survives");
    }

    #[test]
    fn consolidations_normalise() {
        let up = parse(
            r#"{"user": {}, "history": {}, "newFacts": [], "factsToConsolidate": [
                {"sourceIds": ["a", "b", "a", "", 5], "consolidated": {"content": " merged ", "category": "  knowledge  ", "confidence": 0.8, "scope": "user"}},
                {"sourceIds": ["a", "a"], "consolidated": {"content": "x"}},
                {"sourceIds": ["a", "b"], "consolidated": {"content": "  "}},
                {"sourceIds": ["a", "b"], "consolidated": "x"},
                {"sourceIds": ["c", "d"], "consolidated": {"content": "y", "category": " ", "confidence": "0.8"}}]}"#,
        );
        let c = &up.facts_to_consolidate;
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].source_ids, vec!["a", "b"]);
        assert_eq!(c[0].content, "merged");
        assert_eq!(c[0].category, "knowledge");
        assert_eq!(c[0].confidence, Some(0.8));
        assert_eq!(c[0].scope.as_deref(), Some("user"));
        assert_eq!(c[1].category, "context");
        assert_eq!(c[1].confidence, None, "strings are not parsed here");
        assert!(
            parse(r#"{"user": {}, "history": {}, "newFacts": [], "factsToConsolidate": "x"}"#)
                .facts_to_consolidate
                .is_empty()
        );
    }

    #[test]
    fn summaries_need_should_update_and_a_string_summary() {
        let up = parse(
            r#"{"user": {"workContext": {"summary": "Builds compilers", "shouldUpdate": true, "scope": "user", "authority": "descriptive"},
                         "personalContext": {"summary": "x", "shouldUpdate": false},
                         "topOfMind": {"summary": 12345, "shouldUpdate": "false"}},
                "history": {"recentMonths": {"summary": "", "shouldUpdate": true}, "earlierContext": null},
                "newFacts": []}"#,
        );
        assert_eq!(up.summaries.len(), 1);
        assert_eq!(up.summaries[0].key, "workContext");
        assert_eq!(up.summaries[0].scope.as_deref(), Some("user"));
        assert_eq!(up.dropped_summaries, 1);
    }

    #[test]
    fn oversized_fact_content_is_malformed() {
        let long = "x".repeat(MAX_FACT_CONTENT_CHARS + 1);
        let ok = "y".repeat(MAX_FACT_CONTENT_CHARS);
        let up = parse(&format!(
            r#"{{"user": {{}}, "history": {{}}, "newFacts": [{{"content": "{long}"}}, {{"content": "{ok}"}}]}}"#
        ));
        assert_eq!(up.new_facts.len(), 1);
        assert_eq!(up.dropped_new_facts, 1);
    }

    #[test]
    fn huge_or_hostile_responses_are_typed_errors() {
        let big = "x".repeat(MAX_RESPONSE_BYTES + 1);
        assert!(matches!(
            parse_update_response(&big),
            Err(ParseError::TooLarge { .. })
        ));
        let braces = "{\"a\":\"".repeat(200_000);
        let r = parse_update_response(&braces);
        assert!(
            matches!(r, Err(ParseError::TooComplex | ParseError::NoUpdateObject)),
            "{r:?}"
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(s in ".{0,400}") {
            let _ = parse_update_response(&s);
        }

        #[test]
        fn arbitrary_json_like_text_never_panics(s in "[{}\\[\\]\":,0-9a-zA-Z .eE+-]{0,300}") {
            let _ = parse_update_response(&s);
            let wrapped = format!("{{\"user\": {{}}, \"history\": {{}}, \"newFacts\": [{s}]}}");
            let _ = parse_update_response(&wrapped);
        }
    }
}
