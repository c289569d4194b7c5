//! Applying a proposed update to a memory snapshot, then stripping upload mentions: every gate and
//! guardrail in the reference's order, producing the updated document, the drafts of the facts it
//! creates, the capacity decisions to audit after the commit, and the gate metrics.
//!
//! The function is pure: time, ids and the usage sidecar arrive in an [`ApplyContext`], and the
//! input snapshot is never modified, so a commit conflict can re-apply the same proposal to a
//! fresh snapshot.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::DeerMemConfig;
use deermem_core::fact::{FactSource, NormalizeContext, normalize_fact};
use deermem_core::policy::eviction::{
    EvictionDecision, EvictionPolicy, FactUsageMap, select_facts_for_capacity,
};
use deermem_core::{Fact, FactDraft, FactError, FactId, FactScope, MemoryDocument, Timestamp};
use serde::Serialize;
use serde_json::{Value, json};

use crate::consolidation::select_consolidation_candidates;
use crate::facts::FactIdSource;
use crate::parse::{DEFAULT_CONSOLIDATION_CONFIDENCE, ProposedUpdate, ReplacementRef, SectionKind};
use crate::signals::{Signal, SignalSet};
use crate::staleness::{
    effective_age_days, parse_fact_datetime, review_reference, safe_add_days,
    select_stale_candidates,
};
use crate::text::content_key;
use crate::uploads;

/// Everything [`apply_update`] needs besides the snapshot and the proposal.
#[derive(Debug)]
pub struct ApplyContext<'a> {
    /// The DeerMem configuration.
    pub config: &'a DeerMemConfig,
    /// The time written into every timestamp of this apply.
    pub now: Timestamp,
    /// The conversation the proposal came from (the new facts' source).
    pub thread_id: &'a str,
    /// The journal turns the proposal stands for, recorded in the new facts' source.
    pub turns: &'a [String],
    /// Signals of the extraction batch (the reinforcement gate reads them).
    pub signals: SignalSet,
    /// The scope the facts belong to.
    pub scope: &'a FactScope,
    /// The usage sidecar (read by the caller only when the hybrid policy or shadow mode needs
    /// it; otherwise empty).
    pub usage: &'a FactUsageMap,
    /// Fresh fact ids.
    pub ids: &'a FactIdSource,
    /// The fact ids the prompt offered for consolidation; a merge may consume only these.
    /// `None` allows every fact of a qualifying category (the reference's rule).
    pub consolidation_allowed: Option<&'a BTreeSet<String>>,
}

/// Rejections of the fact and consolidation gates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FactGateCounts {
    /// A label is missing.
    pub missing: usize,
    /// The scope is not `user`.
    pub scope: usize,
    /// The durability is not `durable`.
    pub durability: usize,
    /// The authority is not `descriptive`.
    pub authority: usize,
}

impl FactGateCounts {
    fn total(&self) -> usize {
        self.missing + self.scope + self.durability + self.authority
    }
}

/// Rejections of the summary gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SummaryGateCounts {
    /// A label is missing.
    pub missing: usize,
    /// The scope is not `user`.
    pub scope: usize,
    /// The authority is not `descriptive`.
    pub authority: usize,
}

/// Rejections of the removal gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemovalGateCounts {
    /// Scope or reason missing.
    pub missing: usize,
    /// The scope is not `user`.
    pub scope: usize,
    /// The replacement did not survive.
    pub replacement: usize,
}

/// Every scope-gate counter, in the reference's shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ScopeGateRejections {
    /// New facts.
    pub facts: FactGateCounts,
    /// Summaries.
    pub summaries: SummaryGateCounts,
    /// Contradiction removals.
    pub removals: RemovalGateCounts,
    /// Consolidations.
    pub consolidations: FactGateCounts,
}

impl ScopeGateRejections {
    /// The sum of all fourteen counters.
    pub fn total(&self) -> usize {
        self.facts.total()
            + self.summaries.missing
            + self.summaries.scope
            + self.summaries.authority
            + self.removals.missing
            + self.removals.scope
            + self.removals.replacement
            + self.consolidations.total()
    }
}

/// The extraction metrics of one update (the reference's callback payload keys).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UpdateMetrics {
    /// New facts after normalisation.
    pub facts_extracted: usize,
    /// New facts at or above the confidence threshold (counted before the scope gate).
    pub facts_passed_confidence: usize,
    /// `facts_extracted - facts_passed_confidence`.
    pub rejected_low_confidence: usize,
    /// New facts not rejected by the scope gate.
    pub facts_passed_scope_gate: usize,
    /// Sum of every scope-gate counter.
    pub rejected_by_scope_gate: usize,
    /// The counters.
    pub scope_gate_rejections: ScopeGateRejections,
    /// Items the parser dropped as malformed (new facts and summaries).
    pub dropped_malformed: usize,
}

impl UpdateMetrics {
    /// The warnings the reference's default observer logs: more than 60% of the extracted
    /// facts below the confidence threshold, or rejected by the scope gate.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.facts_extracted == 0 {
            return out;
        }
        let n = self.facts_extracted as f64;
        let low = self.rejected_low_confidence as f64 / n;
        if low > 0.6 {
            out.push(format!(
                "memory extraction rejection rate {:.0}% exceeds 60% ({} of {} facts below the confidence threshold)",
                low * 100.0,
                self.rejected_low_confidence,
                self.facts_extracted
            ));
        }
        let scope = self.scope_gate_rejections.facts.total() as f64 / n;
        if scope > 0.6 {
            out.push(format!(
                "memory extraction scope-gate rejection rate {:.0}% exceeds 60% ({} of {} facts rejected; check that custom prompts ask for scope/durability/authority labels)",
                scope * 100.0,
                self.scope_gate_rejections.facts.total(),
                self.facts_extracted
            ));
        }
        out
    }
}

/// A capacity eviction to audit after a successful commit.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityDecision {
    /// What the configured policy did.
    pub decision: EvictionDecision,
    /// The hybrid policy's opinion in shadow mode.
    pub shadow: Option<EvictionDecision>,
}

/// The capacity decision for a list of facts, or `None` when the list fits in `max_facts`. The
/// configured policy decides; in shadow mode with the confidence policy, the hybrid decision is
/// computed too, for the audit only. `usage` is read only by the hybrid policy and shadow mode.
/// Shared by automatic updates, manual creation and import.
pub fn capacity_decision(
    facts: &[Fact],
    config: &DeerMemConfig,
    usage: &FactUsageMap,
    now: Timestamp,
) -> Option<CapacityDecision> {
    if facts.len() <= config.max_facts {
        return None;
    }
    let empty = FactUsageMap::new();
    let usage = if config.tracks_usage() { usage } else { &empty };
    let decision = select_facts_for_capacity(
        facts,
        usage,
        now,
        &config.eviction_params(config.fact_eviction_policy),
    );
    let shadow = (config.fact_eviction_shadow_enabled
        && config.fact_eviction_policy == EvictionPolicy::Confidence)
        .then(|| {
            select_facts_for_capacity(
                facts,
                usage,
                now,
                &config.eviction_params(EvictionPolicy::HybridV1),
            )
        });
    Some(CapacityDecision { decision, shadow })
}

/// The kind of proposed item a [`Rejection`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalKind {
    /// A new fact.
    NewFact,
    /// A summary replacement.
    Summary,
    /// A contradiction removal.
    Removal,
    /// A consolidation (merge) group.
    Consolidation,
}

/// Why the gates refused a proposed item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// A scope, durability or authority label (or a removal's id, scope or reason) is missing.
    MissingLabels,
    /// The scope is not `user`.
    NotUserScope,
    /// The durability is not `durable`.
    NotDurable,
    /// The authority is not `descriptive`.
    NotDescriptive,
    /// The confidence is below `fact_confidence_threshold`.
    LowConfidence,
    /// The same content is already stored or was proposed earlier in the batch.
    Duplicate,
    /// The content is blank.
    Blank,
    /// A paired removal whose replacement did not survive the gates.
    ReplacementNotKept,
    /// Consolidation sources that are unknown, already merged in this batch, or not offered.
    SourcesUnavailable,
    /// A consolidation group smaller than 2 or larger than `consolidation_max_sources`.
    GroupSize,
    /// Accepted, then evicted at once by the capacity policy (`max_facts`).
    Evicted,
}

/// A proposed item the gates refused, with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// What was proposed.
    pub kind: ProposalKind,
    /// The item: a fact's content, `section.key` for a summary, the fact id for a removal, the
    /// merged content for a consolidation.
    pub item: String,
    /// Why it was refused.
    pub reason: RejectReason,
}

/// What an apply did, for logs and tests.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ApplyReport {
    /// Facts whose confirmation was recorded.
    pub reinforced: Vec<String>,
    /// Summaries replaced, as `section.key`.
    pub summaries_updated: Vec<String>,
    /// Facts removed by staleness review.
    pub stale_removed: Vec<String>,
    /// Facts whose review window was extended, with the new window.
    pub stale_extended: Vec<(String, i64)>,
    /// New facts created (before capacity).
    pub created: Vec<String>,
    /// Facts evicted by capacity.
    pub evicted: Vec<String>,
    /// Facts removed as contradicted.
    pub removed: Vec<String>,
    /// Merged facts and their sources.
    pub consolidated: Vec<(String, Vec<String>)>,
    /// Facts removed because they describe upload events.
    pub upload_removed: Vec<String>,
    /// Proposed items the gates refused, in proposal order per kind.
    pub rejected: Vec<Rejection>,
}

/// The result of [`apply_update`].
#[derive(Clone, Debug)]
pub struct ApplyOutcome {
    /// The updated document.
    pub document: MemoryDocument,
    /// Drafts of the facts this apply created, by id (what is sent to storage for them).
    pub new_drafts: BTreeMap<String, FactDraft>,
    /// Gate metrics.
    pub metrics: UpdateMetrics,
    /// Capacity decisions to audit after the commit.
    pub capacity: Vec<CapacityDecision>,
    /// What happened.
    pub report: ApplyReport,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    Pass,
    Missing,
    Scope,
    Durability,
    Authority,
}

fn fact_gate(scope: Option<&str>, durability: Option<&str>, authority: Option<&str>) -> Gate {
    match (scope, durability, authority) {
        (Some(s), Some(d), Some(a)) => {
            if s != "user" {
                Gate::Scope
            } else if d != "durable" {
                Gate::Durability
            } else if a != "descriptive" {
                Gate::Authority
            } else {
                Gate::Pass
            }
        }
        _ => Gate::Missing,
    }
}

fn gate_reason(gate: Gate) -> RejectReason {
    match gate {
        Gate::Pass | Gate::Missing => RejectReason::MissingLabels,
        Gate::Scope => RejectReason::NotUserScope,
        Gate::Durability => RejectReason::NotDurable,
        Gate::Authority => RejectReason::NotDescriptive,
    }
}

fn count(counts: &mut FactGateCounts, gate: Gate) {
    match gate {
        Gate::Pass => {}
        Gate::Missing => counts.missing += 1,
        Gate::Scope => counts.scope += 1,
        Gate::Durability => counts.durability += 1,
        Gate::Authority => counts.authority += 1,
    }
}

struct Builder<'a> {
    ctx: &'a ApplyContext<'a>,
    doc: MemoryDocument,
    drafts: BTreeMap<String, FactDraft>,
    metrics: UpdateMetrics,
    capacity: Vec<CapacityDecision>,
    report: ApplyReport,
    now_iso: String,
}

/// Applies a proposal to a snapshot: reinforcement, summaries, staleness removals and
/// extensions, new facts, capacity, contradiction removals, consolidation, then upload-mention
/// stripping, in the reference's order.
pub fn apply_update(
    current: &MemoryDocument,
    update: &ProposedUpdate,
    ctx: &ApplyContext<'_>,
) -> ApplyOutcome {
    let mut b = Builder {
        ctx,
        doc: current.clone(),
        drafts: BTreeMap::new(),
        metrics: UpdateMetrics {
            facts_extracted: update.new_facts.len(),
            dropped_malformed: update.dropped_new_facts + update.dropped_summaries,
            ..UpdateMetrics::default()
        },
        capacity: Vec::new(),
        report: ApplyReport::default(),
        now_iso: ctx.now.to_iso_z(),
    };
    b.reinforce(update);
    b.summaries(update);
    b.staleness(update);
    let replacement_keys = b.new_facts(update);
    b.enforce_capacity();
    b.removals(update, &replacement_keys);
    b.consolidate(update);
    b.strip_uploads();
    b.metrics.rejected_by_scope_gate = b.metrics.scope_gate_rejections.total();
    ApplyOutcome {
        document: b.doc,
        new_drafts: b.drafts,
        metrics: b.metrics,
        capacity: b.capacity,
        report: b.report,
    }
}

impl<'a> Builder<'a> {
    fn cfg(&self) -> &'a DeerMemConfig {
        self.ctx.config
    }

    fn reject(&mut self, kind: ProposalKind, item: &str, reason: RejectReason) {
        self.report.rejected.push(Rejection {
            kind,
            item: item.to_owned(),
            reason,
        });
    }

    /// Reinforcement: explicit confirmations, only with a deterministic reinforcement signal in the
    /// batch and only when confirmation metadata is tracked.
    fn reinforce(&mut self, update: &ProposedUpdate) {
        if !(self.cfg().tracks_usage() && self.ctx.signals.contains(Signal::Reinforcement)) {
            return;
        }
        let ids: HashSet<&str> = update
            .facts_to_reinforce
            .iter()
            .filter(|e| e.scope.as_deref() == Some("user") && e.reason.is_some())
            .map(|e| e.id.as_str())
            .collect();
        for f in &mut self.doc.facts {
            if ids.contains(f.id.as_str()) {
                let prior = f.confirmation_count.flatten().unwrap_or(0);
                f.last_confirmed_at = Some(Some(self.now_iso.clone()));
                f.confirmation_count = Some(Some(prior.saturating_add(1)));
                self.report.reinforced.push(f.id.as_str().to_owned());
            }
        }
    }

    /// Summaries: replacements behind the scope/authority gate.
    fn summaries(&mut self, update: &ProposedUpdate) {
        for p in &update.summaries {
            // Summaries carry no durability label: the fact gate with that label passed.
            let gate = fact_gate(p.scope.as_deref(), Some("durable"), p.authority.as_deref());
            if gate != Gate::Pass {
                let counts = &mut self.metrics.scope_gate_rejections.summaries;
                match gate {
                    Gate::Scope => counts.scope += 1,
                    Gate::Authority => counts.authority += 1,
                    _ => counts.missing += 1,
                }
                let item = format!("{}.{}", p.section.as_str(), p.key);
                self.reject(ProposalKind::Summary, &item, gate_reason(gate));
                continue;
            }
            let child = json!({"summary": p.summary, "updatedAt": self.now_iso});
            let section = match p.section {
                SectionKind::User => &mut self.doc.user,
                SectionKind::History => &mut self.doc.history,
            };
            section.0.insert(p.key.clone(), child);
            self.report
                .summaries_updated
                .push(format!("{}.{}", p.section.as_str(), p.key));
        }
    }

    /// Staleness: removals and extensions, intersected with the current candidates.
    fn staleness(&mut self, update: &ProposedUpdate) {
        if update.stale_facts_to_remove.is_empty() && update.stale_facts_to_extend.is_empty() {
            return;
        }
        let now = self.ctx.now;
        let candidate_ids: HashSet<String> =
            select_stale_candidates(&self.doc.facts, self.cfg(), now)
                .iter()
                .map(|f| f.id.as_str().to_owned())
                .collect();
        let proposed: HashSet<&str> = update
            .stale_facts_to_remove
            .iter()
            .map(|e| e.id.as_str())
            .collect();
        let mut matching: Vec<&Fact> = self
            .doc
            .facts
            .iter()
            .filter(|f| proposed.contains(f.id.as_str()) && candidate_ids.contains(f.id.as_str()))
            .collect();
        // Lowest confidence goes first when the model asks for more than the cap (stable).
        matching.sort_by(|a, b| a.confidence.total_cmp(&b.confidence));
        // Sorted, as the report lists them.
        let remove: BTreeSet<String> = matching
            .iter()
            .take(self.cfg().staleness_max_removals_per_cycle)
            .map(|f| f.id.as_str().to_owned())
            .collect();
        for e in update
            .stale_facts_to_remove
            .iter()
            .filter(|e| remove.contains(&e.id))
        {
            tracing::info!(fact_id = %e.id, reason = %e.reason, "staleness review removed a fact");
        }
        if !remove.is_empty() {
            self.doc.facts.retain(|f| !remove.contains(f.id.as_str()));
        }
        self.report.stale_removed.extend(remove);

        // Every proposed removal is excluded from extension, even one spared by the cap.
        let mut ext: HashMap<&str, i128> = HashMap::new();
        for e in &update.stale_facts_to_extend {
            if candidate_ids.contains(&e.id) && !proposed.contains(e.id.as_str()) {
                ext.insert(e.id.as_str(), e.extend_by_days);
            }
        }
        let ceiling = i128::from(self.cfg().staleness_max_extension_days);
        for f in &mut self.doc.facts {
            let Some(&by) = ext.get(f.id.as_str()) else {
                continue;
            };
            if by <= 0 {
                continue;
            }
            // Measured from the same instant the review window runs from (the reference measured
            // from `createdAt` even when the window ran from `lastConfirmedAt`).
            let Some((reference, _)) = review_reference(f) else {
                continue;
            };
            let since = i128::from(now.whole_days_since(reference));
            let days = since.saturating_add(by).min(ceiling).max(1);
            let days = i64::try_from(days).unwrap_or(i64::MAX);
            f.set_extra("expected_valid_days", Some(Value::from(days)));
            self.report
                .stale_extended
                .push((f.id.as_str().to_owned(), days));
        }
    }

    fn fresh_id(&self) -> Option<FactId> {
        for _ in 0..32 {
            let id = self.ctx.ids.next_id();
            let taken =
                self.doc.facts.iter().any(|f| f.id == id) || self.drafts.contains_key(id.as_str());
            if !taken {
                return Some(id);
            }
        }
        tracing::warn!("could not draw an unused fact id; skipping a new fact");
        None
    }

    fn creation_cap(&self) -> i128 {
        let cap =
            self.cfg().staleness_age_days as f64 * self.cfg().staleness_max_lifetime_multiplier;
        cap.trunc() as i128
    }

    /// Normalises a draft into a fact of this scope and records the draft; a draft the fact
    /// rules refused is skipped.
    fn push_new(&mut self, draft: Result<FactDraft, FactError>) -> Option<String> {
        // Drafts always carry an id; the generator is never called.
        let ids = self.ctx.ids;
        let fallback = || ids.next_id();
        let ctx = NormalizeContext {
            scope: self.ctx.scope,
            existing: None,
            now: self.ctx.now,
            new_id: &fallback,
        };
        match draft.and_then(|draft| Ok((normalize_fact(&draft, &ctx)?, draft))) {
            Ok((fact, draft)) => {
                let id = fact.id.as_str().to_owned();
                self.doc.facts.push(fact);
                self.drafts.insert(id.clone(), draft);
                Some(id)
            }
            Err(e) => {
                tracing::warn!(error = %e, "a proposed fact failed validation and was skipped");
                None
            }
        }
    }

    fn source(&self) -> FactSource {
        if self.ctx.thread_id.is_empty() {
            FactSource::unknown().with_turns(self.ctx.turns)
        } else {
            // Structured, so a thread literally named "manual" stays a conversation source.
            FactSource::conversation(self.ctx.thread_id).with_turns(self.ctx.turns)
        }
    }

    /// New facts: through the threshold count, the scope gate, the threshold and dedup.
    /// Returns the content key of every fact that passed the gates, by the model's index.
    fn new_facts(&mut self, update: &ProposedUpdate) -> HashMap<usize, String> {
        let threshold = self.cfg().fact_confidence_threshold;
        let mut existing: HashSet<String> = self
            .doc
            .facts
            .iter()
            .filter_map(|f| content_key(&f.content))
            .collect();
        let cap = self.creation_cap();
        let mut replacement_keys = HashMap::new();
        let mut passed = 0usize;
        for nf in &update.new_facts {
            if nf.confidence >= threshold {
                passed += 1;
            }
            let gate = fact_gate(
                nf.scope.as_deref(),
                nf.durability.as_deref(),
                nf.authority.as_deref(),
            );
            if gate != Gate::Pass {
                count(&mut self.metrics.scope_gate_rejections.facts, gate);
                self.reject(ProposalKind::NewFact, &nf.content, gate_reason(gate));
                continue;
            }
            if nf.confidence < threshold {
                self.reject(
                    ProposalKind::NewFact,
                    &nf.content,
                    RejectReason::LowConfidence,
                );
                continue;
            }
            let Some(key) = content_key(&nf.content) else {
                self.reject(ProposalKind::NewFact, &nf.content, RejectReason::Blank);
                continue;
            };
            replacement_keys.insert(nf.index, key.clone());
            if existing.contains(&key) {
                self.reject(ProposalKind::NewFact, &nf.content, RejectReason::Duplicate);
                continue;
            }
            let Some(id) = self.fresh_id() else {
                continue;
            };
            let mut d = FactDraft::identified(id, &nf.content).and_then(|d| {
                Ok(d.with_category(nf.category.clone())
                    .with_confidence(nf.confidence)?
                    .with_created_at(self.now_iso.clone())
                    .with_source(self.source()))
            });
            if let Some(se) = &nf.source_error {
                d = d.and_then(|d| d.with("sourceError", Value::String(se.clone())));
            }
            if let Some(evd) = nf.expected_valid_days {
                d = d.and_then(|d| d.with("expected_valid_days", json_i128(evd.min(cap))));
            }
            if let Some(id) = self.push_new(d) {
                existing.insert(key);
                self.report.created.push(id);
            }
        }
        let n = update.new_facts.len();
        let m = &mut self.metrics;
        m.facts_passed_confidence = passed;
        m.rejected_low_confidence = n - passed;
        m.facts_passed_scope_gate = n.saturating_sub(m.scope_gate_rejections.facts.total());
        replacement_keys
    }

    /// Capacity: eviction through the core policy.
    fn enforce_capacity(&mut self) {
        if let Some(d) =
            capacity_decision(&self.doc.facts, self.cfg(), self.ctx.usage, self.ctx.now)
        {
            let evicted = d.decision.evicted_ids();
            for id in &evicted {
                let content = self.drafts.get(id).map(|draft| draft.content().to_owned());
                if let Some(content) = content {
                    self.reject(ProposalKind::NewFact, &content, RejectReason::Evicted);
                }
            }
            self.report.evicted.extend(evicted);
            let all = std::mem::take(&mut self.doc.facts).into_vec();
            self.doc.facts = move_in_kept_order(all, &d.decision.kept).into();
            self.capacity.push(d);
        }
    }

    /// Contradiction removals; a paired removal needs its replacement to have survived.
    fn removals(&mut self, update: &ProposedUpdate, replacement_keys: &HashMap<usize, String>) {
        if update.facts_to_remove.is_empty() {
            return;
        }
        // Content key → ids of the post-trim memory, computed once.
        let mut by_key: HashMap<String, Vec<&str>> = HashMap::new();
        for f in &self.doc.facts {
            if let Some(k) = content_key(&f.content) {
                by_key.entry(k).or_default().push(f.id.as_str());
            }
        }
        let mut marked: HashSet<String> = HashSet::new();
        let mut refused: Vec<Rejection> = Vec::new();
        for e in &update.facts_to_remove {
            let counts = &mut self.metrics.scope_gate_rejections.removals;
            let mut refuse = |reason: RejectReason| {
                refused.push(Rejection {
                    kind: ProposalKind::Removal,
                    item: e.id.clone(),
                    reason,
                });
            };
            let (Some(scope), Some(_reason)) = (e.scope.as_deref(), e.reason.as_deref()) else {
                counts.missing += 1;
                refuse(RejectReason::MissingLabels);
                continue;
            };
            if scope != "user" {
                counts.scope += 1;
                refuse(RejectReason::NotUserScope);
                continue;
            }
            if e.id.is_empty() {
                counts.missing += 1;
                refuse(RejectReason::MissingLabels);
                continue;
            }
            match e.replacement {
                ReplacementRef::None => {}
                ReplacementRef::Invalid => {
                    counts.replacement += 1;
                    refuse(RejectReason::ReplacementNotKept);
                    continue;
                }
                ReplacementRef::Index(i) => {
                    let survived = replacement_keys
                        .get(&i)
                        .and_then(|key| by_key.get(key))
                        .is_some_and(|ids| ids.iter().any(|id| *id != e.id));
                    if !survived {
                        counts.replacement += 1;
                        refuse(RejectReason::ReplacementNotKept);
                        continue;
                    }
                }
            }
            marked.insert(e.id.clone());
        }
        self.report.rejected.extend(refused);
        if marked.is_empty() {
            return;
        }
        let before: Vec<String> = self
            .doc
            .facts
            .iter()
            .filter(|f| marked.contains(f.id.as_str()))
            .map(|f| f.id.as_str().to_owned())
            .collect();
        self.doc.facts.retain(|f| !marked.contains(f.id.as_str()));
        self.report.removed.extend(before);
    }

    /// Consolidation with its guardrails.
    fn consolidate(&mut self, update: &ProposedUpdate) {
        let cfg = self.cfg();
        if !cfg.consolidation_enabled || update.facts_to_consolidate.is_empty() {
            return;
        }
        let allowed: HashSet<String> = select_consolidation_candidates(&self.doc.facts, cfg)
            .values()
            .flatten()
            .map(|f| f.id.as_str().to_owned())
            .filter(|id| {
                self.ctx
                    .consolidation_allowed
                    .is_none_or(|shown| shown.contains(id))
            })
            .collect();
        let threshold = cfg.fact_confidence_threshold;
        let cap = self.creation_cap();
        let now = self.ctx.now;
        let mut consumed: HashSet<String> = HashSet::new();
        let mut merged: Vec<Result<FactDraft, FactError>> = Vec::new();
        let mut merges = 0usize;
        for p in &update.facts_to_consolidate {
            if merges >= cfg.consolidation_max_groups_per_cycle {
                break;
            }
            let sources: Vec<&Fact> = p
                .source_ids
                .iter()
                .filter_map(|id| self.doc.facts.iter().find(|f| f.id.as_str() == id))
                .collect();
            let usable = sources.len() == p.source_ids.len()
                && p.source_ids
                    .iter()
                    .all(|id| !consumed.contains(id) && allowed.contains(id));
            let gate = fact_gate(
                p.scope.as_deref(),
                p.durability.as_deref(),
                p.authority.as_deref(),
            );
            let refusal = if !usable {
                Some(RejectReason::SourcesUnavailable)
            } else if !(2..=cfg.consolidation_max_sources).contains(&p.source_ids.len()) {
                Some(RejectReason::GroupSize)
            } else if gate != Gate::Pass {
                count(&mut self.metrics.scope_gate_rejections.consolidations, gate);
                Some(gate_reason(gate))
            } else {
                None
            };
            if let Some(reason) = refusal {
                self.reject(ProposalKind::Consolidation, &p.content, reason);
                continue;
            }
            let max_src = sources
                .iter()
                .map(|f| bounded(f.confidence))
                .fold(f64::NEG_INFINITY, f64::max);
            // One rule for every path (the reference's default differed between the parser and a
            // direct apply): a missing confidence is 0.9, and the merged fact is never more
            // confident than its most confident source.
            let model = p.confidence.unwrap_or(DEFAULT_CONSOLIDATION_CONFIDENCE);
            let conf = model.clamp(0.0, 1.0).min(max_src);
            if conf < threshold {
                self.reject(
                    ProposalKind::Consolidation,
                    &p.content,
                    RejectReason::LowConfidence,
                );
                continue;
            }
            let created: Vec<Timestamp> = sources
                .iter()
                .map(|f| parse_fact_datetime(&f.created_at).unwrap_or(now))
                .collect();
            let newest = created.iter().copied().max().unwrap_or(now);
            let deadline = sources
                .iter()
                .zip(&created)
                .map(|(f, &c)| {
                    safe_add_days(c, effective_age_days(f, cfg.staleness_age_days))
                        .or_else(|| safe_add_days(c, i128::from(cfg.staleness_age_days)))
                        .unwrap_or(newest)
                })
                .min()
                .unwrap_or(newest);
            let days = i128::from(deadline.whole_days_since(newest));
            let evd = days.max(1).min(cap);
            let mut source_errors: Vec<&str> = Vec::new();
            for f in &sources {
                if let Some(se) = f.source_error()
                    && !se.trim().is_empty()
                    && !source_errors.contains(&se)
                {
                    source_errors.push(se);
                }
            }
            let Some(id) = self.fresh_id() else {
                continue;
            };
            let mut d = FactDraft::identified(id.clone(), &p.content).and_then(|d| {
                d.with_category(p.category.clone())
                    .with_confidence(conf)?
                    // Always UTC ISO-Z, whatever the sources' offsets (the reference appended
                    // `Z` to a non-UTC offset, giving an invalid timestamp).
                    .with_created_at(newest.to_iso_z())
                    .with_source(FactSource::consolidation())
                    .with_consolidated_from(p.source_ids.clone())
                    .with("consolidatedAt", Value::String(self.now_iso.clone()))
            });
            if !source_errors.is_empty() {
                let joined = Value::String(source_errors.join("\n"));
                d = d.and_then(|d| d.with("sourceError", joined));
            }
            d = d.and_then(|d| d.with("expected_valid_days", json_i128(evd)));
            for id in &p.source_ids {
                consumed.insert(id.clone());
            }
            self.report
                .consolidated
                .push((id.as_str().to_owned(), p.source_ids.clone()));
            merged.push(d);
            merges += 1;
        }
        if consumed.is_empty() {
            return;
        }
        self.doc.facts.retain(|f| !consumed.contains(f.id.as_str()));
        for d in merged {
            self.push_new(d);
        }
    }

    /// Upload mentions: upload-event sentences leave the summaries, upload-event facts are
    /// deleted.
    fn strip_uploads(&mut self) {
        for section in [&mut self.doc.user, &mut self.doc.history] {
            for child in section.0.values_mut() {
                let Some(obj) = child.as_object_mut() else {
                    continue;
                };
                // Non-string summaries are left alone (they used to abort the update).
                if let Some(Value::String(s)) = obj.get("summary") {
                    let cleaned = uploads::strip_upload_sentences(s);
                    if cleaned != *s {
                        obj.insert("summary".into(), Value::String(cleaned));
                    }
                }
            }
        }
        // One regex pass per fact.
        let mut removed: Vec<String> = Vec::new();
        self.doc.facts.retain(|f| {
            let mentions = uploads::mentions_upload_event(&f.content);
            if mentions {
                removed.push(f.id.as_str().to_owned());
            }
            !mentions
        });
        for id in &removed {
            self.drafts.remove(id);
        }
        self.report.upload_removed.extend(removed);
    }
}

/// The facts of `all` in the order of `kept`, the copies the capacity policy kept of some of
/// them: each kept fact is the one of `all` with its id, moved rather than cloned a second
/// time. When an id occurs more than once in `all` (or a kept id is not found), the copies are
/// cloned instead, so which of several same-id facts is kept stays the policy's choice.
fn move_in_kept_order(all: Vec<Fact>, kept: &[Fact]) -> Vec<Fact> {
    let order: Option<Vec<usize>> = {
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(all.len());
        let mut unique = true;
        for (i, f) in all.iter().enumerate() {
            unique &= index.insert(f.id.as_str(), i).is_none();
        }
        if unique {
            kept.iter()
                .map(|k| index.get(k.id.as_str()).copied())
                .collect()
        } else {
            None
        }
    };
    let Some(order) = order else {
        return kept.to_vec();
    };
    let mut slots: Vec<Option<Fact>> = all.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(kept.len());
    for (i, k) in order.into_iter().zip(kept) {
        // Ids are unique, so a slot is taken at most once; the fallback keeps this total.
        out.push(slots[i].take().unwrap_or_else(|| k.clone()));
    }
    out
}

/// The reference's source-confidence coercion for a stored (always numeric) confidence.
fn bounded(c: f64) -> f64 {
    if c.is_finite() {
        c.clamp(0.0, 1.0)
    } else {
        0.5
    }
}

fn json_i128(x: i128) -> Value {
    i64::try_from(x).map_or_else(|_| Value::from(i64::MAX), Value::from)
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
