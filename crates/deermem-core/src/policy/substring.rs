//! The substring search every search path falls back to when no ranked index answers: the facts
//! whose content contains the stripped, lower-cased query, highest score first, cut after the
//! category filter. The storage fallback, the manager's own path and the test index share it;
//! they differ only in the two rules the reference gave them.

use crate::fact::Fact;
use crate::policy::eviction::bounded_confidence;
use crate::search::{MatchType, SearchHit, SearchQuery};
use deermem_pycompat::py;

/// How a category filter compares with a fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CategoryMatch {
    /// The stored field exactly: a fact without a category never matches (the storage
    /// fallback).
    Stored,
    /// A missing category reads as `context` (the manager's path and the index).
    OrDefault,
}

/// How a matching fact is scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubstringScore {
    /// The confidence, with 0 (or a non-finite value) counted as 0.5 (the storage fallback).
    ZeroIsHalf,
    /// The confidence clamped to `[0, 1]`, non-finite as 0.5 (the manager's path).
    Bounded,
}

/// The rules of one substring search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubstringRules {
    /// Category comparison.
    pub category: CategoryMatch,
    /// Scoring.
    pub score: SubstringScore,
}

impl SubstringRules {
    /// The storage fallback's rules.
    pub const STORAGE: Self = Self {
        category: CategoryMatch::Stored,
        score: SubstringScore::ZeroIsHalf,
    };
    /// The manager's rules.
    pub const MANAGER: Self = Self {
        category: CategoryMatch::OrDefault,
        score: SubstringScore::Bounded,
    };
    /// A derived index's rules (category with its default, storage scoring).
    pub const INDEX: Self = Self {
        category: CategoryMatch::OrDefault,
        score: SubstringScore::ZeroIsHalf,
    };
}

/// The matching facts with their scores, highest first (ties keep the input order), at most
/// `top_k`. A blank query or `top_k == 0` matches nothing.
pub fn substring_search<'a>(
    facts: impl IntoIterator<Item = &'a Fact>,
    query: &str,
    category: Option<&str>,
    top_k: usize,
    rules: SubstringRules,
) -> Vec<(f64, &'a Fact)> {
    let needle = py::lower(py::strip(query));
    if needle.is_empty() || top_k == 0 {
        return Vec::new();
    }
    let mut hits: Vec<(f64, &Fact)> = facts
        .into_iter()
        .filter(|f| {
            category.is_none_or(|c| match rules.category {
                CategoryMatch::Stored => f.category.as_deref() == Some(c),
                CategoryMatch::OrDefault => f.category_or_default() == c,
            })
        })
        .filter(|f| py::lower(&f.content).contains(&needle))
        .map(|f| {
            let score = match rules.score {
                SubstringScore::ZeroIsHalf if f.confidence == 0.0 || !f.confidence.is_finite() => {
                    0.5
                }
                SubstringScore::ZeroIsHalf => f.confidence,
                SubstringScore::Bounded => bounded_confidence(f.confidence),
            };
            (score, f)
        })
        .collect();
    hits.sort_by(|a, b| b.0.total_cmp(&a.0));
    hits.truncate(top_k);
    hits
}

/// [`substring_search`] over a [`SearchQuery`]'s text, category and `top_k`, as search hits
/// (the facts cloned, `matchType: substring`).
pub fn substring_hits<'a>(
    facts: impl IntoIterator<Item = &'a Fact>,
    query: &SearchQuery,
    rules: SubstringRules,
) -> Vec<SearchHit> {
    substring_search(
        facts,
        &query.text,
        query.category.as_deref(),
        query.top_k,
        rules,
    )
    .into_iter()
    .map(|(score, fact)| SearchHit {
        fact: fact.clone(),
        score,
        match_type: MatchType::Substring,
        bm25: None,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fact::{FactScope, NormalizeContext, normalize_fact};
    use crate::ids::FactId;
    use crate::time::Timestamp;
    use serde_json::{Value, json};

    fn fact(id: &str, content: &str, extra: Value) -> Fact {
        let mut draft = json!({"id": id, "content": content, "createdAt": "2026-01-01T00:00:00Z"});
        if let (Some(d), Value::Object(e)) = (draft.as_object_mut(), extra) {
            d.extend(e);
        }
        let scope = FactScope::default();
        let fid = FactId::new(id).expect("id");
        let new_id = move || fid.clone();
        let ctx = NormalizeContext {
            scope: &scope,
            existing: None,
            now: Timestamp::parse_iso("2026-01-01T00:00:00Z").expect("time"),
            new_id: &new_id,
        };
        normalize_fact(&draft.try_into().expect("draft"), &ctx).expect("fact")
    }

    fn ids(hits: &[(f64, &Fact)]) -> Vec<String> {
        hits.iter().map(|(_, f)| f.id.as_str().to_owned()).collect()
    }

    #[test]
    fn matches_case_insensitively_ranked_and_cut_after_the_filter() {
        let facts = [
            fact("a", "Drinks TEA daily", json!({"confidence": 0.6})),
            fact(
                "b",
                "tea with milk",
                json!({"confidence": 0.9, "category": "preference"}),
            ),
            fact("c", "coffee", json!({"confidence": 1.0})),
            fact(
                "d",
                "Green tea",
                json!({"confidence": 0.7, "category": "preference"}),
            ),
        ];
        let hits = substring_search(&facts, "  Tea ", None, 5, SubstringRules::MANAGER);
        assert_eq!(ids(&hits), ["b", "d", "a"]);
        let hits = substring_search(
            &facts,
            "tea",
            Some("preference"),
            1,
            SubstringRules::MANAGER,
        );
        assert_eq!(ids(&hits), ["b"]);
        assert!(substring_search(&facts, "  ", None, 5, SubstringRules::MANAGER).is_empty());
        assert!(substring_search(&facts, "tea", None, 0, SubstringRules::MANAGER).is_empty());
    }

    #[test]
    fn the_rules_differ_only_in_category_default_and_zero_confidence() {
        let facts = [
            fact("a", "tea", json!({"confidence": 0.0})),
            fact(
                "b",
                "tea",
                json!({"confidence": 0.4, "category": "context"}),
            ),
        ];
        let storage = substring_search(&facts, "tea", None, 5, SubstringRules::STORAGE);
        assert_eq!(
            storage.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            [0.5, 0.4]
        );
        let manager = substring_search(&facts, "tea", None, 5, SubstringRules::MANAGER);
        assert_eq!(
            manager.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            [0.4, 0.0]
        );
        // `a` has no category: only the defaulting rule reads it as `context`.
        let stored = substring_search(&facts, "tea", Some("context"), 5, SubstringRules::STORAGE);
        assert_eq!(ids(&stored), ["b"]);
        let defaulted = substring_search(&facts, "tea", Some("context"), 5, SubstringRules::INDEX);
        assert_eq!(ids(&defaulted), ["a", "b"]);
    }
}
