//! The debounced update queue, on tokio.
//!
//! Items coalesce per `(thread, user, agent)`: the latest messages win and signals are unioned.
//! Unlike the reference's single global timer, every conversation has its own deadline, so one busy
//! thread never delays the others. Emergency items (`bypass_watermark`) are due at once and never
//! replace a normal item. Items of one conversation run one at a time; by default items run one at
//! a time overall, like the reference. A processor error or panic is logged and counted; the queue
//! keeps going.
//!
//! The bytes of the turns it holds are bounded per user and overall: an item is counted from the
//! moment it is queued until its processing ends (or it is dropped or replaced), and an item that
//! would take a user or everyone past the limit is refused ([`QueueError::TooManyBytes`]), signals
//! and emergencies included.
//!
//! With a turn journal ([`UpdateQueue::with_turns`]) an item carries the journal ids of the
//! turns it stands for (several, once coalesced): they are marked done after a successful
//! processing; after a failure they are retried with backoff or dead-lettered (see
//! [`crate::turns`]), and an item waiting for its retry neither blocks a flush nor counts as
//! new work. Without a journal a failure is logged and the item is gone, as in the reference.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deermem_core::ports::turn_journal::TurnId;
use deermem_core::{OverloadScope, UserId};
use deermem_updater::DeerMemConfig;
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use deermem_updater::ConversationKey;
use deermem_updater::{UpdateProcessor, UpdateRequest};

use crate::turns::TurnLog;

/// Queue settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// How long a conversation stays quiet before it is processed.
    pub debounce: Duration,
    /// Pending items beyond which non-signal items of new conversations are refused
    /// (0 = unlimited).
    pub max_depth: u64,
    /// Conversations processed at the same time (at least 1; items of one conversation never
    /// overlap).
    pub max_concurrency: usize,
    /// Bytes of turns one user may have queued or in processing (0 = unlimited).
    pub max_user_bytes: u64,
    /// Bytes of turns queued or in processing for everyone (0 = unlimited).
    pub max_total_bytes: u64,
}

impl QueueConfig {
    /// The settings of a DeerMem configuration (`debounce_seconds`, `queue_max_depth`,
    /// `queue_max_pending_bytes_per_user`, `queue_max_pending_bytes`), one item at a time.
    pub fn from_config(cfg: &DeerMemConfig) -> Self {
        Self {
            debounce: Duration::from_secs(cfg.debounce_seconds),
            max_depth: cfg.queue_max_depth,
            max_concurrency: 1,
            max_user_bytes: cfg.queue_max_pending_bytes_per_user,
            max_total_bytes: cfg.queue_max_pending_bytes,
        }
    }
}

/// Why an item was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// Backpressure: the queue is full and the item carries no signal.
    #[error(
        "memory update queue is full (depth {depth} >= {max}); non-signal update for thread {thread_id} rejected"
    )]
    Full {
        /// Pending items.
        depth: usize,
        /// The limit.
        max: u64,
        /// The refused thread.
        thread_id: String,
    },
    /// The item's bytes would take its user (or everyone) past the pending-bytes limit.
    #[error(
        "memory update queue holds too many pending bytes {}: {pending} + {item} > {max}; update for thread {thread_id} refused",
        limit_name(*.scope)
    )]
    TooManyBytes {
        /// Which limit.
        scope: OverloadScope,
        /// Bytes already pending under that limit (without an item this one replaces).
        pending: u64,
        /// The refused item's bytes.
        item: u64,
        /// The limit.
        max: u64,
        /// The refused thread.
        thread_id: String,
    },
    /// The queue was closed.
    #[error("memory update queue is closed")]
    Closed,
    /// The queue was created outside a tokio runtime.
    #[error("memory update queue needs a tokio runtime")]
    NoRuntime,
}

fn limit_name(scope: OverloadScope) -> &'static str {
    match scope {
        OverloadScope::User => "for this user",
        _ => "in total",
    }
}

/// Counters since the queue started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Items queued (new or coalesced).
    pub enqueued: u64,
    /// Items that replaced a pending item of the same conversation.
    pub coalesced: u64,
    /// Items refused by backpressure (depth or bytes).
    pub rejected: u64,
    /// Items processed successfully.
    pub succeeded: u64,
    /// Items whose processing returned an error.
    pub failed: u64,
    /// Items whose processing panicked.
    pub panicked: u64,
}

struct Pending {
    key: ConversationKey,
    request: UpdateRequest,
    due: Instant,
    /// What the item counts against the byte limits.
    bytes: u64,
    /// The journal ids of the turns it stands for.
    turns: Vec<TurnId>,
    /// Failed attempts so far.
    attempts: u32,
    /// Waiting for a retry after a failure (does not hold a flush back).
    retrying: bool,
}

/// How a processing ended.
enum Finished {
    Succeeded,
    Failed,
    /// Failed; to be tried again after the pause.
    Retry(Box<Pending>),
}

/// Bytes of the turns the queue holds (pending or being processed), per user and in total.
#[derive(Default)]
struct ByteCount {
    total: u64,
    by_user: HashMap<Option<UserId>, u64>,
}

impl ByteCount {
    fn user(&self, user: Option<&UserId>) -> u64 {
        self.by_user.get(&user.cloned()).copied().unwrap_or(0)
    }

    fn add(&mut self, user: Option<&UserId>, bytes: u64) {
        self.total = self.total.saturating_add(bytes);
        *self.by_user.entry(user.cloned()).or_default() += bytes;
    }

    fn release(&mut self, user: Option<&UserId>, bytes: u64) {
        self.total = self.total.saturating_sub(bytes);
        let key = user.cloned();
        if let Some(n) = self.by_user.get_mut(&key) {
            *n = n.saturating_sub(bytes);
            if *n == 0 {
                self.by_user.remove(&key);
            }
        }
    }
}

#[derive(Default)]
struct State {
    pending: Vec<Pending>,
    in_flight: HashSet<ConversationKey>,
    flushing: usize,
    shutting_down: bool,
    closed: bool,
    stats: QueueStats,
    bytes: ByteCount,
    /// Journal ids of the turns queued or being processed.
    turn_ids: HashSet<TurnId>,
}

impl State {
    /// Whether nothing but retries waiting for their pause is left.
    fn idle(&self) -> bool {
        self.in_flight.is_empty() && self.pending.iter().all(|p| p.retrying)
    }
}

/// What an item counts against the byte limits: the text and JSON it holds, plus a small
/// constant per message and value for the structures around them (an estimate of the memory
/// it keeps, not an exact figure).
pub fn request_bytes(request: &UpdateRequest) -> u64 {
    const ITEM: u64 = 256;
    const MESSAGE: u64 = 128;
    let strings = request.thread_id.len() + request.trace_id.as_ref().map_or(0, String::len);
    let mut total = ITEM + strings as u64;
    for m in &request.messages {
        let texts = [&m.id, &m.name, &m.tool_call_id, &m.status]
            .iter()
            .map(|s| s.as_ref().map_or(0, String::len))
            .sum::<usize>();
        total = total
            .saturating_add(MESSAGE + texts as u64 + value_bytes(&m.content))
            .saturating_add(m.tool_calls.iter().map(value_bytes).sum::<u64>())
            .saturating_add(
                m.additional_kwargs
                    .iter()
                    .map(|(k, v)| k.len() as u64 + value_bytes(v))
                    .sum::<u64>(),
            );
    }
    total
}

/// The estimated size of a JSON value (iterative: no recursion on deep values).
fn value_bytes(v: &Value) -> u64 {
    const NODE: u64 = 32;
    let mut total = 0u64;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total = total.saturating_add(NODE);
        match v {
            Value::String(s) => total = total.saturating_add(s.len() as u64),
            Value::Array(items) => stack.extend(items.iter()),
            Value::Object(m) => {
                for (k, x) in m {
                    total = total.saturating_add(k.len() as u64);
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    total
}

struct Inner {
    state: Mutex<State>,
    wake: Notify,
    progress: watch::Sender<u64>,
    processor: Arc<dyn UpdateProcessor>,
    config: QueueConfig,
    turns: Option<TurnLog>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.progress.send_modify(|v| *v = v.wrapping_add(1));
    }
}

struct WorkerGuard(AbortHandle);

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The queue handle. Cheap to clone; the worker stops when the last handle is dropped.
#[derive(Clone)]
pub struct UpdateQueue {
    inner: Arc<Inner>,
    _worker: Arc<WorkerGuard>,
}

impl fmt::Debug for UpdateQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.inner.lock();
        f.debug_struct("UpdateQueue")
            .field("config", &self.inner.config)
            .field("pending", &s.pending.len())
            .field("in_flight", &s.in_flight.len())
            .field("stats", &s.stats)
            .finish()
    }
}

struct FlushGuard<'a>(&'a Inner);

impl Drop for FlushGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.flushing = s.flushing.saturating_sub(1);
    }
}

impl UpdateQueue {
    /// Starts a queue (and its worker task) on the current tokio runtime.
    ///
    /// # Errors
    /// [`QueueError::NoRuntime`] outside a runtime.
    pub fn new(
        processor: Arc<dyn UpdateProcessor>,
        config: QueueConfig,
    ) -> Result<Self, QueueError> {
        Self::with_turns(processor, config, None)
    }

    /// Starts a queue that records its items' outcomes in a turn journal (see the module
    /// documentation).
    ///
    /// # Errors
    /// [`QueueError::NoRuntime`] outside a runtime.
    pub fn with_turns(
        processor: Arc<dyn UpdateProcessor>,
        config: QueueConfig,
        turns: Option<TurnLog>,
    ) -> Result<Self, QueueError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| QueueError::NoRuntime)?;
        let config = QueueConfig {
            max_concurrency: config.max_concurrency.max(1),
            ..config
        };
        let (progress, _) = watch::channel(0u64);
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            progress,
            processor,
            config,
            turns,
        });
        let worker = handle.spawn(run(inner.clone()));
        Ok(Self {
            inner,
            _worker: Arc::new(WorkerGuard(worker.abort_handle())),
        })
    }

    /// Queues a normal update: it replaces a pending update of the same conversation (the new
    /// messages win, signals are unioned) and is processed after the debounce.
    ///
    /// # Errors
    /// [`QueueError::Full`] under backpressure (never for an item carrying a signal or an
    /// emergency item), [`QueueError::Closed`] after [`UpdateQueue::close`].
    pub fn add(&self, request: UpdateRequest) -> Result<(), QueueError> {
        self.add_turns(request, Vec::new())
    }

    /// Refuses what [`UpdateQueue::add`] would refuse now, without queueing anything (the
    /// check before a turn is written to the journal).
    ///
    /// # Errors
    /// As [`UpdateQueue::add`].
    pub fn check(&self, request: &UpdateRequest) -> Result<(), QueueError> {
        let key = ConversationKey::new(&request.thread_id, request.user.as_ref(), &request.agent);
        let bytes = request_bytes(request);
        let mut s = self.inner.lock();
        self.admit(&mut s, &key, request, bytes).map(|_| ())
    }

    /// Queues an item standing for journal turns, like [`UpdateQueue::add`].
    ///
    /// # Errors
    /// As [`UpdateQueue::add`].
    pub fn add_turns(
        &self,
        mut request: UpdateRequest,
        turns: Vec<TurnId>,
    ) -> Result<(), QueueError> {
        let now = Instant::now();
        let key = ConversationKey::new(&request.thread_id, request.user.as_ref(), &request.agent);
        let bytes = request_bytes(&request);
        {
            let mut s = self.inner.lock();
            let existing = self.admit(&mut s, &key, &request, bytes)?;
            let mut turns = turns;
            if let Some(i) = existing {
                let old = s.pending.remove(i);
                s.bytes.release(old.request.user.as_ref(), old.bytes);
                request.signals = request.signals.union(old.request.signals);
                // The new item's messages include the old one's: it stands for its turns too.
                let mut merged = old.turns;
                merged.append(&mut turns);
                turns = merged;
                s.stats.coalesced += 1;
            }
            let immediate = request.bypass_watermark || s.flushing > 0 || s.shutting_down;
            let due = if immediate {
                now
            } else {
                now + self.inner.config.debounce
            };
            s.stats.enqueued += 1;
            s.bytes.add(request.user.as_ref(), bytes);
            s.turn_ids.extend(turns.iter().cloned());
            s.pending.push(Pending {
                key,
                request,
                due,
                bytes,
                turns,
                attempts: 0,
                retrying: false,
            });
        }
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Queues a replayed journal item due at `due`.
    ///
    /// # Errors
    /// [`QueueError::Closed`].
    pub fn add_replayed(
        &self,
        request: UpdateRequest,
        turns: Vec<TurnId>,
        attempts: u32,
        due: Instant,
    ) -> Result<(), QueueError> {
        let key = ConversationKey::new(&request.thread_id, request.user.as_ref(), &request.agent);
        let bytes = request_bytes(&request);
        {
            let mut s = self.inner.lock();
            if s.closed {
                return Err(QueueError::Closed);
            }
            requeue(
                &mut s,
                Pending {
                    key,
                    request,
                    due,
                    bytes,
                    turns,
                    attempts,
                    retrying: attempts > 0,
                },
                true,
            );
        }
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Whether the queue holds (queued or in processing) the journal turn `id`.
    pub fn holds_turn(&self, id: &TurnId) -> bool {
        self.inner.lock().turn_ids.contains(id)
    }

    /// The limits' decision for a new item: the index of the item it replaces, if any.
    fn admit(
        &self,
        s: &mut State,
        key: &ConversationKey,
        request: &UpdateRequest,
        bytes: u64,
    ) -> Result<Option<usize>, QueueError> {
        if s.closed {
            return Err(QueueError::Closed);
        }
        let existing = s
            .pending
            .iter()
            .position(|p| p.key == *key && p.request.bypass_watermark == request.bypass_watermark);
        let max = self.inner.config.max_depth;
        if existing.is_none()
            && !request.bypass_watermark
            && request.signals.is_empty()
            && max > 0
            && s.pending.len() as u64 >= max
        {
            s.stats.rejected += 1;
            return Err(QueueError::Full {
                depth: s.pending.len(),
                max,
                thread_id: request.thread_id.clone(),
            });
        }
        // The item this one replaces stops counting when it is replaced.
        let replaced = existing.map_or(0, |i| s.pending[i].bytes);
        let user = request.user.as_ref();
        let limits = [
            (
                OverloadScope::User,
                s.bytes.user(user),
                self.inner.config.max_user_bytes,
            ),
            (
                OverloadScope::Global,
                s.bytes.total,
                self.inner.config.max_total_bytes,
            ),
        ];
        for (scope, held, max) in limits {
            let pending = held.saturating_sub(replaced);
            if max > 0 && pending.saturating_add(bytes) > max {
                s.stats.rejected += 1;
                return Err(QueueError::TooManyBytes {
                    scope,
                    pending,
                    item: bytes,
                    max,
                    thread_id: request.thread_id.clone(),
                });
            }
        }
        Ok(existing)
    }

    /// Queues an emergency update (`bypass_watermark` is set): processed at once, beside (not
    /// instead of) a pending normal update, and never refused for depth.
    ///
    /// # Errors
    /// [`QueueError::Closed`] after [`UpdateQueue::close`].
    pub fn add_nowait(&self, mut request: UpdateRequest) -> Result<(), QueueError> {
        request.bypass_watermark = true;
        self.add(request)
    }

    /// Makes every pending item due now without waiting (the reference's `flush_nowait`).
    pub fn flush_now(&self) {
        {
            let mut s = self.inner.lock();
            let now = Instant::now();
            for p in s.pending.iter_mut().filter(|p| !p.retrying) {
                p.due = now;
            }
        }
        self.inner.wake.notify_one();
    }

    /// Processes everything pending now (and anything queued meanwhile) and waits until the
    /// queue is idle or `timeout` passes. Returns true only if it drained completely; items
    /// not finished in time keep running in the background.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.progress.subscribe();
        {
            let mut s = self.inner.lock();
            s.flushing += 1;
        }
        let _guard = FlushGuard(&self.inner);
        self.flush_now();
        let inner = &self.inner;
        tokio::time::timeout(timeout, async move {
            loop {
                rx.borrow_and_update();
                {
                    let s = inner.lock();
                    if s.idle() {
                        return;
                    }
                }
                if rx.changed().await.is_err() {
                    // The worker is gone; nothing will drain.
                    std::future::pending::<()>().await;
                }
            }
        })
        .await
        .is_ok()
    }

    /// The shutdown drain: like [`UpdateQueue::flush`], and from now on items are processed
    /// as soon as they arrive (no debounce), so turns that come in during shutdown are not
    /// left waiting.
    pub async fn shutdown_flush(&self, timeout: Duration) -> bool {
        self.inner.lock().shutting_down = true;
        self.flush(timeout).await
    }

    /// Refuses new items from now on (pending and running items still complete).
    pub fn close(&self) {
        self.inner.lock().closed = true;
    }

    /// Drops every pending item (running ones complete); returns how many were dropped.
    pub fn clear(&self) -> usize {
        let n = {
            let mut s = self.inner.lock();
            let dropped = std::mem::take(&mut s.pending);
            for p in &dropped {
                s.bytes.release(p.request.user.as_ref(), p.bytes);
                for id in &p.turns {
                    s.turn_ids.remove(id);
                }
            }
            dropped.len()
        };
        self.inner.bump();
        n
    }

    /// Items waiting to be processed.
    pub fn pending_count(&self) -> usize {
        self.inner.lock().pending.len()
    }

    /// Journal turns queued or being processed.
    pub fn turn_count(&self) -> usize {
        self.inner.lock().turn_ids.len()
    }

    /// Whether an item is being processed.
    pub fn is_processing(&self) -> bool {
        !self.inner.lock().in_flight.is_empty()
    }

    /// Bytes of the items queued or being processed: for one user, and in total.
    pub fn pending_bytes(&self, user: Option<&UserId>) -> (u64, u64) {
        let s = self.inner.lock();
        (s.bytes.user(user), s.bytes.total)
    }

    /// The counters.
    pub fn stats(&self) -> QueueStats {
        self.inner.lock().stats
    }

    /// The settings in use.
    pub fn config(&self) -> QueueConfig {
        self.inner.config
    }
}

/// Takes the items that may start now, in queue order: due, conversation not running, within
/// the concurrency limit. Returns them and the next deadline among the rest.
fn take_ready(s: &mut State, now: Instant, limit: usize) -> (Vec<Pending>, Option<Instant>) {
    let mut ready = Vec::new();
    let mut next: Option<Instant> = None;
    let mut i = 0;
    while i < s.pending.len() {
        let p = &s.pending[i];
        let blocked = s.in_flight.contains(&p.key);
        if p.due <= now && !blocked && s.in_flight.len() < limit {
            let p = s.pending.remove(i);
            s.in_flight.insert(p.key.clone());
            ready.push(p);
            continue;
        }
        if !blocked && p.due > now {
            next = Some(next.map_or(p.due, |n| n.min(p.due)));
        }
        i += 1;
    }
    (ready, next)
}

/// Puts back an item to retry (or a replayed one), bytes counted again without a limit check:
/// it was accepted already. A queued item of the same conversation stands for both instead:
/// the later accepted of the two keeps its messages (they include the other's), `newer` saying
/// whether that is `p` (a replay, oldest first) or the queued one (a retry); signals are unioned.
fn requeue(s: &mut State, p: Pending, newer: bool) {
    s.turn_ids.extend(p.turns.iter().cloned());
    if let Some(existing) = s
        .pending
        .iter_mut()
        .find(|q| q.key == p.key && q.request.bypass_watermark == p.request.bypass_watermark)
    {
        let signals = existing.request.signals.union(p.request.signals);
        existing.turns.extend(p.turns);
        existing.attempts = existing.attempts.max(p.attempts);
        if newer {
            s.bytes
                .release(existing.request.user.as_ref(), existing.bytes);
            existing.request = p.request;
            existing.bytes = p.bytes;
            s.bytes.add(existing.request.user.as_ref(), existing.bytes);
        }
        existing.request.signals = signals;
        return;
    }
    s.bytes.add(p.request.user.as_ref(), p.bytes);
    s.pending.push(p);
}

/// Runs one item and settles its journal turns.
async fn process(
    processor: Arc<dyn UpdateProcessor>,
    turns: Option<TurnLog>,
    p: Pending,
) -> Finished {
    let thread = p.request.thread_id.clone();
    let journaled = turns.filter(|_| !p.turns.is_empty());
    let retry_copy = journaled.as_ref().map(|_| p.request.clone());
    let mut request = p.request;
    if journaled.is_some() {
        // The facts it creates record these turns, so that a replay of them after a crash
        // between the commit and the done-mark is recognised and not extracted again.
        request.turns = p.turns.iter().map(ToString::to_string).collect();
    }
    match processor.process(request).await {
        Ok(outcome) => {
            tracing::debug!(thread_id = %thread, status = ?outcome.status, "memory update processed");
            if let Some(log) = &journaled {
                log.complete(&p.turns).await;
            }
            Finished::Succeeded
        }
        Err(e) => {
            let (Some(log), Some(request)) = (journaled, retry_copy) else {
                tracing::warn!(thread_id = %thread, error = %e, "memory update failed");
                return Finished::Failed;
            };
            let attempts = p.attempts.saturating_add(1);
            let decided = log.failed(&p.turns, attempts, &e).await;
            if decided.retry.is_empty() {
                return Finished::Failed;
            }
            Finished::Retry(Box::new(Pending {
                key: p.key,
                request,
                due: Instant::now() + decided.delay,
                bytes: p.bytes,
                turns: decided.retry,
                attempts,
                retrying: true,
            }))
        }
    }
}

/// What a running item holds until it ends.
struct Running {
    key: ConversationKey,
    user: Option<UserId>,
    bytes: u64,
    turns: Vec<TurnId>,
}

async fn run(inner: Arc<Inner>) {
    let mut tasks: JoinSet<Finished> = JoinSet::new();
    let mut running: HashMap<tokio::task::Id, Running> = HashMap::new();
    loop {
        let (ready, next) = {
            let mut s = inner.lock();
            take_ready(&mut s, Instant::now(), inner.config.max_concurrency)
        };
        for p in ready {
            let held = Running {
                key: p.key.clone(),
                user: p.request.user.clone(),
                bytes: p.bytes,
                turns: p.turns.clone(),
            };
            let handle = tasks.spawn(process(inner.processor.clone(), inner.turns.clone(), p));
            running.insert(handle.id(), held);
        }
        inner.bump();
        tokio::select! {
            () = inner.wake.notified() => {}
            () = sleep_until_opt(next) => {}
            Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let (id, outcome) = match done {
                    Ok((id, finished)) => (id, Some(finished)),
                    Err(e) => (e.id(), None),
                };
                let mut s = inner.lock();
                if let Some(r) = running.remove(&id) {
                    s.in_flight.remove(&r.key);
                    s.bytes.release(r.user.as_ref(), r.bytes);
                    for t in &r.turns {
                        s.turn_ids.remove(t);
                    }
                }
                match outcome {
                    Some(Finished::Succeeded) => s.stats.succeeded += 1,
                    Some(Finished::Failed) => s.stats.failed += 1,
                    Some(Finished::Retry(p)) => {
                        s.stats.failed += 1;
                        requeue(&mut s, *p, false);
                    }
                    None => {
                        s.stats.panicked += 1;
                        tracing::error!("memory update task panicked; the queue carries on (its journal turns stay pending)");
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
