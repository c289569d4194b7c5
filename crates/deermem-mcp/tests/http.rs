//! The MCP server over streamable HTTP on 127.0.0.1 with two bearer tokens: refusal without a
//! valid token, the add → search → update → delete cycle, per-user isolation (tools and the
//! facts resource), tool errors, and malformed JSON-RPC answered with JSON-RPC errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use deermem_core::ports::MemoryManagerExt as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{MapManager, assert_object_schema};
use deermem_core::ports::MemoryScope;
use deermem_core::{AgentName, UserId};
use deermem_mcp::{HttpOptions, TokenAuth, http_router, http_router_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

const PROTOCOL: &str = "2025-06-18";

struct Server {
    url: String,
    http: reqwest::Client,
    manager: Arc<MapManager>,
    next_id: i64,
}

fn token_table() -> TokenAuth {
    let table: HashMap<&'static str, UserId> = HashMap::from([
        ("tok-alice", UserId::new("alice@example.com").expect("user")),
        ("tok-bob", UserId::new("bob").expect("user")),
    ]);
    Arc::new(move |token: &str| table.get(token).cloned())
}

async fn start_with(router: impl FnOnce(Arc<MapManager>) -> axum::Router) -> Server {
    let manager = Arc::new(MapManager::new());
    let app = router(manager.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Server {
        url: format!("http://{addr}/mcp"),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client"),
        manager,
        next_id: 1,
    }
}

async fn start() -> Server {
    start_with(|m| http_router(m, token_table(), None)).await
}

/// Reads a JSON-RPC message from a JSON body or from the first `data:` line of an SSE body.
fn parse_body(content_type: &str, body: &str) -> Value {
    if content_type.starts_with("text/event-stream") {
        let data = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .find(|d| !d.is_empty())
            .unwrap_or_else(|| panic!("no data in SSE body: {body}"));
        serde_json::from_str(data).expect("SSE data is JSON")
    } else {
        // Plain-text refusals (e.g. a 403 from the Host check) come back as a JSON string.
        serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()))
    }
}

impl Server {
    async fn post_raw(
        &self,
        token: Option<&str>,
        body: String,
    ) -> (StatusCode, Value, reqwest::header::HeaderMap) {
        self.post_with(token, body, &[("mcp-protocol-version", PROTOCOL)])
            .await
    }

    async fn post_with(
        &self,
        token: Option<&str>,
        body: String,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value, reqwest::header::HeaderMap) {
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("request reaches the server");
        let status = resp.status();
        let headers = resp.headers().clone();
        let ct = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let text = resp.text().await.expect("body");
        let value = if text.trim().is_empty() {
            Value::Null
        } else {
            parse_body(&ct, &text)
        };
        (status, value, headers)
    }

    async fn request(&mut self, token: &str, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let (status, value, _) = self.post_raw(Some(token), body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{method}: {value}");
        assert_eq!(value["id"], json!(id), "{value}");
        value
    }

    async fn initialize(&mut self, token: &str) -> Value {
        let r = self
            .request(
                token,
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "deermem-http-test", "version": "0.0.1"}
                }),
            )
            .await;
        let (status, _, _) = self
            .post_raw(
                Some(token),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        r
    }

    async fn call(&mut self, token: &str, name: &str, arguments: Value) -> (Value, bool) {
        let r = self
            .request(
                token,
                "tools/call",
                json!({"name": name, "arguments": arguments}),
            )
            .await;
        let result = r
            .get("result")
            .unwrap_or_else(|| panic!("tools/call {name} failed at protocol level: {r}"));
        let text = result["content"][0]["text"].as_str().expect("text content");
        let v =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {text}"));
        (v, result["isError"] == json!(true))
    }

    async fn facts_resource(&mut self, token: &str) -> Value {
        let r = self
            .request(token, "resources/read", json!({"uri": "memory://facts"}))
            .await;
        let text = r["result"]["contents"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("no resource text: {r}"));
        serde_json::from_str(text).expect("facts JSON")
    }
}

#[tokio::test]
async fn requests_without_a_valid_token_are_refused() {
    let s = start().await;
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                   "clientInfo": {"name": "x", "version": "1"}}
    })
    .to_string();
    for token in [None, Some("tok-mallory"), Some("")] {
        let (status, body, headers) = s.post_raw(token, init.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "token {token:?}");
        assert!(
            headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("Bearer")),
            "{headers:?}"
        );
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains("Bearer")),
            "{body}"
        );
    }
    // The token is checked before the body is even parsed.
    let (status, _, _) = s.post_raw(None, "{broken".into()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A wrong scheme is refused too.
    let resp = s
        .http
        .post(&s.url)
        .header("authorization", "Basic dG9rLWFsaWNlOg==")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // Nothing was written for anyone.
    let doc = s
        .manager
        .get_memory(MemoryScope::user(
            UserId::new("alice@example.com").expect("user"),
        ))
        .await
        .expect("get");
    assert!(doc.facts.is_empty());
}

#[tokio::test]
async fn initialize_and_list_tools_over_http() {
    let mut s = start().await;
    let r = s.initialize("tok-alice").await;
    assert_eq!(r["result"]["serverInfo"]["name"], "deermem");
    let list = s.request("tok-alice", "tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(
        names,
        vec![
            "memory_search",
            "memory_add",
            "memory_update",
            "memory_delete",
            "memory_context"
        ]
    );
    for t in tools {
        assert_object_schema(t["name"].as_str().expect("name"), &t["inputSchema"]);
    }
}

#[tokio::test]
async fn add_search_update_delete_over_http() {
    let mut s = start().await;
    s.initialize("tok-alice").await;
    let (added, err) = s
        .call(
            "tok-alice",
            "memory_add",
            json!({"content": "Rides a cargo bike to work"}),
        )
        .await;
    assert!(!err, "{added}");
    let id = added["fact_id"].as_str().expect("id").to_owned();
    let (found, _) = s
        .call("tok-alice", "memory_search", json!({"query": "bike"}))
        .await;
    assert_eq!(found["count"], 1);
    assert_eq!(found["results"][0]["id"], json!(id));
    let (updated, err) = s
        .call(
            "tok-alice",
            "memory_update",
            json!({"fact_id": id, "content": "Rides an e-bike to work"}),
        )
        .await;
    assert!(!err);
    assert_eq!(updated["status"], "updated");
    let (found, _) = s
        .call("tok-alice", "memory_search", json!({"query": "e-bike"}))
        .await;
    assert_eq!(found["results"][0]["content"], "Rides an e-bike to work");
    let (deleted, err) = s
        .call("tok-alice", "memory_delete", json!({"fact_id": id}))
        .await;
    assert!(!err);
    assert_eq!(deleted["status"], "deleted");
    let (found, _) = s
        .call("tok-alice", "memory_search", json!({"query": "bike"}))
        .await;
    assert_eq!(found["count"], 0);
}

#[tokio::test]
async fn each_token_sees_only_its_own_facts() {
    let mut s = start().await;
    s.initialize("tok-alice").await;
    s.initialize("tok-bob").await;
    let (a, _) = s
        .call(
            "tok-alice",
            "memory_add",
            json!({"content": "Alice keeps bees"}),
        )
        .await;
    let (b, _) = s
        .call(
            "tok-bob",
            "memory_add",
            json!({"content": "Bob keeps chickens"}),
        )
        .await;
    let (a_id, b_id) = (a["fact_id"].clone(), b["fact_id"].clone());

    let (found, _) = s
        .call("tok-alice", "memory_search", json!({"query": "keeps"}))
        .await;
    assert_eq!(found["count"], 1);
    assert_eq!(found["results"][0]["id"], a_id);
    let (found, _) = s
        .call("tok-bob", "memory_search", json!({"query": "keeps"}))
        .await;
    assert_eq!(found["count"], 1);
    assert_eq!(found["results"][0]["id"], b_id);

    let alice_facts = s.facts_resource("tok-alice").await;
    assert_eq!(alice_facts["count"], 1);
    assert_eq!(alice_facts["facts"][0]["content"], "Alice keeps bees");
    let bob_facts = s.facts_resource("tok-bob").await;
    assert_eq!(bob_facts["count"], 1);
    assert_eq!(bob_facts["facts"][0]["content"], "Bob keeps chickens");

    // Bob cannot change or delete Alice's fact by id.
    let (v, err) = s
        .call("tok-bob", "memory_delete", json!({"fact_id": a_id.clone()}))
        .await;
    assert!(err);
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("Fact not found")),
        "{v}"
    );
    let (v, err) = s
        .call(
            "tok-bob",
            "memory_update",
            json!({"fact_id": a_id.clone(), "content": "hijacked"}),
        )
        .await;
    assert!(err, "{v}");
    let alice_facts = s.facts_resource("tok-alice").await;
    assert_eq!(alice_facts["facts"][0]["content"], "Alice keeps bees");

    // Bob's memory_context shows only Bob.
    let r = s
        .request(
            "tok-bob",
            "tools/call",
            json!({"name": "memory_context", "arguments": {}}),
        )
        .await;
    let block = r["result"]["content"][0]["text"].as_str().expect("block");
    assert!(
        block.contains("Bob keeps chickens") && !block.contains("Alice"),
        "{block}"
    );
}

#[tokio::test]
async fn malformed_json_rpc_gets_a_json_rpc_error_and_the_server_keeps_answering() {
    let mut s = start().await;
    s.initialize("tok-alice").await;
    let (status, body, _) = s.post_raw(Some("tok-alice"), "{broken".into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], Value::Null);
    assert_eq!(body["error"]["code"], -32700, "{body}");

    let (status, body, _) = s
        .post_raw(
            Some("tok-alice"),
            r#"{"jsonrpc":"2.0","id":"x1","params":{}}"#.into(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["id"], "x1");
    assert_eq!(body["error"]["code"], -32600, "{body}");

    let (v, err) = s
        .call("tok-alice", "memory_search", json!({"query": 12}))
        .await;
    assert!(err);
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("'query'")),
        "{v}"
    );

    let list = s.request("tok-alice", "tools/list", json!({})).await;
    assert!(
        list["result"]["tools"].is_array(),
        "still answering: {list}"
    );
}

#[tokio::test]
async fn the_agent_option_selects_the_bucket() {
    let mut s = start_with(|m| {
        http_router_with(
            m,
            token_table(),
            Some(AgentName::parse("planner").expect("agent")),
            HttpOptions {
                path: "/memory-mcp/".into(),
                ..HttpOptions::default()
            },
        )
    })
    .await;
    s.url = s.url.replace("/mcp", "/memory-mcp");
    s.initialize("tok-alice").await;
    let (added, err) = s
        .call(
            "tok-alice",
            "memory_add",
            json!({"content": "Plans sprints on Mondays"}),
        )
        .await;
    assert!(!err);
    let planner = s
        .manager
        .get_memory(MemoryScope::new(
            Some(UserId::new("alice@example.com").expect("user")),
            Some(AgentName::parse("planner").expect("agent")),
        ))
        .await
        .expect("get");
    assert_eq!(planner.facts.len(), 1);
    assert_eq!(json!(planner.facts[0].id), added["fact_id"]);
}

#[tokio::test]
async fn allowed_hosts_are_enforced_when_configured() {
    let s = start_with(|m| {
        http_router_with(
            m,
            token_table(),
            None,
            HttpOptions {
                allowed_hosts: Some(vec!["memory.example.com".into()]),
                ..HttpOptions::default()
            },
        )
    })
    .await;
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                   "clientInfo": {"name": "x", "version": "1"}}
    })
    .to_string();
    let (status, body, _) = s.post_raw(Some("tok-alice"), body).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a 127.0.0.1 Host is refused when only memory.example.com is allowed: {body}"
    );
}

/// A client on the 2026-07-28 protocol sends no `initialize`: each request carries its own
/// protocol metadata. The bearer identity still reaches the handler on that path.
#[tokio::test]
async fn per_request_protocol_metadata_path_keeps_the_token_identity() {
    let s = start().await;
    let call = |id: i64, name: &str, arguments: Value| {
        json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {
                "name": name, "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {}
                }
            }
        })
        .to_string()
    };
    let headers = |name: &'static str| {
        [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", name),
        ]
    };
    let (status, body, _) = s
        .post_with(
            Some("tok-bob"),
            call(1, "memory_add", json!({"content": "Bob bakes sourdough"})),
            &headers("memory_add"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_ne!(body["result"]["isError"], json!(true), "{body}");
    let bob = s
        .manager
        .get_memory(MemoryScope::user(UserId::new("bob").expect("user")))
        .await
        .expect("get");
    assert_eq!(bob.facts.len(), 1);
    assert_eq!(bob.facts[0].content, "Bob bakes sourdough");
    let (_, body, _) = s
        .post_with(
            Some("tok-alice"),
            call(2, "memory_search", json!({"query": "sourdough"})),
            &headers("memory_search"),
        )
        .await;
    let text = body["result"]["content"][0]["text"].as_str().expect("text");
    let found: Value = serde_json::from_str(text).expect("JSON");
    assert_eq!(found["count"], 0, "alice does not see bob's fact: {found}");
}

fn init_body(id: i64) -> String {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                   "clientInfo": {"name": "x", "version": "1"}}
    })
    .to_string()
}

/// The endpoint answers plain JSON, so a client that accepts JSON is served whatever else its
/// `Accept` says; one that accepts neither JSON nor anything is still refused.
#[tokio::test]
async fn clients_accepting_json_are_served() {
    let s = start().await;
    for accept in [Some("*/*"), Some("application/json"), None] {
        let mut req = s
            .http
            .post(&s.url)
            .bearer_auth("tok-alice")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", PROTOCOL)
            .body(init_body(1));
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let resp = req.send().await.expect("request");
        assert_eq!(resp.status(), StatusCode::OK, "Accept {accept:?}");
        let v: Value = resp.json().await.expect("JSON body");
        assert_eq!(v["id"], 1, "Accept {accept:?}: {v}");
        assert_eq!(v["result"]["serverInfo"]["name"], "deermem");
    }
    let resp = s
        .http
        .post(&s.url)
        .bearer_auth("tok-alice")
        .header("content-type", "application/json")
        .header("accept", "text/html")
        .body(init_body(2))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
}

/// There is no OAuth here: the discovery documents and dynamic client registration are plain
/// 404s (an OAuth-capable client then uses its configured token), while the endpoint itself
/// still wants a token.
#[tokio::test]
async fn oauth_discovery_paths_are_not_found_without_a_token() {
    let s = start().await;
    let base = s.url.trim_end_matches("/mcp").to_owned();
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration",
    ] {
        let resp = s
            .http
            .get(format!("{base}{path}"))
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let resp = s
        .http
        .post(format!("{base}/register"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let (status, _, _) = s.post_raw(None, init_body(1)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// A browser's preflight is answered for a configured origin (without a token, which a
/// preflight never carries), and refused CORS headers for any other origin.
#[tokio::test]
async fn cors_preflights_follow_the_configured_origins() {
    let s = start_with(|m| {
        http_router_with(
            m,
            token_table(),
            None,
            HttpOptions {
                cors_origins: vec!["http://localhost:6274".into()],
                ..HttpOptions::default()
            },
        )
    })
    .await;
    let preflight = |origin: &'static str| {
        s.http
            .request(reqwest::Method::OPTIONS, &s.url)
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type, mcp-protocol-version",
            )
            .send()
    };
    let resp = preflight("http://localhost:6274").await.expect("request");
    assert!(resp.status().is_success(), "{}", resp.status());
    let h = resp.headers();
    assert_eq!(
        h.get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some("http://localhost:6274")
    );
    let allowed_headers = h
        .get("access-control-allow-headers")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(
        allowed_headers.contains("authorization"),
        "{allowed_headers}"
    );
    let methods = h
        .get("access-control-allow-methods")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(methods.contains("POST"), "{methods}");
    let resp = preflight("http://evil.example").await.expect("request");
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    // The real request still needs its token, and carries the CORS header.
    let resp = s
        .http
        .post(&s.url)
        .header("origin", "http://localhost:6274")
        .bearer_auth("tok-alice")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", PROTOCOL)
        .body(init_body(1))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some("http://localhost:6274")
    );
    // Without the option there are no CORS answers: the preflight meets the token check.
    let plain = start().await;
    let resp = plain
        .http
        .request(reqwest::Method::OPTIONS, &plain.url)
        .header("origin", "http://localhost:6274")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

/// A body over the limit is answered with a JSON-RPC error body, not plain text.
#[tokio::test]
async fn an_oversized_body_gets_a_json_rpc_error() {
    let s = start_with(|m| {
        http_router_with(
            m,
            token_table(),
            None,
            HttpOptions {
                max_body_bytes: 1024,
                ..HttpOptions::default()
            },
        )
    })
    .await;
    let big = json!({
        "jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "memory_add", "arguments": {"content": "x".repeat(4096)}}
    })
    .to_string();
    let (status, body, headers) = s.post_raw(Some("tok-alice"), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("1024 bytes")),
        "{body}"
    );
}

/// Over HTTP too: a lone surrogate is read as U+FFFD and answered with the request's id, and
/// bad params of a known method are `-32602`.
#[tokio::test]
async fn lone_surrogates_and_bad_params_are_answered_over_http() {
    let mut s = start().await;
    s.initialize("tok-alice").await;
    let (status, body, _) = s
        .post_raw(
            Some("tok-alice"),
            r#"{"jsonrpc":"2.0","id":31,"method":"tools/call","params":{"name":"memory_add","arguments":{"content":"broken \ud83c emoji"}}}"#.into(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], 31, "{body}");
    assert_eq!(body["result"]["isError"], false, "{body}");
    let facts = s.facts_resource("tok-alice").await;
    assert_eq!(facts["facts"][0]["content"], "broken \u{FFFD} emoji");
    for (params, wanted) in [
        (
            json!({"name": "memory_search", "arguments": ["tea"]}),
            "'arguments' must be an object",
        ),
        (json!({"name": 5}), "'name' must be a string"),
    ] {
        let (_, body, _) = s
            .post_raw(
                Some("tok-alice"),
                json!({"jsonrpc": "2.0", "id": 32, "method": "tools/call", "params": params})
                    .to_string(),
            )
            .await;
        assert_eq!(body["id"], 32, "{body}");
        assert_eq!(body["error"]["code"], -32602, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(wanted)),
            "{body}"
        );
    }
    let (_, body, _) = s
        .post_raw(
            Some("tok-alice"),
            json!({"jsonrpc": "2.0", "id": 33, "method": "resources/read", "params": {}})
                .to_string(),
        )
        .await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
}

#[tokio::test]
async fn a_token_whose_user_names_another_users_bucket_is_refused() {
    let table: HashMap<&'static str, UserId> = HashMap::from([(
        "tok-m",
        UserId::new("victim-corp-com-7b46e3848256709a").expect("user"),
    )]);
    let auth: TokenAuth = Arc::new(move |token: &str| table.get(token).cloned());
    let s = start_with(|m| http_router(m, auth, None)).await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}});
    let (status, body, _) = s.post_raw(Some("tok-m"), init.to_string()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("storage bucket derived from another user id")),
        "{body}"
    );
}
