//! `FactDraft`, a fact before normalisation: the reference's typed keys checked when the draft
//! is built (from JSON at the boundary, or with typed setters), every other key kept, and the
//! key order remembered so that a rewritten file keeps its layout.

use serde_json::{Map, Value};

use super::{ACTIVE_STATUS, Fact, FactSource, is_typed_key};
use crate::error::FactError;
use crate::ids::FactId;
use deermem_pycompat::py;

/// The keys a draft checks, in the order the reference checks them: the first invalid one in
/// this order is the error a draft reports, whatever the order of its keys.
const CHECK_ORDER: [&str; 14] = [
    "id",
    "content",
    "category",
    "confidence",
    "status",
    "topics",
    "consolidatedFrom",
    "lastConfirmedAt",
    "confirmationCount",
    "revision",
    "source",
    "title",
    "createdAt",
    "updatedAt",
];

/// A fact to write, before normalisation (what a change set upserts).
///
/// The keys whose rules are known are typed and checked when set: the id, the stripped
/// non-empty content, the category, the confidence in `[0, 1]`, the status, the string lists,
/// the confirmation fields, the expected revision (at least 1), the source and the timestamps.
/// Every other key (`categoryExtension`, `sourceError`, hand-added keys...) is kept as JSON.
/// The draft remembers the order of all its keys, typed or not, so that normalisation lays out
/// the fact as the writer did. A draft is built from JSON once, with [`FactDraft::from_json`],
/// where JSON arrives (model output, import documents, stored facts read back); Rust code builds
/// one with [`FactDraft::new`] or [`FactDraft::identified`] and the setters, or from a stored
/// fact with [`Fact::to_draft`].
#[derive(Clone, Debug, PartialEq)]
pub struct FactDraft {
    /// Every key, in order.
    keys: Vec<String>,
    pub(super) id: Option<FactId>,
    pub(super) content: String,
    /// An explicit title, as text (a non-string title is the text Python's `str()` gives).
    pub(super) title: Option<String>,
    pub(super) category: Option<String>,
    pub(super) confidence: Option<f64>,
    pub(super) topics: Option<Vec<String>>,
    pub(super) consolidated_from: Option<Vec<String>>,
    pub(super) last_confirmed_at: Option<Option<String>>,
    pub(super) confirmation_count: Option<Option<u64>>,
    pub(super) revision: Option<u64>,
    pub(super) source: Option<FactSource>,
    pub(super) created_at: Option<String>,
    pub(super) updated_at: Option<String>,
    /// Every key without a typed rule, in order.
    pub(super) extra: Map<String, Value>,
}

fn as_int(v: &Value) -> Option<i128> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from)),
        _ => None,
    }
}

fn string_list(v: &Value, err: FactError) -> Result<Vec<String>, FactError> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned).ok_or_else(|| err.clone()))
            .collect(),
        _ => Err(err),
    }
}

/// The text of an explicit title: none when the value is falsy, a string as it is, anything
/// else as Python's `str()` writes it.
fn title_text(v: &Value) -> Option<String> {
    if !py::truthy(v) {
        return None;
    }
    Some(match v {
        Value::String(s) => s.clone(),
        other => py::py_str(other).unwrap_or_else(|| other.to_string()),
    })
}

fn stripped_content(content: &str) -> Result<String, FactError> {
    let c = py::strip(content);
    if c.is_empty() {
        return Err(FactError::ContentEmpty);
    }
    Ok(c.to_owned())
}

fn check_confidence(c: f64) -> Result<f64, FactError> {
    if (0.0..=1.0).contains(&c) {
        Ok(c)
    } else {
        Err(FactError::Confidence)
    }
}

impl FactDraft {
    fn bare(content: String) -> Self {
        Self {
            keys: Vec::new(),
            id: None,
            content,
            title: None,
            category: None,
            confidence: None,
            topics: None,
            consolidated_from: None,
            last_confirmed_at: None,
            confirmation_count: None,
            revision: None,
            source: None,
            created_at: None,
            updated_at: None,
            extra: Map::new(),
        }
    }

    /// A draft of `content` (stripped) without an id: storage assigns one.
    ///
    /// # Errors
    /// [`FactError::ContentEmpty`] when the content is blank.
    pub fn new(content: &str) -> Result<Self, FactError> {
        let mut d = Self::bare(stripped_content(content)?);
        d.keys.push("content".into());
        Ok(d)
    }

    /// A draft of `content` (stripped) with its id, the id first in key order.
    ///
    /// # Errors
    /// [`FactError::ContentEmpty`] when the content is blank.
    pub fn identified(id: FactId, content: &str) -> Result<Self, FactError> {
        let mut d = Self::bare(stripped_content(content)?);
        d.id = Some(id);
        d.keys.extend(["id".into(), "content".into()]);
        Ok(d)
    }

    /// The draft of a JSON fact object, checked key by key with the reference's rules and in
    /// its order (id, content, category, confidence, status, topics, consolidatedFrom,
    /// lastConfirmedAt, confirmationCount, revision, source, timestamps). A falsy id is no id;
    /// `schemaVersion`, `scope`, `user_id` and `agent_name` keep their place in the key order
    /// but not their value (normalisation writes them).
    ///
    /// # Errors
    /// The [`FactError`] of the first invalid key in that order.
    pub fn from_json(map: Map<String, Value>) -> Result<Self, FactError> {
        let mut draft = Self::bare(String::new());
        draft.keys = Vec::with_capacity(map.len() + 4);
        let mut typed: [Option<Value>; CHECK_ORDER.len()] = Default::default();
        for (k, v) in map {
            if let Some(rank) = CHECK_ORDER.iter().position(|c| *c == k) {
                typed[rank] = Some(v);
            } else if !is_typed_key(&k) {
                draft.extra.insert(k.clone(), v);
            }
            draft.keys.push(k);
        }
        for (key, value) in CHECK_ORDER.iter().zip(typed) {
            match value {
                Some(v) => draft.put(key, v)?,
                None if *key == "content" => return Err(FactError::ContentNotString),
                None => {}
            }
        }
        Ok(draft)
    }

    /// Sets one typed key from JSON (the key order is the caller's).
    fn put(&mut self, key: &str, v: Value) -> Result<(), FactError> {
        let opt_string = |v: Value, err: FactError| match v {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            _ => Err(err),
        };
        let string = |v: Value, err: FactError| match v {
            Value::String(s) => Ok(s),
            _ => Err(err),
        };
        match key {
            "id" => {
                self.id = if py::truthy(&v) {
                    let s = py::py_str(&v).ok_or(FactError::InvalidId)?;
                    Some(FactId::new(s).map_err(|e| match e {
                        crate::IdError::FactIdTooLong { len, max } => {
                            FactError::IdTooLong { len, max }
                        }
                        _ => FactError::InvalidId,
                    })?)
                } else {
                    None
                };
            }
            "content" => {
                self.content = stripped_content(&string(v, FactError::ContentNotString)?)?;
            }
            "category" => self.category = Some(string(v, FactError::CategoryNotString)?),
            "confidence" => {
                let c = v.as_f64().ok_or(FactError::Confidence)?;
                self.confidence = Some(check_confidence(c)?);
            }
            "status" => {
                if v.as_str() != Some(ACTIVE_STATUS) {
                    return Err(FactError::Status);
                }
            }
            "topics" => self.topics = Some(string_list(&v, FactError::Topics)?),
            "consolidatedFrom" => {
                self.consolidated_from = Some(string_list(&v, FactError::ConsolidatedFrom)?);
            }
            "lastConfirmedAt" => {
                self.last_confirmed_at = Some(opt_string(v, FactError::LastConfirmedAt)?);
            }
            "confirmationCount" => {
                self.confirmation_count = Some(match v {
                    Value::Null => None,
                    v => Some(
                        as_int(&v)
                            .filter(|n| *n >= 1)
                            .and_then(|n| u64::try_from(n).ok())
                            .ok_or(FactError::ConfirmationCount)?,
                    ),
                });
            }
            "revision" => {
                self.revision = Some(
                    as_int(&v)
                        .filter(|n| *n >= 1)
                        .and_then(|n| u64::try_from(n).ok())
                        .ok_or(FactError::Revision)?,
                );
            }
            "source" => self.source = Some(FactSource::from_value(&v)?),
            "title" => self.title = title_text(&v),
            "createdAt" => self.created_at = Some(string(v, FactError::Timestamps)?),
            "updatedAt" => self.updated_at = Some(string(v, FactError::Timestamps)?),
            _ if is_typed_key(key) => {}
            _ => {
                self.extra.insert(key.to_owned(), v);
            }
        }
        Ok(())
    }

    fn touch(&mut self, key: &str) {
        if !self.keys.iter().any(|k| k == key) {
            self.keys.push(key.to_owned());
        }
    }

    /// The draft with any key set from JSON: a typed key is checked as
    /// [`FactDraft::from_json`] checks it, any other key is kept as it is. A key the draft
    /// already has keeps its place; a new one goes last.
    ///
    /// # Errors
    /// The [`FactError`] of an invalid value of a typed key.
    pub fn with(mut self, key: &str, value: Value) -> Result<Self, FactError> {
        self.put(key, value)?;
        self.touch(key);
        Ok(self)
    }

    /// Removes a key (its typed value or its JSON value, and its place in the key order). The
    /// content cannot be removed: `"content"` is ignored.
    pub fn remove(&mut self, key: &str) {
        if key == "content" {
            return;
        }
        match key {
            "id" => self.id = None,
            "title" => self.title = None,
            "category" => self.category = None,
            "confidence" => self.confidence = None,
            "topics" => self.topics = None,
            "consolidatedFrom" => self.consolidated_from = None,
            "lastConfirmedAt" => self.last_confirmed_at = None,
            "confirmationCount" => self.confirmation_count = None,
            "revision" => self.revision = None,
            "source" => self.source = None,
            "createdAt" => self.created_at = None,
            "updatedAt" => self.updated_at = None,
            _ => {
                self.extra.shift_remove(key);
            }
        }
        self.keys.retain(|k| k != key);
    }

    /// The draft with its id set (a new `id` key goes last, as the reference appends it).
    pub fn with_id(mut self, id: FactId) -> Self {
        self.set_id(id);
        self
    }

    /// Sets the id (a new `id` key goes last).
    pub fn set_id(&mut self, id: FactId) {
        self.id = Some(id);
        self.touch("id");
    }

    /// The draft with new content (stripped).
    ///
    /// # Errors
    /// [`FactError::ContentEmpty`] when the content is blank.
    pub fn with_content(mut self, content: &str) -> Result<Self, FactError> {
        self.content = stripped_content(content)?;
        Ok(self)
    }

    /// The draft with a category (a non-core one is stored as `other` plus
    /// `categoryExtension` by normalisation).
    pub fn with_category(mut self, category: impl Into<String>) -> Self {
        self.category = Some(category.into());
        self.touch("category");
        self
    }

    /// The draft with a confidence.
    ///
    /// # Errors
    /// [`FactError::Confidence`] outside `[0, 1]` (or NaN).
    pub fn with_confidence(mut self, confidence: f64) -> Result<Self, FactError> {
        self.confidence = Some(check_confidence(confidence)?);
        self.touch("confidence");
        Ok(self)
    }

    /// The draft with its creation time.
    pub fn with_created_at(mut self, created_at: impl Into<String>) -> Self {
        self.created_at = Some(created_at.into());
        self.touch("createdAt");
        self
    }

    /// The draft with its source.
    pub fn with_source(mut self, source: FactSource) -> Self {
        self.source = Some(source);
        self.touch("source");
        self
    }

    /// The draft with the ids it was consolidated from.
    pub fn with_consolidated_from(mut self, ids: Vec<String>) -> Self {
        self.consolidated_from = Some(ids);
        self.touch("consolidatedFrom");
        self
    }

    /// The draft with the revision it was read at (the update's expected revision).
    ///
    /// # Errors
    /// [`FactError::Revision`] for 0.
    pub fn with_revision(mut self, revision: u64) -> Result<Self, FactError> {
        if revision == 0 {
            return Err(FactError::Revision);
        }
        self.revision = Some(revision);
        self.touch("revision");
        Ok(self)
    }

    /// The id, when the draft has one.
    pub fn id(&self) -> Option<&FactId> {
        self.id.as_ref()
    }

    /// The stripped, non-empty content.
    pub fn content(&self) -> &str {
        &self.content
    }

    /// The category as given.
    pub fn category(&self) -> Option<&str> {
        self.category.as_deref()
    }

    /// The confidence as given.
    pub fn confidence(&self) -> Option<f64> {
        self.confidence
    }

    /// The revision the draft was read at (at least 1), when it carries one.
    pub fn revision(&self) -> Option<u64> {
        self.revision
    }

    /// The source as given.
    pub fn source(&self) -> Option<&FactSource> {
        self.source.as_ref()
    }

    /// The value of a key without a typed rule (`sourceError`, `expected_valid_days`...).
    pub fn extra(&self, key: &str) -> Option<&Value> {
        self.extra.get(key)
    }

    /// Every key, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }
}

impl Fact {
    /// A draft to send back for an update: every key of the fact with its revision, so the
    /// storage's revision check passes, in the fact's key order (the keys of
    /// [`Fact::to_internal_map`]).
    pub fn to_draft(&self) -> FactDraft {
        let keys = self
            .ordered_keys()
            .into_iter()
            .filter(|k| *k != "user_id" && *k != "agent_name")
            .map(str::to_owned)
            .collect();
        FactDraft {
            keys,
            id: Some(self.id.clone()),
            content: self.content.clone(),
            title: Some(self.title.clone()).filter(|t| !t.is_empty()),
            category: self.category.clone(),
            confidence: Some(self.confidence).filter(|c| c.is_finite()),
            topics: Some(self.topics.clone()),
            consolidated_from: Some(self.consolidated_from.clone()),
            last_confirmed_at: self.last_confirmed_at.clone(),
            confirmation_count: self.confirmation_count,
            revision: Some(self.revision),
            source: Some(self.source.clone()),
            created_at: Some(self.created_at.clone()),
            updated_at: Some(self.updated_at.clone()),
            extra: self
                .extra
                .iter()
                .filter(|(k, _)| !is_typed_key(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

impl TryFrom<Value> for FactDraft {
    type Error = FactError;

    /// [`FactDraft::from_json`] of a JSON value that must be an object.
    fn try_from(value: Value) -> Result<Self, FactError> {
        match value {
            Value::Object(m) => Self::from_json(m),
            _ => Err(FactError::NotAnObject),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn draft(v: Value) -> Result<FactDraft, FactError> {
        FactDraft::try_from(v)
    }

    #[test]
    fn the_first_invalid_key_in_the_reference_order_is_the_error_whatever_the_key_order() {
        let err = draft(json!({"confidence": 5, "topics": 1, "content": 3})).unwrap_err();
        assert_eq!(err, FactError::ContentNotString);
        let err = draft(json!({"revision": 0, "status": "gone", "content": "x"})).unwrap_err();
        assert_eq!(err, FactError::Status);
        assert_eq!(
            draft(json!({"id": "x"})).unwrap_err(),
            FactError::ContentNotString
        );
        assert_eq!(draft(json!([1])).unwrap_err(), FactError::NotAnObject);
    }

    #[test]
    fn every_key_keeps_its_place_and_new_keys_go_last() {
        let d = draft(
            json!({"scope": {}, "sourceError": "s", "id": "", "content": " x ",
                             "user_id": "u", "revision": 2}),
        )
        .unwrap();
        assert_eq!(
            d.keys().collect::<Vec<_>>(),
            [
                "scope",
                "sourceError",
                "id",
                "content",
                "user_id",
                "revision"
            ]
        );
        // A falsy id is no id; the content is stripped; ignored keys keep only their place.
        assert_eq!((d.id(), d.content(), d.revision()), (None, "x", Some(2)));
        assert_eq!(d.extra("sourceError"), Some(&json!("s")));
        assert_eq!(d.extra("scope"), None);
        let mut d = d
            .with_id(FactId::new("f1").unwrap())
            .with_category("goal")
            .with("sourceError", json!("t"))
            .unwrap();
        d.remove("revision");
        d.remove("content");
        assert_eq!(
            d.keys().collect::<Vec<_>>(),
            [
                "scope",
                "sourceError",
                "id",
                "content",
                "user_id",
                "category"
            ]
        );
        assert_eq!(d.id().map(FactId::as_str), Some("f1"));
        assert_eq!((d.revision(), d.content()), (None, "x"));
    }

    #[test]
    fn typed_setters_refuse_what_json_would_refuse() {
        let d = FactDraft::new("x").unwrap();
        assert_eq!(FactDraft::new(" \n").unwrap_err(), FactError::ContentEmpty);
        assert_eq!(
            d.clone().with_confidence(1.5).unwrap_err(),
            FactError::Confidence
        );
        assert_eq!(
            d.clone().with_confidence(f64::NAN).unwrap_err(),
            FactError::Confidence
        );
        assert_eq!(d.clone().with_revision(0).unwrap_err(), FactError::Revision);
        assert_eq!(
            d.clone().with_content("").unwrap_err(),
            FactError::ContentEmpty
        );
        assert_eq!(
            d.clone().with("topics", json!([1])).unwrap_err(),
            FactError::Topics
        );
        // A key without a typed rule is kept as JSON, last.
        let d = d.with("expected_valid_days", json!(3)).unwrap();
        assert_eq!(
            d.keys().collect::<Vec<_>>(),
            ["content", "expected_valid_days"]
        );
    }
}
