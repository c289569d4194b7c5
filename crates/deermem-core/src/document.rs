//! Memory documents: the per-user summaries, the internal document storage returns, the public
//! "DeerMem shape" the API shows, and the change sets that write them.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::fact::{Fact, FactDraft, PublicFact};
use crate::ids::FactId;
use crate::time::Timestamp;

/// The manifest version every write produces.
pub const DOCUMENT_VERSION: &str = "2.0";
/// The version reported for a user who has never been written to.
pub const EMPTY_DOCUMENT_VERSION: &str = "1.0";
/// The children of the `user` summary section.
pub const USER_SECTION_KEYS: [&str; 3] = ["workContext", "personalContext", "topOfMind"];
/// The children of the `history` summary section.
pub const HISTORY_SECTION_KEYS: [&str; 3] =
    ["recentMonths", "earlierContext", "longTermBackground"];

/// One summary: `{"summary": ..., "updatedAt": ...}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SummaryEntry {
    /// One to three sentences.
    #[serde(default)]
    pub summary: String,
    /// When the summary was written (free-form; writers use ISO-Z).
    #[serde(default, rename = "updatedAt")]
    pub updated_at: String,
}

impl SummaryEntry {
    /// An entry written now.
    pub fn new(summary: impl Into<String>, at: Timestamp) -> Self {
        Self {
            summary: summary.into(),
            updated_at: at.to_iso_z(),
        }
    }

    fn to_value(&self) -> Value {
        serde_json::json!({"summary": self.summary, "updatedAt": self.updated_at})
    }
}

/// A summary section (`user` or `history`) as stored: storage persists any JSON object here
/// verbatim, so the section keeps unknown children and non-standard values.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SummarySection(pub Map<String, Value>);

impl SummarySection {
    fn with_children(keys: &[&str]) -> Self {
        Self(
            keys.iter()
                .map(|k| ((*k).to_owned(), SummaryEntry::default().to_value()))
                .collect(),
        )
    }

    /// The default `user` section: three empty children.
    pub fn default_user() -> Self {
        Self::with_children(&USER_SECTION_KEYS)
    }

    /// The default `history` section: three empty children.
    pub fn default_history() -> Self {
        Self::with_children(&HISTORY_SECTION_KEYS)
    }

    /// One child, read leniently: non-string fields read as empty.
    pub fn entry(&self, key: &str) -> SummaryEntry {
        let child = self.0.get(key).and_then(Value::as_object);
        let field = |name: &str| {
            child
                .and_then(|c| c.get(name))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        SummaryEntry {
            summary: field("summary"),
            updated_at: field("updatedAt"),
        }
    }

    /// Replaces one child.
    pub fn set(&mut self, key: &str, entry: &SummaryEntry) {
        self.0.insert(key.to_owned(), entry.to_value());
    }

    /// The raw mapping.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    /// Whether any child holds a non-empty summary.
    pub fn has_content(&self) -> bool {
        self.0
            .keys()
            .any(|k| !self.entry(k).summary.trim().is_empty())
    }
}

/// The facts of a [`MemoryDocument`]: a list shared between clones and copied on first write.
///
/// Cloning a document (what every cached load returns) therefore costs one reference count, not
/// a copy of every fact. Reading goes through `Deref<Target = Vec<Fact>>`; any mutable access
/// (`push`, `retain`, `iter_mut`, indexing) first makes the list unique (`Arc::make_mut`), so a
/// change never shows through another clone.
#[derive(Clone, Default, PartialEq)]
pub struct Facts(Arc<Vec<Fact>>);

impl Facts {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// The owned list (copied only when another clone still shares it).
    pub fn into_vec(self) -> Vec<Fact> {
        Arc::try_unwrap(self.0).unwrap_or_else(|shared| (*shared).clone())
    }

    /// Whether both lists are the same allocation (a clone not written to since).
    pub fn shares_with(&self, other: &Facts) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for Facts {
    type Target = Vec<Fact>;

    fn deref(&self) -> &Vec<Fact> {
        &self.0
    }
}

impl DerefMut for Facts {
    fn deref_mut(&mut self) -> &mut Vec<Fact> {
        Arc::make_mut(&mut self.0)
    }
}

impl fmt::Debug for Facts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<Vec<Fact>> for Facts {
    fn from(list: Vec<Fact>) -> Self {
        Self(Arc::new(list))
    }
}

impl From<Facts> for Vec<Fact> {
    fn from(list: Facts) -> Self {
        list.into_vec()
    }
}

impl FromIterator<Fact> for Facts {
    fn from_iter<I: IntoIterator<Item = Fact>>(iter: I) -> Self {
        Self(Arc::new(iter.into_iter().collect()))
    }
}

impl Extend<Fact> for Facts {
    fn extend<I: IntoIterator<Item = Fact>>(&mut self, iter: I) {
        Arc::make_mut(&mut self.0).extend(iter);
    }
}

impl IntoIterator for Facts {
    type Item = Fact;
    type IntoIter = std::vec::IntoIter<Fact>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl<'a> IntoIterator for &'a Facts {
    type Item = &'a Fact;
    type IntoIter = std::slice::Iter<'a, Fact>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a mut Facts {
    type Item = &'a mut Fact;
    type IntoIter = std::slice::IterMut<'a, Fact>;

    fn into_iter(self) -> Self::IntoIter {
        Arc::make_mut(&mut self.0).iter_mut()
    }
}

impl PartialEq<Vec<Fact>> for Facts {
    fn eq(&self, other: &Vec<Fact>) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<[Fact]> for Facts {
    fn eq(&self, other: &[Fact]) -> bool {
        self.0.as_slice() == other
    }
}

/// The complete memory view of one user and agent bucket, as storage loads it: the user's shared
/// summaries plus the selected agent's facts (sorted by id), with structured sources.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryDocument {
    /// `"2.0"` when persisted, `"1.0"` for a user never written to.
    pub version: String,
    /// The shared user revision (0 when nothing was ever written).
    pub revision: u64,
    /// Time of the last commit (for an unwritten user: the load time).
    pub last_updated: String,
    /// The `user` summaries.
    pub user: SummarySection,
    /// The `history` summaries.
    pub history: SummarySection,
    /// The agent's facts, sorted by id; empty for user-level loads.
    pub facts: Facts,
    /// Extra top-level manifest keys (readable, dropped on the next commit).
    pub extra: Map<String, Value>,
}

impl MemoryDocument {
    /// The empty template (`create_empty_memory`): version `1.0`, revision 0.
    pub fn empty(now: Timestamp) -> Self {
        Self {
            version: EMPTY_DOCUMENT_VERSION.to_owned(),
            revision: 0,
            last_updated: now.to_iso_z(),
            user: SummarySection::default_user(),
            history: SummarySection::default_history(),
            facts: Facts::new(),
            extra: Map::new(),
        }
    }

    /// The public shape: typed summaries and public facts (sources as strings).
    pub fn to_public(&self) -> PublicMemoryDocument {
        PublicMemoryDocument {
            version: self.version.clone(),
            revision: Some(self.revision),
            last_updated: self.last_updated.clone(),
            user: PublicUserSummaries {
                work_context: self.user.entry("workContext"),
                personal_context: self.user.entry("personalContext"),
                top_of_mind: self.user.entry("topOfMind"),
            },
            history: PublicHistorySummaries {
                recent_months: self.history.entry("recentMonths"),
                earlier_context: self.history.entry("earlierContext"),
                long_term_background: self.history.entry("longTermBackground"),
            },
            facts: self.facts.iter().map(Fact::to_public).collect(),
        }
    }

    /// Finds a fact by id.
    pub fn fact(&self, id: &str) -> Option<&Fact> {
        self.facts.iter().find(|f| f.id.as_str() == id)
    }
}

/// The public `user` summaries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "UserSummaries"))]
pub struct PublicUserSummaries {
    /// Work context.
    #[serde(default)]
    pub work_context: SummaryEntry,
    /// Personal context.
    #[serde(default)]
    pub personal_context: SummaryEntry,
    /// Current focus.
    #[serde(default)]
    pub top_of_mind: SummaryEntry,
}

/// The public `history` summaries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "HistorySummaries"))]
pub struct PublicHistorySummaries {
    /// Recent months.
    #[serde(default)]
    pub recent_months: SummaryEntry,
    /// Earlier context.
    #[serde(default)]
    pub earlier_context: SummaryEntry,
    /// Long-term background.
    #[serde(default)]
    pub long_term_background: SummaryEntry,
}

impl PublicUserSummaries {
    /// The section as stored.
    pub fn to_section(&self) -> SummarySection {
        let mut s = SummarySection::default();
        s.set("workContext", &self.work_context);
        s.set("personalContext", &self.personal_context);
        s.set("topOfMind", &self.top_of_mind);
        s
    }
}

impl PublicHistorySummaries {
    /// The section as stored.
    pub fn to_section(&self) -> SummarySection {
        let mut s = SummarySection::default();
        s.set("recentMonths", &self.recent_months);
        s.set("earlierContext", &self.earlier_context);
        s.set("longTermBackground", &self.long_term_background);
        s
    }
}

/// The public memory document (the reference's `MemoryResponse`: version, revision, last
/// update, the six summary sections and the public facts); also the export/import format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "MemoryResponse"))]
pub struct PublicMemoryDocument {
    /// `"1.0"` or `"2.0"`.
    #[serde(default = "default_version")]
    pub version: String,
    /// Shared user revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// Last commit time.
    #[serde(default)]
    pub last_updated: String,
    /// User summaries.
    #[serde(default)]
    pub user: PublicUserSummaries,
    /// History summaries.
    #[serde(default)]
    pub history: PublicHistorySummaries,
    /// Facts of the selected bucket.
    #[serde(default)]
    pub facts: Vec<PublicFact>,
}

fn default_version() -> String {
    EMPTY_DOCUMENT_VERSION.to_owned()
}

impl PublicMemoryDocument {
    /// An empty document (what minimal backends return).
    pub fn empty() -> Self {
        Self {
            version: default_version(),
            revision: None,
            last_updated: String::new(),
            user: PublicUserSummaries::default(),
            history: PublicHistorySummaries::default(),
            facts: Vec::new(),
        }
    }

    /// The HTTP shape: manager-level fact fields removed.
    pub fn for_http(mut self) -> Self {
        self.facts = self.facts.into_iter().map(PublicFact::for_http).collect();
        self
    }
}

/// A per-child merge into the stored summary sections: supplied children replace the stored
/// child wholesale, omitted ones are kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SummaryPatch {
    /// Children of `user` to replace.
    pub user: Option<Map<String, Value>>,
    /// Children of `history` to replace.
    pub history: Option<Map<String, Value>>,
}

impl SummaryPatch {
    /// Whether the patch names no section at all.
    pub fn is_empty(&self) -> bool {
        self.user.is_none() && self.history.is_none()
    }
}

/// A batch of fact and summary changes for one user and agent, applied atomically.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChangeSet {
    /// Facts to create or update. An update must carry the stored `revision`.
    pub upserts: Vec<FactDraft>,
    /// Ids to delete; absent ids are skipped.
    pub deletes: Vec<FactId>,
    /// Expected revision per deleted id.
    pub delete_revisions: Option<BTreeMap<FactId, u64>>,
    /// Expected revision per upserted id; `None` means "must not exist yet".
    pub upsert_revisions: Option<BTreeMap<FactId, Option<u64>>>,
    /// Summary children to merge.
    pub summaries: Option<SummaryPatch>,
}

impl ChangeSet {
    /// Whether the set touches facts.
    pub fn has_fact_changes(&self) -> bool {
        !self.upserts.is_empty() || !self.deletes.is_empty()
    }
}

/// Preconditions and rebase policy for [`crate::ports::FactRepository::apply_changes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyOptions {
    /// The shared revision the change was computed from; `None` skips the check.
    pub expected_manifest_revision: Option<u64>,
    /// Point operations may rebase over a newer shared revision while every addressed fact
    /// still meets its own precondition.
    pub allow_manifest_rebase: bool,
}

impl ApplyOptions {
    /// A whole-set change computed from the snapshot at `revision`: it commits only if the
    /// shared revision is still that one (no rebase).
    pub fn at_revision(revision: u64) -> Self {
        Self {
            expected_manifest_revision: Some(revision),
            allow_manifest_rebase: false,
        }
    }
}

/// What `apply_changes` applied: only the delta, never a complete document
/// (`complete: false` in the reference).
#[derive(Clone, Debug, PartialEq)]
pub struct ChangeResult {
    /// Manifest version after the commit.
    pub version: String,
    /// Shared revision after the commit (unchanged for a no-op).
    pub revision: u64,
    /// Commit time (unchanged for a no-op).
    pub last_updated: String,
    /// Facts actually written, in order (no-op upserts omitted).
    pub upserted_facts: Vec<Fact>,
    /// Ids actually deleted, in order (absent ids omitted).
    pub deleted_fact_ids: Vec<FactId>,
}

impl ChangeResult {
    /// The reference's JSON form of the result, with `complete: false`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "complete": false,
            "version": self.version,
            "revision": self.revision,
            "lastUpdated": self.last_updated,
            "upsertedFacts": self.upserted_facts.iter().map(|f| Value::Object(f.to_internal_map())).collect::<Vec<_>>(),
            "deletedFactIds": self.deleted_fact_ids.iter().map(|i| i.as_str()).collect::<Vec<_>>(),
        })
    }
}

/// The shared summaries of one user with the revision they were read at.
#[derive(Clone, Debug, PartialEq)]
pub struct SummariesSnapshot {
    /// `user` section.
    pub user: SummarySection,
    /// `history` section.
    pub history: SummarySection,
    /// Shared revision.
    pub revision: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(id: &str, content: &str) -> Fact {
        use crate::fact::{NormalizeContext, normalize_fact};
        let scope = crate::fact::FactScope {
            user_id: Some("alice".into()),
            agent_name: None,
        };
        let new_id = || FactId::new(id).unwrap();
        let ctx = NormalizeContext {
            scope: &scope,
            existing: None,
            now: Timestamp::parse_iso("2026-12-02T09:00:00Z").unwrap(),
            new_id: &new_id,
        };
        let draft = serde_json::json!({"content": content});
        normalize_fact(&draft.try_into().unwrap(), &ctx).unwrap()
    }

    #[test]
    fn cloned_facts_share_the_list_until_one_clone_is_written() {
        let now = Timestamp::parse_iso("2026-01-01T00:00:00Z").unwrap();
        let mut doc = MemoryDocument::empty(now);
        doc.facts = vec![fact("a", "likes tea"), fact("b", "lives in Paris")].into();
        let snapshot = doc.clone();
        assert!(
            doc.facts.shares_with(&snapshot.facts),
            "a clone copies no fact"
        );

        doc.facts[0].content = "likes coffee".into();
        doc.facts.push(fact("c", "works remotely"));
        assert!(!doc.facts.shares_with(&snapshot.facts));
        assert_eq!(snapshot.facts.len(), 2, "the clone never sees the push");
        assert_eq!(snapshot.facts[0].content, "likes tea", "nor the edit");
        assert_eq!(doc.facts[0].content, "likes coffee");

        let mut other = snapshot.clone();
        other.facts.retain(|f| f.id.as_str() != "a");
        for f in &mut other.facts {
            f.content.push('!');
        }
        assert_eq!(other.facts.len(), 1);
        assert_eq!(other.facts[0].content, "lives in Paris!");
        assert_eq!(snapshot.facts[1].content, "lives in Paris");

        let owned: Vec<Fact> = snapshot.facts.clone().into_vec();
        assert_eq!(snapshot.facts, owned);
        let collected: Facts = owned.into_iter().rev().collect();
        assert_eq!(collected[0].id.as_str(), "b");
    }

    #[test]
    fn empty_document_matches_reference_template() {
        let now = Timestamp::parse_iso("2026-01-01T00:00:00Z").unwrap();
        let doc = MemoryDocument::empty(now);
        assert_eq!(doc.version, "1.0");
        assert_eq!(doc.revision, 0);
        let public = serde_json::to_value(doc.to_public()).unwrap();
        assert_eq!(
            public["user"]["workContext"],
            serde_json::json!({"summary": "", "updatedAt": ""})
        );
        assert_eq!(public["history"]["longTermBackground"]["summary"], "");
        assert_eq!(public["facts"], serde_json::json!([]));
        assert_eq!(
            doc.user.as_map().keys().collect::<Vec<_>>(),
            vec!["workContext", "personalContext", "topOfMind"]
        );
    }

    #[test]
    fn lenient_section_reads() {
        let mut s = SummarySection::default_user();
        s.0.insert("workContext".into(), serde_json::json!({"summary": 5}));
        assert_eq!(s.entry("workContext").summary, "");
        s.set(
            "topOfMind",
            &SummaryEntry {
                summary: "Rust".into(),
                updated_at: "now".into(),
            },
        );
        assert!(s.has_content());
    }

    #[test]
    fn public_document_defaults_missing_keys() {
        let doc: PublicMemoryDocument =
            serde_json::from_str(r#"{"facts":[{"id":"a","content":"x"}], "bogus": 1}"#).unwrap();
        assert_eq!(doc.version, "1.0");
        assert_eq!(doc.facts[0].category, "context");
        assert_eq!(doc.facts[0].confidence, 0.5);
        assert_eq!(doc.facts[0].source, "unknown");
        let back = serde_json::to_value(&doc).unwrap();
        assert!(back.get("revision").is_none());
    }
}
