//! DeerMem HTTP gateway: DeerFlow-compatible /api/memory routes plus extensions.
//!
//! [`router`] builds an axum [`Router`] a host can mount or serve; [`serve`] runs it on a
//! listener with graceful shutdown. The gateway knows only the
//! [`MemoryManager`](deermem_core::ports::MemoryManager) port and `deermem_core` types.
//!
//! - Routes: `GET`/`DELETE /api/memory`, `POST /api/memory/reload`, `POST /api/memory/facts`,
//!   `PATCH`/`DELETE /api/memory/facts/{fact_id}`, `GET /api/memory/export`,
//!   `POST /api/memory/import`, `GET /api/memory/config`, `GET /api/memory/status` (the
//!   reference's), and `POST /api/memory/messages`, `GET /api/memory/context`,
//!   `GET /api/memory/search`, `POST /api/memory/index/rebuild`,
//!   `GET /api/threads/{thread_id}/runs/{run_id}/events` (run-level memory identity, with a
//!   [`RunEventStore`](deermem_core::ports::RunEventStore)), `GET /api/memory/turns`,
//!   `POST /api/memory/turns/{turn_id}/retry`, `DELETE /api/memory/turns/{turn_id}` (the
//!   caller's durable turns, with a [`TurnAdmin`](deermem_core::ports::TurnAdmin)), `GET /healthz`, `GET /readyz`, `GET /metrics`, `GET /openapi.json`,
//!   `GET /docs`. Every memory route takes an optional `agent` query parameter. A path with a
//!   trailing slash is redirected (307) to the route without it, as FastAPI does.
//! - Identity: `gateway.auth.mode: none` (user `default`, loopback only), `token` (bearer
//!   tokens mapped to users) or `deerflow_session` (DeerFlow's session cookie, with its CSRF
//!   rule); internal callers with the `X-DeerFlow-Internal-Token` act for the user in
//!   `X-DeerFlow-Owner-User-Id`. See [`config::GatewayConfig`] and [`session`].
//! - CORS, when `gateway.cors` is set: the outermost layer, so preflights are answered without
//!   authentication and error responses carry the CORS headers too.
//! - Errors: one mapping to HTTP in [`error::GatewayError`].
//! - Connections: [`listen`] (hyper's HTTP/1 connections with its head-read timeout, the
//!   connection cap, the drain deadline), shared with `deermem mcp --bind`.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

pub mod auth;
mod body;
pub mod config;
pub mod error;
mod extract;
pub mod layers;
mod limits;
pub mod listen;
pub mod metrics;
mod openapi;
mod ops;
mod routes;
mod schema;
mod server;
pub mod session;
pub mod state;
mod turns;

use aide::axum::ApiRouter;
use aide::axum::routing::{delete_with, get_with, patch_with, post_with};
use axum::http::StatusCode;
use axum::middleware::{from_fn_with_state, map_request};
use axum::{Extension, Router};
use deermem_core::PublicMemoryDocument;
use tower::util::option_layer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use openapi::{Body, Describe as _, InPath, InQuery};
use schema::{
    Accepted, AgentQuery, ContextQuery, EventsQuery, FactCreateBody, FactIdPath, FactPatchBody,
    Health, HttpValidationError, MessagesBody, RunPath, SearchQuery,
};
use turns::{TurnIdPath, TurnsQuery};

pub use auth::{Caller, CallerKind};
pub use config::{AuthMode, GatewayConfig, ServerConfig};
pub use error::{GatewayError, Operation};
pub use metrics::Metrics;
pub use server::{FLUSH_GRACE, WARM_SHUTDOWN_WAIT, serve};
pub use state::{
    ContextObserver, ContextServed, GatewayState, Lifecycle, ObserverError, ReadinessCheck,
    StorageUnreachable, spawn_warm,
};

/// Builds the gateway's router over a state, and with it the OpenAPI document served at
/// `/openapi.json` (generated with `aide`): each route is documented where it is routed.
///
/// Layers, outermost first: CORS (only when `gateway.cors` is set: the preflight log, count
/// and 403 for refused origins, then tower-http's layer, which answers allowed preflights);
/// tower-http's request id (a client's kept when sane) and trace span with the completion log
/// line; metrics; JSON error bodies; the request timeout (504); the body size limit (413); then, on `/api` routes, caller authentication (401/403) and, on the
/// data routes, the `memory.enabled` gate (503). The operational routes (`/healthz`,
/// `/readyz`, `/metrics`, `/openapi.json`, `/docs`) need no authentication. Unknown paths go
/// to the fallback: a 307 redirect when only a trailing slash is in the way, else 404.
pub fn router(state: GatewayState) -> Router {
    openapi::start();
    let data = ApiRouter::new()
        .api_route(
            "/api/memory",
            get_with(routes::get_memory, |o| {
                o.named("get_memory", "The caller's memory document")
                    .input::<InQuery<AgentQuery>>()
            })
            .delete_with(routes::clear_memory, |o| {
                o.named("clear_memory", "Clear memory (all agents, or one with ?agent=)")
                    .input::<InQuery<AgentQuery>>()
            }),
        )
        .api_route(
            "/api/memory/reload",
            post_with(routes::reload_memory, |o| {
                o.named("reload_memory", "Re-read storage and return the document")
                    .input::<InQuery<AgentQuery>>()
            }),
        )
        .api_route(
            "/api/memory/facts",
            post_with(routes::create_fact, |o| {
                o.named("create_fact", "Create a fact; returns the whole document")
                    .input::<(InQuery<AgentQuery>, Body<FactCreateBody>)>()
                    .error::<409>("Duplicate content, a concurrent change, or the new fact was evicted by the capacity policy")
            }),
        )
        .api_route(
            "/api/memory/facts/{fact_id}",
            patch_with(routes::update_fact, |o| {
                o.named("update_fact", "Update a fact's given fields")
                    .input::<(InPath<FactIdPath>, InQuery<AgentQuery>, Body<FactPatchBody>)>()
                    .error::<404>("No such fact")
            })
            .delete_with(routes::delete_fact, |o| {
                o.named("delete_fact", "Delete a fact")
                    .input::<(InPath<FactIdPath>, InQuery<AgentQuery>)>()
                    .error::<404>("No such fact")
            }),
        )
        .api_route(
            "/api/memory/export",
            get_with(routes::export_memory, |o| {
                o.named("export_memory", "Export the document (backup format)")
                    .input::<InQuery<AgentQuery>>()
                    .error::<429>(BULK_USER_BUSY)
                    .error::<503>(BULK_BUSY)
            }),
        )
        .api_route(
            "/api/memory/import",
            post_with(routes::import_memory, |o| {
                o.named("import_memory", "Replace the bucket with a document")
                    .input::<(InQuery<AgentQuery>, Body<PublicMemoryDocument>)>()
                    .error::<429>(BULK_USER_BUSY)
                    .error::<503>(BULK_BUSY)
                    .reply::<422, HttpValidationError>(
                        "Validation error, or more than 2000 facts (refused before they are built)",
                    )
            }),
        )
        .api_route(
            "/api/memory/status",
            get_with(routes::memory_status, |o| {
                o.named("get_memory_status", "Configuration plus document")
                    .input::<InQuery<AgentQuery>>()
            }),
        )
        .api_route(
            "/api/memory/messages",
            post_with(routes::add_messages, |o| {
                o.named("add_messages", "Queue a conversation turn for extraction")
                    .input::<(InQuery<AgentQuery>, Body<MessagesBody>)>()
                    .reply::<202, Accepted>("Queued")
                    .error::<429>("This user's pending turns reached queue_max_pending_bytes_per_user; Retry-After says when to retry")
                    .error::<503>("All pending turns reached queue_max_pending_bytes (Retry-After), memory disabled, or the backend is unavailable")
            }),
        )
        .api_route(
            "/api/memory/context",
            get_with(routes::memory_context, |o| {
                o.named("get_memory_context", "The injection block and its SHA-256")
                    .input::<(InQuery<AgentQuery>, InQuery<ContextQuery>)>()
                    .error::<409>("The run already recorded a different memory block")
            }),
        )
        .api_route(
            "/api/memory/search",
            get_with(routes::search_memory, |o| {
                o.named("search_memory", "Ranked facts for a query")
                    .input::<(InQuery<SearchQuery>, InQuery<AgentQuery>)>()
            }),
        )
        .api_route(
            "/api/memory/index/rebuild",
            post_with(routes::rebuild_index, |o| {
                o.named("rebuild_index", "Rebuild the derived search index (warm)")
                    .error::<409>("A rebuild is already running")
            }),
        )
        .api_route(
            "/api/threads/{thread_id}/runs/{run_id}/events",
            get_with(routes::run_events, |o| {
                o.named(
                    "list_run_events",
                    "A run's recorded events (run-level memory identity)",
                )
                .input::<(InPath<RunPath>, InQuery<EventsQuery>)>()
                .error::<404>("The caller has no event in this thread or run")
            }),
        )
        .api_route(
            "/api/memory/turns",
            get_with(turns::list_turns, |o| {
                o.named(
                    "list_turns",
                    "The caller's accepted turns still in the turn journal (pending or dead-lettered)",
                )
                .input::<InQuery<TurnsQuery>>()
                .error::<501>(NO_TURN_JOURNAL)
            }),
        )
        .api_route(
            "/api/memory/turns/{turn_id}/retry",
            post_with(turns::retry_turn, |o| {
                o.named(
                    "retry_turn",
                    "Retry a dead-lettered turn now (pending again, attempts reset)",
                )
                .input::<InPath<TurnIdPath>>()
                .error::<404>("The caller has no turn with this id")
                .error::<409>("The turn is pending, not dead")
                .error::<501>(NO_TURN_JOURNAL)
            }),
        )
        .api_route(
            "/api/memory/turns/{turn_id}",
            delete_with(turns::drop_turn, |o| {
                o.named("drop_turn", "Drop a turn for good (its extraction never runs)")
                    .input::<InPath<TurnIdPath>>()
                    .error::<404>("The caller has no turn with this id")
                    .error::<501>(NO_TURN_JOURNAL)
            }),
        )
        .with_path_items(|item| openapi::api_errors(item, true))
        .route_layer(from_fn_with_state(state.clone(), layers::require_enabled));
    let api = ApiRouter::new()
        .api_route(
            "/api/memory/config",
            get_with(routes::memory_config, |o| {
                o.named(
                    "get_memory_config",
                    "The memory configuration (secrets redacted)",
                )
            }),
        )
        .with_path_items(|item| openapi::api_errors(item, false))
        .merge(data)
        .route_layer(from_fn_with_state(state.clone(), auth::require_caller));
    let ops = ApiRouter::new()
        .api_route(
            "/healthz",
            get_with(ops::healthz, |o| o.named("healthz", "The process is up")),
        )
        .api_route(
            "/readyz",
            get_with(ops::readyz, |o| {
                o.named("readyz", "The gateway is ready to serve")
                    .reply::<200, Health>("OK")
                    .reply::<503, Health>("Starting or stopping")
            }),
        )
        .api_route(
            "/metrics",
            get_with(ops::metrics, |o| {
                o.named("metrics", "Prometheus metrics").raw::<200>(
                    "application/openmetrics-text",
                    "OpenMetrics text format 1.0.0",
                )
            }),
        )
        .api_route(
            "/openapi.json",
            get_with(ops::openapi, |o| {
                o.named("openapi", "This document")
                    .raw::<200>("application/json", "The OpenAPI document")
            }),
        )
        .api_route(
            "/docs",
            get_with(ops::docs, |o| {
                o.named("docs", "This reference as an HTML page")
                    .raw::<200>(
                        "text/html",
                        "Every operation with its parameters, body and responses",
                    )
            }),
        )
        .with_path_items(openapi::open);
    let cfg = state.gateway_config().clone();
    let (app, document) = openapi::finish(ApiRouter::new().merge(api).merge(ops));
    app.fallback(ops::fallback)
        .layer(Extension(document))
        .layer(RequestBodyLimitLayer::new(cfg.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            cfg.request_timeout,
        ))
        .layer(from_fn_with_state(state.clone(), layers::json_errors))
        .layer(from_fn_with_state(state.clone(), layers::record_metrics))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(layers::request_span)
                .on_request(())
                .on_response(layers::log_response)
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(map_request(layers::drop_unusable_request_id))
        .layer(option_layer(cfg.cors.as_ref().map(layers::cors)))
        .layer(from_fn_with_state(state.clone(), layers::cors_guard))
        .with_state(state)
}

const NO_TURN_JOURNAL: &str =
    "The backend keeps no turn journal (queue.durable is off, or the backend is remote)";
const BULK_USER_BUSY: &str = "Too many imports and exports of this user at once (gateway.max_bulk_requests_per_user); Retry-After says when to retry";
const BULK_BUSY: &str = "Too many imports and exports at once (gateway.max_bulk_requests), memory disabled, or the backend is unavailable; Retry-After when busy";
