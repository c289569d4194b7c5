//! Shared test support: `MapManager`, a small in-memory `MemoryManager` with search and fact
//! CRUD (it passes the testkit manager contract, see `tests/contract.rs`), and a JSON Schema
//! structure check.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use deermem_core::ports::{FactAdmin, MemoryAdmin, MemoryReader, MemoryReload, MemorySearch};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use deermem_core::ports::{
    AddRequest, ContextRequest, FactPatch, MemoryManager, MemoryScope, NewFact, SearchRequest,
};
use deermem_core::{
    DEFAULT_AGENT_BUCKET, DEFAULT_USER_ID, InvalidInputCode, ManagerError, MemoryMode, PublicFact,
    PublicMemoryDocument,
};
use deermem_pycompat::py;
use serde_json::Value;

type Key = (String, String);

/// An in-memory backend: facts per (user, agent) bucket.
#[derive(Debug, Default)]
pub(crate) struct MapManager {
    buckets: Mutex<HashMap<Key, Vec<PublicFact>>>,
    next_id: AtomicU64,
}

impl MapManager {
    /// An empty manager.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn key(scope: &MemoryScope) -> Key {
        (
            scope
                .user
                .as_ref()
                .map_or(DEFAULT_USER_ID.to_owned(), |u| u.as_str().to_owned()),
            scope
                .agent
                .as_ref()
                .map_or(DEFAULT_AGENT_BUCKET.to_owned(), |a| a.as_str().to_owned()),
        )
    }

    fn with_bucket<T>(&self, scope: &MemoryScope, f: impl FnOnce(&mut Vec<PublicFact>) -> T) -> T {
        let mut map = self.buckets.lock().expect("buckets lock");
        f(map.entry(Self::key(scope)).or_default())
    }

    fn document(facts: &[PublicFact]) -> PublicMemoryDocument {
        PublicMemoryDocument {
            version: "2.0".into(),
            facts: facts.to_vec(),
            ..PublicMemoryDocument::empty()
        }
    }
}

fn check_confidence(c: f64) -> Result<(), ManagerError> {
    if c.is_finite() && (0.0..=1.0).contains(&c) {
        Ok(())
    } else {
        Err(ManagerError::invalid(
            InvalidInputCode::Confidence,
            "confidence must be a number between 0 and 1",
        ))
    }
}

fn check_content(c: &str) -> Result<String, ManagerError> {
    let s = py::strip(c);
    if s.is_empty() {
        Err(ManagerError::invalid(
            InvalidInputCode::Content,
            "content must not be empty",
        ))
    } else {
        Ok(s.to_owned())
    }
}

fn category(c: &str) -> String {
    let s = py::strip(c);
    if s.is_empty() {
        "context".into()
    } else {
        s.to_owned()
    }
}

fn check_revision(f: &PublicFact, expected: Option<u64>) -> Result<(), ManagerError> {
    match expected {
        Some(e) if f.revision != Some(e) => Err(ManagerError::conflict(format!(
            "Expected fact '{}' revision {e}, found {:?}",
            f.id, f.revision
        ))),
        _ => Ok(()),
    }
}

#[async_trait]
impl MemoryManager for MapManager {
    fn name(&self) -> &str {
        "MapManager"
    }

    fn mode(&self) -> MemoryMode {
        MemoryMode::Tool
    }

    async fn add(&self, _request: AddRequest) -> Result<(), ManagerError> {
        Ok(())
    }

    async fn get_context(&self, request: ContextRequest) -> Result<String, ManagerError> {
        Ok(self.with_bucket(&request.scope, |facts| {
            if facts.is_empty() {
                return String::new();
            }
            let mut text = String::from("Facts:\n");
            for f in facts.iter() {
                text.push_str(&format!("- [{}] {}\n", f.category, f.content));
            }
            text
        }))
    }

    fn searcher(&self) -> Option<&dyn MemorySearch> {
        Some(self)
    }

    fn reader(&self) -> Option<&dyn MemoryReader> {
        Some(self)
    }

    fn admin(&self) -> Option<&dyn MemoryAdmin> {
        Some(self)
    }

    fn reloader(&self) -> Option<&dyn MemoryReload> {
        None
    }

    fn facts(&self) -> Option<&dyn FactAdmin> {
        Some(self)
    }
}

#[async_trait]
impl MemorySearch for MapManager {
    async fn search_scored(
        &self,
        request: SearchRequest,
    ) -> Result<Vec<deermem_core::ports::ScoredFact>, ManagerError> {
        Ok(MemorySearch::search(self, request)
            .await?
            .into_iter()
            .map(|fact| deermem_core::ports::ScoredFact {
                fact,
                score: None,
                match_type: deermem_core::search::MatchType::Remote,
            })
            .collect())
    }

    async fn search(&self, request: SearchRequest) -> Result<Vec<PublicFact>, ManagerError> {
        let query = py::lower(py::strip(&request.query));
        if query.is_empty() || request.top_k == 0 {
            return Ok(Vec::new());
        }
        let words: Vec<&str> = query.split_whitespace().collect();
        Ok(self.with_bucket(&request.scope, |facts| {
            let mut hits: Vec<PublicFact> = facts
                .iter()
                .filter(|f| request.category.as_ref().is_none_or(|c| &f.category == c))
                .filter(|f| {
                    let content = py::lower(&f.content);
                    words.iter().any(|w| content.contains(w))
                })
                .cloned()
                .collect();
            hits.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
            hits.truncate(request.top_k);
            hits
        }))
    }
}

#[async_trait]
impl MemoryReader for MapManager {
    async fn get_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        Ok(self.with_bucket(&scope, |facts| Self::document(facts)))
    }
}

#[async_trait]
impl MemoryAdmin for MapManager {
    async fn clear_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        Ok(self.with_bucket(&scope, |facts| {
            facts.clear();
            Self::document(facts)
        }))
    }

    async fn import_memory(
        &self,
        document: PublicMemoryDocument,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        Ok(self.with_bucket(&scope, |facts| {
            *facts = document.facts;
            Self::document(facts)
        }))
    }
}

#[async_trait]
impl FactAdmin for MapManager {
    async fn create_fact(
        &self,
        fact: NewFact,
        scope: MemoryScope,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        let content = check_content(&fact.content)?;
        check_confidence(fact.confidence)?;
        let n = self.next_id.fetch_add(1, Ordering::SeqCst);
        let id = format!("fact_{n:08x}");
        self.with_bucket(&scope, |facts| {
            let folded = py::casefold(&content);
            if facts.iter().any(|f| py::casefold(&f.content) == folded) {
                return Err(ManagerError::invalid(
                    InvalidInputCode::DuplicateFact,
                    "Duplicate fact",
                ));
            }
            let public: PublicFact = serde_json::from_value(serde_json::json!({
                "id": id,
                "content": content,
                "category": category(&fact.category),
                "confidence": fact.confidence,
                "createdAt": "2026-01-01T00:00:00Z",
                "source": "manual",
                "revision": 1
            }))
            .map_err(|e| ManagerError::backend(e.to_string()))?;
            facts.push(public);
            Ok((Self::document(facts), Some(id.clone())))
        })
    }

    async fn update_fact(
        &self,
        fact_id: &str,
        patch: FactPatch,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let content = patch.content.as_deref().map(check_content).transpose()?;
        if let Some(c) = patch.confidence {
            check_confidence(c)?;
        }
        self.with_bucket(&scope, |facts| {
            let f = facts.iter_mut().find(|f| f.id == fact_id).ok_or_else(|| {
                ManagerError::NotFound {
                    fact_id: fact_id.to_owned(),
                }
            })?;
            check_revision(f, patch.expected_revision)?;
            if let Some(c) = content {
                f.content = c;
            }
            if let Some(c) = &patch.category {
                f.category = category(c);
            }
            if let Some(c) = patch.confidence {
                f.confidence = c;
            }
            f.revision = Some(f.revision.unwrap_or(1) + 1);
            Ok(Self::document(facts))
        })
    }

    async fn delete_fact(
        &self,
        fact_id: &str,
        expected_revision: Option<u64>,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        self.with_bucket(&scope, |facts| {
            let i = facts.iter().position(|f| f.id == fact_id).ok_or_else(|| {
                ManagerError::NotFound {
                    fact_id: fact_id.to_owned(),
                }
            })?;
            check_revision(&facts[i], expected_revision)?;
            facts.remove(i);
            Ok(Self::document(facts))
        })
    }
}

/// Asserts that `schema` is a JSON Schema object for tool arguments: `type: object`, a
/// `properties` object whose entries each have one valid `type` (no null), a `maxLength` on
/// the bounded strings, and a `required` list naming only declared properties.
pub(crate) fn assert_object_schema(name: &str, schema: &Value) {
    assert_eq!(schema["type"], "object", "{name}: type must be object");
    let props = schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{name}: properties must be an object"));
    let required = schema["required"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: required must be an array"));
    for r in required {
        let key = r.as_str().expect("required entries are strings");
        assert!(
            props.contains_key(key),
            "{name}: required '{key}' undeclared"
        );
    }
    let allowed = [
        "string", "number", "integer", "boolean", "null", "array", "object",
    ];
    for (prop, spec) in props {
        // One type per property: strict checkers (MCP Inspector's `--strict`) flag unions
        // such as `["string", "null"]`; an optional property is simply left out.
        let Value::String(t) = &spec["type"] else {
            panic!(
                "{name}.{prop}: type must be one type name, got {}",
                spec["type"]
            );
        };
        assert!(
            allowed.contains(&t.as_str()) && t != "null",
            "{name}.{prop}: unknown type {t}"
        );
        assert!(
            spec.get("default").is_none_or(|d| !d.is_null()),
            "{name}.{prop}: null default"
        );
        if t == "string" && ["content", "query", "category"].contains(&prop.as_str()) {
            assert!(
                spec["maxLength"].as_u64().is_some_and(|n| n > 0),
                "{name}.{prop}: the enforced limit is declared"
            );
        }
    }
}
