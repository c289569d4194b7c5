//! The manager-facing layer: backpressure never reaches the caller, the emergency path, the
//! configured `patterns_dir` / `prompts_dir`, and hostile input from the model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

// The updater crate's test helpers (clock, spy storage, scripted answers), shared rather than copied.
#[path = "../../deermem-updater/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{LogCapture, SpyStorage, a, answer, clock, h, labelled, seed_fact};
use deermem_core::prelude::*;
use deermem_core::{AgentName, UserId};
use deermem_engine::{QueueConfig, QueueError, Submission, SubmitOutcome, UpdatePipeline};
use deermem_testkit::llm::ScriptedLlm;
use deermem_updater::BuildError;
use deermem_updater::DeerMemConfig;
use deermem_updater::PATTERN_FILES;
use deermem_updater::{CHAT_TEMPLATE_FILE, CONSOLIDATION_TEMPLATE_FILE, STALENESS_TEMPLATE_FILE};
use deermem_updater::{
    HiddenMessagePolicy, MemoryUpdater, Signal, SignalSet, UpdateRequest, UpdateStatus,
};
use serde_json::json;

fn submission(thread: &str) -> Submission {
    Submission {
        thread_id: thread.into(),
        user: Some(UserId::new("alice").unwrap()),
        agent: AgentName::default_bucket(),
        trace_id: Some("tr".into()),
    }
}

#[tokio::test]
async fn backpressure_is_logged_not_raised() {
    // Log capture races with other test threads over tracing's call-site cache.
    if !deermem_testkit::isolation::run_alone("backpressure_is_logged_not_raised") {
        return;
    }
    let log = LogCapture::default();
    let _g = log.install();
    let clock = clock();
    let storage = Arc::new(SpyStorage::new(clock.clone()));
    let updater = MemoryUpdater::builder(Arc::new(DeerMemConfig::default()), storage, clock)
        .language_model(Some(Arc::new(ScriptedLlm::always(answer(&[])))))
        .build();
    let p = UpdatePipeline::new(
        Arc::new(updater),
        HiddenMessagePolicy::structural(),
        QueueConfig {
            debounce: Duration::from_secs(300),
            max_depth: 1,
            max_concurrency: 1,
            max_user_bytes: 0,
            max_total_bytes: 0,
        },
    )
    .unwrap();
    let plain = [h("1", "what is the weather"), a("2", "sunny")];
    assert!(matches!(
        p.submit(submission("t1"), &plain).await,
        SubmitOutcome::Queued { .. }
    ));
    let refused = p.submit(submission("t2"), &plain).await;
    assert!(
        matches!(refused, SubmitOutcome::Refused(QueueError::Full { .. })),
        "{refused:?}"
    );
    assert!(
        log.text().contains("rejected under backpressure"),
        "{}",
        log.text()
    );
    // A turn with a signal is never refused.
    let signal = [h("1", "No, that's wrong"), a("2", "sorry")];
    match p.submit(submission("t3"), &signal).await {
        SubmitOutcome::Queued { signals } => assert!(signals.contains(Signal::Correction)),
        other => panic!("{other:?}"),
    }
    // Neither is an emergency item.
    assert!(matches!(
        p.submit_emergency(submission("t4"), &plain).await,
        SubmitOutcome::Queued { .. }
    ));
    assert!(p.shutdown_flush(Duration::from_secs(10)).await);
    assert_eq!(p.queue().stats().succeeded, 3);
}

#[tokio::test]
async fn configured_dirs_are_loaded_and_must_be_complete() {
    let patterns = tempfile::tempdir().unwrap();
    for name in &PATTERN_FILES[..6] {
        std::fs::write(
            patterns.path().join(format!("{name}.yaml")),
            "- {pattern: 'zzz', flags: [ignorecase]}\n",
        )
        .unwrap();
    }
    let prompts = tempfile::tempdir().unwrap();
    let chat = "format: chat\nmessages:\n  - {role: system, content: 'CUSTOM SYSTEM'}\n  - {role: user, content: '{current_memory}{conversation}{correction_hint}{staleness_review_section}{consolidation_section}'}\n";
    std::fs::write(prompts.path().join(CHAT_TEMPLATE_FILE), chat).unwrap();
    std::fs::write(
        prompts.path().join(STALENESS_TEMPLATE_FILE),
        "format: text\ntemplate: '{stale_facts}'\n",
    )
    .unwrap();
    std::fs::write(
        prompts.path().join(CONSOLIDATION_TEMPLATE_FILE),
        "format: text\ntemplate: '{consolidation_groups}{max_groups}'\n",
    )
    .unwrap();
    let cfg = DeerMemConfig {
        patterns_dir: Some(patterns.path().display().to_string()),
        prompts_dir: Some(prompts.path().display().to_string()),
        ..DeerMemConfig::default()
    };
    let clock = clock();
    let storage = Arc::new(SpyStorage::new(clock.clone()));
    let err = MemoryUpdater::builder(Arc::new(cfg.clone()), storage.clone(), clock.clone())
        .build_from_config()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Patterns(_)), "{err}");
    assert!(err.to_string().contains("decision.yaml"), "{err}");
    std::fs::write(patterns.path().join("decision.yaml"), "- we pick\n").unwrap();
    let llm = Arc::new(ScriptedLlm::always(answer(&[])));
    let updater = MemoryUpdater::builder(Arc::new(cfg), storage, clock)
        .language_model(Some(llm.clone()))
        .build_from_config()
        .await
        .unwrap();
    let req = UpdateRequest {
        thread_id: "t".into(),
        messages: vec![h("1", "we pick ZZZ"), a("2", "ok")],
        user: None,
        agent: AgentName::default_bucket(),
        trace_id: None,
        bypass_watermark: false,
        signals: SignalSet::new(),
        turns: Vec::new(),
    };
    updater.update(req).await.unwrap();
    let sent = &llm.requests()[0];
    assert_eq!(sent.messages[0].content, "CUSTOM SYSTEM");
    // The custom patterns decide the hints: every signal file matches "zzz" or "we pick".
    assert!(
        sent.messages[1]
            .content
            .contains("Explicit correction signals were detected")
    );
    assert!(
        sent.messages[1]
            .content
            .contains("The user made a decision")
    );
}

#[tokio::test]
async fn hostile_ids_and_values_from_the_model_change_nothing() {
    let clock = clock();
    let storage = Arc::new(SpyStorage::new(clock.clone()));
    let alice = UserId::new("alice").unwrap();
    let agent = AgentName::default_bucket();
    storage
        .seed(
            Some(&alice),
            &agent,
            vec![seed_fact("fact_keep", "User likes tea", 0.9)],
        )
        .await;
    let nul_id = "fact\u{0}x";
    let long_id = "y".repeat(1_000_000);
    let text = json!({
        "user": {}, "history": {},
        "newFacts": [labelled("User likes green tea", 0.9)],
        "factsToRemove": [
            {"id": "../../etc/passwd", "scope": "user", "reason": "x"},
            {"id": nul_id, "scope": "user", "reason": "x"},
            {"id": long_id, "scope": "user", "reason": "x"}
        ],
        "staleFactsToRemove": [{"id": "../fact_keep"}],
        "factsToReinforce": [{"id": "fact_keep\u{0}", "scope": "user", "reason": "x"}],
        "factsToConsolidate": [{"sourceIds": ["fact_keep", "../x"], "consolidated": {"content": "merged"}}]
    })
    .to_string();
    let updater =
        MemoryUpdater::builder(Arc::new(DeerMemConfig::default()), storage.clone(), clock)
            .language_model(Some(Arc::new(ScriptedLlm::new([text]))))
            .build();
    let req = UpdateRequest {
        thread_id: "../../thread\u{0}".into(),
        messages: vec![h("1", "I like green tea"), a("2", "ok")],
        user: Some(alice.clone()),
        agent: agent.clone(),
        trace_id: None,
        bypass_watermark: false,
        signals: SignalSet::new(),
        turns: Vec::new(),
    };
    let out = updater.update(req).await.unwrap();
    assert!(matches!(out.status, UpdateStatus::Committed { .. }));
    let doc = storage.load(Some(&alice), Some(&agent)).await.unwrap();
    let mut got: Vec<&str> = doc.facts.iter().map(|f| f.content.as_str()).collect();
    got.sort_unstable();
    assert_eq!(got, vec!["User likes green tea", "User likes tea"]);
}
