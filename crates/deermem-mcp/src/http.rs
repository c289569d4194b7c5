//! The streamable-HTTP transport: an axum router serving the MCP endpoint, with the caller's
//! identity taken from an `Authorization: Bearer` token (a missing or unknown token is refused
//! with 401) and malformed JSON-RPC answered with a JSON-RPC error body (HTTP 400).
//!
//! The endpoint runs statelessly (no `Mcp-Session-Id`) and answers plain JSON, so every request
//! carries its own token and acts for exactly that user.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use deermem_core::ports::MemoryManager;
use deermem_core::{AgentName, UserId};
use http::{HeaderValue, Method, StatusCode, header};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::error::McpServeError;
use crate::handler::{AuthenticatedUser, MemoryMcpServer};
use crate::stdio::error_line;

/// Maps a bearer token to its user; `None` refuses the request.
pub type TokenAuth = Arc<dyn Fn(&str) -> Option<UserId> + Send + Sync>;

/// The default endpoint path.
pub const DEFAULT_PATH: &str = "/mcp";

/// The default cap on a request body, in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Options of the HTTP endpoint.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Where the endpoint is mounted (default `/mcp`).
    pub path: String,
    /// Accepted `Host` header values (host or host:port). `None` accepts any host: every
    /// request must carry a valid bearer token, which a DNS-rebinding page cannot attach.
    pub allowed_hosts: Option<Vec<String>>,
    /// Largest accepted request body in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
    /// Cancelling this token ends in-flight responses (graceful shutdown).
    pub cancellation: CancellationToken,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            path: DEFAULT_PATH.to_owned(),
            allowed_hosts: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            cancellation: CancellationToken::new(),
        }
    }
}

/// The MCP endpoint at `/mcp` with default options: each request acts for the user its bearer
/// token maps to, in `agent`'s bucket (`None`: the default bucket).
pub fn http_router(
    manager: Arc<dyn MemoryManager>,
    auth: TokenAuth,
    agent: Option<AgentName>,
) -> Router {
    http_router_with(manager, auth, agent, HttpOptions::default())
}

/// The MCP endpoint with explicit options.
pub fn http_router_with(
    manager: Arc<dyn MemoryManager>,
    auth: TokenAuth,
    agent: Option<AgentName>,
    options: HttpOptions,
) -> Router {
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(options.max_body_bytes)
        .with_cancellation_token(options.cancellation.child_token());
    config = match options.allowed_hosts {
        Some(hosts) => config.with_allowed_hosts(hosts),
        None => config.disable_allowed_hosts(),
    };
    let service = StreamableHttpService::new(
        move || Ok(MemoryMcpServer::for_http(manager.clone(), agent.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let limit = options.max_body_bytes;
    // Layers run outside-in: the token check first, then JSON-RPC validation, then rmcp.
    Router::new()
        .route_service(&normalize_path(&options.path), service)
        .layer(middleware::from_fn_with_state(limit, validate_json_rpc))
        .layer(middleware::from_fn_with_state(auth, require_bearer))
}

/// Serves [`http_router`] on `listener` until `shutdown` completes.
///
/// # Errors
/// When the listener fails.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    manager: Arc<dyn MemoryManager>,
    auth: TokenAuth,
    agent: Option<AgentName>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), McpServeError> {
    let options = HttpOptions::default();
    let cancel = options.cancellation.clone();
    let router = http_router_with(manager, auth, agent, options);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            cancel.cancel();
        })
        .await
        .map_err(McpServeError::Io)
}

fn normalize_path(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        DEFAULT_PATH.to_owned()
    } else if trimmed.starts_with('/') {
        trimmed.to_owned()
    } else {
        format!("/{trimmed}")
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

async fn require_bearer(
    State(auth): State<TokenAuth>,
    mut request: Request,
    next: Next,
) -> Response {
    let user = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .and_then(|token| auth(token));
    match user {
        Some(user) => {
            request.extensions_mut().insert(AuthenticatedUser(user));
            next.run(request).await
        }
        None => {
            let mut response = (
                StatusCode::UNAUTHORIZED,
                [(header::CONTENT_TYPE, "application/json")],
                json!({ "error": "a valid 'Authorization: Bearer <token>' header is required" })
                    .to_string(),
            )
                .into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"deermem-mcp\""),
            );
            response
        }
    }
}

/// Answers POST bodies that are not JSON (`-32700`) or not a JSON-RPC message (`-32600`) with
/// a JSON-RPC error and HTTP 400; everything else goes on to the MCP service unchanged.
async fn validate_json_rpc(State(limit): State<usize>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST || !is_json(&request) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body exceeds {limit} bytes"),
            )
                .into_response();
        }
    };
    let value: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return json_rpc_error(Value::Null, -32700, &format!("Parse error: {e}")),
    };
    let id = match value.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => Value::Null,
    };
    if let Err(e) = serde_json::from_value::<ClientJsonRpcMessage>(value) {
        return json_rpc_error(id, -32600, &format!("Invalid Request: {e}"));
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn is_json(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
        })
}

fn json_rpc_error(id: Value, code: i64, message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "application/json")],
        error_line(id, code, message),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(normalize_path("/mcp/"), "/mcp");
        assert_eq!(normalize_path("memory"), "/memory");
        assert_eq!(normalize_path("/"), "/mcp");
    }
}
