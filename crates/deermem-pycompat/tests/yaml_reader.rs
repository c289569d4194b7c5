//! Reader behaviour pinned case by case: YAML 1.1 typing of plain scalars, positions of values
//! JSON cannot hold, tags, keys, top-level shapes and typed errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod yaml_common;

use serde_json::{Value, json};
use yaml_common::yaml::{FrontMatter, parse_front_matter, parse_mapping};

fn value_of(scalar: &str) -> Value {
    let m = parse_mapping(&format!("k: {scalar}")).unwrap_or_else(|e| panic!("{scalar:?}: {e}"));
    m["k"].clone()
}

fn fm(text: &str) -> FrontMatter {
    parse_front_matter(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

#[test]
fn plain_scalars_are_typed_like_pyyaml() {
    let cases = [
        ("yes", json!(true)),
        ("No", json!(false)),
        ("on", json!(true)),
        ("OFF", json!(false)),
        ("y", json!("y")),
        ("n", json!("n")),
        ("~", json!(null)),
        ("null", json!(null)),
        ("", json!(null)),
        ("010", json!(8)),
        ("0o10", json!("0o10")),
        ("0x1F", json!(31)),
        ("0b101", json!(5)),
        ("1_000", json!(1000)),
        ("1:30", json!(90)),
        ("-1:30", json!(-90)),
        ("+12", json!(12)),
        ("1.0", json!(1.0)),
        (".5", json!(0.5)),
        ("1.", json!(1.0)),
        ("1.0e+5", json!(100_000.0)),
        ("1.0e5", json!("1.0e5")),
        ("1e-5", json!("1e-5")),
        ("1.0e-05", json!(1e-5)),
        ("1:30.5", json!(90.5)),
        ("0.95", json!(0.95)),
        ("18446744073709551615", json!(u64::MAX)),
        ("'yes'", json!("yes")),
        ("\"010\"", json!("010")),
        ("'2026-01-01'", json!("2026-01-01")),
        ("!!str 1.5", json!("1.5")),
        ("!!int '12'", json!(12)),
        ("!!float '1'", json!(1.0)),
        ("!!bool 'On'", json!(true)),
        ("!!null whatever", json!(null)),
        ("! on", json!(true)),
    ];
    for (text, want) in cases {
        let got = value_of(text);
        assert_eq!(got, want, "{text:?}");
        // Ints stay ints and floats stay floats.
        assert_eq!(got.is_f64(), want.is_f64(), "{text:?}");
    }
}

#[test]
fn unquoted_timestamps_keep_their_text_and_are_located() {
    let f = fm(
        "createdAt: 2026-01-01T00:00:00Z\nupdatedAt: '2026-01-01T00:00:00Z'\nsource:\n  type: conversation\n  threadId: 2026-01-02\ntopics:\n- a\n- 2026-01-01 10:00:00.5 +05:00",
    );
    assert_eq!(f.map["createdAt"], json!("2026-01-01T00:00:00Z"));
    assert_eq!(f.map["source"]["threadId"], json!("2026-01-02"));
    assert_eq!(f.map["topics"][1], json!("2026-01-01 10:00:00.5 +05:00"));
    assert_eq!(
        f.unquoted_timestamps,
        ["createdAt", "source.threadId", "topics.1"]
    );
    assert!(f.non_finite_floats.is_empty());
}

#[test]
fn non_finite_floats_are_printed_and_located() {
    let f = fm("confidence: .nan\na: .inf\nb: -.Inf\nc: 1.0e+999\nd: .5\ne: '.nan'");
    assert_eq!(f.map["confidence"], json!(".nan"));
    assert_eq!(f.map["a"], json!(".inf"));
    assert_eq!(f.map["b"], json!("-.inf"));
    assert_eq!(f.map["c"], json!(".inf"));
    assert_eq!(f.map["d"], json!(0.5));
    assert_eq!(f.map["e"], json!(".nan"));
    assert_eq!(f.non_finite_floats, ["confidence", "a", "b", "c"]);
}

#[test]
fn scalar_styles_and_folding() {
    let m = parse_mapping(concat!(
        "sq: 'it''s'\n",
        "dq: \"\\t\\n\\\\\\\"\\x41\\u00e9\\U0001F98C\\N\\_\\L\\P\\e\\0\\/\"\n",
        "folded: 'one\n  two\n\n  three'\n",
        "cont: \"a\\\n  b\\\n  \\ c\"\n",
        "plain: word\n  more words\n",
        "lit: |\n  a\n  b\n",
        "fold: >-\n  a\n  b\n",
        "last: |\n  x",
    ))
    .expect("parse");
    assert_eq!(m["sq"], json!("it's"));
    assert_eq!(
        m["dq"],
        json!("\t\n\\\"Aé🦌\u{85}\u{a0}\u{2028}\u{2029}\u{1b}\0/")
    );
    assert_eq!(m["folded"], json!("one two\nthree"));
    assert_eq!(m["cont"], json!("ab c"));
    assert_eq!(m["plain"], json!("word more words"));
    assert_eq!(m["lit"], json!("a\nb\n"));
    assert_eq!(m["fold"], json!("a b"));
    // PyYAML: a block scalar ending the (unterminated) front matter has no final line break.
    assert_eq!(m["last"], json!("x"));
}

#[test]
fn keys_keep_document_order_and_python_dict_semantics() {
    let m = parse_mapping("b: 1\na: 2\nb: 3\n=: eq\n1: one\n'quoted': q").expect("parse");
    let keys: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(keys, ["b", "a", "=", "1", "quoted"]);
    assert_eq!(m["b"], json!(3));
    assert_eq!(m["="], json!("eq"));
}

#[test]
fn top_level_shapes_follow_the_reference() {
    for empty in [
        "",
        "# comment only",
        "~",
        "null",
        "false",
        "0",
        "''",
        "[]",
        "{}",
        "---\n...",
    ] {
        assert!(fm(empty).map.is_empty(), "{empty:?}");
    }
    for not_a_mapping in ["- a", "text", "1", "true", "[1]"] {
        let err = parse_mapping(not_a_mapping).expect_err(not_a_mapping);
        assert!(
            err.message.contains("not a mapping"),
            "{not_a_mapping:?}: {err}"
        );
    }
}

#[test]
fn malformed_input_is_a_typed_error_with_a_line() {
    let cases = [
        ("a: 1\nb: [unclosed", "flow sequence"),
        ("a: 1\n<<: {x: 1}", "merge"),
        ("a: =", "="),
        ("a: !custom x", "tag"),
        ("a: !!binary aGk=", "tag"),
        ("a: !!set {x}", "tag"),
        ("a: !!int 1.5", "integer"),
        ("a: !!bool maybe", "boolean"),
        ("a: 99999999999999999999", "64-bit"),
        ("a: 0b_", "integer"),
        ("a: 2026-02-30", "timestamp"),
        ("a: 1\n---\nb: 2", "single document"),
        ("? [a]\n: v", "unhashable"),
        ("a: tab\there", "tab"),
        ("a: \u{1}", "unacceptable character"),
        ("a: *nowhere", "anchor"),
    ];
    for (text, needle) in cases {
        let err = parse_front_matter(text).expect_err(text);
        assert!(err.message.contains(needle), "{text:?}: {err}");
        assert!(err.line.is_some(), "{text:?}: {err} has no line");
        assert!(
            err.to_string().starts_with("YAML front matter, line "),
            "{err}"
        );
    }
}

/// Whole documents of any shape, as configuration loading reads them.
#[test]
fn documents_of_any_shape_read_like_safe_load() {
    use deermem_pycompat::yaml::parse_document;
    assert_eq!(parse_document("").unwrap(), json!(null));
    assert_eq!(parse_document("# only a comment\n").unwrap(), json!(null));
    assert_eq!(
        parse_document("- on\n- off\n- 0x1f\n- 1:30\n- '1:30'\n").unwrap(),
        json!([true, false, 31, 90, "1:30"])
    );
    assert_eq!(parse_document("12").unwrap(), json!(12));
    let v = parse_document(
        "memory:\n  enabled: Yes\n  max_facts: 1_000\n  mode: 017\n  alt: 0o17\n  ratio: .5\n  ttl: .inf\n  since: 2026-01-02\n  1: one\n  ~: none\n",
    )
    .unwrap();
    assert_eq!(
        v,
        json!({"memory": {"enabled": true, "max_facts": 1000, "mode": 15, "alt": "0o17", "ratio": 0.5,
               "ttl": ".inf", "since": "2026-01-02", "1": "one", "null": "none"}})
    );
    assert!(parse_document("a: [1\n").is_err());
    assert!(parse_document("? [a]\n: 1\n").is_err());
}
