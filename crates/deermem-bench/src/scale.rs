//! `deermem-bench scale`: how the cost of the main operations grows with the store. For each
//! size (facts; 100 facts per user in the default agent bucket, so 1,000,000 facts are 10,000
//! users) a root is filled through the storage's bulk path (whole-user snapshots written by the
//! storage crate's own writer, without an fsync per file, then one `sync(2)`; PostgreSQL: one
//! snapshot transaction per user), the index is rebuilt, and then, each in a child process of
//! its own so its memory is its own:
//!
//! - `rebuild_index`: a full rebuild of the index (time, peak RSS); file store only;
//! - `search`, `get_context`, `load_scope_cold`, `write_fact`: p50/p99 (see `measure`);
//! - `serve`: the gateway over the storage, the time from starting the process until `/readyz`
//!   answers 200, and its RSS after `GET /api/memory` for every user.
//!
//! The report has one entry per size and workload.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use deermem_core::config::ConfigSecret;
use deermem_core::fact::{NormalizeContext, normalize_fact};
use deermem_core::ports::{ContextRequest, MemoryManager, MemoryScope, MemoryStorage};
use deermem_core::snapshot::{AgentSnapshot, UserSnapshot};
use deermem_core::{
    AgentName, Fact, FactId, FactScope, MemoryConfig, Scope, SearchQuery, Timestamp, UserId,
};
use deermem_gateway::{AuthMode, GatewayConfig, GatewayState, serve};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::corpus::{self, Generator};
use crate::http::Connection;
use crate::machine;
use crate::stats::Recorder;
use crate::workloads::{self, Store};
use deermem_core::prelude::*;

/// The usage text of `deermem-bench scale`.
pub const USAGE: &str =
    "usage: deermem-bench scale [--store file|postgres] [--sizes 20000,200000,1000000]
                           [--json OUT] [--svg OUT] [--tmpdir DIR] [--ops N]
       deermem-bench scale-chart REPORT.json OUT.svg

For each size (facts, 100 per user), fills a fresh root through the storage's bulk path,
rebuilds the index and measures search (with the OS page cache dropped, then the same
searches again as search_warm; search_from_disk: the cold searches that read from the
disk, file store), get_context, load_scope_cold and write_fact (p50/p99
over N operations, default 2000; load_scope_cold and write_fact a tenth of it), the rebuild
(time, peak RSS) and a gateway process on the root (time to readiness, RSS after one request
for every user). Prints a table; --json writes {\"entries\": [{\"size\", \"workload\", ...}]},
--svg the chart of the figures (scale-chart draws it again from a saved report).";

/// Facts of each user.
pub const FACTS_PER_USER: usize = 100;
/// The internal token the serve child accepts (loopback only, for this process tree).
const INTERNAL_TOKEN: &str = "deermem-bench-scale-internal";
/// The line the serve child prints once it listens.
const PORT_MARKER: &str = "DEERMEM_SCALE_PORT ";

/// Parsed `scale` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleArgs {
    /// The storage measured.
    pub store: Store,
    /// Sizes in facts.
    pub sizes: Vec<usize>,
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--svg`: the chart of the report.
    pub svg: Option<PathBuf>,
    /// `--tmpdir`.
    pub tmpdir: Option<PathBuf>,
    /// Operations per latency workload.
    pub ops: usize,
}

impl ScaleArgs {
    /// Parses the arguments after `scale`.
    ///
    /// # Errors
    /// Unknown flags, bad values.
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut a = Self {
            store: Store::File,
            sizes: vec![20_000, 200_000, 1_000_000],
            json: None,
            svg: None,
            tmpdir: None,
            ops: 2_000,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .with_context(|| format!("{flag} needs a value"))
            };
            match flag.as_str() {
                "--store" => {
                    let v = value()?;
                    a.store = Store::parse(&v)
                        .with_context(|| format!("unknown store {v:?} (file, postgres)"))?;
                }
                "--sizes" => {
                    a.sizes = value()?
                        .split(',')
                        .map(|s| {
                            s.trim()
                                .replace('_', "")
                                .parse::<usize>()
                                .with_context(|| format!("bad size {s:?}"))
                        })
                        .collect::<Result<_>>()?;
                }
                "--json" => a.json = Some(value()?.into()),
                "--svg" => a.svg = Some(value()?.into()),
                "--tmpdir" => a.tmpdir = Some(value()?.into()),
                "--ops" => a.ops = value()?.parse().context("--ops")?,
                other => bail!("unknown argument {other:?}\n\n{USAGE}"),
            }
        }
        if a.sizes.iter().any(|s| *s < FACTS_PER_USER) {
            bail!("every size must be at least {FACTS_PER_USER} facts (one user)");
        }
        if a.ops == 0 {
            bail!("--ops must be positive");
        }
        Ok(a)
    }
}

/// The raw id (and bucket) of user `i`.
fn user_id(i: usize) -> String {
    format!("scale{i:06}")
}

/// The facts of user `i`, made again identically from the user's own seed.
fn user_facts(base: &Generator, i: usize) -> Vec<corpus::CorpusFact> {
    let mut g = base.reseeded(corpus::SEED ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..FACTS_PER_USER)
        .map(|_| g.fact(user_id(i), None))
        .collect()
}

/// The snapshot of user `i`: its facts normalised as the storage would store them.
fn user_snapshot(base: &Generator, i: usize, now: Timestamp) -> Result<UserSnapshot> {
    let raw = user_id(i);
    let scope = FactScope {
        user_id: Some(raw.clone()),
        agent_name: Some(AgentName::default_bucket().as_str().to_owned()),
    };
    let mut facts: Vec<Fact> = Vec::with_capacity(FACTS_PER_USER);
    for (k, f) in user_facts(base, i).iter().enumerate() {
        let id = FactId::new(format!("fact_{i:016x}{k:016x}"))?;
        let fixed = id.clone();
        let new_id = move || fixed.clone();
        let ctx = NormalizeContext {
            scope: &scope,
            existing: None,
            now,
            new_id: &new_id,
        };
        facts.push(normalize_fact(&f.draft()?, &ctx)?);
    }
    facts.sort_by(|a, b| a.id.cmp(&b.id));
    let mut snap = UserSnapshot::empty(raw);
    snap.revision = 1;
    snap.last_updated = now.to_iso_z();
    snap.agents.push(AgentSnapshot {
        agent: AgentName::default_bucket(),
        facts,
        usage: None,
        audit: None,
    });
    Ok(snap)
}

/// Where a size's data lives.
#[derive(Debug, Clone)]
struct Target {
    store: Store,
    root: PathBuf,
    pg_url: Option<String>,
    users: usize,
}

impl Target {
    fn child_args(&self) -> Vec<String> {
        let mut v = vec![
            "--root".to_owned(),
            self.root.display().to_string(),
            "--users".to_owned(),
            self.users.to_string(),
            "--store".to_owned(),
            self.store.name().to_owned(),
        ];
        if let Some(u) = &self.pg_url {
            v.push("--pg-url".into());
            v.push(u.clone());
        }
        v
    }

    fn from_child_args(args: &[String]) -> Result<(Self, usize)> {
        let mut root = None;
        let mut users = None;
        let mut store = Store::File;
        let mut pg_url = None;
        let mut ops = 2_000;
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || it.next().cloned().with_context(|| format!("{flag} value"));
            match flag.as_str() {
                "--root" => root = Some(PathBuf::from(value()?)),
                "--users" => users = Some(value()?.parse()?),
                "--store" => store = Store::parse(&value()?).context("--store")?,
                "--pg-url" => pg_url = Some(value()?),
                "--ops" => ops = value()?.parse()?,
                other => bail!("unknown scale child argument {other:?}"),
            }
        }
        Ok((
            Self {
                store,
                root: root.context("--root")?,
                pg_url,
                users: users.context("--users")?,
            },
            ops,
        ))
    }

    /// The storage of this target, as the embedded engine opens it (the file store with its
    /// FTS5 index, or PostgreSQL).
    async fn storage(&self, with_index: bool) -> Result<Arc<dyn MemoryStorage>> {
        match (&self.pg_url, self.store) {
            (Some(url), Store::Postgres) => Ok(Arc::new(workloads::postgres::open_url(url).await?)),
            _ => Ok(Arc::new(workloads::open_root(&self.root, with_index)?)),
        }
    }
}

/// Child mode (`deermem-bench scale-child PHASE ...`): one phase, its result on stdout.
///
/// # Errors
/// The phase's failure.
pub fn run_child(phase: &str, args: &[String]) -> Result<Value> {
    let (target, ops) = Target::from_child_args(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, usize::from))
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    rt.block_on(async {
        match phase {
            "seed" => seed(&target).await,
            "rebuild" => rebuild(&target).await,
            "measure" => measure(&target, ops).await,
            "serve" => serve_child(&target).await,
            other => bail!("unknown scale phase {other:?}"),
        }
    })
}

async fn seed(t: &Target) -> Result<Value> {
    let started = Instant::now();
    let base = Generator::new(corpus::SEED);
    let now = Timestamp::parse_iso("2026-06-01T00:00:00Z").context("the seed time")?;
    match t.store {
        Store::File => {
            let storage = workloads::open_root(&t.root, false)?;
            // A few users at a time on the blocking pool.
            let mut next = 0;
            while next < t.users {
                let end = (next + 16).min(t.users);
                let mut set = tokio::task::JoinSet::new();
                for i in next..end {
                    let snap = user_snapshot(&base, i, now)?;
                    let s = storage.clone();
                    set.spawn(async move { s.write_snapshot_unsynced(snap).await });
                }
                while let Some(r) = set.join_next().await {
                    r.context("seeding task")?.context("writing a snapshot")?;
                }
                next = end;
            }
            workloads::quiesce();
        }
        Store::Postgres => {
            let url = t.pg_url.as_deref().context("--pg-url")?;
            let store = workloads::postgres::store_url(url).await?;
            for i in 0..t.users {
                let snap = user_snapshot(&base, i, now)?;
                store
                    .write_snapshot(&snap)
                    .await
                    .with_context(|| format!("writing user {i}"))?;
            }
        }
    }
    Ok(json!({
        "facts": t.users * FACTS_PER_USER,
        "users": t.users,
        "seconds": started.elapsed().as_secs_f64(),
        "peak_rss_kb": machine::peak_rss_kb(),
    }))
}

async fn rebuild(t: &Target) -> Result<Value> {
    let storage = t.storage(true).await?;
    workloads::fresh_disk_state();
    let started = Instant::now();
    let report = storage.rebuild_index(None).await.context("rebuild")?;
    let took = started.elapsed();
    anyhow::ensure!(
        report.failed == 0 && !report.fatal,
        "rebuild failed: {report:?}"
    );
    storage.close().await;
    Ok(json!({
        "indexed": report.indexed,
        "seconds": took.as_secs_f64(),
        "facts_per_sec": report.indexed as f64 / took.as_secs_f64().max(1e-9),
        "peak_rss_kb": machine::peak_rss_kb(),
    }))
}

/// Users spread over the whole store (`n` of them, or every user when fewer).
fn spread(users: usize, n: usize, rng: &mut StdRng) -> Vec<usize> {
    (0..n).map(|_| rng.random_range(0..users)).collect()
}

fn summary(rec: Recorder, n: usize) -> Value {
    let s = rec.finish(n, Duration::ZERO).summary();
    json!({"n": s.n, "p50_us": s.p50_us, "p99_us": s.p99_us, "ops_per_sec": s.ops_per_sec})
}

/// Runs every query once, timing each; returns the summary, the number of hits and, with
/// `count_disk` (the file store, whose index this process reads itself) and a kernel that
/// tells, the summary of the searches during which the process read from the disk. The
/// summary then also has the KiB read from the disk per search. PostgreSQL's reads happen in
/// its own processes, where this process's counter cannot see them.
///
/// The split is what compares a cold search with a cold search: at 20,000 facts the whole
/// index is read within the pass's first few hundred searches, so most of its "cold" pass is
/// answered from memory, while at a million facts most searches go to the disk. The counter is
/// read before and after each search, outside the timed span.
async fn search_pass(
    storage: &dyn MemoryStorage,
    queries: &[SearchQuery],
    count_disk: bool,
) -> Result<(Value, usize, Option<Value>)> {
    let read_before = machine::disk_read_bytes().filter(|_| count_disk);
    let mut rec = Recorder::start(queries.len());
    let mut from_disk = Recorder::start(queries.len());
    let (mut disk_n, mut disk_bytes) = (0usize, 0u64);
    let mut hits = 0usize;
    for query in queries {
        let before = read_before.and(machine::disk_read_bytes());
        let started = Instant::now();
        let found = storage.search_facts(query).await.context("search")?;
        let took = started.elapsed();
        rec.push(took);
        if let (Some(b), Some(a)) = (before, before.and(machine::disk_read_bytes()))
            && a > b
        {
            from_disk.push(took);
            disk_n += 1;
            disk_bytes += a - b;
        }
        hits += found.len();
    }
    let mut shown = summary(rec, queries.len());
    if let (Some(before), Some(after), Some(n)) = (
        read_before,
        machine::disk_read_bytes(),
        std::num::NonZeroUsize::new(queries.len()),
    ) {
        let per_op = after.saturating_sub(before) as f64 / 1024.0 / n.get() as f64;
        shown["disk_read_kib_per_op"] = json!(per_op);
    }
    let disk = (read_before.is_some() && disk_n > 0).then(|| {
        let mut v = summary(from_disk, disk_n);
        if let Some(m) = v.as_object_mut() {
            // The pass's wall clock over a subset of its searches is no rate.
            m.remove("ops_per_sec");
        }
        v["disk_read_kib_per_op"] = json!(disk_bytes as f64 / 1024.0 / disk_n as f64);
        v["share_of_searches"] = json!(disk_n as f64 / queries.len().max(1) as f64);
        v
    });
    Ok((shown, hits, disk))
}

/// The latency workloads on one storage:
/// - `search`: `ops` top-10 searches, each in the scope of a random user, for one to three
///   words of one of its facts, after the OS page cache was dropped (at a million facts most
///   of them read their pages from the disk);
/// - `search_warm`: the same searches again, their pages now cached;
/// - `search_from_disk`: those of the `search` pass during which the process read from the
///   disk (file store only; see [`search_pass`]);
/// - `get_context`: the DeerMem manager's block for 100 users spread over the store, warm
///   (each asked once before), `ops` calls round robin;
/// - `load_scope_cold`: `ops / 10` loads of random users, each with a fresh storage instance,
///   after the OS page cache was dropped again (the `get_context` pass read 100 users' files:
///   half the users at 20,000 facts, 1% at a million, so without it the small store's loads
///   were half warm and the sizes did not measure the same thing);
/// - `write_fact`: `ops / 10` single-fact creates, one after another, into a new user's scope.
async fn measure(t: &Target, ops: usize) -> Result<Value> {
    let base = Generator::new(corpus::SEED);
    let mut rng = StdRng::seed_from_u64(corpus::SEED ^ 0x5ca1e);
    let agent = AgentName::default_bucket();
    let storage = t.storage(true).await?;
    workloads::fresh_disk_state();

    // search
    let mut queries = Vec::with_capacity(ops);
    for u in spread(t.users, ops, &mut rng) {
        let facts = user_facts(&base, u);
        let f = &facts[rng.random_range(0..facts.len())];
        let q = corpus::query_from(&f.content, &mut rng);
        let user = UserId::new(user_id(u))?;
        let scope = Scope::new(Some(user), Some(agent.clone()));
        queries.push(SearchQuery::new(q, scope, 10));
    }
    let count_disk = t.store == Store::File;
    let (search, hits, search_from_disk) =
        search_pass(storage.as_ref(), &queries, count_disk).await?;
    anyhow::ensure!(hits > 0, "no search found anything");
    // The same searches again: their index pages are now in the OS cache (and, as far as
    // they fit, in SQLite's), as for users a serving process answers often.
    let (search_warm, _, _) = search_pass(storage.as_ref(), &queries, count_disk).await?;

    // get_context
    let mgr = workloads::context_manager(Arc::clone(&storage))?;
    anyhow::ensure!(mgr.warm().await == Some(true), "tiktoken table unavailable");
    let asked: Vec<ContextRequest> = spread(t.users, 100.min(t.users), &mut rng)
        .into_iter()
        .map(|u| -> Result<ContextRequest> {
            Ok(ContextRequest {
                scope: MemoryScope::new(Some(UserId::new(user_id(u))?), Some(agent.clone())),
                thread_id: None,
            })
        })
        .collect::<Result<_>>()?;
    for r in &asked {
        let text = mgr.get_context(r.clone()).await?;
        anyhow::ensure!(text.contains("Facts"), "no facts in a block: {text:?}");
    }
    let mut rec = Recorder::start(ops);
    for i in 0..ops {
        let r = asked[i % asked.len()].clone();
        let started = Instant::now();
        mgr.get_context(r).await?;
        rec.push(started.elapsed());
    }
    let get_context = summary(rec, ops);

    // load_scope_cold
    workloads::fresh_disk_state();
    let cold_n = (ops / 10).max(1);
    let mut rec = Recorder::start(cold_n);
    for u in spread(t.users, cold_n, &mut rng) {
        let fresh = t.storage(false).await?;
        let user = UserId::new(user_id(u))?;
        let started = Instant::now();
        let doc = fresh
            .load(Some(&user), Some(&agent))
            .await
            .context("load")?;
        rec.push(started.elapsed());
        anyhow::ensure!(doc.facts.len() == FACTS_PER_USER, "short load");
        fresh.close().await;
    }
    let load_scope_cold = summary(rec, cold_n);

    // write_fact
    let writes = (ops / 10).max(1);
    let writer = UserId::new("scale-writer")?;
    let mut g = base.reseeded(corpus::SEED ^ 0x3417e);
    let mut rec = Recorder::start(writes);
    for _ in 0..writes {
        let draft = g.fact(writer.as_str().to_owned(), None).draft()?;
        let started = Instant::now();
        storage
            .upsert_fact(Some(&writer), &agent, draft, None, None)
            .await
            .context("write")?;
        rec.push(started.elapsed());
    }
    let write_fact = summary(rec, writes);
    mgr.close().await;
    Ok(json!({
        "search": search,
        "search_warm": search_warm,
        "search_from_disk": search_from_disk,
        "get_context": get_context,
        "load_scope_cold": load_scope_cold,
        "write_fact": write_fact,
        "search_hits": hits,
        "peak_rss_kb": machine::peak_rss_kb(),
    }))
}

/// The serve child: the gateway over the DeerMem manager and the target's storage on an
/// ephemeral loopback port (token mode, with the internal token that lets the caller name the
/// user), printing the port once it listens, until it is killed.
async fn serve_child(t: &Target) -> Result<Value> {
    let storage = t.storage(true).await?;
    let mgr: Arc<dyn MemoryManager> = Arc::new(workloads::context_manager(storage)?);
    mgr.warm().await;
    let mut config = GatewayConfig::default();
    config.auth.mode = AuthMode::Token;
    config.auth.internal_token = Some(ConfigSecret::new(INTERNAL_TOKEN));
    let state = GatewayState::new(mgr, MemoryConfig::default(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{PORT_MARKER}{}", listener.local_addr()?.port());
    serve(listener, state, std::future::pending::<()>())
        .await
        .context("serving")?;
    Ok(Value::Null)
}

/// Runs `deermem-bench scale-child PHASE` and returns its result line.
fn child(phase: &str, t: &Target, ops: usize) -> Result<Value> {
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let out = Command::new(exe)
        .arg("scale-child")
        .arg(phase)
        .args(t.child_args())
        .args(["--ops", &ops.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting the {phase} child"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("scale phase {phase} failed ({}):\n{stdout}", out.status);
    }
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(crate::runner::RESULT_MARKER))
        .with_context(|| format!("scale phase {phase} printed no result"))?;
    serde_json::from_str(line).with_context(|| format!("scale phase {phase}: bad result"))
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn rss_of(pid: u32) -> (Option<u64>, Option<u64>) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Starts the serve child, measures its readiness, sends `GET /api/memory` for every user and
/// reads its RSS; the child is killed afterwards.
async fn serve_phase(t: &Target) -> Result<Value> {
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let started = Instant::now();
    let mut proc = Command::new(exe)
        .arg("scale-child")
        .arg("serve")
        .args(t.child_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the serve child")?;
    let pid = proc.id();
    let result = async {
        let stdout = proc.stdout.take().context("the child's stdout")?;
        let port: u16 = tokio::task::spawn_blocking(move || -> Result<u16> {
            for line in BufReader::new(stdout).lines() {
                if let Some(p) = line?.strip_prefix(PORT_MARKER) {
                    return Ok(p.trim().parse()?);
                }
            }
            bail!("the serve child exited before listening")
        })
        .await??;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let ready = loop {
            if let Ok(mut c) = Connection::connect(addr).await
                && c.get("/readyz", "").await.is_ok_and(|r| r.status == 200)
            {
                break started.elapsed();
            }
            anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "never ready");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let (rss_ready, _) = rss_of(pid);
        // One request for every user, from four keep-alive connections.
        let clients = 4usize;
        let mut set = tokio::task::JoinSet::new();
        let served_from = Instant::now();
        for c in 0..clients {
            let users = t.users;
            set.spawn(async move {
                let mut conn = Connection::connect(addr).await?;
                let mut done = 0usize;
                for u in (c..users).step_by(clients) {
                    let headers = format!(
                        "x-deerflow-internal-token: {INTERNAL_TOKEN}\r\nx-deerflow-owner-user-id: {}\r\n",
                        user_id(u)
                    );
                    let r = conn.get("/api/memory", &headers).await?;
                    anyhow::ensure!(r.status == 200, "GET /api/memory answered {}", r.status);
                    done += 1;
                }
                anyhow::Ok(done)
            });
        }
        let mut served = 0;
        while let Some(r) = set.join_next().await {
            served += r.context("client task")??;
        }
        let serve_all = served_from.elapsed();
        let (rss, hwm) = rss_of(pid);
        anyhow::Ok(json!({
            "ready_s": ready.as_secs_f64(),
            "rss_kb_ready": rss_ready,
            "users_served": served,
            "serve_all_s": serve_all.as_secs_f64(),
            "rss_kb": rss,
            "peak_rss_kb": hwm,
        }))
    }
    .await;
    let _ = proc.kill();
    let _ = proc.wait();
    result
}

/// Parent mode: every size in turn, its entries, the table and the JSON report.
///
/// # Errors
/// A failed phase, or an unwritable report.
pub fn run(args: &ScaleArgs) -> Result<Value> {
    let base = args.tmpdir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base)
        .with_context(|| format!("creating the --tmpdir {}", base.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let mut entries = Vec::new();
    for &size in &args.sizes {
        let users = size / FACTS_PER_USER;
        let tmp = tempfile::Builder::new()
            .prefix(&format!("deermem-scale-{size}-"))
            .tempdir_in(&base)
            .context("creating the root")?;
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root)?;
        let cluster = match args.store {
            Store::Postgres => Some(
                deermem_testkit::pgcluster::PgCluster::start_durable()
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            ),
            Store::File => None,
        };
        let target = Target {
            store: args.store,
            root,
            pg_url: cluster.as_ref().map(|c| c.url().to_owned()),
            users,
        };
        if let Some(url) = &target.pg_url {
            rt.block_on(workloads::postgres::migrate_url(url))?;
        }
        let mut put = |workload: &str, v: Value| {
            let mut e = json!({"size": size, "users": users, "workload": workload});
            if let (Some(m), Value::Object(v)) = (e.as_object_mut(), v) {
                m.extend(v);
            }
            eprintln!("deermem-bench scale: {size} facts, {workload}: {e}");
            entries.push(e);
        };
        eprintln!("deermem-bench scale: seeding {size} facts ({users} users)");
        put("seed", child("seed", &target, args.ops)?);
        if args.store == Store::File {
            put("rebuild_index", child("rebuild", &target, args.ops)?);
        }
        let measured = child("measure", &target, args.ops)?;
        for w in [
            "search",
            "search_warm",
            "search_from_disk",
            "get_context",
            "load_scope_cold",
            "write_fact",
        ] {
            let mut v = measured[w].clone();
            if v.is_null() {
                // `search_from_disk` where no search read from the disk, or PostgreSQL.
                continue;
            }
            if let Value::Object(m) = &mut v {
                m.insert("child_peak_rss_kb".into(), measured["peak_rss_kb"].clone());
            }
            put(w, v);
        }
        put("serve", rt.block_on(serve_phase(&target))?);
        drop(cluster);
        // The report so far is written before the root is removed (removing a million fact
        // files takes minutes), so an interrupted run keeps every size it finished.
        write_report(&report_of(args, &entries, &base), args)?;
        drop(tmp);
    }
    let report = report_of(args, &entries, &base);
    print!("{}", table(&report));
    Ok(report)
}

fn report_of(args: &ScaleArgs, entries: &[Value], base: &std::path::Path) -> Value {
    json!({
        "store": args.store.name(),
        "facts_per_user": FACTS_PER_USER,
        "entries": entries,
        "machine": machine::describe(base),
    })
}

/// Writes `--json` and `--svg` (when asked for).
fn write_report(report: &Value, args: &ScaleArgs) -> Result<()> {
    if let Some(out) = &args.json {
        let text = serde_json::to_string_pretty(report)?;
        std::fs::write(out, text + "\n").with_context(|| format!("writing {}", out.display()))?;
        eprintln!("deermem-bench scale: wrote {}", out.display());
    }
    if let Some(out) = &args.svg {
        write_chart(report, out)?;
    }
    Ok(())
}

/// Writes the chart of a scale report.
///
/// # Errors
/// An unwritable file.
pub fn write_chart(report: &Value, out: &std::path::Path) -> Result<()> {
    std::fs::write(out, crate::chart::svg(report))
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!("deermem-bench scale: wrote {}", out.display());
    Ok(())
}

/// The report as a table: one line per size and workload.
pub fn table(report: &Value) -> String {
    let mut s = format!(
        "{:>9} {:<16} {:>10} {:>10} {:>10} {:>10}\n",
        "facts", "workload", "p50 us", "p99 us", "seconds", "RSS MiB"
    );
    let num = |v: &Value| v.as_f64().map_or("-".to_owned(), |x| format!("{x:.1}"));
    let mib = |v: &Value| {
        v.as_f64()
            .map_or("-".to_owned(), |kb| format!("{:.1}", kb / 1024.0))
    };
    for e in report["entries"].as_array().into_iter().flatten() {
        let seconds = if e["ready_s"].is_null() {
            &e["seconds"]
        } else {
            &e["ready_s"]
        };
        let rss = if e["rss_kb"].is_null() {
            &e["peak_rss_kb"]
        } else {
            &e["rss_kb"]
        };
        s.push_str(&format!(
            "{:>9} {:<16} {:>10} {:>10} {:>10} {:>10}\n",
            e["size"].as_u64().unwrap_or(0),
            e["workload"].as_str().unwrap_or("?"),
            num(&e["p50_us"]),
            num(&e["p99_us"]),
            num(seconds),
            mib(rss),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn arguments_parse_and_reject_unknowns() {
        let a = ScaleArgs::parse(&strings(&[
            "--sizes",
            "20000,200_000",
            "--store",
            "postgres",
        ]))
        .unwrap();
        assert_eq!(a.sizes, vec![20_000, 200_000]);
        assert_eq!(a.store, Store::Postgres);
        assert_eq!(ScaleArgs::parse(&[]).unwrap().sizes.len(), 3);
        assert!(ScaleArgs::parse(&strings(&["--sizes", "10"])).is_err());
        assert!(ScaleArgs::parse(&strings(&["--sizes", "x"])).is_err());
        assert!(ScaleArgs::parse(&strings(&["--bogus"])).is_err());
        assert!(ScaleArgs::parse(&strings(&["--ops", "0"])).is_err());
    }

    #[test]
    fn a_user_s_facts_are_made_again_identically() {
        let base = Generator::new(corpus::SEED);
        let a = user_facts(&base, 7);
        assert_eq!(a, user_facts(&base, 7));
        assert_ne!(a, user_facts(&base, 8));
        assert_eq!(a.len(), FACTS_PER_USER);
        let now = Timestamp::parse_iso("2026-06-01T00:00:00Z").unwrap();
        let snap = user_snapshot(&base, 7, now).unwrap();
        assert_eq!(snap.bucket, "scale000007");
        assert_eq!(snap.agents[0].facts.len(), FACTS_PER_USER);
        assert_eq!(UserId::new(user_id(7)).unwrap().bucket(), "scale000007");
    }
}
