//! The stored shape, written and read back one way by the storage's commits, the snapshots of
//! `deermem migrate` and search: a fact is its Markdown front matter (with `user_id` and
//! `agent_name`), then `title` and `content`, as `json` so that key order survives, with its
//! search columns beside it; a user's summaries are one `{"user", "history"}` object.

use deermem_core::fact::{FactDraft, FactScope, NormalizeContext, normalize_fact};
use deermem_core::snapshot::stored_fact;
use deermem_core::{Fact, FactId, SummarySection, Timestamp};
use serde_json::{Map, Value};
use tokio_postgres::GenericClient;

use crate::search;

/// The document version written with a user's record.
pub(crate) const DOCUMENT_VERSION: &str = "2.0";

/// A new fact id.
pub(crate) fn fresh_id() -> FactId {
    FactId::long_from_bits(uuid::Uuid::new_v4().as_u128())
}

/// A stored value that does not read back: which one, and why.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {reason}")]
pub(crate) struct Unreadable {
    /// `fact`, `summaries`, `user`, `history`.
    pub(crate) what: &'static str,
    /// What is wrong with it.
    pub(crate) reason: String,
}

fn unreadable(what: &'static str) -> impl Fn(&dyn std::fmt::Display) -> Unreadable {
    move |e| Unreadable {
        what,
        reason: e.to_string(),
    }
}

/// A stored fact read back: normalised in the scope it records, that scope kept.
pub(crate) fn decode_fact(text: &str, now: Timestamp) -> Result<Fact, Unreadable> {
    let mut draft: Map<String, Value> =
        serde_json::from_str(text).map_err(|e| unreadable("fact")(&e))?;
    let user_id = draft.shift_remove("user_id").unwrap_or(Value::Null);
    let agent_name = draft.shift_remove("agent_name").unwrap_or(Value::Null);
    let scope = FactScope {
        user_id: user_id.as_str().map(str::to_owned),
        agent_name: agent_name.as_str().map(str::to_owned),
    };
    let ctx = NormalizeContext {
        scope: &scope,
        existing: None,
        now,
        new_id: &fresh_id,
    };
    FactDraft::from_json(draft)
        .and_then(|d| normalize_fact(&d, &ctx))
        .map_err(|e| unreadable("fact")(&e))
}

/// A user's stored summaries read back (a missing section is the default one).
pub(crate) fn decode_sections(text: &str) -> Result<(SummarySection, SummarySection), Unreadable> {
    let v: Value = serde_json::from_str(text).map_err(|e| unreadable("summaries")(&e))?;
    let section = |key: &'static str, default: fn() -> SummarySection| match v.get(key) {
        None => Ok(default()),
        Some(Value::Object(m)) => Ok(SummarySection(m.clone())),
        Some(other) => Err(unreadable(key)(&format!("not an object: {other}"))),
    };
    Ok((
        section("user", SummarySection::default_user)?,
        section("history", SummarySection::default_history)?,
    ))
}

/// A user's summaries as stored.
pub(crate) fn encode_sections(user: Map<String, Value>, history: Map<String, Value>) -> String {
    let mut summaries = Map::new();
    summaries.insert("user".into(), Value::Object(user));
    summaries.insert("history".into(), Value::Object(history));
    Value::Object(summaries).to_string()
}

/// Sets a user's record (the row exists and is locked by the caller's transaction).
pub(crate) async fn write_user(
    tx: &impl GenericClient,
    bucket: &str,
    revision: i64,
    summaries: &str,
    last_updated: &str,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute(
        "UPDATE users SET revision = $2, version = $3, summaries = $4::text::json, \
         last_updated = $5 WHERE bucket = $1",
        &[
            &bucket,
            &revision,
            &DOCUMENT_VERSION,
            &summaries,
            &last_updated,
        ],
    )
    .await
}

/// Writes (or replaces) a fact of `(bucket, agent)` at `revision`, its search columns and
/// content digest (what its vector is checked against) computed in the same statement's
/// parameters.
pub(crate) async fn write_fact(
    tx: &impl GenericClient,
    (bucket, agent): (&str, &str),
    fact: &Fact,
    revision: i64,
) -> Result<u64, tokio_postgres::Error> {
    let ix = search::indexed(fact);
    tx.execute(
        "INSERT INTO facts (bucket, agent, id, revision, fact, category, \
         search_text, search_tokens, content_digest) \
         VALUES ($1, $2, $3, $4, $5::text::json, $6, $7, $8, $9) \
         ON CONFLICT (bucket, agent, id) DO UPDATE SET revision = EXCLUDED.revision, \
         fact = EXCLUDED.fact, category = EXCLUDED.category, \
         search_text = EXCLUDED.search_text, search_tokens = EXCLUDED.search_tokens, \
         content_digest = EXCLUDED.content_digest",
        &[
            &bucket,
            &agent,
            &fact.id.as_str(),
            &revision,
            &Value::Object(stored_fact(fact)).to_string(),
            &ix.category,
            &ix.text,
            &ix.tokens,
            &crate::vectors::content_digest(&fact.content),
        ],
    )
    .await
}
