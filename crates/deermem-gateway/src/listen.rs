//! The connection layer both HTTP servers use (`deermem serve` and `deermem mcp --bind`):
//! hyper's HTTP/1 connections (its parser, its head-size, header-count and head-read limits,
//! keep-alive), a process-wide connection cap kept below the descriptor limit, and
//! hyper-util's graceful shutdown bounded by a drain deadline.
//!
//! Accepting never stalls on the cap: a connection beyond it is answered 503 (a JSON body,
//! `Retry-After: 1`) and closed at once. An accept error such as `EMFILE` is logged (at most
//! once a second) and retried after a short back-off (10 ms doubling to 1 s) rather than in a
//! tight loop. When the shutdown future completes the listener is closed, idle connections are
//! closed, in-flight requests finish on theirs, and whatever is still open after
//! `drain_timeout` (a stalled head or body included) is closed.
//!
//! A head that hyper refuses is answered with hyper's own bare status (400, or 431 for a head
//! over [`MAX_HEAD_BYTES`] or with more than [`MAX_HEADERS`] headers) and the connection closed.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::config::ServerConfig;

/// The largest request head hyper reads (request line and headers), in bytes; a larger one
/// gets 431.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most header fields a request may carry; more get 431.
pub const MAX_HEADERS: usize = 100;

/// Renders the JSON body of an error answered by the connection layer, from its message.
pub type ErrorBody = Arc<dyn Fn(&str) -> Vec<u8> + Send + Sync>;

/// The gateway's error body: `{"detail": "<message>"}`.
pub fn detail_body() -> ErrorBody {
    Arc::new(|message: &str| {
        serde_json::to_vec(&serde_json::json!({ "detail": message })).unwrap_or_default()
    })
}

/// What the connection layer is told.
#[derive(Clone)]
pub struct ServeOptions {
    /// Timeouts, the connection cap and the drain deadline.
    pub server: ServerConfig,
    /// The body of the 503 the connection layer answers beyond the cap.
    pub error_body: ErrorBody,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl ServeOptions {
    /// Options with the gateway's `{"detail": ...}` error body.
    pub fn new(server: ServerConfig) -> Self {
        Self {
            server,
            error_body: detail_body(),
        }
    }
}

/// How serving ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Connections open when shutdown began.
    pub open_at_shutdown: usize,
    /// Connections still open at the drain deadline, closed then.
    pub closed_at_deadline: usize,
}

/// Descriptors kept free for everything but connections (storage files, the index, logs):
/// at least this many, and at least a tenth of the limit.
pub const MIN_DESCRIPTOR_HEADROOM: u64 = 64;

/// The connection cap in force: `configured`, lowered to leave head-room below the process's
/// soft `RLIMIT_NOFILE` (at least [`MIN_DESCRIPTOR_HEADROOM`] descriptors and a tenth of the
/// limit stay free).
pub fn effective_max_connections(configured: usize) -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    cap_below(configured, limit)
}

fn cap_below(configured: usize, limit: Option<u64>) -> usize {
    let Some(limit) = limit else {
        return configured;
    };
    let headroom = MIN_DESCRIPTOR_HEADROOM.max(limit / 10);
    let room = if limit > 2 * headroom {
        limit - headroom
    } else {
        (limit / 2).max(1)
    };
    configured.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// How long hyper waits for a request head: it times the wait from the moment it starts
/// reading one, which on a kept-alive connection includes the idle time before it, so the
/// shorter of the two settings applies.
fn head_wait(server: &ServerConfig) -> Duration {
    server.header_read_timeout.min(server.keep_alive_timeout)
}

const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
const WARN_EVERY: Duration = Duration::from_secs(1);

/// Errors of `accept` that concern one connection the peer already gave up, not the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves `app` on `listener` until `shutdown` completes, then drains (see the module docs).
///
/// # Errors
/// None at present: accept errors are retried; the signature leaves room for listener
/// failures that cannot be.
pub async fn serve_app<F>(
    listener: TcpListener,
    app: Router,
    options: ServeOptions,
    shutdown: F,
) -> io::Result<DrainReport>
where
    F: Future<Output = ()> + Send,
{
    let cap = effective_max_connections(options.server.max_connections);
    if cap < options.server.max_connections {
        tracing::info!(
            configured = options.server.max_connections,
            cap,
            "connection cap lowered below the descriptor limit (raise it with LimitNOFILE or ulimit -n)"
        );
    }
    let permits = Arc::new(Semaphore::new(cap));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(head_wait(&options.server))
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        .keep_alive(true);
    let service =
        TowerToHyperService::new(app.map_request(|req: Request<Incoming>| req.map(Body::new)));
    let graceful = GracefulShutdown::new();
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut backoff = MIN_BACKOFF;
    let mut last_warn: Option<Instant> = None;
    let mut refused_since_warn = 0u64;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, _peer)) => {
                    backoff = MIN_BACKOFF;
                    let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                        refuse_over_cap(&tcp, cap, &options.error_body);
                        refused_since_warn += 1;
                        if last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                            tracing::warn!(
                                cap,
                                refused = refused_since_warn,
                                "connection cap reached: refusing connections"
                            );
                            last_warn = Some(Instant::now());
                            refused_since_warn = 0;
                        }
                        continue;
                    };
                    // Responses go out as soon as they are written: with Nagle's algorithm a
                    // response split over segments can wait for the client's delayed ACK.
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
                    }
                    let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), service.clone()));
                    tasks.spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        drop(permit);
                    });
                }
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    if last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "accept failed");
                        last_warn = Some(Instant::now());
                    }
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            },
        }
    }
    drop(listener);
    let open = tasks.len();
    tracing::info!(
        connections = open,
        deadline_seconds = options.server.drain_timeout.as_secs_f64(),
        "stopped accepting; draining connections"
    );
    let mut report = DrainReport {
        open_at_shutdown: open,
        closed_at_deadline: 0,
    };
    let drained = async {
        graceful.shutdown().await;
        while tasks.join_next().await.is_some() {}
    };
    if tokio::time::timeout(options.server.drain_timeout, drained)
        .await
        .is_err()
    {
        report.closed_at_deadline = tasks.len();
        tracing::warn!(
            connections = tasks.len(),
            "drain deadline reached: closing the connections still open"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    Ok(report)
}

/// Answers a connection beyond the cap with 503 if the socket takes it at once, never waiting.
fn refuse_over_cap(tcp: &TcpStream, cap: usize, error_body: &ErrorBody) {
    let body = error_body(&format!(
        "the server is at its limit of {cap} connections; retry shortly"
    ));
    let mut bytes = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(&body);
    // A fresh socket's send buffer takes this whole; if not, the client just sees the close.
    let _ = tcp.try_write(&bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_head_room_below_the_descriptor_limit() {
        assert_eq!(cap_below(4096, Some(1024)), 1024 - 102);
        assert_eq!(cap_below(4096, Some(20_000)), 4096);
        assert_eq!(cap_below(100, Some(1024)), 100);
        assert_eq!(cap_below(4096, Some(256)), 256 - 64);
        assert_eq!(cap_below(4096, Some(100)), 50);
        assert_eq!(cap_below(4096, Some(1)), 1);
        assert_eq!(cap_below(4096, None), 4096);
    }

    #[test]
    fn the_detail_body_is_json() {
        let body = detail_body()("bad \"head\"");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["detail"], "bad \"head\"");
    }
}
