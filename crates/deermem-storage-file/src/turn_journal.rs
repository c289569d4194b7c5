//! The file turn journal: the `TurnJournal` port as one append-only JSON-lines file under
//! `{root}/.turns/` (a dot-directory, which the Python reference never reads).
//!
//! Every change is one line appended and `fdatasync`ed before the call returns: `add` (a whole
//! item), then `fail`, `dead`, `retry`, `done` and `drop` records naming it. Reading replays the
//! lines in order; a torn last line (a crash in the middle of a write) is ignored and cut off
//! before the next append, and a line that does not parse is skipped with a warning, never a
//! panic. When the file has grown to twice what its live items need (and past a floor), it is
//! rewritten with one `add` line per live item, atomically (temp file, fsync, rename, directory
//! fsync). One process writes a journal at a time: opening it takes an exclusive `flock(2)` on
//! its `journal.lock`, held until the journal is dropped. Several processes on one root each
//! write a journal *slot* of their own, and take over the slots of processes that died
//! ([`DeferredFileTurnJournal`]).
//!
//! Leases ([`TurnJournal::claim`]) are kept in memory: a journal has a single writer process,
//! so a lease only orders the tasks of that process.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::Message;
use deermem_core::Timestamp;
use deermem_core::ports::TurnJournal;
use deermem_core::ports::turn_journal::{
    ClaimRequest, NewTurn, TurnCounts, TurnFilter, TurnId, TurnIdentity, TurnItem,
    TurnJournalError, TurnState, bounded_error,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// The journal's directory name under the storage root.
pub const TURNS_DIR: &str = ".turns";
/// The journal file's name.
pub const JOURNAL_FILE: &str = "journal.jsonl";
const LOCK_FILE: &str = "journal.lock";
/// The file is not compacted below this size.
const COMPACT_FLOOR: u64 = 1024 * 1024;

/// Settings of a [`FileTurnJournal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileTurnJournalOptions {
    /// Bytes of live items (their stored lines) beyond which an append is refused as full
    /// (0: no bound). The engine's pending-bytes limits normally refuse earlier.
    pub max_bytes: u64,
}

impl Default for FileTurnJournalOptions {
    fn default() -> Self {
        Self {
            max_bytes: 512 * 1024 * 1024,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredItem {
    identity: TurnIdentity,
    messages: Vec<Message>,
    accepted_at: Timestamp,
    #[serde(default)]
    attempts: u32,
    #[serde(default)]
    next_attempt_at: Option<Timestamp>,
    #[serde(default)]
    last_error: Option<String>,
    state: TurnState,
}

impl From<&TurnItem> for StoredItem {
    fn from(i: &TurnItem) -> Self {
        Self {
            identity: i.identity.clone(),
            messages: i.messages.clone(),
            accepted_at: i.accepted_at,
            attempts: i.attempts,
            next_attempt_at: i.next_attempt_at,
            last_error: i.last_error.clone(),
            state: i.state,
        }
    }
}

impl From<StoredItem> for TurnItem {
    fn from(s: StoredItem) -> Self {
        Self {
            identity: s.identity,
            messages: s.messages,
            accepted_at: s.accepted_at,
            attempts: s.attempts,
            next_attempt_at: s.next_attempt_at,
            last_error: s.last_error,
            state: s.state,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Record {
    Add {
        item: StoredItem,
    },
    Fail {
        id: TurnId,
        error: String,
        next: Timestamp,
    },
    Dead {
        id: TurnId,
        error: String,
    },
    Retry {
        id: TurnId,
    },
    Done {
        id: TurnId,
    },
    Drop {
        id: TurnId,
    },
}

struct Live {
    item: TurnItem,
    /// Bytes of its `add` line (what compaction would write).
    bytes: u64,
}

struct State {
    file: Option<File>,
    /// Items by append order.
    items: BTreeMap<u64, Live>,
    by_id: HashMap<TurnId, u64>,
    next_seq: u64,
    /// Leases: holder and end.
    leases: HashMap<TurnId, (String, Timestamp)>,
    file_bytes: u64,
    live_bytes: u64,
}

impl State {
    fn get_mut(&mut self, id: &TurnId) -> Option<&mut Live> {
        let seq = *self.by_id.get(id)?;
        self.items.get_mut(&seq)
    }

    fn remove(&mut self, id: &TurnId) -> Option<Live> {
        let seq = self.by_id.remove(id)?;
        self.leases.remove(id);
        let live = self.items.remove(&seq)?;
        self.live_bytes = self.live_bytes.saturating_sub(live.bytes);
        Some(live)
    }

    fn insert(&mut self, item: TurnItem, bytes: u64) {
        if let Some(old) = self.remove(item.id()) {
            drop(old);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_id.insert(item.id().clone(), seq);
        self.items.insert(seq, Live { item, bytes });
        self.live_bytes = self.live_bytes.saturating_add(bytes);
    }

    /// Applies one record read back or just written; `false` when it names no held item.
    fn apply(&mut self, record: Record, line_bytes: u64) -> bool {
        match record {
            Record::Add { item } => {
                self.insert(item.into(), line_bytes);
                true
            }
            Record::Fail { id, error, next } => {
                self.leases.remove(&id);
                let Some(live) = self.get_mut(&id) else {
                    return false;
                };
                live.item.attempts = live.item.attempts.saturating_add(1);
                live.item.last_error = Some(error);
                live.item.next_attempt_at = Some(next);
                true
            }
            Record::Dead { id, error } => {
                self.leases.remove(&id);
                let Some(live) = self.get_mut(&id) else {
                    return false;
                };
                live.item.state = TurnState::Dead;
                live.item.last_error = Some(error);
                true
            }
            Record::Retry { id } => {
                let Some(live) = self.get_mut(&id) else {
                    return false;
                };
                live.item.state = TurnState::Pending;
                live.item.attempts = 0;
                live.item.next_attempt_at = None;
                true
            }
            Record::Done { id } | Record::Drop { id } => self.remove(&id).is_some(),
        }
    }
}

/// What the blocking tasks of a [`FileTurnJournal`] share.
struct Shared {
    dir: PathBuf,
    path: PathBuf,
    options: FileTurnJournalOptions,
    state: Mutex<State>,
}

/// The file turn journal (see the module documentation).
pub struct FileTurnJournal {
    shared: Arc<Shared>,
    /// Held (with its `flock`) for the journal's lifetime.
    _lock: File,
}

impl std::fmt::Debug for FileTurnJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTurnJournal")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

fn unavailable(
    what: &str,
    path: &Path,
    e: impl std::error::Error + Send + Sync + 'static,
) -> TurnJournalError {
    TurnJournalError::unavailable(format!("{what} {}: {e}", path.display()), e)
}

fn line_of(record: &Record) -> Result<String, TurnJournalError> {
    let mut line = serde_json::to_string(record)
        .map_err(|e| TurnJournalError::Invalid(format!("cannot encode a journal record: {e}")))?;
    line.push('\n');
    Ok(line)
}

/// Reads the items a journal file holds (without taking its lock), for an operator's listing
/// while its owner runs. Returns the items and the length of the file's valid prefix.
fn read_file(path: &Path) -> Result<(State, u64), TurnJournalError> {
    let mut state = State {
        file: None,
        items: BTreeMap::new(),
        by_id: HashMap::new(),
        next_seq: 0,
        leases: HashMap::new(),
        file_bytes: 0,
        live_bytes: 0,
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((state, 0)),
        Err(e) => return Err(unavailable("Failed to read", path, e)),
    };
    let mut valid = 0u64;
    let mut skipped = 0usize;
    let mut start = 0usize;
    while let Some(len) = bytes[start..].iter().position(|b| *b == b'\n') {
        let line = &bytes[start..start + len];
        start += len + 1;
        valid = start as u64;
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Record>(line) {
            Ok(record) => {
                state.apply(record, len as u64 + 1);
            }
            Err(_) => skipped += 1,
        }
    }
    if skipped > 0 {
        tracing::warn!(path = %path.display(), skipped, "turn journal lines that do not parse were skipped");
    }
    if (start as u64) < bytes.len() as u64 {
        tracing::warn!(path = %path.display(), bytes = bytes.len() - start, "the turn journal's last line is incomplete (a write was cut short); it is ignored");
    }
    state.file_bytes = valid;
    Ok((state, valid))
}

impl FileTurnJournal {
    /// The journal directory of a storage root.
    pub fn dir_for_storage_root(root: &Path) -> PathBuf {
        root.join(TURNS_DIR)
    }

    /// Opens (or creates) the journal in `dir`, replaying its file, and takes its lock.
    ///
    /// # Errors
    /// `Unavailable` when the directory cannot be created or read, or when another process
    /// holds the journal.
    pub fn open(
        dir: impl Into<PathBuf>,
        options: FileTurnJournalOptions,
    ) -> Result<Self, TurnJournalError> {
        let dir = dir.into();
        match Self::try_open(&dir, options)? {
            Some(j) => Ok(j),
            None => Err(TurnJournalError::Unavailable {
                message: format!(
                    "the turn journal in {} is held by another process",
                    dir.display()
                ),
                source: None,
            }),
        }
    }

    /// Opens (or creates) the journal in `dir` unless another live process holds it
    /// (`None`): the lock is an `flock(2)`, released by the kernel when its holder dies.
    ///
    /// # Errors
    /// `Unavailable` when the directory cannot be created or read.
    pub fn try_open(
        dir: &Path,
        options: FileTurnJournalOptions,
    ) -> Result<Option<Self>, TurnJournalError> {
        let dir = dir.to_path_buf();
        crate::fsutil::create_dir_all(&dir)
            .map_err(|e| unavailable("Failed to create", &dir, e))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&lock_path)
            .map_err(|e| unavailable("Failed to open", &lock_path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => {
                return Err(unavailable("Failed to lock", &lock_path, e));
            }
        }
        let path = dir.join(JOURNAL_FILE);
        let (mut state, valid) = read_file(&path)?;
        if path.exists() {
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| unavailable("Failed to open", &path, e))?;
            // Cut a torn last line off so the next record starts on a line of its own.
            if f.metadata().map(|m| m.len()).unwrap_or(valid) != valid {
                f.set_len(valid)
                    .and_then(|()| f.sync_data())
                    .map_err(|e| unavailable("Failed to truncate", &path, e))?;
            }
        }
        state.file_bytes = valid;
        Ok(Some(Self {
            shared: Arc::new(Shared {
                dir,
                path,
                options,
                state: Mutex::new(state),
            }),
            _lock: lock,
        }))
    }

    /// Opens the journal of a storage root (`{root}/.turns`).
    ///
    /// # Errors
    /// As [`FileTurnJournal::open`].
    pub fn open_in_root(
        root: &Path,
        options: FileTurnJournalOptions,
    ) -> Result<Self, TurnJournalError> {
        Self::open(Self::dir_for_storage_root(root), options)
    }

    /// The items of the journal in a storage root, read without taking its lock (an operator's
    /// view while another process owns it), oldest accepted first.
    ///
    /// # Errors
    /// `Unavailable` when the file cannot be read.
    pub fn read_items(root: &Path) -> Result<Vec<TurnItem>, TurnJournalError> {
        let mut all = Vec::new();
        for dir in slot_dirs(&Self::dir_for_storage_root(root)) {
            let (state, _) = read_file(&dir.join(JOURNAL_FILE))?;
            all.extend(sorted(&state, &TurnFilter::default()));
        }
        all.sort_by_key(|i| i.accepted_at);
        Ok(all)
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Bytes of the journal file (its valid part).
    pub fn file_bytes(&self) -> u64 {
        self.shared.state.lock().file_bytes
    }

    /// Runs `f` under the state's lock on the blocking pool (it writes and fsyncs).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Shared, &mut State) -> Result<T, TurnJournalError> + Send + 'static,
    ) -> Result<T, TurnJournalError> {
        let shared = Arc::clone(&self.shared);
        let joined = tokio::task::spawn_blocking(move || {
            let mut state = shared.state.lock();
            f(&shared, &mut state)
        })
        .await;
        match joined {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(TurnJournalError::unavailable(
                "the turn journal task was cancelled",
                e,
            )),
        }
    }
}

impl Shared {
    /// Writes `line` at the end of the file and makes it durable.
    fn write_line(&self, state: &mut State, line: &str) -> Result<(), TurnJournalError> {
        if state.file.is_none() {
            let created = !self.path.exists();
            let f = OpenOptions::new()
                .append(true)
                .create(true)
                .open(&self.path)
                .map_err(|e| unavailable("Failed to open", &self.path, e))?;
            if created {
                crate::fsutil::fsync_dir(&self.dir)
                    .map_err(|e| unavailable("Failed to fsync", &self.dir, e))?;
            }
            state.file = Some(f);
        }
        let Some(f) = state.file.as_mut() else {
            return Err(TurnJournalError::Invalid("journal file missing".into()));
        };
        crate::fault::point("turns-before-append");
        let written = f.write_all(line.as_bytes()).and_then(|()| f.sync_data());
        if let Err(e) = written {
            // Part of the line may be in the file: reopen (and cut it off) before the next one.
            state.file = None;
            if let Ok(f) = OpenOptions::new().write(true).open(&self.path) {
                let _ = f.set_len(state.file_bytes).and_then(|()| f.sync_data());
            }
            return Err(unavailable("Failed to append to", &self.path, e));
        }
        state.file_bytes += line.len() as u64;
        Ok(())
    }

    /// Appends a record naming an item and applies it; `false` (nothing written) when the item
    /// is not held or `applies` refuses it.
    fn change(
        &self,
        state: &mut State,
        id: &TurnId,
        applies: impl FnOnce(&TurnItem) -> bool,
        record: Record,
    ) -> Result<bool, TurnJournalError> {
        let held = state
            .by_id
            .get(id)
            .and_then(|seq| state.items.get(seq))
            .is_some_and(|l| applies(&l.item));
        if !held {
            return Ok(false);
        }
        let line = line_of(&record)?;
        self.write_line(state, &line)?;
        state.apply(record, 0);
        self.maybe_compact(state);
        Ok(true)
    }

    fn maybe_compact(&self, state: &mut State) {
        let threshold = COMPACT_FLOOR.max(state.live_bytes.saturating_mul(2));
        if state.file_bytes <= threshold {
            return;
        }
        if let Err(e) = self.compact(state) {
            tracing::warn!(path = %self.path.display(), error = %e, "turn journal compaction failed; keeping the longer file");
        }
    }

    /// Rewrites the file with one `add` line per live item, atomically.
    fn compact(&self, state: &mut State) -> Result<(), TurnJournalError> {
        let mut text = String::with_capacity(usize::try_from(state.live_bytes).unwrap_or(0));
        for live in state.items.values() {
            text.push_str(&line_of(&Record::Add {
                item: StoredItem::from(&live.item),
            })?);
        }
        crate::fsutil::atomic_write(&self.path, text.as_bytes())
            .map_err(|e| unavailable("Failed to compact", &self.path, e))?;
        state.file = None;
        state.file_bytes = text.len() as u64;
        Ok(())
    }
}

fn sorted(state: &State, filter: &TurnFilter) -> Vec<TurnItem> {
    let mut items: Vec<(Timestamp, u64, &TurnItem)> = state
        .items
        .iter()
        .filter(|(_, l)| filter.matches(&l.item))
        .map(|(seq, l)| (l.item.accepted_at, *seq, &l.item))
        .collect();
    items.sort_by_key(|(at, seq, _)| (*at, *seq));
    items.into_iter().map(|(_, _, i)| i.clone()).collect()
}

impl FileTurnJournal {
    /// Appends `turn`, leased to `lease`'s owner until its end when given.
    async fn append_with(
        &self,
        turn: NewTurn,
        lease: Option<(String, Timestamp)>,
    ) -> Result<TurnItem, TurnJournalError> {
        self.run(move |me, state| {
            if state.by_id.contains_key(&turn.identity.id) {
                return Err(TurnJournalError::Duplicate(turn.identity.id.clone()));
            }
            let item = TurnItem::new(turn);
            let record = Record::Add {
                item: StoredItem::from(&item),
            };
            let line = line_of(&record)?;
            let bytes = line.len() as u64;
            let max = me.options.max_bytes;
            if max > 0 && state.live_bytes.saturating_add(bytes) > max {
                return Err(TurnJournalError::Full {
                    message: format!(
                        "{} bytes held + {bytes} > {max} bytes in {}",
                        state.live_bytes,
                        me.path.display()
                    ),
                });
            }
            me.write_line(state, &line)?;
            crate::fault::point("turns-after-append");
            state.insert(item.clone(), bytes);
            if let Some(lease) = lease {
                state.leases.insert(item.id().clone(), lease);
            }
            me.maybe_compact(state);
            Ok(item)
        })
        .await
    }
}

#[async_trait]
impl TurnJournal for FileTurnJournal {
    async fn append(&self, turn: NewTurn) -> Result<TurnItem, TurnJournalError> {
        self.append_with(turn, None).await
    }

    async fn append_leased(
        &self,
        turn: NewTurn,
        owner: &str,
        lease: Duration,
    ) -> Result<TurnItem, TurnJournalError> {
        let micros = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
        let until = turn.accepted_at.saturating_add_micros(micros);
        self.append_with(turn, Some((owner.to_owned(), until)))
            .await
    }

    async fn complete(&self, id: &TurnId) -> Result<bool, TurnJournalError> {
        let id = id.clone();
        self.run(move |me, state| me.change(state, &id, |_| true, Record::Done { id: id.clone() }))
            .await
    }

    async fn record_failure(
        &self,
        id: &TurnId,
        error: &str,
        next_attempt_at: Timestamp,
    ) -> Result<Option<TurnItem>, TurnJournalError> {
        let id = id.clone();
        let error = bounded_error(error);
        self.run(move |me, state| {
            let record = Record::Fail {
                id: id.clone(),
                error,
                next: next_attempt_at,
            };
            if !me.change(state, &id, |_| true, record)? {
                return Ok(None);
            }
            Ok(state.get_mut(&id).map(|l| l.item.clone()))
        })
        .await
    }

    async fn dead_letter(&self, id: &TurnId, error: &str) -> Result<bool, TurnJournalError> {
        let id = id.clone();
        let error = bounded_error(error);
        self.run(move |me, state| {
            let record = Record::Dead {
                id: id.clone(),
                error,
            };
            me.change(state, &id, |i| i.state == TurnState::Pending, record)
        })
        .await
    }

    async fn retry(&self, id: &TurnId) -> Result<Option<TurnItem>, TurnJournalError> {
        let id = id.clone();
        self.run(move |me, state| {
            let record = Record::Retry { id: id.clone() };
            if !me.change(state, &id, |i| i.state == TurnState::Dead, record)? {
                return Ok(None);
            }
            Ok(state.get_mut(&id).map(|l| l.item.clone()))
        })
        .await
    }

    async fn drop_turn(&self, id: &TurnId) -> Result<bool, TurnJournalError> {
        let id = id.clone();
        self.run(move |me, state| me.change(state, &id, |_| true, Record::Drop { id: id.clone() }))
            .await
    }

    async fn list(&self, filter: &TurnFilter) -> Result<Vec<TurnItem>, TurnJournalError> {
        Ok(sorted(&self.shared.state.lock(), filter))
    }

    async fn counts(&self) -> Result<TurnCounts, TurnJournalError> {
        let state = self.shared.state.lock();
        let mut counts = TurnCounts::default();
        for live in state.items.values() {
            match live.item.state {
                TurnState::Pending => counts.pending += 1,
                TurnState::Dead => counts.dead += 1,
            }
        }
        Ok(counts)
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<TurnItem>, TurnJournalError> {
        let mut state = self.shared.state.lock();
        let micros = i64::try_from(request.lease.as_micros()).unwrap_or(i64::MAX);
        let until = request.now.saturating_add_micros(micros);
        let candidates = sorted(
            &state,
            &TurnFilter {
                user: None,
                state: Some(TurnState::Pending),
            },
        );
        let mut claimed = Vec::new();
        for item in candidates {
            if request.limit > 0 && claimed.len() >= request.limit {
                break;
            }
            let free = state
                .leases
                .get(item.id())
                .is_none_or(|(owner, end)| *owner == request.owner || *end <= request.now);
            if free {
                state
                    .leases
                    .insert(item.id().clone(), (request.owner.clone(), until));
                claimed.push(item);
            }
        }
        Ok(claimed)
    }

    async fn release(&self, id: &TurnId, owner: &str) -> Result<(), TurnJournalError> {
        let mut state = self.shared.state.lock();
        if state.leases.get(id).is_some_and(|(o, _)| o == owner) {
            state.leases.remove(id);
        }
        Ok(())
    }
}

/// The most journals one storage root holds: one per process writing it at once.
pub const MAX_JOURNAL_SLOTS: usize = 64;

/// The journal directory of slot `n` under `turns` (the `.turns` directory): slot 0 is
/// `.turns` itself (the layout of a single process), slot `n` is `.turns/{n}`.
fn slot_dir(turns: &Path, n: usize) -> PathBuf {
    if n == 0 {
        turns.to_path_buf()
    } else {
        turns.join(n.to_string())
    }
}

/// The slot directories that exist under `turns`, slot 0 first.
fn slot_dirs(turns: &Path) -> Vec<PathBuf> {
    (0..MAX_JOURNAL_SLOTS)
        .map(|n| slot_dir(turns, n))
        .filter(|d| d.join(JOURNAL_FILE).is_file() || (d == turns && d.is_dir()))
        .collect()
}

/// The turn journals of one storage root as one process sees them: its own journal, opened on
/// first use, and the journals of processes that died with turns in them, adopted.
///
/// Several processes may accept turns on one root at once (DeerFlow's worker processes, a
/// server beside another): each writes a journal of its own, in the first *slot* whose lock no
/// live process holds (`.turns/journal.jsonl` for the first, `.turns/1/journal.jsonl` for the
/// second, … up to [`MAX_JOURNAL_SLOTS`]). The lock is an `flock(2)`, so a process that dies
/// (SIGKILL included) frees its slot at once. Every claim round (the engine's start-up replay
/// and its periodic claims) also takes the lock of every other slot that is free and still
/// holds turns, and processes those turns as its own: a turn acknowledged by a process that
/// died is applied by a survivor, or by the next process to start. An adopted journal is let go
/// (its slot freed) once it is empty.
///
/// A process that never accepts or lists a turn (a one-shot command) never takes a lock, and
/// reads of a root that never accepted a turn create nothing. A failed open is tried again on
/// the next call.
pub struct DeferredFileTurnJournal {
    dir: PathBuf,
    options: FileTurnJournalOptions,
    opened: tokio::sync::Mutex<Option<Arc<FileTurnJournal>>>,
    adopted: tokio::sync::Mutex<Vec<Arc<FileTurnJournal>>>,
}

impl std::fmt::Debug for DeferredFileTurnJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredFileTurnJournal")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Runs blocking journal work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TurnJournalError> + Send + 'static,
) -> Result<T, TurnJournalError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TurnJournalError::unavailable("the turn journal task failed", e))?
}

impl DeferredFileTurnJournal {
    /// The journals of a storage root (`{root}/.turns`), opened on first use.
    pub fn in_root(root: &Path, options: FileTurnJournalOptions) -> Self {
        Self {
            dir: FileTurnJournal::dir_for_storage_root(root),
            options,
            opened: tokio::sync::Mutex::new(None),
            adopted: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    /// This process's own journal: a journal it adopted (its own from before a restart, or a
    /// dead process's), else the first free slot; opened once, then kept.
    async fn get(&self) -> Result<Arc<FileTurnJournal>, TurnJournalError> {
        let mut slot = self.opened.lock().await;
        if let Some(j) = slot.as_ref() {
            return Ok(Arc::clone(j));
        }
        {
            let mut adopted = self.adopted.lock().await;
            if !adopted.is_empty() {
                let j = adopted.remove(0);
                *slot = Some(Arc::clone(&j));
                return Ok(j);
            }
        }
        let (dir, options) = (self.dir.clone(), self.options);
        let opened = blocking(move || {
            for n in 0..MAX_JOURNAL_SLOTS {
                if let Some(j) = FileTurnJournal::try_open(&slot_dir(&dir, n), options)? {
                    return Ok(j);
                }
            }
            Err(TurnJournalError::Unavailable {
                message: format!(
                    "all {MAX_JOURNAL_SLOTS} turn journal slots in {} are held by live processes",
                    dir.display()
                ),
                source: None,
            })
        })
        .await?;
        let j = Arc::new(opened);
        *slot = Some(Arc::clone(&j));
        Ok(j)
    }

    /// Takes over every free slot that still holds turns (its process died, or it is this
    /// process's own from before a restart) and lets go of adopted journals that are empty;
    /// returns the journals this process now holds. A root that never accepted a turn (no
    /// `.turns` directory) is left as it is: reads create nothing.
    async fn adopt(&self) -> Result<Vec<Arc<FileTurnJournal>>, TurnJournalError> {
        let own = self.opened.lock().await.clone();
        let mut adopted = self.adopted.lock().await;
        let mut kept = Vec::with_capacity(adopted.len());
        for j in adopted.drain(..) {
            let c = j.counts().await?;
            if c.pending + c.dead > 0 {
                kept.push(j);
            }
        }
        *adopted = kept;
        // One stat: cheaper than a hand-off to the blocking pool.
        if self.dir.try_exists().unwrap_or(true) {
            let (dir, options) = (self.dir.clone(), self.options);
            let mut held: Vec<PathBuf> = adopted.iter().map(|j| j.shared.dir.clone()).collect();
            if let Some(o) = &own {
                held.push(o.shared.dir.clone());
            }
            let found = blocking(move || {
                let mut found = Vec::new();
                for d in slot_dirs(&dir) {
                    if held.contains(&d) {
                        continue;
                    }
                    if let Some(j) = FileTurnJournal::try_open(&d, options)? {
                        let n = j.shared.state.lock().items.len();
                        if n > 0 {
                            tracing::info!(journal = %j.path().display(), turns = n, "taking over a turn journal no live process holds; its turns are applied here");
                            found.push(Arc::new(j));
                        }
                    }
                }
                Ok(found)
            })
            .await?;
            adopted.extend(found);
        }
        let mut all: Vec<Arc<FileTurnJournal>> = own.into_iter().collect();
        all.extend(adopted.iter().cloned());
        Ok(all)
    }

    /// The journals held now (own first), without scanning for free slots.
    async fn held(&self) -> Result<Vec<Arc<FileTurnJournal>>, TurnJournalError> {
        let mut all: Vec<Arc<FileTurnJournal>> = self.opened.lock().await.iter().cloned().collect();
        all.extend(self.adopted.lock().await.iter().cloned());
        Ok(all)
    }

    /// Runs `op` on the held journals until one reports it held the item; when none did, on
    /// freshly adopted ones (an operator's retry or drop of a dead process's turn). `None`
    /// when no journal holds it.
    async fn on_holder(&self, op: Op<'_>) -> Result<Option<Option<TurnItem>>, TurnJournalError> {
        let held = self.held().await?;
        for j in &held {
            if let Some(v) = op.run(j).await? {
                return Ok(Some(v));
            }
        }
        let all = self.adopt().await?;
        for j in all
            .iter()
            .filter(|j| !held.iter().any(|h| Arc::ptr_eq(h, j)))
        {
            if let Some(v) = op.run(j).await? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }
}

/// A change to one item, routed to the journal that holds it.
enum Op<'a> {
    Complete(&'a TurnId),
    Fail(&'a TurnId, &'a str, Timestamp),
    Dead(&'a TurnId, &'a str),
    Retry(&'a TurnId),
    Drop(&'a TurnId),
}

impl Op<'_> {
    /// `None` when `j` does not hold the item; else the changed item when the change returns
    /// one.
    async fn run(&self, j: &FileTurnJournal) -> Result<Option<Option<TurnItem>>, TurnJournalError> {
        Ok(match *self {
            Self::Complete(id) => j.complete(id).await?.then_some(None),
            Self::Fail(id, error, next) => j.record_failure(id, error, next).await?.map(Some),
            Self::Dead(id, error) => j.dead_letter(id, error).await?.then_some(None),
            Self::Retry(id) => j.retry(id).await?.map(Some),
            Self::Drop(id) => j.drop_turn(id).await?.then_some(None),
        })
    }
}

#[async_trait]
impl TurnJournal for DeferredFileTurnJournal {
    async fn append(&self, turn: NewTurn) -> Result<TurnItem, TurnJournalError> {
        self.get().await?.append(turn).await
    }
    async fn append_leased(
        &self,
        turn: NewTurn,
        owner: &str,
        lease: Duration,
    ) -> Result<TurnItem, TurnJournalError> {
        self.get().await?.append_leased(turn, owner, lease).await
    }
    async fn complete(&self, id: &TurnId) -> Result<bool, TurnJournalError> {
        Ok(self.on_holder(Op::Complete(id)).await?.is_some())
    }
    async fn record_failure(
        &self,
        id: &TurnId,
        error: &str,
        next_attempt_at: Timestamp,
    ) -> Result<Option<TurnItem>, TurnJournalError> {
        Ok(self
            .on_holder(Op::Fail(id, error, next_attempt_at))
            .await?
            .flatten())
    }
    async fn dead_letter(&self, id: &TurnId, error: &str) -> Result<bool, TurnJournalError> {
        Ok(self.on_holder(Op::Dead(id, error)).await?.is_some())
    }
    async fn retry(&self, id: &TurnId) -> Result<Option<TurnItem>, TurnJournalError> {
        Ok(self.on_holder(Op::Retry(id)).await?.flatten())
    }
    async fn drop_turn(&self, id: &TurnId) -> Result<bool, TurnJournalError> {
        Ok(self.on_holder(Op::Drop(id)).await?.is_some())
    }
    async fn list(&self, filter: &TurnFilter) -> Result<Vec<TurnItem>, TurnJournalError> {
        let mut all = Vec::new();
        for j in self.adopt().await? {
            all.extend(j.list(filter).await?);
        }
        all.sort_by_key(|i| i.accepted_at);
        Ok(all)
    }
    async fn counts(&self) -> Result<TurnCounts, TurnJournalError> {
        let mut total = TurnCounts::default();
        for j in self.adopt().await? {
            let c = j.counts().await?;
            total.pending += c.pending;
            total.dead += c.dead;
        }
        Ok(total)
    }
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<TurnItem>, TurnJournalError> {
        let mut claimed = Vec::new();
        for j in self.adopt().await? {
            let left = if request.limit == 0 {
                0
            } else {
                match request.limit.checked_sub(claimed.len()) {
                    Some(0) | None => break,
                    Some(n) => n,
                }
            };
            let r = ClaimRequest {
                limit: left,
                ..request.clone()
            };
            claimed.extend(j.claim(&r).await?);
        }
        claimed.sort_by_key(|i| i.accepted_at);
        Ok(claimed)
    }
    async fn release(&self, id: &TurnId, owner: &str) -> Result<(), TurnJournalError> {
        for j in self.held().await? {
            j.release(id, owner).await?;
        }
        Ok(())
    }
}
