//! The engine's side of the turn journal: fresh turn ids, the journal item of an update
//! request and back, the retry schedule of failed extractions (exponential backoff from
//! `queue.retry.initial_backoff_ms`, a model's `Retry-After` honoured, both capped at
//! `queue.retry.max_backoff`), the dead-letter decision (`max_attempts`, `max_age`), the
//! crash points of the reliability tests, and the journal as an operator drives it through a
//! server ([`DeerMemManager::turn_admin`]: a retried turn is queued at once).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::LlmError;
use deermem_core::Timestamp;
use deermem_core::ports::turn_journal::{
    NewTurn, TurnId, TurnIdentity, TurnItem, TurnJournalError,
};
use deermem_core::ports::{Clock, TurnAdmin, TurnJournal};
use deermem_updater::RetrySettings;
use deermem_updater::{ProposeError, Signal, SignalSet, UpdateRequest, UpdaterError};

use crate::{DeerMemManager, TURN_LEASE, UpdatePipeline};

/// A fresh turn id: `turn_` and 32 random hex digits.
pub fn fresh_turn_id() -> TurnId {
    TurnId::from_bits(rand::random::<u128>())
}

/// The journal item of an update request accepted now.
pub fn new_turn(id: TurnId, request: &UpdateRequest, emergency: bool, now: Timestamp) -> NewTurn {
    NewTurn {
        identity: TurnIdentity {
            id,
            user: request.user.clone(),
            agent: request.agent.clone(),
            thread_id: request.thread_id.clone(),
            trace_id: request.trace_id.clone(),
            signals: request
                .signals
                .iter()
                .map(|s| s.as_str().to_owned())
                .collect(),
            emergency,
        },
        messages: request.messages.clone(),
        accepted_at: now,
    }
}

/// The update request a journal item replays, with its original identity.
pub fn request_of(item: &TurnItem) -> UpdateRequest {
    let identity = &item.identity;
    let signals: SignalSet = identity
        .signals
        .iter()
        .filter_map(|name| Signal::ALL.into_iter().find(|s| s.as_str() == name))
        .collect();
    UpdateRequest {
        thread_id: identity.thread_id.clone(),
        messages: item.messages.clone(),
        user: identity.user.clone(),
        agent: identity.agent.clone(),
        trace_id: identity.trace_id.clone(),
        bypass_watermark: identity.emergency,
        signals,
        turns: Vec::new(),
    }
}

/// The server's `Retry-After` carried by a failed extraction, if any.
pub fn retry_after(error: &UpdaterError) -> Option<Duration> {
    match error {
        UpdaterError::Propose(ProposeError::Llm(LlmError::RateLimited { retry_after })) => {
            *retry_after
        }
        _ => None,
    }
}

/// The journal the queue records into, with the retry settings and the clock.
#[derive(Clone)]
pub struct TurnLog {
    /// The journal.
    pub journal: Arc<dyn TurnJournal>,
    /// `queue.retry`.
    pub retry: RetrySettings,
    /// The clock of `accepted_at` and next-attempt times.
    pub clock: Arc<dyn Clock>,
    /// How long this process's lease on a turn lasts without renewal (`queue.turn_lease`): a
    /// turn it appends is leased to it for that long, so another replica's claim round leaves
    /// it alone.
    pub lease: Duration,
}

impl fmt::Debug for TurnLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnLog")
            .field("journal", &self.journal)
            .field("retry", &self.retry)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// What becomes of turns whose extraction failed.
#[derive(Debug, Default)]
pub struct FailureOutcome {
    /// Turns to try again, after `delay`.
    pub retry: Vec<TurnId>,
    /// The pause before the next attempt.
    pub delay: Duration,
    /// Turns dead-lettered now.
    pub dead: usize,
}

impl TurnLog {
    /// The pause after `attempts` failed attempts: `initial_backoff_ms` doubled per earlier
    /// failure, at least `retry_after`, at most `max_backoff`, scaled by a random factor in
    /// [0.75, 1.25) so that items failing together spread out.
    pub fn backoff(&self, attempts: u32, retry_after: Option<Duration>) -> Duration {
        let cap = Duration::from_secs(self.retry.max_backoff);
        let base = Duration::from_millis(self.retry.initial_backoff_ms)
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(20));
        let jitter = 0.75 + rand::random::<f64>() / 2.0;
        let pause = base.mul_f64(jitter).max(retry_after.unwrap_or_default());
        pause.min(cap)
    }

    /// Marks turns done after their extraction's commit. A failure is logged: the turn stays
    /// pending and its replay is a no-op (the dedup gates drop what it already wrote).
    pub async fn complete(&self, turns: &[TurnId]) {
        crate::fault::point("turns-before-done");
        for id in turns {
            if let Err(e) = self.journal.complete(id).await {
                tracing::warn!(turn_id = %id, error = %e, "could not mark a turn done in the turn journal; it will be replayed (without effect) after a restart");
            }
        }
    }

    /// Records a failed attempt of each turn (`attempts`: the item's failed attempts, this one
    /// included): a turn past `max_attempts` or `max_age` is dead-lettered (and logged), the
    /// others are retried after the backoff.
    pub async fn failed(
        &self,
        turns: &[TurnId],
        attempts: u32,
        error: &UpdaterError,
    ) -> FailureOutcome {
        let text = error.to_string();
        let now = self.clock.now();
        let mut outcome = FailureOutcome::default();
        let mut attempts_seen = 0u32;
        let max_age = i64::try_from(self.retry.max_age)
            .unwrap_or(i64::MAX)
            .saturating_mul(1_000_000);
        let delay = self.backoff(attempts, retry_after(error));
        let next = now.saturating_add_micros(i64::try_from(delay.as_micros()).unwrap_or(i64::MAX));
        for id in turns {
            let recorded = match self.journal.record_failure(id, &text, next).await {
                Ok(Some(item)) => item,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(turn_id = %id, error = %e, "could not record a failed attempt in the turn journal; retrying the turn anyway");
                    outcome.retry.push(id.clone());
                    outcome.delay = outcome.delay.max(delay);
                    continue;
                }
            };
            let age = now
                .unix_micros()
                .saturating_sub(recorded.accepted_at.unix_micros());
            if recorded.attempts >= self.retry.max_attempts || age >= max_age {
                let reason = format!(
                    "gave up after {} attempts over {}s: {text}",
                    recorded.attempts,
                    age / 1_000_000
                );
                match self.journal.dead_letter(id, &reason).await {
                    Ok(_) => {
                        tracing::error!(turn_id = %id, thread_id = %recorded.identity.thread_id, attempts = recorded.attempts, error = %text, "memory update dead-lettered: it stays in the turn journal until an operator retries or drops it (deermem turns list)");
                        outcome.dead += 1;
                    }
                    Err(e) => {
                        tracing::warn!(turn_id = %id, error = %e, "could not dead-letter a turn; retrying it");
                        outcome.retry.push(id.clone());
                    }
                }
                continue;
            }
            attempts_seen = attempts_seen.max(recorded.attempts);
            outcome.retry.push(id.clone());
            outcome.delay = outcome.delay.max(delay);
        }
        if !outcome.retry.is_empty() {
            tracing::warn!(turns = outcome.retry.len(), attempts = attempts_seen, delay_ms = outcome.delay.as_millis() as u64, error = %text, "memory update failed; retrying after a pause");
        }
        outcome
    }
}

/// The turn journal of a durable engine as an operator drives it ([`TurnAdmin`]): listing,
/// counting and dropping go to the journal; a retry makes the dead item pending and queues it
/// in this engine at once (the claim round that would otherwise take it runs every
/// [`crate::CLAIM_INTERVAL`]).
#[derive(Clone)]
pub struct EngineTurnAdmin {
    journal: Arc<dyn TurnJournal>,
    pipeline: UpdatePipeline,
}

impl fmt::Debug for EngineTurnAdmin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineTurnAdmin")
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl TurnAdmin for EngineTurnAdmin {
    fn journal(&self) -> &Arc<dyn TurnJournal> {
        &self.journal
    }

    async fn retry_now(&self, id: &TurnId) -> Result<Option<TurnItem>, TurnJournalError> {
        let Some(item) = self.journal.retry(id).await? else {
            return Ok(None);
        };
        // Claiming queues the journal's pending turns this process does not hold yet: the
        // retried one among them, due at once (its next-attempt time was cleared).
        match self.pipeline.recover(TURN_LEASE).await {
            Ok(_) if self.pipeline.queue().holds_turn(id) => {
                tracing::info!(turn_id = %id, thread_id = %item.identity.thread_id, "a dead turn was retried by an operator; queued for an attempt now");
            }
            Ok(_) => {
                tracing::info!(turn_id = %id, "a dead turn was retried by an operator; it is pending and the next claim round queues it");
            }
            Err(e) => {
                tracing::warn!(turn_id = %id, error = %e, "a dead turn was made pending again but could not be queued at once; the next claim round queues it");
            }
        }
        Ok(Some(item))
    }
}

impl DeerMemManager {
    /// The turn journal as an operator drives it through a server (the gateway's
    /// `/api/memory/turns` routes); `None` when turns are not durable (`queue.durable: false`,
    /// or no journal was given).
    pub fn turn_admin(&self) -> Option<Arc<dyn TurnAdmin>> {
        let log = self.pipeline().turns()?;
        Some(Arc::new(EngineTurnAdmin {
            journal: Arc::clone(&log.journal),
            pipeline: self.pipeline().clone(),
        }))
    }
}
