//! The named workloads. Each runs on a fresh temporary root with the default (durable)
//! configuration, through the real crates in-process, and returns what it measured.

mod context;
pub mod embed;
mod floor;
mod gateway;
mod load;
mod migrate;
pub mod postgres;
mod search;
mod timed;
mod update;
mod write;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use deermem::SystemClock;
use deermem_core::ports::{Clock, MemoryStorage};
use deermem_core::{AgentName, ApplyOptions, ChangeSet, FactDraft, UserId};
use deermem_storage_file::FileStorage;
use deermem_updater::DeerMemConfig;

use crate::corpus::{self, CorpusFact};
use crate::sizes::Sizes;
use crate::stats::WorkloadResult;

/// Every workload, in the order the report lists them.
pub const NAMES: [&str; 17] = [
    "fsync_floor",
    "write_fact",
    "write_fact_parallel",
    "write_fact_one_user",
    "load_scope_cold",
    "load_scope_warm",
    "search",
    "rebuild_index",
    "embed_local",
    "search_hybrid",
    "get_context",
    "count_long_fact",
    "apply_update",
    "migrate_v1",
    "gateway_get",
    "gateway_post",
    "turn_accept",
];

/// Which storage the workloads measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The file storage with its FTS5 index (every workload).
    File,
    /// PostgreSQL on a throwaway durable cluster ([`postgres::NAMES`]).
    Postgres,
}

impl Store {
    /// Parses `file` or `postgres`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "file" => Some(Self::File),
            "postgres" => Some(Self::Postgres),
            _ => None,
        }
    }

    /// The name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Postgres => "postgres",
        }
    }

    /// The workloads of this store, in report order.
    pub fn workloads(self) -> &'static [&'static str] {
        match self {
            Self::File => &NAMES,
            Self::Postgres => &postgres::NAMES,
        }
    }
}

/// What a workload runs on.
#[derive(Debug)]
pub struct Env {
    /// The sizes.
    pub sizes: Sizes,
    /// The corpus (from `--corpus`, or generated).
    pub corpus: Vec<CorpusFact>,
    /// Queries from `--queries`, if given (otherwise generated from the corpus).
    pub queries: Option<Vec<String>>,
    /// The fresh root of this workload.
    pub root: PathBuf,
}

impl Env {
    /// An environment on `root`, loading or generating the corpus.
    ///
    /// # Errors
    /// Unreadable corpus or query files.
    pub fn new(
        sizes: Sizes,
        corpus_file: Option<&Path>,
        queries_file: Option<&Path>,
        root: PathBuf,
    ) -> Result<Self> {
        let corpus = match corpus_file {
            Some(p) => corpus::load_corpus(p)?,
            None => corpus::generate_corpus(sizes.corpus_facts, sizes.corpus_scopes, corpus::SEED),
        };
        let queries = queries_file.map(corpus::load_queries).transpose()?;
        Ok(Self {
            sizes,
            corpus,
            queries,
            root,
        })
    }

    /// The queries of the search workload.
    pub fn queries(&self) -> Vec<String> {
        match &self.queries {
            Some(q) => q.clone(),
            None => corpus::generate_queries(&self.corpus, self.sizes.queries, corpus::SEED),
        }
    }

    /// `n` corpus facts (cycled) as drafts for a single scope.
    ///
    /// # Errors
    /// A corpus fact no draft can be made of.
    pub fn drafts(&self, n: usize) -> Result<Vec<FactDraft>> {
        (0..n)
            .map(|i| {
                let f = &self.corpus[i % self.corpus.len()];
                let d = f.draft()?;
                if i >= self.corpus.len() {
                    // Cycled facts get a distinct text so none is a duplicate.
                    return Ok(d.with_content(&format!("{} (copy {})", f.content, i))?);
                }
                Ok(d)
            })
            .collect()
    }
}

/// Runs one named workload of `store`.
///
/// # Errors
/// An unknown name, or the workload's own failure.
pub fn run(name: &str, env: &Env, store: Store) -> Result<WorkloadResult> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, usize::from))
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    if store == Store::Postgres {
        return rt.block_on(postgres::run(name, env));
    }
    rt.block_on(async {
        match name {
            "fsync_floor" => floor::run(env),
            "write_fact" => write::sequential(env).await,
            "write_fact_parallel" => write::parallel(env).await,
            "write_fact_one_user" => write::one_user(env).await,
            "load_scope_cold" => load::cold(env).await,
            "load_scope_warm" => load::warm(env).await,
            "search" => search::search(env).await,
            "rebuild_index" => search::rebuild(env).await,
            "embed_local" => embed::embed_local(env).await,
            "search_hybrid" => embed::search_hybrid(env).await,
            "get_context" => context::run(env).await,
            "count_long_fact" => context::long_fact(env),
            "apply_update" => update::run(env).await,
            "migrate_v1" => migrate::run(env).await,
            "gateway_get" => gateway::run(env).await,
            "gateway_post" => gateway::post(env).await,
            "turn_accept" => gateway::turn_accept(env).await,
            other => bail!("unknown workload {other:?} (known: {})", NAMES.join(", ")),
        }
    })
}

/// The real clock.
pub(crate) fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// The default DeerMem configuration (durable file storage, FTS5 index, tiktoken counting).
pub(crate) fn config() -> DeerMemConfig {
    DeerMemConfig::default()
}

/// Opens the file storage on `root` as the embedded engine does (for the scale run).
///
/// # Errors
/// The storage refuses to open.
pub fn open_root(root: &Path, with_retrieval: bool) -> Result<FileStorage> {
    open(root, with_retrieval)
}

/// The DeerMem manager over `storage` with the default configuration (for the scale run).
///
/// # Errors
/// The manager refuses its parts.
pub fn context_manager(storage: Arc<dyn MemoryStorage>) -> Result<deermem_engine::DeerMemManager> {
    context::manager(storage)
}

/// Opens the file storage on `root` as the embedded engine does.
pub(crate) fn open(root: &Path, with_retrieval: bool) -> Result<FileStorage> {
    deermem::embedded::open_storage(&config(), root.to_path_buf(), clock(), with_retrieval)
        .context("opening the file storage")
}

/// The parsed scope of a corpus key.
pub(crate) fn scope_ids(user: &str, agent: Option<&str>) -> Result<(UserId, AgentName)> {
    let u = UserId::new(user).with_context(|| format!("corpus user id {user:?}"))?;
    let a = AgentName::resolve(agent).with_context(|| format!("corpus agent {agent:?}"))?;
    Ok((u, a))
}

/// Writes facts into one scope in commits of at most 100 facts.
pub(crate) async fn seed_scope(
    storage: &dyn MemoryStorage,
    user: &UserId,
    agent: &AgentName,
    drafts: Vec<FactDraft>,
) -> Result<()> {
    let mut drafts = drafts;
    while !drafts.is_empty() {
        let rest = drafts.split_off(drafts.len().min(100));
        let batch = std::mem::replace(&mut drafts, rest);
        storage
            .apply_changes(
                Some(user),
                Some(agent),
                ChangeSet {
                    upserts: batch,
                    ..ChangeSet::default()
                },
                ApplyOptions::default(),
            )
            .await
            .context("seeding a scope")?;
    }
    Ok(())
}

/// Flushes every dirty page and inode of the machine to disk (`sync(2)`), so a measured phase
/// does not share the disk and the CPU with the kernel writing back what the setup (or an
/// earlier workload) left dirty. Called after seeding and before each workload.
pub fn quiesce() {
    #[cfg(unix)]
    rustix::fs::sync();
}

/// [`quiesce`], then asks the kernel to drop its clean page cache (root only; `false` when it
/// could not). Called before each workload so every one starts from the same disk state: on a
/// filesystem without a journal, ext4 skips inodes freed in the last minute (longer while
/// their inode table block is cached dirty) when it allocates a new one, so the files an earlier
/// workload deleted would otherwise slow every file the next one creates.
pub fn fresh_disk_state() -> bool {
    quiesce();
    std::fs::write("/proc/sys/vm/drop_caches", b"1").is_ok()
}

/// Waits until a freshly written manifest is older than the storage's time-stamp granularity
/// window (at most 2 s), so reads measure the steady state of a memory read long after its last
/// write (the cache is then validated by `stat` alone; inside the window the storage re-reads
/// the manifest).
pub(crate) async fn settle() {
    quiesce();
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
}

/// Writes the whole corpus into `storage`, eight scopes at a time.
pub(crate) async fn seed_corpus(storage: &FileStorage, env: &Env) -> Result<usize> {
    let groups = corpus::by_scope(&env.corpus);
    let mut jobs = Vec::new();
    for ((user, agent), facts) in groups {
        let (u, a) = scope_ids(&user, agent.as_deref())?;
        let drafts: Vec<_> = facts.iter().map(|f| f.draft()).collect::<Result<_>>()?;
        jobs.push((u, a, drafts));
    }
    let scopes = jobs.len();
    let mut pending = jobs.into_iter();
    loop {
        let mut set = tokio::task::JoinSet::new();
        for (u, a, drafts) in pending.by_ref().take(8) {
            let s = storage.clone();
            set.spawn(async move { seed_scope(&s, &u, &a, drafts).await });
        }
        if set.is_empty() {
            break;
        }
        while let Some(r) = set.join_next().await {
            r.context("seeding task")??;
        }
    }
    quiesce();
    Ok(scopes)
}
