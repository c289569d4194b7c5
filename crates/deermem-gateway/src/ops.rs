//! Operational routes: liveness, readiness, Prometheus metrics and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::schema::{Health, HealthStatus};
use crate::state::{GatewayState, Lifecycle};

fn health(status: HealthStatus) -> Json<Health> {
    Json(Health {
        status,
        last_backend_failure: None,
    })
}

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> Json<Health> {
    health(HealthStatus::Ok)
}

/// `GET /readyz`: 200 once started (index warm-up does not delay it), 503 while starting or
/// draining.
/// The body names the memory backend's last failure reaching its server, when it had one.
pub(crate) async fn readyz(State(state): State<GatewayState>) -> Response {
    match state.lifecycle() {
        Lifecycle::Ready => (
            StatusCode::OK,
            Json(Health {
                status: HealthStatus::Ready,
                last_backend_failure: state.manager().last_backend_failure().map(Into::into),
            }),
        )
            .into_response(),
        Lifecycle::Starting => (
            StatusCode::SERVICE_UNAVAILABLE,
            health(HealthStatus::Starting),
        )
            .into_response(),
        Lifecycle::Stopping => (
            StatusCode::SERVICE_UNAVAILABLE,
            health(HealthStatus::Stopping),
        )
            .into_response(),
    }
}

/// `GET /metrics`: the Prometheus text exposition.
pub(crate) async fn metrics(State(state): State<GatewayState>) -> Response {
    let body = state
        .metrics()
        .render(state.lifecycle() == Lifecycle::Ready);
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    resp
}

/// `GET /openapi.json`.
pub(crate) async fn openapi() -> axum::response::Response {
    use axum::response::IntoResponse;
    // The document depends only on the build: generated and serialised once per process.
    static DOCUMENT: std::sync::OnceLock<axum::body::Bytes> = std::sync::OnceLock::new();
    let body = DOCUMENT.get_or_init(|| {
        axum::body::Bytes::from(serde_json::to_vec(&crate::openapi::document()).unwrap_or_default())
    });
    (
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body.clone(),
    )
        .into_response()
}
