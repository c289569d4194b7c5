//! The updater service: feed the messages after the watermark, detect their signals, load the
//! memory, ask the proposer once, apply the proposal through the gates, commit the change set with
//! a bounded snapshot-recompute retry on revision conflicts, audit capacity evictions after the
//! commit, and advance the watermark only on success.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::DeerMemConfig;
use async_trait::async_trait;
use deermem_core::policy::eviction::FactUsageMap;
use deermem_core::ports::{Clock, LanguageModel, MemoryStorage};
use deermem_core::{
    AgentName, ApplyOptions, CacheBound, MemoryDocument, Message, StorageError, UserId,
};
use tracing::Instrument;

use crate::apply::{ApplyContext, ApplyReport, UpdateMetrics, apply_update};
use crate::diff::{change_set, is_noop};
use crate::facts::FactIdSource;
use crate::observe::{ExtractionReport, UpdateObserver};
use crate::prompt::{PromptError, TemplateStore};
use crate::proposer::{
    LlmProposer, OfflineProposer, Proposal, ProposalOrigin, ProposalRequest, ProposeError, Proposer,
};
use crate::signals::{PatternError, PatternSet, SignalSet};
use crate::watermark::{ConversationKey, WATERMARK_CACHE_NAME, Watermarks, message_identity};

/// Commit attempts before a conflict is given up (the first try plus two recomputes).
pub(crate) const MAX_COMMIT_ATTEMPTS: u32 = 3;

/// One extraction job.
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateRequest {
    /// The host thread id.
    pub thread_id: String,
    /// The filtered conversation (the full list seen so far, or the emergency subset).
    pub messages: Vec<Message>,
    /// The user, captured when the turn was queued.
    pub user: Option<UserId>,
    /// The agent bucket.
    pub agent: AgentName,
    /// The host's trace id.
    pub trace_id: Option<String>,
    /// The emergency path: feed every message and leave the watermark alone.
    pub bypass_watermark: bool,
    /// Signals seen at admission (kept for logs; the gates use the batch's own signals).
    pub signals: SignalSet,
    /// The journal turns this request stands for (empty when turns are not durable). The facts
    /// it creates record them in their source (`turnIds`); a request whose every turn is found
    /// there was committed before (a replay after a crash between the commit and the journal's
    /// done-mark) and is not extracted again.
    pub turns: Vec<String>,
}

/// What an update did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateStatus {
    /// Every message was already extracted; nothing was asked.
    NothingNew,
    /// The new messages hold no text to learn from.
    NothingToExtract,
    /// The proposal changed nothing.
    NoChange,
    /// Every journal turn of the request is already recorded in the scope's facts: its commit
    /// happened before (the replay of a turn whose done-mark was lost); nothing was asked.
    AlreadyApplied,
    /// The change set was committed at this shared revision.
    Committed {
        /// The shared revision after the commit.
        revision: u64,
    },
}

/// The outcome of a successful update.
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateOutcome {
    /// What happened.
    pub status: UpdateStatus,
    /// Who proposed the update (absent when nothing was asked).
    pub origin: Option<ProposalOrigin>,
    /// Gate metrics of the last apply attempt.
    pub metrics: Option<UpdateMetrics>,
    /// What the last apply attempt did.
    pub report: Option<ApplyReport>,
    /// Commit attempts made.
    pub attempts: u32,
}

impl UpdateOutcome {
    fn simple(status: UpdateStatus) -> Self {
        Self {
            status,
            origin: None,
            metrics: None,
            report: None,
            attempts: 0,
        }
    }
}

/// Why an update failed. The watermark does not move, so the same messages are offered again
/// on the conversation's next turn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpdaterError {
    /// The proposer failed (prompt, model call or unusable answer).
    #[error("memory extraction failed: {0}")]
    Propose(#[from] ProposeError),
    /// Storage failed.
    #[error("memory storage failed: {0}")]
    Storage(#[from] StorageError),
    /// Every commit attempt lost a revision race.
    #[error("memory commit conflicted {attempts} times: {last}")]
    ConflictRetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last conflict.
        last: StorageError,
    },
}

/// Why an updater could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The configured `patterns_dir` is unusable.
    #[error(transparent)]
    Patterns(#[from] PatternError),
    /// The configured `prompts_dir` is unusable.
    #[error(transparent)]
    Prompts(#[from] PromptError),
}

/// Builds a [`MemoryUpdater`].
pub struct MemoryUpdaterBuilder {
    config: Arc<DeerMemConfig>,
    storage: Arc<dyn MemoryStorage>,
    clock: Arc<dyn Clock>,
    llm: Option<Arc<dyn LanguageModel>>,
    templates: Option<Arc<TemplateStore>>,
    patterns: Option<Arc<PatternSet>>,
    observer: Option<Arc<dyn UpdateObserver>>,
    ids: FactIdSource,
}

impl fmt::Debug for MemoryUpdaterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryUpdaterBuilder")
            .finish_non_exhaustive()
    }
}

impl MemoryUpdaterBuilder {
    /// Uses a language model (otherwise the offline rules propose updates).
    #[must_use]
    pub fn language_model(mut self, llm: Option<Arc<dyn LanguageModel>>) -> Self {
        self.llm = llm;
        self
    }

    /// Uses these templates instead of the bundled ones.
    #[must_use]
    pub fn templates(mut self, templates: Arc<TemplateStore>) -> Self {
        self.templates = Some(templates);
        self
    }

    /// Uses these patterns instead of the bundled ones.
    #[must_use]
    pub fn patterns(mut self, patterns: Arc<PatternSet>) -> Self {
        self.patterns = Some(patterns);
        self
    }

    /// Reports events to `observer`.
    #[must_use]
    pub fn observer(mut self, observer: Arc<dyn UpdateObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Draws new fact ids from `ids`.
    #[must_use]
    pub fn id_source(mut self, ids: FactIdSource) -> Self {
        self.ids = ids;
        self
    }

    /// Loads `patterns_dir` and `prompts_dir` from the configuration when they are set (all
    /// seven pattern files and all three templates are required), then builds.
    ///
    /// # Errors
    /// A [`BuildError`] naming the missing or invalid file.
    pub async fn build_from_config(mut self) -> Result<MemoryUpdater, BuildError> {
        if self.patterns.is_none()
            && let Some(dir) = &self.config.patterns_dir
        {
            self.patterns = Some(Arc::new(PatternSet::load_dir(Path::new(dir)).await?));
        }
        if self.templates.is_none()
            && let Some(dir) = &self.config.prompts_dir
        {
            self.templates = Some(Arc::new(TemplateStore::load(Path::new(dir)).await?));
        }
        Ok(self.build())
    }

    /// Builds with what was given; bundled patterns and templates fill the gaps.
    pub fn build(self) -> MemoryUpdater {
        let templates = self
            .templates
            .unwrap_or_else(|| Arc::new(TemplateStore::bundled()));
        // Only the model's proposer reads (and caches) templates.
        let used_templates = self.llm.as_ref().map(|_| Arc::clone(&templates));
        let proposer: Arc<dyn Proposer> = match self.llm {
            Some(llm) => Arc::new(LlmProposer::new(llm, templates, self.observer.clone())),
            None => {
                tracing::info!(
                    "no memory model is configured; using the offline rule-based extractor (explicit identity, preference, goal, decision and correction statements only)"
                );
                Arc::new(OfflineProposer)
            }
        };
        MemoryUpdater {
            watermarks: Mutex::new(Watermarks::new(self.config.watermark_max_keys)),
            config: self.config,
            storage: self.storage,
            clock: self.clock,
            proposer,
            patterns: self
                .patterns
                .unwrap_or_else(|| Arc::new(PatternSet::bundled())),
            observer: self.observer,
            ids: self.ids,
            templates: used_templates,
        }
    }
}

/// The updater service.
pub struct MemoryUpdater {
    config: Arc<DeerMemConfig>,
    storage: Arc<dyn MemoryStorage>,
    clock: Arc<dyn Clock>,
    proposer: Arc<dyn Proposer>,
    patterns: Arc<PatternSet>,
    watermarks: Mutex<Watermarks>,
    observer: Option<Arc<dyn UpdateObserver>>,
    ids: FactIdSource,
    /// The templates the model's proposer reads (`None` with the offline proposer).
    templates: Option<Arc<TemplateStore>>,
}

impl fmt::Debug for MemoryUpdater {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryUpdater")
            .field("proposer", &self.proposer)
            .field("patterns", &self.patterns)
            .finish_non_exhaustive()
    }
}

impl MemoryUpdater {
    /// A builder over the configuration, storage and clock.
    pub fn builder(
        config: Arc<DeerMemConfig>,
        storage: Arc<dyn MemoryStorage>,
        clock: Arc<dyn Clock>,
    ) -> MemoryUpdaterBuilder {
        MemoryUpdaterBuilder {
            config,
            storage,
            clock,
            llm: None,
            templates: None,
            patterns: None,
            observer: None,
            ids: FactIdSource::random(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DeerMemConfig {
        &self.config
    }

    /// The storage.
    pub fn storage(&self) -> &Arc<dyn MemoryStorage> {
        &self.storage
    }

    /// The signal patterns (shared with admission).
    pub fn patterns(&self) -> &Arc<PatternSet> {
        &self.patterns
    }

    /// Who proposes updates.
    pub fn origin(&self) -> ProposalOrigin {
        self.proposer.origin()
    }

    /// How many conversations the watermark cache tracks.
    pub fn watermark_len(&self) -> usize {
        self.lock_watermarks().len()
    }

    /// The bounds of the updater's caches: the watermarks (`watermark_max_keys`, unbounded
    /// when 0), the process-wide token-count memo, and the per-agent prompt templates when a
    /// model proposes updates.
    pub fn cache_bounds(&self) -> Vec<CacheBound> {
        let max = self.config.watermark_max_keys;
        let watermarks = CacheBound::entries(WATERMARK_CACHE_NAME, max, Some(self.watermark_len()));
        let mut out = vec![if max == 0 {
            watermarks.unbounded()
        } else {
            watermarks
        }];
        out.extend(crate::tokens::memo_bounds());
        if let Some(t) = &self.templates {
            out.push(t.cache_bound());
        }
        out
    }

    fn lock_watermarks(&self) -> std::sync::MutexGuard<'_, Watermarks> {
        self.watermarks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one update. Requests for the same conversation must not run concurrently (the
    /// queue guarantees it).
    ///
    /// # Errors
    /// An [`UpdaterError`]; nothing is written and the watermark stays where it was.
    pub async fn update(&self, req: UpdateRequest) -> Result<UpdateOutcome, UpdaterError> {
        let span = tracing::info_span!(
            "memory_update",
            thread_id = %req.thread_id,
            trace_id = req.trace_id.as_deref().unwrap_or(""),
            agent = %req.agent,
            admission_signals = ?req.signals,
            emergency = req.bypass_watermark,
        );
        self.update_inner(req).instrument(span).await
    }

    async fn update_inner(&self, req: UpdateRequest) -> Result<UpdateOutcome, UpdaterError> {
        let key = ConversationKey::new(&req.thread_id, req.user.as_ref(), &req.agent);
        let feed: Vec<Message> = if req.bypass_watermark {
            req.messages.clone()
        } else {
            self.lock_watermarks()
                .feed_after(&key, &req.messages)
                .to_vec()
        };
        if feed.is_empty() {
            return Ok(UpdateOutcome::simple(UpdateStatus::NothingNew));
        }
        // Every message of the batch is new, so every user turn in it is looked at (signals
        // are detected here, on the watermark feed, not taken from the queue); messages before
        // the watermark are never looked at again.
        let signals = self.patterns.detect_in(&feed);
        let user = req.user.as_ref();
        let agent = &req.agent;
        let snapshot = self.storage.load(user, Some(agent)).await?;
        if already_applied(&snapshot, &req.turns) {
            tracing::info!(turns = ?req.turns, "the journal turns of this update were committed before (found in the facts' sources); not extracting them again");
            self.advance(&req, key);
            return Ok(UpdateOutcome::simple(UpdateStatus::AlreadyApplied));
        }
        let request = ProposalRequest {
            memory: &snapshot,
            feed: &feed,
            signals,
            agent,
            config: &self.config,
            now: self.clock.now(),
            thread_id: &req.thread_id,
            user,
            trace_id: req.trace_id.as_deref(),
        };
        let proposal = match self.proposer.propose(request).await {
            Ok(Some(p)) => p,
            Ok(None) => {
                self.advance(&req, key);
                return Ok(UpdateOutcome::simple(UpdateStatus::NothingToExtract));
            }
            Err(e) => {
                tracing::warn!(error = %e, "memory extraction failed; the messages will be offered again");
                self.report(
                    &req,
                    self.proposer.origin().model_name(),
                    None,
                    None,
                    Some(&e.to_string()),
                );
                return Err(e.into());
            }
        };
        let result = self.commit(&req, snapshot, &proposal, signals).await;
        let origin_name = proposal.origin.model_name().map(str::to_owned);
        match result {
            Ok(mut outcome) => {
                if let Some(m) = &outcome.metrics {
                    for w in m.warnings() {
                        tracing::warn!(thread_id = %req.thread_id, "{w}");
                    }
                }
                self.report(
                    &req,
                    origin_name.as_deref(),
                    proposal.token_usage,
                    outcome.metrics,
                    None,
                );
                self.advance(&req, key);
                outcome.origin = Some(proposal.origin);
                Ok(outcome)
            }
            Err((e, metrics)) => {
                tracing::warn!(error = %e, "memory update was not committed; the messages will be offered again");
                self.report(
                    &req,
                    origin_name.as_deref(),
                    proposal.token_usage,
                    metrics,
                    Some(&e.to_string()),
                );
                Err(e)
            }
        }
    }

    fn advance(&self, req: &UpdateRequest, key: ConversationKey) {
        if req.bypass_watermark {
            return;
        }
        let last = req.messages.last().and_then(message_identity);
        self.lock_watermarks().set(key, last);
    }

    fn report(
        &self,
        req: &UpdateRequest,
        model: Option<&str>,
        usage: Option<deermem_core::ports::TokenUsage>,
        metrics: Option<UpdateMetrics>,
        error: Option<&str>,
    ) {
        let Some(o) = &self.observer else {
            return;
        };
        o.on_extraction(&ExtractionReport {
            thread_id: req.thread_id.clone(),
            user_id: req.user.as_ref().map(|u| u.as_str().to_owned()),
            trace_id: req.trace_id.clone(),
            model_name: model.map(str::to_owned),
            success: error.is_none(),
            token_usage: usage,
            metrics,
            error: error.map(str::to_owned),
        });
    }

    async fn usage_if_needed(
        &self,
        cache: &mut Option<FactUsageMap>,
        snapshot: &MemoryDocument,
        proposal: &Proposal,
        agent: &AgentName,
        user: Option<&UserId>,
    ) -> FactUsageMap {
        let may_exceed =
            snapshot.facts.len() + proposal.update.new_facts.len() > self.config.max_facts;
        if !(self.config.tracks_usage() && may_exceed) {
            return FactUsageMap::new();
        }
        if let Some(u) = cache {
            return u.clone();
        }
        let usage = self.storage.get_fact_usage(user, agent).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "fact usage unavailable; capacity scoring without access heat");
            FactUsageMap::new()
        });
        *cache = Some(usage.clone());
        usage
    }

    async fn commit(
        &self,
        req: &UpdateRequest,
        mut snapshot: MemoryDocument,
        proposal: &Proposal,
        signals: SignalSet,
    ) -> Result<UpdateOutcome, (UpdaterError, Option<UpdateMetrics>)> {
        let user = req.user.as_ref();
        let agent = &req.agent;
        let scope = deermem_core::Scope::new(user.cloned(), Some(agent.clone())).to_fact_scope();
        let mut usage_cache = None;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let usage = self
                .usage_if_needed(&mut usage_cache, &snapshot, proposal, agent, user)
                .await;
            let now = self.clock.now();
            let ctx = ApplyContext {
                config: &self.config,
                now,
                thread_id: &req.thread_id,
                turns: &req.turns,
                signals,
                scope: &scope,
                usage: &usage,
                ids: &self.ids,
                consolidation_allowed: proposal.consolidation_shown.as_ref(),
            };
            let outcome = apply_update(&snapshot, &proposal.update, &ctx);
            let last_metrics = Some(outcome.metrics);
            let changes = change_set(&snapshot, &outcome);
            let status = if is_noop(&changes) {
                UpdateStatus::NoChange
            } else {
                let options = ApplyOptions::at_revision(snapshot.revision);
                match self
                    .storage
                    .apply_changes(user, Some(agent), changes, options)
                    .await
                {
                    Ok(result) => {
                        for d in &outcome.capacity {
                            if let Err(e) = self
                                .storage
                                .record_capacity_eviction(
                                    user,
                                    agent,
                                    &d.decision,
                                    self.config.max_facts,
                                    d.shadow.as_ref(),
                                    Some(now),
                                )
                                .await
                            {
                                tracing::warn!(error = %e, "capacity eviction audit failed");
                            }
                        }
                        tracing::info!(
                            revision = result.revision,
                            upserted = result.upserted_facts.len(),
                            deleted = result.deleted_fact_ids.len(),
                            "memory update committed"
                        );
                        UpdateStatus::Committed {
                            revision: result.revision,
                        }
                    }
                    Err(e) if e.is_conflict() && attempt < MAX_COMMIT_ATTEMPTS => {
                        tracing::info!(attempt, error = %e, "memory changed concurrently; recomputing the update on a fresh snapshot");
                        snapshot = self
                            .storage
                            .load(user, Some(agent))
                            .await
                            .map_err(|e| (UpdaterError::Storage(e), last_metrics))?;
                        if already_applied(&snapshot, &req.turns) {
                            // Another process committed these very turns meanwhile.
                            return Ok(UpdateOutcome {
                                attempts: attempt,
                                ..UpdateOutcome::simple(UpdateStatus::AlreadyApplied)
                            });
                        }
                        continue;
                    }
                    Err(e) if e.is_conflict() => {
                        return Err((
                            UpdaterError::ConflictRetriesExhausted {
                                attempts: attempt,
                                last: e,
                            },
                            last_metrics,
                        ));
                    }
                    Err(e) => return Err((UpdaterError::Storage(e), last_metrics)),
                }
            };
            return Ok(UpdateOutcome {
                status,
                origin: None,
                metrics: Some(outcome.metrics),
                report: Some(outcome.report),
                attempts: attempt,
            });
        }
    }
}

/// Whether every one of `turns` (none: never) is recorded in a fact of `doc` (`turnIds` of its
/// source).
fn already_applied(doc: &MemoryDocument, turns: &[String]) -> bool {
    if turns.is_empty() {
        return false;
    }
    let recorded: std::collections::HashSet<&str> =
        doc.facts.iter().flat_map(|f| f.source.turn_ids()).collect();
    turns.iter().all(|t| recorded.contains(t.as_str()))
}

/// Something that processes queued conversations (the updater, or a test double).
#[async_trait]
pub trait UpdateProcessor: Send + Sync + 'static {
    /// Processes one request.
    ///
    /// # Errors
    /// Whatever the processor reports; the queue logs it and carries on.
    async fn process(&self, request: UpdateRequest) -> Result<UpdateOutcome, UpdaterError>;
}

#[async_trait]
impl UpdateProcessor for MemoryUpdater {
    async fn process(&self, request: UpdateRequest) -> Result<UpdateOutcome, UpdaterError> {
        self.update(request).await
    }
}
