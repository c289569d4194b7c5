//! The storage's byte-level readers exposed for fuzzing and the reliability suite: the fact
//! Markdown parser with its front-matter validation and the manifest reader, exactly as a
//! load runs them, without touching the filesystem.

use std::path::Path;

use deermem_core::{AgentName, Fact, MemoryDocument, StorageError, Timestamp, UserId};

use crate::error::Error;
use crate::{manifest, markdown};

/// Parses and validates the bytes of a fact file stored as `<fact_id>.md` in the scope of
/// `user` and `agent`, as a load does; on success the fact also renders back to Markdown.
///
/// # Errors
/// `Corrupt` for anything a load would refuse (bad UTF-8, missing or invalid front matter, an
/// id that differs from the file name, another owner's scope, invalid fields), and
/// `InvalidInput` when the parsed fact cannot be rendered again.
pub fn parse_fact_file(
    bytes: &[u8],
    fact_id: &str,
    user: Option<&UserId>,
    agent: &AgentName,
    now: Timestamp,
) -> Result<Fact, StorageError> {
    if fact_id.contains(['/', '\\', '\0']) {
        return Err(StorageError::invalid(
            "fact_id",
            "a fact file name must be a plain name",
        ));
    }
    let path = Path::new("probe").join(format!("{fact_id}.md"));
    let parsed = markdown::parse(&path, bytes)?;
    let loaded = markdown::validate(
        &path,
        parsed,
        markdown::Expected {
            user,
            agent: agent.as_str(),
        },
        now,
    )?;
    markdown::render(&loaded.fact)?;
    Ok(loaded.fact)
}

/// Parses the bytes of a user manifest (`memory.json`) into the document a load returns
/// (summaries, revision, no facts).
///
/// # Errors
/// `Corrupt` for invalid UTF-8 or JSON, a non-object, a bad revision or bad summaries.
pub fn parse_manifest(bytes: &[u8], now: Timestamp) -> Result<MemoryDocument, StorageError> {
    let path = Path::new("probe/memory.json");
    let m = manifest::parse_manifest(path, bytes)?;
    manifest::document(Some(&m), Vec::new(), now).map_err(|e: Error| e.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope() -> (UserId, AgentName) {
        (
            UserId::new("alice").unwrap(),
            AgentName::parse("agent-a").unwrap(),
        )
    }

    #[test]
    fn a_rendered_fact_parses_back_and_garbage_is_corrupt() {
        let (u, a) = scope();
        let now = Timestamp::from_unix_seconds(1_800_000_000);
        let text = "---\nid: f1\ncategory: context\nconfidence: 0.5\nstatus: active\nrevision: 2\n\
                    createdAt: '2026-01-01T00:00:00Z'\nupdatedAt: '2026-01-01T00:00:00Z'\n\
                    user_id: alice\nagent_name: agent-a\n---\n\nLikes tea.\n";
        let fact = parse_fact_file(text.as_bytes(), "f1", Some(&u), &a, now).unwrap();
        assert_eq!(fact.content, "Likes tea.");
        assert_eq!(fact.revision, 2);
        let again = crate::render_fact_markdown(&fact).unwrap();
        let back = parse_fact_file(again.as_bytes(), "f1", Some(&u), &a, now).unwrap();
        assert_eq!(back, fact);
        // Another owner's file, a mismatched id, a path-like id and garbage are refused.
        let bob = UserId::new("bob").unwrap();
        for (bytes, id, user) in [
            (text.as_bytes(), "f1", Some(&bob)),
            (text.as_bytes(), "f2", Some(&u)),
            (text.as_bytes(), "../f1", Some(&u)),
            (&b"\xff\xfe---\n"[..], "f1", Some(&u)),
            (&b"---\n[1, 2\n---\nx"[..], "f1", Some(&u)),
        ] {
            assert!(
                parse_fact_file(bytes, id, user, &a, now).is_err(),
                "{id} {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn manifests_parse_or_fail_typed() {
        let now = Timestamp::from_unix_seconds(1_800_000_000);
        let doc = parse_manifest(
            json!({"version": "2.0", "revision": 7, "lastUpdated": "x"})
                .to_string()
                .as_bytes(),
            now,
        )
        .unwrap();
        assert_eq!(doc.revision, 7);
        for bad in [&b"[]"[..], b"{\"revision\": -1}", b"\xef\xbb\xbf{}", b"{"] {
            assert!(matches!(
                parse_manifest(bad, now),
                Err(StorageError::Corrupt { .. })
            ));
        }
    }
}
