//! Property tests of the YAML codec: render-then-parse is the identity on hostile mappings,
//! rendering is deterministic and parsing never panics on arbitrary or truncated input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod yaml_common;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use yaml_common::yaml::{parse_front_matter, parse_mapping, render_mapping};
use yaml_common::{LOOKALIKES, mapping, nested_value};

fn one(key: &str, value: Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(key.to_owned(), value);
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parse_of_render_is_identity(m in mapping()) {
        let text = render_mapping(&m).expect("render");
        let back = parse_front_matter(&text).unwrap_or_else(|e| panic!("{text}\n{e}"));
        prop_assert!(back.unquoted_timestamps.is_empty(), "{}", text);
        prop_assert!(back.non_finite_floats.is_empty(), "{}", text);
        prop_assert_eq!(Value::Object(back.map), Value::Object(m), "{}", text);
        prop_assert!(!text.ends_with('\n'));
    }

    #[test]
    fn nested_values_round_trip_under_any_key(key in "[a-zA-Z_ -]{1,20}", v in nested_value()) {
        let m = one(&key, v);
        let text = render_mapping(&m).expect("render");
        prop_assert_eq!(parse_mapping(&text).expect("parse"), m, "{}", text);
    }

    #[test]
    fn rendering_is_stable(m in mapping()) {
        let text = render_mapping(&m).expect("render");
        let again = render_mapping(&parse_mapping(&text).expect("parse")).expect("render");
        prop_assert_eq!(again, text);
    }

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        // Either outcome is fine; the property is "no panic, no hang".
        let _ = parse_front_matter(&text);
    }

    #[test]
    fn yaml_shaped_noise_never_panics(parts in prop::collection::vec(prop::sample::select(vec![
        "a", ": ", ":", "- ", "-", "\n", "\n  ", "  ", "'", "\"", "\\", "[", "]", "{", "}", ",",
        "&x ", "*x", "!!str ", "!!int ", "!t ", "? ", "|", ">", "|-", ">+", "#", "---", "...",
        "\t", "%YAML 1.1\n", "<<", "=", "~", "2026-01-01", ".nan", "0x", "1:30", "\u{85}",
        "\u{2028}", "\u{feff}", "é",
    ]), 0..60)) {
        let text = parts.concat();
        let _ = parse_front_matter(&text);
    }

    #[test]
    fn truncated_renderings_never_panic(m in mapping(), cut in any::<prop::sample::Index>()) {
        let text = render_mapping(&m).expect("render");
        let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        let at = boundaries[cut.index(boundaries.len())];
        let _ = parse_front_matter(&text[..at]);
    }
}

#[test]
fn every_lookalike_string_round_trips_as_a_string() {
    for s in LOOKALIKES {
        for m in [
            one("k", json!(s)),
            one(s, json!(1)),
            one("k", json!([s, {"n": s}])),
        ] {
            let text = render_mapping(&m).expect("render");
            assert_eq!(
                parse_mapping(&text).expect("parse"),
                m,
                "{s:?} rendered as\n{text}"
            );
        }
    }
}

#[test]
fn ten_megabyte_scalars_round_trip() {
    let long_line = "x".repeat(10 * 1024 * 1024);
    let long_words = "word ".repeat(2 * 1024 * 1024);
    let long_escaped = "tab\t".repeat(2 * 1024 * 1024);
    for s in [long_line, long_words, long_escaped] {
        let m = one("big", json!(s));
        let text = render_mapping(&m).expect("render");
        assert_eq!(parse_mapping(&text).expect("parse"), m);
    }
}

#[test]
fn deep_nesting_is_a_clean_error_both_ways() {
    use yaml_common::yaml::MAX_DEPTH;
    let deep_flow = format!("a: {}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = parse_mapping(&deep_flow).expect_err("too deep");
    // Our depth bound or the scanner's own recursion bound, whichever trips first.
    assert!(
        err.message.contains("nesting") || err.message.contains("recursion limit"),
        "{err}"
    );
    let deep_flow_map = format!("a: {}{}", "{b: ".repeat(1_000), "}".repeat(1_000));
    let err = parse_mapping(&deep_flow_map).expect_err("too deep");
    assert!(
        err.message.contains("nesting") || err.message.contains("recursion limit"),
        "{err}"
    );

    let mut deep_block = String::new();
    for i in 0..(MAX_DEPTH + 5) {
        deep_block.push_str(&" ".repeat(2 * i));
        deep_block.push_str("k:\n");
    }
    let err = parse_mapping(&deep_block).expect_err("too deep");
    assert!(err.message.contains("nesting"), "{err}");

    let mut v = json!("leaf");
    for _ in 0..(MAX_DEPTH + 5) {
        v = json!([v]);
    }
    let err = render_mapping(&one("k", v)).expect_err("too deep to render");
    assert!(err.message.contains("deeper"), "{err}");

    // Within the limit everything works.
    let mut v = json!("leaf");
    for _ in 0..(MAX_DEPTH - 2) {
        v = json!({"k": v});
    }
    let m = one("k", v);
    assert_eq!(
        parse_mapping(&render_mapping(&m).expect("render")).expect("parse"),
        m
    );
}

#[test]
fn billion_laughs_is_refused() {
    let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    let mut prev = 'a';
    for name in 'b'..='k' {
        text.push_str(&format!("{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
        prev = name;
    }
    let err = parse_mapping(&text).expect_err("expansion bound");
    assert!(err.message.contains("aliases expand"), "{err}");
}

#[test]
fn small_alias_use_is_expanded() {
    let m = parse_mapping("base: &b {type: manual, threadId: null}\ncopy: *b\nlist: [&i 1, *i]")
        .expect("parse");
    assert_eq!(m["copy"], json!({"type": "manual", "threadId": null}));
    assert_eq!(m["list"], json!([1, 1]));
}
