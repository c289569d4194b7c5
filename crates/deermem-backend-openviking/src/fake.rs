//! A fake OpenViking server on 127.0.0.1 for tests (Cargo feature `fake-server`): the seven
//! routes the backend uses with the `{status, result|error}` envelope, strict checks of headers
//! and bodies (every protocol deviation is answered with an error and recorded as a violation),
//! a request log, and switches for the failures the backend must handle.
//!
//! It is test infrastructure: this crate's tests, the facade's and the CLI's use it to prove
//! the backend end to end without a real server. Production builds never enable the feature.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The USER API key the fake accepts.
pub const API_KEY: &str = "ov-user-key-7f3a9c";

/// Headers a request may carry (anything else is a violation).
const ALLOWED_HEADERS: [&str; 7] = [
    "host",
    "x-api-key",
    "x-openviking-actor-peer",
    "content-type",
    "content-length",
    "accept",
    "accept-encoding",
];

const FIND_KEYS: [&str; 17] = [
    "query",
    "image_url",
    "target_uri",
    "context_type",
    "limit",
    "node_limit",
    "score_threshold",
    "filter",
    "include_provenance",
    "tags",
    "since",
    "until",
    "time_field",
    "level",
    "read_content",
    "telemetry",
    "events_time_decay_protection",
];

/// One request as the fake received it.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// The path (still percent-encoded).
    pub path: String,
    /// The query string, when any.
    pub query: Option<String>,
    /// Every header, lower-case names (non-text values as `<binary>`).
    pub headers: Vec<(String, String)>,
    /// The JSON body, when any.
    pub body: Option<Value>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recorded {
    /// The first header with this name (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `METHOD path` for sequence assertions.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

#[derive(Debug, Default)]
struct Session {
    messages: Vec<Value>,
    pending_tokens: u64,
    commits: usize,
}

/// Shared state and switches.
#[derive(Debug, Default)]
pub struct FakeState {
    requests: Mutex<Vec<Recorded>>,
    violations: Mutex<Vec<String>>,
    sessions: Mutex<HashMap<String, Session>>,
    /// Memory hits returned by find and search.
    pub hits: Mutex<Vec<Value>>,
    /// Content returned by `content/read`, by uri (missing uri: NOT_FOUND).
    pub contents: Mutex<HashMap<String, Value>>,
    /// The next N read requests (find, search, get session, read, health) get 503 UNAVAILABLE.
    pub unavailable_reads: AtomicUsize,
    /// The next N write requests (batch, commit) get 503 UNAVAILABLE.
    pub unavailable_writes: AtomicUsize,
    /// The next N find/search requests get a 500 INTERNAL envelope.
    pub failing_retrievals: AtomicUsize,
    /// The next N commits get an HTML 500.
    pub commit_html_500: AtomicUsize,
    /// The batch request with this 1-based number fails with 500 INTERNAL.
    pub fail_batch_number: Mutex<Option<usize>>,
    batch_calls: AtomicUsize,
    /// GET session reports zero pending tokens whatever was added.
    pub report_zero_pending: AtomicBool,
    /// `/health` answers unhealthy.
    pub unhealthy: AtomicBool,
    /// Batch requests wait until the gate opens.
    gate_closed: AtomicBool,
    gate: tokio::sync::Notify,
    /// Signalled when a batch request arrives.
    pub batch_arrived: tokio::sync::Notify,
}

impl FakeState {
    fn record(&self, r: Recorded) {
        lock(&self.requests).push(r);
    }

    fn violation(&self, v: String) {
        lock(&self.violations).push(v);
    }

    fn take_read_failure(&self) -> bool {
        take(&self.unavailable_reads)
    }
}

fn take(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// A running fake server; dropping it stops the server.
#[derive(Debug)]
pub struct FakeOv {
    /// The loopback address it listens on.
    pub addr: SocketAddr,
    /// Shared state and the failure switches.
    pub state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOv {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeOv {
    /// Starts the fake on an ephemeral loopback port, served by a task on the current tokio
    /// runtime.
    ///
    /// # Errors
    /// No loopback port could be bound.
    pub async fn try_start() -> std::io::Result<Self> {
        let state = Arc::new(FakeState::default());
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "fake OpenViking server stopped");
            }
        });
        Ok(Self { addr, state, task })
    }

    /// As [`FakeOv::try_start`], for tests.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start() -> Self {
        match Self::try_start().await {
            Ok(fake) => fake,
            Err(e) => panic!("cannot start the fake OpenViking server on 127.0.0.1: {e}"),
        }
    }

    /// The base URL, `http://127.0.0.1:PORT` (the backend's `base_url`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.addr.port())
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.state.requests).clone()
    }

    /// `METHOD path` of every request so far.
    pub fn lines(&self) -> Vec<String> {
        self.requests().iter().map(Recorded::line).collect()
    }

    /// Forgets the recorded requests.
    pub fn clear(&self) {
        lock(&self.state.requests).clear();
    }

    /// Every protocol violation recorded so far (empty for a well-behaved client).
    pub fn violations(&self) -> Vec<String> {
        lock(&self.state.violations).clone()
    }

    /// Panics when any request broke the protocol.
    ///
    /// # Panics
    /// When [`FakeOv::violations`] is not empty, listing them.
    pub fn assert_clean(&self) {
        let v = self.violations();
        assert!(v.is_empty(), "protocol violations: {v:#?}");
    }

    /// Messages stored in a session.
    pub fn session_messages(&self, sid: &str) -> Vec<Value> {
        lock(&self.state.sessions)
            .get(sid)
            .map(|s| s.messages.clone())
            .unwrap_or_default()
    }

    /// Ids of every session that received messages, sorted.
    pub fn session_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = lock(&self.state.sessions).keys().cloned().collect();
        ids.sort();
        ids
    }

    /// How many commits a session received.
    pub fn session_commits(&self, sid: &str) -> usize {
        lock(&self.state.sessions).get(sid).map_or(0, |s| s.commits)
    }

    /// Sets the memory hits `find` and `search` return.
    pub fn set_hits(&self, hits: Vec<Value>) {
        *lock(&self.state.hits) = hits;
    }

    /// Holds every batch request until [`FakeOv::open_gate`].
    pub fn close_gate(&self) {
        self.state.gate_closed.store(true, Ordering::SeqCst);
    }

    /// Releases held batch requests.
    pub fn open_gate(&self) {
        self.state.gate_closed.store(false, Ordering::SeqCst);
        self.state.gate.notify_waiters();
    }
}

fn envelope_ok(result: Value) -> Response {
    (
        StatusCode::OK,
        axum::Json(json!({"status": "ok", "result": result})),
    )
        .into_response()
}

fn envelope_err(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"status": "error", "error": {"code": code, "message": message}})),
    )
        .into_response()
}

fn bad_request(state: &FakeState, message: String) -> Response {
    state.violation(message.clone());
    envelope_err(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", &message)
}

async fn handle(
    State(state): State<Arc<FakeState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body_json: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(e) => {
                return bad_request(&state, format!("body is not JSON: {e}"));
            }
        }
    };
    let header_list: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or("<binary>").to_owned(),
            )
        })
        .collect();
    let path = uri.path().to_owned();
    state.record(Recorded {
        method: method.to_string(),
        path: path.clone(),
        query: uri.query().map(str::to_owned),
        headers: header_list.clone(),
        body: body_json.clone(),
    });

    for (k, _) in &header_list {
        if !ALLOWED_HEADERS.contains(&k.as_str()) {
            state.violation(format!("unexpected header {k} on {path}"));
        }
    }
    if body_json.is_some()
        && headers.get("content-type").and_then(|v| v.to_str().ok()) != Some("application/json")
    {
        state.violation(format!("body without application/json on {path}"));
    }
    if headers.get("x-api-key").and_then(|v| v.to_str().ok()) != Some(API_KEY) {
        state.violation(format!("missing or wrong X-API-Key on {path}"));
        return envelope_err(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "bad key");
    }
    let actor = headers
        .get("x-openviking-actor-peer")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);

    if path == "/health" {
        if actor.is_some() {
            state.violation("actor peer header on /health".into());
        }
        if method != Method::GET {
            return bad_request(&state, format!("{method} /health"));
        }
        if state.take_read_failure() {
            return envelope_err(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", "warming up");
        }
        if state.unhealthy.load(Ordering::SeqCst) {
            return (
                StatusCode::OK,
                axum::Json(json!({"status": "degraded", "healthy": false})),
            )
                .into_response();
        }
        return (
            StatusCode::OK,
            axum::Json(json!({"status": "ok", "healthy": true, "version": "0.5.2", "auth_mode": "api_key"})),
        )
            .into_response();
    }

    let Some(actor) = actor else {
        return bad_request(&state, format!("missing actor peer header on {path}"));
    };
    if actor.contains('/') || actor.contains('\\') || actor.is_empty() {
        return bad_request(&state, format!("invalid actor peer {actor:?}"));
    }

    if let Some(rest) = path.strip_prefix("/api/v1/sessions/") {
        let (sid, action) = match rest.split_once('/') {
            Some((s, a)) => (s.to_owned(), Some(a.to_owned())),
            None => (rest.to_owned(), None),
        };
        return match (method.clone(), action.as_deref()) {
            (Method::POST, Some("messages/batch")) => batch(&state, &sid, &actor, body_json).await,
            (Method::POST, Some("commit")) => commit(&state, &sid, body_json),
            (Method::GET, None) => {
                if uri.query().is_some() {
                    state.violation("query string on GET session".into());
                }
                if state.take_read_failure() {
                    return envelope_err(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", "busy");
                }
                let sessions = lock(&state.sessions);
                match sessions.get(&sid) {
                    None => envelope_err(StatusCode::NOT_FOUND, "NOT_FOUND", "session not found"),
                    Some(s) => {
                        let pending = if state.report_zero_pending.load(Ordering::SeqCst) {
                            0
                        } else {
                            s.pending_tokens
                        };
                        envelope_ok(json!({"session_id": sid, "pending_tokens": pending,
                            "message_count": s.messages.len(), "commit_count": s.commits}))
                    }
                }
            }
            _ => bad_request(&state, format!("unknown session route {method} {path}")),
        };
    }
    match (method.clone(), path.as_str()) {
        (Method::POST, "/api/v1/search/find") => retrieve(&state, body_json, false),
        (Method::POST, "/api/v1/search/search") => retrieve(&state, body_json, true),
        (Method::GET, "/api/v1/content/read") => {
            let params: HashMap<String, String> =
                uri.query().map(url_decode_pairs).unwrap_or_default();
            if params.get("offset").map(String::as_str) != Some("0")
                || params.get("limit").map(String::as_str) != Some("-1")
            {
                return bad_request(&state, format!("bad read params {params:?}"));
            }
            if state.take_read_failure() {
                return envelope_err(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", "busy");
            }
            let uri_param = params.get("uri").cloned().unwrap_or_default();
            match lock(&state.contents).get(&uri_param) {
                Some(v) => envelope_ok(v.clone()),
                None => envelope_err(StatusCode::NOT_FOUND, "NOT_FOUND", "no such content"),
            }
        }
        _ => bad_request(&state, format!("unknown route {method} {path}")),
    }
}

fn url_decode_pairs(q: &str) -> HashMap<String, String> {
    url::form_urlencoded::parse(q.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

async fn batch(state: &FakeState, sid: &str, actor: &str, body: Option<Value>) -> Response {
    let n = state.batch_calls.fetch_add(1, Ordering::SeqCst) + 1;
    state.batch_arrived.notify_one();
    loop {
        let notified = state.gate.notified();
        if !state.gate_closed.load(Ordering::SeqCst) {
            break;
        }
        notified.await;
    }
    let Some(Value::Object(body)) = body else {
        return bad_request(state, "batch body must be an object".into());
    };
    if body.keys().collect::<Vec<_>>() != ["messages"] {
        return bad_request(
            state,
            format!("batch body keys {:?}", body.keys().collect::<Vec<_>>()),
        );
    }
    let Some(Value::Array(messages)) = body.get("messages") else {
        return bad_request(state, "messages must be a list".into());
    };
    if messages.is_empty() || messages.len() > 100 {
        return bad_request(state, format!("batch of {} messages", messages.len()));
    }
    for m in messages {
        let ok = m
            .get("role")
            .and_then(Value::as_str)
            .is_some_and(|r| r == "user" || r == "assistant")
            && m.get("parts")
                .and_then(Value::as_array)
                .is_some_and(|p| !p.is_empty())
            && m.get("peer_id").and_then(Value::as_str) == Some(actor)
            && m.as_object().is_some_and(|o| {
                o.keys()
                    .all(|k| ["role", "parts", "peer_id"].contains(&k.as_str()))
            });
        if !ok {
            return bad_request(state, format!("bad message payload {m}"));
        }
    }
    if take(&state.unavailable_writes) {
        return envelope_err(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", "busy");
    }
    if *lock(&state.fail_batch_number) == Some(n) {
        return envelope_err(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "disk full");
    }
    let mut sessions = lock(&state.sessions);
    let s = sessions.entry(sid.to_owned()).or_default();
    s.messages.extend(messages.iter().cloned());
    s.pending_tokens += messages.len() as u64 * 10;
    envelope_ok(json!({"session_id": sid, "message_count": s.messages.len(),
        "added": messages.len(), "pending_tokens": s.pending_tokens}))
}

fn commit(state: &FakeState, sid: &str, body: Option<Value>) -> Response {
    if body != Some(json!({"keep_recent_count": 0, "telemetry": false})) {
        return bad_request(state, format!("commit body {body:?}"));
    }
    if take(&state.unavailable_writes) {
        return envelope_err(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", "busy");
    }
    if take(&state.commit_html_500) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "<html><body>Internal Server Error</body></html>",
        )
            .into_response();
    }
    let mut sessions = lock(&state.sessions);
    let Some(s) = sessions.get_mut(sid) else {
        return envelope_err(StatusCode::NOT_FOUND, "NOT_FOUND", "session not found");
    };
    s.pending_tokens = 0;
    s.commits += 1;
    envelope_ok(
        json!({"session_id": sid, "status": "accepted", "task_id": "t-1",
        "archive_uri": format!("viking://session/{sid}/history/1"), "archived": true}),
    )
}

fn retrieve(state: &FakeState, body: Option<Value>, with_session: bool) -> Response {
    let Some(Value::Object(body)) = body else {
        return bad_request(state, "retrieval body must be an object".into());
    };
    for k in body.keys() {
        let allowed = FIND_KEYS.contains(&k.as_str()) || (with_session && k == "session_id");
        if !allowed {
            return bad_request(
                state,
                format!("Invalid request parameters: body.{k}: Extra inputs are not permitted"),
            );
        }
    }
    let limit_ok = body
        .get("limit")
        .and_then(Value::as_u64)
        .is_some_and(|l| l >= 1);
    if !body.get("query").is_some_and(Value::is_string)
        || !limit_ok
        || !body
            .get("target_uri")
            .is_some_and(|t| t.is_array() || t.is_string())
    {
        return bad_request(state, format!("bad retrieval body {body:?}"));
    }
    if state.take_read_failure() {
        return envelope_err(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", "busy");
    }
    if take(&state.failing_retrievals) {
        return envelope_err(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "index offline",
        );
    }
    let hits = lock(&state.hits).clone();
    let total = hits.len();
    envelope_ok(json!({"memories": hits,
        "resources": [{"context_type": "resource", "uri": "viking://resources/doc.md", "level": 2, "score": 0.99, "abstract": "RESOURCE TEXT MUST NOT APPEAR"}],
        "skills": [], "total": total + 1}))
}
