//! The real `deermem` binary against a real OpenViking 0.5.2 server (`openviking==0.5.2` from
//! PyPI in a cached virtual environment, started on loopback in `api_key` mode with a root key;
//! an account and a USER key made through its admin API; its embedding and chat models pointed
//! at a stub in this process whose answers make the server's extractor store a memory).
//!
//! End to end: `deermem ingest` → commit → the server's extraction → `deermem context`,
//! `deermem search` (with `--category`) and `GET /api/memory/context` from `deermem serve`;
//! then a wrong key, a slow server (the request times out, the server stores the batch later,
//! the next run does not send it again), and a server stopped in the middle of a capture
//! (nothing lost, the next run completes). Everything started here is stopped when the test
//! ends; when the server cannot be installed, the test fails saying what is missing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use deermem_backend_openviking::scope::session_id;
use deermem_backend_openviking::testserver::{ModelStub, OvServer};
use serde_json::{Value, json};

/// The variable the config names in `api_key_env` (set on the child only).
const KEY_ENV: &str = "DEERMEM_CLI_REAL_OV_KEY";
/// The OpenViking user the key belongs to.
const OV_USER: &str = "deermem-cli";
/// The bearer token `serve` maps to `alice`.
const TOKEN: &str = "tok-alice";
/// How long the server's background extraction may take.
const EXTRACTION: Duration = Duration::from_secs(120);
/// The line the injection block holds once the memory was extracted.
const VIM_LINE: &str = "- [preferences] - Uses Vim as the code editor.";

/// A conversation whose capture sends 4 messages (the system message is not sent).
fn conversation(topic: &str) -> String {
    json!([
        {"role": "system", "content": "You are DeerFlow."},
        {"type": "human", "id": format!("{topic}-h1"), "content": format!("Remember that {topic}.")},
        {"type": "ai", "id": format!("{topic}-a1"), "content": "", "tool_calls": [
            {"name": "web_search", "args": {"q": topic}, "id": format!("{topic}-call"), "type": "tool_call"}]},
        {"type": "tool", "id": format!("{topic}-t1"), "content": "search result", "name": "web_search",
         "tool_call_id": format!("{topic}-call"), "status": "success"},
        {"type": "ai", "id": format!("{topic}-a2"), "content": "Noted."}
    ])
    .to_string()
}

struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    /// `config.yaml` (30 s timeout) and `slow.yaml` (3 s), one storage root for both.
    fn new(url: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for (name, timeout) in [("config.yaml", 30), ("slow.yaml", 3)] {
            std::fs::write(
                dir.path().join(name),
                format!(
                    "memory:\n  manager_class: openviking\n  backend_config:\n    base_url: {url}\n    owner_user_id: alice\n    api_key_env: {KEY_ENV}\n    timeout_seconds: {timeout}\ngateway:\n  auth:\n    mode: token\n    tokens: {{{TOKEN}: alice}}\n"
                ),
            )
            .unwrap();
        }
        std::fs::create_dir(dir.path().join("root")).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> String {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    }

    /// `deermem --config CONFIG --storage-path ROOT` with the key in the environment and the
    /// CLI's default logging.
    fn bin(&self, config: &str, key: &str) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_deermem"));
        c.env_remove("DEERMEM_CONFIG")
            .env_remove("DEERMEM_DATA_DIR")
            .env_remove("DEER_FLOW_HOME")
            .env_remove("DEERMEM_LOG")
            .env(KEY_ENV, key)
            .arg("--config")
            .arg(self.path(config))
            .arg("--storage-path")
            .arg(self.path("root"));
        c
    }

    fn run(&self, config: &str, key: &str, args: &[&str]) -> Output {
        self.bin(config, key).args(args).output().unwrap()
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

/// One HTTP/1.1 exchange with the bearer token: the status and the parsed JSON body.
fn http(addr: &str, path: &str) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// `deermem serve` on a free loopback port; stopped (SIGTERM, then waited for) on drop.
struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(ws: &Workspace, config: &str, key: &str) -> Self {
        let mut child = ws
            .bin(config, key)
            .args(["serve", "--bind", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                let status = child.wait().unwrap();
                panic!("serve exited before printing its address: {status:?}");
            };
            if let Some(rest) = line.split("http://").nth(1) {
                break rest.split('/').next().unwrap().to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Self { child, addr }
    }

    fn stop(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        self.child.wait().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn cli_and_gateway_against_a_real_openviking_server() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stub = rt.block_on(ModelStub::start()).unwrap();
    let mut server = rt
        .block_on(OvServer::start(&stub.base_url()))
        .unwrap_or_else(|e| panic!("the real OpenViking server is needed: {e}"));
    let key = rt
        .block_on(server.create_user("deermem", OV_USER))
        .unwrap_or_else(|e| panic!("{e}"));
    stub.remember(
        "I use Vim",
        &format!(
            r#"sdk.create_preferences(user="""{OV_USER}""", topic="""editor""", content="""- Uses Vim as the code editor.""")"#
        ),
    );
    let ws = Workspace::new(&server.url());
    let counts = |server: &OvServer, thread: &str| {
        rt.block_on(server.session_counts(
            &key,
            "deerflow",
            &session_id("alice", "deerflow", thread),
        ))
        .unwrap()
    };
    let ingest = |config: &str, key: &str, thread: &str, file: &str| {
        ws.run(
            config,
            key,
            &["ingest", "--user", "alice", "--thread", thread, file],
        )
    };

    // Ingest → commit → extraction.
    let vim = ws.write("vim.json", &conversation("I use Vim as my editor"));
    let out = ok(ingest("config.yaml", &key, "t1", &vim), "ingest");
    assert_eq!(
        stdout(&out),
        "sent 4 message(s) to the openviking backend\n"
    );
    assert_eq!(counts(&server, "t1"), Some((0, 4)));
    rt.block_on(server.wait_for_memory(&key, "Uses Vim", EXTRACTION))
        .unwrap_or_else(|e| panic!("{e}"));

    // context and search (with --category) show the memory the server extracted.
    let out = ok(
        ws.run("config.yaml", &key, &["context", "--user", "alice"]),
        "context",
    );
    let block = stdout(&out);
    assert!(
        block.starts_with("<memory>\n") && block.contains(VIM_LINE),
        "{block}"
    );
    assert!(
        !block.contains("Overview") && !block.contains("](./"),
        "{block}"
    );
    let editor = format!("viking://user/{OV_USER}/memories/preferences/{OV_USER}/editor.md");
    let search = |extra: &[&str]| {
        let mut args = vec!["--json", "search", "--user", "alice", "--top-k", "10"];
        args.extend_from_slice(extra);
        args.push("vim editor");
        let out = ok(ws.run("config.yaml", &key, &args), "search");
        serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
    };
    let all = search(&[]);
    assert!(all.iter().any(|h| h["id"] == editor.as_str()), "{all:?}");
    let prefs = search(&["--category", "preferences"]);
    assert!(
        prefs.iter().any(|h| h["id"] == editor.as_str()),
        "{prefs:?}"
    );
    assert!(
        prefs.iter().all(|h| h["category"] == "preferences"),
        "{prefs:?}"
    );
    assert_eq!(search(&["--category", "events"]), Vec::<Value>::new());
    let out = ok(
        ws.run(
            "config.yaml",
            &key,
            &["search", "--user", "alice", "--category", "events", "vim"],
        ),
        "search",
    );
    assert_eq!(stdout(&out), "(no matches)\n");

    // The gateway: the same block; a server that stops answering gives an empty block (the
    // host's turn goes on) and /readyz names the failure.
    let serve = Serve::start(&ws, "slow.yaml", &key);
    let (status, body) = http(&serve.addr, "/api/memory/context");
    assert_eq!(status, 200, "{body}");
    assert!(
        body["context"].as_str().unwrap().contains(VIM_LINE),
        "{body}"
    );
    let (status, body) = http(&serve.addr, "/readyz");
    assert_eq!((status, body), (200, json!({"status": "ready"})));
    server.pause().unwrap();
    let (status, body) = http(&serve.addr, "/api/memory/context");
    assert_eq!(status, 200, "{body}");
    assert!(!body["context"].as_str().unwrap().contains("Vim"), "{body}");
    let (status, body) = http(&serve.addr, "/readyz");
    server.resume().unwrap();
    assert_eq!(status, 200, "{body}");
    let failure = &body["last_backend_failure"];
    assert_eq!(failure["operation"], "recall", "{body}");
    assert!(
        failure["message"].as_str().unwrap().contains("[TIMEOUT]"),
        "{body}"
    );
    assert!(serve.stop().success());

    // A wrong key: ingest exits 1 with the server's message; context says so in one line (8).
    let out = ingest("config.yaml", "not-a-key", "t-wrong-key", &vim);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("[UNAUTHENTICATED] Invalid API key"),
        "{}",
        stderr(&out)
    );
    let out = ws.run("config.yaml", "not-a-key", &["context", "--user", "alice"]);
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("UNAUTHENTICATED"), "{}", stderr(&out));

    // A slow server: the batch request times out, the server stores it afterwards, and the
    // next run finds it there instead of sending it again.
    let tea = ws.write("tea.json", &conversation("I drink oolong tea"));
    server.pause().unwrap();
    let out = ingest("slow.yaml", &key, "t2", &tea);
    server.resume().unwrap();
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert!(stderr(&out).contains("[TIMEOUT]"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("did not finish"), "{}", stderr(&out));
    let started = Instant::now();
    while counts(&server, "t2") != Some((4, 4)) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the server never stored the timed-out batch: {:?}\n{}",
            counts(&server, "t2"),
            server.log_tail()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let out = ok(
        ingest("config.yaml", &key, "t2", &tea),
        "ingest after a timeout",
    );
    assert_eq!(
        stdout(&out),
        "sent 0 message(s) to the openviking backend; 4 message(s) of an earlier unanswered batch were already there\n"
    );
    assert_eq!(
        counts(&server, "t2"),
        Some((0, 4)),
        "no duplicates, committed"
    );

    // The server stopped in the middle of a capture: the run fails (8), nothing is lost, and
    // the next run against the restarted server completes.
    let cat = ws.write("cat.json", &conversation("my cat is called Miso"));
    server.pause().unwrap();
    let child = ws
        .bin("config.yaml", &key)
        .args(["ingest", "--user", "alice", "--thread", "t3", &cat])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    server.kill();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    rt.block_on(server.launch())
        .unwrap_or_else(|e| panic!("restart: {e}"));
    let out = ok(
        ingest("config.yaml", &key, "t3", &cat),
        "ingest after a restart",
    );
    assert_eq!(
        stdout(&out),
        "sent 4 message(s) to the openviking backend\n"
    );
    assert_eq!(counts(&server, "t3"), Some((0, 4)));
    let out = ok(ingest("config.yaml", &key, "t3", &cat), "ingest again");
    assert_eq!(
        stdout(&out),
        "sent 0 message(s) to the openviking backend\n"
    );
    let out = ok(
        ws.run("config.yaml", &key, &["context", "--user", "alice"]),
        "context",
    );
    assert!(
        stdout(&out).contains(VIM_LINE),
        "memory survives the restart"
    );

    server.kill();
    drop(stub);
}
