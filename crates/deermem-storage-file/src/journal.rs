//! The operation journal (`<U>/.memory.journal.json`) and crash recovery (a prepared but
//! unfinished commit is rolled back from its pre-images; a committed one is only cleaned up).
//! The JSON keys, the states and the pre-image layout are the reference's, so a Python process
//! can recover a Rust crash and the other way round.

use std::path::{Path, PathBuf};

use deermem_core::{AgentName, FactId};
use deermem_pycompat::py;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::fsutil;
use crate::paths::{RECOVERY_MANIFEST, UserDir};
use deermem_pycompat::json;

/// The journal state before any target is touched.
pub(crate) const PREPARED: &str = "prepared";
/// The journal state after every target was written (the reference writes it before cleaning up;
/// DeerMem never does, its commit point is the journal's durable unlink, but recovers it).
pub(crate) const COMMITTED: &str = "committed";

/// One in-flight commit, as written to `<U>/.memory.journal.json`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Journal {
    pub(crate) operation_id: String,
    pub(crate) state: &'static str,
    pub(crate) agent_name: Option<String>,
    pub(crate) expected_revision: u64,
    pub(crate) next_revision: u64,
    pub(crate) fact_ids: Vec<String>,
    /// `(id, path relative to the user dir)` of facts that existed before.
    pub(crate) old_entries: Vec<(String, String)>,
}

impl Journal {
    /// The reference's JSON text, keys in its order.
    pub(crate) fn render(&self) -> String {
        let old: Map<String, Value> = self
            .old_entries
            .iter()
            .map(|(id, path)| (id.clone(), serde_json::json!({ "path": path })))
            .collect();
        json::to_python_json(&serde_json::json!({
            "operationId": self.operation_id,
            "state": self.state,
            "agentName": self.agent_name,
            "expectedRevision": self.expected_revision,
            "nextRevision": self.next_revision,
            "factIds": self.fact_ids,
            "oldEntries": old,
        }))
    }

    /// Writes the journal atomically and durably into the user directory (open as `dir`),
    /// recycling the previous commit's journal inode (`fsutil::write_recycled`).
    ///
    /// # Errors
    /// `Io` on write failure.
    pub(crate) fn write(&self, udir: &UserDir, dir: &std::fs::File) -> Result<()> {
        fsutil::write_recycled(
            dir,
            &udir.dir,
            &udir.journal(),
            &udir.journal_spare(),
            self.render().as_bytes(),
        )
    }
}

fn journal_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Journal {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn is_plain_component(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && !s.contains('/')
        && !s.contains('\\')
        && !s.contains('\0')
}

/// What recovery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recovery {
    /// No journal was present.
    Nothing,
    /// A prepared operation was rolled back.
    RolledBack,
    /// A prepared operation without a manifest pre-image whose manifest already held its
    /// `nextRevision` was completed: every fact write precedes the manifest's.
    RolledForward,
    /// A committed operation was cleaned up.
    CleanedUp,
}

/// Recovers an interrupted commit of the user directory, if a journal exists, and names the
/// journal's agent (whose facts may have changed). The caller holds both locks.
///
/// # Errors
/// `Journal` corruption for an unreadable or inconsistent journal (every operation of the user
/// is then blocked until an operator repairs it), path-escape corruption, `Io`.
pub(crate) fn recover(udir: &UserDir) -> Result<(Recovery, Option<AgentName>)> {
    let path = udir.journal();
    let bytes = match fsutil::read_optional(&path) {
        Ok(None) => {
            sweep_stale_recovery(udir);
            return Ok((Recovery::Nothing, None));
        }
        Ok(Some(b)) => b,
        Err(e) => return Err(journal_error(&path, e.to_string())),
    };
    let text = std::str::from_utf8(&bytes).map_err(|e| journal_error(&path, e.to_string()))?;
    let value = json::parse_lenient(text).map_err(|e| journal_error(&path, e.to_string()))?;
    let Value::Object(j) = value else {
        return Err(journal_error(&path, "the journal is not an object"));
    };
    let op = match j.get("operationId") {
        Some(Value::String(s)) if is_plain_component(s) => s.clone(),
        Some(Value::String(_)) => {
            return Err(journal_error(&path, "operationId is not a plain name"));
        }
        _ => return Err(journal_error(&path, "missing operationId")),
    };
    let agent = match j.get("agentName") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            AgentName::parse(s)
                .map_err(|e| journal_error(&path, format!("invalid agentName: {e}")))?,
        ),
        Some(_) => return Err(journal_error(&path, "agentName must be a string or null")),
    };
    let op_dir = udir.recovery_root().join(&op);
    let state = j.get("state").and_then(Value::as_str).unwrap_or_default();
    let outcome = match state {
        PREPARED if completed_without_preimage(udir, &j, &op_dir) => Recovery::RolledForward,
        PREPARED => {
            roll_back(udir, &path, &j, &op_dir, agent.as_ref())?;
            Recovery::RolledBack
        }
        COMMITTED => Recovery::CleanedUp,
        _ => {
            let shown = j.get("state").map_or_else(
                || "None".to_owned(),
                |v| v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            );
            return Err(Error::Corrupt(format!(
                "Unknown journal state {shown:?} in {}",
                path.display()
            )));
        }
    };
    let _ = std::fs::remove_dir_all(&op_dir);
    fsutil::remove_file_if_exists(&path)?;
    fsutil::fsync_dir(&udir.dir)?;
    sweep_temp_files(udir);
    tracing::info!(journal = %path.display(), operation = %op, ?outcome, "recovered interrupted memory commit");
    Ok((outcome, agent))
}

fn lenient_u64(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
            .unwrap_or(0),
        Some(Value::String(s)) => py::strip(s).parse().unwrap_or(0),
        Some(Value::Bool(b)) => u64::from(*b),
        _ => 0,
    }
}

/// Whether a prepared journal describes a commit that wrote everything but was interrupted
/// before its commit point, and had nothing to restore but facts to unlink: no manifest
/// pre-image (DeerMem writes none for a create-only commit with unchanged summaries) and a
/// manifest that already holds `nextRevision == expectedRevision + 1`. Both implementations
/// write the manifest after every fact file, each durably, so that manifest proves the fact
/// writes done. The reference would unlink the new facts and keep that manifest; completing the
/// commit loses nothing and keeps the revision consistent with the facts.
fn completed_without_preimage(udir: &UserDir, j: &Map<String, Value>, op_dir: &Path) -> bool {
    if op_dir.join(RECOVERY_MANIFEST).exists() {
        return false;
    }
    let (Some(expected), Some(next)) = (
        j.get("expectedRevision").and_then(Value::as_u64),
        j.get("nextRevision").and_then(Value::as_u64),
    ) else {
        return false;
    };
    if expected.checked_add(1) != Some(next) {
        return false;
    }
    matches!(
        crate::manifest::read_manifest(&udir.manifest()),
        Ok(Some(m)) if m.revision == next && !m.needs_migration()
    )
}

fn roll_back(
    udir: &UserDir,
    path: &Path,
    j: &Map<String, Value>,
    op_dir: &Path,
    agent: Option<&AgentName>,
) -> Result<()> {
    // Validate everything before touching anything.
    let fact_ids: Vec<String> = match j.get("factIds") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| journal_error(path, "factIds must hold strings"))
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(journal_error(path, "factIds must be a list")),
    };
    let old_entries = j.get("oldEntries").and_then(Value::as_object);
    let mut restores: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut unlinks: Vec<PathBuf> = Vec::new();
    if let Some(old) = old_entries {
        for id in &fact_ids {
            if old.contains_key(id) {
                continue;
            }
            let Some(agent) = agent else {
                return Err(journal_error(path, "contains facts without agentName"));
            };
            let fid = FactId::new(id.as_str())
                .map_err(|_| journal_error(path, format!("contains an invalid fact id {id:?}")))?;
            unlinks.push(udir.fact(agent, &fid));
        }
        for (id, entry) in old {
            FactId::new(id.as_str())
                .map_err(|_| journal_error(path, format!("contains an invalid fact id {id:?}")))?;
            let Some(rel) = entry.get("path").and_then(Value::as_str) else {
                continue;
            };
            let pre = op_dir.join(format!("{id}.md"));
            let target = UserDir::resolve_below(&udir.dir, rel, "journal path")?;
            if pre.is_file() {
                restores.push((pre, target));
            }
        }
    }
    let manifest_pre = op_dir.join(RECOVERY_MANIFEST);
    if manifest_pre.is_file() {
        let bytes = std::fs::read(&manifest_pre)
            .map_err(|e| Error::io("Failed to read", &manifest_pre, e))?;
        fsutil::atomic_write(&udir.manifest(), &bytes)?;
    } else if lenient_u64(j.get("expectedRevision")) == 0 {
        fsutil::remove_file_if_exists(&udir.manifest())?;
    }
    for p in &unlinks {
        if fsutil::remove_file_if_exists(p)?
            && let Some(d) = p.parent()
        {
            fsutil::fsync_dir(d)?;
        }
    }
    for (pre, target) in &restores {
        let bytes = std::fs::read(pre).map_err(|e| Error::io("Failed to read", pre, e))?;
        fsutil::atomic_write(target, &bytes)?;
    }
    Ok(())
}

/// Removes leftovers of a commit that crashed before its journal was durable: recovery
/// directories without a journal and a journal temporary that was never renamed (their
/// targets were never touched) and, when any were found, our orphaned atomic-write temporaries
/// in the user's tree. One directory listing of the user directory when nothing is left over.
/// Best effort; the caller holds the locks and no journal exists.
fn sweep_stale_recovery(udir: &UserDir) {
    let Some((mut found, has_recovery)) = scan_user_dir(&udir.dir) else {
        return;
    };
    if has_recovery && let Ok(entries) = std::fs::read_dir(udir.recovery_root()) {
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                found = true;
                if let Err(err) = std::fs::remove_dir_all(&p) {
                    tracing::warn!(path = %p.display(), error = %err, "could not remove stale recovery directory");
                }
            } else if e.file_name().to_str().is_some_and(fsutil::is_atomic_temp) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    if found {
        sweep_temp_files(udir);
    }
}

/// Whether the user directory holds one of our atomic-write temporaries and whether it has a
/// `.recovery/` directory; `None` when it cannot be listed. Runs before every commit, so on
/// Linux it lists through a stack buffer (`getdents64`) instead of `read_dir`, whose 32 KiB
/// buffer per call showed in the write profiles (an allocation that consolidates the heap).
fn scan_user_dir(dir: &Path) -> Option<(bool, bool)> {
    let mut temp = false;
    let mut recovery = false;
    let mut see = |name: &[u8]| {
        if name == crate::paths::RECOVERY_DIR.as_bytes() {
            recovery = true;
        } else if std::str::from_utf8(name).is_ok_and(fsutil::is_atomic_temp) {
            temp = true;
        }
    };
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{Mode, OFlags, RawDir};
        let fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 2048];
        let mut entries = RawDir::new(&fd, &mut buf);
        while let Some(entry) = entries.next() {
            see(entry.ok()?.file_name().to_bytes());
        }
    }
    #[cfg(not(target_os = "linux"))]
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        see(e.file_name().as_encoded_bytes());
    }
    Some((temp, recovery))
}

/// Removes our orphaned atomic-write temporaries (`.<name>.<32 hex>.tmp`) from the user
/// directory, each agent's fact shards and sidecar directory. Only safe under the user lock.
pub(crate) fn sweep_temp_files(udir: &UserDir) {
    let mut dirs = vec![udir.dir.clone(), udir.recovery_root()];
    if let Ok(agents) = std::fs::read_dir(udir.agents()) {
        for a in agents.flatten() {
            let ap = a.path();
            dirs.push(ap.clone());
            dirs.push(ap.join(crate::paths::METADATA_DIR));
            if let Ok(shards) = std::fs::read_dir(ap.join("facts")) {
                dirs.extend(shards.flatten().map(|s| s.path()));
            }
        }
    }
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file())
                && e.file_name().to_str().is_some_and(fsutil::is_atomic_temp)
            {
                let p = e.path();
                match std::fs::remove_file(&p) {
                    Ok(()) => {
                        tracing::info!(path = %p.display(), "removed orphaned temporary file")
                    }
                    Err(err) => {
                        tracing::warn!(path = %p.display(), error = %err, "could not remove orphaned temporary file")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_renders_reference_keys_in_order() {
        let j = Journal {
            operation_id: "3419415bbd3848a8b0c033a32bc4aadf".into(),
            state: PREPARED,
            agent_name: Some("a".into()),
            expected_revision: 1,
            next_revision: 2,
            fact_ids: vec!["new1".into(), "old1".into()],
            old_entries: vec![("old1".into(), "agents/a/facts/87/old1.md".into())],
        };
        assert_eq!(
            j.render(),
            "{\n  \"operationId\": \"3419415bbd3848a8b0c033a32bc4aadf\",\n  \"state\": \"prepared\",\n  \"agentName\": \"a\",\n  \"expectedRevision\": 1,\n  \"nextRevision\": 2,\n  \"factIds\": [\n    \"new1\",\n    \"old1\"\n  ],\n  \"oldEntries\": {\n    \"old1\": {\n      \"path\": \"agents/a/facts/87/old1.md\"\n    }\n  }\n}"
        );
    }

    #[test]
    fn plain_components() {
        assert!(is_plain_component("abc123"));
        for bad in ["", ".", "..", "a/b", "a\\b", "a\0"] {
            assert!(!is_plain_component(bad), "{bad:?}");
        }
    }
}
