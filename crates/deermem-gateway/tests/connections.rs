//! The connection layer on a real loopback listener, over raw TCP: hyper's statuses for heads
//! it refuses (400, 431), the header-read and keep-alive timeouts, the
//! connection cap, request framing across keep-alive requests, and a shutdown that starts the
//! flush at the signal and ends by the drain deadline whatever the clients do.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Call, FakeManager};
use deermem_core::MemoryConfig;
use deermem_gateway::{GatewayConfig, GatewayState, ServerConfig, serve};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Generous bound for anything the server should do at once or after a sub-second timeout.
const PATIENCE: Duration = Duration::from_secs(20);

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(m: std::sync::Arc<FakeManager>, server: ServerConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cfg = GatewayConfig {
            server,
            ..GatewayConfig::default()
        };
        let state = GatewayState::new(m, MemoryConfig::default(), cfg);
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, state, async move {
            let _ = stop_rx.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the server stops")
            .expect("server task")
            .expect("serve");
    }
}

fn quick() -> ServerConfig {
    ServerConfig {
        header_read_timeout: Duration::from_secs(30),
        keep_alive_timeout: Duration::from_secs(30),
        max_connections: 1000,
        drain_timeout: Duration::from_secs(1),
    }
}

/// Everything the server sends until it closes the connection.
async fn read_all(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut buf))
        .await
        .expect("the server closes the connection")
        .ok();
    String::from_utf8_lossy(&buf).into_owned()
}

/// Sends `bytes` (errors ignored: the server may close before reading all) and reads to EOF.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let _ = s.write_all(bytes).await;
    read_all(&mut s).await
}

fn status_of(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The status and the JSON body of a single response.
fn json_response(resp: &str) -> (u16, Value) {
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((resp, ""));
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    (status_of(resp), v)
}

/// Heads hyper refuses get its own bare status and the connection is closed (see
/// docs/compat.md: these answers had JSON bodies while the gateway parsed heads itself).
#[tokio::test]
async fn malformed_heads_get_hyper_statuses() {
    let m = FakeManager::new();
    let srv = Server::start(m, quick()).await;
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "b".repeat(500_000)
            )
            .into_bytes(),
            431,
        ),
        (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            431,
        ),
        (
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "b".repeat(70_000)
            )
            .into_bytes(),
            431,
        ),
        (
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n").into_bytes(),
            431,
        ),
        (b"GET /healthz HTTP/1.1\r\nBad Header\r\n\r\n".to_vec(), 400),
        (b"GE(T /healthz HTTP/1.1\r\n\r\n".to_vec(), 400),
        (b"GET /healthz HTTP/9.9\r\n\r\n".to_vec(), 400),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
            400,
        ),
        (
            b"POST /healthz HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n".to_vec(),
            400,
        ),
    ];
    for (bytes, want) in cases {
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned();
        let resp = exchange(srv.addr, &bytes).await;
        assert_eq!(status_of(&resp), want, "{shown:?}: {resp:.300}");
    }
    // A long URI within the head limit is an ordinary request (the router's JSON 404).
    let long = format!(
        "GET /{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "a".repeat(20_000)
    );
    let (status, body) = json_response(&exchange(srv.addr, long.as_bytes()).await);
    assert_eq!(status, 404);
    assert_eq!(body["detail"], "Not Found");
    srv.stop().await;
}

#[tokio::test]
async fn keep_alive_requests_after_bodies_are_framed_correctly() {
    let m = FakeManager::new();
    let srv = Server::start(m, quick()).await;
    // A sized body, a chunked body with a trailer, then a last request: three answers.
    let req = b"POST /api/memory/facts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"content\":\"a\"}\
POST /api/memory/facts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"con\r\na;x=1\r\ntent\":\"b\"}\r\n0\r\nX-T: 1\r\n\r\n\
GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let resp = exchange(srv.addr, req).await;
    let statuses: Vec<u16> = resp
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| status_of(&resp[i..]))
        .collect();
    assert_eq!(statuses, vec![200, 200, 200], "{resp}");
    assert!(resp.ends_with("{\"status\":\"ok\"}"), "{resp}");
    // The same, written a byte at a time.
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    for b in req.iter() {
        s.write_all(std::slice::from_ref(b)).await.expect("write");
    }
    let resp = read_all(&mut s).await;
    // The same facts again: both bodies were read whole, so both are duplicates now.
    assert_eq!(resp.matches("HTTP/1.1 409").count(), 2, "{resp}");
    assert!(resp.ends_with("{\"status\":\"ok\"}"), "{resp}");
    srv.stop().await;
}

/// A head that does not arrive in time closes the connection, partial or not (hyper answers
/// no 408; see docs/compat.md).
#[tokio::test]
async fn a_partial_head_and_a_silent_connection_are_closed() {
    let m = FakeManager::new();
    let srv = Server::start(
        m,
        ServerConfig {
            header_read_timeout: Duration::from_millis(300),
            ..quick()
        },
    )
    .await;
    let resp = exchange(srv.addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
    assert_eq!(resp, "", "closed without an answer");
    let mut silent = TcpStream::connect(srv.addr).await.expect("connect");
    assert_eq!(read_all(&mut silent).await, "", "closed without an answer");
    srv.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_a_slow_request_is_not() {
    let m = FakeManager::new();
    let srv = Server::start(
        m.clone(),
        ServerConfig {
            keep_alive_timeout: Duration::from_millis(300),
            ..quick()
        },
    )
    .await;
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    // A request that takes longer than the idle timeout is answered, on a kept-alive
    // connection that then idles out.
    let gate = m.pause("get_memory");
    s.write_all(b"GET /api/memory HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    tokio::time::timeout(PATIENCE, gate.entered.notified())
        .await
        .expect("the request reached the manager");
    tokio::time::sleep(Duration::from_millis(900)).await;
    gate.open();
    let resp = read_all(&mut s).await;
    assert_eq!(status_of(&resp), 200, "{resp}");
    assert_eq!(resp.matches("HTTP/1.1 ").count(), 1, "{resp}");
    srv.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_cap_get_503_at_once() {
    let m = FakeManager::new();
    let srv = Server::start(
        m,
        ServerConfig {
            max_connections: 2,
            ..quick()
        },
    )
    .await;
    let held1 = TcpStream::connect(srv.addr).await.expect("connect");
    let _held2 = TcpStream::connect(srv.addr).await.expect("connect");
    // Both are accepted (and hold their permits) before the third arrives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resp = exchange(srv.addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let (status, body) = json_response(&resp);
    assert_eq!(status, 503, "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("retry-after: 1"),
        "{resp}"
    );
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("2 connections")),
        "{body}"
    );
    // A freed place is given to the next connection.
    drop(held1);
    let mut served = false;
    for _ in 0..100 {
        let resp = exchange(
            srv.addr,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        if status_of(&resp) == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "a closed connection frees its place");
    srv.stop().await;
}

#[tokio::test]
async fn shutdown_flushes_at_the_signal_and_closes_stalled_connections_at_the_deadline() {
    let m = FakeManager::new();
    let srv = Server::start(m.clone(), quick()).await;
    // Clients that never finish: partial heads, nothing at all, a body that stops short.
    let mut stalled = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(srv.addr).await.expect("connect");
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        stalled.push(s);
        stalled.push(TcpStream::connect(srv.addr).await.expect("connect"));
    }
    let mut short = TcpStream::connect(srv.addr).await.expect("connect");
    short
        .write_all(b"POST /api/memory/facts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"content\"")
        .await
        .expect("write");
    // And a request in flight.
    let gate = m.pause("get_memory");
    let mut inflight = TcpStream::connect(srv.addr).await.expect("connect");
    inflight
        .write_all(b"GET /api/memory HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    tokio::time::timeout(PATIENCE, gate.entered.notified())
        .await
        .expect("the request reached the manager");
    let Server { addr, stop, task } = srv;
    let _ = stop.expect("stop").send(());
    // The flush starts while the request is still running.
    let flush_started = async {
        loop {
            if m.calls()
                .iter()
                .any(|c| matches!(c, Call::ShutdownFlush(_)))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(PATIENCE, flush_started)
        .await
        .expect("the flush starts at the signal, before the drain ends");
    gate.open();
    let resp = read_all(&mut inflight).await;
    assert_eq!(
        status_of(&resp),
        200,
        "the in-flight request finishes: {resp}"
    );
    tokio::time::timeout(PATIENCE, task)
        .await
        .expect("the server stops although clients stall")
        .expect("server task")
        .expect("serve");
    for s in &mut stalled {
        assert_eq!(read_all(s).await, "", "a stalled client gets no answer");
    }
    let _ = read_all(&mut short).await;
    assert_eq!(m.calls().last(), Some(&Call::Close));
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[test]
fn the_server_section_is_parsed_and_validated() {
    let cfg = GatewayConfig::from_root(&serde_json::json!({"gateway": {"server": {
        "header_read_timeout_seconds": 2.5,
        "keep_alive_timeout_seconds": 7,
        "max_connections": 12,
        "drain_timeout_seconds": 0.5
    }}}))
    .expect("valid");
    assert_eq!(
        cfg.server,
        ServerConfig {
            header_read_timeout: Duration::from_millis(2500),
            keep_alive_timeout: Duration::from_secs(7),
            max_connections: 12,
            drain_timeout: Duration::from_millis(500),
        }
    );
    assert_eq!(
        GatewayConfig::from_root(&serde_json::json!({}))
            .expect("defaults")
            .server,
        ServerConfig::default()
    );
    for (bad, key) in [
        (
            serde_json::json!({"header_read_timeout_seconds": 0}),
            "gateway.server.header_read_timeout_seconds",
        ),
        (
            serde_json::json!({"keep_alive_timeout_seconds": "x"}),
            "gateway.server.keep_alive_timeout_seconds",
        ),
        (
            serde_json::json!({"drain_timeout_seconds": 4000}),
            "gateway.server.drain_timeout_seconds",
        ),
        (
            serde_json::json!({"max_connections": 0}),
            "gateway.server.max_connections",
        ),
        (
            serde_json::json!({"max_connections": 1.5}),
            "gateway.server.max_connections",
        ),
        (serde_json::json!({"max_conections": 5}), "gateway.server"),
        (serde_json::json!([1]), "gateway.server"),
    ] {
        let err = GatewayConfig::from_root(&serde_json::json!({"gateway": {"server": bad}}))
            .expect_err("invalid");
        assert_eq!(err.key, key, "{bad}: {err:?}");
    }
}
