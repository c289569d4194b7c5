//! The non-canonical sidecars under `<A>/.metadata/`, in the reference's format: the
//! query-access usage with decaying heat, and the bounded, metadata-only capacity-eviction
//! audit. Reads are tolerant (an unreadable sidecar reads as empty); writes are atomic.

use std::path::Path;

use deermem_core::Timestamp;
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_pycompat::py;
use serde_json::{Map, Value};

use crate::error::Result;
use crate::fsutil;
use deermem_pycompat::json;

/// Reads a sidecar as JSON, or `None` (with a warning) when it is missing or unreadable.
fn read_tolerant(path: &Path) -> Option<Value> {
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
    match read_tolerant(path) {
        Some(Value::Object(m)) => m.into_iter().filter(|(_, v)| v.is_object()).collect(),
        Some(_) => {
            tracing::warn!(path = %path.display(), "ignoring memory usage sidecar that is not an object");
            Map::new()
        }
        None => Map::new(),
    }
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
    let mut usage = match read_tolerant(path) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    for id in ids {
        let prev = usage.get(id).and_then(Value::as_object);
        let raw_heat = prev.and_then(|p| p.get("accessHeat"));
        let mut heat = match raw_heat {
            Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
            Some(Value::Bool(b)) => f64::from(u8::from(*b)),
            Some(Value::String(s)) if !s.is_empty() => py::parse_float(s).unwrap_or(0.0),
            _ => 0.0,
        };
        if !heat.is_finite() || heat < 0.0 {
            heat = 0.0;
        }
        let last = prev
            .and_then(|p| p.get("lastAccessedAt"))
            .and_then(Value::as_str)
            .and_then(Timestamp::parse_iso);
        heat = match last {
            Some(t) if half_life_days > 0.0 => {
                heat * 2f64.powf(-now.days_since(t).max(0.0) / half_life_days)
            }
            _ => 0.0,
        };
        let count = prev
            .and_then(|p| p.get("accessCount"))
            .and_then(|c| match c {
                Value::Number(n) => n.as_u64(),
                _ => None,
            })
            .unwrap_or(0);
        let mut entry = Map::new();
        entry.insert(
            "accessHeat".into(),
            serde_json::Number::from_f64(heat + 1.0).map_or(Value::Null, Value::Number),
        );
        entry.insert("accessCount".into(), Value::from(count.saturating_add(1)));
        entry.insert("lastAccessedAt".into(), Value::String(now.to_iso_z()));
        usage.insert(id.clone(), Value::Object(entry));
    }
    write_json(path, &Value::Object(usage))
}

fn num(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
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
    let mut events = match read_tolerant(path) {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    let evicted: Vec<Value> = decision
        .evicted
        .iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("factId".into(), Value::String(e.fact_id.clone()));
            m.insert("category".into(), Value::String(e.category.clone()));
            m.insert("score".into(), num(e.score));
            m.insert("components".into(), Value::Object(e.components.clone()));
            Value::Object(m)
        })
        .collect();
    let mut event = Map::new();
    event.insert("occurredAt".into(), Value::String(at.to_iso_z()));
    event.insert("reason".into(), Value::String("capacity".into()));
    event.insert(
        "policyVersion".into(),
        Value::String(decision.policy.as_str().into()),
    );
    event.insert("maxFacts".into(), Value::from(max_facts));
    event.insert(
        "reservedCorrectionSlots".into(),
        Value::from(decision.reserved_correction_slots),
    );
    event.insert("evicted".into(), Value::Array(evicted));
    if let Some(shadow) = shadow {
        let mut would: Vec<String> = shadow.evicted_ids();
        would.sort();
        would.dedup();
        let actual: std::collections::BTreeSet<String> =
            decision.evicted_ids().into_iter().collect();
        let shadow_set: std::collections::BTreeSet<String> = would.iter().cloned().collect();
        let mut s = Map::new();
        s.insert(
            "policyVersion".into(),
            Value::String(shadow.policy.as_str().into()),
        );
        s.insert(
            "wouldEvict".into(),
            Value::Array(would.into_iter().map(Value::String).collect()),
        );
        s.insert("disagrees".into(), Value::Bool(actual != shadow_set));
        event.insert("shadow".into(), Value::Object(s));
    }
    events.push(Value::Object(event));
    if events.len() > max_entries {
        events.drain(..events.len() - max_entries);
    }
    write_json(path, &Value::Array(events))
}

/// Removes the given ids from both sidecars, sanitising the audit; empty files are unlinked.
pub(crate) fn clear_ids(usage_path: &Path, audit_path: &Path, ids: &[String]) -> Result<()> {
    let drop_id = |id: &str| ids.iter().any(|i| i == id);
    // Usage.
    if let Some(Value::Object(mut usage)) = read_tolerant(usage_path) {
        let before = usage.len();
        usage.retain(|k, _| !drop_id(k));
        if usage.is_empty() {
            fsutil::remove_file_if_exists(usage_path)?;
        } else if usage.len() != before {
            write_json(usage_path, &Value::Object(usage))?;
        }
    }
    // Audit.
    if let Some(v) = read_tolerant(audit_path) {
        let events = match v {
            Value::Array(a) => a,
            _ => Vec::new(),
        };
        let mut kept = Vec::new();
        for ev in events {
            let Value::Object(mut ev) = ev else { continue };
            let Some(Value::Array(evicted)) = ev.get("evicted").cloned() else {
                continue;
            };
            let evicted: Vec<Value> = evicted
                .into_iter()
                .filter(|e| {
                    e.as_object()
                        .and_then(|o| o.get("factId"))
                        .and_then(Value::as_str)
                        .is_some_and(|id| !drop_id(id))
                })
                .collect();
            if evicted.is_empty() {
                continue;
            }
            let actual: std::collections::BTreeSet<String> = evicted
                .iter()
                .filter_map(|e| e.get("factId").and_then(Value::as_str).map(str::to_owned))
                .collect();
            let shadow = ev.get("shadow").cloned();
            match shadow {
                Some(Value::Object(mut s)) => match s.get("wouldEvict").cloned() {
                    Some(Value::Array(would)) => {
                        let would: Vec<Value> = would
                            .into_iter()
                            .filter(|w| w.as_str().is_some_and(|id| !drop_id(id)))
                            .collect();
                        let set: std::collections::BTreeSet<String> = would
                            .iter()
                            .filter_map(|w| w.as_str().map(str::to_owned))
                            .collect();
                        s.insert("wouldEvict".into(), Value::Array(would));
                        s.insert("disagrees".into(), Value::Bool(set != actual));
                        ev.insert("shadow".into(), Value::Object(s));
                    }
                    _ => {
                        ev.shift_remove("shadow");
                    }
                },
                Some(_) => {
                    ev.shift_remove("shadow");
                }
                None => {}
            }
            ev.insert("evicted".into(), Value::Array(evicted));
            kept.push(Value::Object(ev));
        }
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
