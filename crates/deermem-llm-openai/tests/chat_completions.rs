//! End-to-end tests of the OpenAI-compatible client against a fake chat-completions server on
//! 127.0.0.1: request shape, content parsing, the retry rules and secret hygiene.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::LlmError;
use deermem_core::ModelConfig;
use deermem_core::ports::{ChatMessage, ChatRequest, LanguageModel};
use deermem_llm_openai::fake::{Reply, start};
use deermem_llm_openai::{OpenAiChatModel, RetryPolicy, Sleeper};
use serde_json::json;

/// Records requested delays and returns at once.
#[derive(Debug, Default)]
struct RecordingSleeper {
    delays: Mutex<Vec<Duration>>,
}

#[async_trait]
impl Sleeper for RecordingSleeper {
    async fn sleep(&self, duration: Duration) {
        self.delays.lock().unwrap().push(duration);
    }
}

fn config(base_url: &str, api_key: Option<&str>, max_retries: u32) -> ModelConfig {
    ModelConfig {
        provider: None,
        model: Some("gpt-test".into()),
        api_key: api_key.map(Into::into),
        base_url: Some(base_url.to_owned()),
        temperature: Some(0.2),
        timeout_seconds: 5.0,
        connect_timeout_seconds: 2.0,
        max_retries,
        max_tokens: None,
    }
}

fn model(cfg: &ModelConfig) -> (OpenAiChatModel, Arc<RecordingSleeper>) {
    let sleeper = Arc::new(RecordingSleeper::default());
    let m = OpenAiChatModel::from_config(cfg)
        .unwrap()
        .with_sleeper(sleeper.clone());
    (m, sleeper)
}

fn request() -> ChatRequest {
    ChatRequest {
        messages: vec![ChatMessage::system("be brief"), ChatMessage::user("hello")],
        temperature: None,
        max_tokens: Some(64),
        json_response: true,
    }
}

#[tokio::test]
async fn success_sends_the_expected_body_and_parses_the_answer() {
    let (fake, url) = start(vec![Reply::ok("hi there")]).await;
    let (m, sleeper) = model(&config(&url, Some("sk-test-123"), 2));
    let resp = m.complete(&request()).await.unwrap();
    assert_eq!(resp.content, "hi there");
    assert_eq!(resp.model.as_deref(), Some("served-model"));
    let usage = resp.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (11, 2));
    assert_eq!(m.model_name(), "gpt-test");

    let seen = fake.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body,
        json!({
            "model": "gpt-test",
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
            "temperature": 0.2,
            "max_tokens": 64,
            "response_format": {"type": "json_object"}
        })
    );
    assert_eq!(
        seen[0].headers.get("authorization").unwrap(),
        "Bearer sk-test-123"
    );
    assert_eq!(
        seen[0].headers.get("content-type").unwrap(),
        "application/json"
    );
    assert!(sleeper.delays.lock().unwrap().is_empty());
}

#[tokio::test]
async fn no_key_means_no_authorization_header_and_plain_requests_have_no_extras() {
    let (fake, url) = start(vec![Reply::ok("x")]).await;
    let mut cfg = config(&url, None, 0);
    cfg.temperature = None;
    let (m, _) = model(&cfg);
    let req = ChatRequest {
        messages: vec![ChatMessage::user("q")],
        ..ChatRequest::default()
    };
    m.complete(&req).await.unwrap();
    let seen = fake.requests();
    assert!(seen[0].headers.get("authorization").is_none());
    assert_eq!(
        seen[0].body,
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": "q"}]})
    );
}

#[tokio::test]
async fn list_content_parts_are_joined() {
    let body = json!({"choices": [{"message": {"role": "assistant", "content": [
        {"type": "text", "text": "{\"facts\": "},
        {"type": "text", "text": "[]}"}
    ]}}]});
    let (_, url) = start(vec![Reply::json(200, body)]).await;
    let (m, _) = model(&config(&url, None, 0));
    let resp = m.complete(&request()).await.unwrap();
    assert_eq!(resp.content, "{\"facts\": []}");
    assert!(resp.model.is_none());
    assert!(resp.usage.is_none());
}

#[tokio::test]
async fn rate_limit_honours_retry_after_then_succeeds() {
    let (fake, url) = start(vec![
        Reply::json(429, json!({"error": {"message": "slow down"}})).header("retry-after", "7"),
        Reply::ok("after wait"),
    ])
    .await;
    let (m, sleeper) = model(&config(&url, None, 3));
    let resp = m.complete(&request()).await.unwrap();
    assert_eq!(resp.content, "after wait");
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(
        *sleeper.delays.lock().unwrap(),
        vec![Duration::from_secs(7)]
    );
}

#[tokio::test]
async fn retry_after_is_capped_and_retries_are_bounded() {
    let replies = (0..5)
        .map(|_| Reply::raw(429, "busy").header("retry-after", "86400"))
        .collect();
    let (fake, url) = start(replies).await;
    let sleeper = Arc::new(RecordingSleeper::default());
    let m = OpenAiChatModel::from_config(&config(&url, None, 2))
        .unwrap()
        .with_retry_policy(RetryPolicy {
            retry_after_cap: Duration::from_secs(4),
            ..RetryPolicy::default()
        })
        .with_sleeper(sleeper.clone());
    let err = m.complete(&request()).await.unwrap_err();
    assert!(
        matches!(err, LlmError::RateLimited { retry_after: Some(d) } if d == Duration::from_secs(86400)),
        "{err:?}"
    );
    assert_eq!(fake.requests().len(), 3, "max_retries + 1 attempts");
    assert_eq!(
        *sleeper.delays.lock().unwrap(),
        vec![Duration::from_secs(4), Duration::from_secs(4)]
    );
}

#[tokio::test]
async fn server_errors_are_retried_max_retries_times_then_reported() {
    let replies = (0..10)
        .map(|_| Reply::json(503, json!({"error": {"message": "upstream overloaded"}})))
        .collect();
    let (fake, url) = start(replies).await;
    let (m, sleeper) = model(&config(&url, None, 2));
    let err = m.complete(&request()).await.unwrap_err();
    match err {
        LlmError::Server { status, message } => {
            assert_eq!(status, 503);
            assert_eq!(message, "upstream overloaded");
        }
        other => panic!("expected a server error, got {other:?}"),
    }
    assert_eq!(fake.requests().len(), 3);
    let delays = sleeper.delays.lock().unwrap().clone();
    assert_eq!(delays.len(), 2);
    // Default policy: 0.5 s then 1 s, each scaled by a jitter factor in [0.5, 1].
    assert!(delays[0] >= Duration::from_millis(250) && delays[0] <= Duration::from_millis(500));
    assert!(delays[1] >= Duration::from_millis(500) && delays[1] <= Duration::from_millis(1000));
}

#[tokio::test]
async fn server_error_then_success_recovers() {
    let (fake, url) = start(vec![Reply::raw(500, "oops"), Reply::ok("fine")]).await;
    let (m, _) = model(&config(&url, None, 1));
    assert_eq!(m.complete(&request()).await.unwrap().content, "fine");
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let (fake, url) = start(vec![Reply::json(
        400,
        json!({"error": {"message": "response_format not supported"}}),
    )])
    .await;
    let (m, sleeper) = model(&config(&url, None, 5));
    let err = m.complete(&request()).await.unwrap_err();
    match err {
        LlmError::InvalidRequest { status, message } => {
            assert_eq!(status, 400);
            assert_eq!(message, "response_format not supported");
        }
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
    assert_eq!(fake.requests().len(), 1);
    assert!(sleeper.delays.lock().unwrap().is_empty());
}

#[tokio::test]
async fn unauthorized_is_auth_and_not_retried() {
    let (fake, url) = start(vec![Reply::raw(401, "nope"), Reply::raw(403, "nope")]).await;
    let (m, _) = model(&config(&url, Some("sk-wrong"), 3));
    assert!(matches!(
        m.complete(&request()).await,
        Err(LlmError::Auth { status: 401 })
    ));
    assert!(matches!(
        m.complete(&request()).await,
        Err(LlmError::Auth { status: 403 })
    ));
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn malformed_success_body_is_invalid_response() {
    let (fake, url) = start(vec![
        Reply::raw(200, "<html>gateway</html>"),
        Reply::json(200, json!({"choices": []})),
    ])
    .await;
    let (m, _) = model(&config(&url, None, 3));
    for _ in 0..2 {
        let err = m.complete(&request()).await.unwrap_err();
        assert!(matches!(err, LlmError::InvalidResponse(_)), "{err:?}");
    }
    assert_eq!(
        fake.requests().len(),
        2,
        "invalid responses are not retried"
    );
}

#[tokio::test]
async fn slow_server_times_out_and_timeouts_are_retried() {
    let (fake, url) = start(vec![
        Reply::ok("late").delayed(Duration::from_secs(5)),
        Reply::ok("late").delayed(Duration::from_secs(5)),
    ])
    .await;
    let mut cfg = config(&url, None, 1);
    cfg.timeout_seconds = 0.2;
    let (m, sleeper) = model(&cfg);
    let err = m.complete(&request()).await.unwrap_err();
    assert!(
        matches!(err, LlmError::Timeout(d) if d == Duration::from_millis(200)),
        "{err:?}"
    );
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(sleeper.delays.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn connection_refused_is_a_retried_transport_error() {
    // Bind then drop a listener so the port is (almost certainly) closed.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (m, sleeper) = model(&config(&format!("http://127.0.0.1:{port}/v1"), None, 2));
    let err = m.complete(&request()).await.unwrap_err();
    assert!(matches!(err, LlmError::Transport(_)), "{err:?}");
    assert_eq!(sleeper.delays.lock().unwrap().len(), 2);
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_key_never_appears_in_debug_output_errors_or_logs() {
    // Log capture races with other test threads over tracing's call-site cache.
    if !deermem_testkit::isolation::run_alone(
        "the_key_never_appears_in_debug_output_errors_or_logs",
    ) {
        return;
    }
    const KEY: &str = "sk-live-SECRET-0123456789";
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let echo = format!("Incorrect API key provided: {KEY}");
        let (fake, url) = start(vec![
            Reply::ok("hello"),
            Reply::json(400, json!({"error": {"message": echo}})),
            Reply::raw(500, &echo),
            Reply::raw(401, &echo),
        ])
        .await;
        let (m, _) = model(&config(&url, Some(KEY), 0));
        assert!(!format!("{m:?}").contains(KEY));
        m.complete(&request()).await.unwrap();
        for _ in 0..3 {
            let err = m.complete(&request()).await.unwrap_err();
            assert!(!err.to_string().contains(KEY), "{err}");
            assert!(!format!("{err:?}").contains(KEY), "{err:?}");
        }
        assert_eq!(fake.requests().len(), 4);
        assert_eq!(
            fake.requests()[0].headers.get("authorization").unwrap(),
            &format!("Bearer {KEY}")
        );
    });
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("chat completion succeeded"),
        "logging must be on: {logs}"
    );
    assert!(logs.contains("status=401"), "{logs}");
    assert!(!logs.contains(KEY), "the key leaked into the logs:\n{logs}");
}
