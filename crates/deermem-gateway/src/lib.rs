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
//!   [`RunEventStore`](deermem_core::ports::RunEventStore)), `GET /healthz`, `GET /readyz`, `GET /metrics`, `GET /openapi.json`,
//!   `GET /docs`. Every memory route takes an optional `agent` query parameter. A path with a
//!   trailing slash is redirected (307) to the route without it, as FastAPI does.
//! - Identity: `gateway.auth.mode: none` (user `default`, loopback only), `token` (bearer
//!   tokens mapped to users) or `deerflow_session` (DeerFlow's session cookie, with its CSRF
//!   rule); internal callers with the `X-DeerFlow-Internal-Token` act for the user in
//!   `X-DeerFlow-Owner-User-Id`. See [`config::GatewayConfig`] and [`session`].
//! - CORS, when `gateway.cors` is set: the outermost layer, so preflights are answered without
//!   authentication and error responses carry the CORS headers too.
//! - Errors: one mapping to HTTP in [`error::GatewayError`].
//! - Connections: [`listen`] (header-read and keep-alive timeouts, the connection cap, JSON
//!   bodies for malformed heads, the drain deadline), shared with `deermem mcp --bind`.

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
pub mod openapi;
mod ops;
mod routes;
mod schema;
mod server;
pub mod session;
pub mod state;

use axum::Router;
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, patch, post};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

pub use auth::{Caller, CallerKind};
pub use config::{AuthMode, GatewayConfig, ServerConfig};
pub use error::{GatewayError, Operation};
pub use metrics::Metrics;
pub use server::{FLUSH_GRACE, WARM_SHUTDOWN_WAIT, serve};
pub use state::{
    ContextObserver, ContextServed, GatewayState, Lifecycle, ObserverError, spawn_warm,
};

/// Builds the gateway's router over a state.
///
/// Layers, outermost first: CORS (only when `gateway.cors` is set; it answers preflights
/// itself); request id, log span and metrics; JSON error bodies; the request timeout (504); the
/// body size limit (413); then, on `/api` routes, caller authentication (401/403) and, on the
/// data routes, the `memory.enabled` gate (503). The operational routes (`/healthz`,
/// `/readyz`, `/metrics`, `/openapi.json`, `/docs`) need no authentication. Unknown paths go
/// to the fallback: a 307 redirect when only a trailing slash is in the way, else 404.
pub fn router(state: GatewayState) -> Router {
    let data = Router::new()
        .route(
            "/api/memory",
            get(routes::get_memory).delete(routes::clear_memory),
        )
        .route("/api/memory/reload", post(routes::reload_memory))
        .route("/api/memory/facts", post(routes::create_fact))
        .route(
            "/api/memory/facts/{fact_id}",
            patch(routes::update_fact).delete(routes::delete_fact),
        )
        .route("/api/memory/export", get(routes::export_memory))
        .route("/api/memory/import", post(routes::import_memory))
        .route("/api/memory/status", get(routes::memory_status))
        .route("/api/memory/messages", post(routes::add_messages))
        .route("/api/memory/context", get(routes::memory_context))
        .route("/api/memory/search", get(routes::search_memory))
        .route("/api/memory/index/rebuild", post(routes::rebuild_index))
        .route(
            "/api/threads/{thread_id}/runs/{run_id}/events",
            get(routes::run_events),
        )
        .route_layer(from_fn_with_state(state.clone(), layers::require_enabled));
    let api = Router::new()
        .route("/api/memory/config", get(routes::memory_config))
        .merge(data)
        .route_layer(from_fn_with_state(state.clone(), auth::require_caller));
    let ops = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .route("/docs", get(ops::docs));
    let cfg = state.gateway_config().clone();
    let app = Router::new()
        .merge(api)
        .merge(ops)
        .fallback(ops::fallback)
        .layer(RequestBodyLimitLayer::new(cfg.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            cfg.request_timeout,
        ))
        .layer(from_fn_with_state(state.clone(), layers::json_errors))
        .layer(from_fn_with_state(state.clone(), layers::observe));
    let app = match &cfg.cors {
        Some(cors) => app.layer(layers::cors(cors)),
        None => app,
    };
    app.with_state(state)
}
