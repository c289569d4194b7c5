//! Tool mode end to end: a scripted model drives the four memory tools against the real DeerMem
//! backend (file storage + FTS5, built from configuration in `mode: tool`), the way an agent loop
//! does: the model's reply names a tool call, the host dispatches it and feeds the result back.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "embedded")]

use deermem_core::ports::MemoryManagerExt as _;
use std::sync::Arc;

use deermem::tools::{dispatch, tool_definitions};
use deermem_core::ports::{
    ChatMessage, ChatRequest, ContextRequest, LanguageModel, MemoryManager, MemoryScope,
};
use deermem_core::{MemoryConfig, MemoryMode, UserId};
use deermem_testkit::llm::ScriptedLlm;
use serde_json::{Value, json};

/// Runs the agent loop until the model answers in plain text; returns the final answer.
async fn agent_loop(
    model: &dyn LanguageModel,
    manager: &dyn MemoryManager,
    scope: &MemoryScope,
    user_turn: &str,
) -> String {
    let tools: Vec<Value> = tool_definitions()
        .iter()
        .map(|t| json!({"name": t.name, "parameters": t.input_schema}))
        .collect();
    let mut messages = vec![
        ChatMessage::system(format!("You may call these tools: {}", Value::Array(tools))),
        ChatMessage::user(user_turn),
    ];
    for _ in 0..10 {
        let reply = model
            .complete(&ChatRequest {
                messages: messages.clone(),
                ..ChatRequest::default()
            })
            .await
            .expect("the scripted model answers");
        let call: Option<Value> = serde_json::from_str(&reply.content)
            .ok()
            .filter(|v: &Value| v.get("tool").is_some());
        let Some(call) = call else {
            return reply.content;
        };
        let name = call["tool"].as_str().expect("tool name");
        let out = dispatch(manager, scope, name, &call["arguments"]).await;
        messages.push(ChatMessage::assistant(reply.content));
        messages.push(ChatMessage::user(format!(
            "tool {name} returned: {}",
            out.text
        )));
    }
    panic!("the agent loop did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_manages_memory_through_the_tools() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = MemoryConfig {
        mode: MemoryMode::Tool,
        ..MemoryConfig::default()
    };
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(dir.path().to_path_buf());
    let manager = deermem::build_manager(&config, opts).expect("DeerMem in tool mode");
    assert!(deermem::tools::should_use_memory_tools(&config));
    let scope = MemoryScope::new(Some(UserId::new("tool-user").expect("user")), None);

    // Turn 1: the model stores two facts, then answers.
    let model = ScriptedLlm::new([
        r#"{"tool": "memory_add", "arguments": {"content": "User prefers vim keybindings", "category": "preference", "confidence": 0.9}}"#,
        r#"{"tool": "memory_add", "arguments": {"content": "User lives in Lisbon", "category": "context"}}"#,
        "Noted both.",
    ]);
    let answer = agent_loop(
        &model,
        manager.as_ref(),
        &scope,
        "I use vim everywhere and I live in Lisbon.",
    )
    .await;
    assert_eq!(answer, "Noted both.");
    let doc = manager.get_memory(scope.clone()).await.expect("get");
    let contents: Vec<&str> = doc.facts.iter().map(|f| f.content.as_str()).collect();
    assert!(
        contents.contains(&"User prefers vim keybindings")
            && contents.contains(&"User lives in Lisbon"),
        "{contents:?}"
    );
    let lisbon = doc
        .facts
        .iter()
        .find(|f| f.content == "User lives in Lisbon")
        .expect("fact");
    assert!(
        (lisbon.confidence - 0.7).abs() < 1e-9,
        "memory_add defaults confidence to 0.7"
    );
    let vim_id = doc
        .facts
        .iter()
        .find(|f| f.content.contains("vim"))
        .expect("fact")
        .id
        .clone();

    // Tool mode injects summaries only: the facts stay behind memory_search.
    let ctx = manager
        .get_context(ContextRequest {
            scope: scope.clone(),
            thread_id: None,
        })
        .await
        .expect("context");
    assert!(
        !ctx.contains("vim") && !ctx.contains("Lisbon"),
        "tool mode must not inject facts: {ctx}"
    );

    // Turn 2: the model searches, sees the result, updates one fact and deletes the other.
    let model = ScriptedLlm::new(vec![
        r#"{"tool": "memory_search", "arguments": {"query": "vim"}}"#.to_owned(),
        format!(
            r#"{{"tool": "memory_update", "arguments": {{"fact_id": "{vim_id}", "content": "User prefers helix keybindings"}}}}"#
        ),
        r#"{"tool": "memory_add", "arguments": {"content": "  USER PREFERS HELIX KEYBINDINGS "}}"#
            .to_owned(),
        r#"{"tool": "memory_delete", "arguments": {"fact_id": "fact_does_not_exist"}}"#.to_owned(),
        "Updated.".to_owned(),
    ]);
    let answer = agent_loop(
        &model,
        manager.as_ref(),
        &scope,
        "Actually I switched to helix.",
    )
    .await;
    assert_eq!(answer, "Updated.");
    let prompts = model.requests();
    let seen_search = prompts[1]
        .messages
        .last()
        .expect("tool result")
        .content
        .clone();
    assert!(
        seen_search.contains("memory_search")
            && seen_search.contains("User prefers vim keybindings"),
        "{seen_search}"
    );
    let seen_dup = prompts[3]
        .messages
        .last()
        .expect("tool result")
        .content
        .clone();
    assert!(seen_dup.contains("Duplicate fact"), "{seen_dup}");
    let seen_missing = prompts[4]
        .messages
        .last()
        .expect("tool result")
        .content
        .clone();
    assert!(
        seen_missing.contains("Fact not found: fact_does_not_exist"),
        "{seen_missing}"
    );

    let doc = manager.get_memory(scope.clone()).await.expect("get");
    let vim = doc
        .facts
        .iter()
        .find(|f| f.id == vim_id)
        .expect("updated fact");
    assert_eq!(vim.content, "User prefers helix keybindings");
    assert_eq!(vim.revision, Some(2));
    assert_eq!(doc.facts.len(), 2, "the duplicate was refused");

    // Another user sees none of it.
    let other = MemoryScope::new(Some(UserId::new("someone-else").expect("user")), None);
    let hits = dispatch(
        manager.as_ref(),
        &other,
        "memory_search",
        &json!({"query": "helix"}),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&hits.text).expect("json")["count"],
        0
    );
    assert!(
        manager
            .shutdown_flush(std::time::Duration::from_secs(5))
            .await
    );
    let _keep: Arc<dyn MemoryManager> = manager;
}
