//! A fake OpenAI-compatible server on 127.0.0.1 for tests (`deermem_llm_openai::fake` with that
//! crate's feature `fake-server`): `POST /v1/chat/completions` and `POST /v1/embeddings`,
//! scripted replies (status, headers, body, delay) consumed one per HTTP attempt of either route,
//! and a record of every request it received. Unscripted embedding requests are answered like
//! OpenAI answers them, with the testkit's deterministic hashed vectors.
//!
//! It is test infrastructure: the client's tests use it to prove the client end to end, and the
//! facade's tests use it to run the embedded engine's extraction against a model server without
//! any network beyond loopback.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::{Server, lock, started};

/// The content the fake answers with once its script is used up.
pub const DEFAULT_CONTENT: &str = "default";

/// The vector dimension of unscripted embedding answers when the request names none.
pub const DEFAULT_EMBEDDING_DIMENSION: usize = 64;

/// One scripted answer of the fake server.
#[derive(Clone, Debug)]
pub struct Reply {
    /// HTTP status (an invalid code is answered as 500).
    pub status: u16,
    /// Extra response headers (invalid names or values are skipped).
    pub headers: Vec<(&'static str, String)>,
    /// The raw response body.
    pub body: String,
    /// How long to wait before answering.
    pub delay: Duration,
}

impl Reply {
    /// A JSON body with `content-type: application/json`.
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: body.to_string(),
            delay: Duration::ZERO,
        }
    }

    /// A raw body without a content type.
    pub fn raw(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.to_owned(),
            delay: Duration::ZERO,
        }
    }

    /// A successful chat completion whose first choice's message content is `content`.
    pub fn ok(content: &str) -> Self {
        Self::json(
            200,
            json!({
                "id": "c1",
                "model": "served-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
            }),
        )
    }

    /// Adds a response header.
    #[must_use]
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    /// Answers after `d`.
    #[must_use]
    pub fn delayed(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The request headers.
    pub headers: HeaderMap,
    /// The JSON body (`Null` when absent or not JSON).
    pub body: Value,
}

impl Seen {
    /// The `Authorization` header, when present and valid text.
    pub fn authorization(&self) -> Option<&str> {
        self.headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
    }

    /// The `content` of every message in the body, in order (non-text contents are skipped).
    pub fn message_contents(&self) -> Vec<&str> {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map(|msgs| {
                msgs.iter()
                    .filter_map(|m| m.get("content").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    seen: Vec<Seen>,
}

/// The fake server handle. Clones share the server; it runs until its tokio runtime stops.
#[derive(Clone)]
pub struct FakeOpenAi {
    base_url: String,
    inner: Arc<Mutex<Inner>>,
}

impl fmt::Debug for FakeOpenAi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeOpenAi")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = {
        let mut state = lock(&inner);
        state.seen.push(Seen {
            headers,
            body: parsed,
        });
        state
            .script
            .pop_front()
            .unwrap_or_else(|| Reply::ok(DEFAULT_CONTENT))
    };
    answer(reply).await
}

async fn answer(reply: Reply) -> Response {
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, reply.body).into_response();
    for (name, value) in reply.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            resp.headers_mut().insert(name, value);
        }
    }
    resp
}

/// The answer OpenAI gives to an embeddings request: one `{"object", "index", "embedding"}` per
/// input (a string or a list of strings), in order, of the requested `dimensions`.
pub fn embeddings_answer(request: &Value) -> Reply {
    let inputs: Vec<&str> = match request.get("input") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) => {
            let texts: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            match texts {
                Some(t) if !t.is_empty() => t,
                _ => return invalid_input(),
            }
        }
        _ => return invalid_input(),
    };
    if inputs.iter().any(|t| t.is_empty()) {
        return invalid_input();
    }
    let dimension = request
        .get("dimensions")
        .and_then(Value::as_u64)
        .and_then(|d| usize::try_from(d).ok())
        .unwrap_or(DEFAULT_EMBEDDING_DIMENSION);
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"object": "embedding", "index": i,
                   "embedding": crate::embedder::hashed_vector(t, dimension, &[])})
        })
        .collect();
    Reply::json(
        200,
        json!({"object": "list", "data": data, "model": request.get("model"),
               "usage": {"prompt_tokens": inputs.len(), "total_tokens": inputs.len()}}),
    )
}

fn invalid_input() -> Reply {
    Reply::json(
        400,
        json!({"error": {"message": "'$.input' is invalid.", "type": "invalid_request_error"}}),
    )
}

async fn handle_embeddings(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let scripted = {
        let mut state = lock(&inner);
        state.seen.push(Seen {
            headers,
            body: parsed.clone(),
        });
        state.script.pop_front()
    };
    answer(scripted.unwrap_or_else(|| embeddings_answer(&parsed))).await
}

impl FakeOpenAi {
    /// Starts the fake on an ephemeral loopback port, served by a task on the current tokio
    /// runtime, answering `POST /v1/chat/completions` with `replies` in order, then with
    /// [`DEFAULT_CONTENT`].
    ///
    /// # Errors
    /// No loopback port could be bound.
    pub async fn try_start(replies: Vec<Reply>) -> std::io::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner {
            script: replies.into(),
            seen: Vec::new(),
        }));
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .route("/v1/embeddings", post(handle_embeddings))
            .with_state(Arc::clone(&inner));
        let server = Server::start(app, "fake chat-completions server").await?;
        Ok(Self {
            base_url: server.url("/v1"),
            inner,
        })
    }

    /// As [`FakeOpenAi::try_start`], for tests.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(replies: Vec<Reply>) -> Self {
        started(
            Self::try_start(replies).await,
            "fake chat-completions server",
        )
    }

    /// The client's `base_url`: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: Reply) {
        lock(&self.inner).script.push_back(reply);
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Seen> {
        lock(&self.inner).seen.clone()
    }

    /// Scripted replies not consumed yet.
    pub fn pending_replies(&self) -> usize {
        lock(&self.inner).script.len()
    }
}

/// Starts a fake (see [`FakeOpenAi::start`]) and returns it with its base URL.
///
/// # Panics
/// When no loopback port can be bound.
pub async fn start(replies: Vec<Reply>) -> (FakeOpenAi, String) {
    let fake = FakeOpenAi::start(replies).await;
    let url = fake.base_url().to_owned();
    (fake, url)
}
