//! The run journal: a small, bounded, append-only record of run events per user, so a host
//! can prove afterwards exactly which memory block an agent run saw (through the block's
//! SHA-256, as the reference records it) without storing the memory text twice.
//!
//! # Layout and format
//!
//! Under the journal directory (by convention `{storage_root}/.runs`, see
//! [`RunJournal::dir_for_storage_root`]): `.lock` (held for the journal's lifetime, so one
//! process owns the directory) and, per user bucket, `{bucket}/events.jsonl`: one JSON object
//! per line, `\n`-terminated, in `seq` order:
//!
//! ```json
//! {"seq":1,"user_id":"alice","thread_id":"t-1","run_id":"r-1","event_type":"context:memory","category":"context","content":{"content_sha256":"9f…"},"metadata":{"agent_name":"__default__"},"created_at":"2026-05-01T10:00:00.123456Z"}
//! ```
//!
//! Only the SHA-256 of the block is written, never its text. Appends are one `write` of a
//! whole line followed by `fdatasync`; a torn last line left by a crash is ignored on read and
//! never fatal (the next append starts on a fresh line). Lines that do not parse are skipped
//! with a warning; before such a file is compacted it is kept as `events.jsonl.invalid-{µs}`.
//!
//! # Bounds
//!
//! Each user keeps the newest [`RunJournalOptions::max_events_per_user`] events; older ones are
//! dropped from the index at once and from the file by an atomic compaction (temporary file,
//! fsync, rename, directory fsync) once the file holds a quarter more lines than that.
//! At most [`RunJournalOptions::max_cached_users`] users' indexes stay in memory; others are
//! re-read from their file on demand.
//!
//! # Concurrency
//!
//! All calls for one user are serialised by a per-user mutex that covers the check and the
//! append, so "at most one `context:memory` event per run" holds under concurrent requests.
//! The port's calls do file I/O; on a multi-threaded tokio runtime they run it through
//! `block_in_place`. The `_blocking` methods are the same calls for a thread of one's own.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deermem_core::ports::Clock;
use deermem_core::ports::run_journal::{
    CONTEXT_MEMORY_EVENT, EventQuery, EventsLookup, JournalError, RecordOutcome, RunEvent,
    RunEventStore, check_record_args, is_sha256_hex, settle_recorded, valid_event_type,
    validate_run_key,
};
use deermem_core::time::Timestamp;
use deermem_core::{AgentName, UserId};
use parking_lot::Mutex;
use serde_json::{Map, Value, json};

/// The per-user events file.
const EVENTS_FILE: &str = "events.jsonl";
/// The directory lock.
const LOCK_FILE: &str = ".lock";
/// Longer lines are never ours: they are skipped without being read into memory.
const MAX_LINE_BYTES: usize = 16 * 1024;

/// Limits of a [`RunJournal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunJournalOptions {
    /// Events kept per user (the newest); at least 1. Default 10 000.
    pub max_events_per_user: usize,
    /// Users whose index stays in memory; at least 1. Default 1 024.
    pub max_cached_users: usize,
}

impl Default for RunJournalOptions {
    fn default() -> Self {
        Self {
            max_events_per_user: 10_000,
            max_cached_users: 1_024,
        }
    }
}

/// The stored line format of events: one JSON object per line with the user id first.
mod line {
    use super::*;

    pub(super) fn to_line(event: &RunEvent, user: &str) -> String {
        let v = json!({
            "seq": event.seq,
            "user_id": user,
            "thread_id": event.thread_id,
            "run_id": event.run_id,
            "event_type": event.event_type,
            "category": event.category,
            "content": event.content,
            "metadata": event.metadata,
            "created_at": event.created_at,
        });
        let mut line = v.to_string();
        line.push('\n');
        line
    }

    /// Parses one stored line; `None` for anything that is not a well-formed event of `user`.
    pub(super) fn from_line(bytes: &[u8], user: &str) -> Option<RunEvent> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        let o = v.as_object()?;
        let s = |k: &str| o.get(k).and_then(Value::as_str);
        if s("user_id")? != user {
            return None;
        }
        let seq = o.get("seq").and_then(Value::as_u64).filter(|n| *n > 0)?;
        let thread_id = s("thread_id")?;
        let run_id = s("run_id")?;
        validate_run_key("thread_id", thread_id).ok()?;
        validate_run_key("run_id", run_id).ok()?;
        let event_type = s("event_type").filter(|t| valid_event_type(t))?;
        let content = o.get("content")?.as_object()?.clone();
        let metadata = match o.get("metadata") {
            None | Some(Value::Null) => Map::new(),
            Some(m) => m.as_object()?.clone(),
        };
        let event = RunEvent {
            seq,
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            event_type: event_type.to_owned(),
            category: s("category")?.to_owned(),
            content,
            metadata,
            created_at: s("created_at")?.to_owned(),
        };
        if event.event_type == CONTEXT_MEMORY_EVENT && !is_sha256_hex(event.content_sha256()?) {
            return None;
        }
        Some(event)
    }
}

fn io_err(what: &str, path: &Path, source: io::Error) -> JournalError {
    JournalError::Io {
        context: format!("{what} {}", path.display()),
        source,
    }
}

/// The real clock.
#[derive(Debug)]
struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Timestamp::from_unix_micros(micros)
    }
}

type SharedLog = Arc<Mutex<Option<UserLog>>>;

struct Slot {
    log: SharedLog,
    last_used: u64,
}

/// A file-backed, per-user, bounded, append-only journal of run events: the file
/// implementation of [`RunEventStore`].
pub struct RunJournal {
    dir: PathBuf,
    options: RunJournalOptions,
    clock: Arc<dyn Clock>,
    users: Mutex<HashMap<String, Slot>>,
    tick: AtomicU64,
    _lock: File,
}

impl fmt::Debug for RunJournal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunJournal")
            .field("dir", &self.dir)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RunJournal {
    /// The conventional journal directory of a storage root: `{root}/.runs`.
    pub fn dir_for_storage_root(root: &Path) -> PathBuf {
        root.join(".runs")
    }

    /// Opens (creating it if needed) the journal in `dir` and takes its lock. Users' indexes
    /// are rebuilt from their files on first use.
    ///
    /// # Errors
    /// [`JournalError::Busy`] when another journal holds the directory; `Io` when it cannot be
    /// created or locked.
    pub fn open(dir: impl Into<PathBuf>, options: RunJournalOptions) -> Result<Self, JournalError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| io_err("Failed to create directory", &dir, e))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&lock_path)
            .map_err(|e| io_err("Failed to open lock file", &lock_path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(JournalError::Busy { lock: lock_path });
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_err("Failed to lock", &lock_path, e)),
        }
        Ok(Self {
            dir,
            options: RunJournalOptions {
                max_events_per_user: options.max_events_per_user.max(1),
                max_cached_users: options.max_cached_users.max(1),
            },
            clock: Arc::new(SystemClock),
            users: Mutex::new(HashMap::new()),
            tick: AtomicU64::new(0),
            _lock: lock,
        })
    }

    /// The journal directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limits in force.
    pub fn options(&self) -> RunJournalOptions {
        self.options
    }

    /// The events file of a user.
    pub fn events_file(&self, user: &UserId) -> PathBuf {
        self.dir.join(user.bucket()).join(EVENTS_FILE)
    }

    /// How many events of `user` are retained.
    ///
    /// # Errors
    /// `Io` when the user's file cannot be read.
    pub fn retained_events(&self, user: &UserId) -> Result<usize, JournalError> {
        self.with_log(user, |log, _, _| Ok(log.events.len()))
    }

    /// Runs `f` on the user's loaded log, holding the user's lock.
    fn with_log<T>(
        &self,
        user: &UserId,
        f: impl FnOnce(&mut UserLog, &RunJournalOptions, &dyn Clock) -> Result<T, JournalError>,
    ) -> Result<T, JournalError> {
        let shared = self.slot(user.bucket());
        let mut guard = shared.lock();
        let log = match &mut *guard {
            Some(log) => log,
            None => {
                let dir = self.dir.join(user.bucket());
                guard.insert(UserLog::load(dir, user.bucket(), &self.options)?)
            }
        };
        f(log, &self.options, self.clock.as_ref())
    }

    /// The user's shared log (loaded or not), evicting idle users past the cache limit.
    fn slot(&self, bucket: &str) -> SharedLog {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut users = self.users.lock();
        if let Some(slot) = users.get_mut(bucket) {
            slot.last_used = tick;
            return Arc::clone(&slot.log);
        }
        if users.len() >= self.options.max_cached_users {
            // Only entries nobody holds (the map's is the only reference) may go: a holder
            // took its reference under this same lock, so the count cannot rise meanwhile.
            let mut idle: Vec<(u64, String)> = users
                .iter()
                .filter(|(_, s)| Arc::strong_count(&s.log) == 1)
                .map(|(k, s)| (s.last_used, k.clone()))
                .collect();
            idle.sort();
            let excess = users.len() + 1 - self.options.max_cached_users;
            for (_, key) in idle.into_iter().take(excess) {
                users.remove(&key);
            }
        }
        let log: SharedLog = Arc::new(Mutex::new(None));
        users.insert(
            bucket.to_owned(),
            Slot {
                log: Arc::clone(&log),
                last_used: tick,
            },
        );
        log
    }

    /// Users whose index is in memory now.
    pub fn cached_users(&self) -> usize {
        self.users.lock().len()
    }
}

/// The name the run journal's in-memory user indexes are reported under.
pub const RUN_JOURNAL_CACHE_NAME: &str = "run_journal.users";

impl RunJournal {
    /// Records that `user`'s run `run_id` of `thread_id` saw the block whose SHA-256 is
    /// `content_sha256`: appends one `context:memory` event, or nothing when the run already
    /// recorded this block.
    ///
    /// # Errors
    /// `InvalidId` for a bad thread or run id or a hash that is not 64 lowercase hex digits;
    /// `Conflict` when the run already recorded a different block (nothing is written); `Io`
    /// when the event could not be made durable (nothing is recorded).
    pub fn record_context_blocking(
        &self,
        user: &UserId,
        agent: Option<&AgentName>,
        thread_id: &str,
        run_id: &str,
        content_sha256: &str,
    ) -> Result<RecordOutcome, JournalError> {
        check_record_args(thread_id, run_id, content_sha256)?;
        self.with_log(user, |log, opts, clock| {
            let key = (thread_id.to_owned(), run_id.to_owned());
            if let Some(seq) = log.context.get(&key).copied() {
                let existing = log.event(seq).cloned().ok_or_else(|| JournalError::Io {
                    context: "run journal index out of step".into(),
                    source: io::Error::other("indexed event missing"),
                })?;
                return settle_recorded(existing, content_sha256);
            }
            let event = RunEvent::context_memory(
                log.next_seq,
                thread_id,
                run_id,
                agent,
                content_sha256,
                clock.now().to_iso_z(),
            );
            log.append(&event, opts)?;
            Ok(RecordOutcome::Recorded(event))
        })
    }

    /// The events `user` recorded for `run_id` of `thread_id`, filtered by `query`.
    ///
    /// # Errors
    /// `InvalidId` for a bad thread or run id; `Io` when the user's file cannot be read.
    pub fn events_blocking(
        &self,
        user: &UserId,
        thread_id: &str,
        run_id: &str,
        query: &EventQuery,
    ) -> Result<EventsLookup, JournalError> {
        validate_run_key("thread_id", thread_id)?;
        validate_run_key("run_id", run_id)?;
        self.with_log(user, |log, _, _| {
            if !log.threads.contains_key(thread_id) {
                return Ok(EventsLookup::UnknownThread);
            }
            let Some(seqs) = log.runs.get(&(thread_id.to_owned(), run_id.to_owned())) else {
                return Ok(EventsLookup::UnknownRun);
            };
            let events = seqs
                .iter()
                .filter_map(|seq| log.event(*seq))
                .filter(|e| query.after_seq.is_none_or(|after| e.seq > after))
                .filter(|e| {
                    query
                        .event_types
                        .as_ref()
                        .is_none_or(|types| types.contains(&e.event_type))
                })
                .take(query.limit)
                .cloned()
                .collect();
            Ok(EventsLookup::Events(events))
        })
    }
}

/// Runs the journal's blocking file work from an async call: through `block_in_place` on a
/// multi-threaded runtime (the worker's other tasks move to another thread), inline elsewhere.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[async_trait::async_trait]
impl RunEventStore for RunJournal {
    /// The users whose index is in memory (`max_cached_users`; idle ones are dropped first).
    fn cache_bounds(&self) -> Vec<deermem_core::CacheBound> {
        vec![deermem_core::CacheBound::entries(
            RUN_JOURNAL_CACHE_NAME,
            self.options.max_cached_users,
            Some(self.cached_users()),
        )]
    }

    /// See [`RunJournal::record_context_blocking`].
    async fn record_context(
        &self,
        user: &UserId,
        agent: Option<&AgentName>,
        thread_id: &str,
        run_id: &str,
        content_sha256: &str,
    ) -> Result<RecordOutcome, JournalError> {
        blocking(|| self.record_context_blocking(user, agent, thread_id, run_id, content_sha256))
    }

    /// See [`RunJournal::events_blocking`].
    async fn events(
        &self,
        user: &UserId,
        thread_id: &str,
        run_id: &str,
        query: &EventQuery,
    ) -> Result<EventsLookup, JournalError> {
        blocking(|| self.events_blocking(user, thread_id, run_id, query))
    }
}

/// One user's retained events, their indexes, and the append handle.
struct UserLog {
    dir: PathBuf,
    path: PathBuf,
    bucket: String,
    events: VecDeque<RunEvent>,
    /// (thread, run) → seq of its `context:memory` event.
    context: HashMap<(String, String), u64>,
    /// thread → retained events.
    threads: HashMap<String, usize>,
    /// (thread, run) → `seq` of its retained events, oldest first.
    runs: HashMap<(String, String), VecDeque<u64>>,
    next_seq: u64,
    /// Lines in the file (complete ones, valid or not).
    file_lines: usize,
    /// The file does not end with `\n` (a torn or failed write): the next append starts with one.
    needs_newline: bool,
    /// The file holds lines that did not parse: keep a copy before compacting them away.
    has_invalid: bool,
    file: Option<File>,
}

impl UserLog {
    fn load(dir: PathBuf, bucket: &str, opts: &RunJournalOptions) -> Result<Self, JournalError> {
        let path = dir.join(EVENTS_FILE);
        let mut log = Self {
            dir,
            path,
            bucket: bucket.to_owned(),
            events: VecDeque::new(),
            context: HashMap::new(),
            threads: HashMap::new(),
            runs: HashMap::new(),
            next_seq: 1,
            file_lines: 0,
            needs_newline: false,
            has_invalid: false,
            file: None,
        };
        let file = match File::open(&log.path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(log),
            Err(e) => return Err(io_err("Failed to open", &log.path, e)),
        };
        let mut reader = BufReader::new(file);
        let mut skipped = 0usize;
        let mut line = Vec::new();
        loop {
            line.clear();
            let (complete, too_long) = read_line(&mut reader, &mut line)
                .map_err(|e| io_err("Failed to read", &log.path, e))?;
            if !complete && line.is_empty() && !too_long {
                break;
            }
            // A last line without a newline is a write torn by a crash, or one that completed
            // just before it. Kept only if it parses; the next append starts on a new line.
            log.file_lines += 1;
            log.needs_newline = !complete;
            let blank = line.iter().all(u8::is_ascii_whitespace);
            if blank && !too_long {
                if !complete {
                    break;
                }
                continue;
            }
            let parsed = if too_long {
                None
            } else {
                line::from_line(&line, bucket)
            };
            match parsed {
                Some(event) if log.accepts(&event) => {
                    log.index(event);
                    // Bounded while loading too, whatever the file's size.
                    log.evict(opts);
                }
                _ if !complete => {
                    tracing::warn!(path = %log.path.display(), bytes = line.len(), "ignoring a torn last line of the run journal");
                }
                _ => {
                    skipped += 1;
                    log.has_invalid = true;
                }
            }
            if !complete {
                break;
            }
        }
        if skipped > 0 {
            tracing::warn!(path = %log.path.display(), skipped, "skipped run journal lines that are not valid events");
        }
        log.evict(opts);
        if log.file_lines > compaction_threshold(opts) {
            log.compact();
        }
        Ok(log)
    }

    /// Whether a parsed event can join the index: `seq` increasing, one memory event per run.
    fn accepts(&self, event: &RunEvent) -> bool {
        if event.seq < self.next_seq {
            return false;
        }
        !(event.event_type == CONTEXT_MEMORY_EVENT
            && self
                .context
                .contains_key(&(event.thread_id.clone(), event.run_id.clone())))
    }

    fn index(&mut self, event: RunEvent) {
        self.next_seq = event.seq.saturating_add(1);
        let key = (event.thread_id.clone(), event.run_id.clone());
        if event.event_type == CONTEXT_MEMORY_EVENT {
            self.context.insert(key.clone(), event.seq);
        }
        *self.threads.entry(event.thread_id.clone()).or_default() += 1;
        self.runs.entry(key).or_default().push_back(event.seq);
        self.events.push_back(event);
    }

    /// The retained event with this `seq` (events are in `seq` order).
    fn event(&self, seq: u64) -> Option<&RunEvent> {
        self.events
            .binary_search_by_key(&seq, |e| e.seq)
            .ok()
            .and_then(|i| self.events.get(i))
    }

    /// Drops the oldest events beyond the bound from the index.
    fn evict(&mut self, opts: &RunJournalOptions) {
        while self.events.len() > opts.max_events_per_user {
            let Some(old) = self.events.pop_front() else {
                break;
            };
            let key = (old.thread_id.clone(), old.run_id.clone());
            if self.context.get(&key) == Some(&old.seq) {
                self.context.remove(&key);
            }
            if let Some(seqs) = self.runs.get_mut(&key) {
                seqs.retain(|s| *s != old.seq);
                if seqs.is_empty() {
                    self.runs.remove(&key);
                }
            }
            decrement(&mut self.threads, &old.thread_id);
        }
    }

    /// Appends one event durably, then indexes it (and compacts when the file is too long).
    fn append(&mut self, event: &RunEvent, opts: &RunJournalOptions) -> Result<(), JournalError> {
        let mut bytes = String::new();
        if self.needs_newline {
            bytes.push('\n');
        }
        bytes.push_str(&line::to_line(event, &self.bucket));
        if let Err(e) = self.write_durably(bytes.as_bytes()) {
            // Part of the line may have reached the file: start the next one on a new line.
            self.needs_newline = true;
            self.file = None;
            return Err(e);
        }
        self.needs_newline = false;
        self.file_lines += 1;
        self.index(event.clone());
        self.evict(opts);
        if self.file_lines > compaction_threshold(opts) {
            self.compact();
        }
        Ok(())
    }

    fn write_durably(&mut self, bytes: &[u8]) -> Result<(), JournalError> {
        if self.file.is_none() {
            fs::create_dir_all(&self.dir)
                .map_err(|e| io_err("Failed to create directory", &self.dir, e))?;
            let created = !self.path.exists();
            let f = OpenOptions::new()
                .append(true)
                .create(true)
                .open(&self.path)
                .map_err(|e| io_err("Failed to open", &self.path, e))?;
            if created {
                fsync_dir(&self.dir)?;
            }
            self.file = Some(f);
        }
        let Some(f) = self.file.as_mut() else {
            return Err(io_err(
                "Failed to open",
                &self.path,
                io::Error::other("no handle"),
            ));
        };
        f.write_all(bytes)
            .map_err(|e| io_err("Failed to append to", &self.path, e))?;
        f.sync_data()
            .map_err(|e| io_err("Failed to fsync", &self.path, e))
    }

    /// Rewrites the file with the retained events only (atomically). A failure is logged and
    /// leaves the longer file in place; it is retried on a later append.
    fn compact(&mut self) {
        if let Err(e) = self.try_compact() {
            tracing::warn!(path = %self.path.display(), error = %e, "run journal compaction failed; keeping the longer file");
        }
    }

    fn try_compact(&mut self) -> Result<(), JournalError> {
        if self.has_invalid {
            let micros = SystemClock.now().unix_micros();
            let keep = self.dir.join(format!("{EVENTS_FILE}.invalid-{micros}"));
            fs::hard_link(&self.path, &keep)
                .map_err(|e| io_err("Failed to keep a copy of", &self.path, e))?;
            tracing::warn!(kept = %keep.display(), "run journal held invalid lines; kept a copy before compacting");
            // The copy holds them: a retried compaction needs no second one.
            self.has_invalid = false;
        }
        let text: String = self
            .events
            .iter()
            .map(|e| line::to_line(e, &self.bucket))
            .collect();
        crate::fsutil::atomic_write(&self.path, text.as_bytes()).map_err(|e| match e {
            crate::error::Error::Io { context, source } => JournalError::Io { context, source },
            other => io_err(
                "Failed to replace",
                &self.path,
                io::Error::other(other.to_string()),
            ),
        })?;
        self.file = None;
        self.file_lines = self.events.len();
        self.needs_newline = false;
        Ok(())
    }
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

fn compaction_threshold(opts: &RunJournalOptions) -> usize {
    let max = opts.max_events_per_user;
    max.saturating_add((max / 4).max(1))
}

fn fsync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_err("Failed to fsync directory", dir, e))
}

/// Reads one line into `buf` (without its `\n`). Returns (ended with a newline, was longer
/// than [`MAX_LINE_BYTES`]); a too-long line is consumed but not kept.
fn read_line(reader: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<(bool, bool)> {
    let mut too_long = false;
    loop {
        let limit = (MAX_LINE_BYTES + 1).saturating_sub(buf.len()) as u64;
        let n = reader.by_ref().take(limit.max(1)).read_until(b'\n', buf)?;
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if too_long {
                buf.clear();
            }
            return Ok((true, too_long));
        }
        if n == 0 {
            if too_long {
                buf.clear();
            }
            return Ok((false, too_long));
        }
        if buf.len() > MAX_LINE_BYTES {
            too_long = true;
            buf.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_consumed_without_being_kept() {
        let mut data = vec![b'x'; MAX_LINE_BYTES * 3];
        data.extend_from_slice(b"\nshort\ntail");
        let mut r = BufReader::new(&data[..]);
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (true, true));
        assert!(buf.is_empty());
        buf.clear();
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (true, false));
        assert_eq!(buf, b"short");
        buf.clear();
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (false, false));
        assert_eq!(buf, b"tail");
        buf.clear();
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (false, false));
        assert!(buf.is_empty());
    }

    #[test]
    fn stored_lines_round_trip_and_foreign_lines_are_refused() {
        let e = RunEvent::context_memory(
            3,
            "t",
            "r",
            None,
            &"a".repeat(64),
            "2026-01-01T00:00:00Z".into(),
        );
        assert_eq!(e.metadata["agent_name"], "__default__");
        let line = line::to_line(&e, "alice");
        assert!(line.ends_with('\n'));
        let back = line::from_line(line.trim_end().as_bytes(), "alice");
        assert_eq!(back.as_ref(), Some(&e));
        assert!(line::from_line(line.as_bytes(), "bob").is_none());
        let bad_hash = line.replace(&"a".repeat(64), "not-a-hash");
        assert!(line::from_line(bad_hash.as_bytes(), "alice").is_none());
        assert!(line::from_line(b"{\"seq\":1}", "alice").is_none());
        assert!(line::from_line(b"[]", "alice").is_none());
    }
}
