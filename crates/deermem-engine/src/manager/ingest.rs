//! `ingest_now`: one extraction run at once (no queue, no debounce, the watermark bypassed like
//! an emergency item but awaited), reporting what was added, removed and rejected. Used by the
//! CLI and the benchmarks.

use std::collections::HashSet;

use deermem_core::ports::AddRequest;
use deermem_core::{ManagerError, MemoryDocument};
use serde::Serialize;

use super::DeerMemManager;
use deermem_updater::admit;
use deermem_updater::{ApplyReport, Rejection, UpdateMetrics};
use deermem_updater::{ProposalOrigin, ProposeError};
use deermem_updater::{UpdateRequest, UpdateStatus, UpdaterError};

/// What an ingest did overall.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum IngestStatus {
    /// No user turn or no assistant turn survived filtering; nothing was asked.
    #[default]
    NotAdmitted,
    /// Nothing new to extract (cannot happen on this path, which ignores the watermark; kept
    /// for completeness).
    NothingNew,
    /// The messages hold no text to learn from.
    NothingToExtract,
    /// The proposal changed nothing.
    NoChange,
    /// Changes were committed at this shared revision.
    Committed {
        /// The shared user revision after the commit.
        revision: u64,
    },
}

/// Why a fact left memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RemovalReason {
    /// The model said a new statement contradicts it.
    Contradiction,
    /// Staleness review removed it.
    Staleness,
    /// The capacity policy (`max_facts`) evicted it.
    Eviction,
    /// It was merged into a consolidated fact.
    Consolidation,
    /// It described an upload event.
    UploadMention,
}

/// A fact the ingest stored.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AddedFact {
    /// Fact id.
    pub id: String,
    /// Content.
    pub content: String,
    /// Category as shown (the original one for non-core categories).
    pub category: String,
    /// Confidence.
    pub confidence: f64,
}

/// A fact the ingest removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RemovedFact {
    /// Fact id.
    pub id: String,
    /// Why.
    pub reason: RemovalReason,
}

/// The outcome of [`DeerMemManager::ingest_now`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct IngestReport {
    /// What happened overall.
    #[serde(flatten)]
    pub status: IngestStatus,
    /// `offline` or the model's name; absent when nothing was asked.
    pub origin: Option<String>,
    /// Signals detected at admission.
    pub signals: Vec<String>,
    /// Facts stored by this run (new and consolidated).
    pub added: Vec<AddedFact>,
    /// Facts removed by this run, with the reason.
    pub removed: Vec<RemovedFact>,
    /// Proposed items the gates refused, with the reason.
    pub rejected: Vec<Rejection>,
    /// Summary children replaced, as `section.key`.
    pub summaries_updated: Vec<String>,
    /// Facts whose confirmation was recorded.
    pub reinforced: Vec<String>,
    /// Gate metrics (absent when nothing was asked).
    pub metrics: Option<UpdateMetrics>,
    /// Commit attempts (conflicts are retried on a fresh snapshot).
    pub attempts: u32,
}

fn updater_error(e: UpdaterError) -> ManagerError {
    match e {
        UpdaterError::Storage(e) => e.into(),
        UpdaterError::ConflictRetriesExhausted { last, .. } => last.into(),
        UpdaterError::Propose(ProposeError::Llm(e)) if e.is_retryable() => {
            ManagerError::unavailable(e.to_string()).caused_by(e)
        }
        other => ManagerError::backend(other.to_string()).caused_by(other),
    }
}

/// The removed facts of a report (facts created and dropped in the same run are rejections,
/// not removals).
fn removals(report: &ApplyReport) -> Vec<RemovedFact> {
    let created: HashSet<&str> = report
        .created
        .iter()
        .map(String::as_str)
        .chain(report.consolidated.iter().map(|(id, _)| id.as_str()))
        .collect();
    let mut out = Vec::new();
    let mut push = |ids: &mut dyn Iterator<Item = &String>, reason: RemovalReason| {
        for id in ids {
            if !created.contains(id.as_str()) {
                out.push(RemovedFact {
                    id: id.clone(),
                    reason,
                });
            }
        }
    };
    push(&mut report.stale_removed.iter(), RemovalReason::Staleness);
    push(&mut report.evicted.iter(), RemovalReason::Eviction);
    push(&mut report.removed.iter(), RemovalReason::Contradiction);
    push(
        &mut report.consolidated.iter().flat_map(|(_, sources)| sources),
        RemovalReason::Consolidation,
    );
    push(
        &mut report.upload_removed.iter(),
        RemovalReason::UploadMention,
    );
    out
}

/// The facts of the run that are in the committed document.
fn additions(report: &ApplyReport, doc: &MemoryDocument) -> Vec<AddedFact> {
    report
        .created
        .iter()
        .chain(report.consolidated.iter().map(|(id, _)| id))
        .filter_map(|id| doc.fact(id))
        .map(|f| AddedFact {
            id: f.id.as_str().to_owned(),
            content: f.content.clone(),
            category: deermem_updater::display_category(f).to_owned(),
            confidence: f.confidence,
        })
        .collect()
}

impl DeerMemManager {
    /// Filters the conversation and runs one extraction now, awaiting it: no debounce, and the
    /// watermark is neither read nor moved (every filtered message is offered, as on the
    /// emergency path). Reports the facts added, removed (with the reason) and the proposals
    /// the gates refused (with the reason), plus the gate metrics.
    ///
    /// It runs beside the queue: a queued update of the same conversation may commit in
    /// between; the commit's revision check and snapshot retry keep the result consistent.
    ///
    /// # Errors
    /// Invalid scope or thread id; the model failing transiently (`Unavailable`: timeout, rate
    /// limit, server or transport error), otherwise failing or answering unusably (`Backend`);
    /// storage errors (conflicts after the bounded retries are `Conflict`).
    pub async fn ingest_now(&self, request: AddRequest) -> Result<IngestReport, ManagerError> {
        let submission = self.submission(&request)?;
        let updater = self.pipeline.updater();
        let Some(admitted) = admit(&request.messages, &self.hidden, updater.patterns()) else {
            return Ok(IngestReport::default());
        };
        let signals = admitted.signals;
        let user = submission.user.clone();
        let agent = submission.agent.clone();
        let outcome = updater
            .update(UpdateRequest {
                thread_id: submission.thread_id,
                messages: admitted.messages,
                user: submission.user,
                agent: submission.agent,
                trace_id: submission.trace_id,
                bypass_watermark: true,
                signals,
                turns: Vec::new(),
            })
            .await
            .map_err(updater_error)?;
        let status = match outcome.status {
            // Ingest sends no journal turns, so nothing can be found applied.
            UpdateStatus::NothingNew | UpdateStatus::AlreadyApplied => IngestStatus::NothingNew,
            UpdateStatus::NothingToExtract => IngestStatus::NothingToExtract,
            UpdateStatus::NoChange => IngestStatus::NoChange,
            UpdateStatus::Committed { revision } => IngestStatus::Committed { revision },
        };
        let mut out = IngestReport {
            status,
            ..IngestReport::default()
        };
        out.origin = outcome.origin.map(|o| match o {
            ProposalOrigin::Model(m) => m,
            ProposalOrigin::Offline => "offline".to_owned(),
        });
        out.signals = signals.iter().map(|s| s.as_str().to_owned()).collect();
        out.metrics = outcome.metrics;
        out.attempts = outcome.attempts;
        if let Some(report) = outcome.report {
            if matches!(status, IngestStatus::Committed { .. }) {
                let doc = self.storage.load(user.as_ref(), Some(&agent)).await?;
                out.added = additions(&report, &doc);
                out.removed = removals(&report);
                out.summaries_updated = report.summaries_updated.clone();
                out.reinforced = report.reinforced.clone();
            }
            out.rejected = report.rejected;
        }
        Ok(out)
    }
}
