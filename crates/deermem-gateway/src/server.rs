//! Serving the router on a listener, with the start-up warm-up in the background and a
//! graceful shutdown: stop accepting, finish in-flight requests, then flush the manager's
//! pending work within `memory.shutdown_flush_timeout_seconds` and close it.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::serve::ListenerExt as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::state::{GatewayState, spawn_warm};

/// How long shutdown waits for a still-running warm-up before flushing (the flush budget is
/// not reduced by it).
pub const WARM_SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

/// Extra time granted beyond the flush budget before shutdown stops waiting for a backend that
/// ignores its own timeout.
pub const FLUSH_GRACE: Duration = Duration::from_secs(5);

/// Serves the gateway on `listener` until `shutdown` completes, then drains.
///
/// Before serving it refuses a non-loopback address in unauthenticated mode (unless
/// `gateway.auth.allow_unauthenticated_remote` is set), starts the manager's `warm()` in the
/// background when memory is enabled, and marks the gateway ready at once (readiness does not
/// wait for the warm-up). When `shutdown` completes it stops accepting connections, lets
/// in-flight requests finish (each is bounded by the request timeout), waits at most
/// [`WARM_SHUTDOWN_WAIT`] for the warm-up, calls
/// `manager.shutdown_flush(memory.shutdown_flush_timeout_seconds)` when memory is enabled,
/// and finally `manager.close()` (skipped, with a warning, while the warm-up still runs).
///
/// # Errors
/// `PermissionDenied` for a refused address; any I/O error of the listener.
pub async fn serve<F>(listener: TcpListener, state: GatewayState, shutdown: F) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr()?;
    state
        .gateway_config()
        .check_bind_allowed(&addr)
        .map_err(|m| io::Error::new(io::ErrorKind::PermissionDenied, m))?;
    let warm = if state.memory_config().enabled {
        spawn_warm(&state)
    } else {
        None
    };
    let app = crate::router(state.clone());
    state.mark_ready();
    tracing::info!(
        %addr,
        auth = state.gateway_config().auth.mode.as_str(),
        backend = state.manager().name(),
        "deermem gateway listening"
    );
    let draining = state.clone();
    // Responses go out as soon as they are written: with Nagle's algorithm a response split
    // over several segments can wait for the client's delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
    });
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            draining.mark_stopping();
            tracing::info!("shutting down: no new connections, finishing in-flight requests");
        })
        .await;
    state.mark_stopping();
    drain(&state, warm).await;
    result
}

/// The shutdown sequence after the last request: bounded warm-up wait, flush, close.
async fn drain(state: &GatewayState, warm: Option<JoinHandle<Option<bool>>>) {
    let mut warm_running = false;
    if let Some(mut handle) = warm
        && tokio::time::timeout(WARM_SHUTDOWN_WAIT, &mut handle)
            .await
            .is_err()
    {
        warm_running = true;
        tracing::warn!("memory warm-up still running at shutdown; not waiting for it");
    }
    let manager = state.manager();
    if state.memory_config().enabled {
        let budget = Duration::from_secs_f64(state.memory_config().shutdown_flush_timeout_seconds);
        match tokio::time::timeout(budget + FLUSH_GRACE, manager.shutdown_flush(budget)).await {
            Ok(true) => tracing::info!("memory flushed"),
            Ok(false) => tracing::warn!(
                timeout_seconds = budget.as_secs_f64(),
                "memory flush did not finish in time; pending updates may be lost"
            ),
            Err(_) => tracing::warn!(
                timeout_seconds = budget.as_secs_f64(),
                "memory backend ignored its flush timeout; giving up"
            ),
        }
    }
    if warm_running || state.rebuild_running() {
        tracing::warn!("not closing the memory backend: its warm-up is still running");
    } else {
        manager.close().await;
        tracing::info!("memory backend closed");
    }
}
