//! Tool-mode tests: the four memory tool definitions, the dispatcher against a recording
//! manager and `NoopManager` (the reference's tool tests, ported as our own), argument handling,
//! and the mode-gating helpers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use deermem_core::ports::{FactAdmin, MemoryAdmin, MemoryReader, MemoryReload, MemorySearch};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deermem::NoopManager;
use deermem::tools::{
    self, DEFAULT_ADD_CONFIDENCE, EVICTED_MESSAGE, MAX_SEARCH_LIMIT, TOOL_MODE_DISABLED_WARNING,
    TOOL_NAMES, ToolDefinition, dispatch, tool_definitions,
};
use deermem_core::ports::{
    AddRequest, ContextRequest, FactPatch, MemoryManager, MemoryScope, NewFact, SearchRequest,
};
use deermem_core::{
    AgentName, InvalidInputCode, ManagerError, MemoryConfig, MemoryMode, PublicFact,
    PublicMemoryDocument, SearchMode, UserId,
};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// A recording manager with scripted answers.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Call {
    Search(SearchRequest),
    GetMemory(MemoryScope),
    Create(NewFact, MemoryScope),
    Update(String, FactPatch, MemoryScope),
    Delete(String, Option<u64>, MemoryScope),
}

type SearchFn = dyn Fn(&SearchRequest) -> Result<Vec<PublicFact>, ManagerError> + Send + Sync;
type MemoryFn = dyn Fn() -> Result<PublicMemoryDocument, ManagerError> + Send + Sync;
type CreateFn =
    dyn Fn(&NewFact) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> + Send + Sync;
type IdFn = dyn Fn(&str) -> Result<PublicMemoryDocument, ManagerError> + Send + Sync;

struct Recorder {
    calls: Mutex<Vec<Call>>,
    search: Box<SearchFn>,
    memory: Box<MemoryFn>,
    create: Box<CreateFn>,
    update: Box<IdFn>,
    delete: Box<IdFn>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

impl Recorder {
    fn new() -> Self {
        Self {
            calls: Mutex::new(Vec::new()),
            search: Box::new(|_| Ok(Vec::new())),
            memory: Box::new(|| Ok(PublicMemoryDocument::empty())),
            create: Box::new(|_| Ok((PublicMemoryDocument::empty(), Some("fact_new".into())))),
            update: Box::new(|_| Ok(PublicMemoryDocument::empty())),
            delete: Box::new(|_| Ok(PublicMemoryDocument::empty())),
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("calls lock").clone()
    }

    fn record(&self, call: Call) {
        self.calls.lock().expect("calls lock").push(call);
    }
}

#[async_trait]
impl MemoryManager for Recorder {
    fn name(&self) -> &str {
        "Recorder"
    }

    fn mode(&self) -> MemoryMode {
        MemoryMode::Tool
    }

    async fn add(&self, _request: AddRequest) -> Result<(), ManagerError> {
        Ok(())
    }

    async fn get_context(&self, _request: ContextRequest) -> Result<String, ManagerError> {
        Ok(String::new())
    }

    fn searcher(&self) -> Option<&dyn MemorySearch> {
        Some(self)
    }

    fn reader(&self) -> Option<&dyn MemoryReader> {
        Some(self)
    }

    fn admin(&self) -> Option<&dyn MemoryAdmin> {
        None
    }

    fn reloader(&self) -> Option<&dyn MemoryReload> {
        None
    }

    fn facts(&self) -> Option<&dyn FactAdmin> {
        Some(self)
    }
}

#[async_trait]
impl MemorySearch for Recorder {
    async fn search_scored(
        &self,
        request: SearchRequest,
    ) -> Result<Vec<deermem_core::ports::ScoredFact>, ManagerError> {
        Ok(MemorySearch::search(self, request)
            .await?
            .into_iter()
            .map(|fact| deermem_core::ports::ScoredFact {
                fact,
                score: None,
                match_type: deermem_core::search::MatchType::Remote,
            })
            .collect())
    }

    async fn search(&self, request: SearchRequest) -> Result<Vec<PublicFact>, ManagerError> {
        let out = (self.search)(&request);
        self.record(Call::Search(request));
        out
    }
}

#[async_trait]
impl MemoryReader for Recorder {
    async fn get_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::GetMemory(scope));
        (self.memory)()
    }
}

#[async_trait]
impl FactAdmin for Recorder {
    async fn create_fact(
        &self,
        fact: NewFact,
        scope: MemoryScope,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        let out = (self.create)(&fact);
        self.record(Call::Create(fact, scope));
        out
    }

    async fn update_fact(
        &self,
        fact_id: &str,
        patch: FactPatch,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::Update(fact_id.to_owned(), patch, scope));
        (self.update)(fact_id)
    }

    async fn delete_fact(
        &self,
        fact_id: &str,
        expected_revision: Option<u64>,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        self.record(Call::Delete(fact_id.to_owned(), expected_revision, scope));
        (self.delete)(fact_id)
    }
}

fn fact(id: &str, content: &str) -> PublicFact {
    serde_json::from_value(json!({
        "id": id,
        "content": content,
        "category": "preference",
        "confidence": 0.9,
        "createdAt": "2026-01-01T00:00:00Z",
        "source": "manual"
    }))
    .expect("public fact")
}

fn doc_with(facts: Vec<PublicFact>) -> PublicMemoryDocument {
    PublicMemoryDocument {
        facts,
        ..PublicMemoryDocument::empty()
    }
}

fn user_scope() -> MemoryScope {
    MemoryScope::user(UserId::new("alice@example.com").expect("user"))
}

fn agent_scope() -> MemoryScope {
    MemoryScope::new(
        Some(UserId::new("runtime-user").expect("user")),
        Some(AgentName::parse("Researcher").expect("agent")),
    )
}

async fn call(m: &dyn MemoryManager, tool: &str, args: Value) -> (Value, bool) {
    let out = dispatch(m, &user_scope(), tool, &args).await;
    let parsed: Value = serde_json::from_str(&out.text)
        .unwrap_or_else(|e| panic!("tool output is not JSON ({e}): {}", out.text));
    assert_eq!(
        out.is_error,
        parsed.get("error").is_some(),
        "is_error must match the error key: {}",
        out.text
    );
    (parsed, out.is_error)
}

fn error_text(v: &Value) -> &str {
    v.get("error")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("expected an error object, got {v}"))
}

// ---------------------------------------------------------------------------------------------
// Registry and schemas.
// ---------------------------------------------------------------------------------------------

#[test]
fn returns_four_tools() {
    assert_eq!(tool_definitions().len(), 4);
}

#[test]
fn tools_have_unique_expected_names() {
    let names: Vec<String> = tool_definitions().into_iter().map(|t| t.name).collect();
    assert_eq!(
        names,
        vec![
            "memory_search",
            "memory_add",
            "memory_update",
            "memory_delete"
        ]
    );
    let mut dedup = names.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(dedup.len(), names.len());
    assert_eq!(TOOL_NAMES.to_vec(), names);
}

/// Checks the structural rules of a JSON Schema object describing tool arguments.
fn assert_valid_object_schema(tool: &ToolDefinition) {
    let s = &tool.input_schema;
    assert_eq!(s["type"], "object", "{}: type must be object", tool.name);
    let props = s["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{}: properties must be an object", tool.name));
    let required = s["required"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: required must be an array", tool.name));
    for r in required {
        let key = r
            .as_str()
            .unwrap_or_else(|| panic!("{}: required entries are strings", tool.name));
        assert!(
            props.contains_key(key),
            "{}: required '{key}' is not a property",
            tool.name
        );
    }
    let allowed = [
        "string", "number", "integer", "boolean", "null", "array", "object",
    ];
    for (name, prop) in props {
        let ty = &prop["type"];
        let types: Vec<&str> = match ty {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => panic!("{}.{name}: type must be a string or a list", tool.name),
        };
        assert!(!types.is_empty(), "{}.{name}: empty type", tool.name);
        for t in &types {
            assert!(
                allowed.contains(t),
                "{}.{name}: unknown type {t}",
                tool.name
            );
        }
        assert!(
            prop["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{}.{name}: every argument is described",
            tool.name
        );
        if let Some(default) = prop.get("default") {
            let ok = match default {
                Value::Null => types.contains(&"null"),
                Value::String(_) => types.contains(&"string"),
                Value::Number(n) => {
                    types.contains(&"number") || (types.contains(&"integer") && n.is_i64())
                }
                _ => false,
            };
            assert!(
                ok,
                "{}.{name}: default {default} does not fit {types:?}",
                tool.name
            );
        }
    }
    assert!(!tool.description.is_empty());
}

#[test]
fn every_input_schema_is_a_valid_object_schema() {
    for tool in tool_definitions() {
        assert_valid_object_schema(&tool);
    }
}

#[test]
fn schemas_pin_model_visible_arguments_and_defaults() {
    let defs = tool_definitions();
    let by = |n: &str| {
        defs.iter()
            .find(|t| t.name == n)
            .unwrap_or_else(|| panic!("tool {n}"))
            .input_schema
            .clone()
    };
    let search = by("memory_search");
    assert_eq!(search["required"], json!(["query"]));
    assert_eq!(search["properties"]["limit"]["default"], json!(10));
    assert!(search["properties"]["category"].get("default").is_none());
    assert_eq!(
        search["properties"]["mode"]["enum"],
        json!(["bm25", "vector", "hybrid"])
    );
    assert!(search["properties"]["mode"].get("default").is_none());
    let add = by("memory_add");
    assert_eq!(add["required"], json!(["content"]));
    assert_eq!(add["properties"]["confidence"]["default"], json!(0.7));
    assert_eq!(add["properties"]["category"]["default"], json!("context"));
    let update = by("memory_update");
    assert_eq!(update["required"], json!(["fact_id"]));
    let keys: Vec<&String> = update["properties"]
        .as_object()
        .expect("props")
        .keys()
        .collect();
    assert_eq!(keys, vec!["fact_id", "content", "category", "confidence"]);
    assert_eq!(by("memory_delete")["required"], json!(["fact_id"]));
    // No argument lets the model pick the user or the agent.
    for t in &defs {
        let props = t.input_schema["properties"].as_object().expect("props");
        for forbidden in ["user_id", "agent_name", "runtime"] {
            assert!(
                !props.contains_key(forbidden),
                "{} exposes {forbidden}",
                t.name
            );
        }
    }
}

/// Every property has one JSON type (no `["string", "null"]` unions, which strict schema
/// checkers flag), no `null` default, and the strings the backend bounds declare the bound.
#[test]
fn schemas_are_portable_and_declare_the_enforced_limits() {
    for tool in tool_definitions() {
        let props = tool.input_schema["properties"].as_object().expect("props");
        for (name, prop) in props {
            assert!(
                prop["type"].is_string(),
                "{}.{name}: type {} is not a single type",
                tool.name,
                prop["type"]
            );
            assert!(
                prop.get("default").is_none_or(|d| !d.is_null()),
                "{}.{name}: null default",
                tool.name
            );
        }
    }
    let defs = tool_definitions();
    let max = |tool: &str, prop: &str| {
        defs.iter()
            .find(|t| t.name == tool)
            .expect("tool")
            .input_schema["properties"][prop]["maxLength"]
            .clone()
    };
    assert_eq!(max("memory_search", "query"), json!(4096));
    assert_eq!(max("memory_search", "category"), json!(128));
    assert_eq!(max("memory_add", "content"), json!(20_000));
    assert_eq!(max("memory_add", "category"), json!(128));
    assert_eq!(max("memory_update", "content"), json!(20_000));
    assert_eq!(max("memory_update", "category"), json!(128));
}

#[tokio::test]
async fn arguments_over_the_declared_limits_are_refused_before_the_backend() {
    let m = Recorder::new();
    let long = |n: usize| "x".repeat(n);
    let (v, err) = call(&m, "memory_add", json!({"content": long(20_001)})).await;
    assert!(err);
    assert_eq!(
        error_text(&v),
        "invalid arguments for memory_add: 'content' is too long (at most 20000 characters)"
    );
    let (v, _) = call(
        &m,
        "memory_add",
        json!({"content": "x", "category": long(129)}),
    )
    .await;
    assert!(error_text(&v).contains("'category' is too long"), "{v}");
    let (v, _) = call(&m, "memory_search", json!({"query": long(4097)})).await;
    assert!(error_text(&v).contains("'query' is too long"), "{v}");
    let (v, _) = call(
        &m,
        "memory_search",
        json!({"query": "x", "category": long(129)}),
    )
    .await;
    assert!(error_text(&v).contains("'category' is too long"), "{v}");
    let (v, _) = call(
        &m,
        "memory_update",
        json!({"fact_id": "f", "content": long(20_001)}),
    )
    .await;
    assert!(error_text(&v).contains("'content' is too long"), "{v}");
    assert!(m.calls().is_empty(), "{:?}", m.calls());
    // At the limit, counted in characters (not bytes), the call goes through.
    let (_, err) = call(
        &m,
        "memory_search",
        json!({"query": "茶".repeat(4096), "category": "é".repeat(128)}),
    )
    .await;
    assert!(!err);
    assert_eq!(m.calls().len(), 1);
}

#[test]
fn search_description_does_not_claim_substring_matching() {
    let search = tools::tool_definition("memory_search").expect("search tool");
    let d = search.description.to_lowercase();
    assert!(!d.contains("substring"), "{d}");
    assert!(d.contains("bm25"), "{d}");
    assert!(tools::tool_definition("memory_nope").is_none());
}

#[test]
fn definitions_serialize_with_snake_case_fields() {
    let v = serde_json::to_value(tool_definitions()).expect("serialize");
    assert_eq!(v[0]["name"], "memory_search");
    assert!(v[0]["input_schema"].is_object());
    assert!(v[0]["description"].is_string());
}

// ---------------------------------------------------------------------------------------------
// memory_search.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn search_returns_json_with_results() {
    let mut m = Recorder::new();
    m.search = Box::new(|_| Ok(vec![fact("fact_1", "Prefers tea")]));
    let (v, err) = call(&m, "memory_search", json!({"query": "tea"})).await;
    assert!(!err);
    assert_eq!(v["count"], 1);
    assert_eq!(v["results"][0]["id"], "fact_1");
    assert_eq!(v["results"][0]["content"], "Prefers tea");
    let keys: Vec<&String> = v.as_object().expect("object").keys().collect();
    assert_eq!(keys, vec!["results", "count"]);
    assert_eq!(
        m.calls(),
        vec![Call::Search(SearchRequest {
            query: "tea".into(),
            top_k: 10,
            scope: user_scope(),
            category: None,
            mode: None,
        })]
    );
}

#[tokio::test]
async fn search_empty_results() {
    let m = Recorder::new();
    let (v, err) = call(&m, "memory_search", json!({"query": "nothing"})).await;
    assert!(!err);
    assert_eq!(v, json!({"results": [], "count": 0}));
}

#[tokio::test]
async fn search_category_is_forwarded_to_the_backend() {
    let mut m = Recorder::new();
    // The backend filters; the dispatcher must not filter the backend's answer again.
    m.search = Box::new(|_| Ok(vec![fact("fact_1", "Prefers tea")]));
    let (v, _) = call(
        &m,
        "memory_search",
        json!({"query": "tea", "category": "goal", "limit": 3}),
    )
    .await;
    assert_eq!(v["count"], 1, "results are not filtered client-side");
    let calls = m.calls();
    let Call::Search(req) = &calls[0] else {
        panic!("expected a search, got {calls:?}");
    };
    assert_eq!(req.category.as_deref(), Some("goal"));
    assert_eq!(req.top_k, 3);
}

#[tokio::test]
async fn search_backend_error_becomes_error_json() {
    let mut m = Recorder::new();
    m.search = Box::new(|_| Err(ManagerError::backend("boom")));
    let (v, err) = call(&m, "memory_search", json!({"query": "tea"})).await;
    assert!(err);
    assert!(error_text(&v).contains("boom"), "{v}");
}

#[tokio::test]
async fn search_keeps_non_ascii_text_unescaped() {
    let mut m = Recorder::new();
    m.search = Box::new(|_| Ok(vec![fact("fact_1", "住在东京 — café")]));
    let out = dispatch(
        &m,
        &user_scope(),
        "memory_search",
        &json!({"query": "东京"}),
    )
    .await;
    assert!(!out.is_error);
    assert!(out.text.contains("住在东京 — café"), "{}", out.text);
    assert!(!out.text.contains("\\u"), "{}", out.text);
}

#[tokio::test]
async fn search_limit_is_lax_clamped_and_validated() {
    let m = Recorder::new();
    for (limit, expected) in [
        (json!(1000), MAX_SEARCH_LIMIT as usize),
        (json!("5"), 5),
        (json!(4.0), 4),
        (json!(0), 0),
        (json!(-3), 0),
        (Value::Null, 10),
    ] {
        let (_, err) = call(&m, "memory_search", json!({"query": "q", "limit": limit})).await;
        assert!(!err);
        let calls = m.calls();
        let Some(Call::Search(req)) = calls.last() else {
            panic!("expected a search");
        };
        assert_eq!(req.top_k, expected, "limit {limit}");
    }
    let before = m.calls().len();
    for bad in [json!(2.5), json!("many"), json!([1]), json!(true)] {
        let (v, err) = call(&m, "memory_search", json!({"query": "q", "limit": bad})).await;
        assert!(err, "limit {bad} must be refused");
        assert!(error_text(&v).contains("'limit'"), "{v}");
    }
    assert_eq!(
        m.calls().len(),
        before,
        "bad arguments never reach the backend"
    );
}

#[tokio::test]
async fn search_blank_category_means_no_filter() {
    let m = Recorder::new();
    call(&m, "memory_search", json!({"query": "q", "category": "  "})).await;
    let calls = m.calls();
    let Some(Call::Search(req)) = calls.last() else {
        panic!("expected a search");
    };
    assert_eq!(req.category, None);
}

/// `mode` is forwarded (any case; null or blank means the configured default); anything else is
/// refused with the search mode's own message before the backend is asked.
#[tokio::test]
async fn search_mode_is_forwarded_and_validated() {
    let m = Recorder::new();
    for (mode, expected) in [
        (json!("bm25"), Some(SearchMode::Bm25)),
        (json!("Vector"), Some(SearchMode::Vector)),
        (json!(" hybrid "), Some(SearchMode::Hybrid)),
        (json!(""), None),
        (Value::Null, None),
    ] {
        let (_, err) = call(&m, "memory_search", json!({"query": "q", "mode": mode})).await;
        assert!(!err, "mode {mode}");
        let calls = m.calls();
        let Some(Call::Search(req)) = calls.last() else {
            panic!("expected a search");
        };
        assert_eq!(req.mode, expected, "mode {mode}");
    }
    let before = m.calls().len();
    let (v, err) = call(
        &m,
        "memory_search",
        json!({"query": "q", "mode": "semantic"}),
    )
    .await;
    assert!(err);
    assert_eq!(
        error_text(&v),
        "invalid arguments for memory_search: 'mode': \"semantic\" is not a search mode; use bm25, vector or hybrid"
    );
    let (v, err) = call(&m, "memory_search", json!({"query": "q", "mode": 2})).await;
    assert!(err);
    assert!(error_text(&v).contains("'mode' must be a string"), "{v}");
    assert_eq!(m.calls().len(), before, "bad modes never reach the backend");
}

// ---------------------------------------------------------------------------------------------
// memory_add.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn add_checks_duplicates_then_creates_and_returns_json() {
    let m = Recorder::new();
    let (v, err) = call(&m, "memory_add", json!({"content": "Likes hiking"})).await;
    assert!(!err);
    assert_eq!(v, json!({"fact_id": "fact_new", "status": "added"}));
    let keys: Vec<&String> = v.as_object().expect("object").keys().collect();
    assert_eq!(keys, vec!["fact_id", "status"]);
    assert_eq!(
        m.calls(),
        vec![
            Call::GetMemory(user_scope()),
            Call::Create(
                NewFact {
                    content: "Likes hiking".into(),
                    category: "context".into(),
                    confidence: DEFAULT_ADD_CONFIDENCE,
                },
                user_scope()
            ),
        ]
    );
    assert!((DEFAULT_ADD_CONFIDENCE - 0.7).abs() < f64::EPSILON);
}

#[tokio::test]
async fn add_returns_the_id_create_fact_returned_even_if_storage_reorders() {
    let mut m = Recorder::new();
    m.create = Box::new(|_| {
        // The new fact is not last in the returned document.
        Ok((
            doc_with(vec![
                fact("fact_new1", "Likes hiking"),
                fact("fact_old", "Other"),
            ]),
            Some("fact_new1".into()),
        ))
    });
    let (v, _) = call(&m, "memory_add", json!({"content": "Likes hiking"})).await;
    assert_eq!(v["fact_id"], "fact_new1");
}

#[tokio::test]
async fn add_reports_not_stored_when_capacity_evicts_the_new_fact() {
    let mut m = Recorder::new();
    m.create = Box::new(|_| Ok((PublicMemoryDocument::empty(), None)));
    let (v, err) = call(&m, "memory_add", json!({"content": "x fact"})).await;
    assert!(err);
    assert_eq!(v, json!({"error": EVICTED_MESSAGE}));
    assert_eq!(
        EVICTED_MESSAGE,
        "Fact was not stored because the configured memory.max_facts capacity policy evicted it"
    );
}

#[tokio::test]
async fn add_uses_the_host_scope() {
    let m = Recorder::new();
    let scope = agent_scope();
    let out = dispatch(
        &m,
        &scope,
        "memory_add",
        &json!({"content": "Reads papers", "category": "behavior", "confidence": 0.95,
                "user_id": "mallory", "agent_name": "evil"}),
    )
    .await;
    assert!(!out.is_error, "{}", out.text);
    let calls = m.calls();
    assert_eq!(calls[0], Call::GetMemory(scope.clone()));
    let Call::Create(f, s) = &calls[1] else {
        panic!("expected a create, got {calls:?}");
    };
    assert_eq!(s, &scope, "model arguments never change the scope");
    assert_eq!(s.agent.as_ref().map(AgentName::as_str), Some("researcher"));
    assert_eq!(f.category, "behavior");
    assert!((f.confidence - 0.95).abs() < f64::EPSILON);
}

#[tokio::test]
async fn add_rejects_existing_duplicate_content() {
    let mut m = Recorder::new();
    m.memory = Box::new(|| Ok(doc_with(vec![fact("fact_1", "Likes Hiking")])));
    let (v, err) = call(&m, "memory_add", json!({"content": "  likes hiking \n"})).await;
    assert!(err);
    assert_eq!(v, json!({"error": "Duplicate fact"}));
    assert!(
        !m.calls().iter().any(|c| matches!(c, Call::Create(..))),
        "no create after a duplicate"
    );
}

#[tokio::test]
async fn add_duplicate_check_uses_full_casefold() {
    let mut m = Recorder::new();
    m.memory = Box::new(|| Ok(doc_with(vec![fact("fact_1", "Lives on Hauptstraße")])));
    let (v, _) = call(
        &m,
        "memory_add",
        json!({"content": "LIVES ON HAUPTSTRASSE"}),
    )
    .await;
    assert_eq!(v, json!({"error": "Duplicate fact"}));
}

#[tokio::test]
async fn add_rejects_duplicate_content_outside_any_search_cut() {
    let mut m = Recorder::new();
    m.memory = Box::new(|| {
        let mut facts: Vec<PublicFact> = (0..12)
            .map(|i| fact(&format!("fact_{i}"), &format!("Filler fact number {i}")))
            .collect();
        facts.push(fact("fact_12", "The thirteenth fact"));
        Ok(doc_with(facts))
    });
    let (v, _) = call(&m, "memory_add", json!({"content": "the thirteenth fact"})).await;
    assert_eq!(v, json!({"error": "Duplicate fact"}));
    assert!(
        !m.calls().iter().any(|c| matches!(c, Call::Search(_))),
        "the duplicate check reads the whole bucket, not a capped search"
    );
}

#[tokio::test]
async fn add_empty_content_is_refused_without_backend_calls() {
    let m = Recorder::new();
    for content in ["", "   ", "\u{3000}\n\t"] {
        let (v, err) = call(&m, "memory_add", json!({ "content": content })).await;
        assert!(err);
        assert_eq!(v, json!({"error": "empty content"}));
    }
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn add_on_a_backend_without_create_fact_names_the_operation() {
    let m = NoopManager::new(MemoryMode::Tool);
    let (v, err) = call(&m, "memory_add", json!({"content": "Likes tea"})).await;
    assert!(err);
    assert_eq!(
        error_text(&v),
        "memory backend NoopMemoryManager does not support create_fact"
    );
}

#[tokio::test]
async fn add_still_creates_when_the_backend_cannot_read_memory() {
    let mut m = Recorder::new();
    m.memory = Box::new(|| Err(ManagerError::unsupported("get memory", "Recorder")));
    let (v, err) = call(&m, "memory_add", json!({"content": "Likes tea"})).await;
    assert!(!err, "{v}");
    assert!(m.calls().iter().any(|c| matches!(c, Call::Create(..))));
}

#[tokio::test]
async fn add_stops_when_reading_memory_fails() {
    let mut m = Recorder::new();
    m.memory = Box::new(|| Err(ManagerError::corruption("bad front matter")));
    let (v, err) = call(&m, "memory_add", json!({"content": "Likes tea"})).await;
    assert!(err);
    assert!(error_text(&v).contains("corrupt"), "{v}");
    assert!(!m.calls().iter().any(|c| matches!(c, Call::Create(..))));
}

#[tokio::test]
async fn add_backend_validation_errors_are_passed_on() {
    let mut m = Recorder::new();
    m.create = Box::new(|_| {
        Err(ManagerError::invalid(
            InvalidInputCode::Confidence,
            "confidence must be a number between 0 and 1",
        ))
    });
    let (v, err) = call(
        &m,
        "memory_add",
        json!({"content": "Likes tea", "confidence": 7}),
    )
    .await;
    assert!(err);
    assert_eq!(
        error_text(&v),
        "confidence must be a number between 0 and 1"
    );
}

#[tokio::test]
async fn add_argument_errors_name_the_argument() {
    let m = Recorder::new();
    let (v, _) = call(&m, "memory_add", json!({})).await;
    assert_eq!(
        error_text(&v),
        "invalid arguments for memory_add: missing required argument 'content'"
    );
    let (v, _) = call(&m, "memory_add", json!({"content": 42})).await;
    assert!(error_text(&v).contains("'content' must be a string"), "{v}");
    let (v, _) = call(
        &m,
        "memory_add",
        json!({"content": "x", "confidence": "sure"}),
    )
    .await;
    assert!(error_text(&v).contains("'confidence'"), "{v}");
    let (v, _) = call(&m, "memory_add", json!({"content": "x", "category": ["a"]})).await;
    assert!(error_text(&v).contains("'category'"), "{v}");
    assert!(m.calls().is_empty());
}

// ---------------------------------------------------------------------------------------------
// memory_update and memory_delete.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn update_returns_json_and_passes_only_given_fields() {
    let m = Recorder::new();
    let (v, err) = call(
        &m,
        "memory_update",
        json!({"fact_id": "fact_abc", "content": "Prefers green tea", "confidence": null}),
    )
    .await;
    assert!(!err);
    assert_eq!(v, json!({"fact_id": "fact_abc", "status": "updated"}));
    assert_eq!(
        m.calls(),
        vec![Call::Update(
            "fact_abc".into(),
            FactPatch {
                content: Some("Prefers green tea".into()),
                category: None,
                confidence: None,
                expected_revision: None,
            },
            user_scope()
        )]
    );
}

#[tokio::test]
async fn update_missing_fact_names_the_id() {
    let mut m = Recorder::new();
    m.update = Box::new(|id| {
        Err(ManagerError::NotFound {
            fact_id: id.to_owned(),
        })
    });
    let (v, err) = call(
        &m,
        "memory_update",
        json!({"fact_id": "fact_missing", "content": "x"}),
    )
    .await;
    assert!(err);
    assert_eq!(v, json!({"error": "Fact not found: fact_missing"}));
}

#[tokio::test]
async fn update_on_a_backend_without_update_fact_names_the_operation() {
    let m = NoopManager::new(MemoryMode::Tool);
    let (v, _) = call(
        &m,
        "memory_update",
        json!({"fact_id": "fact_1", "content": "x"}),
    )
    .await;
    assert_eq!(
        error_text(&v),
        "memory backend NoopMemoryManager does not support update_fact"
    );
}

#[tokio::test]
async fn update_conflicts_and_validation_errors_are_reported() {
    let mut m = Recorder::new();
    m.update = Box::new(|_| {
        Err(ManagerError::conflict(
            "Expected fact 'fact_1' revision 1, found 2",
        ))
    });
    let (v, err) = call(
        &m,
        "memory_update",
        json!({"fact_id": "fact_1", "content": "x"}),
    )
    .await;
    assert!(err);
    assert!(error_text(&v).contains("changed concurrently"), "{v}");
    let (v, _) = call(&m, "memory_update", json!({"content": "x"})).await;
    assert!(
        error_text(&v).contains("missing required argument 'fact_id'"),
        "{v}"
    );
}

#[tokio::test]
async fn delete_returns_json() {
    let m = Recorder::new();
    let (v, err) = call(&m, "memory_delete", json!({"fact_id": "fact_abc"})).await;
    assert!(!err);
    assert_eq!(v, json!({"fact_id": "fact_abc", "status": "deleted"}));
    assert_eq!(
        m.calls(),
        vec![Call::Delete("fact_abc".into(), None, user_scope())]
    );
}

#[tokio::test]
async fn delete_missing_fact_names_the_id() {
    let mut m = Recorder::new();
    m.delete = Box::new(|id| {
        Err(ManagerError::NotFound {
            fact_id: id.to_owned(),
        })
    });
    let (v, _) = call(&m, "memory_delete", json!({"fact_id": "fact_gone"})).await;
    assert_eq!(v, json!({"error": "Fact not found: fact_gone"}));
}

#[tokio::test]
async fn delete_on_a_backend_without_delete_fact_names_the_operation() {
    let m = NoopManager::new(MemoryMode::Tool);
    let (v, _) = call(&m, "memory_delete", json!({"fact_id": "fact_1"})).await;
    assert_eq!(
        error_text(&v),
        "memory backend NoopMemoryManager does not support delete_fact"
    );
}

#[tokio::test]
async fn hostile_fact_ids_are_passed_to_the_backend_and_echoed_shortened() {
    let mut m = Recorder::new();
    m.delete = Box::new(|id| {
        Err(ManagerError::NotFound {
            fact_id: id.to_owned(),
        })
    });
    let huge = "../".repeat(3_500_000);
    let (v, err) = call(&m, "memory_delete", json!({ "fact_id": huge })).await;
    assert!(err);
    assert!(error_text(&v).len() < 1_000, "the echo is bounded");
    let (v, _) = call(&m, "memory_delete", json!({"fact_id": "a\u{0}b"})).await;
    assert!(error_text(&v).starts_with("Fact not found: "), "{v}");
}

// ---------------------------------------------------------------------------------------------
// Dispatcher robustness.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn unknown_tools_and_non_object_arguments_are_errors() {
    let m = Recorder::new();
    let (v, err) = call(&m, "memory_forget_everything", json!({})).await;
    assert!(err);
    assert!(
        error_text(&v).starts_with("Unknown tool: memory_forget_everything"),
        "{v}"
    );
    for args in [json!([1, 2]), json!("query"), json!(3)] {
        let (v, err) = call(&m, "memory_search", args).await;
        assert!(err);
        assert!(error_text(&v).contains("expected a JSON object"), "{v}");
    }
    let (v, _) = call(&m, "memory_search", Value::Null).await;
    assert!(
        error_text(&v).contains("missing required argument 'query'"),
        "{v}"
    );
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn error_output_is_a_single_error_key() {
    let out = tools::ToolOutput::error("bad \"quote\" 東京");
    assert!(out.is_error);
    assert_eq!(out.json(), json!({"error": "bad \"quote\" 東京"}));
    assert!(out.text.contains("東京"));
}

// ---------------------------------------------------------------------------------------------
// Mode gating.
// ---------------------------------------------------------------------------------------------

fn config(enabled: bool, mode: MemoryMode) -> MemoryConfig {
    MemoryConfig {
        enabled,
        mode,
        ..MemoryConfig::default()
    }
}

/// A backend that asks the host to keep passive writes in tool mode (as Honcho does).
#[derive(Debug)]
struct PassiveWriter;

#[async_trait]
impl MemoryManager for PassiveWriter {
    fn name(&self) -> &str {
        "PassiveWriter"
    }

    fn mode(&self) -> MemoryMode {
        MemoryMode::Tool
    }

    fn passive_writes_in_tool_mode(&self) -> bool {
        true
    }

    async fn add(&self, _request: AddRequest) -> Result<(), ManagerError> {
        Ok(())
    }

    async fn get_context(&self, _request: ContextRequest) -> Result<String, ManagerError> {
        Ok(String::new())
    }

    fn searcher(&self) -> Option<&dyn MemorySearch> {
        None
    }

    fn reader(&self) -> Option<&dyn MemoryReader> {
        None
    }

    fn admin(&self) -> Option<&dyn MemoryAdmin> {
        None
    }

    fn reloader(&self) -> Option<&dyn MemoryReload> {
        None
    }

    fn facts(&self) -> Option<&dyn FactAdmin> {
        None
    }
}

#[test]
fn should_use_memory_tools_truth_table() {
    assert!(tools::should_use_memory_tools(&config(
        true,
        MemoryMode::Tool
    )));
    assert!(!tools::should_use_memory_tools(&config(
        false,
        MemoryMode::Tool
    )));
    assert!(!tools::should_use_memory_tools(&config(
        true,
        MemoryMode::Middleware
    )));
    assert!(!tools::should_use_memory_tools(&config(
        false,
        MemoryMode::Middleware
    )));
}

#[test]
fn tool_mode_registers_tools_and_drops_passive_writes() {
    let cfg = config(true, MemoryMode::Tool);
    assert!(tools::should_use_memory_tools(&cfg));
    assert!(!tools::installs_passive_writes(&cfg, &Recorder::new()));
    assert_eq!(tools::mode_warning(&cfg), None);
}

#[test]
fn passive_write_backends_keep_the_write_path_in_tool_mode() {
    let cfg = config(true, MemoryMode::Tool);
    assert!(tools::installs_passive_writes(&cfg, &PassiveWriter));
    assert!(tools::installs_passive_writes(
        &config(true, MemoryMode::Middleware),
        &Recorder::new()
    ));
    assert!(tools::should_use_memory_tools(&cfg));
}

#[test]
fn middleware_mode_keeps_passive_writes_and_no_tools() {
    let cfg = config(true, MemoryMode::Middleware);
    assert!(tools::installs_passive_writes(&cfg, &Recorder::new()));
    assert!(!tools::should_use_memory_tools(&cfg));
}

#[test]
fn disabled_memory_keeps_the_no_op_write_path_and_no_tools() {
    let cfg = config(false, MemoryMode::Middleware);
    assert!(tools::installs_passive_writes(&cfg, &Recorder::new()));
    assert!(!tools::should_use_memory_tools(&cfg));
    assert_eq!(tools::mode_warning(&cfg), None);
}

#[test]
fn tool_mode_with_memory_disabled_warns_and_uses_the_write_path() {
    let cfg = config(false, MemoryMode::Tool);
    assert!(!tools::should_use_memory_tools(&cfg));
    assert!(tools::installs_passive_writes(&cfg, &Recorder::new()));
    assert_eq!(tools::mode_warning(&cfg), Some(TOOL_MODE_DISABLED_WARNING));
    assert_eq!(
        TOOL_MODE_DISABLED_WARNING,
        "memory.mode is 'tool' but memory.enabled is false"
    );
}

#[test]
fn injection_carries_facts_only_in_middleware_mode() {
    assert!(tools::mode_injects_facts(MemoryMode::Middleware));
    assert!(!tools::mode_injects_facts(MemoryMode::Tool));
}

#[test]
fn appending_skips_memory_tools_whose_names_are_taken() {
    let existing = ["bash", "memory_search"];
    let added: Vec<String> = tools::memory_tools_to_append(&existing)
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(added, vec!["memory_add", "memory_update", "memory_delete"]);
    let mut all: Vec<String> = existing.iter().map(|s| (*s).to_owned()).collect();
    all.extend(added);
    assert_eq!(all.iter().filter(|n| *n == "memory_search").count(), 1);
    assert_eq!(all.iter().filter(|n| *n == "memory_add").count(), 1);
}

#[test]
fn appending_keeps_unrelated_duplicate_tools() {
    let existing = vec!["bash".to_owned(), "bash".to_owned()];
    let added = tools::memory_tools_to_append(&existing);
    assert_eq!(added.len(), 4);
    let mut all = existing.clone();
    all.extend(added.into_iter().map(|t| t.name));
    assert_eq!(all.iter().filter(|n| *n == "bash").count(), 2);
    assert_eq!(all.iter().filter(|n| *n == "memory_add").count(), 1);
}

#[test]
fn instructions_mention_every_tool() {
    let text = tools::tool_mode_instructions();
    for name in TOOL_NAMES {
        assert!(text.contains(name), "{name} missing from the instructions");
    }
}

#[test]
fn instructions_describe_only_the_offered_tools() {
    let read_only = tools::instructions_for(&["memory_search", "memory_context"], &["- extra"]);
    assert!(read_only.contains("memory_search"), "{read_only}");
    assert!(read_only.ends_with("- extra"), "{read_only}");
    for absent in ["memory_add", "memory_update", "memory_delete", "secrets"] {
        assert!(!read_only.contains(absent), "{absent}: {read_only}");
    }
    assert_eq!(
        tools::instructions_for(&TOOL_NAMES, &[]),
        tools::tool_mode_instructions()
    );
    assert!(tools::tool_mode_instructions().contains("secrets"));
}

#[tokio::test]
async fn the_recorder_is_shared_safely_across_tasks() {
    // Dispatch is usable from concurrent tasks over a shared manager.
    let m: Arc<Recorder> = Arc::new(Recorder::new());
    let mut handles = Vec::new();
    for i in 0..8 {
        let m = m.clone();
        handles.push(tokio::spawn(async move {
            dispatch(
                m.as_ref(),
                &user_scope(),
                "memory_delete",
                &json!({"fact_id": format!("fact_{i}")}),
            )
            .await
        }));
    }
    for h in handles {
        assert!(!h.await.expect("task").is_error);
    }
    assert_eq!(m.calls().len(), 8);
}
