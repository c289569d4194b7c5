//! The PostgreSQL workloads (`--store postgres`): `write_fact`, `load_scope_cold`,
//! `load_scope_warm` and `search` through `PgStorage`, plus `revision_check` (one
//! `SELECT revision` round trip, what a revision-checked replica cache adds to every read),
//! and `get_context`, `gateway_get`, `gateway_post` as the file store runs them (the DeerMem
//! manager, and the gateway's router on loopback, over `PgStorage`). The storage keeps its
//! cache coherent with read leases (the default); `load_scope_warm_revision_check` and
//! `get_context_revision_check` run the same with `coherence: revision_check`;
//! `write_replicas` and `write_replicas_revision_check` measure what each mode costs writers
//! when three replicas write and read the same user. Each runs against its own throwaway cluster started with the machine's PostgreSQL
//! binaries with durable settings (`fsync`, full-page writes and `synchronous_commit` on), over
//! loopback TCP, and removed afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use deermem_core::ports::MemoryStorageExt;
use deermem_core::prelude::*;
use deermem_core::{AgentName, Scope, UserId};
use deermem_storage_postgres::{Coherence, PgDatabase, PgStorage, PostgresConfig};
use deermem_testkit::pgcluster::PgCluster;

use super::{Env, clock, config, scope_ids, seed_scope};
use crate::corpus;
use crate::stats::{Recorder, WorkloadResult};

/// Every PostgreSQL workload, in the order the report lists them.
pub const NAMES: [&str; 12] = [
    "write_fact",
    "load_scope_cold",
    "load_scope_warm",
    "load_scope_warm_revision_check",
    "search",
    "revision_check",
    "get_context",
    "get_context_revision_check",
    "gateway_get",
    "gateway_post",
    "write_replicas",
    "write_replicas_revision_check",
];

/// A durable throwaway cluster with DeerMem's schema migrated.
struct Db {
    store: PgDatabase,
    // Dropped last: stops the server and removes its directory.
    cluster: PgCluster,
}

impl Db {
    async fn start() -> Result<Self> {
        let cluster = PgCluster::start_durable().map_err(|e| anyhow::anyhow!("{e}"))?;
        let store = connect(&cluster).await?;
        store.migrate().await.context("migrating")?;
        let client = store.client().await.context("a connection")?;
        let sync: String = client
            .query_one("SHOW synchronous_commit", &[])
            .await?
            .get(0);
        let fsync: String = client.query_one("SHOW fsync", &[]).await?.get(0);
        ensure!(
            sync == "on" && fsync == "on",
            "the cluster is not durable: synchronous_commit={sync} fsync={fsync}"
        );
        drop(client);
        Ok(Self { store, cluster })
    }

    fn storage(&self) -> PgStorage {
        storage(self.store.clone())
    }

    /// A storage on a store of its own with `coherence`, its lease listener already
    /// listening in lease mode (so the first loads take leases, as in a running replica).
    async fn storage_with(&self, coherence: Coherence) -> Result<PgStorage> {
        listening(&self.cluster, coherence).await
    }
}

/// A storage on a store of its own with `coherence`; in lease mode its lease listener is
/// started and listening before it is returned.
async fn listening(cluster: &PgCluster, coherence: Coherence) -> Result<PgStorage> {
    let store = connect_with(cluster, coherence).await?;
    let s = storage(store.clone());
    if coherence == Coherence::Lease {
        let nobody = UserId::new("nobody@bench.example")?;
        for _ in 0..1_000 {
            s.load(Some(&nobody), None).await?;
            if store.lease_stats().listens > 0 {
                return Ok(s);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        anyhow::bail!("the lease listener did not start");
    }
    Ok(s)
}

async fn connect(cluster: &PgCluster) -> Result<PgDatabase> {
    connect_with(cluster, Coherence::Lease).await
}

async fn connect_with(cluster: &PgCluster, coherence: Coherence) -> Result<PgDatabase> {
    let mut c = PostgresConfig::new(cluster.url());
    c.pool_size = 4;
    c.coherence = coherence;
    PgDatabase::connect(&c).await.context("connecting")
}

/// A store on the server at `url` (pool of 4, read leases), for the scale run.
///
/// # Errors
/// The server cannot be reached.
pub async fn store_url(url: &str) -> Result<PgDatabase> {
    let mut c = PostgresConfig::new(url);
    c.pool_size = 4;
    PgDatabase::connect(&c).await.context("connecting")
}

/// Migrates DeerMem's schema on the server at `url`.
///
/// # Errors
/// The server cannot be reached or refuses the migration.
pub async fn migrate_url(url: &str) -> Result<()> {
    store_url(url).await?.migrate().await.context("migrating")?;
    Ok(())
}

/// The storage over the server at `url` with the default configuration.
///
/// # Errors
/// The server cannot be reached.
pub async fn open_url(url: &str) -> Result<PgStorage> {
    Ok(storage(store_url(url).await?))
}

fn storage(store: PgDatabase) -> PgStorage {
    let m = config();
    PgStorage::new(
        store,
        clock(),
        m.eviction_access_half_life_days as f64,
        m.eviction_audit_max_entries,
    )
    .with_cache_max_scopes(m.cache_max_scopes)
}

/// Runs one PostgreSQL workload.
///
/// # Errors
/// An unknown name, no PostgreSQL binaries, or the workload's own failure.
pub async fn run(name: &str, env: &Env) -> Result<WorkloadResult> {
    let db = Db::start().await?;
    let r = match name {
        "write_fact" => write_fact(&db, env).await,
        "load_scope_cold" => load_cold(&db, env).await,
        "load_scope_warm" => load_warm(&db, env, Coherence::Lease).await,
        "load_scope_warm_revision_check" => load_warm(&db, env, Coherence::RevisionCheck).await,
        "search" => search(&db, env).await,
        "revision_check" => revision_check(&db, env).await,
        // The file store's workloads, over this storage.
        "get_context" => {
            let s = db.storage_with(Coherence::Lease).await?;
            super::context::run_on(env, Arc::new(s)).await
        }
        "get_context_revision_check" => {
            let s = db.storage_with(Coherence::RevisionCheck).await?;
            super::context::run_on(env, Arc::new(s)).await
        }
        "gateway_get" => super::gateway::get_on(env, Arc::new(db.storage())).await,
        "gateway_post" => super::gateway::post_on(env, Arc::new(db.storage())).await,
        "write_replicas" => write_replicas(&db, env, Coherence::Lease).await,
        "write_replicas_revision_check" => write_replicas(&db, env, Coherence::RevisionCheck).await,
        other => anyhow::bail!(
            "unknown postgres workload {other:?} (known: {})",
            NAMES.join(", ")
        ),
    };
    drop(db.store);
    drop(db.cluster);
    r
}

async fn write_fact(db: &Db, env: &Env) -> Result<WorkloadResult> {
    let storage = db.storage();
    let user = UserId::new("writer@bench.example")?;
    let agent = AgentName::default_bucket();
    let n = env.sizes.write_fact;
    let mut rec = Recorder::start(n);
    for d in env.drafts(n)? {
        let t = Instant::now();
        storage
            .upsert_fact(Some(&user), &agent, d, None, None)
            .await
            .context("create")?;
        rec.push(t.elapsed());
    }
    let doc = storage.load(Some(&user), Some(&agent)).await?;
    ensure!(
        doc.facts.len() == n,
        "{} facts after {n} creates",
        doc.facts.len()
    );
    Ok(rec
        .finish(n, Duration::ZERO)
        .with("revision", doc.revision.into()))
}

async fn seeded(db: &Db, env: &Env) -> Result<(UserId, AgentName)> {
    let user = UserId::new("reader@bench.example")?;
    let agent = AgentName::default_bucket();
    seed_scope(
        &db.storage(),
        &user,
        &agent,
        env.drafts(env.sizes.scope_facts)?,
    )
    .await?;
    Ok((user, agent))
}

/// A new pool per load (connecting, and starting the lease listener, is untimed): the load's
/// statements run on a connection that has never run them, and it takes a read lease.
async fn load_cold(db: &Db, env: &Env) -> Result<WorkloadResult> {
    let (user, agent) = seeded(db, env).await?;
    let n = env.sizes.load_cold;
    let mut untimed = Duration::ZERO;
    let mut rec = Recorder::start(n);
    for _ in 0..n {
        let setup = Instant::now();
        let storage = listening(&db.cluster, Coherence::Lease).await?;
        untimed += setup.elapsed();
        let t = Instant::now();
        let doc = storage.load(Some(&user), Some(&agent)).await?;
        rec.push(t.elapsed());
        ensure!(doc.facts.len() == env.sizes.scope_facts, "short load");
    }
    Ok(rec
        .finish(n, untimed)
        .with("facts_per_scope", env.sizes.scope_facts.into()))
}

/// One storage, loads one after another, the coherent read a replica serves: under a read
/// lease (`coherence: lease`) no statement runs; with `revision_check` every load reads the
/// user's row and serves the cached facts while it is unchanged.
async fn load_warm(db: &Db, env: &Env, coherence: Coherence) -> Result<WorkloadResult> {
    let (user, agent) = seeded(db, env).await?;
    let storage = db.storage_with(coherence).await?;
    storage.load(Some(&user), Some(&agent)).await?;
    let n = env.sizes.load_warm;
    let mut rec = Recorder::start(n);
    for _ in 0..n {
        let t = Instant::now();
        let doc = storage.load(Some(&user), Some(&agent)).await?;
        rec.push(t.elapsed());
        ensure!(doc.facts.len() == env.sizes.scope_facts, "short load");
    }
    Ok(rec
        .finish(n, Duration::ZERO)
        .with("facts_per_scope", env.sizes.scope_facts.into()))
}

/// Top-10 queries, each within one scope, over the whole corpus.
async fn search(db: &Db, env: &Env) -> Result<WorkloadResult> {
    let storage = db.storage();
    let groups = corpus::by_scope(&env.corpus);
    let mut scopes = Vec::new();
    for ((u, a), facts) in &groups {
        let (u, a) = scope_ids(u, a.as_deref())?;
        let drafts = facts.iter().map(|f| f.draft()).collect::<Result<_>>()?;
        seed_scope(&storage, &u, &a, drafts).await?;
        scopes.push(Scope::new(Some(u), Some(a)));
    }
    let run = super::search::run_queries(&storage, env, &scopes, None).await?;
    Ok(run.finish().with("indexed", env.corpus.len().into()))
}

/// The check a revision-validated cache would run before serving a scope: a pooled connection
/// and one prepared `SELECT revision` round trip.
async fn revision_check(db: &Db, env: &Env) -> Result<WorkloadResult> {
    let (user, _) = seeded(db, env).await?;
    let n = env.sizes.load_warm;
    let sql = "SELECT revision FROM users WHERE bucket = $1";
    let mut rec = Recorder::start(n);
    let mut last = 0i64;
    for _ in 0..n {
        let t = Instant::now();
        let client = db.store.client().await.context("a connection")?;
        let stmt = client.prepare_cached(sql).await?;
        last = client.query_one(&stmt, &[&user.bucket()]).await?.get(0);
        drop(client);
        rec.push(t.elapsed());
    }
    ensure!(last >= 1, "the seeded user has a revision");
    Ok(rec.finish(n, Duration::ZERO))
}

/// Three replicas (each a store and pool of its own, as three `deermem serve` processes) and 8
/// writers on one user: writer `i` goes through replica `i % 3` and, as a gateway answering a
/// create with the document does, loads the user after each create. Under read leases every
/// load takes a lease that the next create through another replica must revoke (a round trip
/// to the holder); under `revision_check` a load reads the user's row instead. `ops_per_sec` is
/// creates per second; every create must be stored, and none may surface a conflict.
async fn write_replicas(db: &Db, env: &Env, coherence: Coherence) -> Result<WorkloadResult> {
    const REPLICAS: usize = 3;
    const WRITERS: usize = 8;
    let mut replicas = Vec::with_capacity(REPLICAS);
    for _ in 0..REPLICAS {
        replicas.push(Arc::new(db.storage_with(coherence).await?));
    }
    let user = UserId::new("replicas@bench.example")?;
    let agent = AgentName::default_bucket();
    let n = env.sizes.write_fact.max(WRITERS);
    let per = n.div_ceil(WRITERS);
    let mut drafts = env.drafts(n)?;
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let take = per.min(drafts.len());
        let mine: Vec<_> = drafts.drain(..take).collect();
        let storage = Arc::clone(&replicas[w % REPLICAS]);
        let (user, agent) = (user.clone(), agent.clone());
        set.spawn(async move {
            let mut samples = Vec::with_capacity(mine.len());
            for d in mine {
                let t = Instant::now();
                storage
                    .upsert_fact(Some(&user), &agent, d, None, None)
                    .await
                    .context("create")?;
                samples.push(t.elapsed());
                storage
                    .load(Some(&user), Some(&agent))
                    .await
                    .context("load")?;
            }
            anyhow::Ok(samples)
        });
    }
    let mut rec = Recorder::start(n);
    while let Some(r) = set.join_next().await {
        for s in r.context("writer task")?? {
            rec.push(s);
        }
    }
    let elapsed = started.elapsed();
    let doc = replicas[0].reload(Some(&user), Some(&agent)).await?;
    ensure!(
        doc.facts.len() == n,
        "{} facts after {n} acknowledged creates",
        doc.facts.len()
    );
    let mut r = rec.finish(n, Duration::ZERO);
    r.elapsed = elapsed;
    Ok(r.with("replicas", REPLICAS.into())
        .with("writers", WRITERS.into())
        .with(
            "coherence",
            match coherence {
                Coherence::Lease => "lease",
                Coherence::RevisionCheck => "revision_check",
            }
            .into(),
        ))
}
