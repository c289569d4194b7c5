//! Capacity eviction, scored and selected as the reference does: which facts to keep when a
//! bucket exceeds `max_facts`, by the `confidence` policy or the opt-in `hybrid-v1` blend of
//! confidence, confirmation freshness and query-access heat with a bounded correction reserve.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::fact::Fact;
use crate::time::Timestamp;

/// Query-access usage per fact id: `{id: {"accessHeat", "accessCount", "lastAccessedAt"}}`.
pub type FactUsageMap = Map<String, Value>;

/// An eviction policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EvictionPolicy {
    /// Keep the most confident facts.
    #[serde(rename = "confidence")]
    Confidence,
    /// Blend confidence, confirmation freshness and access heat.
    #[serde(rename = "hybrid-v1")]
    HybridV1,
}

impl EvictionPolicy {
    /// The config / audit name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confidence => "confidence",
            Self::HybridV1 => "hybrid-v1",
        }
    }
}

/// Weights and windows of the scoring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvictionParams {
    /// The cap.
    pub max_facts: usize,
    /// The policy.
    pub policy: EvictionPolicy,
    /// Hybrid weight of confidence.
    pub confidence_weight: f64,
    /// Hybrid weight of confirmation freshness.
    pub confirmation_weight: f64,
    /// Hybrid weight of access heat.
    pub access_weight: f64,
    /// Half-life of confirmation freshness, in days.
    pub confirmation_half_life_days: f64,
    /// Half-life of access heat, in days.
    pub access_half_life_days: f64,
    /// Fraction of the cap reserved for corrections (hybrid only).
    pub correction_reserved_fraction: f64,
    /// Upper bound of the correction reserve.
    pub correction_reserved_max: usize,
}

impl EvictionParams {
    /// The reference defaults for a policy and cap.
    pub fn new(max_facts: usize, policy: EvictionPolicy) -> Self {
        Self {
            max_facts,
            policy,
            confidence_weight: 0.65,
            confirmation_weight: 0.25,
            access_weight: 0.10,
            confirmation_half_life_days: 90.0,
            access_half_life_days: 30.0,
            correction_reserved_fraction: 0.10,
            correction_reserved_max: 10,
        }
    }
}

/// One evicted fact, as the audit records it (metadata only, never content).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvictedFact {
    /// Fact id.
    #[serde(rename = "factId")]
    pub fact_id: String,
    /// Category (`context` when absent).
    pub category: String,
    /// Total score.
    pub score: f64,
    /// Score components by name.
    pub components: Map<String, Value>,
}

/// The outcome of a capacity selection.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionDecision {
    /// Facts kept: input order when under the cap, rank order when trimmed.
    pub kept: Vec<Fact>,
    /// Facts evicted, lowest score first.
    pub evicted: Vec<EvictedFact>,
    /// Score per fact id.
    pub scores: HashMap<String, f64>,
    /// The policy used.
    pub policy: EvictionPolicy,
    /// Correction slots reserved (hybrid only).
    pub reserved_correction_slots: usize,
}

impl EvictionDecision {
    /// Ids of the evicted facts.
    pub fn evicted_ids(&self) -> Vec<String> {
        self.evicted.iter().map(|e| e.fact_id.clone()).collect()
    }
}

fn decay(days: f64, half_life: f64) -> f64 {
    if half_life <= 0.0 {
        0.0
    } else {
        2f64.powf(-days.max(0.0) / half_life)
    }
}

/// The bounded confidence used for eviction scoring: non-numbers and non-finite values read as
/// 0.5, the result is clamped to `[0, 1]`.
pub fn bounded_confidence(v: f64) -> f64 {
    if v.is_finite() {
        v.clamp(0.0, 1.0)
    } else {
        0.5
    }
}

/// A timestamp, unless the text is blank.
fn parse_nonblank(s: &str) -> Option<Timestamp> {
    (!s.trim().is_empty())
        .then(|| Timestamp::parse_iso(s))
        .flatten()
}

/// Freshness of explicit confirmation: `decay(lastConfirmedAt)`, else half of
/// `decay(createdAt)`, else 0.
fn confirmation_freshness(fact: &Fact, now: Timestamp, half_life: f64) -> f64 {
    if let Some(Some(last)) = &fact.last_confirmed_at
        && let Some(t) = parse_nonblank(last)
    {
        return decay(now.days_since(t), half_life);
    }
    match parse_nonblank(&fact.created_at) {
        Some(t) => 0.5 * decay(now.days_since(t), half_life),
        None => 0.0,
    }
}

/// Normalised access heat of a usage entry: the recorded heat decayed by the half-life since the
/// last access, mapped onto [0, 1] so that a decayed heat of 8 saturates; 0 for an entry that
/// is missing, malformed, non-finite or not positive.
pub fn access_heat(entry: Option<&Value>, now: Timestamp, half_life: f64) -> f64 {
    let Some(Value::Object(e)) = entry else {
        return 0.0;
    };
    let Some(last) = e
        .get("lastAccessedAt")
        .and_then(Value::as_str)
        .and_then(parse_nonblank)
    else {
        return 0.0;
    };
    let heat = match e.get("accessHeat") {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => deermem_pycompat::py::parse_float(s),
        _ => None,
    };
    let Some(heat) = heat.filter(|h| h.is_finite() && *h > 0.0) else {
        return 0.0;
    };
    let decayed = heat * decay(now.days_since(last), half_life);
    ((1.0 + decayed).ln() / 9f64.ln()).min(1.0)
}

fn score(
    fact: &Fact,
    usage: &FactUsageMap,
    now: Timestamp,
    p: &EvictionParams,
) -> (f64, Map<String, Value>) {
    let c = bounded_confidence(fact.confidence);
    let num = |x: f64| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number);
    let mut components = Map::new();
    components.insert("confidence".into(), num(c));
    match p.policy {
        EvictionPolicy::Confidence => (c, components),
        EvictionPolicy::HybridV1 => {
            let f = confirmation_freshness(fact, now, p.confirmation_half_life_days);
            let a = access_heat(usage.get(fact.id.as_str()), now, p.access_half_life_days);
            components.insert("confirmationFreshness".into(), num(f));
            components.insert("accessHeat".into(), num(a));
            (
                p.confidence_weight * c + p.confirmation_weight * f + p.access_weight * a,
                components,
            )
        }
    }
}

/// Selects which facts stay within `max_facts` (the reference's `select_facts_for_capacity`).
/// Pure: the input is not modified.
pub fn select_facts_for_capacity(
    facts: &[Fact],
    usage: &FactUsageMap,
    now: Timestamp,
    params: &EvictionParams,
) -> EvictionDecision {
    let scored: Vec<(f64, Map<String, Value>)> =
        facts.iter().map(|f| score(f, usage, now, params)).collect();
    let mut scores = HashMap::new();
    for (f, (s, _)) in facts.iter().zip(&scored) {
        scores.insert(f.id.as_str().to_owned(), *s);
    }
    if facts.len() <= params.max_facts {
        return EvictionDecision {
            kept: facts.to_vec(),
            evicted: Vec::new(),
            scores,
            policy: params.policy,
            reserved_correction_slots: 0,
        };
    }
    // Duplicate ids share the later score, as in the reference's dict.
    let score_of = |i: usize| scores[facts[i].id.as_str()];
    let mut ranked: Vec<usize> = (0..facts.len()).collect();
    ranked.sort_by(|&a, &b| score_of(b).total_cmp(&score_of(a)).then(a.cmp(&b)));

    let mut selected = vec![false; facts.len()];
    let mut count = 0usize;
    let mut reserved = 0usize;
    if params.policy == EvictionPolicy::HybridV1 && params.max_facts > 0 {
        let slots = params
            .correction_reserved_max
            .min((params.max_facts as f64 * params.correction_reserved_fraction).ceil() as usize);
        let corrections: Vec<usize> = ranked
            .iter()
            .copied()
            .filter(|&i| {
                facts[i]
                    .category
                    .as_deref()
                    .unwrap_or("")
                    .trim()
                    .to_lowercase()
                    == "correction"
            })
            .collect();
        reserved = slots.min(corrections.len()).min(params.max_facts);
        for &i in corrections.iter().take(reserved) {
            selected[i] = true;
            count += 1;
        }
    }
    for &i in &ranked {
        if count >= params.max_facts {
            break;
        }
        if !selected[i] {
            selected[i] = true;
            count += 1;
        }
    }
    let kept = ranked
        .iter()
        .filter(|&&i| selected[i])
        .map(|&i| facts[i].clone())
        .collect();
    let evicted = ranked
        .iter()
        .rev()
        .filter(|&&i| !selected[i])
        .map(|&i| EvictedFact {
            fact_id: facts[i].id.as_str().to_owned(),
            category: facts[i].category_or_default().to_owned(),
            score: score_of(i),
            components: scored[i].1.clone(),
        })
        .collect();
    EvictionDecision {
        kept,
        evicted,
        scores,
        policy: params.policy,
        reserved_correction_slots: reserved,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fact::{FactScope, NormalizeContext, normalize_fact};
    use crate::ids::FactId;

    fn fact(v: Value) -> Fact {
        let scope = FactScope {
            user_id: Some("u".into()),
            agent_name: Some("a".into()),
        };
        let now = Timestamp::parse_iso("2026-08-13T00:00:00Z").unwrap();
        let new_fact_id = || FactId::new("generated").unwrap();
        let ctx = NormalizeContext {
            scope: &scope,
            existing: None,
            now,
            new_id: &new_fact_id,
        };
        normalize_fact(&v.try_into().unwrap(), &ctx).unwrap()
    }

    fn worked_example() -> (Vec<Fact>, FactUsageMap, Timestamp) {
        let now = Timestamp::parse_iso("2026-08-13T00:00:00Z").unwrap();
        let facts = vec![
            fact(
                json!({"id": "always_kept", "content": "a", "confidence": 1.0, "lastConfirmedAt": "2026-08-13T00:00:00Z", "createdAt": "2026-01-01T00:00:00Z"}),
            ),
            fact(
                json!({"id": "recent_low", "content": "b", "confidence": 0.6, "category": "correction", "lastConfirmedAt": "2026-08-13T00:00:00Z", "createdAt": "2026-01-01T00:00:00Z"}),
            ),
            fact(
                json!({"id": "stale_high", "content": "c", "confidence": 0.9, "createdAt": "2025-01-01T00:00:00Z"}),
            ),
            fact(
                json!({"id": "common_loser", "content": "d", "confidence": 0.1, "category": "preference", "createdAt": "2025-01-01T00:00:00Z"}),
            ),
        ];
        let usage = json!({"recent_low": {"accessHeat": 3.0, "accessCount": 3, "lastAccessedAt": "2026-08-10T00:00:00Z"}});
        (facts, usage.as_object().unwrap().clone(), now)
    }

    #[test]
    fn hybrid_worked_example_matches_reference() {
        let (facts, usage, now) = worked_example();
        let d = select_facts_for_capacity(
            &facts,
            &usage,
            now,
            &EvictionParams::new(2, EvictionPolicy::HybridV1),
        );
        let kept: Vec<&str> = d.kept.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(kept, vec!["always_kept", "recent_low"]);
        assert_eq!(d.reserved_correction_slots, 1);
        assert!((d.scores["always_kept"] - 0.9).abs() < 1e-9);
        assert!((d.scores["recent_low"] - 0.7007).abs() < 1e-3);
        assert!((d.scores["stale_high"] - 0.5863).abs() < 1e-3);
        assert!((d.scores["common_loser"] - 0.0663).abs() < 1e-3);
        // Lowest score first.
        assert_eq!(d.evicted_ids(), vec!["common_loser", "stale_high"]);
        let heat = d
            .evicted
            .iter()
            .find(|e| e.fact_id == "stale_high")
            .unwrap();
        assert!(heat.components.contains_key("accessHeat"));
    }

    #[test]
    fn confidence_policy_keeps_most_confident() {
        let (facts, usage, now) = worked_example();
        let d = select_facts_for_capacity(
            &facts,
            &usage,
            now,
            &EvictionParams::new(2, EvictionPolicy::Confidence),
        );
        let kept: Vec<&str> = d.kept.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(kept, vec!["always_kept", "stale_high"]);
        assert_eq!(d.evicted_ids(), vec!["common_loser", "recent_low"]);
        assert_eq!(
            d.evicted[1].components,
            *json!({"confidence": 0.6}).as_object().unwrap()
        );
        assert_eq!(d.reserved_correction_slots, 0);
    }

    #[test]
    fn under_cap_keeps_input_order() {
        let (facts, usage, now) = worked_example();
        let d = select_facts_for_capacity(
            &facts,
            &usage,
            now,
            &EvictionParams::new(10, EvictionPolicy::HybridV1),
        );
        assert_eq!(d.kept, facts);
        assert!(d.evicted.is_empty());
    }

    #[test]
    fn access_heat_saturates_and_ignores_bad_entries() {
        let now = Timestamp::parse_iso("2026-08-13T00:00:00Z").unwrap();
        let e = json!({"accessHeat": 8.0, "lastAccessedAt": "2026-08-13T00:00:00Z"});
        assert!((access_heat(Some(&e), now, 30.0) - 1.0).abs() < 1e-12);
        for bad in [
            json!({"accessHeat": true, "lastAccessedAt": "2026-08-13T00:00:00Z"}),
            json!({"accessHeat": -1, "lastAccessedAt": "2026-08-13T00:00:00Z"}),
            json!({"accessHeat": 1}),
            json!("x"),
        ] {
            assert_eq!(access_heat(Some(&bad), now, 30.0), 0.0);
        }
    }
}
