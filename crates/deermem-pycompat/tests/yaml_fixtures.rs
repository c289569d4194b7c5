//! YAML codec against the Python reference's fixtures: every fact front matter parses to what
//! PyYAML gives, and re-rendering the parsed values reproduces the fixture bytes.
// The test reads the committed fixture files; the crate's no-I/O rule is for its library code.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod yaml_common;

use yaml_common::yaml::{parse_front_matter, render_mapping};
use yaml_common::{
    as_oracle_value, fixture_fact_files, front_matter_of, load_req, oracle, python_front_matter,
};

#[test]
fn every_fixture_front_matter_rerenders_byte_identically() {
    let files = fixture_fact_files();
    assert!(
        files.len() >= 50,
        "expected the fixture fact files, found {}",
        files.len()
    );
    for path in &files {
        let text = std::fs::read_to_string(path).expect("read fixture");
        let front = front_matter_of(&text);
        let fm = parse_front_matter(front).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(fm.unquoted_timestamps.is_empty(), "{}", path.display());
        assert!(fm.non_finite_floats.is_empty(), "{}", path.display());
        let rendered = render_mapping(&fm.map).expect("render");
        assert_eq!(
            rendered,
            front,
            "re-rendered front matter of {}",
            path.display()
        );
    }
}

#[test]
fn fixture_values_match_the_hostile_topics_the_reference_wrote() {
    // Spot checks that do not need Python: the hostile topics come back as strings.
    let mut topics_seen = Vec::new();
    for path in fixture_fact_files() {
        let text = std::fs::read_to_string(&path).expect("read fixture");
        let fm = parse_front_matter(front_matter_of(&text)).expect("parse");
        if let Some(serde_json::Value::Array(topics)) = fm.map.get("topics") {
            for t in topics {
                assert!(
                    t.is_string(),
                    "{}: topic {t} is not a string",
                    path.display()
                );
                topics_seen.push(t.as_str().unwrap_or_default().to_owned());
            }
        }
        let confidence = fm.map.get("confidence").and_then(|c| c.as_f64());
        assert!(
            confidence.is_some(),
            "{}: confidence is a number",
            path.display()
        );
        for key in ["createdAt", "updatedAt"] {
            assert!(
                fm.map.get(key).is_some_and(|v| v.is_string()),
                "{}: {key}",
                path.display()
            );
        }
    }
    for want in [
        "on",
        "'quoted'",
        "trailing ",
        "- dash",
        "1e-5",
        "null",
        "# hash",
        "tab\there",
        "yes",
        "~",
        "0123",
        "2026-01-02",
        "",
    ] {
        assert!(
            topics_seen.iter().any(|t| t == want),
            "topic {want:?} not found in fixtures"
        );
    }
}

#[test]
fn fixture_values_equal_pyyaml_safe_load() {
    let files = fixture_fact_files();
    let fronts: Vec<String> = files
        .iter()
        .map(|p| front_matter_of(&std::fs::read_to_string(p).expect("read")).to_owned())
        .collect();
    let requests: Vec<_> = fronts.iter().map(|f| load_req(f)).collect();
    let Some(answers) = oracle(&requests) else {
        return;
    };
    for ((path, front), answer) in files.iter().zip(&fronts).zip(answers) {
        let py = answer.unwrap_or_else(|e| panic!("PyYAML failed on {}: {e}", path.display()));
        let ours = parse_front_matter(front).expect("parse");
        assert_eq!(
            as_oracle_value(&ours),
            python_front_matter(&py),
            "{}",
            path.display()
        );
    }
}
