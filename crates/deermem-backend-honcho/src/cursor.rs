//! The per-thread capture cursor: which captured messages Honcho already accepted, kept as
//! hashes only (never message text), bounded, and stored durably with atomic writes in the
//! cursor store (files under `{storage_root}/honcho/cursors/`, or the PostgreSQL database when
//! the storage is postgres), so each turn sends only new messages and a restart does not replay
//! a thread.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use deermem_core::ports::CursorStorage;
use deermem_remote::files::CursorFiles;
pub(crate) use deermem_remote::files::seq_digest;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How many recent message signatures a cursor remembers (for rewritten transcripts).
pub(crate) const MAX_RECENT: usize = 1024;
/// The cursor format version.
const SCHEMA_VERSION: u32 = 1;
/// A cursor file larger than this is not a cursor.
const MAX_CURSOR_BYTES: u64 = 1024 * 1024;
/// The cursor store's space (the folder under the storage root).
const SPACE: &str = "honcho/cursors";

/// The saved progress of one Honcho session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CursorState {
    /// Format version (1).
    pub(crate) schema_version: u32,
    /// The workspace the session lives in.
    pub(crate) workspace: String,
    /// The Honcho session id.
    pub(crate) session: String,
    /// The peers added to the session once it was set up (`None`: not set up yet).
    pub(crate) session_peers: Option<Vec<String>>,
    /// How many leading captured messages of the transcript are known to be accepted.
    pub(crate) prefix_count: usize,
    /// [`seq_digest`] of those leading signatures.
    pub(crate) prefix_digest: String,
    /// The most recent accepted signatures, oldest first, at most [`MAX_RECENT`].
    pub(crate) recent: Vec<String>,
}

impl CursorState {
    /// The state of a session nothing was sent to.
    pub(crate) fn fresh(workspace: &str, session: &str) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            workspace: workspace.to_owned(),
            session: session.to_owned(),
            session_peers: None,
            prefix_count: 0,
            prefix_digest: seq_digest::<&str>(&[]),
            recent: Vec::new(),
        }
    }

    /// Records accepted signatures and, when known, the new accepted prefix.
    pub(crate) fn accept(&mut self, accepted: &[String], prefix: Option<&[String]>) {
        self.recent.extend(accepted.iter().cloned());
        if self.recent.len() > MAX_RECENT {
            let excess = self.recent.len() - MAX_RECENT;
            self.recent.drain(..excess);
        }
        if let Some(p) = prefix {
            self.prefix_count = p.len();
            self.prefix_digest = seq_digest(p);
        }
    }

    fn check(&self, workspace: &str, session: &str) -> Result<(), CursorDefect> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(CursorDefect::SchemaVersion(self.schema_version));
        }
        if self.workspace != workspace || self.session != session {
            return Err(CursorDefect::OtherSession);
        }
        let hex_ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex_ok(&self.prefix_digest, 64) {
            return Err(CursorDefect::PrefixDigest);
        }
        if self.recent.len() > MAX_RECENT || !self.recent.iter().all(|s| hex_ok(s, 32)) {
            return Err(CursorDefect::Recent);
        }
        Ok(())
    }
}

/// Which captured messages still need sending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `Some(start)` when the transcript extends the accepted prefix (append-only); `None`
    /// when it was rewritten and pending messages were found by signature.
    pub(crate) start: Option<usize>,
    /// Indices of the messages to send, in order.
    pub(crate) pending: Vec<usize>,
}

/// Decides what to send for a transcript with these signatures.
pub(crate) fn plan(state: &CursorState, sigs: &[String]) -> Plan {
    let count = state.prefix_count;
    if count <= sigs.len() && seq_digest(&sigs[..count]) == state.prefix_digest {
        return Plan {
            start: Some(count),
            pending: (count..sigs.len()).collect(),
        };
    }
    let seen: HashSet<&str> = state.recent.iter().map(String::as_str).collect();
    Plan {
        start: None,
        pending: sigs
            .iter()
            .enumerate()
            .filter(|(_, s)| !seen.contains(s.as_str()))
            .map(|(i, _)| i)
            .collect(),
    }
}

/// What makes a readable cursor file unusable for its session.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CursorDefect {
    #[error("unknown schema_version {0}")]
    SchemaVersion(u32),
    #[error("the cursor belongs to another workspace or session")]
    OtherSession,
    #[error("prefix_digest is not a SHA-256 hex digest")]
    PrefixDigest,
    #[error("recent holds something other than message signatures")]
    Recent,
}

/// A cursor that cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CursorError {
    /// The stored cursor is not a valid cursor for this session.
    #[error(
        "Honcho capture cursor {location} is invalid ({reason}); refusing to replay the thread, repair or remove it"
    )]
    Corrupt { location: String, reason: String },
    /// Reading or writing failed.
    #[error("Honcho capture cursor {location}: {error}")]
    Io {
        location: String,
        error: std::io::Error,
    },
}

/// The cursors, one per (workspace, session), named by a hash so that no id ever becomes a
/// path or key.
#[derive(Clone, Debug)]
pub(crate) struct CursorStore {
    storage: Arc<dyn CursorStorage>,
}

impl CursorStore {
    /// Cursor files under `{storage_root}/honcho/cursors`.
    pub(crate) fn new(storage_root: &Path) -> Self {
        Self::on(Arc::new(CursorFiles::new(storage_root.to_path_buf())))
    }

    /// Cursors in `storage`.
    pub(crate) fn on(storage: Arc<dyn CursorStorage>) -> Self {
        Self { storage }
    }

    fn name_for(workspace: &str, session: &str) -> String {
        let mut h = Sha256::new();
        h.update(workspace.as_bytes());
        h.update([0u8]);
        h.update(session.as_bytes());
        format!("{}.json", hex::encode(h.finalize()))
    }

    /// Loads a session's cursor; a fresh state when there is none.
    pub(crate) async fn load(
        &self,
        workspace: &str,
        session: &str,
    ) -> Result<CursorState, CursorError> {
        let name = Self::name_for(workspace, session);
        let location = || self.storage.location(SPACE, &name);
        let corrupt = |reason: String| CursorError::Corrupt {
            location: location(),
            reason,
        };
        let bytes = match self.storage.read(SPACE, &name, MAX_CURSOR_BYTES).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(CursorState::fresh(workspace, session)),
            Err(deermem_remote::files::ReadError::Io(error)) => {
                return Err(CursorError::Io {
                    location: location(),
                    error,
                });
            }
            Err(e) => return Err(corrupt(e.to_string())),
        };
        let state: CursorState =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        state
            .check(workspace, session)
            .map_err(|defect| corrupt(defect.to_string()))?;
        Ok(state)
    }

    /// Writes a cursor atomically and durably.
    pub(crate) async fn save(&self, state: &CursorState) -> Result<(), CursorError> {
        let name = Self::name_for(&state.workspace, &state.session);
        let io = |error| CursorError::Io {
            location: self.storage.location(SPACE, &name),
            error,
        };
        let bytes = serde_json::to_vec_pretty(state)
            .map_err(|e| io(std::io::Error::other(e.to_string())))?;
        self.storage.write(SPACE, &name, bytes).await.map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn sigs(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{i:032x}")).collect()
    }

    #[test]
    fn digest_vectors() {
        assert_eq!(
            seq_digest::<&str>(&[]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_ne!(seq_digest(&["ab", "c"]), seq_digest(&["a", "bc"]));
    }

    #[test]
    fn append_only_plans_send_the_suffix() {
        let s = sigs(5);
        let mut st = CursorState::fresh("w", "s");
        assert_eq!(
            plan(&st, &s),
            Plan {
                start: Some(0),
                pending: vec![0, 1, 2, 3, 4]
            }
        );
        st.accept(&s[..3], Some(&s[..3]));
        assert_eq!(
            plan(&st, &s),
            Plan {
                start: Some(3),
                pending: vec![3, 4]
            }
        );
        st.accept(&s[3..], Some(&s));
        assert!(plan(&st, &s).pending.is_empty());
    }

    #[test]
    fn rewritten_transcripts_send_only_unseen_messages() {
        let s = sigs(6);
        let mut st = CursorState::fresh("w", "s");
        st.accept(&s[..4], Some(&s[..4]));
        // Compaction dropped the first three messages and two new ones arrived.
        let rewritten = vec![s[3].clone(), s[4].clone(), s[5].clone()];
        assert_eq!(
            plan(&st, &rewritten),
            Plan {
                start: None,
                pending: vec![1, 2]
            }
        );
    }

    #[test]
    fn recent_is_bounded() {
        let mut st = CursorState::fresh("w", "s");
        let s = sigs(MAX_RECENT + 10);
        st.accept(&s, Some(&s));
        assert_eq!(st.recent.len(), MAX_RECENT);
        assert_eq!(st.recent[0], s[10]);
        assert_eq!(st.prefix_count, MAX_RECENT + 10);
    }

    #[tokio::test]
    async fn save_load_round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let store = CursorStore::new(dir.path());
        let path_for = |w: &str, s: &str| {
            dir.path()
                .join("honcho")
                .join("cursors")
                .join(CursorStore::name_for(w, s))
        };
        assert_eq!(
            store.load("w", "s").await.unwrap(),
            CursorState::fresh("w", "s")
        );
        let mut st = CursorState::fresh("w", "s");
        st.session_peers = Some(vec!["u".into(), "a".into()]);
        st.accept(&sigs(2), Some(&sigs(2)));
        store.save(&st).await.unwrap();
        assert_eq!(store.load("w", "s").await.unwrap(), st);
        // Hostile ids never become paths: the name is a hash.
        let name = CursorStore::name_for("../../etc", "x/../../y");
        assert!(name.ends_with(".json") && !name.contains('/') && !name.contains(".."));
        // Leftover temporaries are not left behind.
        let names: Vec<_> = fs::read_dir(dir.path().join("honcho/cursors"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);

        for bad in [&b"not json"[..], b"[]", br#"{"schema_version": 9}"#] {
            fs::write(path_for("w", "s"), bad).unwrap();
            assert!(matches!(
                store.load("w", "s").await,
                Err(CursorError::Corrupt { .. })
            ));
        }
        // A cursor copied from another session is refused.
        store.save(&CursorState::fresh("w", "other")).await.unwrap();
        fs::copy(path_for("w", "other"), path_for("w", "s")).unwrap();
        assert!(matches!(
            store.load("w", "s").await,
            Err(CursorError::Corrupt { .. })
        ));
    }
}
