//! Test helpers shared by the unit tests: facts from JSON, timestamps from text.

use deermem_core::fact::{NormalizeContext, normalize_fact};
use deermem_core::{Fact, FactId, FactScope, Timestamp};
use serde_json::Value;

/// The scope test facts are written to.
pub(crate) fn scope() -> FactScope {
    FactScope {
        user_id: Some("alice".into()),
        agent_name: Some("__default__".into()),
    }
}

/// A timestamp from an ISO literal.
pub(crate) fn ts(s: &str) -> Timestamp {
    Timestamp::parse_iso(s).unwrap()
}

/// A normalised fact from a JSON draft (created "now" = 2026-06-01 unless the draft says).
pub(crate) fn fact(v: Value) -> Fact {
    let s = scope();
    let gen_id = || FactId::new("generated").unwrap();
    let ctx = NormalizeContext {
        scope: &s,
        existing: None,
        now: ts("2026-06-01T00:00:00Z"),
        new_id: &gen_id,
    };
    normalize_fact(&v.try_into().unwrap(), &ctx).unwrap()
}
