//! The fact metadata every storage keeps beside the facts, in the reference's shapes, as pure
//! edits of JSON values: the query-access usage map with decaying heat, and the bounded,
//! metadata-only capacity-eviction audit. Where the values live (sidecar files, a database row)
//! is the adapter's.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::policy::eviction::{EvictionDecision, FactUsageMap};
use crate::time::Timestamp;
use deermem_pycompat::py;

/// The usage map a stored value reads as: entries with object values (others are dropped); a
/// value that is not an object reads as empty.
pub fn usage_from_value(v: Option<Value>) -> FactUsageMap {
    match v {
        Some(Value::Object(m)) => m.into_iter().filter(|(_, v)| v.is_object()).collect(),
        _ => Map::new(),
    }
}

/// Records one access per id (already filtered to existing facts), decaying each previous heat
/// with the half-life in days. Malformed previous entries start again from nothing.
pub fn record_accesses(
    usage: &mut Map<String, Value>,
    ids: &[String],
    now: Timestamp,
    half_life_days: f64,
) {
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
        usage.insert(
            id.clone(),
            json!({
                "accessHeat": num(heat + 1.0),
                "accessCount": count.saturating_add(1),
                "lastAccessedAt": now.to_iso_z(),
            }),
        );
    }
}

fn num(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

/// Appends a capacity-eviction event (ids, categories, scores and score components; never
/// content) to `events` and keeps the last `max_entries`. Nothing happens for a decision that
/// evicts nothing or a zero bound.
pub fn append_eviction(
    events: &mut Vec<Value>,
    decision: &EvictionDecision,
    max_facts: usize,
    shadow: Option<&EvictionDecision>,
    at: Timestamp,
    max_entries: usize,
) {
    if decision.evicted.is_empty() || max_entries == 0 {
        return;
    }
    let evicted: Vec<Value> = decision
        .evicted
        .iter()
        .map(|e| {
            json!({
                "factId": e.fact_id,
                "category": e.category,
                "score": num(e.score),
                "components": e.components,
            })
        })
        .collect();
    let mut event = json!({
        "occurredAt": at.to_iso_z(),
        "reason": "capacity",
        "policyVersion": decision.policy.as_str(),
        "maxFacts": max_facts,
        "reservedCorrectionSlots": decision.reserved_correction_slots,
        "evicted": evicted,
    });
    if let Some(shadow) = shadow {
        let mut would: Vec<String> = shadow.evicted_ids();
        would.sort();
        would.dedup();
        let actual: BTreeSet<String> = decision.evicted_ids().into_iter().collect();
        let shadow_set: BTreeSet<String> = would.iter().cloned().collect();
        event["shadow"] = json!({
            "policyVersion": shadow.policy.as_str(),
            "wouldEvict": would,
            "disagrees": actual != shadow_set,
        });
    }
    events.push(event);
    if events.len() > max_entries {
        events.drain(..events.len() - max_entries);
    }
}

/// Removes `ids` from the usage map; whether anything was removed.
pub fn forget_usage(usage: &mut Map<String, Value>, ids: &[String]) -> bool {
    let before = usage.len();
    usage.retain(|k, _| !ids.iter().any(|i| i == k));
    usage.len() != before
}

/// The audit without `ids`, sanitised: events that are not objects or whose `evicted` is not a
/// list are dropped, entries without a string `factId` are dropped, an event left with nothing
/// evicted is dropped, and a shadow is recomputed against what is left (or dropped when
/// malformed).
pub fn forget_audit(events: Value, ids: &[String]) -> Vec<Value> {
    let drop_id = |id: &str| ids.iter().any(|i| i == id);
    let events = match events {
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
        let actual: BTreeSet<String> = evicted
            .iter()
            .filter_map(|e| e.get("factId").and_then(Value::as_str).map(str::to_owned))
            .collect();
        match ev.get("shadow").cloned() {
            Some(Value::Object(mut s)) => match s.get("wouldEvict").cloned() {
                Some(Value::Array(would)) => {
                    let would: Vec<Value> = would
                        .into_iter()
                        .filter(|w| w.as_str().is_some_and(|id| !drop_id(id)))
                        .collect();
                    let set: BTreeSet<String> = would
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
    kept
}
