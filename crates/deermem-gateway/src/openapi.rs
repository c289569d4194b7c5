//! The OpenAPI 3.1 description of the gateway, built by hand from one route table
//! ([`ROUTES`]); a test checks that the router serves exactly these routes.

use serde_json::{Map, Value, json};

/// One route of the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    /// HTTP method, upper case.
    pub method: &'static str,
    /// Path template (`{fact_id}` for parameters).
    pub path: &'static str,
    /// OpenAPI operation id.
    pub operation_id: &'static str,
    /// One-line summary.
    pub summary: &'static str,
    /// Whether the route needs an authenticated caller.
    pub authenticated: bool,
    /// Whether the route answers 503 when `memory.enabled` is false.
    pub needs_enabled: bool,
}

const fn api(
    method: &'static str,
    path: &'static str,
    operation_id: &'static str,
    summary: &'static str,
) -> RouteInfo {
    RouteInfo {
        method,
        path,
        operation_id,
        summary,
        authenticated: true,
        needs_enabled: true,
    }
}

const fn open(
    method: &'static str,
    path: &'static str,
    operation_id: &'static str,
    summary: &'static str,
) -> RouteInfo {
    RouteInfo {
        method,
        path,
        operation_id,
        summary,
        authenticated: false,
        needs_enabled: false,
    }
}

/// Every route the gateway serves.
pub const ROUTES: &[RouteInfo] = &[
    api(
        "GET",
        "/api/memory",
        "get_memory",
        "The caller's memory document",
    ),
    api(
        "DELETE",
        "/api/memory",
        "clear_memory",
        "Clear memory (all agents, or one with ?agent=)",
    ),
    api(
        "POST",
        "/api/memory/reload",
        "reload_memory",
        "Re-read storage and return the document",
    ),
    api(
        "POST",
        "/api/memory/facts",
        "create_fact",
        "Create a fact; returns the whole document",
    ),
    api(
        "PATCH",
        "/api/memory/facts/{fact_id}",
        "update_fact",
        "Update a fact's given fields",
    ),
    api(
        "DELETE",
        "/api/memory/facts/{fact_id}",
        "delete_fact",
        "Delete a fact",
    ),
    api(
        "GET",
        "/api/memory/export",
        "export_memory",
        "Export the document (backup format)",
    ),
    api(
        "POST",
        "/api/memory/import",
        "import_memory",
        "Replace the bucket with a document",
    ),
    RouteInfo {
        needs_enabled: false,
        ..api(
            "GET",
            "/api/memory/config",
            "get_memory_config",
            "The memory configuration (secrets redacted)",
        )
    },
    api(
        "GET",
        "/api/memory/status",
        "get_memory_status",
        "Configuration plus document",
    ),
    api(
        "POST",
        "/api/memory/messages",
        "add_messages",
        "Queue a conversation turn for extraction",
    ),
    api(
        "GET",
        "/api/memory/context",
        "get_memory_context",
        "The injection block and its SHA-256",
    ),
    api(
        "GET",
        "/api/memory/search",
        "search_memory",
        "Ranked facts for a query",
    ),
    api(
        "POST",
        "/api/memory/index/rebuild",
        "rebuild_index",
        "Rebuild the derived search index (warm)",
    ),
    api(
        "GET",
        "/api/threads/{thread_id}/runs/{run_id}/events",
        "list_run_events",
        "A run's recorded events (run-level memory identity)",
    ),
    open("GET", "/healthz", "healthz", "The process is up"),
    open("GET", "/readyz", "readyz", "The gateway is ready to serve"),
    open("GET", "/metrics", "metrics", "Prometheus metrics"),
    open("GET", "/openapi.json", "openapi", "This document"),
];

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

fn error_response(description: &str) -> Value {
    json!({ "description": description, "content": json_content(schema_ref("HTTPError")) })
}

fn agent_param() -> Value {
    json!({
        "name": "agent", "in": "query", "required": false,
        "description": "Agent bucket (^[A-Za-z0-9-]+$, case-insensitive, or __default__). Absent: the default bucket.",
        "schema": { "type": "string" }
    })
}

fn query_param(name: &str, required: bool, schema: Value, description: &str) -> Value {
    json!({ "name": name, "in": "query", "required": required, "schema": schema, "description": description })
}

fn fact_id_param() -> Value {
    json!({
        "name": "fact_id", "in": "path", "required": true,
        "description": "Fact id: [A-Za-z0-9_-]+, at most 200 bytes.",
        "schema": { "type": "string", "pattern": "^[A-Za-z0-9_-]+$", "maxLength": 200 }
    })
}

fn body(schema: &str) -> Value {
    json!({ "required": true, "content": json_content(schema_ref(schema)) })
}

/// Parameters, request body and responses of one route.
fn operation(route: &RouteInfo) -> Value {
    let mut params: Vec<Value> = Vec::new();
    let mut request_body = Value::Null;
    let mut responses = Map::new();
    let ok =
        |schema: &str| json!({ "description": "OK", "content": json_content(schema_ref(schema)) });
    match (route.method, route.path) {
        ("GET" | "DELETE", "/api/memory")
        | ("POST", "/api/memory/reload")
        | ("GET", "/api/memory/export") => {
            params.push(agent_param());
            responses.insert("200".into(), ok("MemoryResponse"));
        }
        ("POST", "/api/memory/facts") => {
            params.push(agent_param());
            request_body = body("FactCreateRequest");
            responses.insert("200".into(), ok("MemoryResponse"));
            responses.insert("409".into(), error_response("Duplicate content, a concurrent change, or the new fact was evicted by the capacity policy"));
        }
        ("PATCH", "/api/memory/facts/{fact_id}") => {
            params.push(fact_id_param());
            params.push(agent_param());
            request_body = body("FactPatchRequest");
            responses.insert("200".into(), ok("MemoryResponse"));
            responses.insert("404".into(), error_response("No such fact"));
        }
        ("DELETE", "/api/memory/facts/{fact_id}") => {
            params.push(fact_id_param());
            params.push(agent_param());
            responses.insert("200".into(), ok("MemoryResponse"));
            responses.insert("404".into(), error_response("No such fact"));
        }
        ("POST", "/api/memory/import") => {
            params.push(agent_param());
            request_body = body("MemoryResponse");
            responses.insert("200".into(), ok("MemoryResponse"));
        }
        ("GET", "/api/memory/config") => {
            responses.insert("200".into(), ok("MemoryConfigResponse"));
        }
        ("GET", "/api/memory/status") => {
            params.push(agent_param());
            responses.insert("200".into(), ok("MemoryStatusResponse"));
        }
        ("POST", "/api/memory/messages") => {
            params.push(agent_param());
            request_body = body("MessagesRequest");
            responses.insert(
                "202".into(),
                json!({ "description": "Queued", "content": json_content(schema_ref("Accepted")) }),
            );
        }
        ("GET", "/api/memory/context") => {
            params.push(agent_param());
            params.push(query_param(
                "thread_id",
                false,
                json!({"type": "string", "maxLength": 512}),
                "The thread the block is for.",
            ));
            params.push(query_param(
                "run_id",
                false,
                json!({"type": "string", "maxLength": 256}),
                "The run (needs thread_id).",
            ));
            responses.insert("200".into(), ok("ContextResponse"));
        }
        ("GET", "/api/threads/{thread_id}/runs/{run_id}/events") => {
            for (name, description) in [
                (
                    "thread_id",
                    "The thread: 1-256 characters of [A-Za-z0-9._:@+=~-].",
                ),
                (
                    "run_id",
                    "The run: 1-256 characters of [A-Za-z0-9._:@+=~-].",
                ),
            ] {
                params.push(json!({
                    "name": name, "in": "path", "required": true, "description": description,
                    "schema": { "type": "string", "pattern": "^[A-Za-z0-9._:@+=~-]+$", "maxLength": 256 }
                }));
            }
            params.push(query_param(
                "event_types",
                false,
                json!({"type": "string"}),
                "Comma-separated event types to keep (e.g. context:memory).",
            ));
            params.push(query_param(
                "limit",
                false,
                json!({"type": "integer", "minimum": 1, "maximum": 2000, "default": 500}),
                "At most this many events, oldest first.",
            ));
            params.push(query_param(
                "after_seq",
                false,
                json!({"type": "integer", "minimum": 1}),
                "Only events with a larger seq.",
            ));
            responses.insert(
                "200".into(),
                json!({ "description": "OK", "content": json_content(json!({"type": "array", "items": schema_ref("RunEvent")})) }),
            );
            responses.insert(
                "404".into(),
                error_response("The caller has no event in this thread or run"),
            );
        }
        ("GET", "/api/memory/search") => {
            params.push(query_param(
                "q",
                true,
                json!({"type": "string"}),
                "Query text.",
            ));
            params.push(query_param(
                "top_k",
                false,
                json!({"type": "integer", "minimum": 1, "maximum": 100, "default": 5}),
                "Result cap.",
            ));
            params.push(query_param(
                "category",
                false,
                json!({"type": "string"}),
                "Only this category (applied before the cap).",
            ));
            params.push(agent_param());
            responses.insert("200".into(), ok("SearchResponse"));
        }
        ("POST", "/api/memory/index/rebuild") => {
            responses.insert("200".into(), ok("RebuildResponse"));
            responses.insert("409".into(), error_response("A rebuild is already running"));
        }
        ("GET", "/healthz") => {
            responses.insert("200".into(), ok("Health"));
        }
        ("GET", "/readyz") => {
            responses.insert("200".into(), ok("Health"));
            responses.insert("503".into(), json!({ "description": "Starting or stopping", "content": json_content(schema_ref("Health")) }));
        }
        ("GET", "/metrics") => {
            responses.insert(
                "200".into(),
                json!({ "description": "Prometheus text format 0.0.4", "content": { "text/plain": { "schema": { "type": "string" } } } }),
            );
        }
        _ => {
            responses.insert("200".into(), json!({ "description": "The OpenAPI document", "content": json_content(json!({"type": "object"})) }));
        }
    }
    if route.path.starts_with("/api/") {
        responses.insert(
            "400".into(),
            error_response("Invalid id, agent name or argument"),
        );
        responses.insert("401".into(), error_response("Not authenticated"));
        responses.insert(
            "403".into(),
            error_response("Non-loopback Host/Origin in unauthenticated mode"),
        );
        if !request_body.is_null() {
            responses.insert(
                "413".into(),
                error_response("Body larger than gateway.max_body_bytes"),
            );
        }
        responses.insert(
            "422".into(),
            json!({ "description": "Validation error", "content": json_content(schema_ref("HTTPValidationError")) }),
        );
        if route.path.starts_with("/api/memory/context") {
            responses.insert(
                "409".into(),
                error_response("The run already recorded a different memory block"),
            );
        }
        if route.path != "/api/memory/config" {
            responses.insert(
                "500".into(),
                error_response("Stored data corrupted, or persistence failed"),
            );
            responses.insert(
                "501".into(),
                error_response("The backend does not support the operation"),
            );
            responses.insert(
                "503".into(),
                error_response("Memory disabled, or the backend is unavailable"),
            );
            responses.insert("504".into(), error_response("Request or backend timed out"));
        }
    }
    let mut op = Map::new();
    op.insert("operationId".into(), json!(route.operation_id));
    op.insert("summary".into(), json!(route.summary));
    op.insert(
        "tags".into(),
        json!([if route.path.starts_with("/api/") {
            "memory"
        } else {
            "operations"
        }]),
    );
    if !params.is_empty() {
        op.insert("parameters".into(), Value::Array(params));
    }
    if !request_body.is_null() {
        op.insert("requestBody".into(), request_body);
    }
    op.insert("responses".into(), Value::Object(responses));
    if !route.authenticated {
        op.insert("security".into(), json!([]));
    }
    Value::Object(op)
}

fn summary_entry() -> Value {
    json!({
        "type": "object",
        "properties": { "summary": {"type": "string", "default": ""}, "updatedAt": {"type": "string", "default": ""} }
    })
}

fn schemas() -> Value {
    let string_list = json!({"type": "array", "items": {"type": "string"}});
    json!({
        "SummaryEntry": summary_entry(),
        "UserSummaries": { "type": "object", "properties": {
            "workContext": schema_ref("SummaryEntry"), "personalContext": schema_ref("SummaryEntry"),
            "topOfMind": schema_ref("SummaryEntry") } },
        "HistorySummaries": { "type": "object", "properties": {
            "recentMonths": schema_ref("SummaryEntry"), "earlierContext": schema_ref("SummaryEntry"),
            "longTermBackground": schema_ref("SummaryEntry") } },
        "Fact": { "type": "object", "required": ["id", "content"], "properties": {
            "id": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
            "content": {"type": "string"},
            "category": {"type": "string", "default": "context"},
            "categoryExtension": {"type": "string"},
            "topics": string_list,
            "confidence": {"type": "number", "default": 0.5},
            "createdAt": {"type": "string", "default": ""},
            "source": {"type": "string", "default": "unknown"},
            "sourceError": {"type": "string"},
            "schemaVersion": {"type": "integer"},
            "status": {"type": "string"},
            "scope": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
            "revision": {"type": "integer", "minimum": 0},
            "updatedAt": {"type": "string"},
            "consolidatedAt": {"type": "string"},
            "consolidatedFrom": string_list } },
        "MemoryResponse": { "type": "object", "properties": {
            "version": {"type": "string", "default": "1.0"},
            "revision": {"type": "integer", "minimum": 0},
            "lastUpdated": {"type": "string", "default": ""},
            "user": schema_ref("UserSummaries"),
            "history": schema_ref("HistorySummaries"),
            "facts": {"type": "array", "items": schema_ref("Fact"), "default": []} } },
        "FactCreateRequest": { "type": "object", "required": ["content"], "properties": {
            "content": {"type": "string", "minLength": 1},
            "category": {"type": "string", "default": "context"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5} } },
        "FactPatchRequest": { "type": "object", "properties": {
            "content": {"type": ["string", "null"], "minLength": 1},
            "category": {"type": ["string", "null"]},
            "confidence": {"type": ["number", "null"], "minimum": 0, "maximum": 1} } },
        "MemoryConfigResponse": { "type": "object", "properties": {
            "enabled": {"type": "boolean"}, "mode": {"type": "string", "enum": ["middleware", "tool"]},
            "injection_enabled": {"type": "boolean"},
            "shutdown_flush_timeout_seconds": {"type": "number"},
            "manager_class": {"type": "string"},
            "backend_config": {"type": "object", "description": "memory.backend_config with secret values replaced by \"***\""} } },
        "MemoryStatusResponse": { "type": "object", "properties": {
            "config": schema_ref("MemoryConfigResponse"), "data": schema_ref("MemoryResponse") } },
        "Message": { "type": "object", "description": "{\"role\": \"user\"|\"assistant\", \"content\": ...}, a LangChain message {\"type\": \"human\"|\"ai\", \"content\": ...}, or a LangChain dump {\"type\": ..., \"data\": {...}}",
            "properties": { "role": {"type": "string"}, "type": {"type": "string"}, "content": {}, "additional_kwargs": {"type": "object"}, "tool_calls": {"type": "array"}, "data": {"type": "object"} } },
        "MessagesRequest": { "type": "object", "required": ["thread_id", "messages"], "properties": {
            "thread_id": {"type": "string", "minLength": 1, "maxLength": 512},
            "agent": {"type": ["string", "null"]},
            "messages": {"type": "array", "items": schema_ref("Message")},
            "trace_id": {"type": ["string", "null"], "maxLength": 256} } },
        "Accepted": { "type": "object", "properties": { "status": {"type": "string", "const": "accepted"} } },
        "ContextResponse": { "type": "object", "properties": {
            "context": {"type": "string", "description": "The exact block, <memory> wrapper included; empty when nothing is injected"},
            "content_sha256": {"type": ["string", "null"]} } },
        "SearchHit": { "allOf": [ schema_ref("Fact"), { "type": "object", "properties": {
            "score": {"type": ["number", "null"], "description": "The backend's relevance score (higher is better), when it has one"},
            "matchType": {"type": "string", "enum": ["fts5", "cjk", "substring", "remote"]} } } ] },
        "SearchResponse": { "type": "object", "properties": {
            "results": {"type": "array", "items": schema_ref("SearchHit")}, "count": {"type": "integer"} } },
        "RebuildResponse": { "type": "object", "properties": {
            "status": {"type": "string", "enum": ["ok", "nothing_to_warm"]}, "warmed": {"type": ["boolean", "null"]} } },
        "RunEvent": { "type": "object", "required": ["thread_id", "run_id", "event_type", "category", "content", "seq", "created_at"], "properties": {
            "thread_id": {"type": "string"}, "run_id": {"type": "string"},
            "event_type": {"type": "string", "examples": ["context:memory"]},
            "category": {"type": "string", "examples": ["context"]},
            "content": {"type": "object", "description": "For context:memory exactly {\"content_sha256\": \"<hex>\"}"},
            "metadata": {"type": "object", "description": "{\"agent_name\": ...}"},
            "seq": {"type": "integer", "minimum": 1},
            "created_at": {"type": "string"} } },
        "Health": { "type": "object", "properties": { "status": {"type": "string"} } },
        "HTTPError": { "type": "object", "properties": { "detail": {"type": "string"} } },
        "ValidationError": { "type": "object", "required": ["loc", "msg", "type"], "properties": {
            "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
            "msg": {"type": "string"}, "type": {"type": "string"}, "input": {}, "ctx": {"type": "object"} } },
        "HTTPValidationError": { "type": "object", "properties": {
            "detail": {"type": "array", "items": schema_ref("ValidationError")} } }
    })
}

/// The OpenAPI document.
pub fn document() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for route in ROUTES {
        let entry = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = entry {
            m.insert(route.method.to_ascii_lowercase(), operation(route));
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "DeerMem gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "DeerFlow-compatible /api/memory routes plus extensions. With gateway.auth.mode: token, send Authorization: Bearer <token>; internal callers send X-DeerFlow-Internal-Token (and optionally X-DeerFlow-Owner-User-Id)."
        },
        "paths": paths,
        "components": {
            "schemas": schemas(),
            "securitySchemes": {
                "bearerAuth": { "type": "http", "scheme": "bearer" },
                "internalToken": { "type": "apiKey", "in": "header", "name": "X-DeerFlow-Internal-Token" }
            }
        },
        "security": [ {}, { "bearerAuth": [] }, { "internalToken": [] } ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_described_with_responses() {
        let doc = document();
        for r in ROUTES {
            let op = &doc["paths"][r.path][r.method.to_ascii_lowercase()];
            assert_eq!(op["operationId"], r.operation_id, "{r:?}");
            assert!(
                op["responses"].as_object().is_some_and(|m| !m.is_empty()),
                "{r:?}"
            );
        }
        let ids: std::collections::BTreeSet<_> = ROUTES.iter().map(|r| r.operation_id).collect();
        assert_eq!(ids.len(), ROUTES.len(), "operation ids are unique");
    }

    #[test]
    fn every_reference_resolves() {
        let doc = document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("#/components/schemas/").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            assert!(schemas.contains_key(&name), "dangling $ref {name}");
        }
    }
}
