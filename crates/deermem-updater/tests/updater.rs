//! The updater service end to end over the in-memory storage and a scripted model: parsing
//! through wrappers, fail-closed failures, hints, the watermark, capacity and usage reads,
//! conflict retries, observers and the offline proposer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use deermem_core::policy::eviction::EvictionPolicy;
use deermem_core::prelude::*;
use deermem_core::{AgentName, LlmError, Message, UserId};
use deermem_testkit::llm::{Scripted, ScriptedLlm};
use deermem_updater::DeerMemConfig;
use deermem_updater::ParseError;
use deermem_updater::ProposeError;
use deermem_updater::{ExtractionReport, LlmCallInfo, LlmResultInfo, UpdateObserver};
use deermem_updater::{
    MemoryUpdater, ProposalOrigin, SignalSet, UpdateRequest, UpdateStatus, UpdaterError,
};
use serde_json::json;

struct Rig {
    storage: Arc<SpyStorage>,
    llm: Arc<ScriptedLlm>,
    updater: MemoryUpdater,
    observer: Arc<Recorder>,
}

#[derive(Debug, Default)]
struct Recorder {
    calls: Mutex<Vec<LlmCallInfo>>,
    results: Mutex<Vec<LlmResultInfo>>,
    reports: Mutex<Vec<ExtractionReport>>,
}

impl UpdateObserver for Recorder {
    fn on_llm_call(&self, call: &LlmCallInfo) {
        self.calls.lock().unwrap().push(call.clone());
    }
    fn on_llm_result(&self, result: &LlmResultInfo) {
        self.results.lock().unwrap().push(result.clone());
    }
    fn on_extraction(&self, report: &ExtractionReport) {
        self.reports.lock().unwrap().push(report.clone());
    }
}

fn rig_with(cfg: DeerMemConfig, llm: ScriptedLlm) -> Rig {
    let clock = clock();
    let storage = Arc::new(SpyStorage::new(clock.clone()));
    let llm = Arc::new(llm);
    let observer = Arc::new(Recorder::default());
    let updater = MemoryUpdater::builder(Arc::new(cfg), storage.clone(), clock)
        .language_model(Some(llm.clone()))
        .observer(observer.clone())
        .id_source(counter_ids())
        .build();
    Rig {
        storage,
        llm,
        updater,
        observer,
    }
}

fn rig(replies: &[String]) -> Rig {
    rig_with(config(), ScriptedLlm::new(replies.iter().cloned()))
}

fn alice() -> UserId {
    UserId::new("alice@example.com").unwrap()
}

fn req(thread: &str, messages: Vec<Message>) -> UpdateRequest {
    UpdateRequest {
        thread_id: thread.into(),
        messages,
        user: Some(alice()),
        agent: AgentName::default_bucket(),
        trace_id: Some("trace-1".into()),
        bypass_watermark: false,
        signals: SignalSet::new(),
        turns: Vec::new(),
    }
}

fn turn() -> Vec<Message> {
    vec![h("m1", "I prefer tabs over spaces"), a("m2", "Noted")]
}

async fn contents(r: &Rig) -> Vec<String> {
    r.storage
        .load(Some(&alice()), Some(&AgentName::default_bucket()))
        .await
        .unwrap()
        .facts
        .into_iter()
        .map(|f| f.content)
        .collect()
}

#[tokio::test]
async fn a_plain_json_answer_is_committed() {
    let r = rig(&[answer(&[labelled("User prefers tabs", 0.9)])]);
    let out = r.updater.update(req("t1", turn())).await.unwrap();
    assert!(matches!(
        out.status,
        UpdateStatus::Committed { revision: 1 }
    ));
    assert_eq!(out.origin, Some(ProposalOrigin::Model("scripted".into())));
    assert_eq!(r.llm.calls(), 1);
    assert_eq!(contents(&r).await, vec!["User prefers tabs"]);
    let request = &r.llm.requests()[0];
    assert_eq!(request.messages.len(), 2);
    assert!(request.json_response);
    let opts = r.storage.last_options.lock().unwrap().clone();
    assert_eq!(opts[0].expected_manifest_revision, Some(0));
    assert!(!opts[0].allow_manifest_rebase);
}

#[tokio::test]
async fn wrapped_answers_are_found() {
    let body = answer(&[labelled("User prefers tabs", 0.9)]);
    for wrapped in [
        format!("<think>hmm {{not this}}</think>{body}"),
        format!("<think>never closed {body}"),
        format!("Here you go:\n{body}\nDone."),
        format!("```json\n{body}\n```"),
        format!("{{\"user\": \"alice\"}}\n{body}"),
    ] {
        let r = rig(std::slice::from_ref(&wrapped));
        r.updater.update(req("t1", turn())).await.unwrap();
        assert_eq!(contents(&r).await, vec!["User prefers tabs"], "{wrapped}");
    }
}

#[tokio::test]
async fn unusable_answers_fail_closed_and_save_nothing() {
    let truncated = answer(&[labelled("User prefers tabs", 0.9)]);
    let truncated = truncated[..truncated.len() - 3].to_owned();
    let unsafe_partial = json!({"user": {}, "history": {}, "newFacts": [{"content": 5}],
        "factsToRemove": [{"id": "fact_x", "scope": "user", "reason": "old", "replacementFactIndex": 0}]}).to_string();
    for (text, expected) in [
        (truncated, ParseError::NoUpdateObject),
        (
            r#"{"user": "alice"}"#.to_owned(),
            ParseError::NoUpdateObject,
        ),
        (unsafe_partial, ParseError::UnsafePartialUpdate),
    ] {
        let r = rig(std::slice::from_ref(&text));
        let err = r.updater.update(req("t1", turn())).await.unwrap_err();
        assert!(
            matches!(&err, UpdaterError::Propose(ProposeError::Parse(p)) if *p == expected),
            "{text}: {err}"
        );
        assert_eq!(
            r.storage.applies.load(std::sync::atomic::Ordering::SeqCst),
            0
        );
        // The watermark did not move: the same turn is offered again.
        let r2 = r.llm.calls();
        r.llm.push(Scripted::Reply(answer(&[])));
        r.updater.update(req("t1", turn())).await.unwrap();
        assert_eq!(r.llm.calls(), r2 + 1);
    }
}

#[tokio::test]
async fn malformed_items_are_dropped_one_by_one() {
    let text = r#"{"user": "bad", "history": [], "factsToRemove": "bad", "newFacts": [
        "a string",
        {"content": "Kept fact", "category": "preference", "confidence": 0.9, "scope": "user", "durability": "durable", "authority": "descriptive"},
        {"content": " Coerced ", "category": 9, "confidence": "0.91", "sourceError": " old ",
         "scope": "user", "durability": "durable", "authority": "descriptive"},
        {"content": "Too sure", "confidence": 1.5, "scope": "user", "durability": "durable", "authority": "descriptive"},
        {"content": "   "}, {"content": 7}
    ], "staleFactsToExtend": [{"id": "x", "extend_by_days": NaN}]}"#
        .to_owned();
    let r = rig(&[text]);
    let out = r.updater.update(req("t1", turn())).await.unwrap();
    assert!(matches!(out.status, UpdateStatus::Committed { .. }));
    let mut got = contents(&r).await;
    got.sort();
    assert_eq!(got, vec!["Coerced", "Kept fact"]);
    assert_eq!(out.metrics.unwrap().dropped_malformed, 4);
}

#[tokio::test]
async fn a_non_string_summary_does_not_abort_the_update() {
    let text = json!({"user": {"topOfMind": {"summary": 12345, "shouldUpdate": true, "scope": "user", "authority": "descriptive"},
                               "workContext": {"summary": "Builds compilers", "shouldUpdate": true, "scope": "user", "authority": "descriptive"}},
                      "history": {}, "newFacts": [labelled("User prefers tabs", 0.9)]}).to_string();
    let r = rig(&[text]);
    r.updater.update(req("t1", turn())).await.unwrap();
    let doc = r.storage.load(Some(&alice()), None).await.unwrap();
    assert_eq!(doc.user.entry("workContext").summary, "Builds compilers");
    assert_eq!(doc.user.entry("topOfMind").summary, "");
    assert_eq!(contents(&r).await, vec!["User prefers tabs"]);
}

#[tokio::test]
async fn provider_failures_are_reported_and_fail_the_update() {
    let llm = ScriptedLlm::new(Vec::<String>::new());
    llm.push(Scripted::Fail(LlmError::Server {
        status: 503,
        message: "busy".into(),
    }));
    let r = rig_with(config(), llm);
    let err = r.updater.update(req("t1", turn())).await.unwrap_err();
    assert!(matches!(
        err,
        UpdaterError::Propose(ProposeError::Llm(LlmError::Server { status: 503, .. }))
    ));
    let results = r.observer.results.lock().unwrap().clone();
    assert_eq!(results.len(), 1);
    assert!(results[0].error.as_deref().unwrap().contains("503"));
    let reports = r.observer.reports.lock().unwrap().clone();
    assert!(!reports[0].success);
    assert!(reports[0].metrics.is_none());
}

#[tokio::test]
async fn observers_see_the_call_with_thread_trace_and_model() {
    let r = rig(&[answer(&[
        labelled("User prefers tabs", 0.9),
        json!({"content": "unlabelled", "confidence": 0.9}),
    ])]);
    r.updater.update(req("t1", turn())).await.unwrap();
    let calls = r.observer.calls.lock().unwrap().clone();
    assert_eq!(calls[0].thread_id, "t1");
    assert_eq!(calls[0].trace_id.as_deref(), Some("trace-1"));
    assert_eq!(calls[0].user_id.as_deref(), Some("alice@example.com"));
    assert_eq!(calls[0].model_name, "scripted");
    let results = r.observer.results.lock().unwrap().clone();
    assert!(results[0].error.is_none());
    assert!(results[0].response_chars.unwrap() > 0);
    let report = r.observer.reports.lock().unwrap()[0].clone();
    assert!(report.success);
    let m = report.metrics.unwrap();
    assert_eq!(m.facts_extracted, 2);
    assert_eq!(m.facts_passed_scope_gate, 1);
    assert_eq!(m.scope_gate_rejections.facts.missing, 1);
    assert_eq!(m.rejected_by_scope_gate, 1);
}

#[tokio::test]
async fn signal_hints_reach_the_prompt() {
    let r = rig(&[answer(&[]), answer(&[]), answer(&[])]);
    r.updater
        .update(req(
            "t1",
            vec![h("m1", "No, that's wrong."), a("m2", "Sorry")],
        ))
        .await
        .unwrap();
    assert!(
        r.llm
            .last_prompt()
            .unwrap()
            .contains("Explicit correction signals were detected")
    );
    r.updater
        .update(req(
            "t2",
            vec![
                h("m1", "Yes, exactly! That's what I needed."),
                a("m2", "Great"),
            ],
        ))
        .await
        .unwrap();
    let p = r.llm.last_prompt().unwrap();
    assert!(p.contains("Positive reinforcement signals were detected"));
    assert!(!p.contains("Explicit correction signals were detected"));
    r.updater
        .update(req(
            "t3",
            vec![h("m1", "What time is it?"), a("m2", "Noon")],
        ))
        .await
        .unwrap();
    assert!(
        !r.llm
            .last_prompt()
            .unwrap()
            .contains("signals were detected")
    );
}

#[tokio::test]
async fn facts_land_in_the_captured_user_bucket_only() {
    let r = rig(&[answer(&[labelled("User prefers tabs", 0.9)])]);
    r.updater.update(req("t1", turn())).await.unwrap();
    let bob = UserId::new("bob").unwrap();
    let other = r
        .storage
        .load(Some(&bob), Some(&AgentName::default_bucket()))
        .await
        .unwrap();
    assert!(other.facts.is_empty());
    let fact = r
        .storage
        .load(Some(&alice()), Some(&AgentName::default_bucket()))
        .await
        .unwrap()
        .facts[0]
        .clone();
    assert_eq!(fact.scope.user_id.as_deref(), Some("alice@example.com"));
    assert_eq!(fact.source.thread_id(), Some("t1"));
}

// ---- watermark -----------------------------------------------------------------------------

#[tokio::test]
async fn the_watermark_feeds_only_new_messages() {
    let r = rig(&[answer(&[]), answer(&[]), answer(&[]), answer(&[])]);
    let mut msgs = turn();
    r.updater.update(req("t1", msgs.clone())).await.unwrap();
    // Same messages again: nothing new, no call.
    let out = r.updater.update(req("t1", msgs.clone())).await.unwrap();
    assert_eq!(out.status, UpdateStatus::NothingNew);
    assert_eq!(r.llm.calls(), 1);
    // The conversation grows: only the new turn is fed.
    msgs.push(h("m3", "I use Helix"));
    msgs.push(a("m4", "Nice"));
    r.updater.update(req("t1", msgs.clone())).await.unwrap();
    let p = r.llm.last_prompt().unwrap();
    assert!(p.contains("User: I use Helix"));
    assert!(!p.contains("I prefer tabs"));
    // Another thread starts fresh.
    r.updater.update(req("t2", msgs.clone())).await.unwrap();
    assert!(r.llm.last_prompt().unwrap().contains("I prefer tabs"));
    assert_eq!(r.llm.calls(), 3);
}

#[tokio::test]
async fn the_watermark_survives_front_removal_and_resets_on_shrink() {
    let r = rig(&[answer(&[]), answer(&[]), answer(&[])]);
    let msgs = [
        h("m1", "one"),
        a("m2", "two"),
        h("m3", "three"),
        a("m4", "four"),
    ];
    r.updater
        .update(req("t1", msgs[..2].to_vec()))
        .await
        .unwrap();
    // Summarisation removed m1 but m2 (the watermark) is still there: m3, m4 are fed.
    r.updater
        .update(req("t1", msgs[1..].to_vec()))
        .await
        .unwrap();
    let p = r.llm.last_prompt().unwrap();
    assert!(p.contains("User: three") && !p.contains("User: one") && !p.contains("Assistant: two"));
    // The conversation shrank past the watermark: everything is fed again.
    r.updater
        .update(req("t1", vec![h("x1", "fresh start"), a("x2", "ok")]))
        .await
        .unwrap();
    assert!(r.llm.last_prompt().unwrap().contains("User: fresh start"));
    assert_eq!(r.llm.calls(), 3);
}

#[tokio::test]
async fn the_emergency_path_bypasses_and_does_not_move_the_watermark() {
    let r = rig(&[answer(&[]), answer(&[]), answer(&[])]);
    let msgs = vec![
        h("m1", "one"),
        a("m2", "two"),
        h("m3", "three"),
        a("m4", "four"),
    ];
    r.updater
        .update(req("t1", msgs[..2].to_vec()))
        .await
        .unwrap();
    let mut emergency = req("t1", msgs[..2].to_vec());
    emergency.bypass_watermark = true;
    r.updater.update(emergency).await.unwrap();
    assert!(r.llm.last_prompt().unwrap().contains("User: one"));
    r.updater.update(req("t1", msgs.clone())).await.unwrap();
    let p = r.llm.last_prompt().unwrap();
    assert!(p.contains("User: three") && !p.contains("User: one"));
    assert_eq!(r.llm.calls(), 3);
}

#[tokio::test]
async fn the_watermark_cache_is_a_bounded_lru() {
    let mut cfg = config();
    cfg.watermark_max_keys = 2;
    let r = rig_with(cfg, ScriptedLlm::always(answer(&[])));
    for t in ["t1", "t2", "t3"] {
        r.updater.update(req(t, turn())).await.unwrap();
    }
    assert_eq!(r.updater.watermark_len(), 2);
    // t1 was dropped: it re-extracts once.
    r.updater.update(req("t1", turn())).await.unwrap();
    r.updater.update(req("t3", turn())).await.unwrap();
    assert_eq!(r.llm.calls(), 4);
}

/// The updater reports its caches with the configured bounds: the watermarks at
/// `watermark_max_keys` (holding what it tracks; no bound when configured unbounded), the
/// token-count memo, and the prompt templates a model's proposer reads.
#[tokio::test]
async fn the_updater_reports_its_cache_bounds_from_the_configuration() {
    let mut cfg = config();
    cfg.watermark_max_keys = 2;
    let r = rig_with(cfg, ScriptedLlm::always(answer(&[])));
    for t in ["t1", "t2", "t3"] {
        r.updater.update(req(t, turn())).await.unwrap();
    }
    let caches = r.updater.cache_bounds();
    let find = |name: &str| {
        caches
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name} missing from {caches:?}"))
            .clone()
    };
    let w = find(deermem_updater::WATERMARK_CACHE_NAME);
    assert_eq!((w.bound, w.current), (Some(2), Some(2)));
    assert_eq!(w.unit, deermem_core::CacheUnit::Entries);
    let memo = find(deermem_updater::MEMO_ENTRIES_NAME);
    assert_eq!(memo.bound, Some(16_384));
    assert!(memo.current <= memo.bound);
    let bytes = find(deermem_updater::MEMO_BYTES_NAME);
    assert_eq!(
        (bytes.bound, bytes.unit),
        (Some(8 * 1024 * 1024), deermem_core::CacheUnit::Bytes)
    );
    // Bundled templates: the model's proposer caches no per-agent set.
    assert_eq!(find(deermem_updater::TEMPLATE_CACHE_NAME).bound, Some(0));

    let mut cfg = config();
    cfg.watermark_max_keys = 0;
    let r = rig_with(cfg, ScriptedLlm::always(answer(&[])));
    let caches = r.updater.cache_bounds();
    let w = caches
        .iter()
        .find(|c| c.name == deermem_updater::WATERMARK_CACHE_NAME)
        .unwrap();
    assert_eq!(w.bound, None, "0 is unbounded by configuration");
}

#[tokio::test]
async fn blank_conversations_ask_nothing_and_move_on() {
    let r = rig(&[]);
    let out = r
        .updater
        .update(req(
            "t1",
            vec![h("m1", "<uploaded_files>/mnt/x</uploaded_files>")],
        ))
        .await;
    assert_eq!(out.unwrap().status, UpdateStatus::NothingToExtract);
    assert_eq!(r.llm.calls(), 0);
}

// ---- capacity and usage ---------------------------------------------------------------------

#[tokio::test]
async fn confidence_capacity_never_reads_usage_and_audits_after_commit() {
    let mut cfg = config();
    cfg.max_facts = 10;
    let r = rig_with(
        cfg,
        ScriptedLlm::new([answer(&[labelled("New strong fact", 0.95)])]),
    );
    let facts: Vec<_> = (0..10)
        .map(|i| {
            seed_fact(
                &format!("fact_s{i:02}"),
                &format!("seed {i}"),
                0.5 + f64::from(i) / 100.0,
            )
        })
        .collect();
    r.storage
        .seed(Some(&alice()), &AgentName::default_bucket(), facts)
        .await;
    r.updater.update(req("t1", turn())).await.unwrap();
    assert!(r.storage.usage_reads.lock().unwrap().is_empty());
    let audits = r.storage.audits.lock().unwrap().clone();
    assert_eq!(audits, vec![(vec!["fact_s00".to_owned()], false)]);
    let got = contents(&r).await;
    assert_eq!(got.len(), 10);
    assert!(got.contains(&"New strong fact".to_owned()));
}

#[tokio::test]
async fn hybrid_and_shadow_capacity_read_usage_once() {
    for shadow in [false, true] {
        let mut cfg = config();
        cfg.max_facts = 10;
        if shadow {
            cfg.fact_eviction_shadow_enabled = true;
        } else {
            cfg.fact_eviction_policy = EvictionPolicy::HybridV1;
        }
        let r = rig_with(
            cfg,
            ScriptedLlm::new([answer(&[labelled("New strong fact", 0.95)])]),
        );
        let facts: Vec<_> = (0..10)
            .map(|i| seed_fact(&format!("fact_s{i:02}"), &format!("seed {i}"), 0.5))
            .collect();
        r.storage
            .seed(Some(&alice()), &AgentName::default_bucket(), facts)
            .await;
        r.updater.update(req("t1", turn())).await.unwrap();
        let reads = r.storage.usage_reads.lock().unwrap().clone();
        assert_eq!(
            reads,
            vec![(
                Some("alice@example.com".to_owned()),
                "__default__".to_owned()
            )]
        );
        assert_eq!(r.storage.audits.lock().unwrap()[0].1, shadow);
    }
}

// ---- conflicts -------------------------------------------------------------------------

#[tokio::test]
async fn a_conflict_recomputes_on_a_fresh_snapshot() {
    let r = rig(&[answer(&[labelled("User prefers tabs", 0.9)])]);
    r.storage
        .conflicts_to_inject
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let out = r.updater.update(req("t1", turn())).await.unwrap();
    assert_eq!(out.attempts, 3);
    assert_eq!(r.llm.calls(), 1, "the same answer is re-applied");
    assert_eq!(contents(&r).await, vec!["User prefers tabs"]);
    let doc = r.storage.load(Some(&alice()), None).await.unwrap();
    assert_eq!(
        doc.user.entry("topOfMind").summary,
        "concurrent writer",
        "the other writer's change is kept"
    );
}

#[tokio::test]
async fn three_conflicts_give_up_without_moving_the_watermark() {
    let r = rig(&[answer(&[labelled("User prefers tabs", 0.9)]), answer(&[])]);
    r.storage
        .conflicts_to_inject
        .store(3, std::sync::atomic::Ordering::SeqCst);
    let err = r.updater.update(req("t1", turn())).await.unwrap_err();
    assert!(
        matches!(
            err,
            UpdaterError::ConflictRetriesExhausted { attempts: 3, .. }
        ),
        "{err}"
    );
    assert!(contents(&r).await.is_empty());
    r.updater.update(req("t1", turn())).await.unwrap();
    assert_eq!(r.llm.calls(), 2, "the turn is offered again");
}

// ---- reinforcement through the service ----------------------------------------------------

#[tokio::test]
async fn reinforcement_needs_a_human_confirmation_in_the_batch() {
    let mut cfg = config();
    cfg.fact_eviction_policy = EvictionPolicy::HybridV1;
    let confirm = json!({"user": {}, "history": {}, "newFacts": [],
        "factsToReinforce": [{"id": "fact_tabs", "scope": "user", "reason": "user confirmed"}]})
    .to_string();
    let r = rig_with(cfg, ScriptedLlm::always(confirm));
    r.storage
        .seed(
            Some(&alice()),
            &AgentName::default_bucket(),
            vec![seed_fact("fact_tabs", "User prefers tabs", 0.9)],
        )
        .await;
    r.updater
        .update(req(
            "t1",
            vec![h("m1", "Tabs again please"), a("m2", "Sure")],
        ))
        .await
        .unwrap();
    let f = r
        .storage
        .load(Some(&alice()), Some(&AgentName::default_bucket()))
        .await
        .unwrap()
        .facts[0]
        .clone();
    assert_eq!(f.confirmation_count, None, "no deterministic confirmation");
    r.updater
        .update(req("t2", vec![h("m1", "Perfect."), a("m2", "Thanks")]))
        .await
        .unwrap();
    let f = r
        .storage
        .load(Some(&alice()), Some(&AgentName::default_bucket()))
        .await
        .unwrap()
        .facts[0]
        .clone();
    assert_eq!(f.confirmation_count, Some(Some(1)));
    assert_eq!(f.last_confirmed_at, Some(Some(START.to_owned())));
}

// ---- offline proposer --------------------------------------------------------------------

#[tokio::test]
async fn without_a_model_the_offline_rules_propose() {
    // Log capture races with other test threads over tracing's call-site cache.
    if !deermem_testkit::isolation::run_alone("without_a_model_the_offline_rules_propose") {
        return;
    }
    let clock = clock();
    let storage = Arc::new(SpyStorage::new(clock.clone()));
    let log = LogCapture::default();
    let _g = log.install();
    let updater = MemoryUpdater::builder(Arc::new(config()), storage.clone(), clock).build();
    assert!(log.text().contains("offline rule-based extractor"));
    assert_eq!(updater.origin(), ProposalOrigin::Offline);
    let out = updater
        .update(req(
            "t1",
            vec![
                h(
                    "m1",
                    "I'm a data engineer. I prefer Polars over pandas. Can you help?",
                ),
                a("m2", "Sure"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(out.origin, Some(ProposalOrigin::Offline));
    let doc = storage
        .load(Some(&alice()), Some(&AgentName::default_bucket()))
        .await
        .unwrap();
    let mut got: Vec<(String, String)> = doc
        .facts
        .iter()
        .map(|f| (f.content.clone(), f.category_or_default().to_owned()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("User is a data engineer".to_owned(), "identity".to_owned()),
            (
                "User prefers Polars over pandas".to_owned(),
                "preference".to_owned()
            ),
        ]
    );
}

#[tokio::test]
async fn rejection_warnings_are_logged() {
    // Log capture races with other test threads over tracing's call-site cache.
    if !deermem_testkit::isolation::run_alone("rejection_warnings_are_logged") {
        return;
    }
    let log = LogCapture::default();
    let _g = log.install();
    let r = rig(&[answer(&[
        json!({"content": "a", "confidence": 0.9}),
        json!({"content": "b", "confidence": 0.9}),
    ])]);
    r.updater.update(req("t1", turn())).await.unwrap();
    let text = log.text();
    assert!(text.contains("WARN"), "{text}");
    assert!(
        text.contains("scope-gate rejection rate 100% exceeds 60%"),
        "{text}"
    );
}

#[tokio::test]
async fn journal_turns_are_recorded_and_a_request_of_applied_turns_asks_nothing() {
    let r = rig(&[
        answer(&[labelled("User prefers tabs", 0.9)]),
        answer(&[labelled("User likes tab indentation", 0.9)]),
        answer(&[labelled("User writes Rust", 0.9)]),
    ]);
    let mut first = req("t1", turn());
    first.turns = vec!["turn_a".into()];
    let out = r.updater.update(first.clone()).await.unwrap();
    assert!(matches!(out.status, UpdateStatus::Committed { .. }));
    let doc = r
        .storage
        .load(Some(&alice()), Some(&AgentName::default_bucket()))
        .await
        .unwrap();
    let recorded: Vec<&str> = doc.facts[0].source.turn_ids().collect();
    assert_eq!(recorded, ["turn_a"]);
    assert_eq!(doc.facts[0].source.thread_id(), Some("t1"));
    // The same turn replayed in a fresh process (no watermark): the model would rephrase, but
    // it is not asked, and nothing is written.
    let fresh = MemoryUpdater::builder(Arc::new(config()), r.storage.clone(), clock())
        .language_model(Some(r.llm.clone()))
        .id_source(counter_ids())
        .build();
    let out = fresh.update(first).await.unwrap();
    assert_eq!(out.status, UpdateStatus::AlreadyApplied);
    assert_eq!(r.llm.calls(), 1);
    assert_eq!(contents(&r).await, ["User prefers tabs"]);
    // A request standing for an applied turn and a new one is extracted (the dedup gates
    // guard what the applied one wrote).
    let mut later = turn();
    later.extend([h("m3", "I also like tab indentation"), a("m4", "Noted")]);
    let mut merged = req("t1", later);
    merged.turns = vec!["turn_a".into(), "turn_b".into()];
    let out = fresh.update(merged).await.unwrap();
    assert!(
        matches!(out.status, UpdateStatus::Committed { .. }),
        "{out:?}"
    );
    assert_eq!(r.llm.calls(), 2);
    // Without journal turns (not durable) nothing is recorded and nothing is skipped.
    let out = fresh.update(req("t2", turn())).await.unwrap();
    assert!(
        matches!(out.status, UpdateStatus::Committed { .. }),
        "{out:?}"
    );
    let doc = r
        .storage
        .load(Some(&alice()), Some(&AgentName::default_bucket()))
        .await
        .unwrap();
    let plain = doc
        .facts
        .iter()
        .find(|f| f.content == "User writes Rust")
        .unwrap();
    assert_eq!(plain.source.turn_ids().count(), 0);
    assert!(!plain.source.as_map().contains_key("turnIds"));
}
