//! The non-canonical sidecars under `<A>/.metadata/`, in the reference's format: the
//! query-access usage with decaying heat, and the bounded, metadata-only capacity-eviction
//! audit. Reads are tolerant (an unreadable sidecar reads as empty); writes are atomic.

use std::path::Path;

use deermem_core::Timestamp;
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::policy::metadata;
use serde_json::{Map, Value};

use crate::error::Result;
use crate::fsutil;
use deermem_pycompat::json;

/// A sidecar's JSON as stored (key order kept), or `None` (with a warning) when it is missing
/// or unreadable.
pub(crate) fn read_raw(path: &Path) -> Option<Value> {
    let bytes = match fsutil::read_optional(path) {
        Ok(Some(b)) => b,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable memory sidecar");
            return None;
        }
    };
    let parsed = std::str::from_utf8(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|t| json::parse_lenient(t).map_err(|e| e.to_string()));
    match parsed {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring malformed memory sidecar");
            None
        }
    }
}

/// The usage sidecar: entries with string keys and object values (others are dropped).
pub(crate) fn read_usage(path: &Path) -> FactUsageMap {
    let v = read_raw(path);
    if v.as_ref().is_some_and(|v| !v.is_object()) {
        tracing::warn!(path = %path.display(), "ignoring memory usage sidecar that is not an object");
    }
    metadata::usage_from_value(v)
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    fsutil::atomic_write(path, json::to_python_json(v).as_bytes())
}

/// Records one access per id (already filtered to existing facts), decaying the previous heat
/// with the half-life in days.
pub(crate) fn record_accesses(
    path: &Path,
    ids: &[String],
    now: Timestamp,
    half_life_days: f64,
) -> Result<()> {
    let mut usage = match read_raw(path) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    metadata::record_accesses(&mut usage, ids, now, half_life_days);
    write_json(path, &Value::Object(usage))
}

/// Appends a capacity-eviction event and keeps the last `max_entries`.
pub(crate) fn record_eviction(
    path: &Path,
    decision: &EvictionDecision,
    max_facts: usize,
    shadow: Option<&EvictionDecision>,
    at: Timestamp,
    max_entries: usize,
) -> Result<()> {
    if decision.evicted.is_empty() || max_entries == 0 {
        return Ok(());
    }
    let mut events = match read_raw(path) {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    metadata::append_eviction(&mut events, decision, max_facts, shadow, at, max_entries);
    write_json(path, &Value::Array(events))
}

/// Removes the given ids from both sidecars, sanitising the audit; empty files are unlinked.
pub(crate) fn clear_ids(usage_path: &Path, audit_path: &Path, ids: &[String]) -> Result<()> {
    if let Some(Value::Object(mut usage)) = read_raw(usage_path) {
        let changed = metadata::forget_usage(&mut usage, ids);
        if usage.is_empty() {
            fsutil::remove_file_if_exists(usage_path)?;
        } else if changed {
            write_json(usage_path, &Value::Object(usage))?;
        }
    }
    if let Some(v) = read_raw(audit_path) {
        let kept = metadata::forget_audit(v, ids);
        if kept.is_empty() {
            fsutil::remove_file_if_exists(audit_path)?;
        } else {
            write_json(audit_path, &Value::Array(kept))?;
        }
    }
    if let Some(dir) = usage_path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use deermem_core::policy::eviction::{EvictedFact, EvictionPolicy};
    use serde_json::json;

    use super::*;

    fn ts(s: &str) -> Timestamp {
        Timestamp::parse_iso(s).unwrap()
    }

    #[test]
    fn access_heat_decays_with_half_life() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".metadata/fact-usage.json");
        record_accesses(&p, &["recent_low".into()], ts("2026-08-01T00:00:00Z"), 30.0).unwrap();
        record_accesses(&p, &["recent_low".into()], ts("2026-08-31T00:00:00Z"), 30.0).unwrap();
        let u = read_usage(&p);
        assert!((u["recent_low"]["accessHeat"].as_f64().unwrap() - 1.5).abs() < 1e-9);
        assert_eq!(u["recent_low"]["accessCount"], 2);
        assert_eq!(u["recent_low"]["lastAccessedAt"], "2026-08-31T00:00:00Z");
        std::fs::write(&p, "{not json").unwrap();
        assert!(read_usage(&p).is_empty());
        std::fs::write(
            &p,
            r#"{"a": {"accessHeat": "x", "accessCount": true, "lastAccessedAt": "bad"}}"#,
        )
        .unwrap();
        record_accesses(&p, &["a".into()], ts("2026-08-31T00:00:00Z"), 30.0).unwrap();
        assert_eq!(
            read_usage(&p)["a"],
            json!({"accessHeat": 1.0, "accessCount": 1, "lastAccessedAt": "2026-08-31T00:00:00Z"})
        );
    }

    fn decision(ids: &[&str], policy: EvictionPolicy) -> EvictionDecision {
        EvictionDecision {
            kept: Vec::new(),
            evicted: ids
                .iter()
                .map(|id| EvictedFact {
                    fact_id: (*id).into(),
                    category: "preference".into(),
                    score: 0.1,
                    components: json!({"confidence": 0.1}).as_object().unwrap().clone(),
                })
                .collect(),
            scores: HashMap::new(),
            policy,
            reserved_correction_slots: 0,
        }
    }

    #[test]
    fn audit_is_bounded_and_sanitised() {
        let dir = tempfile::tempdir().unwrap();
        let usage = dir.path().join(".metadata/fact-usage.json");
        let audit = dir.path().join(".metadata/eviction-audit.json");
        let t = ts("2026-08-13T00:00:00Z");
        let actual = decision(&["common_loser", "recent_low"], EvictionPolicy::Confidence);
        let shadow = decision(&["stale_high", "common_loser"], EvictionPolicy::HybridV1);
        record_eviction(&audit, &actual, 2, Some(&shadow), t, 1).unwrap();
        record_eviction(&audit, &actual, 2, Some(&shadow), t, 1).unwrap();
        let events: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(&audit).unwrap()).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(
            events[0]["shadow"]["wouldEvict"],
            json!(["common_loser", "stale_high"])
        );
        assert_eq!(events[0]["shadow"]["disagrees"], true);
        assert!(!std::fs::read_to_string(&audit).unwrap().contains("content"));
        clear_ids(&usage, &audit, &["recent_low".into(), "stale_high".into()]).unwrap();
        let events: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(&audit).unwrap()).unwrap();
        assert_eq!(events[0]["evicted"].as_array().unwrap().len(), 1);
        assert_eq!(events[0]["shadow"]["wouldEvict"], json!(["common_loser"]));
        assert_eq!(events[0]["shadow"]["disagrees"], false);
        // Malformed events and shadows are dropped; an audit left empty is unlinked.
        std::fs::write(&audit, r#"[{"evicted": null}, 5, {"evicted": [{"factId": 1}, {"factId": "k"}], "shadow": {"wouldEvict": null}}]"#).unwrap();
        clear_ids(&usage, &audit, &[]).unwrap();
        let events: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(&audit).unwrap()).unwrap();
        assert_eq!(events, vec![json!({"evicted": [{"factId": "k"}]})]);
        clear_ids(&usage, &audit, &["k".into()]).unwrap();
        assert!(!audit.exists());
        assert!(!dir.path().join(".metadata").exists());
    }
}
