//! The MCP server over the line-delimited transport, driven through an in-process duplex pipe
//! by a raw JSON-RPC test client: handshake, tool listing and schemas, the add → search →
//! update → delete cycle, `memory_context`, the facts resource, tool errors, malformed input,
//! and shutdown at end of input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use deermem_core::ports::MemoryManagerExt as _;
use std::sync::Arc;
use std::time::Duration;

use common::{MapManager, assert_object_schema};
use deermem::NoopManager;
use deermem_core::ports::{MemoryManager, MemoryScope};
use deermem_core::{AgentName, MemoryMode, UserId};
use deermem_mcp::{EMPTY_CONTEXT_BLOCK, McpIdentity, McpServeError, serve_io};
use serde_json::{Value, json};
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};
use tokio::task::JoinHandle;

/// Generous guard against a hung test; no assertion depends on timing.
const RECV_LIMIT: Duration = Duration::from_secs(30);

struct Client {
    writer: WriteHalf<DuplexStream>,
    lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
    server: JoinHandle<Result<(), McpServeError>>,
    next_id: i64,
}

impl Client {
    fn start(manager: Arc<dyn MemoryManager>, identity: McpIdentity) -> Self {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (sr, sw) = tokio::io::split(server_io);
        let server = tokio::spawn(serve_io(manager, identity, sr, sw));
        let (cr, cw) = tokio::io::split(client_io);
        Self {
            writer: cw,
            lines: BufReader::new(cr).lines(),
            server,
            next_id: 1,
        }
    }

    async fn send_raw(&mut self, line: &str) {
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to server");
    }

    async fn recv(&mut self) -> Value {
        let line = tokio::time::timeout(RECV_LIMIT, self.lines.next_line())
            .await
            .expect("server answered in time")
            .expect("read from server")
            .expect("server output still open");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("server sent non-JSON ({e}): {line}"))
    }

    /// Sends a request and returns the response with its id.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(&msg.to_string()).await;
        loop {
            let v = self.recv().await;
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    async fn initialize(&mut self) -> Value {
        let r = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "deermem-test", "version": "0.0.1"}
                }),
            )
            .await;
        self.send_raw(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        r
    }

    /// Calls a tool and returns (text, is_error).
    async fn call(&mut self, name: &str, arguments: Value) -> (String, bool) {
        let r = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        let result = r
            .get("result")
            .unwrap_or_else(|| panic!("tools/call {name} failed at protocol level: {r}"));
        let text = result["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("no text content: {r}"))
            .to_owned();
        (text, result["isError"] == json!(true))
    }

    async fn call_json(&mut self, name: &str, arguments: Value) -> (Value, bool) {
        let (text, err) = self.call(name, arguments).await;
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{name} text not JSON ({e}): {text}"));
        (v, err)
    }

    async fn close(mut self) -> Result<(), McpServeError> {
        // End of input for the server (the read half stays open until the server is done).
        self.writer
            .shutdown()
            .await
            .expect("close the server's input");
        tokio::time::timeout(RECV_LIMIT, self.server)
            .await
            .expect("server stopped in time")
            .expect("server task")
    }
}

fn alice() -> McpIdentity {
    McpIdentity {
        user: UserId::new("alice@example.com").expect("user"),
        agent: None,
    }
}

fn tool_names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .expect("tools array")
        .iter()
        .map(|t| t["name"].as_str().expect("name").to_owned())
        .collect()
}

#[tokio::test]
async fn initialize_reports_the_server_and_its_capabilities() {
    let mut c = Client::start(Arc::new(MapManager::new()), alice());
    let r = c.initialize().await;
    let result = &r["result"];
    assert_eq!(result["serverInfo"]["name"], "deermem");
    assert!(result["capabilities"]["tools"].is_object(), "{r}");
    assert!(result["capabilities"]["resources"].is_object(), "{r}");
    assert!(
        result["instructions"]
            .as_str()
            .is_some_and(|i| i.contains("memory_search")),
        "{r}"
    );
    assert_eq!(result["protocolVersion"], "2025-06-18");
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn tools_are_listed_with_valid_schemas() {
    let mut c = Client::start(Arc::new(MapManager::new()), alice());
    c.initialize().await;
    let list = c.request("tools/list", json!({})).await;
    assert_eq!(
        tool_names(&list),
        vec![
            "memory_search",
            "memory_add",
            "memory_update",
            "memory_delete",
            "memory_context"
        ]
    );
    for tool in list["result"]["tools"].as_array().expect("tools") {
        let name = tool["name"].as_str().expect("name");
        assert!(
            tool["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{name} has a description"
        );
        assert_object_schema(name, &tool["inputSchema"]);
    }
    // The MCP schemas are exactly the tool-mode definitions.
    for def in deermem::tools::tool_definitions() {
        let listed = list["result"]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .find(|t| t["name"] == json!(def.name))
            .expect("listed");
        assert_eq!(listed["inputSchema"], def.input_schema);
    }
    let search = &list["result"]["tools"][0];
    assert_eq!(search["annotations"]["readOnlyHint"], true);
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn add_search_update_delete_round_trip() {
    let manager = Arc::new(MapManager::new());
    let mut c = Client::start(manager.clone(), alice());
    c.initialize().await;

    let (added, err) = c
        .call_json(
            "memory_add",
            json!({"content": "Prefers oolong tea in the morning", "category": "preference"}),
        )
        .await;
    assert!(!err, "{added}");
    assert_eq!(added["status"], "added");
    let id = added["fact_id"].as_str().expect("fact id").to_owned();

    let (found, err) = c
        .call_json("memory_search", json!({"query": "oolong"}))
        .await;
    assert!(!err);
    assert_eq!(found["count"], 1);
    assert_eq!(found["results"][0]["id"], json!(id));
    assert_eq!(found["results"][0]["category"], "preference");
    assert!(
        (found["results"][0]["confidence"]
            .as_f64()
            .expect("confidence")
            - 0.7)
            .abs()
            < 1e-9
    );

    let (updated, err) = c
        .call_json(
            "memory_update",
            json!({"fact_id": id, "content": "Prefers jasmine tea in the morning"}),
        )
        .await;
    assert!(!err, "{updated}");
    assert_eq!(updated, json!({"fact_id": id, "status": "updated"}));
    let (found, _) = c
        .call_json("memory_search", json!({"query": "jasmine"}))
        .await;
    assert_eq!(found["count"], 1);
    let (found, _) = c
        .call_json("memory_search", json!({"query": "oolong"}))
        .await;
    assert_eq!(found["count"], 0);

    let (deleted, err) = c.call_json("memory_delete", json!({"fact_id": id})).await;
    assert!(!err);
    assert_eq!(deleted, json!({"fact_id": id, "status": "deleted"}));
    let (found, _) = c
        .call_json("memory_search", json!({"query": "jasmine"}))
        .await;
    assert_eq!(found, json!({"results": [], "count": 0}));

    // The writes reached the backend in alice's default bucket.
    let doc = manager
        .get_memory(alice().scope())
        .await
        .expect("get memory");
    assert!(doc.facts.is_empty());
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn tool_errors_are_reported_and_the_server_keeps_answering() {
    let mut c = Client::start(Arc::new(MapManager::new()), alice());
    c.initialize().await;

    let (v, err) = c.call_json("memory_add", json!({"content": 5})).await;
    assert!(err);
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("invalid arguments for memory_add")),
        "{v}"
    );
    let (v, err) = c.call_json("memory_add", json!({"content": "   "})).await;
    assert!(err);
    assert_eq!(v, json!({"error": "empty content"}));
    let (v, err) = c
        .call_json("memory_search", json!({"query": "tea", "mode": "semantic"}))
        .await;
    assert!(err);
    assert_eq!(
        v,
        json!({"error": "invalid arguments for memory_search: 'mode': \"semantic\" is not a search mode; use bm25, vector or hybrid"})
    );
    let (v, err) = c
        .call_json(
            "memory_update",
            json!({"fact_id": "fact_nope", "content": "x"}),
        )
        .await;
    assert!(err);
    assert_eq!(v, json!({"error": "Fact not found: fact_nope"}));
    let (v, err) = c
        .call_json("memory_delete", json!({"fact_id": "../../etc/passwd"}))
        .await;
    assert!(err);
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("Fact not found")),
        "{v}"
    );

    c.call_json("memory_add", json!({"content": "Lives in Lisbon"}))
        .await;
    let (v, err) = c
        .call_json("memory_add", json!({"content": " lives in LISBON "}))
        .await;
    assert!(err);
    assert_eq!(v, json!({"error": "Duplicate fact"}));
    let (v, err) = c
        .call_json("memory_add", json!({"content": "x y", "confidence": 3}))
        .await;
    assert!(err);
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("confidence")),
        "{v}"
    );

    // Unknown tools are a JSON-RPC invalid-params error (MCP's rule), not a crash.
    let r = c
        .request(
            "tools/call",
            json!({"name": "memory_wipe", "arguments": {}}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Unknown tool: memory_wipe")),
        "{r}"
    );

    let list = c.request("tools/list", json!({})).await;
    assert_eq!(tool_names(&list).len(), 5, "still answering: {list}");
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn malformed_json_rpc_is_answered_and_the_server_keeps_going() {
    let mut c = Client::start(Arc::new(MapManager::new()), alice());
    c.initialize().await;

    c.send_raw("{this is not json").await;
    let r = c.recv().await;
    assert_eq!(r["jsonrpc"], "2.0");
    assert_eq!(r["id"], Value::Null);
    assert_eq!(r["error"]["code"], -32700, "{r}");

    c.send_raw(r#"{"jsonrpc":"2.0","id":41,"params":{"no":"method"}}"#)
        .await;
    let r = c.recv().await;
    assert_eq!(r["id"], 41);
    assert_eq!(r["error"]["code"], -32600, "{r}");

    c.send_raw(r#"[1, 2, 3]"#).await;
    let r = c.recv().await;
    assert_eq!(r["error"]["code"], -32600, "{r}");

    let r = c.request("no/such_method", json!({})).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");

    // Blank lines are ignored and a ping still works afterwards.
    c.send_raw("   ").await;
    let r = c.request("ping", json!({})).await;
    assert!(r["result"].is_object(), "{r}");
    let (v, err) = c
        .call_json("memory_search", json!({"query": "anything"}))
        .await;
    assert!(!err);
    assert_eq!(v["count"], 0);
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn malformed_input_before_initialize_does_not_end_the_session() {
    let mut c = Client::start(Arc::new(MapManager::new()), alice());
    c.send_raw("garbage").await;
    let r = c.recv().await;
    assert_eq!(r["error"]["code"], -32700, "{r}");
    c.send_raw(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    let r = c.initialize().await;
    assert_eq!(r["result"]["serverInfo"]["name"], "deermem", "{r}");
    let list = c.request("tools/list", json!({})).await;
    assert_eq!(tool_names(&list).len(), 5);
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn memory_context_returns_the_wrapped_block() {
    let mut c = Client::start(Arc::new(MapManager::new()), alice());
    c.initialize().await;
    let (text, err) = c.call("memory_context", json!({})).await;
    assert!(!err);
    assert_eq!(text, EMPTY_CONTEXT_BLOCK);
    c.call_json(
        "memory_add",
        json!({"content": "Works on compilers", "category": "context"}),
    )
    .await;
    let (text, err) = c.call("memory_context", json!({})).await;
    assert!(!err);
    assert!(text.starts_with("<memory>\n"), "{text}");
    assert!(text.ends_with("</memory>\n"), "{text}");
    assert!(text.contains("Works on compilers"), "{text}");
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn the_facts_resource_lists_the_callers_facts() {
    let manager = Arc::new(MapManager::new());
    // Another user's fact must not show up.
    let bob = MemoryScope::user(UserId::new("bob").expect("user"));
    manager
        .create_fact(deermem_core::ports::NewFact::new("Bob's secret"), bob)
        .await
        .expect("seed");
    let mut c = Client::start(manager, alice());
    c.initialize().await;
    let (added, _) = c
        .call_json("memory_add", json!({"content": "Speaks Portuguese"}))
        .await;

    let list = c.request("resources/list", json!({})).await;
    let resources = list["result"]["resources"].as_array().expect("resources");
    assert_eq!(resources.len(), 1, "{list}");
    assert_eq!(resources[0]["uri"], "memory://facts");
    assert_eq!(resources[0]["mimeType"], "application/json");

    let read = c
        .request("resources/read", json!({"uri": "memory://facts"}))
        .await;
    let contents = &read["result"]["contents"][0];
    assert_eq!(contents["uri"], "memory://facts");
    let body: Value =
        serde_json::from_str(contents["text"].as_str().expect("text")).expect("facts JSON");
    assert_eq!(body["count"], 1);
    assert_eq!(body["facts"][0]["id"], added["fact_id"]);
    assert_eq!(body["facts"][0]["content"], "Speaks Portuguese");

    let missing = c
        .request("resources/read", json!({"uri": "memory://../secrets"}))
        .await;
    assert!(missing["error"]["code"].is_i64(), "{missing}");
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn the_configured_agent_bucket_is_used() {
    let manager = Arc::new(MapManager::new());
    let identity = McpIdentity {
        user: UserId::new("carol").expect("user"),
        agent: Some(AgentName::parse("Coder").expect("agent")),
    };
    let mut c = Client::start(manager.clone(), identity.clone());
    c.initialize().await;
    let (added, err) = c
        .call_json("memory_add", json!({"content": "Uses Neovim"}))
        .await;
    assert!(!err);
    let coder = manager.get_memory(identity.scope()).await.expect("get");
    assert_eq!(coder.facts.len(), 1);
    assert_eq!(json!(coder.facts[0].id), added["fact_id"]);
    let default_bucket = manager
        .get_memory(MemoryScope::user(identity.user.clone()))
        .await
        .expect("get");
    assert!(
        default_bucket.facts.is_empty(),
        "writes stay in the agent bucket"
    );
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn unsupported_operations_are_tool_errors_on_a_minimal_backend() {
    let mut c = Client::start(Arc::new(NoopManager::new(MemoryMode::Tool)), alice());
    c.initialize().await;
    let list = c.request("tools/list", json!({})).await;
    assert_eq!(tool_names(&list), vec!["memory_search", "memory_context"]);
    let (v, err) = c
        .call_json("memory_add", json!({"content": "Likes tea"}))
        .await;
    assert!(err);
    assert_eq!(
        v,
        json!({"error": "memory backend NoopMemoryManager does not support create_fact"})
    );
    let (v, err) = c.call_json("memory_search", json!({"query": "tea"})).await;
    assert!(!err);
    assert_eq!(v["count"], 0);
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn end_of_input_before_initialize_is_an_initialize_error() {
    let c = Client::start(Arc::new(MapManager::new()), alice());
    let outcome = c.close().await;
    assert!(
        matches!(outcome, Err(McpServeError::Initialize(_))),
        "{outcome:?}"
    );
}

/// A known method whose params do not fit it is `-32602` with what is wrong, not "Method not
/// found"; an unknown method still is.
#[tokio::test]
async fn bad_params_of_known_methods_are_invalid_params() {
    let mut c = Client::start(Arc::new(MapManager::new()), alice());
    c.initialize().await;
    let cases = [
        (
            "tools/call",
            json!({"name": "memory_search", "arguments": ["tea"]}),
            "'arguments' must be an object",
        ),
        ("tools/call", json!({"arguments": {}}), "'name'"),
        ("tools/call", json!({"name": 5}), "'name' must be a string"),
        ("resources/read", json!({}), "'uri'"),
        ("tools/list", json!(5), "params must be an object"),
    ];
    for (method, params, wanted) in cases {
        let r = c.request(method, params.clone()).await;
        assert_eq!(r["error"]["code"], -32602, "{method} {params}: {r}");
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(wanted), "{method} {params}: {r}");
    }
    // No params at all.
    let id = c.next_id;
    c.next_id += 1;
    c.send_raw(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call"}).to_string())
        .await;
    let r = c.recv().await;
    assert_eq!(r["id"], id, "{r}");
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("params are required")),
        "{r}"
    );
    let r = c.request("no/such_method", json!({})).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
    c.close().await.expect("clean shutdown");
}

/// JavaScript turns a broken emoji into a lone surrogate escape: the request is answered with
/// its own id (the surrogate read as U+FFFD), so the client's call completes.
#[tokio::test]
async fn a_lone_surrogate_is_answered_with_the_request_id() {
    let manager = Arc::new(MapManager::new());
    let mut c = Client::start(manager.clone(), alice());
    c.initialize().await;
    c.send_raw(
        r#"{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"memory_add","arguments":{"content":"broken \ud83c emoji"}}}"#,
    )
    .await;
    let r = c.recv().await;
    assert_eq!(r["id"], 77, "{r}");
    assert_eq!(r["result"]["isError"], false, "{r}");
    let stored = manager.get_memory(alice().scope()).await.expect("get");
    assert_eq!(stored.facts[0].content, "broken \u{FFFD} emoji");
    // A proper pair is kept as the character it encodes.
    c.send_raw(
        r#"{"jsonrpc":"2.0","id":78,"method":"tools/call","params":{"name":"memory_add","arguments":{"content":"tea \ud83c\udf75"}}}"#,
    )
    .await;
    let r = c.recv().await;
    assert_eq!(r["id"], 78, "{r}");
    let stored = manager.get_memory(alice().scope()).await.expect("get");
    assert_eq!(stored.facts[1].content, "tea \u{1F375}");
    c.close().await.expect("clean shutdown");
}

/// The instructions describe the tools the server lists and no other.
#[tokio::test]
async fn instructions_describe_only_the_listed_tools() {
    let mut c = Client::start(Arc::new(NoopManager::new(MemoryMode::Tool)), alice());
    let r = c.initialize().await;
    let text = r["result"]["instructions"].as_str().expect("instructions");
    assert!(text.contains("memory_search"), "{text}");
    assert!(text.contains("memory_context"), "{text}");
    for absent in ["memory_add", "memory_update", "memory_delete"] {
        assert!(!text.contains(absent), "{absent} in {text}");
    }
    c.close().await.expect("clean shutdown");
    let mut c = Client::start(Arc::new(MapManager::new()), alice());
    let r = c.initialize().await;
    let text = r["result"]["instructions"].as_str().expect("instructions");
    for present in [
        "memory_search",
        "memory_add",
        "memory_update",
        "memory_delete",
        "memory_context",
    ] {
        assert!(text.contains(present), "{present} missing from {text}");
    }
    c.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn an_identity_naming_another_users_bucket_is_refused_before_serving() {
    let manager: Arc<dyn MemoryManager> = Arc::new(MapManager::new());
    // `victim@corp.com` is stored in this bucket; as a user id it would act as the victim.
    let identity = McpIdentity {
        user: UserId::new("victim-corp-com-7b46e3848256709a").unwrap(),
        agent: None,
    };
    let (_client_io, server_io) = tokio::io::duplex(1 << 10);
    let (sr, sw) = tokio::io::split(server_io);
    let outcome = serve_io(manager, identity, sr, sw).await;
    match outcome {
        Err(e @ McpServeError::Identity(_)) => assert!(
            e.to_string()
                .contains("storage bucket derived from another user id"),
            "{e}"
        ),
        other => panic!("expected a refused identity: {other:?}"),
    }
}
