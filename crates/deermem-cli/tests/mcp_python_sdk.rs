//! `deermem mcp` driven by a real MCP client: the official Python SDK (`mcp` from PyPI, in a
//! cached virtual environment), over stdio (the SDK spawns this binary) and over streamable
//! HTTP. The client script, `crates/deermem-mcp/tests/python/mcp_sdk_client.py`, checks every
//! protocol version the SDK negotiates, tool calls, JSON-RPC errors, a lone surrogate,
//! concurrent calls and (over HTTP) two users at once; see its docstring.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use deermem_testkit::pyenv::{self, PyEnv};

/// The SDK release the script is written against.
const MCP_SDK: &str = "mcp==2.3.0";

/// The raw id both transports act for (a mixed-case email: its bucket name differs).
const USER: &str = "Mail.User@example.com";

fn sdk() -> PyEnv {
    pyenv::require("mcp-sdk-2.3.0", &[MCP_SDK])
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deermem-mcp/tests/python/mcp_sdk_client.py")
}

fn deermem() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deermem"));
    c.env_remove("DEERMEM_CONFIG")
        .env_remove("DEERMEM_DATA_DIR")
        .env_remove("DEER_FLOW_HOME")
        .env("DEERMEM_LOG", "error");
    c
}

fn assert_held(what: &str, out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks held"),
        "the MCP Python SDK client over {what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

#[test]
fn the_python_sdk_drives_the_server_over_stdio() {
    let env = sdk();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env.python())
        .arg(script())
        .args(["stdio", "--deermem", env!("CARGO_BIN_EXE_deermem")])
        .arg("--root")
        .arg(dir.path())
        .args(["--user", USER])
        .output()
        .expect("run the SDK client");
    assert_held("stdio", &out);
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_python_sdk_drives_the_server_over_http() {
    let env = sdk();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!("gateway:\n  auth:\n    mode: token\n    tokens:\n      tok-mail: {USER}\n      tok-bob: bob\n"),
    )
    .unwrap();
    let mut child = deermem()
        .arg("--config")
        .arg(&config)
        .arg("--storage-path")
        .arg(dir.path().join("root"))
        .args(["mcp", "--bind", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(stderr).lines();
    let started = Instant::now();
    let url = loop {
        let line = lines.next().expect("mcp printed its address").unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            break format!("http://{}", rest.split_whitespace().next().unwrap());
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "mcp did not start"
        );
    };
    let out = Command::new(env.python())
        .arg(script())
        .args(["http", "--url", &url, "--token", "tok-mail"])
        .args(["--other-token", "tok-bob", "--user", USER])
        .output()
        .expect("run the SDK client");
    drop(server);
    assert_held("streamable HTTP", &out);
}
