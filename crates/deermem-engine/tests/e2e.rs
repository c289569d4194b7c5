//! End to end: a scripted conversation goes through admission, the queue, the scripted model
//! and the gates into a real storage (the testkit's in-memory storage and the file storage),
//! and the injection text shows what was learned.

#![allow(clippy::unwrap_used, clippy::expect_used)]

// The updater crate's test helpers (clock, spy storage, scripted answers), shared rather than copied.
#[path = "../../deermem-updater/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{a, clock, counter_ids, h, labelled};
use deermem_core::ports::{Clock, MemoryStorage};
use deermem_core::{AgentName, MemoryMode, Message, UserId};
use deermem_engine::{QueueConfig, Submission, SubmitOutcome, UpdatePipeline};
use deermem_storage_file::{FileStorage, FileStorageConfig};
use deermem_testkit::llm::ScriptedLlm;
use deermem_testkit::storage::InMemoryStorage;
use deermem_updater::DeerMemConfig;
use deermem_updater::{HiddenMessagePolicy, MemoryUpdater, Signal};
use serde_json::json;

fn script() -> Vec<String> {
    vec![
        // Turn 1: identity and a preference, plus a task-only detail the gate refuses.
        json!({
            "user": {"workContext": {"summary": "Backend engineer working on payment services.", "shouldUpdate": true, "scope": "user", "authority": "descriptive"}},
            "history": {},
            "newFacts": [
                labelled("User is a backend engineer", 0.95),
                labelled("User prefers Rust for services", 0.9),
                {"content": "User is fixing bug 1234 today", "category": "context", "confidence": 0.9,
                 "scope": "thread", "durability": "temporary", "authority": "transactional"}
            ]
        })
        .to_string(),
        // Turn 2: a correction replaces an old fact.
        json!({
            "user": {}, "history": {},
            "newFacts": [{"content": "User uses pnpm, not npm", "category": "correction", "confidence": 0.97,
                          "sourceError": "Assistant suggested npm", "scope": "user", "durability": "durable", "authority": "descriptive"}],
            "factsToRemove": []
        })
        .to_string(),
        // Turn 3: the preference changes; the old fact goes with its replacement.
        "```json\n".to_owned()
            + &json!({
                "user": {}, "history": {},
                "newFacts": [labelled("User prefers Go for services", 0.9)],
                "factsToRemove": [{"id": "fact_00000002", "scope": "user", "reason": "preference changed", "replacementFactIndex": 0}]
            })
            .to_string()
            + "\n```",
    ]
}

fn alice() -> UserId {
    UserId::new("alice@example.com").unwrap()
}

fn submission(thread: &str) -> Submission {
    Submission {
        thread_id: thread.into(),
        user: Some(alice()),
        agent: AgentName::parse("Coder").unwrap(),
        trace_id: None,
    }
}

async fn run_conversation(
    storage: Arc<dyn MemoryStorage>,
    clock: Arc<dyn Clock>,
) -> (UpdatePipeline, Arc<ScriptedLlm>) {
    let llm = Arc::new(ScriptedLlm::new(script()));
    let updater = MemoryUpdater::builder(Arc::new(DeerMemConfig::default()), storage, clock)
        .language_model(Some(llm.clone()))
        .id_source(counter_ids())
        .build();
    let pipeline = UpdatePipeline::new(
        Arc::new(updater),
        HiddenMessagePolicy::structural(),
        QueueConfig {
            debounce: Duration::from_millis(20),
            max_depth: 1000,
            max_concurrency: 1,
            max_user_bytes: 0,
            max_total_bytes: 0,
        },
    )
    .unwrap();
    let mut convo: Vec<Message> = Vec::new();
    let turns = [
        (
            "I'm a backend engineer and I prefer Rust for services. Today I'm fixing bug 1234.",
            "Got it.",
        ),
        (
            "No, that's wrong: I use pnpm, not npm.",
            "Sorry, pnpm it is.",
        ),
        (
            "I changed my mind, I prefer Go for services now.",
            "Noted, Go.",
        ),
    ];
    for (i, (user, assistant)) in turns.iter().enumerate() {
        convo.push(h(&format!("u{i}"), user));
        convo.push(a(&format!("a{i}"), assistant));
        // Noise the filter removes: a hidden memory block, a tool call, a trivial thanks.
        let mut hidden = Message::human("<memory>old</memory>");
        hidden
            .additional_kwargs
            .insert("hide_from_ui".into(), json!(true));
        let mut raw = convo.clone();
        raw.insert(0, hidden);
        let outcome = pipeline.submit(submission("thread-1"), &raw).await;
        if i == 1 {
            assert!(
                matches!(outcome, SubmitOutcome::Queued { signals } if signals.contains(Signal::Correction))
            );
        } else {
            assert!(
                matches!(outcome, SubmitOutcome::Queued { .. }),
                "{outcome:?}"
            );
        }
        assert!(
            pipeline.flush(Duration::from_secs(10)).await,
            "turn {i} drained"
        );
    }
    // A trivial turn is filtered out with its reply: nothing new reaches the model.
    let mut thanks = convo.clone();
    thanks.push(h("u9", "thanks!"));
    thanks.push(a("a9", "You're welcome"));
    let _ = pipeline.submit(submission("thread-1"), &thanks).await;
    assert!(pipeline.flush(Duration::from_secs(10)).await);
    assert_eq!(llm.calls(), 3);
    // A conversation with no assistant turn is not admitted at all.
    assert_eq!(
        pipeline
            .submit(submission("thread-2"), &[h("x", "I prefer tabs")])
            .await,
        SubmitOutcome::NotAdmitted
    );
    (pipeline, llm)
}

async fn check(storage: Arc<dyn MemoryStorage>, pipeline: &UpdatePipeline, llm: &ScriptedLlm) {
    let agent = AgentName::parse("coder").unwrap();
    let doc = storage.load(Some(&alice()), Some(&agent)).await.unwrap();
    let mut contents: Vec<&str> = doc.facts.iter().map(|f| f.content.as_str()).collect();
    contents.sort_unstable();
    assert_eq!(
        contents,
        vec![
            "User is a backend engineer",
            "User prefers Go for services",
            "User uses pnpm, not npm",
        ]
    );
    let correction = doc
        .facts
        .iter()
        .find(|f| f.category.as_deref() == Some("correction"))
        .unwrap();
    assert_eq!(correction.source_error(), Some("Assistant suggested npm"));
    assert_eq!(correction.source.thread_id(), Some("thread-1"));
    assert_eq!(
        doc.user.entry("workContext").summary,
        "Backend engineer working on payment services."
    );
    // Each turn fed only its new messages; the hidden block never reached the model.
    assert_eq!(llm.calls(), 3);
    let prompts: Vec<String> = llm
        .requests()
        .iter()
        .map(|r| r.messages[1].content.clone())
        .collect();
    assert!(
        prompts[1].contains("User: No, that&#x27;s wrong")
            || prompts[1].contains("User: No, that's wrong")
    );
    assert!(!prompts[1].contains("I'm a backend engineer and I prefer Rust"));
    assert!(prompts.iter().all(|p| !p.contains("&lt;memory&gt;old")));
    assert!(prompts[1].contains("Explicit correction signals were detected"));
    // Injection shows the corrections first, then the rest.
    let text = pipeline
        .context(Some(&alice()), &agent, MemoryMode::Middleware, true)
        .await
        .unwrap();
    assert!(text.starts_with("User Context:\n- Work: Backend engineer working on payment services.\n\nFacts:\n- [correction | 0.97] User uses pnpm, not npm (avoid: Assistant suggested npm)"), "{text}");
    assert!(text.contains("- [preference | 0.90] User prefers Go for services"));
    let tool = pipeline
        .context(Some(&alice()), &agent, MemoryMode::Tool, true)
        .await
        .unwrap();
    assert_eq!(
        tool,
        "User Context:\n- Work: Backend engineer working on payment services."
    );
    // Another user sees nothing.
    let bob = UserId::new("bob").unwrap();
    assert!(
        storage
            .load(Some(&bob), Some(&agent))
            .await
            .unwrap()
            .facts
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_to_facts_in_memory() {
    let clock = clock();
    let storage: Arc<dyn MemoryStorage> = Arc::new(InMemoryStorage::new(clock.clone()));
    let (pipeline, llm) = run_conversation(storage.clone(), clock).await;
    check(storage, &pipeline, &llm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_to_facts_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock();
    let file = FileStorage::new(FileStorageConfig::new(dir.path()), clock.clone(), None).unwrap();
    let storage: Arc<dyn MemoryStorage> = Arc::new(file);
    let (pipeline, llm) = run_conversation(storage.clone(), clock.clone()).await;
    check(storage, &pipeline, &llm).await;
    // A fresh storage over the same root reads the same facts back from Markdown.
    let again: Arc<dyn MemoryStorage> =
        Arc::new(FileStorage::new(FileStorageConfig::new(dir.path()), clock, None).unwrap());
    let doc = again
        .load(Some(&alice()), Some(&AgentName::parse("coder").unwrap()))
        .await
        .unwrap();
    assert_eq!(doc.facts.len(), 3);
    assert!(doc.revision >= 3);
}
