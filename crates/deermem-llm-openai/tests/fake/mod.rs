//! A fake OpenAI-compatible chat-completions server on 127.0.0.1: scripted replies (status,
//! headers, body, delay) consumed one per HTTP attempt, and a record of every request.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// One scripted answer of the fake server.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: body.to_string(),
            delay: Duration::ZERO,
        }
    }

    pub fn raw(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.to_owned(),
            delay: Duration::ZERO,
        }
    }

    pub fn ok(content: &str) -> Self {
        Self::json(
            200,
            json!({"id": "c1", "model": "served-model", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
                   "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}}),
        )
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    pub fn delayed(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

/// What the fake saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub headers: HeaderMap,
    pub body: Value,
}

#[derive(Clone, Default)]
pub struct Fake {
    pub script: Arc<Mutex<VecDeque<Reply>>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Fake {
    pub fn push(&self, reply: Reply) {
        self.script.lock().unwrap().push_back(reply);
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn handle(State(fake): State<Fake>, headers: HeaderMap, body: Bytes) -> Response {
    let parsed = serde_json::from_slice(&body).unwrap_or(Value::Null);
    fake.seen.lock().unwrap().push(Seen {
        headers,
        body: parsed,
    });
    let reply = fake
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| Reply::ok("default"));
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut resp = (
        StatusCode::from_u16(reply.status).unwrap(),
        reply.body.clone(),
    )
        .into_response();
    for (k, v) in reply.headers {
        resp.headers_mut().insert(k, v.parse().unwrap());
    }
    resp
}

/// Starts the fake on an ephemeral loopback port; returns its `/v1` base URL.
pub async fn start(replies: Vec<Reply>) -> (Fake, String) {
    let fake = Fake {
        script: Arc::new(Mutex::new(replies.into())),
        seen: Arc::default(),
    };
    let app = Router::new()
        .route("/v1/chat/completions", post(handle))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (fake, format!("http://{addr}/v1"))
}
