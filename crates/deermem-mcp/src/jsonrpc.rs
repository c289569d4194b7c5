//! JSON-RPC details both transports share: error codes and error bodies, the repair of lone
//! UTF-16 surrogate escapes before parsing, and the `-32602` answer (with what is wrong) to a
//! known MCP method whose params do not fit it.

use std::borrow::Cow;

use deermem::tools::json_type;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams};
use serde_json::{Value, json};

/// JSON-RPC "Parse error".
pub(crate) const PARSE_ERROR: i64 = -32700;
/// JSON-RPC "Invalid Request".
pub(crate) const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC "Invalid params".
pub(crate) const INVALID_PARAMS: i64 = -32602;

/// The request methods a client may send (every MCP revision the SDK speaks). A known method
/// whose params do not fit it is answered with `-32602`, not `-32601` ("Method not found").
const KNOWN_METHODS: [&str; 21] = [
    "initialize",
    "ping",
    "server/discover",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/directory/read",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "skills/list",
    "skills/get",
];

/// A JSON-RPC error response, as one line of JSON.
pub(crate) fn error_line(id: Value, code: i64, message: &str) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message }
    })
    .to_string()
}

/// The request id of a parsed message, when it has a usable one (a string or a number).
pub(crate) fn request_id(value: &Value) -> Value {
    match value.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => Value::Null,
    }
}

/// What is wrong with the params of a known method, for its `-32602` answer (`None` for a
/// method MCP does not define, which stays "Method not found").
pub(crate) fn invalid_params_message(method: &str, params: Option<&Value>) -> Option<String> {
    if !KNOWN_METHODS.contains(&method) {
        return None;
    }
    let detail = match (method, params) {
        ("tools/call", None | Some(Value::Null)) => {
            "params are required: {\"name\": <tool name>, \"arguments\": {...}}".to_owned()
        }
        ("resources/read", None | Some(Value::Null)) => {
            "params are required: {\"uri\": <resource URI>}".to_owned()
        }
        (
            _,
            Some(other @ (Value::Array(_) | Value::String(_) | Value::Number(_) | Value::Bool(_))),
        ) => {
            format!("params must be an object, got {}", json_type(other))
        }
        ("tools/call", Some(p)) => tool_call_problem(p),
        ("resources/read", Some(p)) => match p.get("uri") {
            None | Some(Value::Null) => "'uri' (the resource URI) is required".to_owned(),
            Some(Value::String(_)) => {
                serde_detail(serde_json::from_value::<ReadResourceRequestParams>(p.clone()).err())
            }
            Some(other) => format!("'uri' must be a string, got {}", json_type(other)),
        },
        _ => format!("params do not fit {method}"),
    };
    Some(format!("Invalid params for {method}: {detail}"))
}

fn tool_call_problem(p: &Value) -> String {
    match p.get("name") {
        None | Some(Value::Null) => return "'name' (the tool to call) is required".to_owned(),
        Some(Value::String(_)) => {}
        Some(other) => return format!("'name' must be a string, got {}", json_type(other)),
    }
    match p.get("arguments") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(other) => return format!("'arguments' must be an object, got {}", json_type(other)),
    }
    serde_detail(serde_json::from_value::<CallToolRequestParams>(p.clone()).err())
}

fn serde_detail(error: Option<serde_json::Error>) -> String {
    match error {
        Some(e) => e.to_string(),
        None => "params do not fit this method".to_owned(),
    }
}

/// `text` with every lone UTF-16 surrogate escape (`\ud83c` not followed by its low half, or
/// a low half alone) inside a JSON string replaced by `\ufffd`, the replacement character.
/// JavaScript produces such escapes from a broken emoji; a Rust string cannot hold them, so
/// without this the whole message would be a parse error without its request id. Each
/// replacement keeps the length (six bytes for six), and text without one is borrowed as is.
pub(crate) fn repair_lone_surrogates(text: &[u8]) -> Cow<'_, [u8]> {
    let mut out: Option<Vec<u8>> = None;
    let mut in_string = false;
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        if !in_string {
            in_string = b == b'"';
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = false;
                i += 1;
            }
            b'\\' => match text.get(i + 1) {
                Some(b'u') => {
                    let unit = hex4(text, i + 2);
                    let len = match unit {
                        Some(0xD800..=0xDBFF) => {
                            let paired = text.get(i + 6) == Some(&b'\\')
                                && text.get(i + 7) == Some(&b'u')
                                && matches!(hex4(text, i + 8), Some(0xDC00..=0xDFFF));
                            if paired { 12 } else { 0 }
                        }
                        Some(0xDC00..=0xDFFF) => 0,
                        _ => 2,
                    };
                    if len == 0 {
                        let buf = out.get_or_insert_with(|| text.to_vec());
                        buf[i..i + 6].copy_from_slice(b"\\ufffd");
                        i += 6;
                    } else {
                        i += len;
                    }
                }
                Some(_) => i += 2,
                None => i += 1,
            },
            _ => i += 1,
        }
    }
    match out {
        Some(buf) => Cow::Owned(buf),
        None => Cow::Borrowed(text),
    }
}

/// The code unit of the four hex digits at `at`, if there are four.
fn hex4(text: &[u8], at: usize) -> Option<u32> {
    let digits = text.get(at..at + 4)?;
    let s = std::str::from_utf8(digits).ok()?;
    if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repaired(s: &str) -> String {
        String::from_utf8(repair_lone_surrogates(s.as_bytes()).into_owned()).expect("UTF-8")
    }

    #[test]
    fn lone_surrogates_become_the_replacement_character() {
        let lone = r#"{"content": "broken \ud83c emoji"}"#;
        let fixed = repaired(lone);
        assert_eq!(fixed, r#"{"content": "broken \ufffd emoji"}"#);
        let v: Value = serde_json::from_str(&fixed).expect("parses");
        assert_eq!(v["content"], "broken \u{FFFD} emoji");
        // A low half alone, a high half at the end of a string and of the text.
        assert_eq!(repaired(r#"["\uDF75x"]"#), r#"["\ufffdx"]"#);
        assert_eq!(repaired(r#"["a\uD83C"]"#), r#"["a\ufffd"]"#);
        assert_eq!(
            repaired(r#"["\ud83c\ud83c\udf75"]"#),
            r#"["\ufffd\ud83c\udf75"]"#
        );
        // Keys too.
        assert_eq!(repaired(r#"{"\ud800": 1}"#), r#"{"\ufffd": 1}"#);
    }

    #[test]
    fn valid_text_is_left_alone() {
        for text in [
            r#"{"a": "pair \ud83c\udf75 ok"}"#,
            r#"{"a": "escaped backslash \\ud83c is text"}"#,
            r#"{"a": "\u00e9\n\"quoted\" \\"}"#,
            r#"{"a": 1, "b": [true, null]}"#,
            r#"{"a": "\u12"#,
            "",
        ] {
            assert!(
                matches!(repair_lone_surrogates(text.as_bytes()), Cow::Borrowed(_)),
                "{text}"
            );
        }
        // Outside strings nothing is touched (the parser reports it).
        assert!(matches!(
            repair_lone_surrogates(br"[\ud83c]"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn bad_params_of_known_methods_are_described() {
        let m = |method: &str, params: Option<Value>| {
            invalid_params_message(method, params.as_ref()).expect("known method")
        };
        assert!(m("tools/call", None).contains("params are required"));
        assert!(
            m(
                "tools/call",
                Some(json!({"name": "memory_search", "arguments": ["tea"]}))
            )
            .contains("'arguments' must be an object, got an array")
        );
        assert!(m("tools/call", Some(json!({"arguments": {}}))).contains("'name'"));
        assert!(
            m("tools/call", Some(json!({"name": 5})))
                .contains("'name' must be a string, got a number")
        );
        assert!(m("tools/call", Some(json!([1]))).contains("params must be an object"));
        assert!(m("resources/read", Some(json!({}))).contains("'uri'"));
        assert!(m("resources/read", None).contains("params are required"));
        assert!(m("tools/list", Some(json!(5))).starts_with("Invalid params for tools/list"));
        assert_eq!(invalid_params_message("nope/nope", None), None);
    }
}
