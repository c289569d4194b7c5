//! Scope derivation as the reference does it: the single-owner rule, the actor peer of an
//! agent, the stable session id of a thread, and the two target URIs of every read (in the
//! current-user spelling `viking://~/…` the server accepts, not the reference's
//! `viking://user/memories`, which current servers refuse).

use deermem_core::ids::DEFAULT_AGENT_BUCKET;
use deermem_core::{DEFAULT_USER_ID, InvalidInputCode, ManagerError, UserId};
use sha2::{Digest, Sha256};

use crate::config::{RESERVED_PEER_PREFIX, is_safe_peer};

/// The namespace mixed into every session id.
pub const SESSION_NAMESPACE: &str = "deerflow-openviking-adapter-v1";

/// The user's own memories: `~` is the server's alias for the user the key belongs to. (The
/// reference's `viking://user/memories` names a user literally called `memories`: a USER key is
/// refused with `INVALID_URI`, and a development server searches an empty space.)
pub const USER_MEMORIES_URI: &str = "viking://~/memories";

/// The DeerFlow user a call acts for: the raw user id, or `default` when none is given.
pub fn resolved_user(user: Option<&UserId>) -> &str {
    user.map_or(DEFAULT_USER_ID, UserId::as_str)
}

/// Refuses a call that belongs to anyone but the owner the USER API key is bound to.
///
/// # Errors
/// [`ManagerError::InvalidInput`] with [`InvalidInputCode::UserId`].
pub fn check_owner(owner_user_id: &str, user: Option<&UserId>) -> Result<(), ManagerError> {
    let resolved = resolved_user(user);
    if resolved == owner_user_id {
        return Ok(());
    }
    Err(ManagerError::invalid(
        InvalidInputCode::UserId,
        format!(
            "OpenViking USER API key is bound to DeerFlow owner_user_id {}, but this request belongs to {}. Refusing to share one credential across users.",
            py_repr(owner_user_id),
            py_repr(resolved)
        ),
    ))
}

/// The actor peer of an agent: the default peer for `None`, the lowercased name when it is a
/// safe id that is neither the default peer nor in the reserved namespace, and otherwise
/// `df-agent-` plus the first 32 hex characters of its SHA-256.
///
/// # Errors
/// An empty (after stripping) or `__default__` name.
pub fn canonical_peer_id(
    agent_name: Option<&str>,
    default_peer_id: &str,
) -> Result<String, ManagerError> {
    let Some(name) = agent_name else {
        return Ok(default_peer_id.to_owned());
    };
    let v = deermem_pycompat::py::lower(deermem_pycompat::py::strip(name));
    if v.is_empty() || v == DEFAULT_AGENT_BUCKET {
        return Err(ManagerError::invalid(
            InvalidInputCode::AgentName,
            format!("Invalid OpenViking peer scope: {}", py_repr(name)),
        ));
    }
    if is_safe_peer(&v) && v != default_peer_id && !v.starts_with(RESERVED_PEER_PREFIX) {
        return Ok(v);
    }
    let digest = hex::encode(Sha256::digest(v.as_bytes()));
    Ok(format!("{RESERVED_PEER_PREFIX}{}", &digest[..32]))
}

/// The OpenViking session of one DeerFlow thread: `df_` plus 48 hex characters.
pub fn session_id(owner_user_id: &str, peer: &str, thread_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(SESSION_NAMESPACE.as_bytes());
    h.update([0]);
    h.update(owner_user_id.as_bytes());
    h.update([0]);
    h.update(peer.as_bytes());
    h.update([0]);
    h.update(thread_id.as_bytes());
    let digest = hex::encode(h.finalize());
    format!("df_{}", &digest[..48])
}

/// The memory trees every read searches: the user's and the actor peer's, both in the current
/// user's space.
pub fn target_uris(peer: &str) -> [String; 2] {
    [
        USER_MEMORIES_URI.to_owned(),
        format!("viking://~/peers/{peer}/memories"),
    ]
}

/// A short, quoted rendering of a value for messages (long values are cut).
fn py_repr(s: &str) -> String {
    const MAX: usize = 120;
    let cut: String = s.chars().take(MAX).collect();
    let quoted = format!("'{}'", cut.escape_debug());
    if s.chars().count() > MAX {
        format!("{quoted}…")
    } else {
        quoted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_vectors_match_the_reference() {
        let d = "deerflow";
        assert_eq!(canonical_peer_id(None, d).unwrap(), "deerflow");
        assert_eq!(canonical_peer_id(Some("Research"), d).unwrap(), "research");
        assert_eq!(
            canonical_peer_id(Some(" Research\n"), d).unwrap(),
            "research"
        );
        let cases = [
            ("deerflow", "df-agent-ea44dcc4367369f986dee4986c0d1a3c"),
            ("DeerFlow", "df-agent-ea44dcc4367369f986dee4986c0d1a3c"),
            ("-research", "df-agent-bae6b8f0e1ba865a2ce9fc8c18ff9081"),
            (
                "df-agent-custom",
                "df-agent-e263580004e16e6de841e8d2dc70b2d7",
            ),
            ("my agent", "df-agent-8cae0b6284ac92403eee714c869f124a"),
        ];
        for (name, want) in cases {
            assert_eq!(canonical_peer_id(Some(name), d).unwrap(), want, "{name}");
        }
        let long = "a".repeat(65);
        assert_eq!(
            canonical_peer_id(Some(&long), d).unwrap(),
            "df-agent-635361c48bb9eab14198e76ea8ab7f1a"
        );
        assert_eq!(
            canonical_peer_id(Some(&"a".repeat(64)), d).unwrap(),
            "a".repeat(64)
        );
    }

    #[test]
    fn peer_namespaces_are_disjoint() {
        let d = "deerflow";
        let ids: Vec<String> = [
            None,
            Some("research"),
            Some("deerflow"),
            Some("-x"),
            Some("df-agent-x"),
        ]
        .into_iter()
        .map(|a| canonical_peer_id(a, d).unwrap())
        .collect();
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "{ids:?}");
    }

    #[test]
    fn invalid_peer_scopes_are_rejected() {
        for bad in ["", "   ", "__default__", "__DEFAULT__"] {
            let e = canonical_peer_id(Some(bad), "deerflow").unwrap_err();
            assert!(
                matches!(
                    e,
                    ManagerError::InvalidInput {
                        code: InvalidInputCode::AgentName,
                        ..
                    }
                ),
                "{bad:?}: {e}"
            );
            assert!(e.to_string().contains("Invalid OpenViking peer scope"));
        }
    }

    #[test]
    fn hostile_agent_names_hash_to_safe_peers() {
        for hostile in ["../etc", "a\0b", "x/y\\z"] {
            let p = canonical_peer_id(Some(hostile), "deerflow").unwrap();
            assert!(p.starts_with("df-agent-") && p.len() == 41, "{p}");
            assert!(is_safe_peer(&p));
        }
        let huge = "x".repeat(10 * 1024 * 1024);
        let p = canonical_peer_id(Some(&huge), "deerflow").unwrap();
        assert_eq!(p.len(), 41);
    }

    #[test]
    fn session_vectors_match_the_reference() {
        assert_eq!(
            session_id("alice", "research", "thread-1"),
            "df_37a681a43a6b7c1cea6b092d50b00150bb780f0c09bec010"
        );
        assert_eq!(
            session_id("default", "deerflow", "thread-1"),
            "df_1d19d462a04e2873521cb087a47161fb2a19888176ef828a"
        );
        assert_ne!(session_id("a", "b", "c"), session_id("a", "b", "d"));
    }

    #[test]
    fn target_uris_cover_user_and_peer() {
        assert_eq!(
            target_uris("research"),
            [
                "viking://~/memories".to_owned(),
                "viking://~/peers/research/memories".to_owned()
            ]
        );
    }

    #[test]
    fn owner_rule_uses_default_for_missing_user() {
        assert!(check_owner("default", None).is_ok());
        assert!(check_owner("alice", Some(&UserId::new("alice").unwrap())).is_ok());
        let e = check_owner("alice", Some(&UserId::new("bob").unwrap())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "OpenViking USER API key is bound to DeerFlow owner_user_id 'alice', but this request belongs to 'bob'. Refusing to share one credential across users."
        );
        assert!(check_owner("alice", None).is_err());
    }
}
