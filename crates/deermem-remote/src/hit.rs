//! [`remote_fact`]: a memory found by a remote service's search as the port's `PublicFact`;
//! [`own_ranking_only`]: the search modes a remote service offers.

use deermem_core::fact::PublicFact;
use deermem_core::ports::SearchRequest;
use deermem_core::{InvalidInputCode, ManagerError, SearchMode};

/// What a remote search hit says about a memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteHit {
    /// The service's id of the memory.
    pub id: String,
    /// Its text.
    pub content: String,
    /// Its category.
    pub category: String,
    /// The service's score or confidence.
    pub confidence: f64,
    /// When it was made (empty when unknown).
    pub created_at: String,
    /// Where it came from.
    pub source: String,
}

/// The `PublicFact` of a remote hit; every field a remote service does not keep is empty.
pub fn remote_fact(hit: RemoteHit) -> PublicFact {
    PublicFact {
        id: hit.id,
        content: hit.content,
        category: hit.category,
        category_extension: None,
        topics: None,
        confidence: hit.confidence,
        created_at: hit.created_at,
        source: hit.source,
        source_error: None,
        schema_version: None,
        status: None,
        scope: None,
        revision: None,
        updated_at: None,
        consolidated_at: None,
        consolidated_from: None,
        title: None,
        expected_valid_days: None,
        last_confirmed_at: None,
        confirmation_count: None,
    }
}

/// A remote service ranks on its own server: only its own ranking (`hybrid` or unset) is
/// offered, any other requested mode is an invalid input naming the backend.
///
/// # Errors
/// `InvalidInput` for a mode other than `hybrid`.
pub fn own_ranking_only(request: &SearchRequest, backend: &str) -> Result<(), ManagerError> {
    match request.mode.filter(|m| *m != SearchMode::Hybrid) {
        None => Ok(()),
        Some(mode) => Err(ManagerError::invalid(
            InvalidInputCode::Other,
            format!(
                "search mode {} is not available with the {backend} backend: the remote server ranks results itself (use hybrid or leave mode unset)",
                mode.as_str()
            ),
        )),
    }
}
