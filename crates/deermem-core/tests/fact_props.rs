//! Property tests of fact normalisation: it never panics on any JSON-shaped input, accepted
//! facts satisfy the schema's invariants, and normalising a stored fact again is a no-op.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use deermem_core::fact::{FactDraft, FactScope, NormalizeContext, TITLE_MAX_CHARS, normalize_fact};
use deermem_core::{FactError, FactId, Timestamp};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn scope() -> FactScope {
    FactScope {
        user_id: Some("alice@example.com".into()),
        agent_name: Some("coder".into()),
    }
}

fn now() -> Timestamp {
    Timestamp::parse_iso("2026-12-02T09:00:00.5Z").expect("timestamp")
}

fn new_id() -> FactId {
    FactId::new("fact_generated").expect("id")
}

fn normalize(
    draft: &FactDraft,
    existing: Option<&deermem_core::Fact>,
) -> Result<deermem_core::Fact, FactError> {
    let s = scope();
    let ctx = NormalizeContext {
        scope: &s,
        existing,
        now: now(),
        new_id: &new_id,
    };
    normalize_fact(draft, &ctx)
}

/// Arbitrary JSON values, a few levels deep, with hostile strings.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-2.0f64..2.0).prop_map(Value::from),
        "\\PC{0,40}".prop_map(Value::String),
        prop_oneof![
            Just("yes"),
            Just("  "),
            Just("../x"),
            Just("a\0b"),
            Just("用户"),
            Just("\u{2028}line"),
            Just("fact_ok")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const KEYS: [&str; 16] = [
    "id",
    "content",
    "title",
    "category",
    "confidence",
    "createdAt",
    "updatedAt",
    "source",
    "status",
    "topics",
    "consolidatedFrom",
    "lastConfirmedAt",
    "confirmationCount",
    "revision",
    "scope",
    "expected_valid_days",
];

fn draft() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((prop::sample::select(KEYS.to_vec()), json_value()), 0..10).prop_map(
        |pairs| {
            let mut m = Map::new();
            for (k, v) in pairs {
                m.insert(k.to_owned(), v);
            }
            m
        },
    )
}

fn valid_draft() -> impl Strategy<Value = FactDraft> {
    (
        "[ -~]{0,3}[a-zA-Z0-9\u{4e00}-\u{4e10}][ -~\u{4e00}-\u{4e10}\n]{0,200}",
        prop::option::of(prop::sample::select(vec![
            "preference",
            "correction",
            "context",
            "workflow",
            "",
            "knowledge",
        ])),
        prop::option::of(0.0f64..=1.0),
        prop::collection::vec("[a-z ]{0,8}", 0..3),
        prop::option::of(prop_oneof![
            Just(json!("thread-1")),
            Just(json!("manual")),
            Just(json!({"type": "conversation", "threadId": "t"}))
        ]),
    )
        .prop_map(|(content, category, confidence, topics, source)| {
            let mut m = Map::new();
            m.insert("content".into(), Value::String(content));
            if let Some(c) = category {
                m.insert("category".into(), Value::String(c.to_owned()));
            }
            if let Some(c) = confidence {
                m.insert("confidence".into(), json!(c));
            }
            m.insert("topics".into(), json!(topics));
            if let Some(s) = source {
                m.insert("source".into(), s);
            }
            FactDraft::from_json(m).expect("a valid draft")
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any mapping is either a valid fact or a typed error naming a field; never a panic.
    #[test]
    fn normalisation_never_panics(d in draft()) {
        match FactDraft::from_json(d).and_then(|d| normalize(&d, None)) {
            Ok(f) => {
                prop_assert!(!f.content.is_empty());
                prop_assert_eq!(deermem_pycompat::py::strip(&f.content), f.content.as_str());
                prop_assert!((0.0..=1.0).contains(&f.confidence));
                prop_assert!(f.revision >= 1);
                prop_assert!(f.title.chars().count() <= TITLE_MAX_CHARS);
                prop_assert_eq!(&f.scope, &scope());
            }
            Err(e) => prop_assert!(!e.field().is_empty()),
        }
    }

    /// Re-normalising a stored fact against itself changes nothing: same revision, same
    /// timestamps, same values.
    #[test]
    fn renormalising_a_stored_fact_is_a_no_op(d in valid_draft()) {
        let stored = normalize(&d, None).expect("valid draft");
        let again = normalize(&stored.to_draft(), Some(&stored)).expect("re-normalise");
        // The typed draft of a fact is the draft of its JSON form.
        prop_assert_eq!(
            stored.to_draft(),
            FactDraft::from_json(stored.to_internal_map()).expect("stored fact as JSON")
        );
        prop_assert_eq!(again.revision, stored.revision);
        prop_assert_eq!(&again.updated_at, &stored.updated_at);
        prop_assert!(again.material_eq(&stored));
        // The front matter and the internal map keep every key.
        let keys: Vec<String> = stored.front_matter().keys().cloned().collect();
        for k in ["id", "confidence", "source", "schemaVersion", "status", "topics", "consolidatedFrom", "createdAt", "updatedAt", "revision", "user_id", "agent_name"] {
            prop_assert!(keys.iter().any(|x| x == k), "front matter lacks {}", k);
        }
    }

    /// Non-core categories are kept as `other` plus the original name.
    #[test]
    fn non_core_categories_keep_their_name(name in "[a-z]{3,12}") {
        let d = FactDraft::new("x").expect("content").with_category(name.clone());
        let f = normalize(&d, None).expect("valid");
        if deermem_core::fact::is_core_category(&name) {
            prop_assert_eq!(f.category.as_deref(), Some(name.as_str()));
        } else {
            prop_assert_eq!(f.category.as_deref(), Some("other"));
            prop_assert_eq!(f.category_extension(), Some(name.as_str()));
        }
    }

    /// A material change bumps the revision by exactly one and keeps `createdAt`.
    #[test]
    fn material_changes_bump_once(d in valid_draft(), extra in "[a-z]{1,10}") {
        let stored = normalize(&d, None).expect("valid draft");
        let changed = stored.to_draft().with_content(&format!("{} {extra}", stored.content)).expect("content");
        let updated = normalize(&changed, Some(&stored)).expect("update");
        prop_assert_eq!(updated.revision, stored.revision + 1);
        prop_assert_eq!(&updated.created_at, &stored.created_at);
        prop_assert_eq!(updated.updated_at, now().to_iso_z());
    }
}
