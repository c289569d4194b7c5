//! The pipeline as a manager sees it: admission (filter, trivial turns, signals) in front of
//! the queue for `add` and `add_nowait`, the queue's worker running the updater, the drain at
//! shutdown, and the injection text for `get_context`. A `MemoryManager` is a thin layer over
//! this. With a turn journal, an admitted turn is appended to it (durably) before it is queued,
//! and the journal's pending turns are queued again by [`UpdatePipeline::recover`].

use std::sync::Arc;
use std::time::Duration;

use deermem_core::ports::turn_journal::{ClaimRequest, TurnJournalError};

use deermem_core::{AgentName, MemoryMode, Message, StorageError, UserId};
use deermem_updater::TokenCounting;

use crate::queue::{QueueConfig, QueueError, UpdateQueue};
use crate::rendered::{RenderedBlocks, RenderedCacheUsage};
use crate::turns::{TurnLog, fresh_turn_id, new_turn, request_of};
use deermem_updater::SignalSet;
use deermem_updater::{HiddenMessagePolicy, admit};
use deermem_updater::{InjectionOptions, format_memory_for_injection};
use deermem_updater::{MemoryUpdater, UpdateRequest};

/// What happened to a submitted conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// Queued, with the signals seen at admission.
    Queued {
        /// Signals of the last six filtered messages.
        signals: SignalSet,
    },
    /// Nothing to learn from: no user turn or no assistant turn survived filtering.
    NotAdmitted,
    /// Refused by the queue (backpressure or closed); the turn is picked up again with the
    /// conversation's next turn, because the watermark did not move.
    Refused(QueueError),
    /// The turn journal could not keep the turn (full, or failing): it was not accepted.
    NotKept {
        /// Why.
        message: String,
        /// The journal is full (retry later) rather than failing.
        full: bool,
    },
}

/// Who and where a conversation belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The host thread id.
    pub thread_id: String,
    /// The user, captured now (the worker has no request context).
    pub user: Option<UserId>,
    /// The agent bucket.
    pub agent: AgentName,
    /// The host's trace id.
    pub trace_id: Option<String>,
}

/// Admission, queue and updater wired together.
#[derive(Debug, Clone)]
pub struct UpdatePipeline {
    updater: Arc<MemoryUpdater>,
    hidden: HiddenMessagePolicy,
    queue: UpdateQueue,
    turns: Option<TurnLog>,
    /// This process's name as a claimer of journal turns.
    owner: String,
    /// The `get_context` blocks of recently asked scopes (see `rendered`).
    rendered: RenderedBlocks,
    /// Durable admission one turn at a time: the queue's limits are checked, the turn appended
    /// and queued under it, so concurrent turns cannot all pass the check before any is counted
    /// (each would write its whole body to the journal, to be refused and dropped after).
    admission: Arc<tokio::sync::Mutex<()>>,
}

impl UpdatePipeline {
    /// Starts the queue on the current tokio runtime with the updater as its worker.
    ///
    /// # Errors
    /// [`QueueError::NoRuntime`] outside a runtime.
    pub fn new(
        updater: Arc<MemoryUpdater>,
        hidden: HiddenMessagePolicy,
        queue: QueueConfig,
    ) -> Result<Self, QueueError> {
        Self::with_turns(updater, hidden, queue, None)
    }

    /// As [`UpdatePipeline::new`], keeping every accepted turn in a turn journal.
    ///
    /// # Errors
    /// [`QueueError::NoRuntime`] outside a runtime.
    pub fn with_turns(
        updater: Arc<MemoryUpdater>,
        hidden: HiddenMessagePolicy,
        queue: QueueConfig,
        turns: Option<TurnLog>,
    ) -> Result<Self, QueueError> {
        let q = UpdateQueue::with_turns(updater.clone(), queue, turns.clone())?;
        Ok(Self {
            updater,
            hidden,
            queue: q,
            turns,
            owner: format!(
                "deermem-{}-{:016x}",
                std::process::id(),
                rand::random::<u64>()
            ),
            rendered: RenderedBlocks::default(),
            admission: Arc::default(),
        })
    }

    /// The turn journal and its retry settings, when turns are durable.
    pub fn turns(&self) -> Option<&TurnLog> {
        self.turns.as_ref()
    }

    /// `add`: filters the raw conversation, writes it to the turn journal (when there is one)
    /// and queues it. Never fails; a refusal is logged and reported.
    pub async fn submit(&self, submission: Submission, messages: &[Message]) -> SubmitOutcome {
        self.enqueue(submission, messages, false).await
    }

    /// `add_nowait`: the emergency path before messages are summarised away; processed at
    /// once, ignoring the watermark.
    pub async fn submit_emergency(
        &self,
        submission: Submission,
        messages: &[Message],
    ) -> SubmitOutcome {
        self.enqueue(submission, messages, true).await
    }

    /// Queues the journal's pending turns that this process does not hold yet, leasing them
    /// to it (the lease is renewed by calling this again), each due at its next attempt time.
    /// Returns how many were queued; 0 without a journal.
    ///
    /// # Errors
    /// The journal's error.
    pub async fn recover(&self, lease: Duration) -> Result<usize, TurnJournalError> {
        let Some(log) = &self.turns else {
            return Ok(0);
        };
        let now = log.clock.now();
        let claimed = log
            .journal
            .claim(&ClaimRequest {
                owner: self.owner.clone(),
                now,
                lease,
                limit: 0,
            })
            .await?;
        let mut queued = 0;
        for item in claimed {
            if self.queue.holds_turn(item.id()) {
                continue;
            }
            let wait = item.next_attempt_at.map_or(0, |t| {
                t.unix_micros().saturating_sub(now.unix_micros()).max(0)
            });
            let due = tokio::time::Instant::now()
                + Duration::from_micros(u64::try_from(wait).unwrap_or(0));
            let request = request_of(&item);
            tracing::info!(turn_id = %item.id(), thread_id = %item.identity.thread_id, attempts = item.attempts, "replaying a pending turn from the turn journal");
            if self
                .queue
                .add_replayed(request, vec![item.id().clone()], item.attempts, due)
                .is_ok()
            {
                queued += 1;
            }
        }
        Ok(queued)
    }

    async fn enqueue(&self, s: Submission, messages: &[Message], emergency: bool) -> SubmitOutcome {
        let Some(admitted) = admit(messages, &self.hidden, self.updater.patterns()) else {
            return SubmitOutcome::NotAdmitted;
        };
        let signals = admitted.signals;
        let thread = s.thread_id.clone();
        let request = UpdateRequest {
            thread_id: s.thread_id,
            messages: admitted.messages,
            user: s.user,
            agent: s.agent,
            trace_id: s.trace_id,
            bypass_watermark: false,
            signals,
            turns: Vec::new(),
        };
        let mut request = request;
        request.bypass_watermark = emergency;
        let queued = match &self.turns {
            None => self.queue.add(request),
            Some(log) => {
                let _admitting = self.admission.lock().await;
                match self.queue.check(&request) {
                    Err(e) if !deferrable(&e) => Err(e),
                    check => {
                        let id = fresh_turn_id();
                        let turn = new_turn(id.clone(), &request, emergency, log.clock.now());
                        let appended = log.journal.append_leased(turn, &self.owner, log.lease);
                        if let Err(e) = appended.await {
                            let full = matches!(e, TurnJournalError::Full { .. });
                            tracing::error!(thread_id = %thread, error = %e, "the turn journal could not keep a conversation turn; it was not accepted");
                            return SubmitOutcome::NotKept {
                                message: e.to_string(),
                                full,
                            };
                        }
                        let queued = match check {
                            Ok(()) => self.queue.add_turns(request, vec![id.clone()]),
                            Err(e) => Err(e),
                        };
                        match queued {
                            // The turn is durable: the queue takes it later (the next claim round
                            // or the next start), so the acknowledgement stays true.
                            Err(e) if deferrable(&e) => {
                                tracing::warn!(turn_id = %id, thread_id = %thread, reason = %e, "the queue cannot take the turn now; it is kept in the turn journal and queued by the next claim round or start");
                                Ok(())
                            }
                            Err(e) => {
                                if let Err(drop) = log.journal.drop_turn(&id).await {
                                    tracing::warn!(turn_id = %id, error = %drop, "a refused turn stays in the turn journal; it will be replayed after a restart");
                                }
                                Err(e)
                            }
                            Ok(()) => Ok(()),
                        }
                    }
                }
            }
        };
        match queued {
            Ok(()) => SubmitOutcome::Queued { signals },
            Err(e) if emergency => {
                tracing::warn!(thread_id = %thread, error = %e, "emergency memory update refused");
                SubmitOutcome::Refused(e)
            }
            Err(e) => {
                tracing::warn!(thread_id = %thread, error = %e, "memory update rejected under backpressure");
                SubmitOutcome::Refused(e)
            }
        }
    }

    /// Drains the queue within `timeout`; true only if everything finished.
    pub async fn flush(&self, timeout: Duration) -> bool {
        self.queue.flush(timeout).await
    }

    /// The shutdown drain (see [`UpdateQueue::shutdown_flush`]).
    pub async fn shutdown_flush(&self, timeout: Duration) -> bool {
        self.queue.shutdown_flush(timeout).await
    }

    /// The injection text for a user and agent: summaries plus the agent's facts in
    /// middleware mode, summaries only in tool mode, nothing when injection is disabled.
    ///
    /// With BPE counting, text the memo has not counted yet is counted on the blocking pool:
    /// encoding is CPU work (a long fact takes milliseconds), and on the async workers it would
    /// stall every other request the runtime serves meanwhile. A block whose every count is
    /// already memoised is built here without the hand-off, and a block rendered earlier from
    /// the same facts, summaries and options is returned as it was (`rendered`: the warm case).
    ///
    /// # Errors
    /// Storage failures.
    pub async fn context(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        mode: MemoryMode,
        injection_enabled: bool,
    ) -> Result<String, StorageError> {
        let opts = InjectionOptions::from_config(self.updater.config(), mode, injection_enabled);
        if !opts.enabled {
            return Ok(String::new());
        }
        let bucket = (mode == MemoryMode::Middleware).then_some(agent);
        let doc = self.updater.storage().load(user, bucket).await?;
        if let Some(text) = self.rendered.get(user, bucket, &doc, &opts) {
            return Ok(text);
        }
        let text = Self::render(doc.clone(), &opts).await;
        self.rendered.put(user, bucket, &doc, &opts, &text);
        Ok(text)
    }

    /// Formats the block of `doc`: here for the character estimate or when every count is
    /// memoised, on the blocking pool otherwise.
    async fn render(doc: deermem_core::MemoryDocument, opts: &InjectionOptions) -> String {
        if opts.counter.mode() == TokenCounting::Char {
            // The character estimate is one linear pass: cheaper than a thread hand-off.
            return format_memory_for_injection(&doc, opts);
        }
        if let Some(text) = deermem_updater::memo_only(|| format_memory_for_injection(&doc, opts)) {
            return text;
        }
        let doc = Arc::new(doc);
        let (shared, options) = (Arc::clone(&doc), opts.clone());
        match tokio::task::spawn_blocking(move || format_memory_for_injection(&shared, &options))
            .await
        {
            Ok(text) => text,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down and dropped the task: build the text here.
            Err(_) => format_memory_for_injection(&doc, opts),
        }
    }

    /// The `get_context` block cache: what it holds and its bounds.
    pub fn rendered_cache_usage(&self) -> RenderedCacheUsage {
        self.rendered.usage()
    }

    /// The bounds of the pipeline's caches: the rendered blocks and the updater's.
    pub fn cache_bounds(&self) -> Vec<deermem_core::CacheBound> {
        let mut out = Vec::from(self.rendered.cache_bounds());
        out.extend(self.updater.cache_bounds());
        out
    }

    /// The queue.
    pub fn queue(&self) -> &UpdateQueue {
        &self.queue
    }

    /// The updater.
    pub fn updater(&self) -> &Arc<MemoryUpdater> {
        &self.updater
    }
}

/// A refusal that does not lose a durable turn: the queue is at its depth or closed (shutting
/// down), and the journal keeps the turn until a claim round or the next start queues it.
fn deferrable(e: &QueueError) -> bool {
    matches!(e, QueueError::Full { .. } | QueueError::Closed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use deermem_core::prelude::*;
    use deermem_core::{AgentName, ApplyOptions, ChangeSet, MemoryMode, Timestamp, UserId};
    use deermem_testkit::clock::ManualClock;
    use deermem_testkit::storage::InMemoryStorage;
    use deermem_updater::DeerMemConfig;
    use serde_json::json;

    use super::UpdatePipeline;
    use crate::queue::QueueConfig;
    use deermem_updater::HiddenMessagePolicy;
    use deermem_updater::MemoryUpdater;
    use deermem_updater::probe;

    /// `get_context` counts tokens on the blocking pool, never on the runtime thread that
    /// serves the other requests (a current-thread runtime: the test's own thread).
    #[tokio::test]
    async fn bpe_counting_runs_off_the_async_worker() {
        let clock = Arc::new(ManualClock::new(
            Timestamp::parse_iso("2026-06-01T00:00:00Z").unwrap(),
        ));
        let storage = Arc::new(InMemoryStorage::new(clock.clone()));
        let user = UserId::new("alice").unwrap();
        let agent = AgentName::default_bucket();
        let content = format!("User writes {} in long unbroken text", probe::MARKER);
        let draft = json!({"id": "fact_probe", "content": content, "category": "context",
                           "confidence": 0.9, "createdAt": "2026-06-01T00:00:00Z"});
        storage
            .apply_changes(
                Some(&user),
                Some(&agent),
                ChangeSet {
                    upserts: vec![deermem_core::FactDraft::try_from(draft).unwrap()],
                    ..ChangeSet::default()
                },
                ApplyOptions::default(),
            )
            .await
            .unwrap();
        let config = Arc::new(DeerMemConfig::default());
        let updater = MemoryUpdater::builder(config, storage, clock).build();
        let pipeline = UpdatePipeline::new(
            Arc::new(updater),
            HiddenMessagePolicy::structural(),
            QueueConfig {
                debounce: Duration::from_secs(300),
                max_depth: 4,
                max_concurrency: 1,
                max_user_bytes: 0,
                max_total_bytes: 0,
            },
        )
        .unwrap();
        let text = pipeline
            .context(Some(&user), &agent, MemoryMode::Middleware, true)
            .await
            .unwrap();
        assert!(text.contains(probe::MARKER), "{text}");
        let threads = probe::threads_counting(probe::MARKER);
        assert!(!threads.is_empty(), "the block was counted");
        let here = std::thread::current().id();
        assert!(
            threads.iter().all(|t| *t != here),
            "tokens were counted on the async worker thread"
        );
        // Warm: every count is memoised, so the block is built without encoding anything
        // (and without the hand-off), identical to the first.
        let again = pipeline
            .context(Some(&user), &agent, MemoryMode::Middleware, true)
            .await
            .unwrap();
        assert_eq!(again, text);
        assert_eq!(probe::threads_counting(probe::MARKER).len(), threads.len());
    }
}
