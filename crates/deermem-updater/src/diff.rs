//! The change set between a snapshot and its updated copy, as the reference finalises an update:
//! facts created, changed and deleted with their revision preconditions, and the summary children
//! that differ.

use std::collections::{BTreeMap, HashMap};

use deermem_core::{ChangeSet, Fact, FactId, MemoryDocument, SummaryPatch};
use deermem_pycompat::py;
use serde_json::{Map, Value};

use crate::apply::ApplyOutcome;

fn changed_children(
    before: &Map<String, Value>,
    after: &Map<String, Value>,
) -> Option<Map<String, Value>> {
    let changed: Map<String, Value> = after
        .iter()
        .filter(|(k, v)| !before.get(*k).is_some_and(|b| py::py_eq(b, v)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!changed.is_empty()).then_some(changed)
}

/// The first fact of every id in `doc`.
fn first_by_id(doc: &MemoryDocument) -> HashMap<&str, &Fact> {
    let mut by_id = HashMap::with_capacity(doc.facts.len());
    for f in &doc.facts {
        by_id.entry(f.id.as_str()).or_insert(f);
    }
    by_id
}

/// The change set that turns `current` into `outcome.document`.
///
/// New facts are sent as the drafts the gates built; changed facts as their full stored form
/// with the stored revision; deleted facts with their revision as a precondition. Only summary
/// children that differ are sent (storage merges children).
pub fn change_set(current: &MemoryDocument, outcome: &ApplyOutcome) -> ChangeSet {
    let updated = &outcome.document;
    // `MemoryDocument::fact` is a linear scan; index both sides once (the first fact of an id
    // wins, as with `fact`).
    let current_by_id = first_by_id(current);
    let updated_ids = first_by_id(updated);
    let mut upserts = Vec::new();
    let mut upsert_revisions: BTreeMap<FactId, Option<u64>> = BTreeMap::new();
    for f in &updated.facts {
        match current_by_id.get(f.id.as_str()).copied() {
            None => {
                let draft = outcome
                    .new_drafts
                    .get(f.id.as_str())
                    .cloned()
                    .unwrap_or_else(|| f.to_draft());
                upserts.push(draft);
                upsert_revisions.insert(f.id.clone(), None);
            }
            Some(old) if old != f => {
                upserts.push(f.to_draft());
                upsert_revisions.insert(f.id.clone(), Some(old.revision));
            }
            Some(_) => {}
        }
    }
    let mut deletes = Vec::new();
    let mut delete_revisions: BTreeMap<FactId, u64> = BTreeMap::new();
    for f in &current.facts {
        if !updated_ids.contains_key(f.id.as_str()) {
            deletes.push(f.id.clone());
            delete_revisions.insert(f.id.clone(), f.revision);
        }
    }
    let patch = SummaryPatch {
        user: changed_children(current.user.as_map(), updated.user.as_map()),
        history: changed_children(current.history.as_map(), updated.history.as_map()),
    };
    ChangeSet {
        upserts,
        deletes,
        delete_revisions: (!delete_revisions.is_empty()).then_some(delete_revisions),
        upsert_revisions: (!upsert_revisions.is_empty()).then_some(upsert_revisions),
        summaries: (!patch.is_empty()).then_some(patch),
    }
}

/// Whether a change set changes nothing.
pub(crate) fn is_noop(changes: &ChangeSet) -> bool {
    !changes.has_fact_changes() && changes.summaries.is_none()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use deermem_core::MemoryDocument;
    use serde_json::json;

    use super::*;
    use crate::apply::{ApplyOutcome, ApplyReport, UpdateMetrics};
    use crate::testutil::{fact, ts};

    fn doc(facts: Vec<Fact>) -> MemoryDocument {
        let mut d = MemoryDocument::empty(ts("2026-06-01T00:00:00Z"));
        d.facts = facts.into();
        d
    }

    fn f(id: &str, content: &str) -> Fact {
        fact(json!({"id": id, "content": content, "confidence": 0.9}))
    }

    fn outcome(document: MemoryDocument) -> ApplyOutcome {
        ApplyOutcome {
            document,
            new_drafts: BTreeMap::new(),
            metrics: UpdateMetrics::default(),
            capacity: Vec::new(),
            report: ApplyReport::default(),
        }
    }

    #[test]
    fn creates_changes_and_deletes_by_id_with_the_first_fact_of_an_id_winning() {
        let current = doc(vec![
            f("fact_a", "A"),
            f("fact_b", "B"),
            f("fact_b", "B duplicate"),
            f("fact_c", "C"),
        ]);
        let mut changed = f("fact_a", "A changed");
        changed.revision = 1;
        let updated = doc(vec![
            changed.clone(),
            // Equal to the first `fact_b`, so no upsert although a later duplicate differs.
            f("fact_b", "B"),
            f("fact_n", "New"),
        ]);
        let cs = change_set(&current, &outcome(updated));
        let ids: Vec<&str> = cs
            .upserts
            .iter()
            .map(|d| d.id().map_or("", FactId::as_str))
            .collect();
        assert_eq!(ids, vec!["fact_a", "fact_n"]);
        let revs = cs.upsert_revisions.unwrap();
        assert_eq!(
            revs.get("fact_a").copied(),
            Some(Some(current.facts[0].revision))
        );
        assert_eq!(revs.get("fact_n").copied(), Some(None));
        assert_eq!(cs.deletes, vec![FactId::new("fact_c").unwrap()]);
        assert!(cs.summaries.is_none());
    }
}
