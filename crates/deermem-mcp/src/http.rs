//! The streamable-HTTP transport: an axum router serving the MCP endpoint, with the caller's
//! identity taken from an `Authorization: Bearer` token (a missing or unknown token is refused
//! with 401) and malformed JSON-RPC answered with a JSON-RPC error body (HTTP 400; 413 for a
//! body over the limit).
//!
//! The endpoint runs statelessly (no `Mcp-Session-Id`) and answers plain JSON, so every request
//! carries its own token and acts for exactly that user; a POST that accepts JSON (`*/*`,
//! `application/json` alone, or no `Accept` at all) is served. Only the endpoint asks for a
//! token: every other path, the OAuth discovery documents and `/register` included, is a plain
//! 404 (there is no OAuth here). CORS preflights are answered for the configured origins.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use deermem_core::ports::MemoryManager;
use deermem_core::{AgentName, UserId};
use deermem_gateway::ServerConfig;
use deermem_gateway::auth::bearer_token;
use deermem_gateway::listen::{ServeOptions, serve_app};
use http::{HeaderValue, Method, StatusCode, header};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::error::McpServeError;
use crate::handler::{AuthenticatedUser, MemoryMcpServer};
use crate::jsonrpc::{INVALID_REQUEST, PARSE_ERROR, error_line, repair_lone_surrogates};
use crate::stdio::check_message;

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
    /// Browser origins (`https://host[:port]`) allowed to call the endpoint across origins;
    /// `*` allows any. Empty (the default): no CORS headers, preflights are refused with 401.
    /// Requests still need their bearer token whatever the origin.
    pub cors_origins: Vec<String>,
    /// Connection handling when served by [`serve_http_with`]: header-read and keep-alive
    /// timeouts, the connection cap, the drain deadline (the gateway's `gateway.server`).
    pub server: ServerConfig,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            path: DEFAULT_PATH.to_owned(),
            allowed_hosts: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            cancellation: CancellationToken::new(),
            cors_origins: Vec::new(),
            server: ServerConfig::default(),
        }
    }
}

/// A CORS origin option that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidOrigin {
    /// No `scheme://`.
    #[error(
        "{0:?} is not an origin: expected scheme://host[:port] (e.g. http://localhost:6274) or *"
    )]
    NotAnOrigin(String),
    /// A bad scheme or host, or a path, query or fragment after the host.
    #[error("{0:?} is not an origin: expected scheme://host[:port] with no path")]
    Malformed(String),
    /// Not sendable in a header.
    #[error("{0:?} is not a valid header value")]
    NotAHeaderValue(String),
}

/// Checks one CORS origin option: `*`, or `scheme://host[:port]` with nothing after it.
///
/// # Errors
/// [`InvalidOrigin`] saying what is wrong with `origin`.
pub fn check_cors_origin(origin: &str) -> Result<(), InvalidOrigin> {
    if origin == "*" {
        return Ok(());
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Err(InvalidOrigin::NotAnOrigin(origin.to_owned()));
    };
    let valid_scheme = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let valid_host = !rest.is_empty()
        && !rest.contains(['/', '?', '#'])
        && !rest.chars().any(|c| c.is_whitespace() || c.is_control());
    if !valid_scheme || !valid_host {
        return Err(InvalidOrigin::Malformed(origin.to_owned()));
    }
    HeaderValue::from_str(origin)
        .map(|_| ())
        .map_err(|_| InvalidOrigin::NotAHeaderValue(origin.to_owned()))
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
    // Layers run outside-in: CORS (answering preflights), the token check, JSON-RPC validation,
    // then rmcp. The token check and validation are route layers: a path that is not the
    // endpoint is a 404 without a token.
    let router = Router::new()
        .route_service(&normalize_path(&options.path), service)
        .route_layer(middleware::from_fn_with_state(limit, validate_json_rpc))
        .route_layer(middleware::from_fn_with_state(auth, require_bearer));
    match cors_layer(&options.cors_origins) {
        Some(cors) => router.layer(cors),
        None => router,
    }
}

/// The CORS layer for `origins` (`None` when there are none). Invalid entries are skipped with
/// a warning; [`check_cors_origin`] finds them beforehand.
fn cors_layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list: Vec<HeaderValue> = origins
            .iter()
            .filter_map(|o| match check_cors_origin(o) {
                Ok(()) => HeaderValue::from_str(o).ok(),
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring a CORS origin");
                    None
                }
            })
            .collect();
        AllowOrigin::list(list)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                header::WWW_AUTHENTICATE,
                http::HeaderName::from_static("mcp-session-id"),
                http::HeaderName::from_static("mcp-protocol-version"),
            ])
            .max_age(Duration::from_secs(600)),
    )
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
    serve_http_with(
        listener,
        manager,
        auth,
        agent,
        HttpOptions::default(),
        shutdown,
    )
    .await
}

/// [`serve_http`] with explicit options; `options.cancellation` is cancelled when `shutdown`
/// completes.
///
/// Connections go through the gateway's connection layer
/// ([`deermem_gateway::listen::serve_app`]) with `options.server`: hyper refuses malformed or
/// oversized heads with its bare 400/431, connections that send no head in time are closed,
/// connections beyond the cap get 503 with a JSON-RPC error body (`-32600`), and after
/// `shutdown` whatever is still open at the drain deadline is closed, so the server always
/// stops.
///
/// # Errors
/// When the listener fails.
pub async fn serve_http_with(
    listener: tokio::net::TcpListener,
    manager: Arc<dyn MemoryManager>,
    auth: TokenAuth,
    agent: Option<AgentName>,
    options: HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), McpServeError> {
    let cancel = options.cancellation.clone();
    let serve_options = ServeOptions {
        server: options.server,
        error_body: Arc::new(|message: &str| {
            error_line(Value::Null, INVALID_REQUEST, message).into_bytes()
        }),
    };
    let router = http_router_with(manager, auth, agent, options);
    let report = serve_app(listener, router, serve_options, async move {
        shutdown.await;
        cancel.cancel();
    })
    .await
    .map_err(McpServeError::Io)?;
    tracing::info!(
        open_at_shutdown = report.open_at_shutdown,
        closed_at_deadline = report.closed_at_deadline,
        "MCP connections drained"
    );
    Ok(())
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
            // The token map is the host's; its users obey the one rule on caller-chosen ids.
            if let Err(e) = deermem_core::ids::refuse_derived_bucket(user.as_str()) {
                tracing::warn!(error = %e, "refused a bearer token's user");
                return (
                    StatusCode::FORBIDDEN,
                    [(header::CONTENT_TYPE, "application/json")],
                    json!({ "error": format!("refused the user of this bearer token: {e}") })
                        .to_string(),
                )
                    .into_response();
            }
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

/// For POST: serves a client that accepts JSON whatever else its `Accept` says (the answers
/// are plain JSON), and answers bodies over the limit (413), not JSON (`-32700`) or not a
/// JSON-RPC message (`-32600`, or `-32602` for a known method with unfitting params) with a
/// JSON-RPC error body (HTTP 400). A lone UTF-16 surrogate escape is read as U+FFFD.
/// Everything else goes on to the MCP service.
async fn validate_json_rpc(
    State(limit): State<usize>,
    mut request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    if accepts_json(request.headers()) {
        request.headers_mut().insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
    }
    if !is_json(&request) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return json_rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                Value::Null,
                INVALID_REQUEST,
                &format!("Invalid Request: the request body exceeds {limit} bytes"),
            );
        }
    };
    let bytes = match repair_lone_surrogates(&bytes) {
        std::borrow::Cow::Borrowed(_) => bytes,
        std::borrow::Cow::Owned(fixed) => Bytes::from(fixed),
    };
    let value: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return json_rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                PARSE_ERROR,
                &format!("Parse error: {e}"),
            );
        }
    };
    if let Err((id, code, message)) = check_message(value) {
        return json_rpc_error(StatusCode::BAD_REQUEST, id, code, &message);
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Whether an `Accept` header admits a JSON answer: absent, or listing `application/json`,
/// `application/*` or `*/*` without `q=0`.
fn accepts_json(headers: &http::HeaderMap) -> bool {
    let values: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    if values.is_empty() {
        return true;
    }
    values.iter().flat_map(|v| v.split(',')).any(|entry| {
        let mut parts = entry.split(';');
        let essence = parts.next().unwrap_or("").trim();
        let refused = parts.any(|p| {
            p.split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("q")
                    && v.trim().parse::<f64>().is_ok_and(|q| q <= 0.0)
            })
        });
        !refused
            && ["application/json", "application/*", "*/*"]
                .iter()
                .any(|m| essence.eq_ignore_ascii_case(m))
    })
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

fn json_rpc_error(status: StatusCode, id: Value, code: i64, message: &str) -> Response {
    tracing::debug!(?id, code, message, "answered a JSON-RPC error");
    (
        status,
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
    fn json_accepting_clients_are_recognised() {
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(header::ACCEPT, HeaderValue::from_str(v).expect("header"));
            accepts_json(&h)
        };
        assert!(accepts_json(&http::HeaderMap::new()));
        assert!(with("*/*"));
        assert!(with("application/json"));
        assert!(with("text/event-stream, application/json;q=0.9"));
        assert!(with("Application/*"));
        assert!(!with("text/event-stream"));
        assert!(!with("application/json;q=0"));
        assert!(!with("text/html"));
    }

    #[test]
    fn cors_origins_are_checked() {
        assert!(check_cors_origin("*").is_ok());
        assert!(check_cors_origin("http://localhost:6274").is_ok());
        assert!(check_cors_origin("https://inspector.example.com").is_ok());
        for bad in [
            "localhost:6274",
            "http://",
            "https://a.example/path",
            "://x",
            "http://a b",
        ] {
            assert!(check_cors_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(normalize_path("/mcp/"), "/mcp");
        assert_eq!(normalize_path("memory"), "/memory");
        assert_eq!(normalize_path("/"), "/mcp");
    }
}
