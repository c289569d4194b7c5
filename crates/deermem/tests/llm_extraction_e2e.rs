//! Issue 5 end to end through the facade: the DeerMem backend built from a YAML configuration
//! whose `model` section points at the fake OpenAI-compatible server on 127.0.0.1 (API key from
//! `$VAR`); a scripted conversation goes through the manager's queue, the fake answers the
//! extraction requests with scripted JSON, and the expected facts end up as Markdown files under
//! the storage root and in `get_memory`.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "embedded")]

use deermem_core::ports::MemoryManagerExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use deermem::Backend;
use deermem_core::ports::{AddRequest, MemoryScope};
use deermem_core::{AgentName, Message, UserId};
use deermem_llm_openai::fake::{FakeOpenAi, Reply, Seen};
use serde_json::{Value, json};

const KEY_VAR: &str = "DEERMEM_E2E_FAKE_LLM_KEY";
const KEY: &str = "sk-e2e-fake-0123456789";
const THREAD: &str = "thread-e2e";

fn fact(content: &str, category: &str, confidence: f64) -> Value {
    json!({"content": content, "category": category, "confidence": confidence,
           "scope": "user", "durability": "durable", "authority": "descriptive"})
}

fn msg(human: bool, id: &str, text: &str) -> Message {
    let mut m = if human {
        Message::human(text)
    } else {
        Message::ai(text)
    };
    m.id = Some(id.into());
    m
}

fn config_yaml(root: &Path, base_url: &str) -> String {
    format!(
        r#"memory:
  enabled: true
  manager_class: deermem
  backend_config:
    storage_path: "{root}"
    debounce_seconds: 1
    model:
      provider: openai
      model: extraction-test-model
      base_url: "{base_url}"
      api_key: ${KEY_VAR}
      timeout_seconds: 20
      max_retries: 0
"#,
        root = root.display()
    )
}

/// Every `*.md` file under `dir`, recursively, with its text.
fn markdown_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                let text = std::fs::read_to_string(&p).expect("fact file is UTF-8");
                out.push((p, text));
            }
        }
    }
    out.sort();
    out
}

/// Every file under `dir` (recursively) as text, lossily.
fn all_file_texts(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("readable dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.push((p, String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
    }
    out
}

fn prompt_text(seen: &Seen) -> String {
    seen.message_contents().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_through_the_queue_and_the_fake_llm_server_lands_on_disk() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("memory-root");
    // Turn 1's answer: two durable facts, plus a thread-scoped transient one the gate refuses.
    let turn1 = json!({
        "user": {"workContext": {"summary": "Backend engineer on the payments team.",
                                  "shouldUpdate": true, "scope": "user", "authority": "descriptive"}},
        "history": {},
        "newFacts": [
            fact("User is a backend engineer on the payments team", "context", 0.95),
            fact("User prefers Rust for backend services", "preference", 0.9),
            {"content": "User is debugging ticket 4711 today", "category": "context", "confidence": 0.9,
             "scope": "thread", "durability": "temporary", "authority": "transactional"}
        ]
    });
    let fake = FakeOpenAi::start(vec![Reply::ok(&turn1.to_string())]).await;
    let env = |name: &str| (name == KEY_VAR).then(|| KEY.to_owned());
    let loaded = deermem::load_config_text(&config_yaml(&root, fake.base_url()), &env)
        .expect("the YAML configuration loads");
    assert_eq!(
        loaded.memory.backend_config["model"]["api_key"],
        json!(KEY),
        "$VAR is resolved at load time"
    );
    let backend =
        deermem::build_backend(&loaded.memory, deermem::BuildOptions::new(&env)).expect("build");
    let Backend::DeerMem(deermem, _) = &backend else {
        panic!(
            "manager_class deermem builds the embedded engine, got {}",
            backend.class()
        );
    };
    let manager = backend.manager();
    let user = UserId::new("erin@example.com").expect("user id");
    let agent = AgentName::parse("Coder").expect("agent");
    let scope = MemoryScope::new(Some(user.clone()), Some(agent.clone()));

    // Turn 1 goes through the queue; the flush drains it without waiting for the debounce.
    let mut convo = vec![
        msg(
            true,
            "u1",
            "I am a backend engineer on the payments team and I prefer Rust for backend services. Today I am debugging ticket 4711.",
        ),
        msg(false, "a1", "Understood, Rust it is."),
    ];
    manager
        .add(AddRequest {
            thread_id: THREAD.into(),
            messages: convo.clone(),
            scope: scope.clone(),
            trace_id: None,
        })
        .await
        .expect("add turn 1");
    assert!(
        deermem.pipeline().flush(Duration::from_secs(60)).await,
        "turn 1 drained"
    );
    let doc = manager.get_memory(scope.clone()).await.expect("get_memory");
    let rust = doc
        .facts
        .iter()
        .find(|f| f.content == "User prefers Rust for backend services")
        .expect("the preference was stored")
        .id
        .clone();
    assert_eq!(
        doc.facts.len(),
        2,
        "the transient fact was refused: {doc:?}"
    );

    // Turn 2: the user changes their mind; the model replaces the old preference.
    fake.push(Reply::ok(
        &json!({
            "user": {}, "history": {},
            "newFacts": [fact("User prefers Go for backend services", "preference", 0.92)],
            "factsToRemove": [{"id": rust, "scope": "user", "reason": "preference changed",
                               "replacementFactIndex": 0}]
        })
        .to_string(),
    ));
    convo.push(msg(
        true,
        "u2",
        "I changed my mind: I prefer Go for backend services now.",
    ));
    convo.push(msg(false, "a2", "Noted, Go from now on."));
    manager
        .add(AddRequest {
            thread_id: THREAD.into(),
            messages: convo.clone(),
            scope: scope.clone(),
            trace_id: None,
        })
        .await
        .expect("add turn 2");
    assert!(
        deermem.pipeline().flush(Duration::from_secs(60)).await,
        "turn 2 drained"
    );

    // What the fake received: one extraction request per turn, with the bearer key, the model
    // name, the new turn of the conversation, and (turn 2) the memory learned in turn 1.
    let seen = fake.requests();
    assert_eq!(seen.len(), 2, "one model call per turn");
    assert_eq!(fake.pending_replies(), 0);
    for s in &seen {
        assert_eq!(s.authorization(), Some(format!("Bearer {KEY}").as_str()));
        assert_eq!(s.body["model"], json!("extraction-test-model"));
    }
    let p1 = prompt_text(&seen[0]);
    assert!(p1.contains("debugging ticket 4711"), "{p1}");
    assert!(p1.contains("Understood, Rust it is."), "{p1}");
    let p2 = prompt_text(&seen[1]);
    assert!(p2.contains("I prefer Go for backend services now"), "{p2}");
    assert!(p2.contains("Noted, Go from now on."), "{p2}");
    assert!(
        p2.contains("User prefers Rust for backend services"),
        "turn 2's prompt shows the current memory: {p2}"
    );
    assert!(
        !p2.contains("debugging ticket 4711"),
        "turn 2 sends only the new messages: {p2}"
    );

    // On disk: one Markdown file per surviving fact in the user's agent bucket, nothing else.
    let facts_dir = root
        .join("users")
        .join(user.bucket())
        .join("agents")
        .join("coder")
        .join("facts");
    let files = markdown_files(&facts_dir);
    let mut on_disk: Vec<&str> = Vec::new();
    for want in [
        "User is a backend engineer on the payments team",
        "User prefers Go for backend services",
    ] {
        let holders: Vec<_> = files.iter().filter(|(_, t)| t.contains(want)).collect();
        assert_eq!(holders.len(), 1, "{want:?} is in exactly one fact file");
        assert!(
            holders[0]
                .0
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("fact_")),
            "{:?}",
            holders[0].0
        );
        on_disk.push(want);
    }
    assert_eq!(files.len(), 2, "{files:?}");
    for gone in ["User prefers Rust for backend services", "ticket 4711"] {
        assert!(
            files.iter().all(|(_, t)| !t.contains(gone)),
            "{gone:?} is not on disk"
        );
    }
    let rust_file = files
        .iter()
        .any(|(p, _)| p.to_string_lossy().contains(&rust));
    assert!(!rust_file, "the replaced fact's file was removed");
    let go = files
        .iter()
        .find(|(_, t)| t.contains("User prefers Go for backend services"))
        .map(|(_, t)| t.as_str())
        .unwrap_or_default();
    assert!(go.starts_with("---\n"), "YAML front matter: {go}");
    assert!(go.contains("category: preference"), "{go}");
    assert!(go.contains(THREAD), "the source thread is recorded: {go}");

    // Through the manager: the same facts, and the summary the model wrote.
    let doc = manager.get_memory(scope.clone()).await.expect("get_memory");
    let mut contents: Vec<&str> = doc.facts.iter().map(|f| f.content.as_str()).collect();
    contents.sort_unstable();
    assert_eq!(contents, on_disk);
    assert_eq!(
        doc.user.work_context.summary,
        "Backend engineer on the payments team."
    );
    // Another agent bucket of the same user learned nothing.
    let other = manager
        .get_memory(MemoryScope::new(
            Some(user.clone()),
            Some(AgentName::parse("writer").expect("agent")),
        ))
        .await
        .expect("get_memory");
    assert!(other.facts.is_empty());

    // The API key is never written to the storage root.
    manager.close().await;
    for (path, text) in all_file_texts(&root) {
        assert!(!text.contains(KEY), "{} holds the API key", path.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_variable_fails_at_load_time_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let env = |_: &str| None;
    let err = deermem::load_config_text(&config_yaml(dir.path(), "http://127.0.0.1:9/v1"), &env)
        .expect_err("the key variable is missing");
    assert!(err.to_string().contains(KEY_VAR), "{err}");
}
