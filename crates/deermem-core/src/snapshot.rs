//! One user's whole stored memory as plain data, for moving it between storage adapters
//! (`deermem migrate --from … --to …`): the shared revision and its timestamp, the summaries,
//! and per agent the facts and the usage and audit sidecars exactly as stored. Adapters read
//! and write it as administrative operations that keep every stored value (revisions and
//! timestamps included), so a copy is the same memory, not a re-commit of it.

use serde_json::{Map, Value, json};

use crate::document::SummarySection;
use crate::fact::Fact;
use crate::ids::AgentName;

/// One user bucket's memory.
#[derive(Debug, Clone, PartialEq)]
pub struct UserSnapshot {
    /// The storage bucket (the file store's directory name, the database's key).
    pub bucket: String,
    /// The shared revision of the user's record.
    pub revision: u64,
    /// `lastUpdated` of the record, as stored.
    pub last_updated: String,
    /// The `user` summary section.
    pub user: SummarySection,
    /// The `history` summary section.
    pub history: SummarySection,
    /// The agents holding facts or sidecars, by name.
    pub agents: Vec<AgentSnapshot>,
}

/// One agent bucket of a user.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSnapshot {
    /// The agent bucket.
    pub agent: AgentName,
    /// The facts, by id, with the raw user id each one records.
    pub facts: Vec<Fact>,
    /// The usage sidecar as stored (key order kept); `None` when there is none.
    pub usage: Option<Map<String, Value>>,
    /// The capacity-eviction audit as stored; `None` when there is none.
    pub audit: Option<Vec<Value>>,
}

/// How much a snapshot holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Agent buckets.
    pub agents: usize,
    /// Facts over all agents.
    pub facts: usize,
    /// Usage entries over all agents.
    pub usage: usize,
    /// Audit events over all agents.
    pub audit: usize,
}

impl std::ops::AddAssign for SnapshotCounts {
    fn add_assign(&mut self, o: Self) {
        self.agents += o.agents;
        self.facts += o.facts;
        self.usage += o.usage;
        self.audit += o.audit;
    }
}

/// A fact in its stored shape: the Markdown front matter (with `user_id` and `agent_name`),
/// then `title` and `content`.
pub fn stored_fact(fact: &Fact) -> Map<String, Value> {
    let mut m = fact.front_matter();
    m.insert("title".into(), Value::String(fact.title.clone()));
    m.insert("content".into(), Value::String(fact.content.clone()));
    m
}

impl UserSnapshot {
    /// An empty record for `bucket` (what a bucket never written to reads as).
    pub fn empty(bucket: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            revision: 0,
            last_updated: String::new(),
            user: SummarySection::default_user(),
            history: SummarySection::default_history(),
            agents: Vec::new(),
        }
    }

    /// Whether nothing is stored: no revision, no facts and no sidecar.
    pub fn is_empty(&self) -> bool {
        self.revision == 0
            && self
                .agents
                .iter()
                .all(|a| a.facts.is_empty() && a.usage.is_none() && a.audit.is_none())
    }

    /// The counts of what it holds.
    pub fn counts(&self) -> SnapshotCounts {
        SnapshotCounts {
            agents: self.agents.len(),
            facts: self.agents.iter().map(|a| a.facts.len()).sum(),
            usage: self
                .agents
                .iter()
                .map(|a| a.usage.as_ref().map_or(0, Map::len))
                .sum(),
            audit: self
                .agents
                .iter()
                .map(|a| a.audit.as_ref().map_or(0, Vec::len))
                .sum(),
        }
    }

    /// The canonical serialisation the transfer checksums: compact JSON with a fixed key order
    /// (`bucket`, `revision`, `lastUpdated`, `user`, `history`, `agents`), agents by name,
    /// facts by id in their stored shape, sidecars as stored (`null` when absent). Two
    /// snapshots serialise equally exactly when they are the same memory.
    pub fn canonical_json(&self) -> String {
        let mut agents: Vec<&AgentSnapshot> = self.agents.iter().collect();
        agents.sort_by(|a, b| a.agent.as_str().cmp(b.agent.as_str()));
        let agents: Vec<Value> = agents
            .into_iter()
            .map(|a| {
                let mut facts: Vec<&Fact> = a.facts.iter().collect();
                facts.sort_by(|x, y| x.id.as_str().cmp(y.id.as_str()));
                let facts: Vec<Map<String, Value>> = facts.into_iter().map(stored_fact).collect();
                json!({"agent": a.agent, "facts": facts, "usage": a.usage, "audit": a.audit})
            })
            .collect();
        json!({
            "bucket": self.bucket,
            "revision": self.revision,
            "lastUpdated": self.last_updated,
            "user": self.user,
            "history": self.history,
            "agents": agents,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_counts_and_order_independence() {
        let mut s = UserSnapshot::empty("alice");
        assert!(s.is_empty());
        assert_eq!(s.counts(), SnapshotCounts::default());
        s.agents.push(AgentSnapshot {
            agent: AgentName::parse("coder").unwrap(),
            facts: Vec::new(),
            usage: Some(Map::from_iter([("f".to_owned(), Value::from(1))])),
            audit: None,
        });
        s.agents.push(AgentSnapshot {
            agent: AgentName::default_bucket(),
            facts: Vec::new(),
            usage: None,
            audit: Some(vec![Value::from("e")]),
        });
        assert!(!s.is_empty());
        assert_eq!(
            s.counts(),
            SnapshotCounts {
                agents: 2,
                facts: 0,
                usage: 1,
                audit: 1
            }
        );
        let mut reversed = s.clone();
        reversed.agents.reverse();
        assert_eq!(s.canonical_json(), reversed.canonical_json());
        let mut changed = s.clone();
        changed.revision = 1;
        assert_ne!(s.canonical_json(), changed.canonical_json());
    }
}
