//! A fake OpenViking server on 127.0.0.1 for tests (`deermem_backend_openviking::fake` with
//! that crate's feature `fake-server`): the seven
//! routes the backend uses, answering as a real OpenViking 0.5.2 server in `api_key` mode does
//! for one USER key, with strict checks of headers and bodies (every protocol deviation is
//! answered with the server's error and recorded as a violation), a request log, and switches
//! for the failures the backend must handle.
//!
//! What it shares with the real server (checked against 0.5.2): the `{status, result, error,
//! telemetry, profile}` envelope; `INVALID_URI` for `viking://user/memories` and the other
//! reserved first segments (the current user is `viking://~/…`), `PERMISSION_DENIED` for
//! another user's space; hits with exactly `context_type, uri, level, score, abstract, tags`
//! under `viking://user/<user id>/…`, directory summaries (`.overview.md`, level 1) mixed in
//! with memory files (level 2, tagged `memory_type=<type>`); `filter`, `tags`,
//! `score_threshold` and `limit` applied; `message_count` counting the messages since the last
//! commit (a commit resets it) while `total_message_count` keeps counting; a commit with
//! nothing to commit answered `skipped`.
//!
//! It is test infrastructure: the backend's tests, the facade's and the CLI's use it to prove
//! the backend end to end without a real server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Server, lock, started};

/// The USER API key the fake accepts.
pub const API_KEY: &str = "ov-user-key-7f3a9c";

/// The OpenViking user id the key belongs to (hit uris live under `viking://user/<this>/`).
pub const USER_ID: &str = "ov-alice";

/// First segments after `viking://user/` that name a space, not a user.
const RESERVED_USER_SEGMENTS: [&str; 6] = [
    "memories",
    "resources",
    "skills",
    "peers",
    "privacy",
    "sessions",
];

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
    /// Every message ever added (the fake keeps them after a commit, for assertions).
    messages: Vec<Value>,
    /// Messages added since the last commit (the server's `message_count`).
    uncommitted: usize,
    pending_tokens: u64,
    commits: usize,
}

/// Shared state and switches.
#[derive(Debug, Default)]
pub struct FakeState {
    requests: Mutex<Vec<Recorded>>,
    violations: Mutex<Vec<String>>,
    sessions: Mutex<HashMap<String, Session>>,
    /// The hits find and search choose from (see [`FakeOv::set_hits`], [`FakeOv::add_memory`]).
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
    /// The next N batches are stored, then answered only after [`FakeState::slow_delay`]: a
    /// client that gives up first does not know the server has them.
    pub slow_batches: AtomicUsize,
    /// The batch request with this 1-based number is slow (see [`FakeState::slow_batches`]).
    pub slow_batch_number: Mutex<Option<usize>>,
    /// The next N batches are not stored, and answered (with an error) only after
    /// [`FakeState::slow_delay`]: a client that gives up first cannot tell them from slow
    /// batches.
    pub lost_batches: AtomicUsize,
    /// How long a slow or lost batch's answer takes.
    pub slow_delay: Mutex<Duration>,
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

/// The server's envelope around a result: `error`, `telemetry` and `profile` are `null`.
fn ok_body(result: Value) -> Value {
    json!({"status": "ok", "result": result, "error": null, "telemetry": null, "profile": null})
}

/// A memory file's hit: level 2, tagged with its type.
#[must_use]
pub fn memory_hit(uri: &str, abstract_: &str, memory_type: &str, score: f64) -> Value {
    json!({"context_type": "memory", "uri": uri, "level": 2, "score": score,
           "abstract": abstract_, "tags": [format!("memory_type={memory_type}")]})
}

/// A directory summary's hit (level 1, no tags), as the server mixes them into results.
#[must_use]
pub fn directory_hit(uri: &str, abstract_: &str, score: f64) -> Value {
    json!({"context_type": "memory", "uri": uri, "level": 1, "score": score,
           "abstract": abstract_, "tags": []})
}

/// Title case of a memory type, for directory summaries (`preferences` → `Preferences`).
fn title(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// A running fake server; dropping it stops the server.
#[derive(Debug)]
pub struct FakeOv {
    /// The loopback address it listens on.
    pub addr: SocketAddr,
    /// Shared state and the failure switches.
    pub state: Arc<FakeState>,
    server: Server,
}

impl Drop for FakeOv {
    fn drop(&mut self) {
        self.server.abort();
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
        let server = Server::start(app, "fake OpenViking server").await?;
        Ok(Self {
            addr: server.addr,
            state,
            server,
        })
    }

    /// As [`FakeOv::try_start`], for tests.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start() -> Self {
        started(Self::try_start().await, "fake OpenViking server")
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

    /// Replaces the hits `find` and `search` choose from. They are filtered like the server
    /// filters its index (target uris, `filter`, `tags`, `score_threshold`), ordered by score
    /// and cut to `limit`; a hit without a string `uri` or `score` passes those checks.
    pub fn set_hits(&self, hits: Vec<Value>) {
        *lock(&self.state.hits) = hits;
    }

    /// Stores a memory the way the server's extractor does: a file
    /// `viking://user/<USER_ID>/memories/<type>/<USER_ID>/<name>.md` tagged
    /// `memory_type=<type>` whose abstract and content are `text`, plus the directory summaries
    /// the server writes beside it (the type directory's `.overview.md` listing its files, and
    /// the memory root's `.overview.md`). Returns the memory's uri.
    pub fn add_memory(&self, memory_type: &str, name: &str, text: &str, score: f64) -> String {
        let dir = format!("viking://user/{USER_ID}/memories/{memory_type}/{USER_ID}");
        let uri = format!("{dir}/{name}.md");
        let overview_uri = format!("{dir}/.overview.md");
        let root_uri = format!("viking://user/{USER_ID}/memories/.overview.md");
        let mut hits = lock(&self.state.hits);
        let mut contents = lock(&self.state.contents);
        hits.push(memory_hit(&uri, text, memory_type, score));
        contents.insert(uri.clone(), Value::String(text.to_owned()));
        let listed: Vec<String> = hits
            .iter()
            .filter_map(|h| h.get("uri").and_then(Value::as_str))
            .filter_map(|u| u.strip_prefix(&format!("{dir}/")))
            .filter(|f| !f.starts_with('.'))
            .map(|f| format!("- [{}](./{f})", f.trim_end_matches(".md")))
            .collect();
        let overview = format!(
            "# {} Overview\n**User:** {USER_ID}\n\n{}",
            title(memory_type),
            listed.join("\n")
        );
        hits.retain(|h| h.get("uri").and_then(Value::as_str) != Some(overview_uri.as_str()));
        hits.push(directory_hit(&overview_uri, &overview, score + 0.05));
        contents.insert(
            overview_uri.clone(),
            Value::String(format!(
                "---\ndirectory: {dir}/\ngenerated_by:\n  component: MemoryUpdater\n---\n\n{overview}\n"
            )),
        );
        if !hits
            .iter()
            .any(|h| h.get("uri").and_then(Value::as_str) == Some(root_uri.as_str()))
        {
            hits.push(directory_hit(
                &root_uri,
                "User's long-term memory storage. Contains memory types like preferences, entities, events, managed hierarchically by type.",
                0.5,
            ));
        }
        uri
    }

    /// The session's counters as `GET /api/v1/sessions/{id}` reports them:
    /// `(message_count, total_message_count)`.
    pub fn session_counts(&self, sid: &str) -> Option<(usize, usize)> {
        lock(&self.state.sessions)
            .get(sid)
            .map(|s| (s.uncommitted, s.messages.len()))
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
    (StatusCode::OK, axum::Json(ok_body(result))).into_response()
}

fn envelope_err_details(status: StatusCode, code: &str, message: &str, details: Value) -> Response {
    (
        status,
        axum::Json(json!({"status": "error", "result": null,
            "error": {"code": code, "message": message, "details": details},
            "telemetry": null, "profile": null})),
    )
        .into_response()
}

fn envelope_err(status: StatusCode, code: &str, message: &str) -> Response {
    envelope_err_details(status, code, message, json!({}))
}

fn bad_request(state: &FakeState, message: String) -> Response {
    state.violation(message.clone());
    envelope_err(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", &message)
}

/// Resolves a request's target uri as the server does for a USER key: `viking://~/…` is the
/// user's own space; `viking://user/<reserved>/…` is refused (`INVALID_URI`), another user's
/// space is `PERMISSION_DENIED`.
fn resolve_target(uri: &str) -> Result<String, Box<Response>> {
    let own = format!("viking://user/{USER_ID}");
    if let Some(rest) = uri.strip_prefix("viking://~") {
        return Ok(format!("{own}{rest}"));
    }
    if let Some(rest) = uri.strip_prefix("viking://user/") {
        let first = rest.split('/').next().unwrap_or_default();
        if first != USER_ID && RESERVED_USER_SEGMENTS.contains(&first) {
            let reason = format!(
                "'viking://user/{rest}' no longer expands to the current user's space: '{first}' is a reserved name, not a user id. Use 'viking://~/{rest}' for the current user, or 'viking://user/{{user_id}}/{rest}' for an explicit user."
            );
            return Err(Box::new(envelope_err_details(
                StatusCode::BAD_REQUEST,
                "INVALID_URI",
                &format!("Invalid URI: {uri} ({reason})"),
                json!({"uri": uri, "reason": reason}),
            )));
        }
        if first != USER_ID {
            return Err(Box::new(envelope_err_details(
                StatusCode::FORBIDDEN,
                "PERMISSION_DENIED",
                &format!("Access denied for {uri}: read permission required"),
                json!({"resource": uri}),
            )));
        }
        return Ok(uri.to_owned());
    }
    Ok(uri.to_owned())
}

/// Whether a hit passes a `filter` clause (`must` on a field: the hit's value, or one of its
/// values, is in `conds`; `and` / `or` combine clauses). The server stores a hit's tags in the
/// field `search_tags`; fields a hit does not carry (`category`) match nothing.
fn filter_matches(hit: &Value, filter: &Value) -> bool {
    let conds = filter.get("conds").and_then(Value::as_array);
    match filter.get("op").and_then(Value::as_str) {
        Some("and") => conds.is_some_and(|c| c.iter().all(|f| filter_matches(hit, f))),
        Some("or") => conds.is_some_and(|c| c.iter().any(|f| filter_matches(hit, f))),
        Some("must") => {
            let field = filter
                .get("field")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let key = if field == "search_tags" {
                "tags"
            } else {
                field
            };
            let Some(wanted) = conds else { return false };
            match hit.get(key) {
                Some(Value::Array(values)) => values.iter().any(|v| wanted.contains(v)),
                Some(v) => wanted.contains(v),
                None => false,
            }
        }
        _ => true,
    }
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
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(API_KEY) => {}
        Some(_) => {
            return envelope_err(
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
                "Invalid API key",
            );
        }
        None => {
            state.violation(format!("missing X-API-Key on {path}"));
            return envelope_err(
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
                "Missing API key",
            );
        }
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
            axum::Json(json!({"status": "ok", "healthy": true, "version": "0.5.2",
                "auth_mode": "api_key", "account_id": "acme", "user_id": USER_ID, "role": "user"})),
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
                    None => (
                        StatusCode::NOT_FOUND,
                        axum::Json(json!({"status": "error",
                            "error": {"code": "NOT_FOUND", "message": format!("Session {sid} not found")}})),
                    )
                        .into_response(),
                    Some(s) => {
                        let pending = if state.report_zero_pending.load(Ordering::SeqCst) {
                            0
                        } else {
                            s.pending_tokens
                        };
                        envelope_ok(json!({"session_id": sid,
                            "message_count": s.uncommitted, "commit_count": s.commits,
                            "pending_tokens": pending, "keep_recent_count": 0,
                            "total_message_count": s.messages.len(),
                            "uri": format!("viking://user/{USER_ID}/sessions/{sid}"),
                            "user": {"account_id": "acme", "user_id": USER_ID}}))
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
    if take(&state.lost_batches) {
        let delay = *lock(&state.slow_delay);
        tokio::time::sleep(delay).await;
        return envelope_err(
            StatusCode::GATEWAY_TIMEOUT,
            "DEADLINE_EXCEEDED",
            "batch was not stored",
        );
    }
    let reply = {
        let mut sessions = lock(&state.sessions);
        let s = sessions.entry(sid.to_owned()).or_default();
        s.messages.extend(messages.iter().cloned());
        s.uncommitted += messages.len();
        s.pending_tokens += messages.len() as u64 * 10;
        json!({"session_id": sid, "message_count": s.uncommitted,
            "added": messages.len(), "pending_tokens": s.pending_tokens})
    };
    if take(&state.slow_batches) || *lock(&state.slow_batch_number) == Some(n) {
        let delay = *lock(&state.slow_delay);
        tokio::time::sleep(delay).await;
    }
    envelope_ok(reply)
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
        return envelope_err(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            &format!("Session {sid} not found"),
        );
    };
    if s.uncommitted == 0 {
        return (
            StatusCode::OK,
            axum::Json(
                json!({"status": "ok", "result": {"session_id": sid, "status": "skipped",
                "task_id": null, "archive_uri": null, "archived": false, "reason": "no_messages"}}),
            ),
        )
            .into_response();
    }
    s.pending_tokens = 0;
    s.uncommitted = 0;
    s.commits += 1;
    (
        StatusCode::OK,
        axum::Json(json!({"status": "ok", "result": {"session_id": sid, "status": "accepted",
            "task_id": format!("task-{}", s.commits),
            "archive_uri": format!("viking://user/{USER_ID}/sessions/{sid}/history/archive_{:03}", s.commits),
            "archived": true}})),
    )
        .into_response()
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
    let limit = body
        .get("limit")
        .and_then(Value::as_u64)
        .filter(|l| *l >= 1);
    let tags_ok = body.get("tags").is_none_or(|t| {
        t.as_array().is_some_and(|items| {
            items.iter().all(|i| {
                i.as_str().is_some_and(|s| {
                    s.matches('=').count() == 1 && !s.starts_with('=') && !s.ends_with('=')
                })
            })
        })
    });
    let Some(limit) = limit else {
        return bad_request(state, format!("bad retrieval body {body:?}"));
    };
    if !body.get("query").is_some_and(Value::is_string)
        || !tags_ok
        || !body
            .get("target_uri")
            .is_some_and(|t| t.is_array() || t.is_string())
    {
        return bad_request(state, format!("bad retrieval body {body:?}"));
    }
    let targets: Vec<&str> = match body.get("target_uri") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let mut resolved = Vec::new();
    for t in targets {
        match resolve_target(t) {
            Ok(r) => resolved.push(r),
            Err(resp) => {
                state.violation(format!("target uri {t} refused"));
                return *resp;
            }
        }
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
    let tag_filter: Vec<Value> = body
        .get("tags")
        .and_then(Value::as_array)
        .map(|t| {
            t.iter()
                .filter_map(Value::as_str)
                .map(|s| Value::String(s.to_lowercase()))
                .collect()
        })
        .unwrap_or_default();
    let threshold = body.get("score_threshold").and_then(Value::as_f64);
    let mut hits: Vec<Value> = lock(&state.hits)
        .iter()
        .filter(|h| match h.get("uri").and_then(Value::as_str) {
            Some(u) => resolved.is_empty() || resolved.iter().any(|r| u.starts_with(r.as_str())),
            None => true,
        })
        .filter(|h| body.get("filter").is_none_or(|f| filter_matches(h, f)))
        .filter(|h| {
            tag_filter.iter().all(|t| {
                h.get("tags")
                    .and_then(Value::as_array)
                    .is_some_and(|tags| tags.contains(t))
            })
        })
        .filter(
            |h| match (threshold, h.get("score").and_then(Value::as_f64)) {
                (Some(min), Some(score)) => score >= min,
                _ => true,
            },
        )
        .cloned()
        .collect();
    // Highest score first, as the server ranks; hits without a score keep their place last.
    hits.sort_by(|a, b| {
        let sa = a.get("score").and_then(Value::as_f64).unwrap_or(f64::MIN);
        let sb = b.get("score").and_then(Value::as_f64).unwrap_or(f64::MIN);
        sb.total_cmp(&sa)
    });
    hits.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let total = hits.len();
    envelope_ok(json!({"memories": hits, "resources": [], "skills": [], "total": total}))
}
