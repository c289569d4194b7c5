//! The crash writer's workload: a seeded stream of mixed storage operations (creates,
//! updates, deletes, summary updates, multi-change batches with every precondition, lazy v1
//! migrations), the line log the writer keeps (`begin` before an operation, `ack` after it
//! returned), and the [`State`] model a recovered root must match.
//!
//! All operations act for user [`USER`]; fact operations on agent [`AGENT`], migrations on
//! fresh `legacy-*` agents.

use std::collections::BTreeMap;
use std::path::Path;

use deermem_core::ports::MemoryStorageExt;
use deermem_core::prelude::*;
use deermem_core::{
    AgentName, ApplyOptions, ChangeSet, FactDraft, FactId, StorageError, SummaryPatch, UserId,
};
use deermem_storage_file::FileStorage;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The user every crash-workload operation acts for.
pub const USER: &str = "alice";
/// The agent of the fact operations.
pub const AGENT: &str = "agent-a";

/// Words mixed into contents so searches have something to find.
const WORDS: [&str; 12] = [
    "tea",
    "rust",
    "hiking",
    "berlin",
    "piano",
    "chess",
    "sushi",
    "linux",
    "jazz",
    "kayak",
    "乌龙茶",
    "東京",
];

/// One operation of the workload, with everything needed to predict its effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Op {
    /// Create-only upsert of a new fact.
    Create {
        /// Fact id.
        id: String,
        /// Content.
        content: String,
    },
    /// Update of an existing fact at its expected revision.
    Update {
        /// Fact id.
        id: String,
        /// New content.
        content: String,
        /// The fact's revision before the update.
        revision: u64,
    },
    /// Delete of an existing fact at its expected revision.
    Delete {
        /// Fact id.
        id: String,
        /// The fact's revision.
        revision: u64,
    },
    /// A summary update (`user.workContext`).
    Summary {
        /// The new summary.
        text: String,
    },
    /// One `apply_changes` with creates, updates, deletes and a summary, all preconditioned,
    /// at an expected manifest revision (no rebase).
    Batch {
        /// `(id, content)` to create.
        creates: Vec<(String, String)>,
        /// `(id, content, revision before)` to update.
        updates: Vec<(String, String, u64)>,
        /// `(id, revision)` to delete.
        deletes: Vec<(String, u64)>,
        /// A new `workContext` summary.
        summary: Option<String>,
        /// The manifest revision the batch was computed from.
        expected: u64,
    },
    /// A legacy v1 per-agent document dropped into `agents/<agent>/memory.json`, then
    /// migrated lazily by a load of that agent.
    Migrate {
        /// The (fresh) agent name.
        agent: String,
        /// `(id, content)` of the legacy facts.
        facts: Vec<(String, String)>,
    },
}

/// A fact of [`AGENT`] in the model: content and revision.
pub type ModelFact = (String, u64);

/// What the root holds for [`USER`], as far as the workload is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The shared user revision.
    pub revision: u64,
    /// Facts of [`AGENT`].
    pub facts: BTreeMap<String, ModelFact>,
    /// `user.workContext.summary`.
    pub summary: String,
    /// Migrated legacy agents: agent → id → content.
    pub legacy: BTreeMap<String, BTreeMap<String, String>>,
}

impl State {
    /// The state after `op` committed.
    pub fn applied(&self, op: &Op) -> State {
        let mut s = self.clone();
        s.revision += 1;
        match op {
            Op::Create { id, content } => {
                s.facts.insert(id.clone(), (content.clone(), 1));
            }
            Op::Update {
                id,
                content,
                revision,
            } => {
                s.facts.insert(id.clone(), (content.clone(), revision + 1));
            }
            Op::Delete { id, .. } => {
                s.facts.remove(id);
            }
            Op::Summary { text } => s.summary = text.clone(),
            Op::Batch {
                creates,
                updates,
                deletes,
                summary,
                ..
            } => {
                for (id, content) in creates {
                    s.facts.insert(id.clone(), (content.clone(), 1));
                }
                for (id, content, rev) in updates {
                    s.facts.insert(id.clone(), (content.clone(), rev + 1));
                }
                for (id, _) in deletes {
                    s.facts.remove(id);
                }
                if let Some(t) = summary {
                    s.summary = t.clone();
                }
            }
            Op::Migrate { agent, facts } => {
                s.legacy.insert(
                    agent.clone(),
                    facts.iter().map(|(i, c)| (i.clone(), c.clone())).collect(),
                );
            }
        }
        s
    }
}

/// One line of the writer's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum LogLine {
    /// The writer loaded the root and starts writing.
    Ready {
        /// The revision it saw.
        revision: u64,
    },
    /// An operation is about to run.
    Begin {
        /// Sequence number within the run.
        seq: u64,
        /// The operation.
        op: Op,
    },
    /// The operation returned successfully (the write is acknowledged).
    Ack {
        /// Sequence number.
        seq: u64,
        /// The revision the storage reported.
        revision: u64,
    },
}

/// What a (possibly cut) log says: the acknowledged operations in order with their reported
/// revisions, and the operation that had begun without an acknowledgement.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogSummary {
    /// Whether the writer got as far as `ready`.
    pub ready: bool,
    /// Acknowledged operations and the revisions reported for them.
    pub acked: Vec<(Op, u64)>,
    /// The operation in flight when the writer died.
    pub in_flight: Option<Op>,
}

/// Reads a log; a torn last line (the writer died while writing it) is ignored.
///
/// # Errors
/// A line other than the last that does not parse, or an `ack` for an operation that was not
/// begun.
pub fn parse_log(text: &str) -> Result<LogSummary, String> {
    let mut out = LogSummary::default();
    let lines: Vec<&str> = text.split('\n').collect();
    let last = lines.len().saturating_sub(1);
    for (i, line) in lines.iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        let parsed: LogLine = match serde_json::from_str(line) {
            Ok(l) => l,
            // The final fragment (no newline yet) may be torn.
            Err(_) if i == last => break,
            Err(e) => return Err(format!("log line {}: {e}: {line}", i + 1)),
        };
        match parsed {
            LogLine::Ready { .. } => out.ready = true,
            LogLine::Begin { op, .. } => {
                if let Some(prev) = out.in_flight.take() {
                    return Err(format!(
                        "operation {prev:?} began but was never acknowledged"
                    ));
                }
                out.in_flight = Some(op);
            }
            LogLine::Ack { revision, .. } => match out.in_flight.take() {
                Some(op) => out.acked.push((op, revision)),
                None => return Err(format!("ack without begin at line {}", i + 1)),
            },
        }
    }
    Ok(out)
}

fn user() -> UserId {
    UserId::new(USER).unwrap_or_else(|_| unreachable!("a constant valid user id"))
}

fn agent() -> AgentName {
    AgentName::parse(AGENT).unwrap_or_else(|_| unreachable!("a constant valid agent name"))
}

/// A fact draft; an update carries the stored revision, as the port requires.
fn draft(id: &str, content: &str, revision: Option<u64>) -> Result<FactDraft, StorageError> {
    let d = FactDraft::identified(fact_id(id)?, content)?
        .with_category("context")
        .with_confidence(0.5)?;
    Ok(match revision {
        Some(r) => d.with_revision(r)?,
        None => d,
    })
}

fn fact_id(id: &str) -> Result<FactId, StorageError> {
    FactId::new(id).map_err(StorageError::from)
}

fn summary_patch(text: &str) -> SummaryPatch {
    let mut p = Map::new();
    p.insert(
        "workContext".into(),
        json!({"summary": text, "updatedAt": "2026-01-01T00:00:00Z"}),
    );
    SummaryPatch {
        user: Some(p),
        history: None,
    }
}

/// Picks the next operation from the writer's current view of the root.
pub fn next_op(rng: &mut impl Rng, state: &State, run: u64, seq: u64) -> Op {
    let word = WORDS[rng.random_range(0..WORDS.len())];
    let content = |tag: &str| format!("{tag} r{run} s{seq} likes {word}");
    let ids: Vec<(&String, &ModelFact)> = state.facts.iter().collect();
    let pick = |rng: &mut dyn rand::RngCore| -> Option<(String, ModelFact)> {
        if ids.is_empty() {
            return None;
        }
        let i = (rng.next_u64() % ids.len() as u64) as usize;
        Some((ids[i].0.clone(), ids[i].1.clone()))
    };
    let roll = rng.random_range(0..100u32);
    let many = state.facts.len() > 40;
    match roll {
        0..=24 if !many => Op::Create {
            id: format!("f_{run}_{seq}"),
            content: content("created"),
        },
        0..=44 => match pick(rng) {
            Some((id, (_, revision))) => Op::Update {
                id,
                content: content("updated"),
                revision,
            },
            None => Op::Summary {
                text: content("summary"),
            },
        },
        45..=59 => match pick(rng) {
            Some((id, (_, revision))) => Op::Delete { id, revision },
            None => Op::Create {
                id: format!("f_{run}_{seq}"),
                content: content("created"),
            },
        },
        60..=74 => Op::Summary {
            text: content("summary"),
        },
        75..=95 => {
            let mut creates = Vec::new();
            if !many {
                for k in 0..rng.random_range(1..=3u32) {
                    creates.push((format!("b_{run}_{seq}_{k}"), content("batch")));
                }
            }
            let mut updates = Vec::new();
            let mut deletes = Vec::new();
            let mut used = std::collections::BTreeSet::new();
            for _ in 0..rng.random_range(0..=2u32) {
                if let Some((id, (_, rev))) = pick(rng)
                    && used.insert(id.clone())
                {
                    updates.push((id, content("batch-updated"), rev));
                }
            }
            for _ in 0..rng.random_range(0..=2u32) {
                if let Some((id, (_, rev))) = pick(rng)
                    && used.insert(id.clone())
                {
                    deletes.push((id, rev));
                }
            }
            Op::Batch {
                creates,
                updates,
                deletes,
                summary: Some(content("batch-summary")),
                expected: state.revision,
            }
        }
        _ => Op::Migrate {
            agent: format!("legacy-{run}-{seq}"),
            facts: (0..rng.random_range(1..=3u32))
                .map(|k| (format!("l_{run}_{seq}_{k}"), content("legacy")))
                .collect(),
        },
    }
}

/// Runs one operation; returns the revision the storage reported.
///
/// `scratch` is a directory on the root's filesystem where a legacy document is prepared
/// before it is renamed into place (so it is either absent or complete).
///
/// # Errors
/// Whatever the storage reports.
pub async fn execute(storage: &FileStorage, scratch: &Path, op: &Op) -> Result<u64, StorageError> {
    let (u, a) = (user(), agent());
    match op {
        Op::Create { id, content } => Ok(storage
            .upsert_fact(Some(&u), &a, draft(id, content, None)?, None, None)
            .await?
            .revision),
        Op::Update {
            id,
            content,
            revision,
        } => Ok(storage
            .upsert_fact(
                Some(&u),
                &a,
                draft(id, content, Some(*revision))?,
                None,
                Some(*revision),
            )
            .await?
            .revision),
        Op::Delete { id, revision } => Ok(storage
            .delete_fact(Some(&u), &a, &fact_id(id)?, None, Some(*revision))
            .await?
            .revision),
        Op::Summary { text } => Ok(storage
            .update_summaries(Some(&u), summary_patch(text), None)
            .await?
            .revision),
        Op::Batch {
            creates,
            updates,
            deletes,
            summary,
            expected,
        } => {
            let mut changes = ChangeSet::default();
            let mut upsert_revisions = BTreeMap::new();
            for (id, content) in creates {
                changes.upserts.push(draft(id, content, None)?);
                upsert_revisions.insert(fact_id(id)?, None);
            }
            for (id, content, rev) in updates {
                changes.upserts.push(draft(id, content, Some(*rev))?);
                upsert_revisions.insert(fact_id(id)?, Some(*rev));
            }
            let mut delete_revisions = BTreeMap::new();
            for (id, rev) in deletes {
                changes.deletes.push(fact_id(id)?);
                delete_revisions.insert(fact_id(id)?, *rev);
            }
            changes.upsert_revisions = Some(upsert_revisions);
            changes.delete_revisions = Some(delete_revisions);
            changes.summaries = summary.as_deref().map(summary_patch);
            let options = ApplyOptions {
                expected_manifest_revision: Some(*expected),
                allow_manifest_rebase: false,
            };
            Ok(storage
                .apply_changes(Some(&u), Some(&a), changes, options)
                .await?
                .revision)
        }
        Op::Migrate { agent: name, facts } => {
            let legacy = AgentName::parse(name)?;
            let list: Vec<Value> = facts
                .iter()
                .map(|(id, content)| {
                    json!({"id": id, "content": content, "category": "context",
                           "confidence": 0.5, "createdAt": "2026-01-01T00:00:00Z",
                           "source": "manual"})
                })
                .collect();
            let doc = json!({"version": "1.0", "facts": list});
            let dir = storage
                .root()
                .join("users")
                .join(USER)
                .join("agents")
                .join(name);
            let io = |e: std::io::Error| StorageError::Io {
                context: "preparing a legacy document".into(),
                source: e,
            };
            std::fs::create_dir_all(&dir).map_err(io)?;
            let tmp = scratch.join(format!("{name}.json"));
            std::fs::write(&tmp, doc.to_string()).map_err(io)?;
            std::fs::rename(&tmp, dir.join("memory.json")).map_err(io)?;
            let loaded = storage.load(Some(&u), Some(&legacy)).await?;
            for (id, _) in facts {
                if loaded.fact(id).is_none() {
                    return Err(StorageError::corrupt(format!(
                        "migrated fact {id} missing from {name}"
                    )));
                }
            }
            Ok(loaded.revision)
        }
    }
}

/// Reads the state of the root as the workload sees it: [`AGENT`]'s facts and the summary
/// (loading them recovers an interrupted commit), and each named legacy agent's facts (loading
/// them completes a pending migration). The revision is read last.
///
/// # Errors
/// Whatever the storage reports.
pub async fn read_state(
    storage: &FileStorage,
    legacy_agents: &[String],
) -> Result<State, StorageError> {
    let (u, a) = (user(), agent());
    let doc = storage.load(Some(&u), Some(&a)).await?;
    let facts = doc
        .facts
        .iter()
        .map(|f| (f.id.to_string(), (f.content.clone(), f.revision)))
        .collect();
    let summary = doc.user.entry("workContext").summary;
    let mut legacy = BTreeMap::new();
    for name in legacy_agents {
        let la = AgentName::parse(name)?;
        let d = storage.load(Some(&u), Some(&la)).await?;
        let m: BTreeMap<String, String> = d
            .facts
            .iter()
            .map(|f| (f.id.to_string(), f.content.clone()))
            .collect();
        if !m.is_empty() {
            legacy.insert(name.clone(), m);
        }
    }
    let revision = storage.get_summaries(Some(&u)).await?.revision;
    Ok(State {
        revision,
        facts,
        summary,
        legacy,
    })
}
