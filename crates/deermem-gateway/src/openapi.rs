//! The OpenAPI 3.1 description of the gateway: one route table ([`ROUTES`]: path, method,
//! parameters, the request and response body type of each operation, its status codes), and
//! component schemas generated from those types' `JsonSchema` derivations, so the document
//! follows the types (serde renames, defaults, `skip_serializing_if` and `flatten` included).
//!
//! Responses are described with the *serialize* contract (a field that is always written is
//! `required`), request bodies with the *deserialize* contract (a field with a default is
//! optional). When a type reads differently from how it is written (the import document, whose
//! every field has a default), its request form is a separate component named `<Name>-Input`.
//!
//! Tests tie the table to the router (`lib.rs`'s routes are exactly these, to the handler),
//! and the conformance tests validate real responses and the requests they send against the
//! served document.

use std::collections::{BTreeMap, BTreeSet};

use deermem_core::PublicMemoryDocument;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::schema::{
    Accepted, ContextResponse, FactCreateBody, FactPatchBody, Health, HttpError,
    HttpValidationError, MAX_THREAD_ID_CHARS, MAX_TOP_K, MAX_TRACE_ID_CHARS, MemoryConfigResponse,
    MemoryStatusResponse, MessagesBody, RebuildResponse, SearchResponse, Unauthorized,
};
use deermem_core::ports::run_journal::RunEvent;

/// Registers a body type with a generator and returns the schema to use for it (a `$ref` for
/// a named type).
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// The body of a response.
#[derive(Clone, Copy, Debug)]
pub enum Body {
    /// `application/json` of a type.
    Json(SchemaFn),
    /// Prometheus text.
    PrometheusText,
    /// This document (an OpenAPI object).
    OpenApi,
    /// An HTML page.
    Html,
}

/// One documented response of an operation.
#[derive(Clone, Copy, Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// What it means for this operation.
    pub description: &'static str,
    /// Its body.
    pub body: Body,
}

/// Where a parameter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum In {
    /// A path segment.
    Path,
    /// The query string.
    Query,
}

/// The schema of a parameter (parameters are not bodies: their grammar is documented here and
/// enforced by the handlers' checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    /// A string, with an optional pattern and length bound.
    Str {
        /// A regular expression the value matches.
        pattern: Option<&'static str>,
        /// The longest accepted value, in characters.
        max_len: Option<usize>,
    },
    /// An integer in a range, with a default.
    Int {
        /// Smallest value.
        min: i64,
        /// Largest value.
        max: Option<i64>,
        /// The value when absent.
        default: Option<i64>,
    },
}

/// One parameter of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    /// Its name.
    pub name: &'static str,
    /// Path or query.
    pub location: In,
    /// Whether it must be given.
    pub required: bool,
    /// What it selects.
    pub description: &'static str,
    /// Its grammar.
    pub schema: ParamType,
}

/// One route of the gateway.
#[derive(Clone, Copy, Debug)]
pub struct RouteInfo {
    /// HTTP method, upper case.
    pub method: &'static str,
    /// Path template (`{fact_id}` for parameters).
    pub path: &'static str,
    /// The handler serving it, as `lib.rs` names it (`routes::get_memory`).
    pub handler: &'static str,
    /// OpenAPI operation id.
    pub operation_id: &'static str,
    /// One-line summary.
    pub summary: &'static str,
    /// Whether the route needs an authenticated caller.
    pub authenticated: bool,
    /// Whether the route answers 503 when `memory.enabled` is false.
    pub needs_enabled: bool,
    /// Path and query parameters.
    pub params: &'static [Param],
    /// The JSON request body's type, when the operation takes one.
    pub request: Option<SchemaFn>,
    /// The operation's own responses (the errors every `/api` route shares are added by
    /// [`document`]).
    pub responses: &'static [Reply],
}

const AGENT: Param = Param {
    name: "agent",
    location: In::Query,
    required: false,
    description: "Agent bucket (^[A-Za-z0-9-]+$, case-insensitive, or __default__). Absent: the default bucket.",
    schema: ParamType::Str {
        pattern: None,
        max_len: None,
    },
};

const FACT_ID: Param = Param {
    name: "fact_id",
    location: In::Path,
    required: true,
    description: "Fact id: [A-Za-z0-9_-]+, at most 200 bytes.",
    schema: ParamType::Str {
        pattern: Some("^[A-Za-z0-9_-]+$"),
        max_len: Some(200),
    },
};

const RUN_KEY: ParamType = ParamType::Str {
    pattern: Some("^[A-Za-z0-9._:@+=~-]+$"),
    max_len: Some(256),
};

const fn ok(body: SchemaFn) -> Reply {
    Reply {
        status: 200,
        description: "OK",
        body: Body::Json(body),
    }
}

const fn error(status: u16, description: &'static str) -> Reply {
    Reply {
        status,
        description,
        body: Body::Json(of::<HttpError>),
    }
}

const DOCUMENT: &[Reply] = &[ok(of::<PublicMemoryDocument>)];
const FACT_NOT_FOUND: Reply = error(404, "No such fact");
const BULK_USER_BUSY: Reply = error(
    429,
    "Too many imports and exports of this user at once (gateway.max_bulk_requests_per_user); Retry-After says when to retry",
);
const BULK_BUSY: Reply = error(
    503,
    "Too many imports and exports at once (gateway.max_bulk_requests), memory disabled, or the backend is unavailable; Retry-After when busy",
);

const fn api(
    method: &'static str,
    path: &'static str,
    handler: &'static str,
    operation_id: &'static str,
    summary: &'static str,
) -> RouteInfo {
    RouteInfo {
        method,
        path,
        handler,
        operation_id,
        summary,
        authenticated: true,
        needs_enabled: true,
        params: &[AGENT],
        request: None,
        responses: DOCUMENT,
    }
}

const fn open(
    method: &'static str,
    path: &'static str,
    handler: &'static str,
    operation_id: &'static str,
    summary: &'static str,
    responses: &'static [Reply],
) -> RouteInfo {
    RouteInfo {
        method,
        path,
        handler,
        operation_id,
        summary,
        authenticated: false,
        needs_enabled: false,
        params: &[],
        request: None,
        responses,
    }
}

/// Every route the gateway serves.
pub const ROUTES: &[RouteInfo] = &[
    api(
        "GET",
        "/api/memory",
        "routes::get_memory",
        "get_memory",
        "The caller's memory document",
    ),
    api(
        "DELETE",
        "/api/memory",
        "routes::clear_memory",
        "clear_memory",
        "Clear memory (all agents, or one with ?agent=)",
    ),
    api(
        "POST",
        "/api/memory/reload",
        "routes::reload_memory",
        "reload_memory",
        "Re-read storage and return the document",
    ),
    RouteInfo {
        request: Some(of::<FactCreateBody>),
        responses: &[
            ok(of::<PublicMemoryDocument>),
            error(
                409,
                "Duplicate content, a concurrent change, or the new fact was evicted by the capacity policy",
            ),
        ],
        ..api(
            "POST",
            "/api/memory/facts",
            "routes::create_fact",
            "create_fact",
            "Create a fact; returns the whole document",
        )
    },
    RouteInfo {
        params: &[FACT_ID, AGENT],
        request: Some(of::<FactPatchBody>),
        responses: &[ok(of::<PublicMemoryDocument>), FACT_NOT_FOUND],
        ..api(
            "PATCH",
            "/api/memory/facts/{fact_id}",
            "routes::update_fact",
            "update_fact",
            "Update a fact's given fields",
        )
    },
    RouteInfo {
        params: &[FACT_ID, AGENT],
        responses: &[ok(of::<PublicMemoryDocument>), FACT_NOT_FOUND],
        ..api(
            "DELETE",
            "/api/memory/facts/{fact_id}",
            "routes::delete_fact",
            "delete_fact",
            "Delete a fact",
        )
    },
    RouteInfo {
        responses: &[ok(of::<PublicMemoryDocument>), BULK_USER_BUSY, BULK_BUSY],
        ..api(
            "GET",
            "/api/memory/export",
            "routes::export_memory",
            "export_memory",
            "Export the document (backup format)",
        )
    },
    RouteInfo {
        request: Some(of::<PublicMemoryDocument>),
        responses: &[
            ok(of::<PublicMemoryDocument>),
            BULK_USER_BUSY,
            BULK_BUSY,
            Reply {
                status: 422,
                description: "Validation error, or more than 2000 facts (refused before they are built)",
                body: Body::Json(of::<HttpValidationError>),
            },
        ],
        ..api(
            "POST",
            "/api/memory/import",
            "routes::import_memory",
            "import_memory",
            "Replace the bucket with a document",
        )
    },
    RouteInfo {
        needs_enabled: false,
        params: &[],
        responses: &[ok(of::<MemoryConfigResponse>)],
        ..api(
            "GET",
            "/api/memory/config",
            "routes::memory_config",
            "get_memory_config",
            "The memory configuration (secrets redacted)",
        )
    },
    RouteInfo {
        responses: &[ok(of::<MemoryStatusResponse>)],
        ..api(
            "GET",
            "/api/memory/status",
            "routes::memory_status",
            "get_memory_status",
            "Configuration plus document",
        )
    },
    RouteInfo {
        request: Some(of::<MessagesBody>),
        responses: &[
            Reply {
                status: 202,
                description: "Queued",
                body: Body::Json(of::<Accepted>),
            },
            error(
                429,
                "This user's pending turns reached queue_max_pending_bytes_per_user; Retry-After says when to retry",
            ),
            error(
                503,
                "All pending turns reached queue_max_pending_bytes (Retry-After), memory disabled, or the backend is unavailable",
            ),
        ],
        ..api(
            "POST",
            "/api/memory/messages",
            "routes::add_messages",
            "add_messages",
            "Queue a conversation turn for extraction",
        )
    },
    RouteInfo {
        params: &[
            AGENT,
            Param {
                name: "thread_id",
                location: In::Query,
                required: false,
                description: "The thread the block is for.",
                schema: ParamType::Str {
                    pattern: None,
                    max_len: Some(MAX_THREAD_ID_CHARS),
                },
            },
            Param {
                name: "run_id",
                location: In::Query,
                required: false,
                description: "The run (needs thread_id).",
                schema: ParamType::Str {
                    pattern: None,
                    max_len: Some(MAX_TRACE_ID_CHARS),
                },
            },
        ],
        responses: &[
            ok(of::<ContextResponse>),
            error(409, "The run already recorded a different memory block"),
        ],
        ..api(
            "GET",
            "/api/memory/context",
            "routes::memory_context",
            "get_memory_context",
            "The injection block and its SHA-256",
        )
    },
    RouteInfo {
        params: &[
            Param {
                name: "q",
                location: In::Query,
                required: true,
                description: "Query text.",
                schema: ParamType::Str {
                    pattern: None,
                    max_len: None,
                },
            },
            Param {
                name: "top_k",
                location: In::Query,
                required: false,
                description: "Result cap.",
                schema: ParamType::Int {
                    min: 1,
                    max: Some(MAX_TOP_K),
                    default: Some(5),
                },
            },
            Param {
                name: "category",
                location: In::Query,
                required: false,
                description: "Only this category (applied before the cap).",
                schema: ParamType::Str {
                    pattern: None,
                    max_len: None,
                },
            },
            AGENT,
        ],
        responses: &[ok(of::<SearchResponse>)],
        ..api(
            "GET",
            "/api/memory/search",
            "routes::search_memory",
            "search_memory",
            "Ranked facts for a query",
        )
    },
    RouteInfo {
        params: &[],
        responses: &[
            ok(of::<RebuildResponse>),
            error(409, "A rebuild is already running"),
        ],
        ..api(
            "POST",
            "/api/memory/index/rebuild",
            "routes::rebuild_index",
            "rebuild_index",
            "Rebuild the derived search index (warm)",
        )
    },
    RouteInfo {
        params: &[
            Param {
                name: "thread_id",
                location: In::Path,
                required: true,
                description: "The thread: 1-256 characters of [A-Za-z0-9._:@+=~-].",
                schema: RUN_KEY,
            },
            Param {
                name: "run_id",
                location: In::Path,
                required: true,
                description: "The run: 1-256 characters of [A-Za-z0-9._:@+=~-].",
                schema: RUN_KEY,
            },
            Param {
                name: "event_types",
                location: In::Query,
                required: false,
                description: "Comma-separated event types to keep (e.g. context:memory).",
                schema: ParamType::Str {
                    pattern: None,
                    max_len: None,
                },
            },
            Param {
                name: "limit",
                location: In::Query,
                required: false,
                description: "At most this many events, oldest first.",
                schema: ParamType::Int {
                    min: 1,
                    max: Some(2000),
                    default: Some(500),
                },
            },
            Param {
                name: "after_seq",
                location: In::Query,
                required: false,
                description: "Only events with a larger seq.",
                schema: ParamType::Int {
                    min: 1,
                    max: None,
                    default: None,
                },
            },
        ],
        responses: &[
            ok(of::<Vec<RunEvent>>),
            error(404, "The caller has no event in this thread or run"),
        ],
        ..api(
            "GET",
            "/api/threads/{thread_id}/runs/{run_id}/events",
            "routes::run_events",
            "list_run_events",
            "A run's recorded events (run-level memory identity)",
        )
    },
    open(
        "GET",
        "/healthz",
        "ops::healthz",
        "healthz",
        "The process is up",
        &[ok(of::<Health>)],
    ),
    open(
        "GET",
        "/readyz",
        "ops::readyz",
        "readyz",
        "The gateway is ready to serve",
        &[
            ok(of::<Health>),
            Reply {
                status: 503,
                description: "Starting or stopping",
                body: Body::Json(of::<Health>),
            },
        ],
    ),
    open(
        "GET",
        "/metrics",
        "ops::metrics",
        "metrics",
        "Prometheus metrics",
        &[Reply {
            status: 200,
            description: "Prometheus text format 0.0.4",
            body: Body::PrometheusText,
        }],
    ),
    open(
        "GET",
        "/openapi.json",
        "ops::openapi",
        "openapi",
        "This document",
        &[Reply {
            status: 200,
            description: "The OpenAPI document",
            body: Body::OpenApi,
        }],
    ),
    open(
        "GET",
        "/docs",
        "ops::docs",
        "docs",
        "This reference as an HTML page",
        &[Reply {
            status: 200,
            description: "Every operation with its parameters, body and responses",
            body: Body::Html,
        }],
    ),
];

/// The errors every `/api` route shares (the route's own responses take precedence).
fn shared_errors(route: &RouteInfo) -> Vec<Reply> {
    let mut out = vec![
        error(400, "Invalid id, agent name or argument"),
        Reply {
            status: 401,
            description: "Not authenticated (in deerflow_session mode with DeerFlow's {code, message} detail)",
            body: Body::Json(of::<Unauthorized>),
        },
        error(
            403,
            "A cookie-authenticated write without DeerFlow's CSRF pair, or a Host/Origin the unauthenticated mode does not serve",
        ),
    ];
    if route.request.is_some() {
        out.push(error(413, "Body larger than gateway.max_body_bytes"));
    }
    out.push(Reply {
        status: 422,
        description: "Validation error",
        body: Body::Json(of::<HttpValidationError>),
    });
    if route.needs_enabled {
        out.extend([
            error(409, "Memory changed concurrently; reload and retry"),
            error(500, "Stored data corrupted, or persistence failed"),
            error(501, "The backend does not support the operation"),
            error(503, "Memory disabled, or the backend is unavailable"),
            error(504, "Request or backend timed out"),
        ]);
    }
    out
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

fn param_json(p: &Param) -> Value {
    let schema = match p.schema {
        ParamType::Str { pattern, max_len } => {
            let mut m = Map::new();
            m.insert("type".into(), json!("string"));
            if let Some(pattern) = pattern {
                m.insert("pattern".into(), json!(pattern));
            }
            if let Some(max) = max_len {
                m.insert("maxLength".into(), json!(max));
            }
            Value::Object(m)
        }
        ParamType::Int { min, max, default } => {
            let mut m = Map::new();
            m.insert("type".into(), json!("integer"));
            m.insert("minimum".into(), json!(min));
            if let Some(max) = max {
                m.insert("maximum".into(), json!(max));
            }
            if let Some(default) = default {
                m.insert("default".into(), json!(default));
            }
            Value::Object(m)
        }
    };
    json!({
        "name": p.name,
        "in": match p.location { In::Path => "path", In::Query => "query" },
        "required": p.required,
        "description": p.description,
        "schema": schema,
    })
}

/// One operation. Response schemas go to `out`, the request body's to `input`.
fn operation(route: &RouteInfo, out: &mut SchemaGenerator, input: &mut SchemaGenerator) -> Value {
    let mut op = Map::new();
    op.insert("operationId".into(), json!(route.operation_id));
    op.insert("summary".into(), json!(route.summary));
    let tag = if route.path.starts_with("/api/") {
        "memory"
    } else {
        "operations"
    };
    op.insert("tags".into(), json!([tag]));
    if !route.params.is_empty() {
        op.insert(
            "parameters".into(),
            route.params.iter().map(param_json).collect(),
        );
    }
    if let Some(request) = route.request {
        op.insert(
            "requestBody".into(),
            json!({ "required": true, "content": json_content(request(input).to_value()) }),
        );
    }
    let mut replies: BTreeMap<u16, Reply> = BTreeMap::new();
    if route.path.starts_with("/api/") {
        for r in shared_errors(route) {
            replies.insert(r.status, r);
        }
    }
    for r in route.responses {
        replies.insert(r.status, *r);
    }
    let mut responses = Map::new();
    for (status, reply) in replies {
        let content = match reply.body {
            Body::Json(schema) => json_content(schema(out).to_value()),
            Body::PrometheusText => json!({ "text/plain": { "schema": { "type": "string" } } }),
            Body::OpenApi => json_content(json!({ "type": "object" })),
            Body::Html => json!({ "text/html": { "schema": { "type": "string" } } }),
        };
        responses.insert(
            status.to_string(),
            json!({ "description": reply.description, "content": content }),
        );
    }
    op.insert("responses".into(), Value::Object(responses));
    if !route.authenticated {
        op.insert("security".into(), json!([]));
    }
    Value::Object(op)
}

const SCHEMAS_PATH: &str = "#/components/schemas/";

fn generator(serialize: bool) -> SchemaGenerator {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    });
    if serialize {
        settings.for_serialize().into_generator()
    } else {
        settings.for_deserialize().into_generator()
    }
}

/// Every component name a schema refers to.
fn refs(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref"
                    && let Some(name) = x.as_str().and_then(|r| r.strip_prefix(SCHEMAS_PATH))
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

fn rename_refs(v: &mut Value, renamed: &BTreeMap<String, String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "$ref"
                    && let Some(new) = x
                        .as_str()
                        .and_then(|r| r.strip_prefix(SCHEMAS_PATH))
                        .and_then(|name| renamed.get(name))
                {
                    *x = Value::String(format!("{SCHEMAS_PATH}{new}"));
                    continue;
                }
                rename_refs(x, renamed);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rename_refs(x, renamed)),
        _ => {}
    }
}

/// Merges the request-side components into the response-side ones: a request schema equal to
/// the response schema of the same name (and referring only to shared components) is shared;
/// any other gets its own `<Name>-Input` component.
fn merge_components(
    mut outputs: Map<String, Value>,
    inputs: Map<String, Value>,
) -> (Map<String, Value>, BTreeMap<String, String>) {
    let mut renamed: BTreeMap<String, String> = BTreeMap::new();
    for (name, schema) in &inputs {
        if outputs.get(name).is_some_and(|o| o != schema) {
            renamed.insert(name.clone(), format!("{name}-Input"));
        }
    }
    // A schema referring to a renamed one differs too, even if its text is equal.
    loop {
        let mut more = Vec::new();
        for (name, schema) in &inputs {
            if renamed.contains_key(name) || !outputs.contains_key(name) {
                continue;
            }
            let mut names = BTreeSet::new();
            refs(schema, &mut names);
            if names.iter().any(|n| renamed.contains_key(n)) {
                more.push(name.clone());
            }
        }
        if more.is_empty() {
            break;
        }
        for name in more {
            renamed.insert(name.clone(), format!("{name}-Input"));
        }
    }
    for (name, mut schema) in inputs {
        rename_refs(&mut schema, &renamed);
        let key = renamed.get(&name).cloned().unwrap_or(name);
        outputs.entry(key).or_insert(schema);
    }
    (outputs, renamed)
}

/// The OpenAPI document.
pub fn document() -> Value {
    let mut out = generator(true);
    let mut input = generator(false);
    let mut paths: Map<String, Value> = Map::new();
    for route in ROUTES {
        let op = operation(route, &mut out, &mut input);
        let entry = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = entry {
            m.insert(route.method.to_ascii_lowercase(), op);
        }
    }
    let (schemas, renamed) =
        merge_components(out.take_definitions(true), input.take_definitions(true));
    for ops in paths.values_mut() {
        if let Value::Object(ops) = ops {
            for op in ops.values_mut() {
                if let Some(body) = op.get_mut("requestBody") {
                    rename_refs(body, &renamed);
                }
            }
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "DeerMem gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "DeerFlow-compatible /api/memory routes plus extensions. With gateway.auth.mode: token, send Authorization: Bearer <token>; with deerflow_session, DeerFlow's access_token cookie (and, on writes, the csrf_token cookie repeated in X-CSRF-Token); internal callers send X-DeerFlow-Internal-Token (and optionally X-DeerFlow-Owner-User-Id)."
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearerAuth": { "type": "http", "scheme": "bearer" },
                "internalToken": { "type": "apiKey", "in": "header", "name": "X-DeerFlow-Internal-Token" },
                "sessionCookie": { "type": "apiKey", "in": "cookie", "name": "access_token" }
            }
        },
        "security": [ {}, { "bearerAuth": [] }, { "internalToken": [] }, { "sessionCookie": [] } ]
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
            // Every path parameter of the template is declared, and only those.
            let in_template: BTreeSet<&str> = r
                .path
                .split('/')
                .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            let declared: BTreeSet<&str> = r
                .params
                .iter()
                .filter(|p| p.location == In::Path)
                .map(|p| p.name)
                .collect();
            assert_eq!(in_template, declared, "{r:?}");
        }
        let ids: BTreeSet<_> = ROUTES.iter().map(|r| r.operation_id).collect();
        assert_eq!(ids.len(), ROUTES.len(), "operation ids are unique");
    }

    #[test]
    fn every_reference_resolves() {
        let doc = document();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let mut names = BTreeSet::new();
        refs(&doc, &mut names);
        assert!(names.len() > 10, "{names:?}");
        for name in names {
            assert!(schemas.contains_key(&name), "dangling $ref {name}");
        }
        let text = doc.to_string();
        assert_eq!(
            text.matches("\"$ref\":\"#/").count(),
            text.matches(&format!("\"$ref\":\"{SCHEMAS_PATH}")).count(),
            "every $ref points into components.schemas"
        );
    }

    /// The route table against `lib.rs`'s router: every `.route(path, method(handler)...)`
    /// there is a row here with that handler, and every row is routed. Adding a route without
    /// documenting it fails here.
    #[test]
    fn the_table_is_the_router() {
        let source = include_str!("lib.rs");
        let body = source
            .split_once("pub fn router(")
            .map(|(_, rest)| rest)
            .unwrap_or("");
        let mut served: BTreeSet<(String, String, String)> = BTreeSet::new();
        for chunk in body.split(".route(").skip(1) {
            // The arguments: up to the parenthesis closing `.route(`.
            let mut depth = 1usize;
            let mut end = chunk.len();
            for (i, c) in chunk.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let args = &chunk[..end];
            let path = args.split('"').nth(1).unwrap_or("").to_owned();
            let methods = args.split_once(',').map(|(_, m)| m).unwrap_or("");
            for part in methods.split(')') {
                let part = part.trim().trim_start_matches('.');
                let Some((method, handler)) = part.split_once('(') else {
                    continue;
                };
                served.insert((
                    method.trim().to_ascii_uppercase(),
                    path.clone(),
                    handler.trim().to_owned(),
                ));
            }
        }
        let documented: BTreeSet<(String, String, String)> = ROUTES
            .iter()
            .map(|r| (r.method.into(), r.path.into(), r.handler.into()))
            .collect();
        assert_eq!(served, documented);
        assert_eq!(documented.len(), ROUTES.len());
    }

    #[test]
    fn request_and_response_contracts_differ_where_the_types_do() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
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
        assert_eq!(
            required("MemoryResponse"),
            ["facts", "history", "lastUpdated", "user", "version"]
                .map(str::to_owned)
                .into()
        );
        assert_eq!(
            required("Fact"),
            [
                "category",
                "confidence",
                "content",
                "createdAt",
                "id",
                "source"
            ]
            .map(str::to_owned)
            .into()
        );
        // Read: defaults make fields optional; the import body refers to the input forms.
        assert_eq!(required("MemoryResponse-Input"), BTreeSet::new());
        assert_eq!(
            required("Fact-Input"),
            ["content", "id"].map(str::to_owned).into()
        );
        assert_eq!(
            doc["paths"]["/api/memory/import"]["post"]["requestBody"]["content"]["application/json"]
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
        assert_eq!(
            hit["matchType"]["$ref"], "#/components/schemas/MatchType",
            "{hit}"
        );
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
                &json!("remote")
            ]
        );
        // Defaults and bounds of the create body.
        let create = &schemas["FactCreateRequest"];
        assert_eq!(create["required"], json!(["content"]));
        assert_eq!(create["properties"]["category"]["default"], "context");
        assert_eq!(create["properties"]["confidence"]["default"], 0.5);
        assert_eq!(create["properties"]["confidence"]["maximum"], 1.0);
        assert_eq!(create["properties"]["content"]["minLength"], 1);
    }

    #[test]
    fn merging_renames_only_what_differs() {
        let outputs: Map<String, Value> = serde_json::from_value(json!({
            "A": {"type": "object", "required": ["x"]},
            "B": {"type": "object", "properties": {"a": {"$ref": "#/components/schemas/A"}}},
            "C": {"type": "string"}
        }))
        .unwrap();
        let inputs: Map<String, Value> = serde_json::from_value(json!({
            "A": {"type": "object"},
            "B": {"type": "object", "properties": {"a": {"$ref": "#/components/schemas/A"}}},
            "C": {"type": "string"},
            "D": {"type": "integer"}
        }))
        .unwrap();
        let (merged, renamed) = merge_components(outputs, inputs);
        assert_eq!(
            renamed.keys().cloned().collect::<Vec<_>>(),
            vec!["A".to_owned(), "B".to_owned()]
        );
        assert_eq!(merged["A-Input"], json!({"type": "object"}));
        assert_eq!(
            merged["B-Input"]["properties"]["a"]["$ref"],
            "#/components/schemas/A-Input"
        );
        assert_eq!(
            merged["B"]["properties"]["a"]["$ref"],
            "#/components/schemas/A"
        );
        assert!(merged.contains_key("C") && !merged.contains_key("C-Input"));
        assert!(merged.contains_key("D"));
    }
}
