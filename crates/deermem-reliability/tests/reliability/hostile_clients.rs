//! Hostile clients against the real `deermem` binary: `serve` holding 2,000 stalled
//! connections (half silent, half trickling a request head that never ends) still answers a
//! normal client quickly, and SIGTERM with those connections open ends the process within the
//! drain deadline with every turn it accepted (202) committed to storage; `mcp --bind` stops
//! on SIGTERM whatever its stalled clients do, and answers malformed heads with JSON-RPC.

use deermem_core::ports::MemoryManagerExt as _;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deermem_core::UserId;
use deermem_core::ports::MemoryScope;
use deermem_reliability::{figure, pick};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support;

/// The drain deadline the tests configure.
const DRAIN_SECONDS: u64 = 3;
/// What the exit may take beyond the drain deadline (process start-up of the flush, a loaded
/// 2-core machine): generous on purpose.
const EXIT_MARGIN: Duration = Duration::from_secs(20);

/// The `deermem` binary next to this test's executable (`cargo test --workspace` builds it).
fn deermem_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("deermem"))
        .expect("target directory");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build -p deermem-cli), or run the workspace's tests",
        bin.display()
    );
    bin
}

/// Raises this process's soft descriptor limit (children inherit it) to at least `want`,
/// as far as the hard limit allows; returns the soft limit in force.
fn raise_nofile(want: u64) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let cur = getrlimit(Resource::Nofile);
    let soft = cur.current.unwrap_or(u64::MAX);
    if soft >= want {
        return soft;
    }
    let target = cur.maximum.map_or(want, |hard| hard.min(want));
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: cur.maximum,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// A running `deermem` server and the address it printed.
struct Running {
    child: Child,
    addr: String,
    stderr: std::thread::JoinHandle<Vec<String>>,
}

fn start(root: &Path, config: &Path, args: &[&str]) -> Running {
    let mut child = Command::new(deermem_bin())
        .env_remove("DEERMEM_CONFIG")
        .env_remove("DEERMEM_DATA_DIR")
        .env_remove("DEER_FLOW_HOME")
        .env("DEERMEM_LOG", "info")
        .arg("--storage-path")
        .arg(root)
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("deermem starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let started = Instant::now();
    let addr = loop {
        let line = lines
            .next()
            .expect("the server printed its address")
            .expect("stderr line");
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.split('/').next().unwrap_or_default().to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the server did not start"
        );
    };
    // Keep reading so the child never blocks on a full pipe; the lines explain failures.
    let stderr = std::thread::spawn(move || lines.map_while(Result::ok).collect());
    Running {
        child,
        addr,
        stderr,
    }
}

impl Running {
    /// Sends SIGTERM and waits for the exit; returns the time it took and the exit status.
    fn terminate(mut self, limit: Duration) -> (Duration, std::process::ExitStatus, Vec<String>) {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
            .expect("pid");
        let sent = Instant::now();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let took = sent.elapsed();
                let log = self.stderr.join().unwrap_or_default();
                return (took, status, log);
            }
            if sent.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let log = self.stderr.join().unwrap_or_default();
                panic!(
                    "still running {limit:?} after SIGTERM; log:\n{}",
                    log.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn write_config(dir: &Path, extra_gateway: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!(
            "memory:\n  backend_config:\n    debounce_seconds: 300\ngateway:\n{extra_gateway}  server:\n    header_read_timeout_seconds: 120\n    keep_alive_timeout_seconds: 120\n    drain_timeout_seconds: {DRAIN_SECONDS}\n"
        ),
    )
    .expect("config written");
    path
}

/// Opens `n` connections that never complete a request: half send nothing (returned first),
/// half a request line and part of a header (returned second).
async fn open_stalled(addr: &str, n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let (mut silent, mut partial) = (Vec::new(), Vec::new());
    for batch in (0..n).collect::<Vec<_>>().chunks(100) {
        let mut set = tokio::task::JoinSet::new();
        for &i in batch {
            let addr = addr.to_owned();
            set.spawn(async move {
                let mut s = TcpStream::connect(&addr).await.expect("connect");
                if i % 2 == 1 {
                    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                        .await
                        .expect("write");
                }
                (i % 2 == 1, s)
            });
        }
        while let Some(r) = set.join_next().await {
            match r.expect("connect task") {
                (true, s) => partial.push(s),
                (false, s) => silent.push(s),
            }
        }
    }
    (silent, partial)
}

/// Whether the server closed `s` (EOF or reset) within `wait`.
async fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(wait, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_holds_two_thousand_stalled_connections_and_stops_on_sigterm_with_turns_flushed() {
    let stalled_n: usize = 2000;
    let soft = raise_nofile(8192);
    assert!(
        soft >= 2 * stalled_n as u64 + 512,
        "the descriptor limit ({soft}) is too low for this test; raise the hard limit (ulimit -Hn)"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    let config = write_config(tmp.path(), "");
    let server = start(&root, &config, &["serve", "--bind", "127.0.0.1:0"]);
    let addr = server.addr.clone();
    let (mut stalled, mut trickling) = open_stalled(&addr, stalled_n).await;
    // The partial heads keep trickling a byte of their never-ending header now and then.
    let trickle = tokio::spawn(async move {
        loop {
            for s in &mut trickling {
                let _ = s.write_all(b"a").await;
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    });
    // A normal client meanwhile: reads and turns, each timed.
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    let requests: usize = pick(200, 1000);
    let turns = 40usize;
    let mut latencies = Vec::with_capacity(requests);
    let mut accepted = Vec::new();
    for i in 0..requests {
        let t = Instant::now();
        let status = if i % (requests / turns) == 0 && accepted.len() < turns {
            let n = accepted.len();
            let body = serde_json::json!({
                "thread_id": format!("thread-{n}"),
                "messages": [
                    {"role": "user", "content": format!("I prefer green tea blend number {n}.")},
                    {"role": "assistant", "content": "Noted!"}
                ]
            });
            let r = http
                .post(format!("{base}/api/memory/messages"))
                .json(&body)
                .send()
                .await
                .expect("turn answered");
            let status = r.status().as_u16();
            if status == 202 {
                accepted.push(n);
            }
            status
        } else if i % 2 == 0 {
            http.get(format!("{base}/healthz"))
                .send()
                .await
                .expect("healthz answered")
                .status()
                .as_u16()
        } else {
            http.get(format!("{base}/api/memory"))
                .send()
                .await
                .expect("memory answered")
                .status()
                .as_u16()
        };
        latencies.push(t.elapsed());
        assert!(matches!(status, 200 | 202), "request {i}: status {status}");
    }
    assert_eq!(accepted.len(), turns, "every turn was accepted with 202");
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    let p99 = latencies[(latencies.len() * 99).div_ceil(100) - 1];
    let max = latencies[latencies.len() - 1];
    // None of the accepted turns is committed yet (debounce 300 s): the shutdown commits them.
    let before: serde_json::Value = http
        .get(format!("{base}/api/memory"))
        .send()
        .await
        .expect("memory answered")
        .json()
        .await
        .expect("json");
    let before_n = before["facts"].as_array().map_or(0, Vec::len);
    // Every stalled connection is still open (the head timeout is 120 s).
    let mut probe = TcpStream::connect(&addr).await.expect("connect");
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .expect("write");
    assert!(
        !closed_within(&mut probe, Duration::from_millis(200)).await,
        "a stalled connection stays open until its head timeout"
    );
    let limit = Duration::from_secs(DRAIN_SECONDS) + EXIT_MARGIN;
    let (took, status, log) = tokio::task::spawn_blocking(move || server.terminate(limit))
        .await
        .expect("terminate");
    assert!(
        status.success(),
        "exit {status:?}; log:\n{}",
        log.join("\n")
    );
    assert!(
        took <= limit,
        "exit took {took:?}; log:\n{}",
        log.join("\n")
    );
    let mut cut = 0usize;
    for s in stalled.iter_mut().take(50) {
        if closed_within(s, Duration::from_secs(5)).await {
            cut += 1;
        }
    }
    assert_eq!(cut, 50, "stalled connections are closed at shutdown");
    trickle.abort();
    // Every accepted turn is in storage.
    let manager = support::manager(&root);
    let doc = manager
        .get_memory(MemoryScope::user(UserId::default_user()))
        .await
        .expect("memory reads");
    let contents: Vec<String> = doc.facts.iter().map(|f| f.content.clone()).collect();
    for n in &accepted {
        let needle = format!("number {n}");
        assert!(
            contents
                .iter()
                .any(|c| c.contains(&needle) && c.contains("green tea")),
            "turn {n} accepted with 202 is not in storage; facts: {contents:?}; log:\n{}",
            log.join("\n")
        );
    }
    manager.close().await;
    assert!(
        p99 < Duration::from_millis(100),
        "p99 {p99:?} under {stalled_n} stalled connections"
    );
    let test = "hostile_clients_serve";
    figure(test, "stalled_connections", stalled_n);
    figure(test, "requests", requests);
    figure(test, "p50_ms", format!("{:.2}", p50.as_secs_f64() * 1000.0));
    figure(test, "p99_ms", format!("{:.2}", p99.as_secs_f64() * 1000.0));
    figure(test, "max_ms", format!("{:.2}", max.as_secs_f64() * 1000.0));
    figure(test, "turns_accepted", accepted.len());
    figure(test, "facts_before_sigterm", before_n);
    figure(test, "facts_after_exit", contents.len());
    figure(test, "drain_deadline_s", DRAIN_SECONDS);
    figure(test, "exit_after_sigterm_ms", took.as_millis());
    let drained = log
        .iter()
        .find(|l| l.contains("connections drained"))
        .cloned()
        .unwrap_or_default();
    figure(test, "drain_log", drained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_bind_stops_on_sigterm_with_stalled_connections() {
    raise_nofile(1024);
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    let config = write_config(
        tmp.path(),
        "  auth:\n    mode: token\n    tokens: {tok-alice-0123456789: alice}\n",
    );
    let server = start(&root, &config, &["mcp", "--bind", "127.0.0.1:0"]);
    let addr = server.addr.clone();
    let (mut stalled, partial) = open_stalled(&addr, 100).await;
    stalled.extend(partial);
    // A body that stops short of its length.
    let mut short = TcpStream::connect(&addr).await.expect("connect");
    short
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok-alice-0123456789\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: 500\r\n\r\n{\"jsonrpc\"")
        .await
        .expect("write");
    // A head over the limit is refused.
    let mut bad = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
        "b".repeat(100_000)
    );
    let _ = bad.write_all(head.as_bytes()).await;
    let mut resp = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), bad.read_to_end(&mut resp))
        .await
        .expect("answered")
        .ok();
    let resp = String::from_utf8_lossy(&resp);
    // hyper's own bare 431 (docs/compat.md: the connection layer no longer parses heads).
    assert!(resp.starts_with("HTTP/1.1 431"), "{resp:.300}");
    let limit = Duration::from_secs(DRAIN_SECONDS) + EXIT_MARGIN;
    let (took, status, log) = tokio::task::spawn_blocking(move || server.terminate(limit))
        .await
        .expect("terminate");
    assert!(
        status.success(),
        "exit {status:?}; log:\n{}",
        log.join("\n")
    );
    for s in stalled.iter_mut().take(20) {
        assert!(closed_within(s, Duration::from_secs(5)).await);
    }
    assert!(closed_within(&mut short, Duration::from_secs(5)).await);
    let test = "hostile_clients_mcp";
    figure(test, "stalled_connections", 102);
    figure(test, "exit_after_sigterm_ms", took.as_millis());
}
