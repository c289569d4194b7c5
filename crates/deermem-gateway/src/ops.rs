//! Operational routes: liveness, readiness, Prometheus metrics, the OpenAPI document and its
//! human-readable page (`/docs`), and the fallback for unknown paths (FastAPI's trailing-slash
//! redirect, else 404).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::Value;

use crate::error::GatewayError;
use crate::openapi::Document;

use crate::schema::{Health, HealthStatus};
use crate::state::{GatewayState, Lifecycle};

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health {
        status: HealthStatus::Ok,
        last_backend_failure: None,
    })
}

/// How long `/readyz` waits for the storage check before answering not ready.
const READINESS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /readyz`: 200 once started (index warm-up does not delay it), 503 while starting or
/// draining, and 503 `unavailable` while the storage cannot be reached (when a readiness check
/// is installed: PostgreSQL storage), ready again as soon as it can.
/// The body names the memory backend's last failure reaching its server, when it had one.
pub(crate) async fn readyz(State(state): State<GatewayState>) -> Response {
    let mut status = match state.lifecycle() {
        Lifecycle::Ready => HealthStatus::Ready,
        Lifecycle::Starting => HealthStatus::Starting,
        Lifecycle::Stopping => HealthStatus::Stopping,
    };
    if status == HealthStatus::Ready
        && let Some(check) = &state.readiness
    {
        let reached = tokio::time::timeout(READINESS_TIMEOUT, check()).await;
        let late = || crate::state::StorageUnreachable("the storage did not answer in time".into());
        if let Err(reason) = reached.unwrap_or_else(|_| Err(late())) {
            tracing::warn!(reason = %reason, "not ready: the memory storage cannot be reached");
            status = HealthStatus::Unavailable;
        }
    }
    let (code, last_backend_failure) = match status {
        HealthStatus::Ready => (StatusCode::OK, state.manager().last_backend_failure()),
        _ => (StatusCode::SERVICE_UNAVAILABLE, None),
    };
    let health = Health {
        status,
        last_backend_failure,
    };
    (code, Json(health)).into_response()
}

/// `GET /metrics`: the Prometheus text exposition.
/// With a turn journal, its counts are read at each scrape (`deermem_turns_pending`,
/// `deermem_turns_dead`); a journal that fails or does not answer in time leaves the two gauges
/// out of that scrape (and logs why) rather than failing it.
pub(crate) async fn metrics(State(state): State<GatewayState>) -> Response {
    let turns = crate::turns::counts_for_metrics(&state).await;
    let body = state
        .metrics()
        .render_with_turns(state.lifecycle() == Lifecycle::Ready, turns);
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response()
}

/// `GET /openapi.json`: the document the router was built with.
pub(crate) async fn openapi(Extension(doc): Extension<Arc<Document>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        doc.json.clone(),
    )
        .into_response()
}

/// `GET /docs`: the API reference as one self-contained HTML page (no script, no external
/// asset), generated once from the OpenAPI document: every operation with its summary,
/// parameters, request body and responses, and a link to `/openapi.json`.
pub(crate) async fn docs(Extension(doc): Extension<Arc<Document>>) -> Response {
    let headers = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'",
        ),
    ];
    (headers, doc.html.clone()).into_response()
}

/// HTML text with `&`, `<`, `>`, `"` and `'` escaped.
fn escape(text: &str) -> String {
    deermem_pycompat::py::html_escape(text, true)
}

/// The short name of a schema: its component name, or its type.
fn schema_name(schema: &Value) -> String {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        return r.rsplit('/').next().unwrap_or(r).to_owned();
    }
    match schema.get("type") {
        Some(Value::String(t)) if t == "array" => {
            format!("array of {}", schema_name(&schema["items"]))
        }
        Some(Value::String(t)) => t.clone(),
        _ => "JSON".to_owned(),
    }
}

/// A string of the document, escaped (`""` when absent).
fn text(v: &Value) -> String {
    escape(v.as_str().unwrap_or(""))
}

/// Appends an HTML table: the header cells, then a row of (already escaped) cells per item.
fn table(out: &mut String, head: &[&str], rows: impl Iterator<Item = Vec<String>>) {
    let _ = writeln!(out, "<table><tr><th>{}</th></tr>", head.join("</th><th>"));
    for row in rows {
        let _ = writeln!(out, "<tr><td>{}</td></tr>", row.join("</td><td>"));
    }
    out.push_str("</table>\n");
}

/// Renders the OpenAPI document as HTML (operations in document order).
pub(crate) fn docs_html(doc: &Value) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}}\
         code{{background:#f3f3f3;padding:0 .2em}}h2{{font-size:1.1em;margin-top:2em}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2em .5em;\
         text-align:left;vertical-align:top}}</style></head><body>\n<h1>{t} {v}</h1>\n<p>{d}</p>\n\
         <p>Machine-readable: <a href=\"/openapi.json\">/openapi.json</a> (OpenAPI 3.1).</p>\n",
        t = escape(doc["info"]["title"].as_str().unwrap_or("API")),
        v = text(&doc["info"]["version"]),
        d = text(&doc["info"]["description"]),
    );
    let paths = doc["paths"].as_object().into_iter().flatten();
    for (path, ops) in paths {
        for (method, op) in ops.as_object().into_iter().flatten() {
            let _ = write!(
                out,
                "<h2 id=\"{id}\"><code>{m} {p}</code></h2>\n<p>{s}</p>\n",
                id = text(&op["operationId"]),
                m = escape(&method.to_ascii_uppercase()),
                p = escape(path),
                s = text(&op["summary"]),
            );
            if let Some(params) = op["parameters"].as_array() {
                let rows = params.iter().map(|p| {
                    let required = p["required"].as_bool().unwrap_or(false);
                    let name = format!("<code>{}</code>", text(&p["name"]));
                    let required = (if required { "yes" } else { "no" }).to_owned();
                    vec![name, text(&p["in"]), required, text(&p["description"])]
                });
                table(
                    &mut out,
                    &["parameter", "in", "required", "description"],
                    rows,
                );
            }
            for (ctype, media) in op["requestBody"]["content"]
                .as_object()
                .into_iter()
                .flatten()
            {
                let name = escape(&schema_name(&media["schema"]));
                let _ = writeln!(out, "<p>Body: <code>{name}</code> ({})</p>", escape(ctype));
            }
            if let Some(responses) = op["responses"].as_object() {
                let rows = responses.iter().map(|(status, reply)| {
                    let body = reply["content"].as_object().and_then(|c| c.iter().next());
                    let body = body.map(|(ctype, media)| {
                        format!("{} ({ctype})", schema_name(&media["schema"]))
                    });
                    let body = format!("<code>{}</code>", escape(&body.unwrap_or_default()));
                    vec![escape(status), text(&reply["description"]), body]
                });
                table(&mut out, &["status", "meaning", "body"], rows);
            }
        }
    }
    out.push_str("</body></html>\n");
    out
}

/// Whether a concrete path matches a route template (`{name}` matches one non-empty segment).
fn matches_template(template: &str, path: &str) -> bool {
    let t: Vec<&str> = template.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    t.len() == p.len()
        && t.iter().zip(&p).all(|(t, p)| {
            if t.starts_with('{') && t.ends_with('}') {
                !p.is_empty()
            } else {
                t == p
            }
        })
}

/// Unknown paths. Like FastAPI, a path that matches a route once its trailing slashes are
/// removed is redirected there (307, so the method and body are kept; the query string is
/// kept too; `Location` is the path, a relative reference). Anything else is 404.
pub(crate) async fn fallback(Extension(doc): Extension<Arc<Document>>, uri: Uri) -> Response {
    let path = uri.path();
    let trimmed = path.trim_end_matches('/');
    if trimmed.len() < path.len()
        && !trimmed.is_empty()
        && doc.paths.iter().any(|p| matches_template(p, trimmed))
    {
        let location = match uri.query() {
            Some(q) => format!("{trimmed}?{q}"),
            None => trimmed.to_owned(),
        };
        if let Ok(value) = HeaderValue::from_str(&location) {
            return (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, value)]).into_response();
        }
    }
    GatewayError::NotFound("Not Found".into()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_whole_segments() {
        assert!(matches_template("/api/memory", "/api/memory"));
        assert!(matches_template(
            "/api/memory/facts/{fact_id}",
            "/api/memory/facts/f1"
        ));
        assert!(!matches_template(
            "/api/memory/facts/{fact_id}",
            "/api/memory/facts/"
        ));
        assert!(!matches_template("/api/memory", "/api/memory/x"));
        assert!(!matches_template("/api/memory", "//evil.example"));
    }

    #[test]
    fn the_docs_page_escapes_and_lists_every_operation() {
        let doc = serde_json::json!({
            "info": {"title": "<b>x</b>", "version": "1"},
            "paths": {
                "/a/{id}": {"get": {"operationId": "a", "summary": "A & B", "parameters": [
                    {"name": "id", "in": "path", "required": true, "description": "<id>"}
                ], "responses": {"200": {"description": "OK", "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}
                }}}}},
                "/b": {"post": {"operationId": "b", "requestBody": {"content": {
                    "application/json": {"schema": {"type": "array", "items": {"type": "string"}}}
                }}}}
            }
        });
        let page = docs_html(&doc);
        assert!(page.contains("&lt;b&gt;x&lt;/b&gt;"), "{page}");
        assert!(page.contains("<code>GET /a/{id}</code>"), "{page}");
        assert!(page.contains("<code>POST /b</code>"), "{page}");
        assert!(
            page.contains("A &amp; B") && page.contains("&lt;id&gt;"),
            "{page}"
        );
        assert!(
            page.contains("<code>Thing (application/json)</code>"),
            "{page}"
        );
        assert!(page.contains("<code>array of string</code>"), "{page}");
        assert!(!page.contains("<script"));
    }
}
