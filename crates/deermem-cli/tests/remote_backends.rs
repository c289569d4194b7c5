//! The real `deermem` binary with `manager_class: honcho` and `manager_class: openviking`
//! selected from a config file, against the strict fake servers of the backend crates running in
//! this test process on 127.0.0.1: `ingest`, `context`, `search --json`, `facts add`
//! (unsupported) and `serve` (context, messages, the document route, SIGTERM) all reach the fake.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use deermem_backend_honcho::HonchoConfig;
use deermem_backend_honcho::fake::FakeHoncho;
use deermem_backend_honcho::identity::{Identity, session_id as honcho_session};
use deermem_backend_openviking::fake::{API_KEY, FakeOv};
use deermem_backend_openviking::scope::session_id as ov_session;
use serde_json::{Value, json};

/// The variable the OpenViking config names in `api_key_env` (set on the child only).
const OV_KEY_ENV: &str = "DEERMEM_CLI_TEST_OV_KEY";
/// The bearer token `serve` maps to user `alice`.
const TOKEN: &str = "tok-alice";

/// A multi-threaded runtime whose workers serve the fakes while the test thread blocks on the
/// child process.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A scratch directory with the config file, the storage root and input files.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new(memory_yaml: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "{memory_yaml}gateway:\n  auth:\n    mode: token\n    tokens: {{{TOKEN}: alice}}\n"
        );
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// `deermem --config FILE --storage-path ROOT`, with the environment cleaned.
    fn bin(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_deermem"));
        c.env_remove("DEERMEM_CONFIG")
            .env_remove("DEERMEM_DATA_DIR")
            .env_remove("DEER_FLOW_HOME")
            .env_remove(OV_KEY_ENV)
            .env("DEERMEM_LOG", "error")
            .arg("--config")
            .arg(self.path("config.yaml"))
            .arg("--storage-path")
            .arg(self.path("root"));
        c
    }

    /// As [`Workspace::run`] with the CLI's default logging (no `DEERMEM_LOG`).
    fn run_default_log(&self, args: &[&str], key: Option<&str>) -> Output {
        let mut c = self.bin();
        c.env_remove("DEERMEM_LOG");
        if let Some(k) = key {
            c.env(OV_KEY_ENV, k);
        }
        c.args(args).output().unwrap()
    }

    fn run(&self, args: &[&str], key: Option<&str>) -> Output {
        let mut c = self.bin();
        if let Some(k) = key {
            c.env(OV_KEY_ENV, k);
        }
        c.args(args).output().unwrap()
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "deermem {what} failed ({:?}): {}",
        out.status,
        stderr(&out)
    );
    out
}

fn json_out(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON on stdout ({e}): {}", stdout(out)))
}

const CONVERSATION: &str = r#"[
  {"role": "system", "content": "you are helpful"},
  {"role": "user", "content": "I drink oolong tea every morning"},
  {"role": "assistant", "content": "Noted: oolong tea in the morning."}
]"#;

/// One HTTP/1.1 exchange with `Connection: close`: the status and the parsed JSON body.
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let payload = body.map(Value::to_string).unwrap_or_default();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n"
    );
    if body.is_some() {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            payload.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(&payload);
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {raw:?}"));
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let value = serde_json::from_str(body).unwrap_or(Value::String(body.to_owned()));
    (status, value)
}

/// Starts `deermem serve --bind 127.0.0.1:0` and returns the child and its address.
fn serve(ws: &Workspace, key: Option<&str>) -> (Child, String) {
    let mut c = ws.bin();
    if let Some(k) = key {
        c.env(OV_KEY_ENV, k);
    }
    let mut child = c
        .args(["serve", "--bind", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let Some(line) = lines.next() else {
            let status = child.wait().unwrap();
            panic!("serve exited before printing its address: {status:?}");
        };
        let line = line.unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            assert!(line.contains("/api/memory"), "{line}");
            break rest.split('/').next().unwrap().to_owned();
        }
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    (child, addr)
}

/// SIGTERM, then the exit status.
fn stop(mut child: Child) -> std::process::ExitStatus {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    child.wait().unwrap()
}

fn assert_unsupported_fact_add(ws: &Workspace, key: Option<&str>, backend: &str) {
    let out = ws.run(
        &["facts", "add", "--user", "alice", "--content", "Likes tea"],
        key,
    );
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("not supported") && err.contains("create fact") && err.contains(backend),
        "{err}"
    );
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
}

// ---------------------------------------------------------------------------------------------
// Honcho
// ---------------------------------------------------------------------------------------------

fn honcho_workspace(fake: &FakeHoncho) -> Workspace {
    Workspace::new(&format!(
        "memory:\n  manager_class: honcho\n  backend_config:\n    base_url: {}\n    api_key: sk-cli\n    allow_insecure_http: true\n",
        fake.url
    ))
}

fn alice_honcho() -> Identity {
    Identity::resolve(&HonchoConfig::default(), Some("alice")).unwrap()
}

#[test]
fn honcho_cli_commands_reach_the_fake() {
    let rt = runtime();
    let fake = rt.block_on(FakeHoncho::start());
    let ws = honcho_workspace(&fake);
    let alice = alice_honcho();
    let msgs = ws.write("conversation.json", CONVERSATION);

    // ingest: the messages reach Honcho before the command exits.
    let out = ok(
        ws.run(
            &[
                "ingest",
                "--user",
                "alice",
                "--thread",
                "t1",
                msgs.to_str().unwrap(),
            ],
            None,
        ),
        "ingest",
    );
    assert!(
        stdout(&out).contains("sent 3 message(s) to the honcho backend"),
        "{}",
        stdout(&out)
    );
    let stored: Vec<(String, String, String, String)> = fake
        .messages()
        .into_iter()
        .map(|m| (m.workspace, m.session, m.peer_id, m.content))
        .collect();
    let session = honcho_session("t1");
    assert_eq!(
        stored,
        vec![
            (
                alice.workspace.clone(),
                session.clone(),
                alice.user_peer.clone(),
                "I drink oolong tea every morning".to_owned()
            ),
            (
                alice.workspace.clone(),
                session.clone(),
                "deerflow".to_owned(),
                "Noted: oolong tea in the morning.".to_owned()
            ),
        ]
    );
    for r in fake.requests() {
        assert_eq!(r.authorization.as_deref(), Some("Bearer sk-cli"));
        assert!(r.status == 200 || r.status == 201, "{r:?}");
    }
    // The cursor is under the storage root given on the command line.
    assert!(ws.path("root").join("honcho/cursors").is_dir());

    // A second ingest of the same transcript sends nothing new (the cursor survived the
    // process).
    fake.clear_requests();
    ok(
        ws.run(
            &[
                "--json",
                "ingest",
                "--user",
                "alice",
                "--thread",
                "t1",
                msgs.to_str().unwrap(),
            ],
            None,
        ),
        "ingest again",
    );
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());
    assert_eq!(fake.messages().len(), 2);

    // context: the representation wrapped in <memory>.
    fake.set_representation(
        &alice.workspace,
        &alice.user_peer,
        "Alice drinks oolong tea.",
    );
    let out = ok(ws.run(&["context", "--user", "alice"], None), "context");
    assert_eq!(
        stdout(&out),
        "<memory>\nAlice drinks oolong tea.\n</memory>\n"
    );
    let out = ok(
        ws.run(&["--json", "context", "--user", "alice"], None),
        "context --json",
    );
    let v = json_out(&out);
    assert_eq!(
        v["context"],
        "<memory>\nAlice drinks oolong tea.\n</memory>\n"
    );
    assert_eq!(v["content_sha256"].as_str().map(str::len), Some(64));

    // search --json: the fake's hits.
    fake.clear_requests();
    let out = ok(
        ws.run(&["--json", "search", "--user", "alice", "oolong"], None),
        "search",
    );
    let rows = json_out(&out);
    let rows = rows.as_array().unwrap();
    let contents: Vec<&str> = rows
        .iter()
        .map(|r| r["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        contents,
        vec![
            "I drink oolong tea every morning",
            "Noted: oolong tea in the morning."
        ]
    );
    assert!(rows.iter().all(|r| r["matchType"] == "remote"), "{rows:?}");
    let search = fake.requests();
    assert_eq!(search.len(), 1);
    assert_eq!(
        search[0].raw_path,
        format!("/v3/workspaces/{}/search", alice.workspace)
    );
    assert_eq!(search[0].body, json!({"query": "oolong", "limit": 5}));

    // Fact edits are not supported by Honcho.
    assert_unsupported_fact_add(&ws, None, "HonchoMemoryManager");
}

#[test]
fn honcho_serve_reaches_the_fake_and_stops_on_sigterm() {
    let rt = runtime();
    let fake = rt.block_on(FakeHoncho::start());
    let ws = honcho_workspace(&fake);
    let alice = alice_honcho();
    fake.set_representation(
        &alice.workspace,
        &alice.user_peer,
        "Alice drinks oolong tea.",
    );
    let (child, addr) = serve(&ws, None);

    let (status, body) = http(&addr, "GET", "/api/memory/context", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["context"],
        "<memory>\nAlice drinks oolong tea.\n</memory>\n"
    );
    let message_body = json!({"thread_id": "t2", "messages": [
        {"role": "user", "content": "My cat is called Miso"},
        {"role": "assistant", "content": "Miso is a lovely name."}
    ]});
    let (status, body) = http(&addr, "POST", "/api/memory/messages", Some(&message_body));
    assert_eq!(status, 202, "{body}");
    // Honcho can read the document: the representation is mapped into it.
    let (status, doc) = http(&addr, "GET", "/api/memory", None);
    assert_eq!(status, 200, "{doc}");
    assert_eq!(
        doc["user"]["workContext"]["summary"],
        "Alice drinks oolong tea."
    );
    assert_eq!(doc["facts"], json!([]));

    let exit = stop(child);
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
    // The capture was drained before the process exited.
    let stored: Vec<(String, String)> = fake
        .messages()
        .into_iter()
        .map(|m| (m.session, m.content))
        .collect();
    let session = honcho_session("t2");
    assert_eq!(
        stored,
        vec![
            (session.clone(), "My cat is called Miso".to_owned()),
            (session, "Miso is a lovely name.".to_owned()),
        ]
    );
    let representation_reads = fake
        .requests()
        .iter()
        .filter(|r| r.raw_path.ends_with("/representation"))
        .count();
    assert_eq!(representation_reads, 2, "context and the document");
}

// ---------------------------------------------------------------------------------------------
// OpenViking
// ---------------------------------------------------------------------------------------------

fn openviking_workspace(fake: &FakeOv) -> Workspace {
    Workspace::new(&format!(
        "memory:\n  manager_class: openviking\n  backend_config:\n    base_url: {}\n    owner_user_id: alice\n    api_key_env: {OV_KEY_ENV}\n",
        fake.url()
    ))
}

/// The memory the server's extractor would have stored from `CONVERSATION`; returns its uri.
fn add_tea(fake: &FakeOv) -> String {
    fake.add_memory(
        "preferences",
        "tea",
        "Drinks oolong tea every morning.",
        0.82,
    )
}

#[test]
fn openviking_cli_commands_reach_the_fake() {
    let rt = runtime();
    let fake = rt.block_on(FakeOv::start());
    let tea = add_tea(&fake);
    let ws = openviking_workspace(&fake);
    let key = Some(API_KEY);
    let msgs = ws.write("conversation.json", CONVERSATION);

    // ingest: one batch and a commit reach OpenViking before the command exits.
    let out = ok(
        ws.run(
            &[
                "ingest",
                "--user",
                "alice",
                "--thread",
                "t1",
                msgs.to_str().unwrap(),
            ],
            key,
        ),
        "ingest",
    );
    assert!(
        stdout(&out).contains("sent 2 message(s) to the openviking backend"),
        "{}",
        stdout(&out)
    );
    let sid = ov_session("alice", "deerflow", "t1");
    assert_eq!(
        fake.lines(),
        vec![
            format!("POST /api/v1/sessions/{sid}/messages/batch"),
            format!("POST /api/v1/sessions/{sid}/commit"),
        ]
    );
    let texts: Vec<(String, String)> = fake
        .session_messages(&sid)
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["parts"][0]["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        texts,
        vec![
            (
                "user".to_owned(),
                "I drink oolong tea every morning".to_owned()
            ),
            (
                "assistant".to_owned(),
                "Noted: oolong tea in the morning.".to_owned()
            ),
        ]
    );
    assert_eq!(fake.session_commits(&sid), 1);
    for r in fake.requests() {
        assert_eq!(r.header("x-api-key"), Some(API_KEY));
    }
    assert!(
        ws.path("root")
            .join("openviking/sessions")
            .join(format!("{sid}.json"))
            .is_file()
    );

    // The single-owner rule: another user is refused before any request.
    fake.clear();
    let out = ws.run(
        &[
            "ingest",
            "--user",
            "bob",
            "--thread",
            "t1",
            msgs.to_str().unwrap(),
        ],
        key,
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("alice"), "{}", stderr(&out));
    assert!(fake.requests().is_empty(), "{:?}", fake.lines());

    // context: the recalled memory wrapped in <memory>.
    let out = ok(ws.run(&["context", "--user", "alice"], key), "context");
    assert_eq!(
        stdout(&out),
        "<memory>\n- [preferences] Drinks oolong tea every morning.\n</memory>\n"
    );

    // search --json: the fake's hits with their scores.
    fake.clear();
    let out = ok(
        ws.run(
            &["--json", "search", "--user", "alice", "--top-k", "3", "tea"],
            key,
        ),
        "search",
    );
    assert_eq!(
        json_out(&out),
        json!([{
            "id": tea,
            "content": "Drinks oolong tea every morning.",
            "category": "preferences",
            "score": 0.82,
            "matchType": "remote",
        }])
    );
    let reqs = fake.requests();
    assert_eq!(fake.lines(), vec!["POST /api/v1/search/find"]);
    let body = reqs[0].body.as_ref().unwrap();
    assert_eq!(
        (body["query"].as_str(), body["limit"].as_u64()),
        (Some("tea"), Some(3))
    );

    // Fact edits are not supported by OpenViking.
    assert_unsupported_fact_add(&ws, key, "OpenVikingMemoryManager");

    // Without its key the backend refuses to start, naming the variable (never a key).
    let out = ws.run(&["context", "--user", "alice"], None);
    assert_eq!(
        out.status.code(),
        Some(5),
        "a configuration mistake is invalid input"
    );
    assert!(
        stderr(&out).contains("api_key_env") && stderr(&out).contains(OV_KEY_ENV),
        "{}",
        stderr(&out)
    );
    fake.assert_clean();
}

#[test]
fn openviking_serve_reaches_the_fake_and_stops_on_sigterm() {
    let rt = runtime();
    let fake = rt.block_on(FakeOv::start());
    add_tea(&fake);
    let ws = openviking_workspace(&fake);
    let (child, addr) = serve(&ws, Some(API_KEY));

    let (status, body) = http(&addr, "GET", "/api/memory/context", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["context"],
        "<memory>\n- [preferences] Drinks oolong tea every morning.\n</memory>\n"
    );
    let message_body = json!({"thread_id": "t2", "messages": [
        {"role": "user", "content": "My cat is called Miso"},
        {"role": "assistant", "content": "Miso is a lovely name."}
    ]});
    let (status, body) = http(&addr, "POST", "/api/memory/messages", Some(&message_body));
    assert_eq!(status, 202, "{body}");
    // OpenViking cannot read a memory document: the capability says so, the route says 501.
    let (status, body) = http(&addr, "GET", "/api/memory", None);
    assert_eq!(status, 501, "{body}");

    let exit = stop(child);
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
    let sid = ov_session("alice", "deerflow", "t2");
    let texts: Vec<String> = fake
        .session_messages(&sid)
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        texts,
        vec!["My cat is called Miso", "Miso is a lovely name."]
    );
    assert_eq!(fake.session_commits(&sid), 1);
    let lines = fake.lines();
    assert!(lines.contains(&"GET /health".to_owned()), "{lines:?}");
    assert!(
        lines.contains(&"POST /api/v1/search/find".to_owned()),
        "{lines:?}"
    );
    fake.assert_clean();
}

#[test]
fn openviking_tool_mode_is_refused_before_anything_starts() {
    let rt = runtime();
    let fake = rt.block_on(FakeOv::start());
    let ws = Workspace::new(&format!(
        "memory:\n  manager_class: openviking\n  mode: tool\n  backend_config:\n    base_url: {}\n    owner_user_id: alice\n    api_key_env: {OV_KEY_ENV}\n",
        fake.url()
    ));
    for args in [
        &["context", "--user", "alice"][..],
        &["serve", "--bind", "127.0.0.1:0"][..],
    ] {
        let out = ws.run(args, Some(API_KEY));
        assert_eq!(out.status.code(), Some(5), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("memory.mode: middleware") && !err.contains("serving"),
            "{args:?}: {err}"
        );
    }
    assert!(fake.requests().is_empty(), "{:?}", fake.lines());
}

/// A port nothing listens on.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Defect: with `failure_policy.read: fail_open` (the default), `context` and `search` exited 0
/// with empty output when the server could not be read; only a log line said why. They now
/// fail with one stderr line and exit 8; the configured behaviour for hosts is unchanged.
#[test]
fn openviking_context_and_search_fail_when_nothing_could_be_read() {
    let ws = Workspace::new(&format!(
        "memory:\n  manager_class: openviking\n  backend_config:\n    base_url: http://127.0.0.1:{}\n    owner_user_id: alice\n    api_key_env: {OV_KEY_ENV}\n    timeout_seconds: 2\n",
        dead_port()
    ));
    for args in [
        &["context", "--user", "alice"][..],
        &["search", "--user", "alice", "tea"][..],
        &["--json", "search", "--user", "alice", "tea"][..],
    ] {
        let out = ws.run_default_log(args, Some(API_KEY));
        assert_eq!(out.status.code(), Some(8), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line: {err}");
        assert!(
            lines[0].starts_with("deermem: unavailable: ")
                && lines[0].contains("OpenViking")
                && lines[0].contains("[CONNECT]")
                && lines[0].contains("no memory could be read")
                && !lines[0].contains("127.0.0.1"),
            "{args:?}: the server's error without its URL: {err}"
        );
        assert_eq!(
            stdout(&out),
            "",
            "{args:?}: nothing printed as if memory were empty"
        );
    }
    // A reachable server with nothing stored is not a failure.
    let rt = runtime();
    let fake = rt.block_on(FakeOv::start());
    let ws = openviking_workspace(&fake);
    let out = ok(
        ws.run(&["context", "--user", "alice"], Some(API_KEY)),
        "context",
    );
    assert_eq!(stdout(&out), "(no memory to inject)\n");
}

/// Defect: `deermem ingest` exited 0 and printed the input's message count whatever happened.
/// It now reports what reached the server, and a failed capture exits 8 (unavailable, timed
/// out) or 1 (refused) with the server's message, without a "did not finish in time" line.
#[test]
fn openviking_ingest_reports_failures_and_what_was_sent() {
    let rt = runtime();
    let fake = rt.block_on(FakeOv::start());
    let ws = openviking_workspace(&fake);
    let msgs = ws.write("conversation.json", CONVERSATION);
    let ingest = |key| {
        ws.run_default_log(
            &[
                "ingest",
                "--user",
                "alice",
                "--thread",
                "t1",
                msgs.to_str().unwrap(),
            ],
            key,
        )
    };

    // Refused: a wrong key.
    let out = ingest(Some("not-the-key"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("[UNAUTHENTICATED] Invalid API key")
            && err.contains("0 message(s) reached the server"),
        "{err}"
    );
    assert!(!err.contains("did not finish"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // Unavailable: the server answers 503.
    fake.state
        .unavailable_writes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let out = ingest(Some(API_KEY));
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert!(stderr(&out).contains("[UNAVAILABLE]"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("did not finish"), "{}", stderr(&out));

    // Then it works, and reports the messages sent (the system message is not one of them).
    let out = ok(ingest(Some(API_KEY)), "ingest");
    assert_eq!(
        stdout(&out),
        "sent 2 message(s) to the openviking backend\n"
    );
    // Again: nothing new to send.
    let out = ok(ingest(Some(API_KEY)), "ingest");
    assert_eq!(
        stdout(&out),
        "sent 0 message(s) to the openviking backend\n"
    );
    let out = ok(
        ws.run(
            &[
                "--json",
                "ingest",
                "--user",
                "alice",
                "--thread",
                "t1",
                msgs.to_str().unwrap(),
            ],
            Some(API_KEY),
        ),
        "ingest --json",
    );
    assert_eq!(
        json_out(&out),
        json!({"status": "sent", "backend": "openviking", "sent": 0, "found_on_server": 0})
    );

    // Server down: exit 8.
    let down = Workspace::new(&format!(
        "memory:\n  manager_class: openviking\n  backend_config:\n    base_url: http://127.0.0.1:{}\n    owner_user_id: alice\n    api_key_env: {OV_KEY_ENV}\n    failure_policy: {{write: log_and_drop}}\n",
        dead_port()
    ));
    let out = down.run_default_log(
        &[
            "ingest",
            "--user",
            "alice",
            "--thread",
            "t1",
            msgs.to_str().unwrap(),
        ],
        Some(API_KEY),
    );
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("[CONNECT]") && !err.contains("did not finish"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
