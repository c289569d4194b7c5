//! A fake Honcho v3 server on 127.0.0.1 for tests (`deermem_backend_honcho::fake` with that
//! crate's feature `fake-server`): the six POST
//! routes the backend uses, request validation against Honcho's v3 schemas (id pattern, 1–100
//! messages per batch, 25 000-character contents, limits 1–100), a record of every request,
//! and switches for failures, delays and a server that forgot its sessions.
//!
//! It is test infrastructure: the backend's tests, the facade's and the CLI's use it to prove
//! the backend end to end without a real server.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::to_bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};

use super::{Server, lock, started};

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// The path exactly as sent (still percent-encoded).
    pub raw_path: String,
    /// The decoded path segments after `/v3/`.
    pub segments: Vec<String>,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The `Content-Type` header.
    pub content_type: Option<String>,
    /// The JSON body (`Null` when absent or invalid).
    pub body: Value,
    /// The status answered.
    pub status: u16,
}

/// A stored message.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The workspace id (decoded).
    pub workspace: String,
    /// The session id (decoded).
    pub session: String,
    /// The peer that said it.
    pub peer_id: String,
    /// The message text.
    pub content: String,
}

#[derive(Default)]
struct Inner {
    requests: Vec<Recorded>,
    peers: HashMap<String, HashSet<String>>,
    sessions: HashMap<String, HashSet<String>>,
    messages: Vec<Stored>,
    representations: HashMap<(String, String), String>,
    raw_representation: Option<Value>,
    fail_status: u16,
    fail_remaining: usize,
    reject_messages: Option<u16>,
    /// (message batches still let through, status, failures left)
    fail_messages: Option<(usize, u16, usize)>,
    delay: Duration,
    next_id: u64,
}

/// The fake server handle. Clones share the server; it runs until its tokio runtime stops.
#[derive(Clone)]
pub struct FakeHoncho {
    /// The base URL, `http://127.0.0.1:PORT` (the backend's `base_url`).
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

impl fmt::Debug for FakeHoncho {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeHoncho")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 512
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn invalid(msg: &str) -> (u16, Value) {
    (
        422,
        json!({"detail": [{"msg": msg, "type": "value_error"}]}),
    )
}

fn int_in(v: Option<&Value>, lo: i64, hi: i64) -> Result<(), String> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) if (lo..=hi).contains(&i) => Ok(()),
            _ => Err(format!("must be between {lo} and {hi}")),
        },
        _ => Err("must be an integer".into()),
    }
}

impl FakeHoncho {
    /// Starts the fake on an ephemeral loopback port, served by a task on the current tokio
    /// runtime.
    ///
    /// # Errors
    /// No loopback port could be bound.
    pub async fn try_start() -> std::io::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&inner));
        let server = Server::start(app, "fake Honcho server").await?;
        Ok(Self {
            url: server.url(""),
            inner,
        })
    }

    /// As [`FakeHoncho::try_start`], for tests.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start() -> Self {
        started(Self::try_start().await, "fake Honcho server")
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.inner).requests.clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        lock(&self.inner).requests.clear();
    }

    /// `(raw path, body)` of every request, for exact sequence assertions.
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.requests()
            .into_iter()
            .map(|r| (r.raw_path, r.body))
            .collect()
    }

    /// Every stored message.
    pub fn messages(&self) -> Vec<Stored> {
        lock(&self.inner).messages.clone()
    }

    /// Answers the next `count` requests with `status` (`usize::MAX` for always; 0 stops).
    pub fn fail(&self, status: u16, count: usize) {
        let mut i = lock(&self.inner);
        i.fail_status = status;
        i.fail_remaining = count;
    }

    /// Rejects the next message batch with `status`.
    pub fn reject_next_messages(&self, status: u16) {
        lock(&self.inner).reject_messages = Some(status);
    }

    /// Lets `ok_first` message batches through, then answers the next `count` with `status`.
    pub fn fail_messages_after(&self, ok_first: usize, status: u16, count: usize) {
        lock(&self.inner).fail_messages = Some((ok_first, status, count));
    }

    /// Delays every answer.
    pub fn delay(&self, d: Duration) {
        lock(&self.inner).delay = d;
    }

    /// Simulates a server that lost its sessions.
    pub fn forget_sessions(&self) {
        lock(&self.inner).sessions.clear();
    }

    /// Sets a peer's representation.
    pub fn set_representation(&self, workspace: &str, peer: &str, text: &str) {
        lock(&self.inner)
            .representations
            .insert((workspace.into(), peer.into()), text.into());
    }

    /// Makes the representation route answer this exact JSON body.
    pub fn set_raw_representation(&self, body: Value) {
        lock(&self.inner).raw_representation = Some(body);
    }
}

async fn handle(State(inner): State<Arc<Mutex<Inner>>>, req: Request) -> Response {
    let method = req.method().clone();
    let raw_path = req.uri().path().to_owned();
    let (authorization, content_type) = {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (header("authorization"), header("content-type"))
    };
    let bytes = to_bytes(req.into_body(), 64 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let segments: Vec<String> = raw_path
        .strip_prefix("/v3/")
        .unwrap_or("")
        .split('/')
        .map(|s| percent_decode_str(s).decode_utf8_lossy().into_owned())
        .collect();
    let (index, delay) = {
        let mut i = lock(&inner);
        i.requests.push(Recorded {
            method: method.to_string(),
            raw_path: raw_path.clone(),
            segments: segments.clone(),
            authorization,
            content_type,
            body: body.clone(),
            status: 0,
        });
        (i.requests.len() - 1, i.delay)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (status, answer) = {
        let mut i = lock(&inner);
        let out = if i.fail_remaining > 0 {
            if i.fail_remaining != usize::MAX {
                i.fail_remaining -= 1;
            }
            (
                i.fail_status,
                json!({"detail": "An unexpected error occurred"}),
            )
        } else if method != Method::POST {
            (405, json!({"detail": "Method Not Allowed"}))
        } else {
            route(&mut i, &segments, &body)
        };
        if let Some(r) = i.requests.get_mut(index) {
            r.status = out.0;
        }
        out
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(answer)).into_response()
}

fn route(i: &mut Inner, seg: &[String], body: &Value) -> (u16, Value) {
    let s: Vec<&str> = seg.iter().map(String::as_str).collect();
    let Some(obj) = body.as_object() else {
        return invalid("body must be a JSON object");
    };
    match s.as_slice() {
        ["workspaces", ws, "peers"] => {
            let Some(id) = obj.get("id").and_then(Value::as_str).filter(|id| is_id(id)) else {
                return invalid("id must match ^[a-zA-Z0-9_-]+$");
            };
            let created = i
                .peers
                .entry((*ws).to_owned())
                .or_default()
                .insert(id.to_owned());
            (
                if created { 201 } else { 200 },
                json!({"id": id, "workspace_id": ws, "created_at": "2026-01-01T00:00:00Z", "metadata": {}, "configuration": {}}),
            )
        }
        ["workspaces", ws, "sessions"] => {
            let Some(id) = obj.get("id").and_then(Value::as_str).filter(|id| is_id(id)) else {
                return invalid("id must match ^[a-zA-Z0-9_-]+$");
            };
            let created = i
                .sessions
                .entry((*ws).to_owned())
                .or_default()
                .insert(id.to_owned());
            (
                if created { 201 } else { 200 },
                json!({"id": id, "is_active": true, "workspace_id": ws, "metadata": {}, "configuration": {}, "created_at": "2026-01-01T00:00:00Z"}),
            )
        }
        ["workspaces", ws, "sessions", sid, "peers"] => {
            if !i.sessions.get(*ws).is_some_and(|ss| ss.contains(*sid)) {
                return (404, json!({"detail": "Session not found"}));
            }
            for (peer, cfg) in obj {
                if !is_id(peer) || !cfg.is_object() {
                    return invalid("peer ids must match the id pattern");
                }
                if !i.peers.get(*ws).is_some_and(|p| p.contains(peer)) {
                    return (404, json!({"detail": "Peer not found"}));
                }
            }
            (
                200,
                json!({"id": sid, "is_active": true, "workspace_id": ws, "metadata": {}, "configuration": {}, "created_at": "2026-01-01T00:00:00Z"}),
            )
        }
        ["workspaces", ws, "sessions", sid, "messages"]
        | ["workspaces", ws, "sessions", sid, "messages", ""] => {
            let Some(items) = obj.get("messages").and_then(Value::as_array) else {
                return invalid("messages is required");
            };
            if items.is_empty() || items.len() > 100 {
                return invalid("messages must hold 1 to 100 items");
            }
            for m in items {
                let ok = m.get("peer_id").and_then(Value::as_str).is_some_and(is_id)
                    && m.get("content")
                        .and_then(Value::as_str)
                        .is_some_and(|c| c.chars().count() <= 25_000);
                if !ok {
                    return invalid(
                        "each message needs a peer_id and content of at most 25000 characters",
                    );
                }
            }
            if let Some((ok, status, left)) = i.fail_messages {
                if ok > 0 {
                    i.fail_messages = Some((ok - 1, status, left));
                } else if left > 0 {
                    i.fail_messages = Some((0, status, left - 1));
                    return (status, json!({"detail": "failing by test switch"}));
                }
            }
            if let Some(status) = i.reject_messages.take() {
                return (status, json!({"detail": "rejected by test switch"}));
            }
            if !i.sessions.get(*ws).is_some_and(|ss| ss.contains(*sid)) {
                return (404, json!({"detail": "Session not found"}));
            }
            let mut out = Vec::new();
            for m in items {
                i.next_id += 1;
                let stored = Stored {
                    workspace: (*ws).to_owned(),
                    session: (*sid).to_owned(),
                    peer_id: m["peer_id"].as_str().unwrap_or_default().to_owned(),
                    content: m["content"].as_str().unwrap_or_default().to_owned(),
                };
                out.push(json!({"id": format!("msg-{}", i.next_id), "content": stored.content, "peer_id": stored.peer_id,
                    "session_id": sid, "workspace_id": ws, "metadata": {}, "created_at": "2026-01-01T00:00:00Z", "token_count": 1}));
                i.messages.push(stored);
            }
            (201, Value::Array(out))
        }
        ["workspaces", ws, "peers", peer, "representation"] => {
            if let Err(e) = int_in(obj.get("max_conclusions"), 1, 100) {
                return invalid(&format!("max_conclusions {e}"));
            }
            if let Some(raw) = &i.raw_representation {
                return (200, raw.clone());
            }
            let text = i
                .representations
                .get(&((*ws).to_owned(), (*peer).to_owned()))
                .cloned()
                .unwrap_or_default();
            (200, json!({"representation": text}))
        }
        ["workspaces", ws, "search"] => {
            let Some(query) = obj.get("query").and_then(Value::as_str) else {
                return invalid("query is required");
            };
            if let Err(e) = int_in(obj.get("limit"), 1, 100) {
                return invalid(&format!("limit {e}"));
            }
            let limit = obj.get("limit").and_then(Value::as_u64).unwrap_or(10) as usize;
            let q = query.to_lowercase();
            let hits: Vec<Value> = i
                .messages
                .iter()
                .enumerate()
                .filter(|(_, m)| m.workspace == *ws && m.content.to_lowercase().contains(&q))
                .take(limit)
                .map(|(n, m)| json!({"id": format!("hit-{n}"), "content": m.content, "peer_id": m.peer_id,
                    "session_id": m.session, "workspace_id": ws, "metadata": {}, "created_at": "2026-01-01T00:00:00Z", "token_count": 1}))
                .collect();
            (200, Value::Array(hits))
        }
        _ => (404, json!({"detail": "Not Found"})),
    }
}
