//! Small readings of stored facts shared by the gates, the prompt and the injection: the
//! category a person (and the model) should see, and fresh manager-style fact ids.

use std::fmt;
use std::sync::Arc;

use deermem_core::{Fact, FactId};

/// The category to show and group by: storage keeps a non-core category as `other` plus
/// `categoryExtension`, and this returns the original (`knowledge` rather than `other`, where
/// the reference showed and grouped such facts as `other`). Missing or blank categories read
/// as `context`.
pub fn display_category(fact: &Fact) -> &str {
    let stored = fact.category.as_deref().map(str::trim).unwrap_or("");
    if stored == "other"
        && let Some(ext) = fact.category_extension().map(str::trim)
        && !ext.is_empty()
    {
        return ext;
    }
    if stored.is_empty() { "context" } else { stored }
}

/// A source of fresh fact ids (`fact_` + 8 hex characters by default).
#[derive(Clone)]
pub struct FactIdSource(Arc<dyn Fn() -> FactId + Send + Sync>);

impl fmt::Debug for FactIdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FactIdSource")
    }
}

impl Default for FactIdSource {
    fn default() -> Self {
        Self::random()
    }
}

impl FactIdSource {
    /// `fact_` followed by the first 8 hex characters of a random UUID (the reference's shape).
    pub fn random() -> Self {
        Self(Arc::new(|| {
            // The first 8 hex digits of the UUID's rendering are its top 32 bits.
            FactId::short_from_bits((uuid::Uuid::new_v4().as_u128() >> 96) as u32)
        }))
    }

    /// Ids from a custom generator (deterministic tests, other id schemes).
    pub fn from_fn(f: impl Fn() -> FactId + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// A fresh id.
    pub fn next_id(&self) -> FactId {
        (self.0)()
    }
}
