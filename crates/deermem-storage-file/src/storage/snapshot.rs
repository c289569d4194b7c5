//! Whole-user snapshots, an administrative operation for moving data to and from another
//! storage (`deermem migrate --from/--to`): [`FileStorage::list_buckets`],
//! [`FileStorage::read_snapshot`] and [`FileStorage::write_snapshot`] read and
//! write a user bucket with every stored value kept (revisions, timestamps, the raw user id
//! each fact records, the sidecars' key order), in the reference's layout and bytes.
//!
//! A write holds the user's locks, writes the facts and sidecars first and the manifest last,
//! with a `.transfer-incomplete` marker in the user directory from the first write until the
//! manifest is in place: a bucket holding the marker was left by an interrupted write and may
//! be written again.

use std::collections::BTreeMap;

use deermem_core::snapshot::{AgentSnapshot, UserSnapshot};
use deermem_core::{AgentName, FactId, StorageError, UserId};
use deermem_pycompat::json;
use serde_json::Value;

use super::{FileStorage, Inner};
use crate::error::{Error, Result};
use crate::fsutil;
use crate::manifest;
use crate::markdown::{self, Expected};
use crate::paths::{AUDIT_FILE, USAGE_FILE, UserDir};

/// Left in a user directory while a snapshot is being written into it.
pub const INCOMPLETE_MARKER: &str = ".transfer-incomplete";

/// Whether `s` can be a bucket (a directory name the layout derives): `[A-Za-z0-9_-]+`.
fn is_bucket(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A user whose bucket is `bucket`; bucket names are raw ids that map to themselves.
fn bucket_user(bucket: &str) -> Result<UserId> {
    if !is_bucket(bucket) {
        return Err(Error::invalid(
            "bucket",
            format!("{bucket:?} is not a user bucket name ([A-Za-z0-9_-]+)"),
        ));
    }
    let user = UserId::new(bucket).map_err(|e| Error::invalid("bucket", e.to_string()))?;
    debug_assert_eq!(user.bucket(), bucket);
    Ok(user)
}

impl FileStorage {
    /// The user buckets under `users/` (directories with a bucket-shaped name), sorted.
    ///
    /// # Errors
    /// `Io` when `users/` cannot be listed.
    pub async fn list_buckets(&self) -> std::result::Result<Vec<String>, StorageError> {
        self.run(|inner| {
            Ok(fsutil::sorted_entries(&inner.layout.root.join("users"))?
                .into_iter()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|b| is_bucket(b))
                .collect())
        })
        .await
    }

    /// The whole of one user bucket, or `None` when the bucket holds nothing. Reads under the
    /// user's locks after journal recovery.
    ///
    /// # Errors
    /// `InvalidInput` for a name that is not a bucket, `Corrupt` for a bucket an interrupted
    /// [`FileStorage::write_snapshot`] left incomplete, an unreadable manifest or
    /// fact file, a legacy (v1) manifest that `deermem migrate --all-users` must upgrade
    /// first, or two files holding one fact id; `Io`.
    pub async fn read_snapshot(
        &self,
        bucket: &str,
    ) -> std::result::Result<Option<UserSnapshot>, StorageError> {
        let bucket = bucket.to_owned();
        self.run(move |inner| inner.read_snapshot(&bucket)).await
    }

    /// Whether an interrupted [`FileStorage::write_snapshot`] left the bucket
    /// incomplete (its marker is there); such a bucket does not read, and may be written
    /// again.
    ///
    /// # Errors
    /// `InvalidInput` for a name that is not a bucket.
    pub fn snapshot_incomplete(&self, bucket: &str) -> std::result::Result<bool, StorageError> {
        let user = bucket_user(bucket)?;
        let udir = self.inner.user_dir(Some(&user))?;
        Ok(udir.dir.join(INCOMPLETE_MARKER).exists())
    }

    /// Replaces the user bucket with `snapshot`: its facts, sidecars and manifest exactly, and
    /// no other fact or sidecar of the bucket. The search index is not told: rebuild it
    /// (`deermem index rebuild`) before serving a root written this way with retrieval on.
    ///
    /// # Errors
    /// `InvalidInput` for a bad bucket or a fact that cannot be rendered; `Io`.
    pub async fn write_snapshot(
        &self,
        snapshot: &UserSnapshot,
    ) -> std::result::Result<(), StorageError> {
        let snapshot = snapshot.clone();
        self.run(move |inner| inner.write_snapshot(&snapshot, Durability::Synced))
            .await
    }

    /// [`FileStorage::write_snapshot`] without any `fsync`: the same files, bytes and
    /// order, left for the kernel to write back. For filling a new root with many users at
    /// once (bulk loads, benchmarks); nothing written this way is durable until the caller
    /// syncs the filesystem (`sync(2)`), and a crash before that may leave any part of it.
    ///
    /// # Errors
    /// As [`FileStorage::write_snapshot`].
    pub async fn write_snapshot_unsynced(
        &self,
        snapshot: UserSnapshot,
    ) -> std::result::Result<(), StorageError> {
        self.run(move |inner| inner.write_snapshot(&snapshot, Durability::Unsynced))
            .await
    }
}

/// Whether a snapshot write makes each file durable before the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// Every file written atomically and fsynced (the normal write).
    Synced,
    /// Plain writes, no fsync (bulk loads; the caller syncs).
    Unsynced,
}

impl Durability {
    fn write(self, path: &std::path::Path, bytes: &[u8]) -> Result<()> {
        match self {
            Self::Synced => fsutil::atomic_write(path, bytes),
            Self::Unsynced => {
                if let Some(dir) = path.parent() {
                    fsutil::create_dir_all(dir)?;
                }
                std::fs::write(path, bytes).map_err(|e| Error::io("Failed to write", path, e))
            }
        }
    }
}

impl Inner {
    fn read_snapshot(&self, bucket: &str) -> Result<Option<UserSnapshot>> {
        let user = bucket_user(bucket)?;
        let udir = self.user_dir(Some(&user))?;
        if !udir.dir.is_dir() {
            return Ok(None);
        }
        let _lock = self.lock(&udir)?;
        self.recover_locked(&udir)?;
        if udir.dir.join(INCOMPLETE_MARKER).exists() {
            return Err(Error::Corrupt(format!(
                "user bucket {bucket:?} was left incomplete by an interrupted `deermem migrate \
                 --to file:` ({} exists): run that migrate again to finish it",
                udir.dir.join(INCOMPLETE_MARKER).display()
            )));
        }
        let mut snap = UserSnapshot::empty(bucket);
        if let Some(m) = manifest::read_manifest(&udir.manifest())? {
            if m.needs_migration() {
                return Err(Error::Corrupt(format!(
                    "{} is a legacy manifest: run `deermem migrate --all-users` on this root \
                     before moving it",
                    m.path.display()
                )));
            }
            snap.revision = m.revision;
            snap.last_updated = m.last_updated();
            snap.user = m.user()?;
            snap.history = m.history()?;
        }
        let now = self.now();
        for entry in fsutil::sorted_entries(&udir.agents())? {
            let name = entry.file_name();
            let Some(agent) = name.to_str().and_then(markdown::canonical_agent_dir) else {
                continue;
            };
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let a = read_agent(&udir, &user, agent, now)?;
            if !a.facts.is_empty() || a.usage.is_some() || a.audit.is_some() {
                snap.agents.push(a);
            }
        }
        Ok((!snap.is_empty()).then_some(snap))
    }

    fn write_snapshot(&self, snap: &UserSnapshot, durability: Durability) -> Result<()> {
        let user = bucket_user(&snap.bucket)?;
        // Render everything before touching the disk: a fact that cannot be written fails
        // the bucket without a partial write.
        let mut files: Vec<(AgentName, BTreeMap<FactId, String>)> = Vec::new();
        for a in &snap.agents {
            let mut rendered = BTreeMap::new();
            for f in &a.facts {
                rendered.insert(f.id.clone(), markdown::render(f)?);
            }
            files.push((a.agent.clone(), rendered));
        }
        let udir = self.user_dir(Some(&user))?;
        fsutil::create_dir_all(&udir.dir)?;
        let _lock = self.lock(&udir)?;
        self.recover_locked(&udir)?;
        let marker = udir.dir.join(INCOMPLETE_MARKER);
        durability.write(&marker, b"")?;
        // Agents on disk that the snapshot does not hold lose their facts and sidecars.
        for entry in fsutil::sorted_entries(&udir.agents())? {
            let Some(agent) = entry
                .file_name()
                .to_str()
                .and_then(markdown::canonical_agent_dir)
            else {
                continue;
            };
            if !snap.agents.iter().any(|a| a.agent == agent) {
                clear_agent(&udir, &agent, &BTreeMap::new())?;
                for name in [USAGE_FILE, AUDIT_FILE] {
                    fsutil::remove_file_if_exists(&udir.metadata(&agent).join(name))?;
                }
            }
        }
        for (a, (agent, rendered)) in snap.agents.iter().zip(&files) {
            clear_agent(&udir, agent, rendered)?;
            for (id, text) in rendered {
                let path = udir.fact(agent, id);
                if let Some(dir) = path.parent() {
                    fsutil::create_dir_all(dir)?;
                }
                durability.write(&path, text.as_bytes())?;
            }
            let meta = udir.metadata(agent);
            let sidecars = [
                (USAGE_FILE, a.usage.clone().map(Value::Object)),
                (AUDIT_FILE, a.audit.clone().map(Value::Array)),
            ];
            for (name, value) in sidecars {
                match value {
                    Some(v) => {
                        fsutil::create_dir_all(&meta)?;
                        durability.write(&meta.join(name), json::to_python_json(&v).as_bytes())?;
                    }
                    None => {
                        fsutil::remove_file_if_exists(&meta.join(name))?;
                    }
                }
            }
        }
        let text = manifest::render(
            snap.revision,
            &snap.last_updated,
            &snap.user.0,
            &snap.history.0,
        );
        durability.write(&udir.manifest(), text.as_bytes())?;
        fsutil::remove_file_if_exists(&marker)?;
        if durability == Durability::Synced {
            fsutil::fsync_dir(&udir.dir)?;
        }
        self.invalidate_user(&Some(user));
        Ok(())
    }
}

/// Removes the agent's fact files whose ids `keep` does not hold (and any file outside its
/// canonical place), and the shard directories left empty.
fn clear_agent(udir: &UserDir, agent: &AgentName, keep: &BTreeMap<FactId, String>) -> Result<()> {
    let facts = udir.facts(agent);
    for path in fsutil::markdown_files(&facts)? {
        let kept = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| FactId::new(s).ok())
            .is_some_and(|id| keep.contains_key(&id) && udir.fact(agent, &id) == path);
        if !kept {
            fsutil::remove_file_if_exists(&path)?;
            if let Some(dir) = path.parent()
                && dir != facts
            {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
    Ok(())
}

/// One agent directory: every fact as stored (the raw user id it records kept), and the
/// sidecars as they are (an unreadable or empty sidecar reads as absent, as everywhere).
fn read_agent(
    udir: &UserDir,
    user: &UserId,
    agent: AgentName,
    now: deermem_core::Timestamp,
) -> Result<AgentSnapshot> {
    let mut facts: BTreeMap<String, deermem_core::Fact> = BTreeMap::new();
    for path in fsutil::markdown_files(&udir.facts(&agent))? {
        let bytes = std::fs::read(&path).map_err(|e| Error::io("Failed to read", &path, e))?;
        let parsed = markdown::parse(&path, &bytes)?;
        let recorded = parsed.user_id.as_str().map(str::to_owned);
        let expected = Expected {
            user: Some(user),
            agent: agent.as_str(),
        };
        let mut loaded = markdown::validate(&path, parsed, expected, now)?;
        // The bucket's user as the file names it, not as this read's requester.
        loaded.fact.scope.user_id = recorded;
        let id = loaded.fact.id.as_str().to_owned();
        if facts.insert(id.clone(), loaded.fact).is_some() {
            return Err(Error::Corrupt(format!(
                "fact {id} is stored twice under {}; keep one file before moving this user",
                udir.facts(&agent).display()
            )));
        }
    }
    let meta = udir.metadata(&agent);
    let usage = match crate::sidecar::read_raw(&meta.join(USAGE_FILE)) {
        Some(Value::Object(m)) if !m.is_empty() => Some(m),
        _ => None,
    };
    let audit = match crate::sidecar::read_raw(&meta.join(AUDIT_FILE)) {
        Some(Value::Array(a)) if !a.is_empty() => Some(a),
        _ => None,
    };
    Ok(AgentSnapshot {
        agent,
        facts: facts.into_values().collect(),
        usage,
        audit,
    })
}
