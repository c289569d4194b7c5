//! Cross-cutting middleware: CORS (tower-http's layer, from `gateway.cors`), the request id
//! and log span with metrics, the JSON error-body normaliser (so 404, 405, 413 and timeouts
//! answer `{"detail": ...}` like every other error), and the `memory.enabled` gate.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};
use tracing::Instrument as _;

use crate::config::CorsConfig;
use crate::error::GatewayError;
use crate::state::GatewayState;

/// The request id header (accepted from the client when sane, generated otherwise, and always
/// echoed back).
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The id of the current request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

/// A client-sent request id is kept only if it is 1–128 visible ASCII characters.
fn usable_request_id(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| s.to_owned())
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// How long a browser may cache a preflight answer (FastAPI's CORS default).
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The CORS layer for `gateway.cors`: the listed origins (or any, for `*` without
/// credentials), credentials when allowed, and the methods and headers a preflight asks for
/// mirrored back (what FastAPI's `allow_methods=["*"]`, `allow_headers=["*"]` amount to with
/// credentials). `X-Request-Id` is readable by the page.
pub(crate) fn cors(cfg: &CorsConfig) -> CorsLayer {
    let origin = if cfg.allowed_origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            cfg.allowed_origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok()),
        )
    };
    CorsLayer::new()
        .allow_origin(origin)
        .allow_credentials(cfg.allow_credentials)
        .allow_methods(AllowMethods::mirror_request())
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([REQUEST_ID_HEADER])
        .max_age(PREFLIGHT_MAX_AGE)
}

/// Outermost layer: request id, the `request` span (with the route template, never the raw
/// path or headers), metrics and the completion log line.
pub(crate) async fn observe(
    State(state): State<GatewayState>,
    mut req: Request,
    next: Next,
) -> Response {
    let id = req
        .headers()
        .get(&REQUEST_ID_HEADER)
        .and_then(usable_request_id)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    req.extensions_mut().insert(RequestId(id.clone()));
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = method_label(req.method());
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method,
        route = %route,
        user = tracing::field::Empty,
    );
    let metrics = state.metrics().clone();
    let _in_flight = metrics.start_request();
    let start = Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    let elapsed = start.elapsed();
    let status = resp.status().as_u16();
    metrics.record_request(&route, method, status, elapsed);
    span.in_scope(|| {
        tracing::info!(
            status,
            latency_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            "request finished"
        );
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

/// Gives error responses produced outside the handlers (router 404/405, the body limit, the
/// timeout) the `{"detail": ...}` JSON body every other error has.
pub(crate) async fn json_errors(
    State(state): State<GatewayState>,
    req: Request,
    next: Next,
) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let detail = match status {
        StatusCode::NOT_FOUND => "Not Found".to_owned(),
        StatusCode::METHOD_NOT_ALLOWED => "Method Not Allowed".to_owned(),
        StatusCode::PAYLOAD_TOO_LARGE => format!(
            "Request body is larger than the limit of {} bytes.",
            state.gateway_config().max_body_bytes
        ),
        StatusCode::GATEWAY_TIMEOUT => format!(
            "Request timed out after {} seconds.",
            state.gateway_config().request_timeout.as_secs_f64()
        ),
        other => other.canonical_reason().unwrap_or("Error").to_owned(),
    };
    let (mut parts, _) = resp.into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let body = serde_json::to_vec(&json!({ "detail": detail })).unwrap_or_default();
    Response::from_parts(parts, Body::from(body))
}

/// The `memory.enabled` gate on the data routes: 503 with a fixed detail when disabled.
pub(crate) async fn require_enabled(
    State(state): State<GatewayState>,
    req: Request,
    next: Next,
) -> Response {
    if state.memory_config().enabled {
        next.run(req).await
    } else {
        GatewayError::Disabled.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_sanitised() {
        let ok = HeaderValue::from_static("abc-123");
        assert_eq!(usable_request_id(&ok).as_deref(), Some("abc-123"));
        let spaced = HeaderValue::from_static("a b");
        assert_eq!(usable_request_id(&spaced), None);
        let long = HeaderValue::from_str(&"x".repeat(129)).unwrap();
        assert_eq!(usable_request_id(&long), None);
        assert_eq!(method_label(&Method::CONNECT), "OTHER");
    }
}
