//! `gateway_get` and `gateway_post`: `GET /api/memory` of a 100-fact user and `POST
//! /api/memory/facts` (one durable fact create each), served by the gateway's router over the
//! DeerMem manager and file storage (or PostgreSQL, `--store postgres`) on 127.0.0.1 (an ephemeral port, in this process), driven
//! by concurrent HTTP/1.1 keep-alive clients; latency is measured on the client side.

use deermem_core::ports::MemoryManagerExt as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::ports::{MemoryManager, MemoryStorage};
use deermem_core::{AgentName, MemoryConfig, UserId};
use deermem_gateway::{GatewayConfig, GatewayState, serve};

use super::context::manager;
use super::{Env, open, seed_scope, settle};
use crate::http::Connection;
use crate::stats::{Recorder, WorkloadResult};

/// The gateway served over `mgr` on an ephemeral loopback port, in this process.
struct Server {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(mgr: Arc<dyn MemoryManager>) -> Result<Self> {
        let state = GatewayState::new(mgr, MemoryConfig::default(), GatewayConfig::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, state, async move {
            let _ = stop_rx.await;
        }));
        Ok(Self { addr, stop, task })
    }

    /// Shuts the server down gracefully and reports how it ended.
    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(30), self.task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e).context("gateway server"),
            Ok(Err(e)) => Err(e).context("gateway task"),
            Err(_) => anyhow::bail!("the gateway did not stop within 30 s"),
        }
    }
}

pub(crate) async fn run(env: &Env) -> Result<WorkloadResult> {
    get_on(env, Arc::new(open(&env.root, true)?)).await
}

/// `gateway_get` over `storage` (the file store, or PostgreSQL for `--store postgres`).
pub(crate) async fn get_on(env: &Env, storage: Arc<dyn MemoryStorage>) -> Result<WorkloadResult> {
    // Authentication mode `none` serves the user `default` to loopback callers.
    let user = UserId::default_user();
    let agent = AgentName::default_bucket();
    seed_scope(&*storage, &user, &agent, env.drafts(env.sizes.scope_facts)?).await?;
    let mgr: Arc<dyn MemoryManager> = Arc::new(manager(storage)?);
    let server = Server::start(mgr.clone()).await?;
    let addr = server.addr;

    // One checked request: the document holds the seeded facts.
    let mut probe = Connection::connect(addr).await?;
    let first = probe.get("/api/memory", "").await?;
    anyhow::ensure!(
        first.status == 200,
        "GET /api/memory answered {}",
        first.status
    );
    let doc: serde_json::Value = serde_json::from_slice(&first.body).context("response JSON")?;
    let facts = doc["facts"].as_array().map_or(0, Vec::len);
    anyhow::ensure!(
        facts == env.sizes.scope_facts,
        "the response holds {facts} facts"
    );
    drop(probe);
    settle().await;

    let clients = env.sizes.gateway_clients.max(1);
    let total = env.sizes.gateway_requests;
    let per = total.div_ceil(clients);
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut c = Connection::connect(addr).await?;
        // Warm the connection (and the server's per-connection state).
        anyhow::ensure!(
            c.get("/api/memory", "").await?.status == 200,
            "warm-up failed"
        );
        conns.push(c);
    }
    let started = Instant::now();
    let cpu_before = crate::machine::process_cpu_time();
    let mut set = tokio::task::JoinSet::new();
    let mut remaining = total;
    for mut c in conns {
        let mine = per.min(remaining);
        remaining -= mine;
        set.spawn(async move {
            let mut samples = Vec::with_capacity(mine);
            for _ in 0..mine {
                let t = Instant::now();
                let r = c.get("/api/memory", "").await?;
                samples.push(t.elapsed());
                anyhow::ensure!(r.status == 200, "status {}", r.status);
            }
            anyhow::Ok(samples)
        });
    }
    let mut rec = Recorder::start(total);
    while let Some(r) = set.join_next().await {
        for s in r.context("client task")?? {
            rec.push(s);
        }
    }
    let elapsed = started.elapsed();
    // Server and clients share this process: its CPU time over the measured phase, per
    // request, is the cost the throughput figure hides on a shared machine.
    let cpu_us_per_request = match (cpu_before, crate::machine::process_cpu_time()) {
        (Some(a), Some(b)) => serde_json::json!(
            ((b.saturating_sub(a).as_secs_f64() * 1e6 / total.max(1) as f64) * 10.0).round() / 10.0
        ),
        _ => serde_json::Value::Null,
    };
    server.stop().await?;
    mgr.close().await;
    let mut r = rec.finish(total, Duration::ZERO);
    r.elapsed = elapsed;
    Ok(r.with("clients", clients.into())
        .with("response_bytes", first.body.len().into())
        .with("cpu_us_per_request", cpu_us_per_request))
}

/// `gateway_post`: `POST /api/memory/facts` creating one fact per request for the user
/// `default` (authentication mode `none`) from 4 concurrent clients; every create is a durable
/// commit, so this is fsync-bound like `write_fact`. Answers other than 200 are counted, not
/// hidden: 409 for a conflict, and (past the default capacity of 100 facts) 409 for a create
/// the capacity policy evicts at once, as the reference answers.
pub(crate) async fn post(env: &Env) -> Result<WorkloadResult> {
    post_on(env, Arc::new(open(&env.root, true)?)).await
}

/// `gateway_post` over `storage` (the file store, or PostgreSQL for `--store postgres`).
pub(crate) async fn post_on(env: &Env, storage: Arc<dyn MemoryStorage>) -> Result<WorkloadResult> {
    let mgr: Arc<dyn MemoryManager> = Arc::new(manager(storage)?);
    let server = Server::start(mgr.clone()).await?;
    let addr = server.addr;

    let clients = env.sizes.gateway_clients.clamp(1, 4);
    let total = (env.sizes.gateway_requests / 40).max(4);
    let per = total.div_ceil(clients);
    let drafts = env.drafts(total)?;
    let mut bodies: Vec<Vec<u8>> = drafts
        .iter()
        .enumerate()
        .map(|(i, d)| {
            serde_json::to_vec(&serde_json::json!({
                "content": format!("{} (post {i})", d.content()),
                "category": d.category().unwrap_or("context"),
                "confidence": d.confidence().unwrap_or(0.9),
            }))
        })
        .collect::<Result<_, _>>()?;
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(Connection::connect(addr).await?);
    }
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for mut c in conns {
        let take = per.min(bodies.len());
        let mine: Vec<Vec<u8>> = bodies.drain(..take).collect();
        set.spawn(async move {
            let mut samples = Vec::with_capacity(mine.len());
            let (mut created, mut conflicts, mut not_kept) = (0usize, 0usize, 0usize);
            let mut first_conflict: Option<String> = None;
            for body in mine {
                let t = Instant::now();
                let r = c.post_json("/api/memory/facts", "", &body).await?;
                samples.push(t.elapsed());
                match r.status {
                    200 => created += 1,
                    // Past `max_facts` a create the capacity policy evicts at once is answered
                    // 409 with this detail (the reference's behaviour): not a conflict.
                    409 if r.body.windows(9).any(|w| w == b"max_facts") => not_kept += 1,
                    409 => {
                        conflicts += 1;
                        first_conflict
                            .get_or_insert_with(|| String::from_utf8_lossy(&r.body).into_owned());
                    }
                    other => anyhow::bail!(
                        "POST /api/memory/facts answered {other}: {}",
                        String::from_utf8_lossy(&r.body)
                    ),
                }
            }
            anyhow::Ok((samples, created, conflicts, not_kept, first_conflict))
        });
    }
    let mut rec = Recorder::start(total);
    let (mut created, mut conflicts, mut not_kept) = (0usize, 0usize, 0usize);
    let mut first_conflict = None;
    while let Some(r) = set.join_next().await {
        let (samples, c, k, nk, f) = r.context("client task")??;
        created += c;
        conflicts += k;
        not_kept += nk;
        first_conflict = first_conflict.or(f);
        for s in samples {
            rec.push(s);
        }
    }
    let elapsed = started.elapsed();
    server.stop().await?;
    // Every create that was answered 200 is in the stored document, up to the capacity (past
    // it, each create evicts the lowest-scoring fact or is itself not kept).
    let doc = mgr
        .get_memory(deermem_core::ports::MemoryScope::new(
            Some(UserId::default_user()),
            Some(AgentName::default_bucket()),
        ))
        .await?;
    let capacity = deermem_updater::DeerMemConfig::default().max_facts;
    anyhow::ensure!(
        doc.facts.len() == created.min(capacity),
        "{created} creates were acknowledged (capacity {capacity}) but {} facts are stored",
        doc.facts.len()
    );
    mgr.close().await;
    let n = created + conflicts + not_kept;
    let mut r = rec.finish(n, Duration::ZERO);
    r.elapsed = elapsed;
    Ok(r.with("clients", clients.into())
        .with("created", created.into())
        .with("conflicts", conflicts.into())
        .with("not_kept_over_capacity", not_kept.into())
        .with("first_conflict", first_conflict.into()))
}

/// `turn_accept`: an acknowledged `POST /api/memory/messages` (202) with the durable file turn
/// journal (each turn appended and `fdatasync`'d before the answer), one request at a time from
/// one client, one new thread per request: the latency a host waits for one acknowledged turn.
/// Then the same requests against a manager that keeps turns in memory only (`queue.durable:
/// false`), reported beside it as `in_memory_p50_us`/`in_memory_p99_us`, and the durable run
/// again from 4 concurrent clients (`concurrent4_p50_us`, `concurrent4_ops_per_sec`: durable
/// admission takes one turn at a time, so concurrent turns wait for each other's `fdatasync`).
/// The debounce (30 s) holds every turn queued during the runs, so only admission is measured;
/// afterwards the journal must hold one pending item per 202.
pub(crate) async fn turn_accept(env: &Env) -> Result<WorkloadResult> {
    let clients = 1;
    let total = (env.sizes.gateway_requests / 10).max(4);

    let (durable, journal) = durable_manager(&env.root.join("durable"))?;
    let (server, rec, elapsed, accepted) = post_turns(durable, clients, total, "d").await?;
    // Before the server stops (its shutdown flush would apply and complete them).
    let counts = journal.counts().await?;
    anyhow::ensure!(
        counts.pending == accepted as u64,
        "{accepted} turns were acknowledged but the journal holds {} pending",
        counts.pending
    );
    server.stop().await?;
    // The server's shutdown closed that manager: the concurrent run gets a root of its own.
    let (durable, journal) = durable_manager(&env.root.join("concurrent"))?;
    let (server, rec4, elapsed4, accepted4) = post_turns(durable, 4, total, "c").await?;
    let held = journal.counts().await?.pending;
    anyhow::ensure!(
        held == accepted4 as u64,
        "{accepted4} concurrent turns were acknowledged but the journal holds {held} pending"
    );
    server.stop().await?;
    let mut c4 = rec4.finish(total, Duration::ZERO);
    c4.elapsed = elapsed4;
    let c4 = c4.summary();

    let memory_root = env.root.join("memory");
    let storage: Arc<dyn MemoryStorage> = Arc::new(open(&memory_root, true)?);
    let in_memory: Arc<dyn MemoryManager> = Arc::new(manager(storage)?);
    let (server, mem_rec, _, _) = post_turns(in_memory, clients, total, "m").await?;
    server.stop().await?;
    let mem = mem_rec.finish(total, Duration::ZERO).summary();

    let mut r = rec.finish(total, Duration::ZERO);
    r.elapsed = elapsed;
    Ok(r.with("clients", clients.into())
        .with("journal_pending", counts.pending.into())
        .with("in_memory_p50_us", mem.p50_us.round().into())
        .with("in_memory_p99_us", mem.p99_us.round().into())
        .with("concurrent4_p50_us", c4.p50_us.round().into())
        .with("concurrent4_p99_us", c4.p99_us.round().into())
        .with("concurrent4_ops_per_sec", c4.ops_per_sec.round().into()))
}

/// A DeerMem manager over the file storage in `root` with the durable file turn journal, and
/// the journal.
fn durable_manager(
    root: &std::path::Path,
) -> Result<(
    Arc<dyn MemoryManager>,
    Arc<dyn deermem_core::ports::TurnJournal>,
)> {
    let storage: Arc<dyn MemoryStorage> = Arc::new(open(root, true)?);
    let journal: Arc<dyn deermem_core::ports::TurnJournal> = Arc::new(
        deermem_storage_file::FileTurnJournal::open_in_root(
            root,
            deermem_storage_file::FileTurnJournalOptions::default(),
        )
        .context("turn journal")?,
    );
    let mut parts = deermem_engine::DeerMemParts::new(super::config(), storage, super::clock());
    parts.turns = Some(journal.clone());
    let mgr: Arc<dyn MemoryManager> =
        Arc::new(deermem_engine::DeerMemManager::new(parts).context("manager")?);
    Ok((mgr, journal))
}

/// Serves `mgr`, posts `total` one-message-pair turns (each on its own thread, text the offline
/// rules extract nothing from) from `clients` connections, and returns the server (still
/// running), the latencies, the measured phase's wall time and the 202 count.
async fn post_turns(
    mgr: Arc<dyn MemoryManager>,
    clients: usize,
    total: usize,
    tag: &str,
) -> Result<(Server, Recorder, Duration, usize)> {
    let server = Server::start(mgr.clone()).await?;
    let addr = server.addr;
    let mut bodies: Vec<Vec<u8>> = (0..total)
        .map(|i| {
            serde_json::to_vec(&serde_json::json!({
                "thread_id": format!("bench-{tag}-{i}"),
                "messages": [
                    {"role": "user", "content": format!("Hello again, request number {i}. How are you today?")},
                    {"role": "assistant", "content": "Fine, thank you."}
                ]
            }))
        })
        .collect::<Result<_, _>>()?;
    let per = total.div_ceil(clients);
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(Connection::connect(addr).await?);
    }
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for mut c in conns {
        let take = per.min(bodies.len());
        let mine: Vec<Vec<u8>> = bodies.drain(..take).collect();
        set.spawn(async move {
            let mut samples = Vec::with_capacity(mine.len());
            for body in mine {
                let t = Instant::now();
                let r = c.post_json("/api/memory/messages", "", &body).await?;
                samples.push(t.elapsed());
                anyhow::ensure!(
                    r.status == 202,
                    "POST /api/memory/messages answered {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                );
            }
            anyhow::Ok(samples)
        });
    }
    let mut rec = Recorder::start(total);
    let mut accepted = 0;
    while let Some(r) = set.join_next().await {
        for s in r.context("client task")?? {
            rec.push(s);
            accepted += 1;
        }
    }
    let elapsed = started.elapsed();
    Ok((server, rec, elapsed, accepted))
}
