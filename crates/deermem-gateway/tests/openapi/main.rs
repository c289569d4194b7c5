//! `/openapi.json` against the real thing: every route is called through the router (over the
//! recording manager and over the real DeerMem manager on a temp root), and every response
//! body, and every request body sent, is validated against the schema the served document
//! gives for that operation and status. Objects are closed: a field the types do not declare
//! is drift as much as a missing one. A status the document does not list for the operation
//! fails too, and so does a route whose success response no test exercised.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod validator;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::http::{Method, StatusCode};
use common::{
    FakeManager, JournalOnly, Resp, app, dead_turn, empty, json_req, ready_state, send, token_app,
};
use deermem_core::ports::MemoryManager;
use deermem_core::ports::TurnJournal;
use deermem_core::{ManagerError, MemoryConfig};
use deermem_gateway::{GatewayConfig, GatewayState, router};
use deermem_storage_file::{
    FileTurnJournal, FileTurnJournalOptions, RunJournal, RunJournalOptions,
};
use serde_json::{Value, json};
use validator::Validator;

/// The served document, and which (method, path, status) the tests have checked.
struct Conformance {
    doc: Value,
    seen: BTreeSet<(String, String, u16)>,
}

impl Conformance {
    async fn fetch(app: &Router) -> Self {
        let r = send(app, empty(Method::GET, "/openapi.json")).await;
        assert_eq!(r.status, StatusCode::OK);
        Self {
            doc: r.body,
            seen: BTreeSet::new(),
        }
    }

    fn operation(&self, method: &Method, template: &str) -> &Value {
        let op = &self.doc["paths"][template][method.as_str().to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {template} is not documented");
        op
    }

    /// Validates a request body against the operation's request schema.
    fn request(&self, method: &Method, template: &str, body: &Value) {
        let schema = &self.operation(method, template)["requestBody"]["content"]["application/json"]
            ["schema"];
        assert!(
            schema.is_object(),
            "{method} {template} documents no JSON body"
        );
        let errors = Validator::new(&self.doc, true)
            .expect("components")
            .errors(schema, body);
        assert!(
            errors.is_empty(),
            "{method} {template} request {body}: {errors:#?}"
        );
    }

    /// Validates a response against the operation's schema for its status.
    fn response(&mut self, method: &Method, template: &str, r: &Resp) {
        let status = r.status.as_u16();
        let reply = &self.operation(method, template)["responses"][status.to_string()];
        assert!(
            reply.is_object(),
            "{method} {template} answered {status}, which it does not document: {}",
            r.text
        );
        let content = reply["content"].as_object().expect("content");
        if let Some(json) = content.get("application/json") {
            let ctype = r.headers["content-type"].to_str().unwrap_or("");
            assert!(ctype.starts_with("application/json"), "{ctype}");
            let errors = Validator::new(&self.doc, true)
                .expect("components")
                .errors(&json["schema"], &r.body);
            assert!(
                errors.is_empty(),
                "{method} {template} {status} body {}: {errors:#?}",
                r.text
            );
        } else if content.contains_key("text/html") {
            let ctype = r.headers["content-type"].to_str().unwrap_or("");
            assert!(ctype.starts_with("text/html"), "{ctype}");
            assert!(r.text.starts_with("<!DOCTYPE html>"), "{}", r.text);
        } else {
            let ctype = r.headers["content-type"].to_str().unwrap_or("");
            assert!(
                content.keys().any(|k| ctype.starts_with(k.as_str())),
                "{ctype} not in {content:?}"
            );
            assert!(!r.text.is_empty());
        }
        self.seen
            .insert((method.as_str().to_owned(), template.to_owned(), status));
    }

    /// Sends a request (validating its JSON body first) and validates the response.
    async fn call(
        &mut self,
        app: &Router,
        method: Method,
        template: &str,
        uri: &str,
        body: Option<Value>,
    ) -> Resp {
        let request = match &body {
            Some(b) => {
                self.request(&method, template, b);
                json_req(method.clone(), uri, b)
            }
            None => empty(method.clone(), uri),
        };
        let r = send(app, request).await;
        self.response(&method, template, &r);
        r
    }

    /// Sends a request whose body is *meant* to be outside the schema (error paths).
    async fn call_raw(
        &mut self,
        app: &Router,
        method: Method,
        template: &str,
        uri: &str,
        body: &Value,
    ) -> Resp {
        let r = send(app, json_req(method.clone(), uri, body)).await;
        self.response(&method, template, &r);
        r
    }

    /// Every documented operation, as (method, path template).
    fn operations(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, ops) in self.doc["paths"].as_object().expect("paths") {
            for method in ops.as_object().expect("operations").keys() {
                out.insert((method.to_ascii_uppercase(), path.clone()));
            }
        }
        out
    }

    fn assert_every_route_succeeded(&self) {
        let operations = self.operations();
        assert_eq!(operations.len(), 23, "{operations:?}");
        for (method, path) in operations {
            assert!(
                self.seen
                    .iter()
                    .any(|(m, p, s)| *m == method && *p == path && (200..300).contains(s)),
                "no test validated a success response of {method} {path}"
            );
        }
    }
}

/// The app with a run journal and a turn journal in `root`; the turn journal too.
fn journal_app(m: &Arc<FakeManager>, root: &Path) -> (Router, Arc<dyn TurnJournal>) {
    let journal = Arc::new(
        RunJournal::open(
            RunJournal::dir_for_storage_root(root),
            RunJournalOptions::default(),
        )
        .expect("journal"),
    );
    let turns: Arc<dyn TurnJournal> = Arc::new(
        FileTurnJournal::open_in_root(root, FileTurnJournalOptions::default())
            .expect("turn journal"),
    );
    let app = router(
        ready_state(m.clone(), MemoryConfig::default(), GatewayConfig::default())
            .with_run_journal(journal)
            .with_turn_journal(Arc::new(JournalOnly(Arc::clone(&turns)))),
    );
    (app, turns)
}

const FACTS: &str = "/api/memory/facts";
const FACT: &str = "/api/memory/facts/{fact_id}";

#[tokio::test]
async fn every_route_answers_what_the_document_says() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    m.set_summary("default", "Writes Rust");
    let (a, turns) = journal_app(&m, tmp.path());
    let mut c = Conformance::fetch(&a).await;
    let (get, post, patch, delete) = (Method::GET, Method::POST, Method::PATCH, Method::DELETE);

    // Operational routes.
    c.call(&a, get.clone(), "/healthz", "/healthz", None).await;
    c.call(&a, get.clone(), "/readyz", "/readyz", None).await;
    c.call(&a, get.clone(), "/metrics", "/metrics", None).await;
    c.call(&a, get.clone(), "/openapi.json", "/openapi.json", None)
        .await;
    c.call(&a, get.clone(), "/docs", "/docs", None).await;
    let starting = router(GatewayState::new(
        m.clone(),
        MemoryConfig::default(),
        GatewayConfig::default(),
    ));
    let r = c
        .call(&starting, get.clone(), "/readyz", "/readyz", None)
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);

    // The reference's routes.
    let r = c
        .call(
            &a,
            post.clone(),
            FACTS,
            FACTS,
            Some(json!({"content": "Prefers Rust", "category": "preference", "confidence": 0.9})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    c.call(
        &a,
        post.clone(),
        "/api/memory/facts",
        "/api/memory/facts?agent=coder",
        Some(json!({"content": "Uses tokio"})),
    )
    .await;
    let r = c
        .call(&a, get.clone(), "/api/memory", "/api/memory", None)
        .await;
    let id = r.body["facts"][0]["id"].as_str().expect("id").to_owned();
    let uri = format!("/api/memory/facts/{id}");
    let r = c
        .call(
            &a,
            patch.clone(),
            FACT,
            &uri,
            Some(json!({"content": "Prefers Rust 2024", "category": null})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    c.call(&a, patch.clone(), FACT, &uri, Some(json!({}))).await;
    let export = c
        .call(
            &a,
            get.clone(),
            "/api/memory/export",
            "/api/memory/export",
            None,
        )
        .await;
    c.call(
        &a,
        post.clone(),
        "/api/memory/reload",
        "/api/memory/reload",
        None,
    )
    .await;
    c.call(
        &a,
        get.clone(),
        "/api/memory/config",
        "/api/memory/config",
        None,
    )
    .await;
    c.call(
        &a,
        get.clone(),
        "/api/memory/status",
        "/api/memory/status",
        None,
    )
    .await;
    let r = c
        .call(
            &a,
            post.clone(),
            "/api/memory/import",
            "/api/memory/import",
            Some(export.body.clone()),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Extensions.
    let r = c
        .call(
            &a,
            post.clone(),
            "/api/memory/messages",
            "/api/memory/messages",
            Some(
                json!({"thread_id": "t-1", "agent": "coder", "trace_id": "tr-1", "messages": [
                    {"role": "user", "content": "I use Rust"},
                    {"type": "ai", "content": [{"type": "text", "text": "Noted"}]},
                    {"type": "human", "data": {"content": "dumped", "additional_kwargs": {}}}
                ]}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let ctx = "/api/memory/context";
    let r = c.call(&a, get.clone(), ctx, ctx, None).await;
    assert!(r.body["content_sha256"].is_string());
    m.set_context_body("");
    let r = c.call(&a, get.clone(), ctx, ctx, None).await;
    assert_eq!(r.body["content_sha256"], Value::Null);
    m.set_context_body("User Context:\n- Rust");
    c.call(
        &a,
        get.clone(),
        ctx,
        "/api/memory/context?thread_id=t-1&run_id=r-1",
        None,
    )
    .await;
    let events = "/api/threads/{thread_id}/runs/{run_id}/events";
    let r = c
        .call(
            &a,
            get.clone(),
            events,
            "/api/threads/t-1/runs/r-1/events",
            None,
        )
        .await;
    assert_eq!(r.body.as_array().map(Vec::len), Some(1), "{}", r.text);
    let search = "/api/memory/search";
    let r = c
        .call(
            &a,
            get.clone(),
            search,
            "/api/memory/search?q=Rust&top_k=3",
            None,
        )
        .await;
    assert!(r.body["count"].as_u64() >= Some(1), "{}", r.text);
    let rebuild = "/api/memory/index/rebuild";
    m.set_warm_result(Some(true));
    c.call(&a, post.clone(), rebuild, rebuild, None).await;
    m.set_warm_result(None);
    c.call(&a, post.clone(), rebuild, rebuild, None).await;
    c.call(&a, delete.clone(), FACT, &uri, None).await;
    c.call(&a, delete.clone(), "/api/memory", "/api/memory", None)
        .await;

    // The turn journal (the default user's items).
    let first = dead_turn(turns.as_ref(), "turn_a1", "default", "t-1").await;
    let second = dead_turn(turns.as_ref(), "turn_a2", "default", "t-2").await;
    dead_turn(turns.as_ref(), "turn_b1", "bob", "t-3").await;
    let list = "/api/memory/turns";
    let r = c.call(&a, get.clone(), list, list, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["total"], 2, "{}", r.text);
    assert_eq!(r.body["turns"][0]["message_count"], 2, "{}", r.text);
    let retry = "/api/memory/turns/{turn_id}/retry";
    let r = c
        .call(
            &a,
            post.clone(),
            retry,
            &format!("/api/memory/turns/{first}/retry"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["state"], "pending");
    let r = c
        .call(
            &a,
            post.clone(),
            retry,
            &format!("/api/memory/turns/{first}/retry"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let r = c
        .call(
            &a,
            post.clone(),
            retry,
            "/api/memory/turns/turn_b1/retry",
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let one = "/api/memory/turns/{turn_id}";
    let r = c
        .call(
            &a,
            delete.clone(),
            one,
            &format!("/api/memory/turns/{second}"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = c
        .call(&a, delete.clone(), one, "/api/memory/turns/bad.id", None)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = c
        .call(&a, get.clone(), list, "/api/memory/turns?state=gone", None)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let without = router(ready_state(
        m.clone(),
        MemoryConfig::default(),
        GatewayConfig::default(),
    ));
    let r = c.call(&without, get.clone(), list, list, None).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{}", r.text);
    c.assert_every_route_succeeded();

    // Errors: each body against its documented schema.
    let r = c
        .call_raw(&a, post.clone(), FACTS, FACTS, &json!({"confidence": 7}))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = c
        .call_raw(
            &a,
            post.clone(),
            "/api/memory/import",
            "/api/memory/import",
            &json!({"facts": [{"id": "x"}, 5]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = c
        .call(
            &a,
            delete.clone(),
            FACT,
            "/api/memory/facts/fact_missing",
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = c
        .call(&a, delete.clone(), FACT, "/api/memory/facts/bad%20id", None)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = c
        .call(&a, get.clone(), search, "/api/memory/search?top_k=0", None)
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = c
        .call(
            &a,
            get.clone(),
            events,
            "/api/threads/t-9/runs/r-9/events",
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    m.fail("get_memory", || ManagerError::corruption("private"));
    let r = c
        .call(&a, get.clone(), "/api/memory", "/api/memory", None)
        .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    m.fail("get_memory", || ManagerError::conflict("private"));
    let r = c
        .call(&a, get.clone(), "/api/memory", "/api/memory", None)
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    m.fail("get_memory", || {
        ManagerError::unsupported("get memory", "FakeMemoryManager")
    });
    let r = c
        .call(&a, get.clone(), "/api/memory", "/api/memory", None)
        .await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
    let disabled = router(ready_state(
        m.clone(),
        MemoryConfig {
            enabled: false,
            ..MemoryConfig::default()
        },
        GatewayConfig::default(),
    ));
    let r = c
        .call(&disabled, get.clone(), "/api/memory", "/api/memory", None)
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let locked = token_app(m.clone(), &[("tok-a", "alice")]);
    let r = c
        .call(&locked, get.clone(), "/api/memory", "/api/memory", None)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // deerflow_session mode: DeerFlow's 401 object, and the CSRF rule's 403.
    let session = router(ready_state(
        m.clone(),
        MemoryConfig::default(),
        GatewayConfig::with_deerflow_session("conformance-secret").expect("secret"),
    ));
    let r = c
        .call(&session, get.clone(), "/api/memory", "/api/memory", None)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.body["detail"]["code"], "not_authenticated");
    let r = c
        .call(&session, delete.clone(), "/api/memory", "/api/memory", None)
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let small = router(ready_state(
        m.clone(),
        MemoryConfig::default(),
        GatewayConfig {
            max_body_bytes: 64,
            ..GatewayConfig::default()
        },
    ));
    let r = c
        .call(
            &small,
            post.clone(),
            FACTS,
            FACTS,
            Some(json!({"content": "x".repeat(200)})),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// Every component name a schema refers to.
fn refs(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref"
                    && let Some(name) = x.as_str()
                {
                    out.insert(name.to_owned());
                }
                refs(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

#[tokio::test]
async fn every_operation_is_described_and_every_reference_resolves() {
    let c = Conformance::fetch(&app(FakeManager::new())).await;
    let mut ids = BTreeMap::new();
    for (method, path) in c.operations() {
        let op = c.operation(&Method::from_bytes(method.as_bytes()).expect("m"), &path);
        let id = op["operationId"].as_str().expect("operationId").to_owned();
        assert!(ids.insert(id.clone(), path.clone()).is_none(), "{id} twice");
        assert!(op["summary"].is_string(), "{method} {path}");
        let responses = op["responses"].as_object().expect("responses");
        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{method} {path}"
        );
        for r in responses.values() {
            assert!(
                r["description"].as_str().is_some_and(|d| !d.is_empty()),
                "{method} {path}"
            );
        }
        // Every path parameter of the template is declared, and only those.
        let in_template: BTreeSet<&str> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        let declared: BTreeSet<&str> = op["parameters"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter(|p| p["in"] == "path")
                    .filter_map(|p| p["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(in_template, declared, "{method} {path}");
        // Authentication: the /api routes take the global requirements, the others none.
        assert_eq!(
            op.get("security") == Some(&json!([])),
            !path.starts_with("/api/"),
            "{method} {path}"
        );
    }
    let schemas = c.doc["components"]["schemas"].as_object().expect("schemas");
    let mut names = BTreeSet::new();
    refs(&c.doc, &mut names);
    assert!(names.len() > 10, "{names:?}");
    for name in names {
        let short = name
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{name} points outside components.schemas"));
        assert!(schemas.contains_key(short), "dangling $ref {name}");
    }
    assert!(
        !c.doc.to_string().contains("x-deermem"),
        "internal markers are not served"
    );
}

#[tokio::test]
async fn request_and_response_contracts_differ_where_the_types_do() {
    let c = Conformance::fetch(&app(FakeManager::new())).await;
    let schemas = &c.doc["components"]["schemas"];
    // Written: every field without skip_serializing_if is always there.
    let required = |name: &str| -> BTreeSet<String> {
        schemas[name]["required"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let set =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|s| (*s).to_owned()).collect() };
    assert_eq!(
        required("MemoryResponse"),
        set(&["facts", "history", "lastUpdated", "user", "version"])
    );
    assert_eq!(
        required("Fact"),
        set(&[
            "category",
            "confidence",
            "content",
            "createdAt",
            "id",
            "source"
        ])
    );
    // Read: defaults make fields optional; the import body refers to the input forms.
    assert_eq!(required("MemoryResponse-Input"), BTreeSet::new());
    // An import fact may leave its id out (one is generated).
    assert_eq!(required("Fact-Input"), set(&["content"]));
    assert_eq!(
        c.operation(&Method::POST, "/api/memory/import")["requestBody"]["content"]["application/json"]
            ["schema"]["$ref"],
        "#/components/schemas/MemoryResponse-Input"
    );
    assert_eq!(
        schemas["MemoryResponse-Input"]["properties"]["facts"]["items"]["$ref"],
        "#/components/schemas/Fact-Input"
    );
    // Manager-level fields are not in the HTTP shape; flatten merges the fact into a hit.
    for field in [
        "title",
        "expected_valid_days",
        "lastConfirmedAt",
        "confirmationCount",
    ] {
        assert!(
            schemas["Fact"]["properties"].get(field).is_none(),
            "{field}"
        );
    }
    let hit = &schemas["SearchHit"]["properties"];
    for field in ["id", "content", "score", "matchType"] {
        assert!(hit.get(field).is_some(), "{field}");
    }
    assert_eq!(hit["matchType"]["$ref"], "#/components/schemas/MatchType");
    let consts: Vec<&Value> = schemas["MatchType"]["oneOf"]
        .as_array()
        .map(|a| a.iter().map(|v| &v["const"]).collect())
        .unwrap_or_default();
    assert_eq!(
        consts,
        [
            &json!("fts5"),
            &json!("cjk"),
            &json!("substring"),
            &json!("remote"),
            &json!("vector"),
            &json!("hybrid")
        ]
    );
    // Defaults and bounds of the create body.
    let create = &schemas["FactCreateRequest"];
    assert_eq!(create["required"], json!(["content"]));
    assert_eq!(create["properties"]["category"]["default"], "context");
    assert_eq!(create["properties"]["confidence"]["default"], 0.5);
    assert_eq!(create["properties"]["confidence"]["maximum"], 1.0);
    assert_eq!(create["properties"]["content"]["minLength"], 1);
    // Query parameters are read: an optional one is not required.
    let search = c.operation(&Method::GET, "/api/memory/search")["parameters"].clone();
    let param = |name: &str| {
        search
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(param("q")["required"], true);
    assert_ne!(param("top_k")["required"], true);
    assert_eq!(param("top_k")["schema"]["maximum"], 100);
    assert_eq!(param("top_k")["schema"]["default"], 5);
    assert_eq!(param("agent")["schema"]["type"], "string");
    assert_ne!(param("mode")["required"], true);
    assert_eq!(
        param("mode")["schema"]["enum"],
        json!(["bm25", "vector", "hybrid"])
    );
}

fn deermem_at(root: &Path) -> Arc<dyn MemoryManager> {
    let cfg = MemoryConfig::default();
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    deermem::build_manager(&cfg, opts).expect("DeerMem builds on a temp root")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_manager_answers_what_the_document_says() {
    let tmp = tempfile::tempdir().expect("tmp");
    let a = app(deermem_at(tmp.path()));
    let mut c = Conformance::fetch(&a).await;
    let (get, post, patch) = (Method::GET, Method::POST, Method::PATCH);
    for (content, category) in [
        ("Prefers Rust for command-line tools", "preference"),
        ("Works on the DeerMem gateway", "workflow"),
        ("用中文写文档", "context"),
    ] {
        let r = c
            .call(
                &a,
                post.clone(),
                FACTS,
                FACTS,
                Some(json!({"content": content, "category": category})),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let r = c
        .call(&a, get.clone(), "/api/memory", "/api/memory", None)
        .await;
    assert_eq!(r.body["facts"].as_array().map(Vec::len), Some(3));
    // The real document carries the optional fields (revision, scope, schemaVersion...).
    assert!(r.body["revision"].is_u64() && r.body["facts"][0]["scope"].is_object());
    let other = r.body["facts"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["category"] == "other"))
        .expect("the non-core category");
    assert_eq!(other["categoryExtension"], "workflow");
    let id = r.body["facts"][0]["id"].as_str().expect("id").to_owned();
    c.call(
        &a,
        patch.clone(),
        FACT,
        &format!("/api/memory/facts/{id}"),
        Some(json!({"confidence": 0.75})),
    )
    .await;
    let r = c
        .call(
            &a,
            post.clone(),
            FACTS,
            FACTS,
            Some(json!({"content": "Prefers Rust for command-line tools"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "duplicate content");
    for q in ["Rust", "中文", "gateway"] {
        let r = c
            .call(
                &a,
                get.clone(),
                "/api/memory/search",
                &format!("/api/memory/search?q={}", urlencode(q)),
                None,
            )
            .await;
        assert!(r.body["count"].as_u64() >= Some(1), "{q}: {}", r.text);
        assert!(r.body["results"][0]["score"].is_number(), "{}", r.text);
    }
    let export = c
        .call(
            &a,
            get.clone(),
            "/api/memory/export",
            "/api/memory/export",
            None,
        )
        .await;
    c.call(&a, Method::DELETE, "/api/memory", "/api/memory", None)
        .await;
    let r = c
        .call(
            &a,
            post.clone(),
            "/api/memory/import",
            "/api/memory/import",
            Some(export.body.clone()),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = c
        .call(
            &a,
            get.clone(),
            "/api/memory/status",
            "/api/memory/status",
            None,
        )
        .await;
    // The real manager reports its caches, so their schema is checked here too.
    assert!(
        r.body["caches"].as_array().is_some_and(|c| !c.is_empty()),
        "{}",
        r.text
    );
    c.call(
        &a,
        get.clone(),
        "/api/memory/context",
        "/api/memory/context",
        None,
    )
    .await;
    let rebuild = "/api/memory/index/rebuild";
    let r = c.call(&a, post.clone(), rebuild, rebuild, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The request schemas never promise more than the server accepts, nor accept what it
/// refuses: bodies the schema accepts are accepted, bodies it refuses get a 422 (lax
/// coercions the server also accepts, such as `"0.5"` for a number, are left out).
#[tokio::test]
async fn request_schemas_agree_with_the_server() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let c = Conformance::fetch(&a).await;
    let v = Validator::new(&c.doc, false).expect("components");
    let schema_of = |method: &Method, template: &str| {
        c.operation(method, template)["requestBody"]["content"]["application/json"]["schema"]
            .clone()
    };
    let cases: Vec<(Method, &str, &str, Value)> = vec![
        (Method::POST, FACTS, FACTS, json!({"content": "a"})),
        (
            Method::POST,
            FACTS,
            FACTS,
            json!({"content": "a", "category": "goal", "confidence": 1}),
        ),
        (Method::POST, FACTS, FACTS, json!({"content": ""})),
        (Method::POST, FACTS, FACTS, json!({})),
        (Method::POST, FACTS, FACTS, json!({"content": 5})),
        (
            Method::POST,
            FACTS,
            FACTS,
            json!({"content": "a", "confidence": 1.5}),
        ),
        (
            Method::POST,
            FACTS,
            FACTS,
            json!({"content": "a", "confidence": -0.1}),
        ),
        (
            Method::POST,
            FACTS,
            FACTS,
            json!({"content": "a", "category": null}),
        ),
        (
            Method::POST,
            FACTS,
            FACTS,
            // (`true` is a lax coercion to 1.0, as in pydantic: left out, see above.)
            json!({"content": "a", "confidence": [true]}),
        ),
        (Method::POST, FACTS, FACTS, json!([1])),
        (Method::PATCH, FACT, "/api/memory/facts/fact_x", json!({})),
        (
            Method::PATCH,
            FACT,
            "/api/memory/facts/fact_x",
            json!({"content": null, "confidence": null}),
        ),
        (
            Method::PATCH,
            FACT,
            "/api/memory/facts/fact_x",
            json!({"content": ""}),
        ),
        (
            Method::PATCH,
            FACT,
            "/api/memory/facts/fact_x",
            json!({"confidence": 2}),
        ),
        (
            Method::PATCH,
            FACT,
            "/api/memory/facts/fact_x",
            json!({"category": 3}),
        ),
        (
            Method::POST,
            "/api/memory/import",
            "/api/memory/import",
            json!({}),
        ),
        (
            Method::POST,
            "/api/memory/import",
            "/api/memory/import",
            json!({"facts": [{"id": "fact_a", "content": "A"}]}),
        ),
        (
            Method::POST,
            "/api/memory/import",
            "/api/memory/import",
            json!({"facts": [{"content": "no id"}]}),
        ),
        (
            Method::POST,
            "/api/memory/import",
            "/api/memory/import",
            json!({"facts": {}}),
        ),
        (
            Method::POST,
            "/api/memory/import",
            "/api/memory/import",
            json!({"revision": -1}),
        ),
        (
            Method::POST,
            "/api/memory/import",
            "/api/memory/import",
            json!({"facts": [{"id": "a", "content": "b", "topics": [1]}]}),
        ),
        (
            Method::POST,
            "/api/memory/import",
            "/api/memory/import",
            json!({"user": {"workContext": {"summary": 1}}}),
        ),
        (
            Method::POST,
            "/api/memory/messages",
            "/api/memory/messages",
            json!({"thread_id": "t", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            Method::POST,
            "/api/memory/messages",
            "/api/memory/messages",
            json!({"thread_id": "", "messages": []}),
        ),
        (
            Method::POST,
            "/api/memory/messages",
            "/api/memory/messages",
            json!({"thread_id": "t"}),
        ),
        (
            Method::POST,
            "/api/memory/messages",
            "/api/memory/messages",
            json!({"messages": []}),
        ),
        (
            Method::POST,
            "/api/memory/messages",
            "/api/memory/messages",
            json!({"thread_id": "t".repeat(513), "messages": []}),
        ),
        (
            Method::POST,
            "/api/memory/messages",
            "/api/memory/messages",
            json!({"thread_id": "t", "messages": [], "trace_id": "x".repeat(257)}),
        ),
    ];
    let mut accepted = 0;
    let mut refused = 0;
    for (method, template, uri, body) in cases {
        let by_schema = v.errors(&schema_of(&method, template), &body).is_empty();
        let r = send(&a, json_req(method.clone(), uri, &body)).await;
        let by_server = r.status != StatusCode::UNPROCESSABLE_ENTITY;
        assert_eq!(
            by_schema, by_server,
            "{method} {uri} {body}: schema {by_schema}, server {} {}",
            r.status, r.text
        );
        if by_schema {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    assert!(accepted >= 7 && refused >= 15, "{accepted} / {refused}");
}

// ----------------------------------------------------------------------------------------
// The validator itself.

fn doc_with(schemas: Value) -> Value {
    json!({ "components": { "schemas": schemas } })
}

#[test]
fn validator_checks_types_required_and_nested_refs() {
    let doc = doc_with(json!({
        "Item": {"type": "object", "required": ["id"], "properties": {
            "id": {"type": "string", "minLength": 1, "maxLength": 3, "pattern": "^[a-z]*$"},
            "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 5}
        }},
        "List": {"type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/Item"}}}}
    }));
    let open = Validator::new(&doc, false).expect("doc");
    let list = json!({"$ref": "#/components/schemas/List"});
    assert!(
        open.errors(
            &list,
            &json!({"items": [{"id": "ab", "n": 2}, {"id": "c", "n": null}]})
        )
        .is_empty()
    );
    let cases = [
        (json!({"items": [{"n": 2}]}), "missing required `id`"),
        (json!({"items": [{"id": 5}]}), "is not of type"),
        (json!({"items": [{"id": "abcd"}]}), "maxLength"),
        (json!({"items": [{"id": ""}]}), "minLength"),
        (json!({"items": [{"id": "AB"}]}), "does not match"),
        (json!({"items": [{"id": "a", "n": 1.5}]}), "is not of type"),
        (json!({"items": [{"id": "a", "n": 9}]}), "maximum"),
        (json!({"items": [{"id": "a", "n": 0}]}), "minimum"),
        (json!({"items": {}}), "is not of type"),
    ];
    for (value, expected) in cases {
        let errors = open.errors(&list, &value);
        assert!(
            errors.len() == 1 && errors[0].contains(expected),
            "{value}: {errors:?}"
        );
    }
    // The path names where.
    assert!(
        open.errors(&list, &json!({"items": [{"id": "a"}, {"n": 1}]}))[0].starts_with("$.items[1]")
    );
}

#[test]
fn validator_closed_mode_refuses_undeclared_properties() {
    let doc = doc_with(json!({
        "A": {"type": "object", "properties": {"a": {"type": "string"}}},
        "Map": {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    }));
    let a = json!({"$ref": "#/components/schemas/A"});
    let value = json!({"a": "x", "b": 1});
    assert!(
        Validator::new(&doc, false)
            .expect("doc")
            .errors(&a, &value)
            .is_empty()
    );
    let closed = Validator::new(&doc, true).expect("doc");
    assert_eq!(closed.errors(&a, &value).len(), 1);
    // Declared additional properties are checked, not refused.
    let map = json!({"$ref": "#/components/schemas/Map"});
    assert!(closed.errors(&map, &json!({"a": null, "b": 1})).is_empty());
    assert_eq!(closed.errors(&map, &json!({"b": "x"})).len(), 1);
}

#[test]
fn validator_combinators_enums_and_unknown_keywords() {
    let doc = doc_with(json!({}));
    let v = Validator::new(&doc, true).expect("doc");
    let any = json!({"anyOf": [{"type": "string"}, {"type": "null"}]});
    assert!(v.errors(&any, &json!(null)).is_empty());
    assert_eq!(v.errors(&any, &json!(1)).len(), 1);
    let one = json!({"oneOf": [{"const": "a"}, {"const": "b"}]});
    assert!(v.errors(&one, &json!("b")).is_empty());
    assert_eq!(v.errors(&one, &json!("c")).len(), 1);
    let both = json!({"oneOf": [{"type": "integer"}, {"type": "number"}]});
    assert_eq!(
        v.errors(&both, &json!(1)).len(),
        1,
        "oneOf needs exactly one"
    );
    let all = json!({"allOf": [{"type": "integer"}, {"minimum": 3}]});
    assert!(v.errors(&all, &json!(4)).is_empty());
    assert_eq!(v.errors(&all, &json!(2)).len(), 1);
    assert_eq!(v.errors(&json!({"enum": [1, 2]}), &json!(3)).len(), 1);
    assert!(
        v.errors(&json!({"type": "string", "nullable": true}), &json!(null))
            .is_empty()
    );
    assert!(v.errors(&json!(true), &json!({"anything": 1})).is_empty());
    assert_eq!(v.errors(&json!(false), &json!(1)).len(), 1);
    assert!(
        v.errors(
            &json!({"description": "d", "default": 1, "format": "uint"}),
            &json!("x")
        )
        .is_empty()
    );
    // What it does not understand is an error, never a silent pass.
    assert!(v.errors(&json!({"multipleOf": 2}), &json!(3))[0].contains("unsupported keyword"));
    assert!(
        v.errors(&json!({"$ref": "#/components/schemas/Nope"}), &json!(1))[0]
            .contains("unresolvable")
    );
}
