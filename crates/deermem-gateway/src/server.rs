//! Serving the router on a listener through the connection layer ([`crate::listen`]), with the
//! start-up warm-up in the background and a shutdown that always ends: at the signal the
//! memory flush starts at once, in parallel with the connection drain (bounded by
//! `gateway.server.drain_timeout_seconds`); once both are done the manager is closed.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::listen::{ServeOptions, serve_app};
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
/// wait for the warm-up). Connections are served by [`crate::listen::serve_app`] with
/// `gateway.server`'s timeouts and cap. When `shutdown` completes, two things start together:
/// the connection drain (no new connections, in-flight requests finish, whatever is open after
/// `gateway.server.drain_timeout_seconds` is closed) and, when memory is enabled, the flush
/// (`manager.shutdown_flush(memory.shutdown_flush_timeout_seconds)`, after waiting at most
/// [`WARM_SHUTDOWN_WAIT`] for the warm-up), so every turn accepted before the signal is
/// committed whatever the clients do. After the drain a second flush, within what is left of
/// the budget, takes the turns that requests finishing during the drain queued. Finally
/// `manager.close()` (skipped, with a warning, while the warm-up still runs).
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
        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
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
    let (signalled_tx, mut signalled_rx) = watch::channel(false);
    let draining = state.clone();
    let signal = async move {
        shutdown.await;
        draining.mark_stopping();
        tracing::info!(
            "shutting down: no new connections; flushing memory while connections drain"
        );
        let _ = signalled_tx.send(true);
    };
    let options = ServeOptions::new(state.gateway_config().server);
    let flushing = state.clone();
    let flush = async move {
        if signalled_rx.wait_for(|s| *s).await.is_err() {
            return None;
        }
        Some(flush(&flushing, warm).await)
    };
    let (served, flushed) = tokio::join!(serve_app(listener, app, options, signal), flush);
    state.mark_stopping();
    let warm_running = match flushed {
        Some((warm_running, deadline)) => {
            // Turns queued by requests that finished during the drain.
            let left = deadline.and_then(|d| d.checked_duration_since(Instant::now()));
            if let Some(left) = left.filter(|left| !left.is_zero()) {
                flush_once(&state, left).await;
            }
            warm_running
        }
        None => false,
    };
    close(&state, warm_running).await;
    served.map(|report| {
        tracing::info!(
            open_at_shutdown = report.open_at_shutdown,
            closed_at_deadline = report.closed_at_deadline,
            "connections drained"
        );
    })
}

/// The shutdown flush: bounded warm-up wait, then the flush within its budget. Answers whether
/// the warm-up still runs, and the flush budget's deadline (none when memory is disabled).
async fn flush(
    state: &GatewayState,
    warm: Option<JoinHandle<Option<bool>>>,
) -> (bool, Option<Instant>) {
    let mut warm_running = false;
    if let Some(mut handle) = warm
        && tokio::time::timeout(WARM_SHUTDOWN_WAIT, &mut handle)
            .await
            .is_err()
    {
        warm_running = true;
        tracing::warn!("memory warm-up still running at shutdown; not waiting for it");
    }
    if !state.memory_config().enabled {
        return (warm_running, None);
    }
    let budget = Duration::from_secs_f64(state.memory_config().shutdown_flush_timeout_seconds);
    let deadline = Instant::now() + budget;
    flush_once(state, budget).await;
    (warm_running, Some(deadline))
}

/// One `shutdown_flush` within `budget` (plus [`FLUSH_GRACE`] for a backend that ignores it).
async fn flush_once(state: &GatewayState, budget: Duration) {
    let manager = state.manager();
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

/// Closes the manager unless its warm-up or an index rebuild still runs.
async fn close(state: &GatewayState, warm_running: bool) {
    if warm_running || state.rebuild_running() {
        tracing::warn!("not closing the memory backend: its warm-up is still running");
    } else {
        state.manager().close().await;
        tracing::info!("memory backend closed");
    }
}
