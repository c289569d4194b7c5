//! `deermem mcp` as an MCP host runs it: logs on stderr without colour codes when stderr is not
//! a terminal and without a WARN per JSON-RPC error answered, `--user` documented with its
//! default, the same raw user id on facts over stdio and HTTP, and CORS preflights for the
//! `--allow-origin` origins.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deermem"));
    c.env_remove("DEERMEM_CONFIG")
        .env_remove("DEERMEM_DATA_DIR")
        .env_remove("DEER_FLOW_HOME")
        .env_remove("DEERMEM_LOG")
        .env_remove("NO_COLOR");
    c
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// Runs one stdio session: writes `lines`, closes stdin, returns (stdout lines, stderr).
fn stdio_session(args: &[&str], env: &[(&str, &str)], lines: &[String]) -> (Vec<Value>, String) {
    let mut cmd = bin();
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start deermem mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut out = stdout.lines();
    let mut answers = Vec::new();
    for line in lines {
        writeln!(stdin, "{line}").expect("write");
        stdin.flush().expect("flush");
        let v: Value = serde_json::from_str(line).expect("test JSON");
        if v.get("id").is_some() {
            let text = out.next().expect("an answer").expect("read");
            answers.push(serde_json::from_str(&text).expect("JSON answer"));
        }
    }
    drop(stdin);
    let output = child.wait_with_output().expect("wait");
    assert!(output.status.success(), "{output:?}");
    (
        answers,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn call(id: u64, name: &str, arguments: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
    .to_string()
}

#[test]
fn logs_have_no_colour_codes_and_answered_errors_are_debug_not_warn() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let session = [
        INIT.to_owned(),
        call(2, "memory_nope", json!({})),
        json!({"jsonrpc": "2.0", "id": 3, "method": "nope/nope"}).to_string(),
    ];
    // Default level: nothing is logged for a client's mistakes.
    let (answers, stderr) = stdio_session(
        &["--storage-path", root, "mcp", "--user", "alice"],
        &[],
        &session,
    );
    assert_eq!(answers[1]["error"]["code"], -32602, "{answers:?}");
    assert_eq!(answers[2]["error"]["code"], -32601, "{answers:?}");
    assert!(!stderr.contains("WARN"), "{stderr}");
    assert!(!stderr.contains("response error"), "{stderr}");
    // At DEBUG they are there, and stderr (a pipe here) carries no ANSI escape codes.
    let (_, stderr) = stdio_session(
        &["--storage-path", root, "mcp", "--user", "alice"],
        &[("DEERMEM_LOG", "debug")],
        &session,
    );
    assert!(stderr.contains("answered a JSON-RPC error"), "{stderr}");
    assert!(stderr.contains("DEBUG"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes on a pipe: {stderr}"
    );
    assert!(!stderr.contains("WARN"), "{stderr}");
}

#[test]
fn help_says_who_mcp_acts_for_without_user() {
    let out = bin().args(["mcp", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        help.contains("--user") && help.contains("acts as the user `default`"),
        "{help}"
    );
    assert!(help.contains("--allow-origin"), "{help}");
    // An origin that is not one is refused before anything starts.
    let out = bin()
        .args([
            "mcp",
            "--bind",
            "127.0.0.1:0",
            "--allow-origin",
            "localhost:6274",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an origin"));
}

struct HttpServer {
    child: Child,
    addr: String,
}

impl HttpServer {
    fn start(config: &Path, root: &Path, extra: &[&str]) -> Self {
        let mut child = bin()
            .arg("--config")
            .arg(config)
            .arg("--storage-path")
            .arg(root)
            .args(["mcp", "--bind", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let started = Instant::now();
        let addr = loop {
            let line = lines.next().expect("mcp printed its address").unwrap();
            if let Some(rest) = line.split("http://").nth(1) {
                break rest.split('/').next().unwrap().to_owned();
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "mcp did not start"
            );
        };
        Self { child, addr }
    }

    /// One HTTP/1.1 request on its own connection: (status line, headers, body).
    fn request(
        &self,
        method: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (String, String, String) {
        let mut stream = std::net::TcpStream::connect(&self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut req = format!(
            "{method} /mcp HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        stream.write_all(req.as_bytes()).unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
        (
            status.to_owned(),
            headers.to_ascii_lowercase(),
            body.to_owned(),
        )
    }

    fn post(&self, token: &str, body: &str) -> Value {
        let auth = format!("Bearer {token}");
        let (status, _, body) = self.request(
            "POST",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            body,
        );
        assert!(status.contains(" 200 "), "{status}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn token_config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "memory:\n  enabled: true\ngateway:\n  auth:\n    mode: token\n    tokens:\n      tok-mail: Mail.User@example.com\n",
    )
    .unwrap();
    config
}

fn text_of(answer: &Value) -> Value {
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text: {answer}"));
    serde_json::from_str(text).unwrap()
}

#[test]
fn a_fact_shows_the_raw_user_id_over_stdio_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let config = token_config(dir.path());
    let server = HttpServer::start(&config, &root, &[]);
    let added = server.post(
        "tok-mail",
        &call(1, "memory_add", json!({"content": "Added over HTTP"})),
    );
    assert_eq!(text_of(&added)["status"], "added", "{added}");
    drop(server);

    let (answers, _) = stdio_session(
        &[
            "--config",
            config.to_str().unwrap(),
            "--storage-path",
            root.to_str().unwrap(),
            "mcp",
            "--user",
            "Mail.User@example.com",
        ],
        &[],
        &[
            INIT.to_owned(),
            call(2, "memory_add", json!({"content": "Added over stdio"})),
            call(3, "memory_search", json!({"query": "Added"})),
        ],
    );
    let found = text_of(&answers[2]);
    assert_eq!(found["count"], 2, "one bucket for both transports: {found}");
    for fact in found["results"].as_array().unwrap() {
        assert_eq!(fact["scope"]["userId"], "Mail.User@example.com", "{fact}");
    }
    // And over HTTP the stdio fact shows the same id.
    let server = HttpServer::start(&config, &root, &[]);
    let found = server.post(
        "tok-mail",
        &call(4, "memory_search", json!({"query": "stdio"})),
    );
    let found = text_of(&found);
    assert_eq!(found["count"], 1, "{found}");
    assert_eq!(
        found["results"][0]["scope"]["userId"],
        "Mail.User@example.com"
    );
}

#[test]
fn allow_origin_answers_cors_preflights() {
    let dir = tempfile::tempdir().unwrap();
    let config = token_config(dir.path());
    let server = HttpServer::start(
        &config,
        &dir.path().join("root"),
        &["--allow-origin", "http://localhost:6274"],
    );
    let preflight = |origin: &str| {
        server.request(
            "OPTIONS",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
            ],
            "",
        )
    };
    let (status, headers, _) = preflight("http://localhost:6274");
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        headers.contains("access-control-allow-origin: http://localhost:6274"),
        "{headers}"
    );
    let (_, headers, _) = preflight("http://elsewhere.example");
    assert!(
        !headers.contains("access-control-allow-origin"),
        "{headers}"
    );
}

#[test]
fn mcp_refuses_a_user_named_like_another_users_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let out = bin()
        .args([
            "--storage-path",
            root,
            "mcp",
            "--user",
            "victim-corp-com-7b46e3848256709a",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--user") && stderr.contains("storage bucket derived from another user id"),
        "{stderr}"
    );
}
