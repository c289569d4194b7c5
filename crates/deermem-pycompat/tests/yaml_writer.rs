//! Writer output pinned byte for byte against what `yaml.safe_dump(.., allow_unicode=True,
//! sort_keys=False)` printed for the same values (recorded with PyYAML 6.0.3), so the layout is
//! checked even where Python is not installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod yaml_common;

use serde_json::{Map, Value, json};
use yaml_common::yaml::{parse_mapping, render_mapping};

fn check(value: Value, expected: &str) {
    let Value::Object(map) = value else {
        panic!("test values are objects")
    };
    let rendered = render_mapping(&map).expect("render");
    assert_eq!(rendered, expected);
    let back: Map<String, Value> = parse_mapping(&rendered).expect("parse");
    assert_eq!(back, map);
}

#[test]
fn spec_example_fact() {
    let value: Value = serde_json::from_str(r##"{"id": "fact_01HZZZZZZZZZZZZZZZZZZZZZZZ", "category": "constraint", "topics": ["python", "runtime"], "confidence": 0.95, "createdAt": "2026-07-17T00:00:00Z", "source": {"type": "manual", "threadId": "thread-1"}, "revision": 1, "schemaVersion": 2, "status": "active", "consolidatedFrom": [], "updatedAt": "2026-07-17T00:00:00Z", "user_id": "alice", "agent_name": "agent-a"}"##).expect("JSON");
    check(
        value,
        "id: fact_01HZZZZZZZZZZZZZZZZZZZZZZZ\ncategory: constraint\ntopics:\n- python\n- runtime\nconfidence: 0.95\ncreatedAt: '2026-07-17T00:00:00Z'\nsource:\n  type: manual\n  threadId: thread-1\nrevision: 1\nschemaVersion: 2\nstatus: active\nconsolidatedFrom: []\nupdatedAt: '2026-07-17T00:00:00Z'\nuser_id: alice\nagent_name: agent-a",
    );
}

#[test]
fn numbers_and_empty_collections() {
    let value: Value = serde_json::from_str(r##"{"f": [1e-05, 1e+16, 1.5e+20, 1.0, -0.0, 0.1, 123456789.125], "i": [0, -5, 18446744073709551615], "n": null, "b": [true, false], "e": {}, "l": []}"##).expect("JSON");
    check(
        value,
        "f:\n- 1.0e-05\n- 1.0e+16\n- 1.5e+20\n- 1.0\n- -0.0\n- 0.1\n- 123456789.125\ni:\n- 0\n- -5\n- 18446744073709551615\nn: null\nb:\n- true\n- false\ne: {}\nl: []",
    );
}

#[test]
fn long_plain_folds_at_80() {
    let value: Value = serde_json::from_str(r##"{"t": "word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word "}"##).expect("JSON");
    check(
        value,
        "t: 'word word word word word word word word word word word word word word word word\n  word word word word word word word word word word word word word word '",
    );
}

#[test]
fn long_nested_folds_deeper() {
    let value: Value = serde_json::from_str(r##"{"s": {"t": "word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word "}}"##).expect("JSON");
    check(
        value,
        "s:\n  t: 'word word word word word word word word word word word word word word word word\n    word word word word word word word word word word word word word word '",
    );
}

#[test]
fn long_double_quoted_folds_with_escapes() {
    let value: Value = serde_json::from_str(r##"{"q": "tab\t word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word "}"##).expect("JSON");
    check(
        value,
        "q: \"tab\\t word word word word word word word word word word word word word word word\\\n  \\ word word word word word word word word word word word word word word word \"",
    );
}

#[test]
fn line_breaks_and_edge_spaces() {
    let value: Value = serde_json::from_str(
        r##"{"m": "multi\nline\n\nstring", "lead": " x", "trail": "x ", "nl": "x\n"}"##,
    )
    .expect("JSON");
    check(
        value,
        "m: 'multi\n\n  line\n\n\n  string'\nlead: ' x'\ntrail: 'x '\nnl: 'x\n\n  '",
    );
}

#[test]
fn complex_keys() {
    let value: Value = serde_json::from_str(r##"{"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk": 1, "": 2, "a\nb": [1]}"##).expect("JSON");
    check(
        value,
        "? kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\n: 1\n? ''\n: 2\n? 'a\n\n  b'\n: - 1",
    );
}

#[test]
fn indicators() {
    let value: Value = serde_json::from_str(r##"{"x": ["- dash", "# hash", "'q'", "\"d\"", "a: b", "a #b", "a#b", "@", "`", "%", "!", "&", "*", "|", ">", "?", "? x", ":x", ": x", "-x", "[", "]", "{", "}", ",x", "x,y", "---", "...x", "--x"]}"##).expect("JSON");
    check(
        value,
        "x:\n- '- dash'\n- '# hash'\n- '''q'''\n- '\"d\"'\n- 'a: b'\n- 'a #b'\n- a#b\n- '@'\n- '`'\n- '%'\n- '!'\n- '&'\n- '*'\n- '|'\n- '>'\n- '?'\n- '? x'\n- :x\n- ': x'\n- -x\n- '['\n- ']'\n- '{'\n- '}'\n- ',x'\n- x,y\n- '---'\n- '...x'\n- --x",
    );
}

#[test]
fn nested_collections() {
    let value: Value = serde_json::from_str(
        r##"{"a": [[1, 2], [], {}, {"x": [1], "y": {}}], "b": {"c": {"d": []}}}"##,
    )
    .expect("JSON");
    check(
        value,
        "a:\n- - 1\n  - 2\n- []\n- {}\n- x:\n  - 1\n  y: {}\nb:\n  c:\n    d: []",
    );
}

#[test]
fn unicode_raw_astral_escaped_in_double_quotes() {
    let value = json!({
        "u": "中文 emoji 🦌",
        "d": "emoji 🦌\t",
        "bom": "\u{feff}x",
        "del": "a\u{7f}b",
        "nbsp": "\u{a0}x",
    });
    check(
        value,
        "u: 中文 emoji 🦌\nd: \"emoji \\U0001F98C\\t\"\nbom: \"\\uFEFFx\"\ndel: \"a\\x7Fb\"\nnbsp: \u{a0}x",
    );
}

#[test]
fn empty_mapping_is_flow_braces() {
    check(json!({}), "{}");
}

#[test]
fn yaml_1_1_line_breaks_are_escaped_in_double_quotes() {
    // Deliberate divergence (docs/compat.md, YAML front matter): PyYAML writes NEL/LS/PS raw in single quotes
    // and reads a leading NEL back as a space; escaping them keeps every value intact.
    check(
        json!({"nel": "\u{85}x", "ls": "a\u{2028}b", "ps": "\u{2029}"}),
        "nel: \"\\Nx\"\nls: \"a\\Lb\"\nps: \"\\P\"",
    );
}
