//! A real OpenViking server for tests (`deermem_backend_openviking::testserver` with that
//! crate's feature `real-server`): `openviking==0.5.2` from
//! PyPI in a cached virtual environment, started on a free loopback port in `api_key` mode with
//! a root key, with its embedding and chat models pointed at [`ModelStub`], a small
//! OpenAI-compatible server in the test process. [`OvServer::create_user`] makes an account
//! and a USER key through the admin API. Dropping the server kills its process.
//!
//! The stub answers embeddings deterministically (a bag of hashed words) and answers the
//! server's memory extractor with the program its output contract asks for: calls of the
//! restricted memory SDK such as `sdk.create_preferences(...)`, chosen by the phrases a test
//! registers with [`ModelStub::remember`], and `sdk.commit()` alone for any other conversation.
//!
//! It is test infrastructure, like the fakes beside it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Server, lock};

/// The cached environment's name and requirement.
pub const PYENV_NAME: &str = "openviking-0.5.2";
/// The pinned server release.
pub const REQUIREMENT: &str = "openviking==0.5.2";
/// Dimensions of the stub's embeddings.
pub const EMBEDDING_DIMENSION: usize = 64;
/// How long the server may take to start answering `/health`.
const BOOT_DEADLINE: Duration = Duration::from_secs(180);
/// The marker of the extractor's conversation message.
const CONVERSATION_MARKER: &str = "## Conversation History";

/// What the stub answers when a conversation contains a phrase.
#[derive(Clone, Debug)]
struct Rule {
    phrase: String,
    program: String,
}

#[derive(Debug, Default)]
struct StubState {
    rules: Mutex<Vec<Rule>>,
    chat_calls: AtomicUsize,
    embedding_calls: AtomicUsize,
}

/// An OpenAI-compatible model server on 127.0.0.1 for the OpenViking server's embedding and
/// chat models. Dropping it stops it.
#[derive(Debug)]
pub struct ModelStub {
    addr: SocketAddr,
    state: Arc<StubState>,
    server: Server,
}

impl Drop for ModelStub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The stub's embedding of a text: each lowercase word adds 1 to the dimension its SHA-256
/// picks; the vector is normalised (an empty text is the first unit vector).
#[must_use]
pub fn embedding(text: &str) -> Vec<f64> {
    let mut v = vec![0.0; EMBEDDING_DIMENSION];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let digest = Sha256::digest(word.to_lowercase().as_bytes());
        v[usize::from(digest[0]) % EMBEDDING_DIMENSION] += 1.0;
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm == 0.0 {
        v[0] = 1.0;
    } else {
        for x in &mut v {
            *x /= norm;
        }
    }
    v
}

async fn embeddings(
    State(state): State<Arc<StubState>>,
    body: axum::Json<Value>,
) -> axum::Json<Value> {
    state.embedding_calls.fetch_add(1, Ordering::SeqCst);
    let inputs: Vec<String> = match body.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": embedding(t)}))
        .collect();
    axum::Json(
        json!({"object": "list", "data": data, "model": body.get("model"),
        "usage": {"prompt_tokens": inputs.len(), "total_tokens": inputs.len()}}),
    )
}

/// The conversation the extractor shows the model, when this is an extraction request.
fn conversation_of(body: &Value) -> Option<String> {
    body.get("messages")?
        .as_array()?
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_str))
        .find(|c| c.contains(CONVERSATION_MARKER))
        .map(str::to_owned)
}

async fn chat(State(state): State<Arc<StubState>>, body: axum::Json<Value>) -> axum::Json<Value> {
    state.chat_calls.fetch_add(1, Ordering::SeqCst);
    let reply = match conversation_of(&body) {
        Some(conversation) => {
            let rules = lock(&state.rules).clone();
            let mut program: Vec<String> = rules
                .iter()
                .filter(|r| conversation.contains(&r.phrase))
                .map(|r| r.program.clone())
                .collect();
            program.push("sdk.commit()".to_owned());
            format!("```python\n{}\n```", program.join("\n"))
        }
        None => "Summary.".to_owned(),
    };
    axum::Json(
        json!({"id": "chatcmpl-stub", "object": "chat.completion", "created": 0,
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
    )
}

impl ModelStub {
    /// Starts the stub on an ephemeral loopback port, on the current tokio runtime.
    ///
    /// # Errors
    /// No loopback port could be bound.
    pub async fn start() -> std::io::Result<Self> {
        let state = Arc::new(StubState::default());
        let app = Router::new()
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/chat/completions", post(chat))
            .with_state(Arc::clone(&state));
        let server = Server::start(app, "OpenViking model stub").await?;
        Ok(Self {
            addr: server.addr,
            state,
            server,
        })
    }

    /// The OpenAI-compatible base URL (`http://127.0.0.1:PORT/v1`).
    #[must_use]
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.addr.port())
    }

    /// When a conversation contains `phrase`, the extractor's answer includes `program` (one
    /// or more memory-SDK calls, e.g. `sdk.create_preferences(user="""u""", topic="""editor""",
    /// content="""- Uses Vim.""")`).
    pub fn remember(&self, phrase: &str, program: &str) {
        lock(&self.state.rules).push(Rule {
            phrase: phrase.to_owned(),
            program: program.to_owned(),
        });
    }

    /// How many chat requests arrived.
    #[must_use]
    pub fn chat_calls(&self) -> usize {
        self.state.chat_calls.load(Ordering::SeqCst)
    }
}

/// A running `openviking-server`; dropping it kills the process.
#[derive(Debug)]
pub struct OvServer {
    child: Option<Child>,
    port: u16,
    root_key: String,
    dir: tempfile::TempDir,
    program: PathBuf,
    stub_base_url: String,
    http: reqwest::Client,
}

impl Drop for OvServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn signal(pid: u32, sig: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .map_err(|e| format!("kill {sig} {pid}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill {sig} {pid}: {status}"))
    }
}

impl OvServer {
    /// Installs `openviking==0.5.2` into the cached environment when needed (minutes and about
    /// 1.3 GB the first time; see `crate::pyenv`), writes an `ov.conf` whose
    /// embedding and chat models are `stub_base_url`, and starts the server on a free loopback
    /// port with a random root key, waiting until `/health` answers.
    ///
    /// # Errors
    /// What is missing (Python, the package index) or why the server did not start, with the
    /// end of its log.
    pub async fn start(stub_base_url: &str) -> Result<Self, String> {
        let env = tokio::task::spawn_blocking(|| crate::pyenv::ensure(PYENV_NAME, &[REQUIREMENT]))
            .await
            .map_err(|e| format!("installing {REQUIREMENT}: {e}"))??;
        let program = env.bin("openviking-server");
        if !program.is_file() {
            return Err(format!(
                "{} is missing from the environment",
                program.display()
            ));
        }
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        let mut server = Self {
            child: None,
            port: 0,
            root_key: format!("root-{}", uuid::Uuid::new_v4().simple()),
            dir,
            program,
            stub_base_url: stub_base_url.to_owned(),
            http,
        };
        server.configure()?;
        match server.launch().await {
            Ok(()) => Ok(server),
            Err(first) => {
                // A loopback port picked free can be taken before the server binds it: try
                // once more on another one, and say so.
                eprintln!(
                    "openviking-server did not start; trying once more on another port: {first}"
                );
                server.configure()?;
                server.launch().await.map(|()| server)
            }
        }
    }

    /// Picks a free loopback port and writes `ov.conf` for it.
    fn configure(&mut self) -> Result<(), String> {
        self.port = free_port().map_err(|e| format!("no free loopback port: {e}"))?;
        let config = json!({
            "storage": {"workspace": self.dir.path().join("data")},
            "server": {"host": "127.0.0.1", "port": self.port, "root_api_key": self.root_key},
            "embedding": {"dense": {"provider": "openai", "api_base": self.stub_base_url,
                "api_key": "stub-key", "model": "stub-embedding",
                "dimension": EMBEDDING_DIMENSION}},
            "vlm": {"provider": "openai", "api_base": self.stub_base_url, "api_key": "stub-key",
                "model": "stub-chat"},
        });
        std::fs::write(
            self.dir.path().join("ov.conf"),
            serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("writing ov.conf: {e}"))
    }

    /// Starts the process (again) on the same port, configuration and data, and waits until
    /// `/health` answers.
    ///
    /// # Errors
    /// The process does not start or does not become healthy in time.
    pub async fn launch(&mut self) -> Result<(), String> {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("server log: {e}"))?;
        let log_err = log.try_clone().map_err(|e| format!("server log: {e}"))?;
        let child = Command::new(&self.program)
            .arg("--config")
            .arg(self.dir.path().join("ov.conf"))
            .env("HOME", self.dir.path())
            .env("PYTHONUNBUFFERED", "1")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("OPENVIKING_CONFIG_FILE")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.program.display()))?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "openviking-server exited at start ({status}):\n{}",
                    self.log_tail()
                ));
            }
            if let Ok(resp) = self.http.get(format!("{}/health", self.url())).send().await
                && let Ok(v) = resp.json::<Value>().await
                && v.get("status").and_then(Value::as_str) == Some("ok")
            {
                return Ok(());
            }
            if started.elapsed() > BOOT_DEADLINE {
                return Err(format!(
                    "openviking-server did not answer /health within {BOOT_DEADLINE:?}:\n{}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's log file (stdout and stderr).
    #[must_use]
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The last lines of the server's log, for failure messages.
    #[must_use]
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(120)..].join("\n")
    }

    /// The directory holding `ov.conf`, the data and the log.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the process without ending it (`SIGSTOP`): connections are accepted by the kernel
    /// and requests wait, as with a server too busy to answer.
    ///
    /// # Errors
    /// The process is not running or cannot be signalled.
    pub fn pause(&self) -> Result<(), String> {
        signal(self.pid().ok_or("the server is not running")?, "-STOP")
    }

    /// Lets a paused process run again (`SIGCONT`); it then serves the requests that waited.
    ///
    /// # Errors
    /// The process is not running or cannot be signalled.
    pub fn resume(&self) -> Result<(), String> {
        signal(self.pid().ok_or("the server is not running")?, "-CONT")
    }

    /// Kills the process (also a paused one) and waits for it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn admin(&self, path: &str, body: Value) -> Result<Value, String> {
        let resp = self
            .http
            .post(format!("{}/api/v1/admin{path}", self.url()))
            .header("X-API-Key", &self.root_key)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("POST /api/v1/admin{path}: {e}"))?;
        let status = resp.status();
        let v: Value = resp
            .json()
            .await
            .map_err(|e| format!("POST /api/v1/admin{path}: {status}: {e}"))?;
        if v.get("status").and_then(Value::as_str) != Some("ok") {
            return Err(format!("POST /api/v1/admin{path}: {status}: {v}"));
        }
        Ok(v.get("result").cloned().unwrap_or(Value::Null))
    }

    /// Creates the account `account` (with an admin user `admin`) and the user `user` in it
    /// through the admin API with the root key; returns the user's USER API key.
    ///
    /// # Errors
    /// The admin API refused or the answer has no key.
    pub async fn create_user(&self, account: &str, user: &str) -> Result<String, String> {
        self.admin(
            "/accounts",
            json!({"account_id": account, "admin_user_id": "admin"}),
        )
        .await?;
        let result = self
            .admin(
                &format!("/accounts/{account}/users"),
                json!({"user_id": user}),
            )
            .await?;
        result
            .get("user_key")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("no user_key in {result}"))
    }

    /// `GET /api/v1/sessions/{id}` with a user key and actor peer: the session's
    /// `(message_count, total_message_count)`, or `None` when it does not exist.
    ///
    /// # Errors
    /// The request failed.
    pub async fn session_counts(
        &self,
        user_key: &str,
        peer: &str,
        session_id: &str,
    ) -> Result<Option<(u64, u64)>, String> {
        let resp = self
            .http
            .get(format!("{}/api/v1/sessions/{session_id}", self.url()))
            .header("X-API-Key", user_key)
            .header("X-OpenViking-Actor-Peer", peer)
            .send()
            .await
            .map_err(|e| format!("GET session: {e}"))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let v: Value = resp.json().await.map_err(|e| format!("GET session: {e}"))?;
        let r = &v["result"];
        match (
            r["message_count"].as_u64(),
            r["total_message_count"].as_u64(),
        ) {
            (Some(m), Some(t)) => Ok(Some((m, t))),
            _ => Err(format!("GET session: unexpected answer {v}")),
        }
    }

    /// `POST /api/v1/search/find` over the user's memories with a user key: the memory hits.
    ///
    /// # Errors
    /// The request failed.
    pub async fn find_memories(&self, user_key: &str, query: &str) -> Result<Vec<Value>, String> {
        let v: Value = self
            .http
            .post(format!("{}/api/v1/search/find", self.url()))
            .header("X-API-Key", user_key)
            .header("X-OpenViking-Actor-Peer", "deerflow")
            .json(&json!({"query": query, "target_uri": "viking://~/memories", "limit": 20}))
            .send()
            .await
            .map_err(|e| format!("find: {e}"))?
            .json()
            .await
            .map_err(|e| format!("find: {e}"))?;
        Ok(v["result"]["memories"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Waits until a memory file (level 2) whose abstract contains `needle` is searchable, as
    /// the server extracts memories in the background after a commit.
    ///
    /// # Errors
    /// None appeared within `deadline`; the message has the end of the server's log.
    pub async fn wait_for_memory(
        &self,
        user_key: &str,
        needle: &str,
        deadline: Duration,
    ) -> Result<Value, String> {
        let started = Instant::now();
        loop {
            if let Ok(hits) = self.find_memories(user_key, needle).await
                && let Some(hit) = hits.into_iter().find(|h| {
                    h["level"].as_u64() == Some(2)
                        && h["abstract"].as_str().is_some_and(|a| a.contains(needle))
                })
            {
                return Ok(hit);
            }
            if started.elapsed() > deadline {
                return Err(format!(
                    "no memory containing {needle:?} after {deadline:?}; server log:\n{}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
