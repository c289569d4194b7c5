//! No accepted turn is lost: the real `deermem serve` process, its model a loopback fake that is
//! down (500) or answers with one fact per `KEEP-…` token in the conversation, SIGKILLed while
//! it holds accepted turns. After a restart every turn answered 202 is applied, each fact once:
//! (a) model down, 20 turns of 5 users, SIGKILL, restart with the model up; (b) SIGKILL cycles
//! at random moments of a turn flood, one of them a crash exactly between an extraction's
//! commit and its turn's done-mark (the engine's `turns-before-done` fault point, feature
//! `fault-injection`); (c) two replicas on one PostgreSQL database, the one holding accepted
//! turns SIGKILLed, the other applying them within the lease. `DEERMEM_LONG=1` runs 30 cycles
//! instead of 4.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

/// Users (bearer tokens).
const USERS: usize = 5;
/// A guard against a server that never comes up or never applies; not a speed assertion.
const GUARD: Duration = Duration::from_secs(180);

fn deermem_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("deermem"))
        .expect("target directory");
    assert!(
        bin.is_file(),
        "the deermem binary is missing at {}: build it first (`cargo build -p deermem-cli`; \
         `cargo test --workspace` builds it)",
        bin.display()
    );
    bin
}

fn token(u: usize) -> String {
    format!("turns-token-{u}-0123456789")
}

/// The fake model: 500 while down; when up, one durable preference fact per `KEEP-…` token
/// found in the request (the conversation and the memory shown to it alike: the dedup gate
/// drops those already stored).
#[derive(Clone)]
struct FakeModel {
    up: Arc<AtomicBool>,
    url: String,
}

async fn chat(State(up): State<Arc<AtomicBool>>, body: Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    if !up.load(Ordering::SeqCst) {
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "{\"error\": {\"message\": \"model down\"}}",
        )
            .into_response();
    }
    let text = String::from_utf8_lossy(&body);
    let mut keys = BTreeSet::new();
    for (i, _) in text.match_indices("KEEP-") {
        let key: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        keys.insert(key);
    }
    let facts: Vec<Value> = keys
        .iter()
        .map(|k| {
            json!({"content": format!("User keeps the code {k}"), "category": "preference",
                   "confidence": 0.9, "scope": "user", "durability": "durable",
                   "authority": "descriptive"})
        })
        .collect();
    let content = json!({"user": {}, "history": {}, "newFacts": facts}).to_string();
    axum::Json(json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    }))
    .into_response()
}

impl FakeModel {
    async fn start(up: bool) -> Self {
        let up = Arc::new(AtomicBool::new(up));
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(Arc::clone(&up));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            up,
            url: format!("http://{addr}/v1"),
        }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }
}

/// A storage root and configuration that servers are started on, one after another.
struct Site {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Site {
    fn new(model: &FakeModel) -> Self {
        Self::with_attempts(model, 10)
    }

    fn with_attempts(model: &FakeModel, max_attempts: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tokens: serde_json::Map<String, Value> = (0..USERS)
            .map(|u| (token(u), json!(format!("turns-user{u}"))))
            .collect();
        let config = json!({
            "memory": {"enabled": true, "backend_config": {
                "debounce_seconds": 1,
                // Room for every fact a flood makes (one per turn): a capacity eviction would
                // otherwise remove applied turns' facts and the test could not tell them apart.
                "max_facts": MAX_FACTS,
                "model": {"model": "fake", "api_key": "k", "base_url": model.url,
                          "timeout_seconds": 5, "max_retries": 0},
                "queue": {"retry": {"initial_backoff_ms": 200, "max_backoff": 1,
                                    "max_attempts": max_attempts}},
            }},
            "gateway": {"auth": {"mode": "token", "tokens": tokens}},
        });
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, config.to_string()).unwrap();
        Self { dir, config: path }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// `deermem <args>` on this site: its exit success and stdout.
    fn cli(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(deermem_binary())
            .env_remove("DEERMEM_CONFIG")
            .env_remove("DEERMEM_DATA_DIR")
            .env_remove("DEERMEM_FAULT_STEP")
            .arg("--config")
            .arg(&self.config)
            .arg("--storage-path")
            .arg(self.root())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("deermem runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        (out.status.success(), format!("{stdout}{stderr}"))
    }

    /// The journal's turns as `deermem turns list --json` prints them.
    fn turns(&self, dead_only: bool) -> Vec<Value> {
        let mut args = vec!["turns", "list", "--json"];
        if dead_only {
            args.push("--dead");
        }
        let (ok, out) = self.cli(&args);
        assert!(ok, "deermem turns list failed: {out}");
        let first = out.lines().next().unwrap_or("[]");
        serde_json::from_str::<Value>(first)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_else(|| panic!("not a JSON list: {out}"))
    }
}

/// A running `deermem serve`, killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    async fn start(site: &Site, n: usize, fault: Option<(&str, u32)>) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let log = site.dir.path().join(format!("server-{n}.log"));
        let mut cmd = Command::new(deermem_binary());
        cmd.env_remove("DEERMEM_CONFIG")
            .env_remove("DEERMEM_DATA_DIR")
            .env_remove("DEERMEM_FAULT_STEP")
            .env("DEERMEM_LOG", "info")
            .arg("--config")
            .arg(&site.config)
            .arg("--storage-path")
            .arg(site.root())
            .arg("serve")
            .arg("--bind")
            .arg(addr.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some((step, after)) = fault {
            cmd.env("DEERMEM_FAULT_STEP", step)
                .env("DEERMEM_FAULT_AFTER", after.to_string());
        }
        let child = cmd.spawn().expect("deermem serve starts");
        let mut server = Self { child, addr, log };
        server.wait_ready(fault.is_some()).await;
        server
    }

    /// Waits until the server answers `/readyz`. A server started with a fault point may reach
    /// it before it is ready (replaying the previous cycle's pending turns commits at once):
    /// with `may_exit`, an exit returns, and the caller checks its status.
    async fn wait_ready(&mut self, may_exit: bool) {
        let started = Instant::now();
        let http = reqwest::Client::new();
        loop {
            if let Ok(r) = http.get(self.url("/readyz")).send().await
                && r.status().is_success()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                if may_exit {
                    return;
                }
                panic!("deermem serve exited ({status}): {}", self.log_text());
            }
            assert!(
                started.elapsed() < GUARD,
                "deermem serve never became ready: {}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_text(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = s.len().saturating_sub(6000);
        s.get(start..).unwrap_or_default().to_owned()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// SIGKILL, and the exit status reaped.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One turn of user `u` carrying the code `key`; true when answered 202.
async fn send(http: &reqwest::Client, server_url: &str, u: usize, key: &str) -> bool {
    let body = json!({
        "thread_id": format!("thread-{key}"),
        "messages": [
            {"role": "user", "content": format!("Please remember that I keep the code {key}.")},
            {"role": "assistant", "content": "Noted."},
        ],
    });
    match http
        .post(format!("{server_url}/api/memory/messages"))
        .bearer_auth(token(u))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r.status().as_u16() == 202,
        Err(_) => false,
    }
}

/// The fact contents of user `u`.
async fn contents(http: &reqwest::Client, server: &Server, u: usize) -> Vec<String> {
    let Ok(r) = http
        .get(server.url("/api/memory"))
        .bearer_auth(token(u))
        .send()
        .await
    else {
        return Vec::new();
    };
    let doc: Value = r.json().await.unwrap_or(Value::Null);
    doc["facts"]
        .as_array()
        .map(|facts| {
            facts
                .iter()
                .filter_map(|f| f["content"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until every acknowledged code of every user is a fact, then checks that no fact is
/// there twice.
async fn assert_applied_once(server: &Server, acked: &BTreeMap<usize, BTreeSet<String>>) {
    let http = reqwest::Client::new();
    // The guard runs from the last progress: a loaded machine may take long over a backlog
    // (the long run's last cycles), but a turn that is never applied stops the progress.
    let mut started = Instant::now();
    let mut applied = 0usize;
    loop {
        let mut missing = Vec::new();
        let mut all = BTreeMap::new();
        for (u, keys) in acked {
            let facts = contents(&http, server, *u).await;
            for k in keys {
                if !facts.contains(&format!("User keeps the code {k}")) {
                    missing.push(k.clone());
                }
            }
            all.insert(*u, facts);
        }
        if missing.is_empty() {
            for (u, facts) in &all {
                let unique: BTreeSet<&String> = facts.iter().collect();
                assert_eq!(
                    unique.len(),
                    facts.len(),
                    "user {u} holds a fact twice: {facts:?}"
                );
            }
            return;
        }
        let now_applied: usize = all.values().map(Vec::len).sum();
        if now_applied > applied {
            applied = now_applied;
            started = Instant::now();
        }
        assert!(
            started.elapsed() < GUARD,
            "accepted turns were never applied: {missing:?}\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_accepted_while_the_model_is_down_survive_a_sigkill() {
    let model = FakeModel::start(false).await;
    let site = Site::new(&model);
    let server = Server::start(&site, 0, None).await;
    let http = reqwest::Client::new();
    let mut acked: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for t in 0..4 {
        for u in 0..USERS {
            let key = format!("KEEP-u{u}-t{t}");
            assert!(
                send(&http, &server.url(""), u, &key).await,
                "turn {key} was not accepted"
            );
            acked.entry(u).or_default().insert(key);
        }
    }
    // Past the debounce: the extraction runs and fails against the model that is down.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill();
    model.set_up(true);
    let server = Server::start(&site, 1, None).await;
    assert_applied_once(&server, &acked).await;
}

/// The capacity each user gets (the configuration's maximum).
const MAX_FACTS: usize = 500;

/// Turns one client sends in a cycle at most, so a user's facts stay within [`MAX_FACTS`].
fn turns_per_cycle() -> usize {
    (MAX_FACTS - 50) / cycles()
}

fn cycles() -> usize {
    if std::env::var("DEERMEM_LONG").is_ok_and(|v| v == "1") {
        30
    } else {
        4
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_cycles_during_a_turn_flood_apply_every_accepted_turn_once() {
    use rand::Rng as _;
    let model = FakeModel::start(true).await;
    let site = Site::new(&model);
    let acked: Arc<std::sync::Mutex<BTreeMap<usize, BTreeSet<String>>>> = Arc::default();
    let mut aborted_at_fault = false;
    for cycle in 0..cycles() {
        // The second cycle dies at the fault point: after its second commit, before the
        // turns' done-mark.
        let fault = (cycle == 1).then_some(("turns-before-done", 2));
        let server = Server::start(&site, cycle, fault).await;
        let url = server.url("");
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..USERS)
            .map(|u| {
                let (url, stop, acked) = (url.clone(), Arc::clone(&stop), Arc::clone(&acked));
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    let mut t = 0;
                    while !stop.load(Ordering::SeqCst) {
                        if t >= turns_per_cycle() {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                        let key = format!("KEEP-c{cycle}-u{u}-t{t}");
                        t += 1;
                        if send(&http, &url, u, &key).await {
                            acked.lock().unwrap().entry(u).or_default().insert(key);
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
            })
            .collect();
        let mut server = server;
        if fault.is_some() {
            let started = Instant::now();
            let status = loop {
                if let Ok(Some(status)) = server.child.try_wait() {
                    break status;
                }
                assert!(
                    started.elapsed() < GUARD,
                    "the server never reached the fault point (is deermem built with the engine's fault-injection feature? `cargo test --workspace` builds it so): {}",
                    server.log_text()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            use std::os::unix::process::ExitStatusExt as _;
            aborted_at_fault = status.signal() == Some(6);
            assert!(aborted_at_fault, "exit {status}: {}", server.log_text());
        } else {
            let pause = rand::rng().random_range(200..2500);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        stop.store(true, Ordering::SeqCst);
        for c in clients {
            let _ = c.await;
        }
        server.kill();
    }
    assert!(aborted_at_fault);
    let server = Server::start(&site, cycles(), None).await;
    let acked = acked.lock().unwrap().clone();
    assert!(acked.values().map(BTreeSet::len).sum::<usize>() > 0);
    assert_applied_once(&server, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettered_turns_are_listed_and_applied_by_turns_retry() {
    let model = FakeModel::start(false).await;
    let site = Site::with_attempts(&model, 2);
    let server = Server::start(&site, 0, None).await;
    let http = reqwest::Client::new();
    let mut acked: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for u in 0..3 {
        let key = format!("KEEP-dead-u{u}");
        assert!(send(&http, &server.url(""), u, &key).await);
        acked.entry(u).or_default().insert(key);
    }
    // Two failed attempts each, then the dead letter; listed beside the running server.
    let started = Instant::now();
    while site.turns(true).len() < 3 {
        assert!(
            started.elapsed() < GUARD,
            "the turns were never dead-lettered: {:?}\n{}",
            site.turns(false),
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dead = site.turns(true);
    assert!(dead.iter().all(|t| t["attempts"] == 2), "{dead:?}");
    assert!(dead.iter().all(|t| {
        t["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("gave up"))
    }));
    server.kill();
    model.set_up(true);
    let (ok, out) = site.cli(&["turns", "retry", "--all-dead"]);
    assert!(ok, "deermem turns retry failed: {out}");
    assert!(site.turns(false).is_empty(), "{out}");
    let server = Server::start(&site, 1, None).await;
    assert_applied_once(&server, &acked).await;
}

/// A model that never answers in time: every request waits ten minutes.
async fn hanging_model() -> String {
    async fn hang() -> &'static str {
        tokio::time::sleep(Duration::from_secs(600)).await;
        "{}"
    }
    let app = Router::new().route("/v1/chat/completions", post(hang));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/v1")
}

/// Seconds of a replica's lease on a journal turn in the replica test (`queue.turn_lease`).
const PG_TURN_LEASE: u64 = 4;
/// Seconds between a replica's claim rounds in the replica test (`queue.claim_interval`).
const PG_CLAIM_INTERVAL: u64 = 1;
/// `debounce_seconds` of the replica test.
const PG_DEBOUNCE: u64 = 1;

/// A replica's site on the shared database: a storage root of its own (nothing is shared
/// through files) and its own model.
fn pg_site(db_url: &str, schema: &str, model_url: &str, model_timeout: u64) -> Site {
    let dir = tempfile::tempdir().unwrap();
    let tokens: serde_json::Map<String, Value> = (0..USERS)
        .map(|u| (token(u), json!(format!("turns-user{u}"))))
        .collect();
    let config = json!({
        "memory": {"enabled": true, "backend_config": {
            "storage_class": "postgres",
            "postgres": {"url": db_url, "schema": schema, "pool_size": 4},
            "debounce_seconds": PG_DEBOUNCE,
            "max_facts": MAX_FACTS,
            "model": {"model": "fake", "api_key": "k", "base_url": model_url,
                      "timeout_seconds": model_timeout, "max_retries": 0},
            "queue": {"turn_lease": PG_TURN_LEASE, "claim_interval": PG_CLAIM_INTERVAL,
                      "retry": {"initial_backoff_ms": 200, "max_backoff": 1}},
        }},
        "gateway": {"auth": {"mode": "token", "tokens": tokens}},
    });
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config.to_string()).unwrap();
    Site { dir, config: path }
}

/// The done-when: two replicas on one PostgreSQL database. Replica A accepts turns
/// (202) while its model hangs, so it holds them (leased, renewed every claim round); B, whose
/// model works, does not touch them while A lives. A is SIGKILLed: B applies every one of them,
/// each fact once, within the lease plus a claim round plus the debounce (and slack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_postgres_replicas_accepted_turns_are_applied_by_the_other_within_the_lease() {
    let cluster = deermem_testkit::pgcluster::PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let schema = format!("turns_replicas_{}", std::process::id());
    let slow = hanging_model().await;
    let model = FakeModel::start(true).await;
    let site_a = pg_site(cluster.url(), &schema, &slow, 300);
    let site_b = pg_site(cluster.url(), &schema, &model.url, 5);
    let a = Server::start(&site_a, 0, None).await;
    let b = Server::start(&site_b, 0, None).await;
    let http = reqwest::Client::new();
    let mut acked: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for t in 0..3 {
        for u in 0..USERS {
            let key = format!("KEEP-pg-u{u}-t{t}");
            assert!(
                send(&http, &a.url(""), u, &key).await,
                "turn {key} was not accepted by A"
            );
            acked.entry(u).or_default().insert(key);
        }
    }
    // Longer than a lease: A renews its leases, so B leaves its turns alone while A lives.
    tokio::time::sleep(Duration::from_secs(PG_TURN_LEASE + 2)).await;
    for u in 0..USERS {
        let facts = contents(&http, &b, u).await;
        assert!(
            facts.is_empty(),
            "B applied turns A holds while A lives: {facts:?}\n{}",
            b.log_text()
        );
    }
    a.kill();
    let killed = Instant::now();
    assert_applied_once(&b, &acked).await;
    let took = killed.elapsed();
    let bound = Duration::from_secs(PG_TURN_LEASE + PG_CLAIM_INTERVAL + PG_DEBOUNCE + 10);
    assert!(
        took <= bound,
        "B applied A's turns {took:?} after the kill, past {bound:?}\n{}",
        b.log_text()
    );
    // Nothing left in the shared journal (`deermem turns list` reads the table): every turn
    // was completed.
    let left = site_b.turns(false);
    assert!(left.is_empty(), "turns left in the journal: {left:?}");
}
