//! `deermem serve` (the HTTP gateway) and `deermem mcp` (the memory tools over MCP).

use std::net::SocketAddr;
use std::sync::Arc;

use deermem_core::{AgentName, UserId};
use deermem_gateway::auth::constant_time_eq;
use deermem_gateway::{GatewayConfig, GatewayState, Metrics};
use deermem_updater::{ExtractionReport, UpdateObserver};

use crate::ctx::{self, Ctx};
use crate::error::CliError;

fn gateway_config(ctx: &Ctx) -> Result<GatewayConfig, CliError> {
    GatewayConfig::from_root_in(&ctx.loaded.root, ctx.config_dir.as_deref())
        .map_err(|e| CliError::invalid(e.to_string()))
}

/// Resolves when the process receives SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received: no new connections; draining");
}

/// A listener on `addr`, and the address it got.
async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), CliError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::failure(format!("cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::failure(e.to_string()))?;
    Ok((listener, local))
}

/// Feeds the embedded engine's extraction events into the gateway's Prometheus metrics.
#[derive(Debug)]
struct MetricsObserver {
    metrics: Metrics,
}

impl UpdateObserver for MetricsObserver {
    fn on_extraction(&self, report: &ExtractionReport) {
        self.metrics.inc_extraction_outcome(if report.success {
            "committed"
        } else {
            "failed"
        });
        if let Some(m) = &report.metrics {
            let gates = [
                ("confidence", m.rejected_low_confidence),
                ("scope", m.rejected_by_scope_gate),
                ("malformed", m.dropped_malformed),
            ];
            for (gate, n) in gates {
                for _ in 0..n {
                    self.metrics.inc_gate_rejection(gate);
                }
            }
        }
    }
}

pub(crate) async fn serve(ctx: &Ctx, bind_override: Option<SocketAddr>) -> Result<(), CliError> {
    let mut gateway = gateway_config(ctx)?;
    if let Some(addr) = bind_override {
        gateway.bind = addr;
    }
    let metrics = Metrics::new();
    let mut opts = ctx.build_options();
    // A server runs long: it takes read leases in `coherence: lease`.
    opts.short_lived = false;
    opts.recover_turns = true;
    opts.observer = Some(Arc::new(MetricsObserver {
        metrics: metrics.clone(),
    }));
    let backend = deermem::build_backend(ctx.memory(), opts).map_err(ctx::build_error)?;
    if let Some(dm) = backend.deermem() {
        // The turn journal's pending turns are queued again before the server listens (and
        // so before /readyz can answer).
        dm.turns_recovered().await;
    }
    if let Some(dm) = backend.deermem() {
        // Queue depth, sampled every two seconds.
        let dm = Arc::clone(dm);
        let m = metrics.clone();
        tokio::spawn(async move {
            loop {
                m.set_queue_depth(dm.pipeline().queue().pending_count() as u64);
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        });
    }
    let mut state = GatewayState::new(backend.manager(), ctx.memory().clone(), gateway.clone())
        .with_metrics(metrics);
    if let Some(turns) = backend.deermem().and_then(|dm| dm.turn_admin()) {
        // `/api/memory/turns` and the deermem_turns_* gauges (absent with `queue.durable: false`).
        state = state.with_turn_journal(turns);
    }
    if let Some(storage) = backend.embedded_storage().cloned() {
        // `/readyz` is not ready while the storage (a database) cannot be reached.
        let probe = storage.clone();
        state = state.with_readiness_check(Arc::new(move || {
            let probe = probe.clone();
            Box::pin(async move {
                probe
                    .check_reachable()
                    .await
                    .map_err(|e| deermem_gateway::StorageUnreachable(e.to_string()))
            })
        }));
        // The journal that belongs with the storage: `{root}/.runs` beside the files, or the
        // database's `run_events` table, shared by every replica.
        let journal = storage
            .open_run_journal(Arc::new(deermem::SystemClock))
            .await
            .map_err(|e| CliError::failure(format!("cannot open the run journal: {e}")))?;
        state = state.with_run_journal(journal);
    }
    let (listener, local) = bind(gateway.bind).await?;
    eprintln!(
        "deermem: serving the memory API on http://{local}/api/memory (backend {}, auth {}); Ctrl-C to stop",
        backend.class(),
        gateway.auth.mode.as_str()
    );
    deermem_gateway::serve(listener, state, shutdown_signal())
        .await
        .map_err(|e| CliError::failure(format!("gateway stopped: {e}")))
}

pub(crate) async fn mcp(
    ctx: &Ctx,
    user: Option<String>,
    agent: Option<String>,
    bind_addr: Option<SocketAddr>,
    allow_origin: Vec<String>,
) -> Result<(), CliError> {
    let agent: Option<AgentName> = ctx::agent(agent.as_deref())?;
    let mut opts = ctx.build_options();
    opts.short_lived = false;
    let backend = deermem::build_backend(ctx.memory(), opts).map_err(ctx::build_error)?;
    let manager = backend.manager();
    let result = match bind_addr {
        None => {
            let user = match user {
                Some(raw) => {
                    // The server acts for this user on a host's behalf: the rule on
                    // caller-chosen ids applies.
                    deermem_core::ids::refuse_derived_bucket(&raw)
                        .map_err(|e| CliError::invalid(format!("--user: {e}")))?;
                    ctx::user(&raw)?
                }
                None => UserId::default_user(),
            };
            let identity = deermem_mcp::McpIdentity { user, agent };
            deermem_mcp::serve_stdio(Arc::clone(&manager), identity)
                .await
                .map_err(|e| CliError::failure(e.to_string()))
        }
        Some(addr) => {
            if user.is_some() {
                return Err(CliError::invalid(
                    "--user is for stdio mode; over HTTP every caller is identified by its bearer token",
                ));
            }
            let gateway = gateway_config(ctx)?;
            if gateway.auth.tokens.is_empty() {
                return Err(CliError::invalid(
                    "deermem mcp --bind needs bearer tokens: configure gateway.auth.tokens or gateway.auth.tokens_file",
                ));
            }
            // The raw ids as configured, so a fact shows the same `scope.userId` over HTTP as
            // over stdio (the gateway's own routes use the safe ids, as the reference does).
            let tokens: Vec<(String, UserId)> = gateway
                .auth
                .token_users
                .iter()
                .map(|(t, u)| (t.clone(), u.clone()))
                .collect();
            let auth: deermem_mcp::TokenAuth = Arc::new(move |given: &str| {
                let mut found = None;
                for (token, user) in &tokens {
                    if constant_time_eq(token, given) {
                        found = Some(user.clone());
                    }
                }
                found
            });
            let (listener, local) = bind(addr).await?;
            eprintln!(
                "deermem: serving MCP on http://{local}{} (backend {}); Ctrl-C to stop",
                deermem_mcp::DEFAULT_PATH,
                backend.class()
            );
            let options = deermem_mcp::HttpOptions {
                cors_origins: allow_origin,
                server: gateway.server,
                ..deermem_mcp::HttpOptions::default()
            };
            // The flush starts at the signal, while connections drain; `finish` below flushes
            // again (whatever requests finishing during the drain left) and closes.
            let (signalled_tx, mut signalled_rx) = tokio::sync::watch::channel(false);
            let signal = async move {
                shutdown_signal().await;
                let _ = signalled_tx.send(true);
            };
            let flusher = Arc::clone(&manager);
            let budget =
                std::time::Duration::from_secs_f64(ctx.memory().shutdown_flush_timeout_seconds);
            let flush = async move {
                if signalled_rx.wait_for(|s| *s).await.is_ok()
                    && !flusher.shutdown_flush(budget).await
                {
                    tracing::warn!("pending memory updates did not finish within {budget:?}");
                }
            };
            let served = deermem_mcp::serve_http_with(
                listener,
                Arc::clone(&manager),
                auth,
                agent,
                options,
                signal,
            );
            let (served, ()) = tokio::join!(served, flush);
            served.map_err(|e| CliError::failure(e.to_string()))
        }
    };
    crate::cmd::finish(&manager, ctx).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq("tok-alice", "tok-alice"));
        assert!(!constant_time_eq("tok-alice", "tok-alicf"));
        assert!(!constant_time_eq("tok", "tok-alice"));
        assert!(!constant_time_eq("", "x"));
    }
}
