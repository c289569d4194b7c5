//! [`is_clarification_response`]: DeerFlow's rule for the hidden (`hide_from_ui`) messages a
//! remote backend still captures.

use serde_json::{Map, Value};

/// Whether a hidden message is a human-input clarification answer, which DeerFlow keeps:
/// `additional_kwargs.human_input_response` with version 1, kind `human_input_response`,
/// non-blank `source`, `request_id` and `value` (blank as Python's `str.strip` sees it), and
/// either `response_kind == "text"` or `response_kind == "option"` with a non-blank
/// `option_id`.
pub fn is_clarification_response(kwargs: &Map<String, Value>) -> bool {
    let Some(Value::Object(r)) = kwargs.get("human_input_response") else {
        return false;
    };
    let version_ok = match r.get("version") {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() == Some(1.0),
        _ => false,
    };
    let non_blank = |k: &str| {
        r.get(k)
            .and_then(Value::as_str)
            .is_some_and(|s| !deermem_pycompat::py::strip(s).is_empty())
    };
    let kind_ok = r.get("kind").and_then(Value::as_str) == Some("human_input_response");
    let response_ok = match r.get("response_kind").and_then(Value::as_str) {
        Some("text") => true,
        Some("option") => non_blank("option_id"),
        _ => false,
    };
    version_ok
        && kind_ok
        && non_blank("source")
        && non_blank("request_id")
        && non_blank("value")
        && response_ok
}
