//! Tests of the gates and lifecycle steps of `apply_update`: new facts, the scope gate and
//! contradiction removals, reinforcement and capacity, staleness, consolidation, and upload
//! mentions (the behaviours the reference's updater tests pin, ported as our own).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::DeerMemConfig;
use deermem_core::policy::eviction::{EvictionPolicy, FactUsageMap};
use deermem_core::{Fact, FactId, MemoryDocument, Timestamp};
use serde_json::{Value, json};

use super::*;
use crate::diff::change_set;
use crate::parse::{ProposedUpdate, normalize_update};
use crate::signals::{Signal, SignalSet};
use crate::staleness::{safe_add_days, select_stale_candidates};
use crate::testutil::{fact, scope, ts};
use deermem_pycompat::json::decode_str;

const NOW: &str = "2026-06-01T00:00:00Z";

fn now() -> Timestamp {
    ts(NOW)
}

fn days_ago(n: i64) -> String {
    safe_add_days(now(), -i128::from(n)).unwrap().to_iso_z()
}

fn counter_ids() -> FactIdSource {
    let n = Arc::new(AtomicU64::new(0));
    FactIdSource::from_fn(move || {
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        FactId::new(format!("fact_new{i:04}")).unwrap()
    })
}

fn doc(facts: Vec<Fact>) -> MemoryDocument {
    let mut d = MemoryDocument::empty(now());
    d.revision = 3;
    d.facts = facts.into();
    d
}

fn update(v: Value) -> ProposedUpdate {
    let mut obj = v.as_object().cloned().unwrap();
    for k in ["user", "history"] {
        obj.entry(k).or_insert(json!({}));
    }
    obj.entry("newFacts").or_insert(json!([]));
    let py = decode_str(&Value::Object(obj).to_string()).unwrap();
    normalize_update(py.as_object().unwrap()).unwrap()
}

struct Fx {
    cfg: DeerMemConfig,
    signals: SignalSet,
    usage: FactUsageMap,
    ids: FactIdSource,
    allowed: Option<BTreeSet<String>>,
    now: Timestamp,
}

impl Fx {
    fn new() -> Self {
        Self {
            cfg: DeerMemConfig::default(),
            signals: SignalSet::new(),
            usage: FactUsageMap::new(),
            ids: counter_ids(),
            allowed: None,
            now: now(),
        }
    }

    fn run(&self, d: &MemoryDocument, u: &ProposedUpdate) -> ApplyOutcome {
        let s = scope();
        let ctx = ApplyContext {
            config: &self.cfg,
            now: self.now,
            thread_id: "thread-1",
            turns: &[],
            signals: self.signals,
            scope: &s,
            usage: &self.usage,
            ids: &self.ids,
            consolidation_allowed: self.allowed.as_ref(),
        };
        apply_update(d, u, &ctx)
    }
}

fn labelled(content: &str, conf: f64) -> Value {
    json!({"content": content, "category": "preference", "confidence": conf,
           "scope": "user", "durability": "durable", "authority": "descriptive"})
}

fn contents(d: &MemoryDocument) -> Vec<&str> {
    d.facts.iter().map(|f| f.content.as_str()).collect()
}

fn ids(d: &MemoryDocument) -> Vec<&str> {
    d.facts.iter().map(|f| f.id.as_str()).collect()
}

fn f(id: &str, content: &str, conf: f64) -> Fact {
    fact(json!({"id": id, "content": content, "confidence": conf, "createdAt": days_ago(1)}))
}

// ---- new facts -------------------------------------------------------------------------

#[test]
fn duplicate_of_existing_content_is_not_added_and_removals_still_apply() {
    let d = doc(vec![
        f("fact_a", "User prefers tabs", 0.9),
        f("fact_b", "Uses Java", 0.8),
    ]);
    let u = update(json!({
        "newFacts": [labelled("  user prefers TABS ", 0.9)],
        "factsToRemove": [{"id": "fact_b", "scope": "user", "reason": "switched languages"}]
    }));
    let out = Fx::new().run(&d, &u);
    assert_eq!(ids(&out.document), vec!["fact_a"]);
    assert!(out.new_drafts.is_empty());
}

#[test]
fn whitespace_only_facts_are_never_stored() {
    let out = Fx::new().run(
        &doc(vec![]),
        &update(json!({"newFacts": [labelled("   ", 0.9)]})),
    );
    assert!(out.document.facts.is_empty());
}

#[test]
fn same_batch_duplicates_collapse_and_keep_source_metadata() {
    let u = update(
        json!({"newFacts": [labelled("Likes Rust", 0.9), labelled("likes rust ", 0.95), labelled("Likes Go", 0.8)]}),
    );
    let out = Fx::new().run(&doc(vec![]), &u);
    assert_eq!(contents(&out.document), vec!["Likes Rust", "Likes Go"]);
    for fact in &out.document.facts {
        assert!(fact.id.as_str().starts_with("fact_"));
        assert_eq!(fact.source.thread_id(), Some("thread-1"));
        assert_eq!(fact.source.kind(), "conversation");
    }
}

#[test]
fn threshold_and_max_facts_trim_in_ranked_order() {
    let mut fx = Fx::new();
    fx.cfg.max_facts = 2;
    let d = doc(vec![
        f("fact_py", "Uses Python", 0.95),
        f("fact_old", "Old tool", 0.5),
    ]);
    let u =
        update(json!({"newFacts": [labelled("Uses uv", 0.85), labelled("Maybe likes vim", 0.6)]}));
    let out = fx.run(&d, &u);
    assert_eq!(contents(&out.document), vec!["Uses Python", "Uses uv"]);
    assert_eq!(out.capacity.len(), 1);
    assert_eq!(out.capacity[0].decision.evicted_ids(), vec!["fact_old"]);
    assert_eq!(out.metrics.rejected_low_confidence, 1);
    let uv = &out.document.facts[1];
    assert_eq!(uv.source.thread_id(), Some("thread-1"));
}

#[test]
fn source_error_is_kept_only_when_non_blank() {
    let mut a = labelled("Use pnpm", 0.95);
    a["category"] = json!("correction");
    a["sourceError"] = json!("  Suggested npm  ");
    let mut b = labelled("Use uv", 0.95);
    b["category"] = json!("correction");
    b["sourceError"] = json!("   ");
    let out = Fx::new().run(&doc(vec![]), &update(json!({"newFacts": [a, b]})));
    assert_eq!(out.document.facts[0].source_error(), Some("Suggested npm"));
    assert_eq!(out.document.facts[1].source_error(), None);
    assert!(
        !out.new_drafts
            .values()
            .any(|d| d.extra("sourceError") == Some(&json!("   ")))
    );
}

#[test]
fn casefold_dedup_keeps_original_casing() {
    let d = doc(vec![f("fact_a", "User prefers Straße names", 0.9)]);
    let out = Fx::new().run(&d, &update(json!({"newFacts": [labelled("USER PREFERS STRASSE NAMES", 0.9), labelled("User prefers dark mode", 0.9)]})));
    assert_eq!(
        contents(&out.document),
        vec!["User prefers Straße names", "User prefers dark mode"]
    );
}

#[test]
fn expected_valid_days_are_capped_at_creation() {
    let mut fx = Fx::new();
    let mut a = labelled("A", 0.9);
    a["expected_valid_days"] = json!(180);
    let mut b = labelled("B", 0.9);
    b["expected_valid_days"] = json!(3650);
    let c = labelled("C", 0.9);
    let u = update(json!({"newFacts": [a, b, c]}));
    let out = fx.run(&doc(vec![]), &u);
    let evd = |i: usize| {
        out.document.facts[i]
            .extra
            .get("expected_valid_days")
            .cloned()
    };
    assert_eq!(evd(0), Some(json!(180)));
    assert_eq!(evd(1), Some(json!(1800)));
    assert_eq!(evd(2), None);
    fx.cfg.staleness_max_lifetime_multiplier = 3.0;
    let out = fx.run(&doc(vec![]), &u);
    assert_eq!(
        out.document.facts[1].extra.get("expected_valid_days"),
        Some(&json!(270))
    );
}

// ---- scope gate and contradiction removals --------------------------------------------------

#[test]
fn fact_gate_accepts_only_durable_descriptive_user_facts() {
    let mut missing = labelled("Missing label", 0.9);
    missing.as_object_mut().unwrap().remove("authority");
    let mut thread = labelled("Thread fact", 0.9);
    thread["scope"] = json!("thread");
    let mut temporary = labelled("Temporary fact", 0.9);
    temporary["durability"] = json!("temporary");
    let mut transactional = labelled("Transactional fact", 0.9);
    transactional["authority"] = json!("transactional");
    let u = update(
        json!({"newFacts": [labelled("Durable fact", 0.9), missing, thread, temporary, transactional]}),
    );
    let out = Fx::new().run(&doc(vec![]), &u);
    assert_eq!(contents(&out.document), vec!["Durable fact"]);
    let draft = out.new_drafts.values().next().unwrap();
    assert_eq!(
        draft.keys().collect::<Vec<_>>(),
        vec![
            "id",
            "content",
            "category",
            "confidence",
            "createdAt",
            "source"
        ]
    );
    let g = out.metrics.scope_gate_rejections;
    assert_eq!(
        g.facts,
        FactGateCounts {
            missing: 1,
            scope: 1,
            durability: 1,
            authority: 1
        }
    );
    assert_eq!(g.summaries, SummaryGateCounts::default());
    assert_eq!(g.removals, RemovalGateCounts::default());
    assert_eq!(g.consolidations, FactGateCounts::default());
    assert_eq!(out.metrics.rejected_by_scope_gate, 4);
    assert_eq!(out.metrics.facts_passed_scope_gate, 1);
    assert_eq!(out.metrics.facts_extracted, 5);
}

#[test]
fn summary_gate_requires_user_scope_and_descriptive_authority() {
    let mut d = doc(vec![]);
    d.user.0.insert(
        "personalContext".into(),
        json!({"summary": "old personal", "updatedAt": "x"}),
    );
    let u = update(json!({
        "user": {
            "workContext": {"summary": "Builds compilers", "shouldUpdate": true, "scope": "user", "authority": "descriptive", "extra": 1},
            "personalContext": {"summary": "Project detail", "shouldUpdate": true, "scope": "project", "authority": "descriptive"},
            "topOfMind": {"summary": "Fix bug 12", "shouldUpdate": true, "scope": "user", "authority": "transactional"}
        },
        "history": {"recentMonths": {"summary": "No authority", "shouldUpdate": true, "scope": "user"}}
    }));
    let out = Fx::new().run(&d, &u);
    assert_eq!(
        out.document.user.0["workContext"],
        json!({"summary": "Builds compilers", "updatedAt": NOW})
    );
    assert_eq!(
        out.document.user.0["personalContext"]["summary"],
        "old personal"
    );
    assert_eq!(out.document.user.entry("topOfMind").summary, "");
    assert_eq!(out.document.history.entry("recentMonths").summary, "");
    assert_eq!(
        out.metrics.scope_gate_rejections.summaries,
        SummaryGateCounts {
            missing: 1,
            scope: 1,
            authority: 1
        }
    );
}

#[test]
fn removals_need_user_scope_and_a_reason() {
    let d = doc(vec![f("fact_api", "API uses REST", 0.9)]);
    for removal in [
        json!({"id": "fact_api", "scope": "thread", "reason": "task"}),
        json!({"id": "fact_api", "scope": "user"}),
        json!("fact_api"),
    ] {
        let out = Fx::new().run(&d, &update(json!({"factsToRemove": [removal.clone()]})));
        assert_eq!(ids(&out.document), vec!["fact_api"], "{removal}");
        let r = out.metrics.scope_gate_rejections.removals;
        assert_eq!(r.missing + r.scope, 1, "{removal}");
    }
    let out = Fx::new().run(&d, &update(json!({"factsToRemove": ["fact_api"]})));
    assert_eq!(out.metrics.scope_gate_rejections.removals.missing, 1);
}

fn paired(replacement: Value) -> ProposedUpdate {
    update(json!({
        "newFacts": [replacement],
        "factsToRemove": [{"id": "fact_old", "scope": "user", "reason": "replaced", "replacementFactIndex": 0}]
    }))
}

#[test]
fn paired_removal_is_skipped_when_the_replacement_fails_the_scope_gate() {
    let d = doc(vec![f("fact_old", "Uses npm", 0.9)]);
    let mut r = labelled("Uses pnpm", 0.9);
    r["scope"] = json!("thread");
    r["durability"] = json!("temporary");
    let out = Fx::new().run(&d, &paired(r));
    assert_eq!(ids(&out.document), vec!["fact_old"]);
    assert_eq!(out.metrics.scope_gate_rejections.removals.replacement, 1);
}

#[test]
fn paired_removal_is_skipped_when_the_replacement_is_below_threshold() {
    let d = doc(vec![f("fact_old", "Uses npm", 0.9)]);
    let out = Fx::new().run(&d, &paired(labelled("Uses pnpm", 0.69)));
    assert_eq!(ids(&out.document), vec!["fact_old"]);
    assert_eq!(out.metrics.facts_passed_scope_gate, 1);
    assert_eq!(out.metrics.rejected_low_confidence, 1);
    assert_eq!(out.metrics.scope_gate_rejections.removals.replacement, 1);
}

#[test]
fn paired_removal_is_atomic_with_its_replacement() {
    let d = doc(vec![f("fact_old", "Uses npm", 0.9)]);
    let out = Fx::new().run(&d, &paired(labelled("Uses pnpm", 0.9)));
    assert_eq!(contents(&out.document), vec!["Uses pnpm"]);
    let cs = change_set(&d, &out);
    assert_eq!(cs.deletes, vec![FactId::new("fact_old").unwrap()]);
    assert_eq!(
        cs.delete_revisions.unwrap()[&FactId::new("fact_old").unwrap()],
        1
    );
    assert_eq!(cs.upserts.len(), 1);
    assert_eq!(
        cs.upsert_revisions.unwrap().values().collect::<Vec<_>>(),
        vec![&None]
    );
}

#[test]
fn paired_removal_is_skipped_when_the_replacement_is_trimmed() {
    let mut fx = Fx::new();
    fx.cfg.max_facts = 1;
    let d = doc(vec![f("fact_old", "Uses npm", 0.9)]);
    let out = fx.run(&d, &paired(labelled("Uses pnpm", 0.8)));
    assert_eq!(ids(&out.document), vec!["fact_old"]);
    assert_eq!(out.metrics.scope_gate_rejections.removals.replacement, 1);
}

#[test]
fn replacement_deduplicated_against_another_fact_still_allows_removal() {
    let d = doc(vec![
        f("fact_old", "Uses npm", 0.9),
        f("fact_other", "Uses pnpm", 0.9),
    ]);
    let out = Fx::new().run(&d, &paired(labelled("uses PNPM", 0.9)));
    assert_eq!(ids(&out.document), vec!["fact_other"]);
}

#[test]
fn missing_classification_rejects_one_fact_without_aborting_others() {
    let d = doc(vec![f("fact_old", "Uses npm", 0.9)]);
    let u = update(json!({
        "newFacts": [{"content": "Uses pnpm", "confidence": 0.9}, labelled("Likes tea", 0.9)],
        "factsToRemove": [{"id": "fact_old", "scope": "user", "reason": "replaced", "replacementFactIndex": 0}]
    }));
    let out = Fx::new().run(&d, &u);
    assert_eq!(contents(&out.document), vec!["Uses npm", "Likes tea"]);
    assert_eq!(out.metrics.scope_gate_rejections.facts.missing, 1);
}

#[test]
fn invalid_replacement_index_fails_closed() {
    let d = doc(vec![f("fact_old", "Uses npm", 0.9)]);
    for idx in [json!(null), json!(0.0), json!(true), json!(-1), json!(7)] {
        let u = update(json!({
            "newFacts": [labelled("Uses pnpm", 0.9)],
            "factsToRemove": [{"id": "fact_old", "scope": "user", "reason": "replaced", "replacementFactIndex": idx}]
        }));
        let out = Fx::new().run(&d, &u);
        assert!(ids(&out.document).contains(&"fact_old"), "{idx}");
        assert_eq!(
            out.metrics.scope_gate_rejections.removals.replacement, 1,
            "{idx}"
        );
    }
}

#[test]
fn scope_gate_warning_fires_above_sixty_percent() {
    let u = update(
        json!({"newFacts": [{"content": "a", "confidence": 0.9}, {"content": "b", "confidence": 0.9}]}),
    );
    let out = Fx::new().run(&doc(vec![]), &u);
    let w = out.metrics.warnings();
    assert!(
        w.iter()
            .any(|m| m.contains("scope-gate rejection rate 100% exceeds 60%")),
        "{w:?}"
    );
    let low =
        update(json!({"newFacts": [labelled("a", 0.1), labelled("b", 0.1), labelled("c", 0.9)]}));
    let w = Fx::new().run(&doc(vec![]), &low).metrics.warnings();
    assert!(
        w.iter()
            .any(|m| m.contains("rejection rate 67% exceeds 60%")),
        "{w:?}"
    );
    assert!(
        Fx::new()
            .run(&doc(vec![]), &update(json!({})))
            .metrics
            .warnings()
            .is_empty()
    );
}

// ---- reinforcement and capacity ---------------------------------------------------------

fn reinforce_update() -> ProposedUpdate {
    update(json!({"factsToReinforce": [
        {"id": "fact_a", "scope": "user", "reason": "user confirmed"},
        {"id": "fact_b", "scope": "thread", "reason": "task only"},
        {"id": "fact_c", "scope": "user"}
    ]}))
}

fn reinforce_doc() -> MemoryDocument {
    doc(vec![
        f("fact_a", "A", 0.9),
        f("fact_b", "B", 0.9),
        f("fact_c", "C", 0.9),
    ])
}

#[test]
fn reinforcement_needs_the_signal_and_tracked_metadata() {
    let mut fx = Fx::new();
    fx.cfg.fact_eviction_policy = EvictionPolicy::HybridV1;
    fx.signals = [Signal::Reinforcement].into_iter().collect();
    let out = fx.run(&reinforce_doc(), &reinforce_update());
    let a = out.document.fact("fact_a").unwrap();
    assert_eq!(a.last_confirmed_at, Some(Some(NOW.to_owned())));
    assert!(NOW.ends_with('Z'));
    assert_eq!(a.confirmation_count, Some(Some(1)));
    assert_eq!(
        out.document.fact("fact_b").unwrap().confirmation_count,
        None
    );
    assert_eq!(
        out.document.fact("fact_c").unwrap().confirmation_count,
        None
    );
    assert_eq!(out.report.reinforced, vec!["fact_a"]);

    fx.signals = SignalSet::new();
    let out = fx.run(&reinforce_doc(), &reinforce_update());
    assert_eq!(
        out.document.fact("fact_a").unwrap().confirmation_count,
        None
    );

    let mut fx = Fx::new();
    fx.signals = [Signal::Reinforcement].into_iter().collect();
    let out = fx.run(&reinforce_doc(), &reinforce_update());
    assert_eq!(
        out.document.fact("fact_a").unwrap().confirmation_count,
        None,
        "confidence policy"
    );
    fx.cfg.fact_eviction_shadow_enabled = true;
    let out = fx.run(&reinforce_doc(), &reinforce_update());
    assert_eq!(
        out.document.fact("fact_a").unwrap().confirmation_count,
        Some(Some(1)),
        "shadow mode"
    );
}

#[test]
fn prior_confirmation_counts_are_incremented() {
    let mut fx = Fx::new();
    fx.cfg.fact_eviction_policy = EvictionPolicy::HybridV1;
    fx.signals = [Signal::Reinforcement].into_iter().collect();
    for (prior, expected) in [(json!(3), 4), (json!(null), 1), (json!(1), 2)] {
        let d = doc(vec![fact(
            json!({"id": "fact_a", "content": "A", "confirmationCount": prior}),
        )]);
        let out = fx.run(&d, &reinforce_update());
        assert_eq!(
            out.document.facts[0].confirmation_count,
            Some(Some(expected))
        );
    }
}

#[test]
fn hybrid_capacity_keeps_a_recently_confirmed_fact_over_a_stale_confident_one() {
    let mut fx = Fx::new();
    fx.cfg.max_facts = 1;
    fx.cfg.fact_eviction_policy = EvictionPolicy::HybridV1;
    let d = doc(vec![
        fact(
            json!({"id": "fact_stale", "content": "Stale", "confidence": 0.9, "createdAt": days_ago(400)}),
        ),
        fact(
            json!({"id": "fact_fresh", "content": "Fresh", "confidence": 0.7, "createdAt": days_ago(400), "lastConfirmedAt": NOW}),
        ),
    ]);
    let out = fx.run(&d, &update(json!({})));
    assert_eq!(ids(&out.document), vec!["fact_fresh"]);
    assert_eq!(out.capacity[0].decision.policy, EvictionPolicy::HybridV1);
    assert!(out.capacity[0].shadow.is_none());
    fx.cfg.fact_eviction_policy = EvictionPolicy::Confidence;
    fx.cfg.fact_eviction_shadow_enabled = true;
    let out = fx.run(&d, &update(json!({})));
    assert_eq!(ids(&out.document), vec!["fact_stale"]);
    assert_eq!(
        out.capacity[0].shadow.as_ref().unwrap().evicted_ids(),
        vec!["fact_stale"]
    );
}

// ---- staleness at apply time ------------------------------------------------------------

fn aged(id: &str, conf: f64, days: i64) -> Fact {
    fact(
        json!({"id": id, "content": format!("content {id}"), "confidence": conf, "createdAt": days_ago(days)}),
    )
}

fn stale_remove(ids: &[&str]) -> ProposedUpdate {
    update(
        json!({"staleFactsToRemove": ids.iter().map(|i| json!({"id": i, "reason": "outdated"})).collect::<Vec<_>>()}),
    )
}

#[test]
fn proposed_stale_candidates_are_removed() {
    let d = doc(vec![aged("a", 0.5, 100), aged("b", 0.5, 100)]);
    let out = Fx::new().run(&d, &stale_remove(&["a"]));
    assert_eq!(ids(&out.document), vec!["b"]);
    assert_eq!(out.report.stale_removed, vec!["a"]);
    assert_eq!(
        ids(&Fx::new().run(&d, &stale_remove(&[])).document),
        vec!["a", "b"]
    );
    assert_eq!(
        ids(&Fx::new().run(&d, &update(json!({}))).document),
        vec!["a", "b"]
    );
}

#[test]
fn removal_cap_takes_the_lowest_confidence_first() {
    let mut fx = Fx::new();
    fx.cfg.staleness_max_removals_per_cycle = 2;
    let d = doc(vec![
        aged("a", 0.9, 100),
        aged("b", 0.3, 100),
        aged("c", 0.8, 100),
        aged("d", 0.1, 100),
        aged("e", 0.5, 100),
    ]);
    let out = fx.run(&d, &stale_remove(&["a", "b", "c", "d", "e"]));
    assert_eq!(ids(&out.document), vec!["a", "c", "e"]);
}

#[test]
fn missing_confidence_counts_as_half_in_the_cap() {
    let mut fx = Fx::new();
    fx.cfg.staleness_max_removals_per_cycle = 1;
    let d = doc(vec![
        fact(json!({"id": "n", "content": "no conf", "createdAt": days_ago(100)})),
        aged("low", 0.2, 100),
        aged("high", 0.9, 100),
    ]);
    let out = fx.run(&d, &stale_remove(&["n", "low", "high"]));
    assert_eq!(ids(&out.document), vec!["n", "high"]);
}

#[test]
fn contradiction_and_staleness_removals_combine() {
    let d = doc(vec![
        aged("old", 0.5, 100),
        f("fact_x", "X", 0.9),
        f("fact_y", "Y", 0.9),
    ]);
    let u = update(json!({
        "staleFactsToRemove": [{"id": "old", "reason": "stale"}],
        "factsToRemove": [{"id": "fact_x", "scope": "user", "reason": "contradicted"}]
    }));
    assert_eq!(ids(&Fx::new().run(&d, &u).document), vec!["fact_y"]);
}

#[test]
fn protected_and_fresh_facts_are_refused_even_with_review_disabled() {
    let mut fx = Fx::new();
    fx.cfg.staleness_review_enabled = false;
    let d = doc(vec![
        fact(
            json!({"id": "corr", "content": "c", "category": "correction", "createdAt": days_ago(400)}),
        ),
        aged("fresh", 0.5, 5),
        aged("old", 0.5, 100),
    ]);
    let out = fx.run(&d, &stale_remove(&["corr", "fresh", "old"]));
    assert_eq!(ids(&out.document), vec!["corr", "fresh"]);
}

fn extend(entries: Value) -> ProposedUpdate {
    update(json!({"staleFactsToExtend": entries}))
}

fn evd(out: &ApplyOutcome, id: &str) -> Option<Value> {
    out.document
        .fact(id)?
        .extra
        .get("expected_valid_days")
        .cloned()
}

#[test]
fn extensions_set_a_window_measured_from_the_review_reference() {
    let d = doc(vec![aged("a", 0.5, 100)]);
    let out = Fx::new().run(&d, &extend(json!([{"id": "a", "extend_by_days": 365}])));
    assert_eq!(evd(&out, "a"), Some(json!(465)));
    let mut fx = Fx::new();
    fx.cfg.staleness_max_lifetime_multiplier = 3.0;
    fx.cfg.staleness_max_extension_days = 36_500;
    let out = fx.run(&d, &extend(json!([{"id": "a", "extend_by_days": 9999}])));
    assert_eq!(
        evd(&out, "a"),
        Some(json!(10_099)),
        "not capped by the creation multiplier"
    );
    let out = Fx::new().run(&d, &extend(json!([{"id": "a", "extend_by_days": 9999}])));
    assert_eq!(evd(&out, "a"), Some(json!(3650)));
}

#[test]
fn huge_extensions_are_capped_and_do_not_break_the_next_cycle() {
    let d = doc(vec![aged("a", 0.5, 100)]);
    let fx = Fx::new();
    let out = fx.run(
        &d,
        &extend(json!([{"id": "a", "extend_by_days": 1_000_000_000u64}])),
    );
    assert_eq!(evd(&out, "a"), Some(json!(3650)));
    assert!(select_stale_candidates(&out.document.facts, &fx.cfg, now()).is_empty());
}

#[test]
fn only_unproposed_candidates_can_be_extended() {
    let mut fx = Fx::new();
    fx.cfg.staleness_max_removals_per_cycle = 1;
    let d = doc(vec![
        aged("low", 0.1, 100),
        aged("high", 0.9, 100),
        aged("other", 0.5, 100),
        aged("fresh", 0.5, 3),
    ]);
    let u = update(json!({
        "staleFactsToRemove": [{"id": "low"}, {"id": "high"}],
        "staleFactsToExtend": [{"id": "low", "extend_by_days": 30}, {"id": "high", "extend_by_days": 30},
                               {"id": "other", "extend_by_days": 30}, {"id": "fresh", "extend_by_days": 30},
                               {"id": "other", "extend_by_days": 0.9}]
    }));
    let out = fx.run(&d, &u);
    assert_eq!(ids(&out.document), vec!["high", "other", "fresh"]);
    assert_eq!(
        evd(&out, "high"),
        None,
        "spared by the cap but not extendable"
    );
    assert_eq!(evd(&out, "other"), Some(json!(130)));
    assert_eq!(evd(&out, "fresh"), None);
    let out = Fx::new().run(&d, &extend(json!([])));
    assert_eq!(evd(&out, "other"), None);
}

#[test]
fn extension_of_a_confirmed_fact_counts_from_its_confirmation() {
    let d = doc(vec![fact(
        json!({"id": "a", "content": "a", "createdAt": days_ago(500), "lastConfirmedAt": days_ago(100)}),
    )]);
    let out = Fx::new().run(&d, &extend(json!([{"id": "a", "extend_by_days": 30}])));
    assert_eq!(evd(&out, "a"), Some(json!(130)));
}

#[test]
fn reinforced_facts_are_fresh_so_not_reviewed_in_the_same_cycle() {
    let mut fx = Fx::new();
    fx.cfg.fact_eviction_policy = EvictionPolicy::HybridV1;
    fx.signals = [Signal::Reinforcement].into_iter().collect();
    let d = doc(vec![aged("a", 0.5, 100)]);
    let u = update(json!({
        "factsToReinforce": [{"id": "a", "scope": "user", "reason": "confirmed"}],
        "staleFactsToRemove": [{"id": "a"}]
    }));
    assert_eq!(ids(&fx.run(&d, &u).document), vec!["a"]);
}

// ---- consolidation -----------------------------------------------------------------------

fn group(cat: &str, n: usize, prefix: &str, conf: f64, days: i64) -> Vec<Fact> {
    (0..n)
        .map(|i| {
            fact(
                json!({"id": format!("{prefix}{i}"), "content": format!("{cat} detail {i}"),
                        "category": cat, "confidence": conf, "createdAt": days_ago(days)}),
            )
        })
        .collect()
}

fn consolidation_fx() -> Fx {
    let mut fx = Fx::new();
    fx.cfg.consolidation_enabled = true;
    fx.cfg.consolidation_min_facts = 3;
    fx
}

fn merge(ids: &[&str], content: &str) -> Value {
    json!({"sourceIds": ids, "consolidated": {"content": content, "category": "preference", "confidence": 0.9,
           "scope": "user", "durability": "durable", "authority": "descriptive"}})
}

#[test]
fn consolidation_replaces_sources_with_the_merged_fact() {
    let fx = consolidation_fx();
    let d = doc(group("preference", 3, "p", 0.9, 10));
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [merge(&["p2", "p0", "p1"], "Merged prefs")]})),
    );
    assert_eq!(out.document.facts.len(), 1);
    let m = &out.document.facts[0];
    assert_eq!(m.content, "Merged prefs");
    assert_eq!(m.source.kind(), "consolidation");
    assert_eq!(m.consolidated_from, vec!["p2", "p0", "p1"]);
    assert_eq!(m.consolidated_at(), Some(NOW));
    assert_eq!(m.confidence, 0.9);
    let cs = change_set(&d, &out);
    assert_eq!(cs.deletes.len(), 3);
    assert_eq!(cs.upserts.len(), 1);
}

#[test]
fn consolidation_guardrails() {
    let mut fx = consolidation_fx();
    fx.cfg.consolidation_max_groups_per_cycle = 2;
    fx.cfg.consolidation_max_sources = 5;
    let mut facts = group("preference", 3, "p", 0.9, 10);
    facts.extend(group("goal", 3, "g", 0.9, 10));
    facts.extend(group("behavior", 10, "b", 0.9, 10));
    let d = doc(facts);
    // Group cap: only the first two merges happen.
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [
        merge(&["p0", "p1"], "P"), merge(&["g0", "g1"], "G"), merge(&["b0", "b1"], "B")]})),
    );
    assert_eq!(out.report.consolidated.len(), 2);
    // Hallucinated ids, too many sources, double consumption.
    let b10: Vec<String> = (0..10).map(|i| format!("b{i}")).collect();
    let b10: Vec<&str> = b10.iter().map(String::as_str).collect();
    let out = fx.run(&d, &update(json!({"factsToConsolidate": [
        merge(&["p0", "nope"], "X"), merge(&b10, "Y"), merge(&["g0", "g1"], "G"), merge(&["g1", "g2"], "G2")]})));
    assert_eq!(out.report.consolidated.len(), 1);
    assert_eq!(out.report.consolidated[0].1, vec!["g0", "g1"]);
}

#[test]
fn protected_categories_and_disabled_flag_refuse_merges() {
    let mut fx = consolidation_fx();
    let d = doc(group("correction", 3, "c", 0.9, 10));
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [merge(&["c0", "c1"], "C")]})),
    );
    assert!(out.report.consolidated.is_empty());
    fx.cfg.consolidation_enabled = false;
    let d = doc(group("preference", 3, "p", 0.9, 10));
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [merge(&["p0", "p1"], "P")]})),
    );
    assert!(out.report.consolidated.is_empty());
    assert!(!DeerMemConfig::default().consolidation_enabled);
}

#[test]
fn consolidation_only_consumes_facts_shown_in_the_prompt() {
    let mut fx = consolidation_fx();
    fx.allowed = Some(["p0".to_owned(), "p1".to_owned()].into_iter().collect());
    let d = doc(group("preference", 3, "p", 0.9, 10));
    let out = fx.run(
        &d,
        &update(
            json!({"factsToConsolidate": [merge(&["p1", "p2"], "X"), merge(&["p0", "p1"], "Y")]}),
        ),
    );
    assert_eq!(out.report.consolidated.len(), 1);
    assert_eq!(out.report.consolidated[0].1, vec!["p0", "p1"]);
}

#[test]
fn unlabelled_consolidation_keeps_its_sources() {
    let fx = consolidation_fx();
    let d = doc(group("preference", 3, "p", 0.9, 10));
    let out = fx.run(&d, &update(json!({"factsToConsolidate": [{"sourceIds": ["p0", "p1"], "consolidated": {"content": "X"}}]})));
    assert_eq!(out.document.facts.len(), 3);
    assert_eq!(out.metrics.scope_gate_rejections.consolidations.missing, 1);
    assert_eq!(out.metrics.rejected_by_scope_gate, 1);
}

#[test]
fn consolidation_runs_after_the_trim() {
    let mut fx = consolidation_fx();
    fx.cfg.max_facts = 3;
    let mut facts = group("preference", 3, "p", 0.5, 10);
    facts.push(fact(json!({"id": "high_keep", "content": "keep", "category": "preference", "confidence": 0.95, "createdAt": days_ago(10)})));
    let d = doc(facts);
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [merge(&["p0", "p1"], "merged")]})),
    );
    assert!(
        out.report.consolidated.is_empty(),
        "a trimmed source refuses the merge"
    );
    assert_eq!(out.document.facts.len(), 3);
    assert!(ids(&out.document).contains(&"high_keep"));
}

#[test]
fn merged_fact_carries_source_errors_and_capped_confidence() {
    let fx = consolidation_fx();
    let mut facts = group("preference", 3, "p", 0.75, 10);
    facts[0].set_extra("sourceError", Some(json!("used npm")));
    facts[1].set_extra("sourceError", Some(json!("used npm")));
    facts[2].set_extra("sourceError", Some(json!("used yarn")));
    let d = doc(facts);
    let mut m = merge(&["p0", "p1", "p2"], "Merged");
    m["consolidated"]["confidence"] = json!(1.0);
    let out = fx.run(&d, &update(json!({"factsToConsolidate": [m]})));
    let merged = &out.document.facts[0];
    assert_eq!(merged.confidence, 0.75);
    assert_eq!(merged.source_error(), Some("used npm\nused yarn"));
    let d = doc(group("preference", 3, "p", 0.65, 10));
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [merge(&["p0", "p1"], "Merged")]})),
    );
    assert!(
        out.report.consolidated.is_empty(),
        "sources below the threshold"
    );
}

#[test]
fn missing_model_confidence_defaults_to_point_nine_capped_by_sources() {
    let fx = consolidation_fx();
    let d = doc(group("preference", 3, "p", 0.85, 10));
    let mut m = merge(&["p0", "p1"], "Merged");
    m["consolidated"]
        .as_object_mut()
        .unwrap()
        .remove("confidence");
    let out = fx.run(&d, &update(json!({"factsToConsolidate": [m]})));
    assert_eq!(out.document.facts.last().unwrap().confidence, 0.85);
    let d = doc(group("preference", 3, "p", 0.95, 10));
    let mut m = merge(&["p0", "p1"], "Merged");
    m["consolidated"]
        .as_object_mut()
        .unwrap()
        .remove("confidence");
    let out = fx.run(&d, &update(json!({"factsToConsolidate": [m]})));
    assert_eq!(out.document.facts.last().unwrap().confidence, 0.9);
}

fn src(id: &str, created: &str, evd: Option<Value>) -> Fact {
    let mut v = json!({"id": id, "content": format!("c {id}"), "category": "preference", "confidence": 0.9, "createdAt": created});
    if let Some(e) = evd {
        v["expected_valid_days"] = e;
    }
    fact(v)
}

/// A third fact of the category, so that two sources form a candidate group.
fn filler() -> Fact {
    src("z_filler", NOW, None)
}

fn merged_evd(fx: &Fx, sources: Vec<Fact>) -> (String, Value) {
    let ids: Vec<String> = sources.iter().map(|f| f.id.as_str().to_owned()).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut sources = sources;
    sources.push(filler());
    let d = doc(sources);
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [merge(&ids, "Merged")]})),
    );
    let m = out
        .document
        .facts
        .iter()
        .find(|f| f.content == "Merged")
        .unwrap();
    (m.created_at.clone(), m.extra["expected_valid_days"].clone())
}

#[test]
fn merged_created_at_and_review_window() {
    let fx = consolidation_fx();
    let (created, e) = merged_evd(
        &fx,
        vec![
            src("a", &days_ago(30), Some(json!(365))),
            src("b", &days_ago(10), Some(json!(730))),
            src("c", &days_ago(20), None),
        ],
    );
    assert_eq!(created, days_ago(10), "newest source");
    // Deadlines: a at -30+365=335, b at -10+730, c at -20+90=70 → 70 - (-10) = 80.
    assert_eq!(e, json!(80));
    let (_, e) = merged_evd(
        &fx,
        vec![
            src("a", &days_ago(10), Some(json!(365))),
            src("b", &days_ago(10), Some(json!(730))),
        ],
    );
    assert_eq!(e, json!(365));
    let (_, e) = merged_evd(
        &fx,
        vec![
            src("a", &days_ago(10), Some(json!(3650))),
            src("b", &days_ago(10), Some(json!(3650))),
        ],
    );
    assert_eq!(e, json!(1800), "capped by the creation multiplier");
    let (_, e) = merged_evd(
        &fx,
        vec![src("a", &days_ago(10), None), src("b", &days_ago(10), None)],
    );
    assert_eq!(e, json!(90), "legacy sources use the global window");
    let (_, e) = merged_evd(
        &fx,
        vec![
            src("a", &days_ago(10), None),
            src("b", &days_ago(10), Some(json!(3650))),
        ],
    );
    assert_eq!(
        e,
        json!(90),
        "a legacy source is not swallowed by a stable sibling"
    );
    let (_, e) = merged_evd(
        &fx,
        vec![
            src("a", &days_ago(200), None),
            src("b", &days_ago(10), Some(json!(3650))),
        ],
    );
    assert_eq!(e, json!(1), "overdue source clamps to one day");
    let (_, e) = merged_evd(
        &fx,
        vec![
            src("a", &days_ago(3), Some(json!(7))),
            src("b", &days_ago(3), Some(json!(3650))),
        ],
    );
    assert_eq!(e, json!(7), "a volatile source governs");
    let (_, e) = merged_evd(
        &fx,
        vec![
            src("a", &days_ago(10), Some(json!(365.7))),
            src("b", &days_ago(10), Some(json!(180.2))),
        ],
    );
    assert_eq!(e, json!(180));
    for bad in [
        json!(null),
        json!("x"),
        json!(true),
        json!(1e12),
        json!(1_000_000_000u64),
        json!(u64::MAX),
    ] {
        let (_, e) = merged_evd(
            &fx,
            vec![
                src("a", &days_ago(10), Some(bad.clone())),
                src("b", &days_ago(10), Some(json!(3650))),
            ],
        );
        assert_eq!(e, json!(90), "{bad}");
    }
}

#[test]
fn merged_created_at_is_utc_whatever_the_source_offset() {
    let fx = consolidation_fx();
    let (created, _) = merged_evd(
        &fx,
        vec![
            src("a", "2026-05-01T08:00:00+08:00", None),
            src("b", "2026-04-01T00:00:00Z", None),
        ],
    );
    assert_eq!(created, "2026-05-01T00:00:00Z");
}

#[test]
fn a_merge_of_stable_sources_is_not_stale_next_cycle_but_a_volatile_one_is() {
    let fx = consolidation_fx();
    let sources = vec![
        src("a", &days_ago(200), Some(json!(3650))),
        src("b", &days_ago(200), Some(json!(3650))),
    ];
    let (_, e) = merged_evd(&fx, sources.clone());
    assert_eq!(e, json!(1800));
    let d = doc(vec![sources[0].clone(), sources[1].clone(), filler()]);
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [merge(&["a", "b"], "Merged")]})),
    );
    assert!(select_stale_candidates(&out.document.facts, &fx.cfg, now()).is_empty());
    let d = doc(vec![
        src("a", &days_ago(10), Some(json!(7))),
        src("b", &days_ago(10), Some(json!(7))),
        filler(),
    ]);
    let out = fx.run(
        &d,
        &update(json!({"factsToConsolidate": [merge(&["a", "b"], "Merged")]})),
    );
    assert_eq!(
        select_stale_candidates(&out.document.facts, &fx.cfg, now()).len(),
        1
    );
}

#[test]
fn consolidation_combines_with_staleness_and_contradiction() {
    let fx = consolidation_fx();
    let mut facts = group("preference", 3, "p", 0.9, 10);
    facts.push(aged("old", 0.5, 100));
    facts.push(f("fact_x", "X", 0.9));
    let d = doc(facts);
    let u = update(json!({
        "staleFactsToRemove": [{"id": "old"}],
        "factsToRemove": [{"id": "fact_x", "scope": "user", "reason": "contradicted"}],
        "factsToConsolidate": [merge(&["p0", "p1", "p2"], "Merged")]
    }));
    let out = fx.run(&d, &u);
    assert_eq!(contents(&out.document), vec!["Merged"]);
}

// ---- upload mentions ----------------------------------------------------------------------

#[test]
fn upload_mentions_are_stripped_from_memory() {
    let mut d = doc(vec![
        f("fact_up", "User uploaded a CSV file with sales data", 0.9),
        f("fact_ok", "User works with CSV files", 0.9),
    ]);
    d.user.0.insert("workContext".into(), json!({"summary": "Data analyst. Uploaded  a file for review. Likes SQL.", "updatedAt": "t"}));
    d.user.0.insert(
        "topOfMind".into(),
        json!({"summary": 12345, "updatedAt": "t"}),
    );
    let out = Fx::new().run(&d, &update(json!({})));
    assert_eq!(ids(&out.document), vec!["fact_ok"]);
    assert_eq!(
        out.document.user.0["workContext"]["summary"],
        "Data analyst. Likes SQL."
    );
    assert_eq!(out.document.user.0["topOfMind"]["summary"], 12345);
    assert_eq!(out.report.upload_removed, vec!["fact_up"]);
    let empty = doc(vec![]);
    let out = Fx::new().run(&empty, &update(json!({})));
    assert!(crate::diff::is_noop(&change_set(&empty, &out)));
}

#[test]
fn new_upload_facts_are_not_written() {
    let u = update(
        json!({"newFacts": [labelled("User uploaded a PDF document", 0.9), labelled("Likes SQL", 0.9)]}),
    );
    let out = Fx::new().run(&doc(vec![]), &u);
    assert_eq!(contents(&out.document), vec!["Likes SQL"]);
    assert_eq!(out.new_drafts.len(), 1);
}

#[test]
fn knowledge_category_is_kept_as_an_extension() {
    let mut v = labelled("Rust has no GC", 0.9);
    v["category"] = json!("knowledge");
    let out = Fx::new().run(&doc(vec![]), &update(json!({"newFacts": [v]})));
    let fct = &out.document.facts[0];
    assert_eq!(fct.category.as_deref(), Some("other"));
    assert_eq!(crate::facts::display_category(fct), "knowledge");
}

#[test]
fn unchanged_memory_yields_an_empty_change_set() {
    let d = doc(vec![f("fact_a", "A", 0.9)]);
    let out = Fx::new().run(&d, &update(json!({"newFacts": [labelled("a", 0.9)]})));
    assert!(crate::diff::is_noop(&change_set(&d, &out)));
}

#[test]
fn changed_facts_carry_their_stored_revision() {
    let d = doc(vec![fact(
        json!({"id": "a", "content": "a", "createdAt": days_ago(100), "revision": 4}),
    )]);
    let out = Fx::new().run(&d, &extend(json!([{"id": "a", "extend_by_days": 10}])));
    let cs = change_set(&d, &out);
    assert_eq!(cs.upserts.len(), 1);
    assert_eq!(cs.upserts[0].revision(), Some(4));
    assert_eq!(
        cs.upsert_revisions.unwrap()[&FactId::new("a").unwrap()],
        Some(4)
    );
    assert!(cs.summaries.is_none());
}

#[test]
fn capacity_keeps_the_policy_order_and_the_facts_it_kept() {
    let mut fx = Fx::new();
    fx.cfg.max_facts = 3;
    let d = doc(vec![
        f("fact_a", "Uses Python", 0.7),
        f("fact_b", "Old tool", 0.5),
        f("fact_c", "Likes tea", 0.95),
        f("fact_d", "Writes Rust", 0.8),
    ]);
    let u = update(json!({"newFacts": [labelled("Uses uv", 0.9)]}));
    let out = fx.run(&d, &u);
    let kept = &out.capacity[0].decision.kept;
    // The document holds exactly the facts the policy kept, in its ranked order.
    assert_eq!(&out.document.facts, kept);
    assert_eq!(
        contents(&out.document),
        vec!["Likes tea", "Uses uv", "Writes Rust"]
    );
    assert_eq!(out.report.evicted, vec!["fact_b", "fact_a"]);
}

#[test]
fn moving_kept_facts_falls_back_to_the_copies_on_duplicate_or_unknown_ids() {
    let a = f("fact_a", "One", 0.9);
    let a2 = f("fact_a", "Two", 0.8);
    let b = f("fact_b", "Three", 0.7);
    // Unique ids: the originals, in the kept order.
    let moved = move_in_kept_order(vec![a.clone(), b.clone()], &[b.clone(), a.clone()]);
    assert_eq!(moved, vec![b.clone(), a.clone()]);
    // A duplicated id: the kept copies, whichever of the same-id facts they are.
    let moved = move_in_kept_order(
        vec![a.clone(), a2.clone(), b.clone()],
        &[a2.clone(), b.clone()],
    );
    assert_eq!(moved, vec![a2.clone(), b.clone()]);
    // A kept id that is not there: the copies.
    let c = f("fact_c", "Four", 0.6);
    let moved = move_in_kept_order(vec![a.clone()], std::slice::from_ref(&c));
    assert_eq!(moved, vec![c]);
}
