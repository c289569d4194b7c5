//! The hash-only capture cursor, which never holds message text: its JSON file under
//! `{root}/openviking/sessions/{session}.json`, the prefix digest, the append-only and rebase
//! matching, and atomic saves (through `deermem_remote::files`).
//!
//! A cursor never holds message text: only SHA-256 hashes of messages, at most
//! `max_seen_message_ids` of them, a count and a digest of the submitted prefix, and whether a
//! commit is still owed.
//!
//! Two keys of our own follow the reference's five, written only when they say something: a
//! batch whose request timed out or broke after it was sent (`in_doubt_batch`: its hashes, its
//! size and the session's uncommitted message count before it), so that the next capture asks
//! the server whether it arrived instead of sending it again; and the session's uncommitted
//! message count when it is not zero (`uncommitted_on_server`; `null` when unknown). The
//! reference reads such a cursor and ignores both.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use deermem_core::ports::CursorStorage;
use deermem_remote::files::{CursorFiles, ReadError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The cursor schema version.
pub const CURSOR_SCHEMA_VERSION: u64 = 1;

/// Largest cursor file we read (a full cursor of 10000 hashes is under 1 MB).
const MAX_CURSOR_BYTES: u64 = 16 * 1024 * 1024;

/// One session's capture progress.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CursorState {
    /// Whether the state is `{}` (no file yet).
    pub empty: bool,
    /// Hashes of the submitted messages, oldest first, at most `max_seen_message_ids`.
    pub submitted_signatures: Vec<String>,
    /// A commit failed and must be retried before new messages are sent.
    pub commit_pending: bool,
    /// How many leading messages of the transcript were submitted.
    pub submitted_prefix_count: Option<u64>,
    /// [`seq_digest`] of those leading hashes.
    pub submitted_prefix_digest: Option<String>,
    /// A batch the server may or may not have stored.
    pub in_doubt: Option<InDoubtBatch>,
    /// Messages the session holds that no commit has covered yet (`None`: unknown). A missing
    /// key means 0: every capture ends with a commit unless it failed part-way.
    pub uncommitted_on_server: Option<u64>,
}

/// A batch whose request timed out or broke after it was sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InDoubtBatch {
    /// Hashes of the input messages the batch carried (with any unrecorded ones between them).
    pub signatures: Vec<String>,
    /// How many payloads the batch held.
    pub payload_count: u64,
    /// The session's uncommitted message count just before the batch, when known.
    pub uncommitted_before: Option<u64>,
}

impl CursorState {
    /// The state of a session nothing was captured for.
    pub fn new_empty() -> Self {
        Self {
            empty: true,
            uncommitted_on_server: Some(0),
            ..Self::default()
        }
    }

    /// Reads a cursor from its JSON value.
    ///
    /// # Errors
    /// A value that is not a JSON object.
    pub fn from_json(v: &Value) -> Result<Self, &'static str> {
        let Value::Object(o) = v else {
            return Err("not a JSON object");
        };
        Ok(Self {
            empty: o.is_empty(),
            submitted_signatures: match o.get("submitted_signatures") {
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            },
            commit_pending: o
                .get("commit_pending")
                .is_some_and(deermem_pycompat::py::truthy),
            submitted_prefix_count: o.get("submitted_prefix_count").and_then(Value::as_u64),
            submitted_prefix_digest: o
                .get("submitted_prefix_digest")
                .and_then(Value::as_str)
                .map(str::to_owned),
            // A malformed record is dropped: the batch is then sent again, as the reference
            // would (a possible duplicate, never a loss).
            in_doubt: o
                .get("in_doubt_batch")
                .and_then(|v| serde_json::from_value(v.clone()).ok()),
            uncommitted_on_server: match o.get("uncommitted_on_server") {
                None => Some(0),
                Some(v) => v.as_u64(),
            },
        })
    }

    /// The JSON the file holds, keys in the reference's order.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "schema_version": CURSOR_SCHEMA_VERSION,
            "submitted_signatures": self.submitted_signatures,
            "commit_pending": self.commit_pending,
            "submitted_prefix_count": self.submitted_prefix_count,
            "submitted_prefix_digest": self.submitted_prefix_digest,
        });
        if let Some(d) = &self.in_doubt {
            v["in_doubt_batch"] = json!(d);
        }
        if self.uncommitted_on_server != Some(0) {
            v["uncommitted_on_server"] = json!(self.uncommitted_on_server);
        }
        v
    }

    /// The file text: two-space indented JSON, as the reference writes it.
    pub fn to_file_text(&self) -> String {
        serde_json::to_string_pretty(&self.to_json()).unwrap_or_else(|_| "{}".to_owned())
    }

    /// How many leading transcript messages were already submitted, or `None` when the
    /// transcript no longer extends what was submitted (compaction or rewrite).
    pub fn matching_prefix_count(&self, signatures: &[String]) -> Option<usize> {
        if let (Some(c), Some(digest)) = (
            self.submitted_prefix_count,
            self.submitted_prefix_digest.as_deref(),
        ) && let Ok(c) = usize::try_from(c)
            && c <= signatures.len()
        {
            return (seq_digest(&signatures[..c]) == digest).then_some(c);
        }
        let subs = &self.submitted_signatures;
        if !subs.is_empty() && subs.len() <= signatures.len() {
            let width = subs.len();
            for s in (0..=signatures.len() - width).rev() {
                if signatures[s..s + width] == subs[..] {
                    return Some(s + width);
                }
            }
        }
        self.empty.then_some(0)
    }

    /// The next state: `new` hashes appended (keeping the last `max_seen`), the prefix replaced
    /// when given (kept otherwise), and the commit flag set.
    pub fn advanced(
        &self,
        prefix: Option<&[String]>,
        new: &[String],
        max_seen: usize,
        commit_pending: bool,
    ) -> Self {
        let mut sigs: Vec<String> = self
            .submitted_signatures
            .iter()
            .chain(new.iter())
            .cloned()
            .collect();
        if sigs.len() > max_seen {
            sigs.drain(..sigs.len() - max_seen);
        }
        let (count, digest) = match prefix {
            Some(p) => (Some(p.len() as u64), Some(seq_digest(p))),
            None => (
                self.submitted_prefix_count,
                self.submitted_prefix_digest.clone(),
            ),
        };
        Self {
            empty: false,
            submitted_signatures: sigs,
            commit_pending,
            submitted_prefix_count: count,
            submitted_prefix_digest: digest,
            in_doubt: None,
            uncommitted_on_server: self.uncommitted_on_server,
        }
    }
}

impl CursorState {
    /// The state once an in-doubt batch turned out to be on the server: its hashes count as
    /// submitted, and when the transcript still extends the submitted prefix right through the
    /// batch, the prefix grows over it. The in-doubt record is cleared.
    pub fn with_landed(
        &self,
        batch: &InDoubtBatch,
        signatures: &[String],
        max_seen: usize,
    ) -> Self {
        let prefix = self.matching_prefix_count(signatures).and_then(|c| {
            let end = c.checked_add(batch.signatures.len())?;
            (end <= signatures.len() && signatures[c..end] == batch.signatures[..])
                .then(|| &signatures[..end])
        });
        self.advanced(prefix, &batch.signatures, max_seen, self.commit_pending)
    }
}

/// SHA-256 over each hash's 8-byte big-endian UTF-8 length followed by its bytes, as hex.
pub fn seq_digest(signatures: &[String]) -> String {
    deermem_remote::files::seq_digest(signatures)
}

/// Why a cursor could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum CursorError {
    /// The file exists but cannot be read.
    #[error(
        "OpenViking capture cursor is unreadable; refusing unsafe replay (session={session}): {detail}"
    )]
    Unreadable {
        /// The session id.
        session: String,
        /// The OS error.
        detail: String,
    },
    /// The file is not a JSON object.
    #[error(
        "OpenViking capture cursor is invalid; refusing unsafe replay (session={session}): {detail}"
    )]
    Invalid {
        /// The session id.
        session: String,
        /// What is wrong.
        detail: String,
    },
    /// The cursor could not be written.
    #[error("Failed to save OpenViking capture cursor (session={session}): {source}")]
    Save {
        /// The session id.
        session: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The cursor store's space (the folder under the storage root).
const SPACE: &str = "openviking/sessions";

/// The cursors of one storage root: files under `{root}/openviking/sessions/`, or another
/// [`CursorStorage`] (the PostgreSQL database when the storage is postgres) under the same
/// names.
#[derive(Debug, Clone)]
pub struct CursorStore {
    storage: Arc<dyn CursorStorage>,
    dir: PathBuf,
}

impl CursorStore {
    /// The store under `{root}/openviking/sessions/`.
    pub fn new(root: &Path) -> Self {
        Self::on(root, Arc::new(CursorFiles::new(root.to_path_buf())))
    }

    /// The store in `storage`; `root` is the storage root the cursor files would live under.
    pub fn on(root: &Path, storage: Arc<dyn CursorStorage>) -> Self {
        Self {
            storage,
            dir: CursorFiles::new(root.to_path_buf()).dir(SPACE),
        }
    }

    /// The directory holding the cursor files (when the cursors are files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of a session (when the cursors are files). Session ids are `df_` plus hex,
    /// so they are always one safe path component.
    pub fn path(&self, session_id: &str) -> PathBuf {
        self.dir.join(format!("{session_id}.json"))
    }

    /// Loads a session's cursor; a missing file is the empty state.
    ///
    /// # Errors
    /// [`CursorError::Unreadable`] or [`CursorError::Invalid`]: the caller must not send
    /// anything (replaying history would duplicate it).
    pub async fn load(&self, session_id: &str) -> Result<CursorState, CursorError> {
        let invalid = |detail: String| CursorError::Invalid {
            session: session_id.to_owned(),
            detail,
        };
        let bytes = match self
            .storage
            .read(SPACE, &format!("{session_id}.json"), MAX_CURSOR_BYTES)
            .await
        {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(CursorState::new_empty()),
            Err(e @ (ReadError::Io(_) | ReadError::NotAFile)) => {
                return Err(CursorError::Unreadable {
                    session: session_id.to_owned(),
                    detail: e.to_string(),
                });
            }
            Err(e) => return Err(invalid(e.to_string())),
        };
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|e| invalid(format!("invalid JSON: {e}")))?;
        CursorState::from_json(&value).map_err(|d| invalid(d.to_owned()))
    }

    /// Saves a session's cursor atomically: a temporary file in the same directory, fsync,
    /// rename over the cursor, fsync of the directory. The temporary file never survives a
    /// failure.
    ///
    /// # Errors
    /// [`CursorError::Save`].
    pub async fn save(&self, session_id: &str, state: &CursorState) -> Result<(), CursorError> {
        self.storage
            .write(
                SPACE,
                &format!("{session_id}.json"),
                state.to_file_text().into_bytes(),
            )
            .await
            .map_err(|source| CursorError::Save {
                session: session_id.to_owned(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn sigs(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn seq_digest_vectors() {
        assert_eq!(
            seq_digest(&[]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            seq_digest(&sigs(&["a", "bc"])),
            "3fafa1cf2f19a7c1129beb20cf0983f73a489a221fc0dd2f16d1be292d089205"
        );
        assert_eq!(
            seq_digest(&sigs(&["ab", "c"])),
            "601d5476e2ccfe2c87a2bba7a322659734a05749d5b5aa781f513e4912db0d5f"
        );
    }

    #[test]
    fn file_text_has_reference_key_order_and_indent() {
        let s = CursorState::new_empty().advanced(None, &sigs(&["x", "y"]), 512, false);
        assert_eq!(
            s.to_file_text(),
            "{\n  \"schema_version\": 1,\n  \"submitted_signatures\": [\n    \"x\",\n    \"y\"\n  ],\n  \"commit_pending\": false,\n  \"submitted_prefix_count\": null,\n  \"submitted_prefix_digest\": null\n}"
        );
        let back = CursorState::from_json(&s.to_json()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn our_keys_follow_the_reference_keys_only_when_set() {
        let plain =
            CursorState::new_empty().advanced(Some(&sigs(&["a"])), &sigs(&["a"]), 16, false);
        let keys: Vec<String> = plain
            .to_json()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(
            keys,
            [
                "schema_version",
                "submitted_signatures",
                "commit_pending",
                "submitted_prefix_count",
                "submitted_prefix_digest"
            ]
        );
        let mut doubt = plain.clone();
        doubt.in_doubt = Some(InDoubtBatch {
            signatures: sigs(&["b", "c"]),
            payload_count: 2,
            uncommitted_before: Some(0),
        });
        doubt.uncommitted_on_server = None;
        let v = doubt.to_json();
        assert_eq!(
            v["in_doubt_batch"],
            serde_json::json!({"signatures": ["b", "c"], "payload_count": 2, "uncommitted_before": 0})
        );
        assert_eq!(v["uncommitted_on_server"], Value::Null);
        assert_eq!(CursorState::from_json(&v).unwrap(), doubt);
        // A reference cursor has neither: nothing in doubt, nothing uncommitted.
        let back = CursorState::from_json(&plain.to_json()).unwrap();
        assert_eq!((back.in_doubt, back.uncommitted_on_server), (None, Some(0)));
        // A malformed record is dropped (the batch is then sent again).
        let mut bad = v.clone();
        bad["in_doubt_batch"] = serde_json::json!({"signatures": [1]});
        assert_eq!(CursorState::from_json(&bad).unwrap().in_doubt, None);
    }

    #[test]
    fn a_landed_batch_extends_the_prefix_when_the_transcript_still_matches() {
        let s = sigs(&["a", "b", "c", "d"]);
        let state = CursorState::new_empty().advanced(Some(&s[..1]), &s[..1], 16, false);
        let batch = InDoubtBatch {
            signatures: sigs(&["b", "c"]),
            payload_count: 2,
            uncommitted_before: Some(0),
        };
        let next = state.with_landed(&batch, &s, 16);
        assert_eq!(next.matching_prefix_count(&s), Some(3));
        assert_eq!(next.submitted_signatures, sigs(&["a", "b", "c"]));
        assert_eq!(next.in_doubt, None);
        // A rewritten transcript keeps the old prefix; the hashes still count as seen.
        let other = sigs(&["x", "b", "c"]);
        let next = state.with_landed(&batch, &other, 16);
        assert_eq!(next.submitted_prefix_count, Some(1));
        assert_eq!(next.submitted_signatures, sigs(&["a", "b", "c"]));
    }

    #[test]
    fn append_only_prefix_matching() {
        let all = sigs(&["a", "b", "c"]);
        assert_eq!(
            CursorState::new_empty().matching_prefix_count(&all),
            Some(0)
        );
        let s = CursorState::new_empty().advanced(Some(&all[..2]), &all[..2], 512, false);
        assert_eq!(s.matching_prefix_count(&all), Some(2));
        let rewritten = sigs(&["a", "x", "c"]);
        assert_eq!(s.matching_prefix_count(&rewritten), None);
        // A prefix count beyond the transcript falls back to the window scan.
        let shorter = sigs(&["a"]);
        assert_eq!(s.matching_prefix_count(&shorter), None);
    }

    #[test]
    fn window_scan_takes_the_rightmost_match() {
        let s = CursorState {
            empty: false,
            submitted_signatures: sigs(&["a", "b"]),
            ..CursorState::default()
        };
        assert_eq!(
            s.matching_prefix_count(&sigs(&["a", "b", "x", "a", "b", "y"])),
            Some(5)
        );
        assert_eq!(s.matching_prefix_count(&sigs(&["b", "a"])), None);
        let non_empty_without_data = CursorState {
            empty: false,
            ..CursorState::default()
        };
        assert_eq!(
            non_empty_without_data.matching_prefix_count(&sigs(&["a"])),
            None
        );
    }

    #[test]
    fn advanced_keeps_only_the_last_hashes() {
        let many: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
        let s = CursorState::new_empty().advanced(Some(&many), &many, 16, true);
        assert_eq!(s.submitted_signatures.len(), 16);
        assert_eq!(s.submitted_signatures[0], "s24");
        assert_eq!(s.submitted_prefix_count, Some(40));
        assert!(s.commit_pending);
        let kept = s.advanced(None, &[], 16, false);
        assert_eq!(kept.submitted_prefix_count, Some(40));
        assert_eq!(kept.submitted_prefix_digest, s.submitted_prefix_digest);
    }

    #[tokio::test]
    async fn store_round_trips_and_fails_closed_on_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let store = CursorStore::new(dir.path());
        assert_eq!(store.load("df_x").await.unwrap(), CursorState::new_empty());
        let s = CursorState::new_empty().advanced(Some(&sigs(&["a"])), &sigs(&["a"]), 16, false);
        store.save("df_x", &s).await.unwrap();
        assert_eq!(store.load("df_x").await.unwrap(), s);
        let leftovers: Vec<_> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(leftovers, vec!["df_x.json".to_owned()]);
        for garbage in ["not json", "[1, 2]", "\"str\"", "null"] {
            fs::write(store.path("df_y"), garbage).unwrap();
            let e = store.load("df_y").await.unwrap_err();
            assert!(matches!(e, CursorError::Invalid { .. }), "{garbage}: {e}");
            assert!(e.to_string().contains("refusing unsafe replay"));
        }
        fs::create_dir_all(store.path("df_dir")).unwrap();
        let e = store.load("df_dir").await.unwrap_err();
        assert!(matches!(e, CursorError::Unreadable { .. }), "{e}");
    }

    #[tokio::test]
    async fn save_failure_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = CursorStore::new(dir.path());
        fs::create_dir_all(store.path("df_z")).unwrap();
        fs::write(store.path("df_z").join("occupied"), "x").unwrap();
        let e = store
            .save("df_z", &CursorState::new_empty())
            .await
            .unwrap_err();
        assert!(matches!(e, CursorError::Save { .. }));
        let names: Vec<_> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["df_z.json".to_owned()]);
    }
}
