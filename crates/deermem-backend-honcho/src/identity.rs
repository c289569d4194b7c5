//! Identity derivation, byte for byte the reference's: the collision-resistant sanitised ids,
//! and the workspace, user peer, assistant peer and session a call maps to.

use sha2::{Digest, Sha256};

use crate::config::HonchoConfig;

/// Honcho's longest id.
const MAX_HONCHO_ID_CHARS: usize = 512;

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Whether Honcho accepts `id` as a peer, session or workspace id (`^[a-zA-Z0-9_-]+$`, 1–512).
pub fn is_honcho_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_HONCHO_ID_CHARS && id.chars().all(allowed)
}

/// The reference's `sanitize_id`: every run of characters outside `[A-Za-z0-9_-]` becomes one
/// `-` (a literal `-` next to a run is kept), leading and trailing `-` are stripped, and the
/// result is cut to 64 characters.
pub fn sanitize_id(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len().min(256));
    let mut in_run = false;
    for c in raw.chars() {
        if allowed(c) {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    let trimmed = out.trim_matches('-');
    // Only ASCII remains, so byte and character counts agree.
    trimmed[..trimmed.len().min(64)].to_owned()
}

/// The reference's `_stable_id`: the sanitised id cut to 48 characters (trailing `-`
/// removed), then `-` and the first 8 hex digits of the SHA-256 of the raw id; just the digest
/// when nothing survives sanitising.
pub fn stable_id(raw: &str) -> String {
    let s = sanitize_id(raw);
    let head = s[..s.len().min(48)].trim_end_matches('-');
    let digest = hex::encode(Sha256::digest(raw.as_bytes()));
    let short = &digest[..8];
    if head.is_empty() {
        short.to_owned()
    } else {
        format!("{head}-{short}")
    }
}

/// The Honcho session id of a host thread: `df-` + the stable id (an empty thread id is
/// allowed, as in the reference).
pub fn session_id(thread_id: &str) -> String {
    format!("df-{}", stable_id(thread_id))
}

/// Who a call talks to in Honcho.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The user's workspace.
    pub workspace: String,
    /// The user's peer.
    pub user_peer: String,
    /// The assistant's peer.
    pub assistant_peer: String,
}

impl Identity {
    /// Resolves the identity of a raw user id; `None` for a missing or empty user (no memory,
    /// no request).
    pub fn resolve(config: &HonchoConfig, user: Option<&str>) -> Option<Self> {
        let raw = user.filter(|u| !u.is_empty())?;
        let workspace = config
            .workspace_overrides
            .get(raw)
            .cloned()
            .unwrap_or_else(|| format!("{}{}", config.workspace_prefix, stable_id(raw)));
        let user_peer = config
            .user_peer_overrides
            .get(raw)
            .cloned()
            .unwrap_or_else(|| stable_id(raw));
        Some(Self {
            workspace,
            user_peer,
            assistant_peer: config.assistant_peer.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vectors() {
        let x100 = "x".repeat(100);
        let x48 = format!("{}-09ecb6eb", "x".repeat(48));
        let cases: [(&str, &str, &str); 11] = [
            ("alice", "alice", "alice-2bd806c9"),
            (
                "bob@example.com",
                "bob-example-com",
                "bob-example-com-5ff860bf",
            ),
            (
                "user.name@example.com",
                "user-name-example-com",
                "user-name-example-com-ff11779f",
            ),
            (
                "user-name@example.com",
                "user-name-example-com",
                "user-name-example-com-4ae064cc",
            ),
            ("!!!", "", "e84c538e"),
            ("", "", "e3b0c442"),
            ("t-1", "t-1", "t-1-46e9bc34"),
            ("t.1", "t-1", "t-1-61a4dd05"),
            ("thread-1", "thread-1", "thread-1-4b0a5fef"),
            (&x100, &x100[..64], &x48),
            ("日本語ユーザー", "", "44b7bee1"),
        ];
        for (raw, sanitized, stable) in cases {
            assert_eq!(sanitize_id(raw), sanitized, "sanitize_id({raw:?})");
            assert_eq!(stable_id(raw), stable, "stable_id({raw:?})");
        }
        assert_eq!(session_id("thread.1"), "df-thread-1-6b74530e");
        assert_eq!(session_id(""), "df-e3b0c442");
        assert_ne!(session_id("t.1"), session_id("t-1"));
    }

    #[test]
    fn sanitize_keeps_literal_dashes_next_to_runs() {
        assert_eq!(sanitize_id("a.-b"), "a--b");
        assert_eq!(sanitize_id("user_1-ok"), "user_1-ok");
        assert_eq!(sanitize_id("weird id@example.com"), "weird-id-example-com");
        assert_eq!(sanitize_id(&"y".repeat(200)).len(), 64);
        assert_eq!(sanitize_id("--a..b--"), "a-b");
    }

    #[test]
    fn identity_derivation_and_overrides() {
        let mut c = HonchoConfig::default();
        let id = Identity::resolve(&c, Some("bob@example.com")).unwrap();
        assert_eq!(id.workspace, "deerflow-u-bob-example-com-5ff860bf");
        assert_eq!(id.user_peer, "bob-example-com-5ff860bf");
        assert_eq!(id.assistant_peer, "deerflow");
        assert!(Identity::resolve(&c, None).is_none());
        assert!(Identity::resolve(&c, Some("")).is_none());

        c.workspace_overrides
            .insert("bob@example.com".into(), "team".into());
        c.user_peer_overrides
            .insert("bob@example.com".into(), "bobby".into());
        let id = Identity::resolve(&c, Some("bob@example.com")).unwrap();
        assert_eq!(
            (id.workspace.as_str(), id.user_peer.as_str()),
            ("team", "bobby")
        );
        // Override lookups use the raw key exactly.
        let other = Identity::resolve(&c, Some("Bob@example.com")).unwrap();
        assert_ne!(other.workspace, "team");
    }

    #[test]
    fn degenerate_and_colliding_ids_stay_distinct() {
        let c = HonchoConfig::default();
        let a = Identity::resolve(&c, Some("user.name@example.com")).unwrap();
        let b = Identity::resolve(&c, Some("user-name@example.com")).unwrap();
        assert_ne!(a.workspace, b.workspace);
        assert_ne!(a.user_peer, b.user_peer);
        let bang = Identity::resolve(&c, Some("!!!")).unwrap();
        assert!(!bang.user_peer.is_empty());
        assert_ne!(bang.workspace, c.workspace_prefix);
        assert!(is_honcho_id(&bang.user_peer) && is_honcho_id(&bang.workspace));
    }

    #[test]
    fn honcho_id_pattern() {
        assert!(is_honcho_id("a-b_C9"));
        assert!(!is_honcho_id(""));
        assert!(!is_honcho_id("a b"));
        assert!(!is_honcho_id("a/b"));
        assert!(!is_honcho_id(&"a".repeat(513)));
    }
}
