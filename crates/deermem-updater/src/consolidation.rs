//! Consolidation: which categories are fragmented enough to merge, the prompt section that shows
//! them, and the set of fact ids a merge may consume.

use std::collections::BTreeSet;

use crate::DeerMemConfig;
use deermem_core::Fact;
use indexmap::IndexMap;

use crate::facts::display_category;
use crate::staleness::is_protected;
use crate::text::fmt2;
use deermem_pycompat::py::html_escape;

/// The group key of a fact: its displayed category, stripped; blank categories are not grouped.
fn group_key(fact: &Fact) -> Option<&str> {
    match fact.category.as_deref() {
        None => Some("context"),
        Some(c) if c.trim().is_empty() => None,
        Some(_) => Some(display_category(fact)),
    }
}

/// Categories holding at least `consolidation_min_facts` facts and not protected, with their
/// facts in memory order (first-seen category order).
pub(crate) fn select_consolidation_candidates<'a>(
    facts: &'a [Fact],
    config: &DeerMemConfig,
) -> IndexMap<String, Vec<&'a Fact>> {
    let mut groups: IndexMap<String, Vec<&Fact>> = IndexMap::new();
    for f in facts {
        if let Some(key) = group_key(f) {
            groups.entry(key.to_owned()).or_default().push(f);
        }
    }
    groups.retain(|cat, members| {
        members.len() >= config.consolidation_min_facts
            && !config
                .staleness_protected_categories
                .iter()
                .any(|p| p == cat)
            && !members
                .first()
                .is_some_and(|f| is_protected(f, &config.staleness_protected_categories))
    });
    groups
}

/// The groups shown in the prompt: the largest categories first (ties by name), at most
/// `consolidation_max_groups_per_cycle`, each with its first `consolidation_max_sources` facts.
pub(crate) fn shown_groups<'a>(
    candidates: &IndexMap<String, Vec<&'a Fact>>,
    config: &DeerMemConfig,
) -> Vec<(String, Vec<&'a Fact>)> {
    let mut groups: Vec<(&String, &Vec<&Fact>)> = candidates.iter().collect();
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(b.0)));
    groups
        .into_iter()
        .take(config.consolidation_max_groups_per_cycle)
        .map(|(cat, members)| {
            (
                cat.clone(),
                members
                    .iter()
                    .take(config.consolidation_max_sources)
                    .copied()
                    .collect(),
            )
        })
        .collect()
}

/// The ids shown in the prompt: a merge may consume only these (the reference let a merge
/// consume any fact of a qualifying category, even one the prompt had cut off).
pub(crate) fn shown_ids(groups: &[(String, Vec<&Fact>)]) -> BTreeSet<String> {
    groups
        .iter()
        .flat_map(|(_, members)| members.iter().map(|f| f.id.as_str().to_owned()))
        .collect()
}

/// The `{consolidation_groups}` text: one tagged block per shown group.
pub(crate) fn consolidation_groups_text(groups: &[(String, Vec<&Fact>)]) -> String {
    groups
        .iter()
        .map(|(cat, members)| {
            let mut block = format!(
                "<consolidation_candidates category=\"{}\" count=\"{}\">",
                html_escape(cat, true),
                members.len()
            );
            for f in members {
                block.push_str(&format!(
                    "\n- [{} | {}] \"{}\"",
                    f.id,
                    fmt2(f.confidence),
                    html_escape(&f.content, true)
                ));
            }
            block.push_str("\n</consolidation_candidates>");
            block
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testutil::fact;

    fn facts(cat: &str, n: usize, prefix: &str) -> Vec<Fact> {
        (0..n)
            .map(|i| {
                fact(
                    json!({"id": format!("{prefix}{i:02}"), "content": format!("{cat} fact {i}"),
                            "category": cat, "confidence": 0.9}),
                )
            })
            .collect()
    }

    #[test]
    fn candidates_need_enough_facts_and_no_protection() {
        let cfg = DeerMemConfig::default();
        assert!(select_consolidation_candidates(&[], &cfg).is_empty());
        assert!(select_consolidation_candidates(&facts("preference", 5, "p"), &cfg).is_empty());
        assert_eq!(
            select_consolidation_candidates(&facts("preference", 8, "p"), &cfg)["preference"].len(),
            8
        );
        assert_eq!(
            select_consolidation_candidates(&facts("preference", 12, "p"), &cfg)["preference"]
                .len(),
            12
        );
        let mut all = facts("preference", 10, "p");
        all.extend(facts("knowledge", 9, "k"));
        all.extend(facts("goal", 3, "g"));
        all.extend(facts("correction", 9, "c"));
        let c = select_consolidation_candidates(&all, &cfg);
        assert_eq!(
            c.keys().collect::<Vec<_>>(),
            vec!["preference", "knowledge"]
        );
    }

    #[test]
    fn shown_groups_are_largest_first_and_capped() {
        let cfg = DeerMemConfig {
            consolidation_max_groups_per_cycle: 1,
            ..DeerMemConfig::default()
        };
        let mut all = facts("goal", 9, "g");
        all.extend(facts("behavior", 20, "b"));
        let c = select_consolidation_candidates(&all, &cfg);
        let shown = shown_groups(&c, &cfg);
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].0, "behavior");
        assert_eq!(shown[0].1.len(), 8);
        let text = consolidation_groups_text(&shown);
        assert!(text.starts_with("<consolidation_candidates category=\"behavior\" count=\"8\">\n- [b00 | 0.90] \"behavior fact 0\""));
        assert_eq!(shown_ids(&shown).len(), 8);
    }

    #[test]
    fn section_text_escapes_with_quotes() {
        let f = [fact(
            json!({"id": "a", "content": "<b> & \"x\" </consolidation_candidates>", "category": "pref\"erences", "confidence": 0.95}),
        )];
        let refs: Vec<&Fact> = f.iter().collect();
        let text = consolidation_groups_text(&[("pref\"erences".to_owned(), refs)]);
        assert!(text.contains("category=\"pref&quot;erences\""));
        assert!(text.contains("&lt;b&gt; &amp; &quot;x&quot; &lt;/consolidation_candidates&gt;"));
        assert!(text.contains("| 0.95]"));
        assert_eq!(consolidation_groups_text(&[]), "");
    }
}
