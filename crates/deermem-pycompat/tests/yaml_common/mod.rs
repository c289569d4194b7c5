//! Shared helpers of the YAML codec tests: the PyYAML oracle process, fixture discovery, value
//! generators for property tests.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// The codec under test.
pub use deermem_pycompat::yaml;

use yaml::FrontMatter;

/// The PyYAML oracle script.
pub fn oracle_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/yaml_oracle.py")
}

/// `Some(reason)` when `python3` with PyYAML cannot be used here.
pub fn pyyaml_unavailable() -> Option<String> {
    match Command::new("python3")
        .args(["-c", "import yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => None,
        Ok(_) => Some("python3 is installed but `import yaml` fails (pip install pyyaml)".into()),
        Err(e) => Some(format!("python3 cannot be started: {e}")),
    }
}

/// Runs a batch of requests through one PyYAML process; `None` (with a printed skip reason)
/// when PyYAML is unavailable.
pub fn oracle(requests: &[Value]) -> Option<Vec<Result<Value, String>>> {
    if let Some(reason) = pyyaml_unavailable() {
        // Written to the real stderr (not the test harness's capture) so the skip is visible.
        let _ = writeln!(std::io::stderr(), "SKIPPED PyYAML interop check: {reason}");
        return None;
    }
    let mut child = Command::new("python3")
        .arg(oracle_script())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the PyYAML oracle");
    let mut stdin = child.stdin.take().expect("oracle stdin");
    let payload: String = requests
        .iter()
        .map(|r| format!("{}\n", serde_json::to_string(r).expect("request to JSON")))
        .collect();
    // Feed from another thread so neither pipe can fill up and block the other side.
    let feeder = std::thread::spawn(move || {
        stdin
            .write_all(payload.as_bytes())
            .expect("write to the oracle");
    });
    let stdout = child.stdout.take().expect("oracle stdout");
    let mut answers = Vec::with_capacity(requests.len());
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read the oracle");
        let v: Value = serde_json::from_str(&line).expect("oracle answers JSON");
        answers.push(match (v.get("ok"), v.get("err")) {
            (Some(ok), _) => Ok(ok.clone()),
            (_, Some(Value::String(e))) => Err(e.clone()),
            _ => panic!("malformed oracle answer {line}"),
        });
    }
    feeder.join().expect("feeder thread");
    let status = child.wait().expect("oracle exit");
    assert!(status.success(), "the PyYAML oracle failed: {status}");
    assert_eq!(answers.len(), requests.len(), "one answer per request");
    Some(answers)
}

/// A `load` request.
pub fn load_req(text: &str) -> Value {
    json!({"op": "load", "text": text})
}

/// A `dump` request.
pub fn dump_req(map: &Map<String, Value>) -> Value {
    json!({"op": "dump", "value": map})
}

fn mark_path(v: &mut Value, path: &[&str], marker: &dyn Fn(&Value) -> Value) {
    let Some((first, rest)) = path.split_first() else {
        *v = marker(v);
        return;
    };
    let next = match v {
        Value::Object(m) => m.get_mut(*first),
        Value::Array(a) => first.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        _ => None,
    };
    mark_path(next.expect("listed path exists"), rest, marker);
}

/// A JSON value in the oracle's notation: every float becomes `{"__float__": repr}`.
pub fn floats_marked(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => {
            json!({"__float__": deermem_pycompat::py::float_repr(n.as_f64().unwrap_or(f64::NAN))})
        }
        Value::Array(a) => Value::Array(a.iter().map(floats_marked).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), floats_marked(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Our parse result in the oracle's notation (floats, timestamps and non-finite floats marked).
pub fn as_oracle_value(fm: &FrontMatter) -> Value {
    let mut v = floats_marked(&Value::Object(fm.map.clone()));
    for p in &fm.unquoted_timestamps {
        let parts: Vec<&str> = p.split('.').collect();
        mark_path(&mut v, &parts, &|_| json!("__timestamp__"));
    }
    for p in &fm.non_finite_floats {
        let parts: Vec<&str> = p.split('.').collect();
        mark_path(&mut v, &parts, &|old| match old.as_str() {
            Some(".nan") => json!("__nan__"),
            Some(".inf") => json!("__inf__"),
            Some("-.inf") => json!("__-inf__"),
            other => panic!("unexpected non-finite text {other:?}"),
        });
    }
    v
}

/// The reference's view of a front matter: `safe_load(text) or {}`.
pub fn python_front_matter(loaded: &Value) -> Value {
    let falsy = match loaded {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Object(m) if m.len() == 1 && m.contains_key("__float__") => m
            .get("__float__")
            .and_then(Value::as_str)
            .is_some_and(|r| r == "0.0" || r == "-0.0"),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
    };
    if falsy { json!({}) } else { loaded.clone() }
}

/// Every fact file of the Python fixtures, sorted.
pub fn fixture_fact_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/python-deermem");
    assert!(
        root.join("expected.json").is_file(),
        "the reference fixtures are missing at {}",
        root.display()
    );
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read fixture dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md")
                && path.components().any(|c| c.as_os_str() == "facts")
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The front matter of a fact file, split the way the reference splits it.
pub fn front_matter_of(text: &str) -> &str {
    let rest = text
        .strip_prefix("---\n")
        .expect("fact file starts with ---");
    rest.split_once("\n---\n")
        .expect("front matter terminator")
        .0
}

// ---------------------------------------------------------------- generators

/// Strings that YAML 1.1 or YAML syntax would misread unless the writer quotes them.
pub const LOOKALIKES: &[&str] = &[
    "yes",
    "Yes",
    "YES",
    "no",
    "NO",
    "on",
    "On",
    "ON",
    "off",
    "OFF",
    "true",
    "False",
    "y",
    "n",
    "~",
    "null",
    "Null",
    "NULL",
    "",
    " ",
    "0",
    "-0",
    "0123",
    "010",
    "08",
    "0o10",
    "0x1F",
    "0b101",
    "0b_",
    "1_000",
    "1:30",
    "-1:30",
    "190:20:30",
    ".5",
    "1.",
    "1e-5",
    "1.0e5",
    "1.0e+5",
    "-1.0e-05",
    "1_000.5",
    "1:30.5",
    "2026-01-02",
    "2026-1-2",
    "2026-01-01T00:00:00Z",
    "2026-01-01 00:00:00.5 +05:00",
    "2026-13-45",
    ".inf",
    "-.inf",
    "+.inf",
    ".nan",
    ".NaN",
    "-.nan",
    "<<",
    "=",
    "!",
    "&",
    "*",
    "- dash",
    "-",
    "--",
    "---",
    "...",
    "--- x",
    "? q",
    "?x",
    ": c",
    ":x",
    "a: b",
    "a:b",
    "a #b",
    "a#b",
    "#hash",
    "'quoted'",
    "'''",
    "\"dq\"",
    "[x]",
    "{y}",
    "a, b",
    "@at",
    "`tick",
    "%pct",
    "|pipe",
    ">gt",
    "&anchor",
    "*alias",
    "!tag",
    "trailing ",
    " leading",
    "tab\there",
    "a\tb",
    "back\\slash",
    "\\",
    "中文",
    "emoji 🦌",
    "\u{85}",
    "a\u{85}b",
    "\u{2028}",
    "x\u{2029}y",
    "\u{feff}bom",
    "\u{a0}nbsp",
    "line\nbreak",
    "\n",
    "two\n\nbreaks",
    "trail\n",
    "\nlead",
    "sp \nbreak",
    "break\n sp",
    "\r",
    "cr\rlf\r\n",
    "\0nul",
    "\u{7f}",
    "\u{1b}esc",
    "\u{10FFFF}",
    "\u{FFFE}",
    "\u{3000}",
    "x\u{3000}",
];

/// A hostile string: a look-alike, random text from a hostile alphabet, or a long line.
pub fn hostile_string() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "a",
        "b",
        "Z",
        "0",
        "1",
        "9",
        " ",
        "  ",
        ":",
        ": ",
        "#",
        " #",
        "'",
        "\"",
        "\\",
        "\t",
        "\n",
        "\r",
        "-",
        "- ",
        "?",
        ",",
        "[",
        "]",
        "{",
        "}",
        "&",
        "*",
        "!",
        "|",
        ">",
        "%",
        "@",
        "`",
        ".",
        "e",
        "+",
        "_",
        "x",
        "中",
        "文",
        "🦌",
        "😀",
        "\u{85}",
        "\u{2028}",
        "\u{2029}",
        "\u{a0}",
        "\u{feff}",
        "\u{7}",
        "\u{0}",
        "\u{1f}",
        "é",
        "yes",
        "null",
        "~",
        "2026-01-02",
        ".inf",
        "0x",
        "1:30",
        "word ",
    ]);
    prop_oneof![
        3 => prop::sample::select(LOOKALIKES.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
        6 => prop::collection::vec(pieces, 0..12).prop_map(|v| v.concat()),
        1 => (prop::collection::vec("[a-z]{1,9}", 10..40), prop::bool::ANY).prop_map(|(words, dq)| {
            let mut s = words.join(" ");
            if dq { s.push('\t'); }
            s
        }),
        1 => ".{0,200}",
    ]
}

/// A JSON leaf value.
pub fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop::num::f64::NORMAL.prop_map(Value::from),
        prop::sample::select(vec![
            0.0,
            -0.0,
            0.95,
            1.0,
            1e-5,
            1e16,
            1.5e20,
            0.1,
            123456789.125,
            5e-324
        ])
        .prop_map(Value::from),
        hostile_string().prop_map(Value::String),
        hostile_string().prop_map(Value::String),
    ]
}

/// A nested JSON value (lists and maps up to a few levels).
pub fn nested_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((hostile_string(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A front-matter mapping with hostile keys and nested values.
pub fn mapping() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((hostile_string(), nested_value()), 0..8)
        .prop_map(|kv| kv.into_iter().collect())
}
