//! `storage_class: postgres` while the database is down, through the `deermem` binary against
//! a throwaway cluster that the test stops and starts again: `deermem serve` answers 503 with
//! `Retry-After` and a JSON `detail`, `/readyz` is not ready, and every data command exits 8
//! ("unavailable"); once the database is back the same server is ready and serves again,
//! without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use deermem_testkit::pgcluster::PgCluster;
use serde_json::Value;

fn write_config(dir: &Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!(
            "memory:\n  backend_config:\n    storage_class: postgres\n    postgres:\n      url: {url}\n      schema: outage\n      pool_size: 2\n      connect_timeout_seconds: 1\n"
        ),
    )
    .unwrap();
    path
}

fn deermem(config: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deermem"));
    c.env_remove("DEERMEM_CONFIG")
        .env_remove("DEERMEM_DATA_DIR")
        .env_remove("DEER_FLOW_HOME")
        .env("DEERMEM_LOG", "error")
        .arg("--config")
        .arg(config);
    c
}

fn run(config: &Path, args: &[&str]) -> Output {
    deermem(config).args(args).output().expect("run deermem")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A `deermem serve` process, killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(config: &Path) -> Self {
        let mut child = deermem(config)
            .args(["serve", "--bind", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start deermem serve");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("deermem serve stopped before serving")
                .unwrap();
            if let Some(rest) = line.split("http://").nth(1) {
                break rest.split('/').next().unwrap().to_owned();
            }
        };
        // Keep draining its log so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self { child, addr }
    }

    /// One HTTP/1.1 exchange: the status, the headers (lowercase names) and the body as JSON.
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, Vec<(String, String)>, Value) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let mut head_lines = head.lines();
        let status: u16 = head_lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = head_lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let json = serde_json::from_str(body).unwrap_or(Value::String(body.to_owned()));
        (status, headers, json)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn with_the_database_down_the_server_answers_503_and_every_command_exits_8() {
    let cluster = PgCluster::start_fresh().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), cluster.url());
    let out = run(
        &config,
        &["facts", "add", "--user", "u", "--content", "kept"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let server = Server::start(&config);
    assert_eq!(server.request("GET", "/readyz", "").0, 200);

    cluster.stop().unwrap_or_else(|e| panic!("{e}"));
    let create = r#"{"content": "while down", "category": "context", "confidence": 0.9}"#;
    for (method, path, body) in [
        ("GET", "/api/memory", ""),
        ("POST", "/api/memory/facts", create),
        ("GET", "/api/memory/search?q=kept", ""),
    ] {
        let (status, headers, json) = server.request(method, path, body);
        assert_eq!(status, 503, "{method} {path}: {json}");
        assert!(
            header(&headers, "retry-after").is_some_and(|v| v.parse::<u64>().is_ok()),
            "{method} {path}: {headers:?}"
        );
        assert!(json["detail"].is_string(), "{method} {path}: {json}");
    }
    let (status, _, json) = server.request("GET", "/readyz", "");
    assert_eq!(
        (status, json["status"].as_str()),
        (503, Some("unavailable")),
        "{json}"
    );

    let commands: &[&[&str]] = &[
        &["facts", "list", "--user", "u"],
        &["facts", "add", "--user", "u", "--content", "while down"],
        &["export", "--user", "u"],
        &["search", "--user", "u", "kept"],
        &["context", "--user", "u"],
        &["db", "migrate"],
        &["db", "migrate", "--status"],
    ];
    for args in commands {
        let out = run(&config, args);
        assert_eq!(
            out.status.code(),
            Some(8),
            "deermem {args:?}: {}",
            text(&out)
        );
        let shown = text(&out);
        assert!(shown.contains("unavailable"), "deermem {args:?}: {shown}");
    }

    cluster.start_again().unwrap_or_else(|e| panic!("{e}"));
    let mut ready = 0;
    for _ in 0..100 {
        ready = server.request("GET", "/readyz", "").0;
        if ready == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(ready, 200, "ready again once the database is back");
    let (status, _, json) = server.request("GET", "/api/memory", "");
    assert_eq!(status, 200, "{json}");
    let out = run(&config, &["facts", "list", "--user", "u"]);
    assert!(out.status.success(), "{}", text(&out));
}
