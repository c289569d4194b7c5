//! The change set between a snapshot and its updated copy (spec/updater.md §9 step 2): facts
//! created, changed and deleted with their revision preconditions, and the summary children
//! that differ.

use std::collections::BTreeMap;

use deermem_core::{ChangeSet, FactId, MemoryDocument, SummaryPatch, py};
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

/// The change set that turns `current` into `outcome.document`.
///
/// New facts are sent as the drafts the gates built; changed facts as their full stored form
/// with the stored revision; deleted facts with their revision as a precondition. Only summary
/// children that differ are sent (storage merges children).
pub fn change_set(current: &MemoryDocument, outcome: &ApplyOutcome) -> ChangeSet {
    let updated = &outcome.document;
    let mut upserts = Vec::new();
    let mut upsert_revisions: BTreeMap<FactId, Option<u64>> = BTreeMap::new();
    for f in &updated.facts {
        match current.fact(f.id.as_str()) {
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
        if updated.fact(f.id.as_str()).is_none() {
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
pub fn is_noop(changes: &ChangeSet) -> bool {
    !changes.has_fact_changes() && changes.summaries.is_none()
}
