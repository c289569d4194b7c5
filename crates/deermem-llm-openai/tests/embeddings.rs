//! The OpenAI-compatible embedding client against the fake server on 127.0.0.1: the embedder
//! contract suite, then the request shape, batching, the retry rules, answers that cannot be
//! used, and secret hygiene.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::EmbedError;
use deermem_core::config::EmbeddingConfig;
use deermem_core::ports::Embedder;
use deermem_llm_openai::fake::{self, FakeOpenAi, Reply};
use deermem_llm_openai::{OpenAiEmbedder, RetryPolicy, Sleeper};
use deermem_testkit::embedder::EmbedderFixture;
use serde_json::{Value, json};

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

fn config(url: &str, retries: u32) -> EmbeddingConfig {
    EmbeddingConfig {
        provider: deermem_core::config::EmbeddingProvider::Openai,
        model: Some("embed-test".into()),
        base_url: Some(url.to_owned()),
        api_key: Some("sk-embed-secret".into()),
        dimensions: Some(32),
        max_retries: retries,
        timeout_seconds: 5.0,
        connect_timeout_seconds: 2.0,
        ..EmbeddingConfig::default()
    }
}

fn embedder(cfg: &EmbeddingConfig) -> (OpenAiEmbedder, Arc<RecordingSleeper>) {
    let sleeper = Arc::new(RecordingSleeper::default());
    let e = OpenAiEmbedder::from_config(cfg)
        .unwrap()
        .with_sleeper(sleeper.clone());
    (e, sleeper)
}

fn texts(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("text {i}")).collect()
}

async fn fixture() -> EmbedderFixture {
    let (server, url) = fake::start(Vec::new()).await;
    let (e, _) = embedder(&config(&url, 1));
    let breaker = server.clone();
    EmbedderFixture {
        embedder: Arc::new(e.with_retry_policy(RetryPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            retry_after_cap: Duration::from_millis(2),
        })),
        break_next: Some(Box::new(move || {
            // More 503s than the one retry allows.
            breaker.push(Reply::raw(503, "overloaded"));
            breaker.push(Reply::raw(503, "overloaded"));
        })),
        guard: Box::new(server),
    }
}

deermem_testkit::embedder_contract!(fixture());

fn inputs(server: &FakeOpenAi) -> Vec<usize> {
    server
        .requests()
        .iter()
        .map(|r| r.body["input"].as_array().map_or(0, Vec::len))
        .collect()
}

#[tokio::test]
async fn sends_the_openai_request_and_batches_at_the_configured_size() {
    let (server, url) = fake::start(Vec::new()).await;
    let mut cfg = config(&url, 0);
    cfg.batch_size = 100;
    let (e, _) = embedder(&cfg);
    assert_eq!(e.endpoint(), format!("{url}/embeddings"));
    let out = e.embed(&texts(250)).await.unwrap();
    assert_eq!(out.len(), 250);
    assert_eq!(inputs(&server), vec![100, 100, 50]);
    let first = &server.requests()[0];
    assert_eq!(first.body["model"], "embed-test");
    assert_eq!(first.body["dimensions"], 32);
    assert_eq!(first.body["encoding_format"], "float");
    assert_eq!(first.authorization(), Some("Bearer sk-embed-secret"));
    // An empty text is sent as a space, which servers accept.
    e.embed(&[String::new()]).await.unwrap();
    assert_eq!(server.requests()[3].body["input"], json!([" "]));
}

/// An asymmetric model: queries and documents carry their own `input_type` and prefix; a
/// side left unset sends neither.
#[tokio::test]
async fn queries_and_documents_carry_their_own_input_type_and_prefix() {
    let (server, url) = fake::start(Vec::new()).await;
    let mut cfg = config(&url, 0);
    cfg.input_type.query = Some("query".into());
    cfg.input_type.document = Some("passage".into());
    cfg.prefix.query = Some("query: ".into());
    let (e, _) = embedder(&cfg);
    e.embed(&["Plays basketball".into()]).await.unwrap();
    e.embed_queries(&["what sport".into(), String::new()])
        .await
        .unwrap();
    let sent = server.requests();
    assert_eq!(sent[0].body["input_type"], "passage");
    assert_eq!(sent[0].body["input"], json!(["Plays basketball"]));
    assert_eq!(sent[1].body["input_type"], "query");
    assert_eq!(
        sent[1].body["input"],
        json!(["query: what sport", "query:  "])
    );
    assert_eq!(e.model_id(), "openai:embed-test@32;input_type=passage");
    // Nothing configured: neither key nor prefix, and the same request for both sides.
    let (plain, _) = embedder(&config(&url, 0));
    plain.embed_queries(&["what sport".into()]).await.unwrap();
    let last = server.requests().pop().unwrap();
    assert!(last.body.get("input_type").is_none());
    assert_eq!(last.body["input"], json!(["what sport"]));
}

#[tokio::test]
async fn answers_out_of_order_are_put_back_in_order() {
    let (server, url) = fake::start(Vec::new()).await;
    let (e, _) = embedder(&config(&url, 0));
    let mut answer = fake::embeddings_answer(&json!({"input": ["a", "b"], "dimensions": 32}));
    let mut body: Value = serde_json::from_str(&answer.body).unwrap();
    body["data"].as_array_mut().unwrap().reverse();
    answer.body = body.to_string();
    server.push(answer);
    let swapped = e.embed(&["a".into(), "b".into()]).await.unwrap();
    let straight = e.embed(&["a".into(), "b".into()]).await.unwrap();
    assert_eq!(swapped, straight);
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried_honouring_retry_after() {
    let (server, url) = fake::start(vec![
        Reply::raw(429, "slow down").header("retry-after", "3"),
        Reply::raw(502, "bad gateway"),
    ])
    .await;
    let (e, sleeper) = embedder(&config(&url, 2));
    let e = e.with_retry_policy(RetryPolicy {
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_secs(60),
        retry_after_cap: Duration::from_secs(30),
    });
    assert_eq!(e.embed(&texts(3)).await.unwrap().len(), 3);
    assert_eq!(server.requests().len(), 3);
    let delays = sleeper.delays.lock().unwrap().clone();
    assert_eq!(delays.len(), 2);
    assert_eq!(delays[0], Duration::from_secs(3), "Retry-After honoured");
}

#[tokio::test]
async fn refusals_are_typed_and_not_retried() {
    let (server, url) = fake::start(vec![
        Reply::json(
            401,
            json!({"error": {"message": "bad key sk-embed-secret"}}),
        ),
        Reply::json(400, json!({"error": {"message": "model not found"}})),
    ])
    .await;
    let (e, sleeper) = embedder(&config(&url, 3));
    let err = e.embed(&texts(1)).await.unwrap_err();
    assert!(matches!(err, EmbedError::Auth { status: 401 }), "{err:?}");
    let err = e.embed(&texts(1)).await.unwrap_err();
    assert!(
        matches!(&err, EmbedError::InvalidRequest { status: 400, message } if message == "model not found"),
        "{err:?}"
    );
    assert_eq!(server.requests().len(), 2);
    assert!(sleeper.delays.lock().unwrap().is_empty());
}

#[tokio::test]
async fn unusable_answers_are_invalid_responses() {
    let wrong_dim = fake::embeddings_answer(&json!({"input": ["a"], "dimensions": 8}));
    let nan = Reply::raw(
        200,
        &json!({"data": [{"index": 0, "embedding": [1.0, "x"]}]}).to_string(),
    );
    let missing = Reply::json(200, json!({"data": []}));
    let twice = Reply::json(
        200,
        json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]}),
    );
    let outside = Reply::json(200, json!({"data": [{"index": 7, "embedding": [1.0]}]}));
    let zero = Reply::json(
        200,
        json!({"data": [{"index": 0, "embedding": vec![0.0; 32]}]}),
    );
    let cases = [
        (wrong_dim, "has 8 components"),
        (nan, "not an embeddings answer"),
        (missing, "no vector for text 0"),
        (twice, "answered twice"),
        (outside, "outside the 1 texts"),
        (zero, "all zeros"),
        (Reply::raw(200, "<html>"), "not an embeddings answer"),
    ];
    let (server, url) = fake::start(Vec::new()).await;
    let (e, _) = embedder(&config(&url, 0));
    for (reply, says) in cases {
        server.push(reply);
        let err = e.embed(&texts(1)).await.unwrap_err();
        assert!(matches!(err, EmbedError::InvalidResponse(_)), "{err:?}");
        assert!(
            err.to_string().contains(says),
            "{err} does not say {says:?}"
        );
    }
}

#[tokio::test]
async fn the_key_never_appears_in_errors_or_debug_output() {
    let echo = "invalid key sk-embed-secret";
    let (_server, url) = fake::start(vec![
        Reply::json(400, json!({"error": {"message": echo}})),
        Reply::raw(500, echo),
    ])
    .await;
    let (e, _) = embedder(&config(&url, 0));
    assert!(!format!("{e:?}").contains("sk-embed-secret"));
    for _ in 0..2 {
        let err = e.embed(&texts(1)).await.unwrap_err();
        assert!(!err.to_string().contains("sk-embed-secret"), "{err}");
        assert!(!format!("{err:?}").contains("sk-embed-secret"), "{err:?}");
    }
}

#[tokio::test]
async fn a_dead_server_is_a_transport_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (e, _) = embedder(&config(&format!("http://127.0.0.1:{port}/v1"), 0));
    let err = e.embed(&texts(1)).await.unwrap_err();
    assert!(matches!(err, EmbedError::Transport(_)), "{err:?}");
    assert!(err.is_retryable());
}
