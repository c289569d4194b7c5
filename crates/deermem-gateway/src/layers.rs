//! Cross-cutting middleware: CORS (tower-http's layer, from `gateway.cors`, with the preflight
//! log, count and 403 in front of it), the request id rule and log span for tower-http's
//! request-id and trace layers, request metrics, the JSON error-body normaliser (so 404, 405, 413 and timeouts
//! answer `{"detail": ...}` like every other error), and the `memory.enabled` gate.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_REQUEST_METHOD,
    CONTENT_LENGTH, CONTENT_TYPE, ORIGIN,
};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};
use tracing::Span;

use crate::config::CorsConfig;
use crate::error::GatewayError;
use crate::state::GatewayState;

/// The request id header (accepted from the client when sane, generated otherwise, and always
/// echoed back).
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Whether a client-sent request id is 1–128 visible ASCII characters.
fn usable_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(u8::is_ascii_graphic)
}

/// The method as a metrics and log label: the standard ones by name, any other as `OTHER`.
fn method_label(m: &Method) -> &'static str {
    const KNOWN: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
    KNOWN
        .into_iter()
        .find(|k| *k == m.as_str())
        .unwrap_or("OTHER")
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
        // The same rule as `cors_guard`'s verdict.
        let rule = cfg.clone();
        AllowOrigin::predicate(move |origin: &HeaderValue, _| {
            origin.to_str().is_ok_and(|o| rule.allows(o))
        })
    };
    CorsLayer::new()
        .allow_origin(origin)
        .allow_credentials(cfg.allow_credentials)
        .allow_methods(AllowMethods::mirror_request())
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([REQUEST_ID_HEADER])
        .max_age(PREFLIGHT_MAX_AGE)
}

/// Outside the CORS layer, when `gateway.cors` is set (otherwise it passes every request
/// through): logs and counts every preflight with its origin and verdict, answers a refused one
/// with 403 and a detail saying why, and drops `Access-Control-Allow-Credentials` from any
/// answer that grants no origin.
pub(crate) async fn cors_guard(
    State(state): State<GatewayState>,
    req: Request,
    next: Next,
) -> Response {
    let Some(cors) = state.gateway_config().cors.as_ref() else {
        return next.run(req).await;
    };
    let origin = req.headers().get(ORIGIN);
    let preflight = req.method() == Method::OPTIONS
        && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD);
    if let (true, Some(origin)) = (preflight, origin) {
        let allowed_by = origin.to_str().ok().and_then(|o| cors.matching(o));
        state.metrics().record_preflight(allowed_by);
        let shown = crate::auth::shown(origin);
        if allowed_by.is_none() {
            tracing::info!(origin = %shown, verdict = "refused", "CORS preflight refused");
            return GatewayError::Forbidden(format!(
                "CORS preflight refused: origin {shown:?} is not in gateway.cors.allowed_origins. \
                 To let pages from this origin call the gateway, add it there."
            ))
            .into_response();
        }
        tracing::info!(origin = %shown, verdict = "allowed", "CORS preflight");
    }
    let mut resp = next.run(req).await;
    if !resp.headers().contains_key(ACCESS_CONTROL_ALLOW_ORIGIN) {
        resp.headers_mut().remove(ACCESS_CONTROL_ALLOW_CREDENTIALS);
    }
    resp
}

/// Before tower-http's `SetRequestId`: a client-sent `X-Request-Id` is kept only if it is
/// 1–128 visible ASCII characters; otherwise it is dropped, so a fresh one is generated.
pub(crate) async fn drop_unusable_request_id(mut req: Request) -> Request {
    if req
        .headers()
        .get(&REQUEST_ID_HEADER)
        .is_some_and(|v| !usable_request_id(v))
    {
        req.headers_mut().remove(&REQUEST_ID_HEADER);
    }
    req
}

/// The `request` span tower-http's `TraceLayer` opens for each request: the request id, the
/// method and the route template (never the raw path or headers); `user` is recorded by the
/// authentication layer.
pub(crate) fn request_span(req: &Request) -> Span {
    let id = req
        .headers()
        .get(&REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "request",
        request_id = %id,
        method = method_label(req.method()),
        route = %route_of(req),
        user = tracing::field::Empty,
    )
}

/// The completion log line, inside the request span.
pub(crate) fn log_response(resp: &Response, latency: Duration, _span: &Span) {
    tracing::info!(
        status = resp.status().as_u16(),
        latency_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
        "request finished"
    );
}

fn route_of(req: &Request) -> String {
    req.extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned())
}

/// Request counts by route template, method and status, latency, and requests in flight.
pub(crate) async fn record_metrics(
    State(state): State<GatewayState>,
    req: Request,
    next: Next,
) -> Response {
    let route = route_of(&req);
    let method = method_label(req.method());
    let metrics = state.metrics().clone();
    let _in_flight = metrics.start_request();
    let start = Instant::now();
    let resp = next.run(req).await;
    metrics.record_request(&route, method, resp.status().as_u16(), start.elapsed());
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
        StatusCode::PAYLOAD_TOO_LARGE => {
            let limit = state.gateway_config().max_body_bytes;
            return GatewayError::PayloadTooLarge { limit }.into_response();
        }
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
        assert!(usable_request_id(&HeaderValue::from_static("abc-123")));
        assert!(!usable_request_id(&HeaderValue::from_static("a b")));
        assert!(!usable_request_id(&HeaderValue::from_static("")));
        let long = HeaderValue::from_str(&"x".repeat(129)).unwrap();
        assert!(!usable_request_id(&long));
        assert_eq!(method_label(&Method::CONNECT), "OTHER");
    }
}
