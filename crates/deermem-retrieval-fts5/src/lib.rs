//! DeerMem retrieval adapter: a derived SQLite FTS5/BM25 index with CJK n-gram search.
//!
//! [`Fts5Retrieval`] implements [`deermem_core::ports::Retrieval`] (and
//! [`deermem_core::ports::VectorIndex`]: embeddings in a `vectors` table of the same file, see
//! the schema in `engine`) over a SQLite database
//! (rusqlite with the bundled SQLite, so FTS5 is always there), either on disk at
//! `{root}/.retrieval/deermem-fts5-v1.sqlite3` or in memory.
//!
//! - **Ranking** is the reference's: `-bm25` with SQLite's defaults, a
//!   30-day grace then `exp(-0.01 * (days - 30))` decay on `createdAt`, `+ 0.2 * confidence`,
//!   `4 * top_k` candidates per scope, category filter before the cut, stable ordering.
//! - **Queries** are sanitised like the reference: valid FTS5 syntax passes through,
//!   anything else becomes a quoted OR of its words, and a syntax error retries as words.
//! - **CJK**: runs of Han, kana or Hangul are indexed as overlapping bigrams in a second column,
//!   so `乌龙茶`, `東京` or `住んでいる` find the facts that contain them (the reference's
//!   `unicode61` makes a whole run one token and finds nothing). With the `zh` feature, Chinese
//!   query runs are segmented with jieba.
//! - **Scopes** own disjoint rowid ranges, so a search reads only its scope's postings, and
//!   live in one of 128 FTS5 tables chosen by scope: BM25's term statistics (IDF, average
//!   length) cover that shard, not every tenant (see `docs/compat.md`, section "Retrieval").
//! - **Robustness**: a corrupt or foreign file is deleted and recreated once at open (a busy,
//!   unreadable or unwritable one is left alone and reported `Unavailable`); a
//!   corrupt file found later is recreated by the next full rebuild; rows that fail to decode
//!   are logged and skipped; no query text is an error.
//! - **Concurrency**: one writer connection behind a mutex and a small pool of reader
//!   connections (WAL: readers see the last committed snapshot while a rebuild runs). SQLite
//!   work runs on tokio's blocking pool.
//!
//! The file name differs from the reference's `memory-fts5.sqlite3` on purpose: the schema
//! differs (scope ranges, CJK column), and a Python process sharing the root must not break.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

mod engine;
pub mod query;
// The FTS5 auxiliary-function interface has no safe wrapper in rusqlite: the one module that
// calls SQLite's C API directly.
#[allow(unsafe_code)]
mod tf;
mod vector_cache;
#[cfg(feature = "zh")]
pub mod zh;

/// CJK runs and their bigrams: the core's shared text rule.
pub use deermem_core::policy::text::cjk;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use deermem_core::policy::fusion::nearest_calibrated_indexed;
use deermem_core::policy::language::{ScriptGroup, script_group};
use deermem_core::ports::{
    Clock, EmbedTask, MeaningHit, MeaningQuery, MeaningRanking, Retrieval, VectorIndex, WordHit,
};
use deermem_core::{
    CacheBound, Fact, IndexedDoc, RetrievalError, RetrievalStats, Scope, SearchHit, SearchQuery,
};
use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;

pub use engine::SCHEMA_VERSION;
use engine::{FailureKind, Row, ScopeKeyText, WriteError, Writer};
use query::Segmenter;
use vector_cache::{ScopeVectors, VectorCache};

pub use engine::{MMAP_BYTES, PAGE_CACHE_BYTES};

/// The most memory the index's connections take: the writer and at most `max_idle_readers`
/// pooled readers (the defaults: 5 connections), each with its page cache and mapped window.
pub fn memory_bound_bytes(options: &Fts5Options) -> u64 {
    (options.max_idle_readers as u64 + 1) * (PAGE_CACHE_BYTES + MMAP_BYTES)
}

/// The name the connections' SQLite page caches are reported under (bytes, all connections).
pub const PAGE_CACHE_NAME: &str = "fts5.page_cache";
/// The name the connections' memory-mapped windows are reported under (bytes, all connections).
pub const MMAP_NAME: &str = "fts5.mmap";
/// The name the decoded-fact cache is reported under (entries).
pub const DECODED_CACHE_NAME: &str = "fts5.decoded_facts";

/// The bounds of an on-disk index's caches with these options (see [`Retrieval::cache_bounds`]):
/// the page caches and mapped windows of the writer and at most `max_idle_readers` pooled
/// readers (together [`memory_bound_bytes`]), the decoded facts and the decoded scope
/// vectors; `decoded` is how many decoded facts are held now and `vector_bytes` how many bytes
/// of vectors, when known.
pub fn cache_bounds(
    options: &Fts5Options,
    decoded: Option<usize>,
    vector_bytes: Option<usize>,
) -> Vec<CacheBound> {
    let connections = options.max_idle_readers as u64 + 1;
    vec![
        CacheBound::bytes(PAGE_CACHE_NAME, connections * PAGE_CACHE_BYTES, None),
        CacheBound::bytes(MMAP_NAME, connections * MMAP_BYTES, None),
        CacheBound::entries(DECODED_CACHE_NAME, DECODED_CACHE, decoded),
        vector_bound(vector_bytes),
    ]
}

fn vector_bound(held: Option<usize>) -> CacheBound {
    CacheBound::bytes(
        VECTOR_CACHE_NAME,
        VECTOR_CACHE_BYTES as u64,
        held.map(|b| b as u64),
    )
}

/// The adapter kind reported by [`Retrieval::kind`].
pub const KIND: &str = "fts5";
/// The folder under the storage root that holds derived search data.
pub const INDEX_DIR: &str = ".retrieval";
/// The index file name inside [`INDEX_DIR`].
pub const INDEX_FILE_NAME: &str = "deermem-fts5-v1.sqlite3";

/// Tuning knobs; the defaults suit every caller.
#[derive(Clone, Debug)]
pub struct Fts5Options {
    /// How long SQLite waits for a lock held by another connection or process.
    pub busy_timeout_ms: u64,
    /// Idle reader connections kept open (file indexes only).
    pub max_idle_readers: usize,
}

impl Default for Fts5Options {
    fn default() -> Self {
        Self {
            busy_timeout_ms: 30_000,
            max_idle_readers: 4,
        }
    }
}

/// Where the index lives.
#[derive(Clone, Debug)]
enum Location {
    Memory,
    File(PathBuf),
}

struct State {
    writer: Option<Connection>,
}

/// A single-document write waiting for the writer connection.
enum WriteOp {
    Upsert(Row),
    Remove(ScopeKeyText, String),
}

impl WriteOp {
    fn apply(&self, w: &mut Writer<'_>) -> Result<(), WriteError> {
        match self {
            Self::Upsert(row) => w.upsert(row),
            Self::Remove(scope, id) => w.remove(scope, id),
        }
    }
}

/// Single-document writes accepted but not applied yet, and whether an applier is scheduled.
#[derive(Default)]
struct Pending {
    ops: Vec<(WriteOp, Scope)>,
    applier: bool,
    /// A scheduled applier is waiting for more writes ([`Inner::gather`]).
    gathering: bool,
}

struct Inner {
    location: Location,
    options: Fts5Options,
    clock: Arc<dyn Clock>,
    segmenter: Box<dyn Segmenter>,
    state: Mutex<State>,
    /// Single-document writes acknowledged to their callers and applied by a background
    /// applier, or by the next search, stats, clear, rebuild or close, whichever takes the
    /// writer first; each holder applies all of them in one transaction (write-behind with
    /// group commit).
    pending: Mutex<Pending>,
    /// Wakes a gathering applier early: the batch is full or the index is closing.
    gathered: Condvar,
    /// [`GATHER_WINDOW`] (tests set longer ones).
    gather_window: std::time::Duration,
    /// Scopes of accepted writes that failed to apply, until the storage takes them.
    stale: Mutex<Vec<Scope>>,
    /// Transactions committed by [`Inner::apply_pending`] (tests check the sharing).
    shared_commits: AtomicU64,
    readers: Mutex<Vec<(u64, Connection)>>,
    generation: AtomicU64,
    closed: AtomicBool,
    corrupt: AtomicBool,
    last_error: Mutex<Option<String>>,
    /// Decoded facts by document id, checked against the stored JSON before use (a document
    /// id is reused only after its scope was emptied, and then with different JSON).
    decoded: Mutex<lru::LruCache<i64, Arc<(String, Fact)>>>,
    /// Decoded vectors of recently ranked scopes ([`VectorCache`]).
    vectors: Mutex<VectorCache>,
}

/// How long a background applier waits for more writes before its first transaction. Nothing
/// waits for it (searches, stats, clear, rebuild and close apply pending writes themselves, and
/// closing wakes it), so it trades index CPU for nothing visible: at ~400 creates/s one after
/// another, 20 ms gathers ~8 writes per transaction, and the FTS5 work per create fell to about
/// a quarter in `write_fact` profiles. Writes still pending when the process dies are covered
/// as any crash between a commit and its notification is: the manager rebuilds each scope from
/// the files before its first search.
const GATHER_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);
/// A batch this large is applied without waiting out the window.
const GATHER_MAX: usize = 256;

/// Decoded facts kept in memory.
const DECODED_CACHE: usize = 4096;
/// Bytes of decoded scope vectors kept in memory (`fts5.scope_vectors`): about 20,000 vectors of
/// 384 dimensions.
pub const VECTOR_CACHE_BYTES: usize = 32 * 1024 * 1024;
/// The name the decoded scope vectors are reported under (bytes).
pub const VECTOR_CACHE_NAME: &str = "fts5.scope_vectors";
/// Larger facts are decoded every time rather than cached (bounds the cache's memory).
const DECODED_CACHE_MAX_JSON: usize = 16 * 1024;

/// The SQLite FTS5 retrieval adapter. Cheap to clone; clones share the index.
#[derive(Clone)]
pub struct Fts5Retrieval {
    inner: Arc<Inner>,
}

impl fmt::Debug for Fts5Retrieval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fts5Retrieval")
            .field("location", &self.inner.location)
            .field("closed", &self.inner.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn closed_error() -> RetrievalError {
    RetrievalError::Unavailable("the FTS5 index is closed".into())
}

fn default_segmenter() -> Box<dyn Segmenter> {
    #[cfg(feature = "zh")]
    {
        Box::new(zh::JiebaSegmenter)
    }
    #[cfg(not(feature = "zh"))]
    {
        Box::new(query::NoSegmenter)
    }
}

fn db_side_files(path: &Path) -> [PathBuf; 3] {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    [path.to_path_buf(), PathBuf::from(wal), PathBuf::from(shm)]
}

fn remove_db_files(path: &Path) {
    for p in db_side_files(path) {
        match std::fs::remove_file(&p) {
            Ok(()) => tracing::info!(path = %p.display(), "removed unusable index file"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %p.display(), error = %e, "cannot remove index file"),
        }
    }
}

fn open_writer(location: &Location, options: &Fts5Options) -> rusqlite::Result<Connection> {
    let conn = match location {
        Location::Memory => Connection::open_in_memory()?,
        Location::File(path) => Connection::open(path)?,
    };
    engine::configure(&conn, true, options.busy_timeout_ms)?;
    if engine::init_schema(&conn)? {
        tracing::warn!("FTS5 index had an incompatible schema; it was emptied");
    }
    Ok(conn)
}

impl Fts5Retrieval {
    /// The index file for a storage root: `{root}/.retrieval/deermem-fts5-v1.sqlite3`.
    pub fn index_path(root: &Path) -> PathBuf {
        root.join(INDEX_DIR).join(INDEX_FILE_NAME)
    }

    /// Opens (creating the folder and file if needed) the index of a storage root.
    ///
    /// # Errors
    /// `Unavailable` when the folder cannot be created or the file cannot be opened even after
    /// deleting it; the storage then falls back to substring search.
    pub fn open(root: &Path, clock: Arc<dyn Clock>) -> Result<Self, RetrievalError> {
        Self::open_file(&Self::index_path(root), clock, Fts5Options::default())
    }

    /// Opens an index file at an explicit path. A file SQLite reports as corrupt or not a
    /// database is deleted (with its `-wal` and `-shm`) and recreated once; any other failure
    /// (a lock held by another process past the busy timeout, permissions, a full disk, I/O)
    /// leaves the file untouched.
    ///
    /// # Errors
    /// `Unavailable` when the parent folder cannot be created, the file cannot be opened for
    /// a reason other than corruption, or the retry after deleting a corrupt file fails too.
    pub fn open_file(
        path: &Path,
        clock: Arc<dyn Clock>,
        options: Fts5Options,
    ) -> Result<Self, RetrievalError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                RetrievalError::Unavailable(format!(
                    "cannot create index folder {}: {e}",
                    parent.display()
                ))
            })?;
        }
        let location = Location::File(path.to_path_buf());
        let writer = match open_writer(&location, &options) {
            Ok(c) => c,
            // Only a file SQLite calls corrupt or foreign is replaced. A lock held too long by
            // another process, a permission, a full disk or an I/O error says nothing about
            // the file, which may be a live index another process is using: it is left alone
            // and the storage falls back to substring search until the next open.
            Err(first) if engine::classify(&first) != engine::FailureKind::Corrupt => {
                return Err(RetrievalError::Unavailable(format!(
                    "index {} cannot be opened: {first}",
                    path.display()
                )));
            }
            Err(first) => {
                tracing::warn!(path = %path.display(), error = %first,
                    "FTS5 index unusable; deleting and recreating it");
                remove_db_files(path);
                open_writer(&location, &options).map_err(|e| {
                    RetrievalError::Unavailable(format!(
                        "index {} is unusable ({first}) and could not be recreated: {e}",
                        path.display()
                    ))
                })?
            }
        };
        Ok(Self::from_parts(location, options, clock, writer))
    }

    /// An index that lives in memory only (nothing is written to disk).
    ///
    /// # Errors
    /// `Unavailable` when SQLite cannot create the database.
    pub fn in_memory(clock: Arc<dyn Clock>) -> Result<Self, RetrievalError> {
        let options = Fts5Options::default();
        let writer = open_writer(&Location::Memory, &options).map_err(|e| {
            RetrievalError::Unavailable(format!("cannot create in-memory index: {e}"))
        })?;
        Ok(Self::from_parts(Location::Memory, options, clock, writer))
    }

    fn from_parts(
        location: Location,
        options: Fts5Options,
        clock: Arc<dyn Clock>,
        writer: Connection,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                location,
                options,
                clock,
                segmenter: default_segmenter(),
                state: Mutex::new(State {
                    writer: Some(writer),
                }),
                pending: Mutex::new(Pending::default()),
                gathered: Condvar::new(),
                gather_window: GATHER_WINDOW,
                stale: Mutex::new(Vec::new()),
                shared_commits: AtomicU64::new(0),
                readers: Mutex::new(Vec::new()),
                generation: AtomicU64::new(0),
                closed: AtomicBool::new(false),
                corrupt: AtomicBool::new(false),
                last_error: Mutex::new(None),
                decoded: Mutex::new(lru::LruCache::new(
                    std::num::NonZeroUsize::new(DECODED_CACHE)
                        .unwrap_or(std::num::NonZeroUsize::MIN),
                )),
                vectors: Mutex::new(VectorCache::new(VECTOR_CACHE_BYTES)),
            }),
        }
    }

    /// The index file, when on disk.
    pub fn path(&self) -> Option<&Path> {
        match &self.inner.location {
            Location::File(p) => Some(p),
            Location::Memory => None,
        }
    }

    /// Searches on the calling thread (for callers outside an async runtime, and benchmarks).
    ///
    /// # Errors
    /// As [`Retrieval::search`].
    pub fn search_blocking(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        self.inner.search(query)
    }

    /// The last error the index saw (also reported by `stats`), readable even when the index
    /// is too damaged to answer `stats`.
    pub fn last_error(&self) -> Option<String> {
        self.inner.last_error.lock().clone()
    }

    /// Runs `f` on tokio's blocking pool when a runtime is present, inline otherwise.
    async fn blocking<T, F>(&self, f: F) -> Result<T, RetrievalError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, RetrievalError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle
                .spawn_blocking(move || f(&inner))
                .await
                .map_err(|e| RetrievalError::Backend(format!("index task failed: {e}")))?,
            Err(_) => f(&inner),
        }
    }
}

/// A read transaction with cached `BEGIN`/`COMMIT` statements, ended on drop.
struct ReadTx<'c>(&'c Connection);

impl<'c> ReadTx<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        conn.prepare_cached("BEGIN")?.execute([])?;
        Ok(Self(conn))
    }
}

impl Drop for ReadTx<'_> {
    fn drop(&mut self) {
        if let Ok(mut commit) = self.0.prepare_cached("COMMIT") {
            let _ = commit.execute([]);
        }
        if !self.0.is_autocommit() {
            let _ = self.0.execute_batch("ROLLBACK");
        }
    }
}

/// A reader connection checked out of the pool; returned on drop.
struct ReaderGuard<'a> {
    inner: &'a Inner,
    conn: Option<Connection>,
    generation: u64,
}

impl Drop for ReaderGuard<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && !self.inner.closed.load(Ordering::Acquire)
            && self.generation == self.inner.generation.load(Ordering::Acquire)
        {
            let mut idle = self.inner.readers.lock();
            if idle.len() < self.inner.options.max_idle_readers {
                idle.push((self.generation, conn));
            }
        }
    }
}

impl Inner {
    fn ensure_open(&self) -> Result<(), RetrievalError> {
        if self.closed.load(Ordering::Acquire) {
            Err(closed_error())
        } else {
            Ok(())
        }
    }

    fn record(&self, e: RetrievalError) -> RetrievalError {
        tracing::warn!(error = %e, "FTS5 index error");
        *self.last_error.lock() = Some(e.to_string());
        e
    }

    fn record_sqlite(&self, e: &rusqlite::Error) -> RetrievalError {
        if engine::classify(e) == FailureKind::Corrupt {
            self.corrupt.store(true, Ordering::Release);
        }
        self.record(engine::to_retrieval_error(e))
    }

    fn with_writer<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, WriteError>,
    ) -> Result<T, RetrievalError> {
        self.ensure_open()?;
        let mut state = self.state.lock();
        self.apply_pending(&mut state);
        let conn = state.writer.as_mut().ok_or_else(closed_error)?;
        f(conn).map_err(|e| self.write_error(e))
    }

    fn checkout(&self, path: &Path) -> Result<ReaderGuard<'_>, RetrievalError> {
        let generation = self.generation.load(Ordering::Acquire);
        let pooled = {
            let mut idle = self.readers.lock();
            idle.retain(|(g, _)| *g == generation);
            idle.pop()
        };
        let conn = match pooled {
            Some((_, c)) => c,
            None => {
                let c = Connection::open(path).map_err(|e| self.record_sqlite(&e))?;
                engine::configure(&c, false, self.options.busy_timeout_ms)
                    .map_err(|e| self.record_sqlite(&e))?;
                c
            }
        };
        Ok(ReaderGuard {
            inner: self,
            conn: Some(conn),
            generation,
        })
    }

    /// Runs `f` on a reader connection, after the writes accepted so far are applied.
    fn with_reader<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, RetrievalError> {
        self.ensure_open()?;
        self.settle();
        match &self.location {
            Location::Memory => {
                let state = self.state.lock();
                let conn = state.writer.as_ref().ok_or_else(closed_error)?;
                f(conn).map_err(|e| self.record_sqlite(&e))
            }
            Location::File(path) => {
                let guard = self.checkout(path)?;
                let conn = guard.conn.as_ref().ok_or_else(closed_error)?;
                f(conn).map_err(|e| self.record_sqlite(&e))
            }
        }
    }

    /// Deletes and recreates the database (after corruption was seen).
    fn recreate(&self) -> Result<(), RetrievalError> {
        self.ensure_open()?;
        let mut state = self.state.lock();
        state.writer = None;
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.readers.lock().clear();
        self.vectors.lock().clear();
        if let Location::File(path) = &self.location {
            remove_db_files(path);
        }
        let conn = open_writer(&self.location, &self.options).map_err(|e| {
            self.record(RetrievalError::Unavailable(format!(
                "cannot recreate the FTS5 index: {e}"
            )))
        })?;
        state.writer = Some(conn);
        self.corrupt.store(false, Ordering::Release);
        tracing::warn!("FTS5 index recreated after corruption");
        Ok(())
    }

    fn write_error(&self, e: WriteError) -> RetrievalError {
        match e {
            WriteError::Sqlite(e) => self.record_sqlite(&e),
            WriteError::Limit(m) => self.record(RetrievalError::Backend(m)),
        }
    }

    /// Accepts one single-document write and returns: it is applied by an applier on the
    /// blocking pool (inline without a runtime), together with every write accepted meanwhile,
    /// in one transaction. Every later search, stats, clear, rebuild or close applies what is
    /// still pending before it reads or writes, so an acknowledged write is always seen.
    fn enqueue(self: &Arc<Self>, op: WriteOp, scope: Scope) -> Result<(), RetrievalError> {
        self.ensure_open()?;
        let start = {
            let mut p = self.pending.lock();
            p.ops.push((op, scope));
            if p.ops.len() == GATHER_MAX {
                self.gathered.notify_all();
            }
            !std::mem::replace(&mut p.applier, true)
        };
        if start {
            let inner = Arc::clone(self);
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn_blocking(move || {
                        inner.gather();
                        inner.run_applier();
                    });
                }
                Err(_) => inner.run_applier(),
            }
        }
        Ok(())
    }

    /// Lets the writes that follow join the first transaction of a background applier (one
    /// FTS5 segment flush and WAL commit for all of them instead of one each): waits up to
    /// [`GATHER_WINDOW`], less when [`GATHER_MAX`] writes are queued or the index closes.
    fn gather(&self) {
        let deadline = std::time::Instant::now() + self.gather_window;
        let mut p = self.pending.lock();
        p.gathering = true;
        while p.ops.len() < GATHER_MAX && !self.closed.load(Ordering::Acquire) {
            if self.gathered.wait_until(&mut p, deadline).timed_out() {
                break;
            }
        }
        p.gathering = false;
    }

    /// Applies pending writes until none is left, then stands down.
    fn run_applier(&self) {
        loop {
            {
                let mut state = self.state.lock();
                self.apply_pending(&mut state);
            }
            let mut p = self.pending.lock();
            if p.ops.is_empty() {
                p.applier = false;
                return;
            }
        }
    }

    /// Applies every pending write in one transaction; when it fails, each write is retried
    /// alone. The scope of a write that cannot be applied (or finds the index closed) is kept
    /// for [`Retrieval::take_stale_scopes`]. The caller holds `state`.
    fn apply_pending(&self, state: &mut State) {
        let batch = std::mem::take(&mut self.pending.lock().ops);
        if batch.is_empty() {
            return;
        }
        let Some(conn) = state.writer.as_mut() else {
            self.stale.lock().extend(batch.into_iter().map(|(_, s)| s));
            return;
        };
        let run = |conn: &mut Connection, ops: &[(WriteOp, Scope)]| {
            let mut w = Writer::begin(conn)?;
            for (op, _) in ops {
                op.apply(&mut w)?;
            }
            w.finish()
        };
        match run(conn, &batch) {
            Ok(()) => {
                self.shared_commits.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if batch.len() == 1 => {
                let _ = self.write_error(e);
                self.stale.lock().extend(batch.into_iter().map(|(_, s)| s));
            }
            Err(_) => {
                for one in batch.chunks(1) {
                    if let Err(e) = run(conn, one) {
                        let _ = self.write_error(e);
                        self.stale.lock().extend(one.iter().map(|(_, s)| s.clone()));
                    }
                }
            }
        }
    }

    /// Waits until every write accepted before the call is applied: a running applier holds
    /// the writer until its transaction ends, and what is still queued is applied here.
    fn settle(&self) {
        let busy = {
            let p = self.pending.lock();
            !p.ops.is_empty() || p.applier
        };
        if busy {
            let mut state = self.state.lock();
            self.apply_pending(&mut state);
        }
    }

    fn clear(&self, scopes: Option<&[ScopeKeyText]>) -> Result<(), RetrievalError> {
        if scopes.is_none() && self.corrupt.load(Ordering::Acquire) {
            return self.recreate();
        }
        self.with_writer(|conn| {
            let mut w = Writer::begin(conn)?;
            w.clear(scopes, false)?;
            w.finish()
        })
    }

    fn rebuild(
        &self,
        scopes: Option<&[ScopeKeyText]>,
        rows: &[Row],
    ) -> Result<usize, RetrievalError> {
        if scopes.is_none() && self.corrupt.load(Ordering::Acquire) {
            self.recreate()?;
        }
        self.with_writer(|conn| {
            let mut w = Writer::begin(conn)?;
            // Vectors are kept while the scope is refilled: those whose document comes back
            // with the same text stay current, the others are dropped below.
            w.clear(scopes, true)?;
            // Scope by scope: each shard then receives ascending rowids, which FTS5 appends
            // to its pending segment; interleaved scopes would force a flush per insert.
            let mut first_seen: std::collections::HashMap<&ScopeKeyText, usize> =
                std::collections::HashMap::new();
            let mut order: Vec<(usize, usize)> = rows
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let n = first_seen.len();
                    (*first_seen.entry(&r.scope).or_insert(n), i)
                })
                .collect();
            order.sort_unstable();
            for (_, i) in order {
                if let Some(row) = rows.get(i) {
                    w.upsert(row)?;
                }
            }
            w.drop_orphan_vectors(scopes)?;
            // SQLite's automatic checkpoint copies the WAL back at commit; the next write trims
            // the WAL file to `journal_size_limit`.
            w.finish()?;
            engine::merge_segments(conn, scopes);
            Ok(rows.len())
        })
    }

    fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        let now = self.clock.now();
        let fact_scopes: Vec<_> = fact_scopes(&query.scopes)
            .iter()
            .map(|s| s.to_fact_scope())
            .collect();
        self.ranked(query, |conn, all| {
            let mut hits = Vec::with_capacity(query.top_k.min(all.len()));
            for c in all {
                if hits.len() >= query.top_k {
                    break;
                }
                let Some((fact_id, json)) = engine::load_doc(conn, c.id)? else {
                    continue;
                };
                let Some(scope) = fact_scopes.get(c.scope_index) else {
                    continue;
                };
                match self.decode_cached(c.id, &fact_id, json, scope, now) {
                    Ok(fact) => hits.push(SearchHit {
                        fact,
                        score: c.score,
                        match_type: c.match_type(),
                        bm25: Some(c.rel),
                    }),
                    Err(msg) => {
                        tracing::warn!(doc = c.id, fact_id = %fact_id, error = %msg,
                            "skipping an index row that does not decode");
                    }
                }
            }
            Ok(hits)
        })
    }

    /// [`VectorIndex::word_ranking`]: the hits of [`Inner::search`] without decoding their facts
    /// (a document that does not decode is dropped when its fact is read).
    fn word_ranking(&self, query: &SearchQuery) -> Result<Vec<WordHit>, RetrievalError> {
        let scopes = fact_scopes(&query.scopes);
        self.ranked(query, |conn, all| {
            let mut hits = Vec::with_capacity(query.top_k.min(all.len()));
            for c in all.into_iter().take(query.top_k) {
                let (Some(fact_id), Some(scope)) =
                    (engine::doc_fact_id(conn, c.id)?, scopes.get(c.scope_index))
                else {
                    continue;
                };
                hits.push(WordHit {
                    scope: (*scope).clone(),
                    fact_id,
                    bm25: c.rel,
                    match_type: c.match_type(),
                });
            }
            Ok(hits)
        })
    }

    /// The BM25 candidates of `query`'s scopes, best final score first, handed to `take` in the
    /// same read snapshot (a concurrent rebuild is seen entirely or not at all).
    fn ranked<T: Default>(
        &self,
        query: &SearchQuery,
        take: impl FnOnce(&Connection, Vec<engine::Candidate>) -> rusqlite::Result<T>,
    ) -> Result<T, RetrievalError> {
        if query.is_trivially_empty() {
            return Ok(T::default());
        }
        self.ensure_open()?;
        let Some(plan) = query::plan(&query.text, self.segmenter.as_ref()) else {
            return Ok(T::default());
        };
        let keys: Vec<ScopeKeyText> = fact_scopes(&query.scopes)
            .iter()
            .map(|s| ScopeKeyText::of(s))
            .collect();
        let per_scope = query.top_k.saturating_mul(4);
        let category = query.category.as_deref();
        let now = self.clock.now();
        self.with_reader(|conn| {
            let _snapshot = ReadTx::begin(conn)?;
            let mut expr = plan.first.as_str();
            let mut plain = plan.first_is_plain;
            let mut retry = plan.retry.as_deref();
            let mut all: Vec<engine::Candidate> = Vec::new();
            for (i, key_text) in keys.iter().enumerate() {
                let Some(key) = engine::scope_key(conn, key_text)? else {
                    continue;
                };
                loop {
                    let q = engine::ScopeSearch {
                        expr,
                        plain,
                        category,
                        per_scope,
                        has_cjk: plan.has_cjk,
                        now,
                    };
                    let found = engine::search_scope(conn, key, &q, i);
                    match found {
                        Ok(c) => {
                            all.extend(c);
                            break;
                        }
                        Err(e) if engine::classify(&e) == FailureKind::Syntax => {
                            tracing::debug!(error = %e, expression = expr, "FTS5 query rejected");
                            match retry.take() {
                                Some(r) => {
                                    expr = r;
                                    plain = true;
                                }
                                // Neither expression is valid: no results, as the reference.
                                None => return Ok(T::default()),
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            all.sort_by(|a, b| b.score.total_cmp(&a.score));
            take(conn, all)
        })
    }

    /// Decodes a stored fact, reusing an earlier decode of the same document and JSON.
    fn decode_cached(
        &self,
        id: i64,
        fact_id: &str,
        json: String,
        scope: &deermem_core::FactScope,
        now: deermem_core::Timestamp,
    ) -> Result<Fact, engine::DecodeError> {
        if let Some(hit) = self.decoded.lock().get(&id)
            && hit.0 == json
        {
            return Ok(hit.1.clone());
        }
        let fact = engine::decode_fact(fact_id, &json, scope, now)?;
        if json.len() <= DECODED_CACHE_MAX_JSON {
            self.decoded.lock().put(id, Arc::new((json, fact.clone())));
        }
        Ok(fact)
    }

    fn inventory(&self) -> Result<Vec<IndexedDoc>, RetrievalError> {
        let rows = self.with_reader(engine::inventory)?;
        let mut out = Vec::with_capacity(rows.len());
        for (user, agent, fact_id, revision) in rows {
            let scope = engine::decode_scope(&user, &agent).map_err(|e| {
                RetrievalError::Backend(format!(
                    "index holds an unreadable scope ({user}, {agent}): {e}"
                ))
            })?;
            out.push(IndexedDoc {
                scope,
                fact_id,
                revision: revision.and_then(|r| u64::try_from(r).ok()),
            });
        }
        Ok(out)
    }

    fn indexed_scopes(&self) -> Result<Vec<Scope>, RetrievalError> {
        let rows = self.with_reader(engine::scope_texts)?;
        rows.iter()
            .map(|(user, agent)| {
                engine::decode_scope(user, agent).map_err(|e| {
                    RetrievalError::Backend(format!(
                        "index holds an unreadable scope ({user}, {agent}): {e}"
                    ))
                })
            })
            .collect()
    }

    fn missing_vectors(
        &self,
        model_id: &str,
        scopes: Option<&[ScopeKeyText]>,
        limit: usize,
    ) -> Result<Vec<EmbedTask>, RetrievalError> {
        let rows = self.with_reader(|conn| {
            let _snapshot = ReadTx::begin(conn)?;
            match scopes {
                None => engine::missing_vectors(conn, model_id, None, limit),
                Some(list) => {
                    let mut out = Vec::new();
                    let mut seen = std::collections::HashSet::new();
                    for s in list {
                        if out.len() >= limit || !seen.insert(s) {
                            continue;
                        }
                        if let Some(key) = engine::scope_key(conn, s)? {
                            out.extend(engine::missing_vectors(
                                conn,
                                model_id,
                                Some(key),
                                limit - out.len(),
                            )?);
                        }
                    }
                    Ok(out)
                }
            }
        })?;
        let mut tasks = Vec::with_capacity(rows.len());
        for (user, agent, fact_id, text) in rows {
            match engine::decode_scope(&user, &agent) {
                Ok(scope) => tasks.push(EmbedTask {
                    scope,
                    fact_id,
                    text,
                }),
                Err(e) => tracing::warn!(user = %user, agent = %agent, error = %e,
                    "skipping an index row with an unreadable scope"),
            }
        }
        Ok(tasks)
    }

    fn put_vectors(
        &self,
        model_id: &str,
        tasks: &[(ScopeKeyText, String, [u8; 32])],
        vectors: &[Vec<f32>],
    ) -> Result<usize, RetrievalError> {
        self.with_writer(|conn| {
            let mut w = Writer::begin(conn)?;
            let mut stored = 0;
            for ((scope, fact_id, digest), vec) in tasks.iter().zip(vectors) {
                stored += usize::from(w.put_vector(scope, fact_id, model_id, digest, vec)?);
            }
            w.finish()?;
            Ok(stored)
        })
    }

    fn scope_vectors(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>, ScriptGroup)>, RetrievalError> {
        let unique = fact_scopes(scopes);
        let now = self.clock.now();
        let per_scope = self.with_reader(|conn| {
            let _snapshot = ReadTx::begin(conn)?;
            let mut out = Vec::with_capacity(unique.len());
            for s in &unique {
                let rows = match engine::scope_key(conn, &ScopeKeyText::of(s))? {
                    Some(key) => engine::scope_vectors(conn, key, model_id)?,
                    None => Vec::new(),
                };
                out.push(rows);
            }
            Ok(out)
        })?;
        let mut found = Vec::new();
        let mut damaged = Vec::new();
        for (scope, rows) in unique.iter().zip(per_scope) {
            let fact_scope = scope.to_fact_scope();
            for (id, fact_id, json, dim, blob, script) in rows {
                let Some(vec) = engine::decode_vector(&blob, dim) else {
                    tracing::warn!(fact_id = %fact_id, "a stored vector does not decode; it is embedded again");
                    damaged.push((ScopeKeyText::of(scope), fact_id));
                    continue;
                };
                match self.decode_cached(id, &fact_id, json, &fact_scope, now) {
                    Ok(fact) => {
                        // The stored tag; a row written by hand without one is derived again.
                        let group = ScriptGroup::from_tag(&script)
                            .unwrap_or_else(|| script_group(&fact.content));
                        found.push((fact, vec, group));
                    }
                    Err(msg) => tracing::warn!(doc = id, fact_id = %fact_id, error = %msg,
                        "skipping an index row that does not decode"),
                }
            }
        }
        self.drop_damaged(&damaged);
        Ok(found)
    }

    /// Deletes the vectors that do not decode, so their documents are listed as missing and
    /// embedded again.
    fn drop_damaged(&self, damaged: &[(ScopeKeyText, String)]) {
        if damaged.is_empty() {
            return;
        }
        let cleared = self.with_writer(|conn| {
            let mut w = Writer::begin(conn)?;
            for (scope, fact_id) in damaged {
                w.drop_vector(scope, fact_id)?;
            }
            w.finish()
        });
        if let Err(e) = cleared {
            tracing::warn!(error = %e, "damaged vectors could not be deleted");
        }
    }

    /// [`VectorIndex::nearest`]: each scope's decoded vectors come from the [`VectorCache`]
    /// while its write stamp is unchanged, or are read (without any fact) and kept; the hits
    /// answer without their facts ([`Inner::read_hits`] reads those a search keeps).
    fn nearest(&self, q: &MeaningQuery<'_>) -> Result<MeaningRanking, RetrievalError> {
        let unique = fact_scopes(q.scopes);
        let dim = q.vector.len();
        let mut damaged = Vec::new();
        // Per scope (position in `unique`), its vectors of the model and dimension.
        let entries = self.with_reader(|conn| {
            let _snapshot = ReadTx::begin(conn)?;
            let mut entries = Vec::with_capacity(unique.len());
            for (at, scope) in unique.iter().enumerate() {
                let text = ScopeKeyText::of(scope);
                let Some((key, stamp)) = engine::scope_key_stamp(conn, &text)? else {
                    continue;
                };
                if let Some(stamp) = stamp
                    && let Some(hit) = self.vectors.lock().get(key, q.model_id, dim, stamp)
                {
                    entries.push((at, hit));
                    continue;
                }
                let before = damaged.len();
                let read = Arc::new(Self::read_scope_vectors(
                    conn,
                    key,
                    &text,
                    q.model_id,
                    dim,
                    stamp.unwrap_or_default(),
                    &mut damaged,
                )?);
                if let Some(stamp) = stamp
                    && damaged.len() == before
                {
                    debug_assert_eq!(read.stamp, stamp);
                    self.vectors
                        .lock()
                        .put(key, q.model_id, dim, Arc::clone(&read));
                }
                entries.push((at, read));
            }
            Ok(entries)
        })?;
        self.drop_damaged(&damaged);
        let missing = !damaged.is_empty() || entries.iter().any(|(_, e)| e.missing);
        // The candidates: every document of the scopes with a vector, in the category asked.
        let mut slots: Vec<(usize, usize)> = Vec::new();
        let mut vectors: Vec<&[f32]> = Vec::new();
        let mut groups: Vec<ScriptGroup> = Vec::new();
        for (e, (_, entry)) in entries.iter().enumerate() {
            for (i, ((_, category, group), v)) in entry
                .docs
                .iter()
                .zip(entry.flat.chunks_exact(dim.max(1)))
                .enumerate()
            {
                if q.category.is_some_and(|c| c != category) {
                    continue;
                }
                slots.push((e, i));
                vectors.push(v);
                groups.push(*group);
            }
        }
        let best = nearest_calibrated_indexed(q.vector, q.group, &vectors, &groups, q.limit);
        let hits = best
            .into_iter()
            .filter_map(|(i, score)| {
                let (e, d) = *slots.get(i)?;
                let (at, entry) = entries.get(e)?;
                Some(MeaningHit {
                    scope: (*unique.get(*at)?).clone(),
                    fact_id: entry.docs.get(d)?.0.clone(),
                    score,
                    fact: None,
                })
            })
            .collect();
        Ok(MeaningRanking { hits, missing })
    }

    /// The vectors of `model_id` and `dim` of one scope as stored now (`stamp` is the scope's
    /// write stamp read in the same snapshot). A vector that does not decode is listed in
    /// `damaged` and counts as missing; vectors of another dimension are left out.
    fn read_scope_vectors(
        conn: &Connection,
        key: i64,
        text: &ScopeKeyText,
        model_id: &str,
        dim: usize,
        stamp: i64,
        damaged: &mut Vec<(ScopeKeyText, String)>,
    ) -> rusqlite::Result<ScopeVectors> {
        let mut out = ScopeVectors {
            stamp,
            ..ScopeVectors::default()
        };
        for (id, fact_id, category, script, vdim, blob) in
            engine::scope_rank_rows(conn, key, model_id)?
        {
            let (Some(vdim), Some(blob)) = (vdim, blob) else {
                out.missing = true;
                continue;
            };
            let same_dim = usize::try_from(vdim).ok() == Some(dim);
            let valid = if same_dim {
                engine::decode_vector_into(&blob, vdim, &mut out.flat)
            } else {
                engine::decode_vector(&blob, vdim).is_some()
            };
            if !valid {
                tracing::warn!(fact_id = %fact_id, "a stored vector does not decode; it is embedded again");
                damaged.push((text.clone(), fact_id));
                out.missing = true;
                continue;
            }
            if !same_dim {
                continue;
            }
            // The stored tag; a row written by hand without one is derived again.
            let group = match ScriptGroup::from_tag(&script) {
                Some(g) => g,
                None => script_group(&engine::doc_content(conn, id)?),
            };
            out.docs.push((fact_id, category, group));
        }
        Ok(out)
    }

    /// [`VectorIndex::read_hits`]: the facts of the hits without one, read in one snapshot
    /// (through the decoded-fact cache); a hit whose document is gone is dropped.
    fn read_hits(&self, hits: &mut Vec<MeaningHit>) -> Result<(), RetrievalError> {
        let wanted: Vec<usize> = (0..hits.len())
            .filter(|i| hits[*i].fact.is_none())
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let rows = self.with_reader(|conn| {
            let _snapshot = ReadTx::begin(conn)?;
            let mut rows = Vec::with_capacity(wanted.len());
            for i in &wanted {
                let hit = &hits[*i];
                let row = match engine::scope_key(conn, &ScopeKeyText::of(&hit.scope))? {
                    Some(key) => engine::doc_json(conn, key, &hit.fact_id)?,
                    None => None,
                };
                rows.push(row);
            }
            Ok(rows)
        })?;
        let now = self.clock.now();
        for (i, row) in wanted.into_iter().zip(rows) {
            let Some((id, json)) = row else { continue };
            let hit = &mut hits[i];
            match self.decode_cached(id, &hit.fact_id, json, &hit.scope.to_fact_scope(), now) {
                Ok(fact) => hit.fact = Some(fact),
                Err(msg) => tracing::warn!(doc = id, fact_id = %hit.fact_id, error = %msg,
                    "skipping an index row that does not decode"),
            }
        }
        hits.retain(|h| h.fact.is_some());
        Ok(())
    }

    fn vector_coverage(&self, model_id: &str) -> Result<(u64, u64), RetrievalError> {
        self.with_reader(|conn| engine::vector_coverage(conn, model_id))
    }

    fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        let total_docs = self.with_reader(engine::count_docs)?;
        let (db_path, db_bytes) = match &self.location {
            Location::Memory => (None, None),
            Location::File(path) => {
                let [db, wal, _] = db_side_files(path);
                let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
                (
                    Some(path.display().to_string()),
                    Some(size(&db) + size(&wal)),
                )
            }
        };
        Ok(RetrievalStats {
            adapter: KIND.to_owned(),
            total_docs,
            db_path,
            db_bytes,
            jieba: cfg!(feature = "zh"),
            last_error: self.last_error.lock().clone(),
            vectors: None,
        })
    }

    /// Marks the index closed; `false` when it already was.
    fn mark_closed(&self) -> bool {
        let first = !self.closed.swap(true, Ordering::AcqRel);
        // A gathering applier stops waiting (taking the lock orders this after its check).
        let _p = self.pending.lock();
        self.gathered.notify_all();
        first
    }

    /// Closes the connections (after [`Inner::mark_closed`]); waits for a running write.
    fn close_connections(&self) {
        self.readers.lock().clear();
        let writer = {
            let mut state = self.state.lock();
            self.apply_pending(&mut state);
            state.writer.take()
        };
        if let Some(conn) = writer
            && let Err((_, e)) = conn.close()
        {
            tracing::warn!(error = %e, "closing the FTS5 index failed");
        }
    }
}

/// Each scope once, in order, and only scopes that can hold facts (those with an agent).
fn fact_scopes(scopes: &[Scope]) -> Vec<&Scope> {
    let mut unique: Vec<&Scope> = Vec::with_capacity(scopes.len());
    for s in scopes {
        if s.agent.is_some() && !unique.contains(&s) {
            unique.push(s);
        }
    }
    unique
}

#[async_trait]
impl Retrieval for Fts5Retrieval {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn upsert(&self, scope: &Scope, fact: &Fact) -> Result<(), RetrievalError> {
        let row = engine::encode_row(scope, fact)?;
        self.inner.enqueue(WriteOp::Upsert(row), scope.clone())
    }

    async fn remove(&self, scope: &Scope, id: &str) -> Result<(), RetrievalError> {
        if scope.agent.is_none() {
            self.inner.ensure_open()?;
            return Ok(());
        }
        let key = ScopeKeyText::of(scope);
        self.inner
            .enqueue(WriteOp::Remove(key, id.to_owned()), scope.clone())
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        if query.is_trivially_empty() {
            return Ok(Vec::new());
        }
        let query = query.clone();
        self.blocking(move |inner| inner.search(&query)).await
    }

    async fn clear(&self, scopes: Option<&[Scope]>) -> Result<(), RetrievalError> {
        let keys: Option<Vec<ScopeKeyText>> =
            scopes.map(|s| s.iter().map(ScopeKeyText::of).collect());
        self.blocking(move |inner| inner.clear(keys.as_deref()))
            .await
    }

    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError> {
        let rows: Vec<Row> = facts
            .iter()
            .map(|(scope, fact)| engine::encode_row(scope, fact))
            .collect::<Result<_, _>>()?;
        let keys: Option<Vec<ScopeKeyText>> =
            scopes.map(|s| s.iter().map(ScopeKeyText::of).collect());
        self.blocking(move |inner| inner.rebuild(keys.as_deref(), &rows))
            .await
    }

    async fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        self.blocking(|inner| inner.stats()).await
    }

    async fn inventory(&self) -> Result<Vec<IndexedDoc>, RetrievalError> {
        self.blocking(|inner| inner.inventory()).await
    }

    async fn indexed_scopes(&self) -> Result<Vec<Scope>, RetrievalError> {
        self.blocking(|inner| inner.indexed_scopes()).await
    }

    fn take_stale_scopes(&self) -> Vec<Scope> {
        std::mem::take(&mut *self.inner.stale.lock())
    }

    /// The page caches, mapped windows and decoded facts ([`cache_bounds`]); an in-memory
    /// index has its writer connection only, and no mapped window.
    fn cache_bounds(&self) -> Vec<CacheBound> {
        let decoded = Some(self.inner.decoded.lock().len());
        let vectors = Some(self.inner.vectors.lock().bytes());
        match self.inner.location {
            Location::File(_) => cache_bounds(&self.inner.options, decoded, vectors),
            Location::Memory => vec![
                CacheBound::bytes(PAGE_CACHE_NAME, PAGE_CACHE_BYTES, None),
                CacheBound::entries(DECODED_CACHE_NAME, DECODED_CACHE, decoded),
                vector_bound(vectors),
            ],
        }
    }

    async fn close(&self) {
        // Later calls fail at once; the connections close off the async threads (closing
        // applies the pending writes and waits for a running one), or when the last clone is
        // dropped if that task never runs.
        if !self.inner.mark_closed() {
            return;
        }
        let inner = Arc::clone(&self.inner);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let _ = handle
                .spawn_blocking(move || inner.close_connections())
                .await;
        } else {
            inner.close_connections();
        }
    }
}

#[async_trait]
impl VectorIndex for Fts5Retrieval {
    async fn missing_vectors(
        &self,
        model_id: &str,
        scopes: Option<&[Scope]>,
        limit: usize,
    ) -> Result<Vec<EmbedTask>, RetrievalError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let model_id = model_id.to_owned();
        let keys: Option<Vec<ScopeKeyText>> = scopes.map(|s| {
            s.iter()
                .filter(|s| s.agent.is_some())
                .map(ScopeKeyText::of)
                .collect()
        });
        self.blocking(move |inner| inner.missing_vectors(&model_id, keys.as_deref(), limit))
            .await
    }

    async fn put_vectors(
        &self,
        model_id: &str,
        tasks: &[EmbedTask],
        vectors: &[Vec<f32>],
    ) -> Result<usize, RetrievalError> {
        deermem_core::ports::check_put_vectors(tasks, vectors)?;
        if tasks.is_empty() {
            self.inner.ensure_open()?;
            return Ok(0);
        }
        let keyed: Vec<(ScopeKeyText, String, [u8; 32])> = tasks
            .iter()
            .map(|t| {
                (
                    ScopeKeyText::of(&t.scope),
                    t.fact_id.clone(),
                    engine::text_digest(&t.text),
                )
            })
            .collect();
        let model_id = model_id.to_owned();
        let vectors = vectors.to_vec();
        self.blocking(move |inner| inner.put_vectors(&model_id, &keyed, &vectors))
            .await
    }

    async fn scope_vectors(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>)>, RetrievalError> {
        Ok(self
            .scope_vectors_tagged(scopes, model_id)
            .await?
            .into_iter()
            .map(|(fact, v, _)| (fact, v))
            .collect())
    }

    async fn nearest(&self, query: &MeaningQuery<'_>) -> Result<MeaningRanking, RetrievalError> {
        let scopes = query.scopes.to_vec();
        let model_id = query.model_id.to_owned();
        let vector = query.vector.to_vec();
        let category = query.category.map(str::to_owned);
        let (group, limit) = (query.group, query.limit);
        self.blocking(move |inner| {
            inner.nearest(&MeaningQuery {
                scopes: &scopes,
                model_id: &model_id,
                vector: &vector,
                group,
                category: category.as_deref(),
                limit,
            })
        })
        .await
    }

    async fn word_ranking(
        &self,
        query: &SearchQuery,
    ) -> Result<Option<Vec<WordHit>>, RetrievalError> {
        if query.is_trivially_empty() {
            return Ok(Some(Vec::new()));
        }
        let query = query.clone();
        self.blocking(move |inner| inner.word_ranking(&query).map(Some))
            .await
    }

    async fn read_hits(&self, hits: &mut Vec<MeaningHit>) -> Result<(), RetrievalError> {
        if hits.iter().all(|h| h.fact.is_some()) {
            return Ok(());
        }
        let mut taken = std::mem::take(hits);
        *hits = self
            .blocking(move |inner| inner.read_hits(&mut taken).map(|()| taken))
            .await?;
        Ok(())
    }

    /// The stored `script` column of each document.
    async fn scope_vectors_tagged(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>, ScriptGroup)>, RetrievalError> {
        let scopes = scopes.to_vec();
        let model_id = model_id.to_owned();
        self.blocking(move |inner| inner.scope_vectors(&scopes, &model_id))
            .await
    }

    async fn vector_coverage(&self, model_id: &str) -> Result<(u64, u64), RetrievalError> {
        let model_id = model_id.to_owned();
        self.blocking(move |inner| inner.vector_coverage(&model_id))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deermem_testkit::clock::ManualClock;
    use deermem_testkit::retrieval::{fact, scope};

    fn upsert_op(s: &Scope, id: &str, text: &str) -> WriteOp {
        WriteOp::Upsert(engine::encode_row(s, &fact(s, id, text, "context", 0.5)).unwrap())
    }

    /// Writes accepted while the writer is busy are applied by the next holder in one
    /// transaction, in the order they were accepted, and a search sees all of them.
    #[test]
    fn accepted_writes_share_one_commit_and_are_seen_by_the_next_search() {
        let dir = tempfile::tempdir().unwrap();
        let index = Fts5Retrieval::open(
            dir.path(),
            Arc::new(ManualClock::at("2026-01-01T00:00:00Z")),
        )
        .unwrap();
        let s = scope(Some("alice"), "coder");
        let key = ScopeKeyText::of(&s);
        index
            .inner
            .enqueue(upsert_op(&s, "f0", "seeded memory"), s.clone())
            .unwrap();
        index.inner.settle();
        let before = index.inner.shared_commits.load(Ordering::Relaxed);
        // As if an applier were scheduled but not yet running: the writes wait in the queue.
        index.inner.pending.lock().applier = true;
        for i in 1..=3 {
            index
                .inner
                .enqueue(upsert_op(&s, &format!("f{i}"), "queued memory"), s.clone())
                .unwrap();
        }
        // Upsert then remove of one id: the order is kept.
        index
            .inner
            .enqueue(WriteOp::Remove(key.clone(), "f0".into()), s.clone())
            .unwrap();
        index
            .inner
            .enqueue(upsert_op(&s, "f4", "late memory"), s.clone())
            .unwrap();
        index
            .inner
            .enqueue(WriteOp::Remove(key, "f4".into()), s.clone())
            .unwrap();
        assert_eq!(index.inner.pending.lock().ops.len(), 6);
        let hits = index
            .search_blocking(&SearchQuery::new("memory", s.clone(), 10))
            .unwrap();
        let mut ids: Vec<_> = hits.iter().map(|h| h.fact.id.as_str().to_owned()).collect();
        ids.sort();
        assert_eq!(ids, vec!["f1", "f2", "f3"]);
        assert_eq!(
            index.inner.shared_commits.load(Ordering::Relaxed) - before,
            1
        );
        assert!(index.inner.pending.lock().ops.is_empty());
        index.inner.pending.lock().applier = false;
        assert!(index.take_stale_scopes().is_empty());
    }

    /// A write that cannot be applied (here: the writer is gone) is reported once as a stale
    /// scope, for the storage to rebuild; nothing is left pending.
    #[test]
    fn writes_that_cannot_be_applied_report_their_scope() {
        let index =
            Fts5Retrieval::in_memory(Arc::new(ManualClock::at("2026-01-01T00:00:00Z"))).unwrap();
        let s = scope(Some("alice"), "coder");
        index.inner.state.lock().writer = None;
        index
            .inner
            .enqueue(upsert_op(&s, "f1", "memory"), s.clone())
            .unwrap();
        assert!(index.inner.pending.lock().ops.is_empty());
        assert_eq!(index.take_stale_scopes(), vec![s]);
        assert!(index.take_stale_scopes().is_empty());
    }

    /// An index whose background applier waits `window` for more writes.
    fn with_window(window: std::time::Duration) -> (tempfile::TempDir, Fts5Retrieval) {
        let dir = tempfile::tempdir().unwrap();
        let mut index = Fts5Retrieval::open(
            dir.path(),
            Arc::new(ManualClock::at("2026-01-01T00:00:00Z")),
        )
        .unwrap();
        Arc::get_mut(&mut index.inner).unwrap().gather_window = window;
        (dir, index)
    }

    /// Waits (bounded) until no applier is scheduled; `false` when one still is.
    async fn applier_done(index: &Fts5Retrieval) -> bool {
        for _ in 0..500 {
            if !index.inner.pending.lock().applier {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        false
    }

    /// The background applier gathers the writes that follow the first into one transaction;
    /// a full batch is applied at once without waiting out the window (a minute here).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_background_applier_gathers_writes_into_one_transaction() {
        let (_dir, index) = with_window(std::time::Duration::from_secs(60));
        let s = scope(Some("alice"), "coder");
        let before = index.inner.shared_commits.load(Ordering::Relaxed);
        for i in 0..GATHER_MAX {
            index
                .upsert(
                    &s,
                    &fact(&s, &format!("f{i}"), "gathered memory", "context", 0.5),
                )
                .await
                .unwrap();
        }
        assert!(applier_done(&index).await, "a full batch does not wait");
        assert_eq!(
            index.inner.shared_commits.load(Ordering::Relaxed) - before,
            1,
            "one transaction for the whole batch"
        );
        assert!(index.inner.pending.lock().ops.is_empty());
        let hits = index
            .search_blocking(&SearchQuery::new("gathered", s.clone(), 1000))
            .unwrap();
        assert_eq!(hits.len(), GATHER_MAX);
    }

    /// A gathering applier stops waiting when the index closes, and what it gathered is
    /// applied by the close: a reopened index has it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closing_wakes_a_gathering_applier() {
        let (dir, index) = with_window(std::time::Duration::from_secs(60));
        let s = scope(Some("alice"), "coder");
        index
            .upsert(&s, &fact(&s, "f1", "pending memory", "context", 0.5))
            .await
            .unwrap();
        let mut waiting = false;
        for _ in 0..500 {
            waiting = index.inner.pending.lock().gathering;
            if waiting {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(waiting, "an applier is gathering");
        index.close().await;
        assert!(applier_done(&index).await, "the applier stood down");
        drop(index);
        let reopened = Fts5Retrieval::open(
            dir.path(),
            Arc::new(ManualClock::at("2026-01-01T00:00:00Z")),
        )
        .unwrap();
        let hits = reopened
            .search_blocking(&SearchQuery::new("pending", s.clone(), 10))
            .unwrap();
        assert_eq!(hits.len(), 1);
    }

    /// Closing applies what was accepted before: a reopened index has it.
    #[tokio::test]
    async fn close_applies_accepted_writes() {
        let dir = tempfile::tempdir().unwrap();
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::at("2026-01-01T00:00:00Z"));
        let index = Fts5Retrieval::open(dir.path(), clock.clone()).unwrap();
        let s = scope(Some("alice"), "coder");
        // As if an applier were scheduled but not yet running: the writes wait in the queue.
        index.inner.pending.lock().applier = true;
        for i in 0..5 {
            index
                .upsert(
                    &s,
                    &fact(&s, &format!("f{i}"), "closing memory", "context", 0.5),
                )
                .await
                .unwrap();
        }
        assert_eq!(index.inner.pending.lock().ops.len(), 5);
        index.close().await;
        let reopened = Fts5Retrieval::open(dir.path(), clock).unwrap();
        assert_eq!(reopened.stats().await.unwrap().total_docs, 5);
    }
}
