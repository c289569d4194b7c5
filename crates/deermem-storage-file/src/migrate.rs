//! v1 → v2 migration, as the reference migrates: legacy global manifests (inline facts or the
//! v2-preview path mapping), legacy per-agent documents, and the old implicit `lead-agent`
//! bucket. Backups are written and verified before anything else changes; conflicting data
//! stops the migration with nothing modified.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use deermem_core::fact::{FactScope, NormalizeContext, normalize_fact};
use deermem_core::{
    AgentName, Fact, FactDraft, FactId, Scope, SummaryPatch, SummarySection, Timestamp,
};
use deermem_pycompat::py;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::commit::{self, CommitRequest, Notification};
use crate::error::{Error, Result};
use crate::fsutil;
use crate::manifest::{self, Manifest};
use crate::markdown::{self, Expected};
use crate::paths::{AGENT_CONFIG_FILE, BACKUP_SUFFIX, LEGACY_DEFAULT_AGENT, METADATA_DIR, UserDir};

/// The result of one migration step.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) migrated: bool,
    pub(crate) from_version: Option<String>,
    pub(crate) notifications: Vec<Notification>,
    pub(crate) facts: usize,
}

struct Source {
    path: PathBuf,
    bytes: Vec<u8>,
    doc: Map<String, Value>,
}

fn read_legacy_doc(path: &Path) -> Result<Option<Source>> {
    let Some(bytes) = fsutil::read_optional(path).map_err(|e| Error::ManifestParse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?
    else {
        return Ok(None);
    };
    let m = manifest::parse_manifest(path, &bytes)?;
    Ok(Some(Source {
        path: path.to_path_buf(),
        bytes,
        doc: m.map,
    }))
}

/// Whether a value holds anything but `None`, `""`, `False` (and, as in Python, `0`).
fn meaningful(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => a.iter().any(meaningful),
        Value::Object(o) => o.values().any(meaningful),
    }
}

/// Equal after ignoring the fields a migration may legitimately change.
fn migration_equivalent(a: &Fact, b: &Fact) -> bool {
    let strip = |f: &Fact| {
        let mut m = f.to_internal_map();
        for k in [
            "revision",
            "createdAt",
            "updatedAt",
            "scope",
            "title",
            "schemaVersion",
        ] {
            m.shift_remove(k);
        }
        Value::Object(m)
    };
    py::py_eq(&strip(a), &strip(b))
}

fn legacy_facts(source: &Source, udir: &UserDir) -> Result<Vec<Map<String, Value>>> {
    let path = &source.path;
    match source.doc.get("facts") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::Object(m) => Ok(m.clone()),
                _ => Err(Error::Corrupt(format!(
                    "Legacy fact in {} is not an object",
                    path.display()
                ))),
            })
            .collect(),
        Some(Value::Object(entries)) => {
            let base = path.parent().unwrap_or(&udir.dir);
            let mut out = Vec::new();
            for (id, entry) in entries {
                let rel = entry
                    .as_object()
                    .and_then(|e| e.get("path"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        Error::Corrupt(format!("Invalid legacy manifest entry for fact '{id}'"))
                    })?;
                let file = UserDir::resolve_below(base, rel, "legacy fact path")?;
                let bytes = std::fs::read(&file).map_err(|e| Error::FactParse {
                    path: file.clone(),
                    reason: e.to_string(),
                })?;
                let parsed = markdown::parse(&file, &bytes)?;
                if parsed.map.get("id").and_then(py::py_str).as_deref() != Some(id.as_str()) {
                    return Err(Error::Corrupt(format!(
                        "Legacy manifest id mismatch for '{id}' in {}",
                        file.display()
                    )));
                }
                let hash = entry.get("contentHash").filter(|h| py::truthy(h));
                if let Some(hash) = hash {
                    let want = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
                    if hash.as_str() != Some(want.as_str()) {
                        return Err(Error::Corrupt(format!(
                            "Hash mismatch for canonical fact {}",
                            file.display()
                        )));
                    }
                }
                out.push(parsed.map);
            }
            Ok(out)
        }
        Some(_) => Err(Error::Corrupt(format!(
            "Legacy facts in {} must be a list or mapping",
            path.display()
        ))),
    }
}

fn merge_section(
    name: &str,
    canonical: Map<String, Value>,
    legacy: Option<&Value>,
    legacy_path: &Path,
) -> Result<Map<String, Value>> {
    let legacy = legacy.cloned().unwrap_or(Value::Object(Map::new()));
    let canon_v = Value::Object(canonical.clone());
    if py::py_eq(&canon_v, &legacy) || !meaningful(&legacy) {
        return Ok(canonical);
    }
    if !meaningful(&canon_v) {
        return match legacy {
            Value::Object(m) => Ok(m),
            _ => Err(Error::Corrupt(format!(
                "Legacy {name} summary in {} is not an object; the legacy file was kept",
                legacy_path.display()
            ))),
        };
    }
    Err(Error::Corrupt(format!(
        "Legacy {name} summary migration conflict in {}; the legacy file was kept",
        legacy_path.display()
    )))
}

/// Writes (or verifies) the byte-exact backup of a migration source.
fn ensure_backup(source: &Source) -> Result<()> {
    let mut name = source.path.clone().into_os_string();
    name.push(BACKUP_SUFFIX);
    let bak = PathBuf::from(name);
    match fsutil::read_optional(&bak) {
        Ok(Some(existing)) if existing == source.bytes => Ok(()),
        Ok(Some(_)) => Err(Error::Corrupt(format!(
            "Existing migration backup {} differs from source {}; the original backup was kept and migration was stopped",
            bak.display(),
            source.path.display()
        ))),
        Ok(None) => {
            // A process that died while writing this backup left its temporary file behind
            // (no journal exists yet at this point, so recovery never sweeps it).
            fsutil::remove_orphaned_temps_of(&bak);
            fsutil::atomic_write(&bak, &source.bytes).map_err(|e| match e {
                Error::Io { source: io, .. } => Error::Io {
                    context: format!(
                        "Failed to create durable migration backup {}",
                        bak.display()
                    ),
                    source: io,
                },
                other => other,
            })
        }
        Err(e) => Err(Error::io("Failed to read migration backup", &bak, e)),
    }
}

/// Migrates the legacy sources of one agent. With `dry_run` everything is read and
/// checked but nothing is written. The caller holds both locks and has run recovery.
///
/// # Errors
/// Corruption for conflicts, escaping paths, hash or backup mismatches; `Invalid` for invalid
/// legacy facts (as the reference); `Io`.
pub(crate) fn migrate_locked(
    udir: &UserDir,
    agent: &AgentName,
    include_global: bool,
    adopt_legacy_summaries: bool,
    dry_run: bool,
    now: Timestamp,
) -> Result<Outcome> {
    let global = manifest::read_manifest(&udir.manifest())?;
    let from_version = global.as_ref().and_then(Manifest::version_text);
    let mut sources: Vec<Source> = Vec::new();
    let legacy_agent = read_legacy_doc(&udir.legacy_agent_doc(agent))?;
    let has_legacy_agent = legacy_agent.is_some();
    if let Some(s) = legacy_agent {
        sources.push(s);
    }
    let migrating_global = include_global && global.as_ref().is_some_and(Manifest::needs_migration);
    if migrating_global && let Some(g) = &global {
        {
            let bytes = std::fs::read(&g.path).map_err(|e| Error::ManifestParse {
                path: g.path.clone(),
                reason: e.to_string(),
            })?;
            sources.push(Source {
                path: g.path.clone(),
                bytes,
                doc: g.map.clone(),
            });
        }
    }
    if sources.is_empty() {
        return Ok(Outcome {
            from_version,
            ..Outcome::default()
        });
    }

    // Summaries.
    let (mut user_sec, mut hist_sec) = match &global {
        Some(g) => (g.user()?.0, g.history()?.0),
        None => (
            SummarySection::default_user().0,
            SummarySection::default_history().0,
        ),
    };
    if has_legacy_agent && adopt_legacy_summaries {
        let legacy = &sources[0];
        user_sec = merge_section("user", user_sec, legacy.doc.get("user"), &legacy.path)?;
        hist_sec = merge_section("history", hist_sec, legacy.doc.get("history"), &legacy.path)?;
    }

    // Facts.
    let scope = FactScope {
        user_id: udir.raw_user(),
        agent_name: Some(agent.as_str().to_owned()),
    };
    let expected = udir.expected(agent);
    let mut collected: Vec<Fact> = Vec::new();
    // Every id seen so far (from a source or already canonical) with the fact it stands for.
    let mut known: HashMap<FactId, Fact> = HashMap::new();
    for source in &sources {
        for raw in legacy_facts(source, udir)? {
            let ctx = NormalizeContext {
                scope: &scope,
                existing: None,
                now,
                new_id: &crate::fresh_fact_id,
            };
            let fact = normalize_fact(&FactDraft::from_json(raw)?, &ctx)?;
            let other = match known.get(&fact.id) {
                Some(f) => Some(f.clone()),
                None => markdown::load_optional(&udir.fact(agent, &fact.id), expected, now)?
                    .map(|l| l.fact),
            };
            if let Some(other) = other {
                if !migration_equivalent(&other, &fact) {
                    return Err(Error::Corrupt(format!(
                        "Fact migration conflict for '{}'",
                        fact.id
                    )));
                }
                known.entry(fact.id.clone()).or_insert(other);
                continue;
            }
            known.insert(fact.id.clone(), fact.clone());
            collected.push(fact);
        }
    }
    let count = collected.len();
    if dry_run {
        return Ok(Outcome {
            migrated: true,
            from_version,
            notifications: Vec::new(),
            facts: count,
        });
    }

    // Backups before any write.
    for source in &sources {
        ensure_backup(source)?;
    }
    let current_rev = global.as_ref().map_or(0, |g| g.revision);
    let req = CommitRequest {
        agent: Some(agent.clone()),
        upserts: collected
            .iter()
            .map(|f| (f.id.clone(), f.to_draft()))
            .collect(),
        summaries: Some(SummaryPatch {
            user: Some(user_sec),
            history: Some(hist_sec),
        }),
        expected_revision: Some(current_rev),
        allow_legacy_drop: migrating_global,
        ..CommitRequest::default()
    };
    let done = commit::commit(udir, &req, None, now)?;
    if has_legacy_agent {
        let legacy = udir.legacy_agent_doc(agent);
        if fsutil::remove_file_if_exists(&legacy)?
            && let Some(d) = legacy.parent()
        {
            fsutil::fsync_dir(d)?;
        }
    }
    Ok(Outcome {
        migrated: true,
        from_version,
        notifications: done.notifications(),
        facts: count,
    })
}

/// Whether the user has the old implicit `lead-agent` bucket (a `lead-agent` directory without
/// a `config.yaml` file).
pub(crate) fn has_legacy_default_bucket(udir: &UserDir) -> bool {
    let dir = udir.agents().join(LEGACY_DEFAULT_AGENT);
    dir.is_dir() && !dir.join(AGENT_CONFIG_FILE).is_file()
}

/// Moves the old implicit `lead-agent` bucket into `__default__`. Its `.metadata`
/// sidecars move along (or are dropped when `__default__` already has its own) and orphaned
/// temporaries of our atomic writes are removed, instead of blocking every default read as in
/// the reference.
///
/// # Errors
/// Corruption for unexpected entries or conflicting facts (nothing modified); `Io`.
pub(crate) fn migrate_legacy_default_bucket(
    udir: &UserDir,
    now: Timestamp,
) -> Result<Vec<Notification>> {
    if !has_legacy_default_bucket(udir) {
        return Ok(Vec::new());
    }
    let dir = udir.agents().join(LEGACY_DEFAULT_AGENT);
    let facts_dir = dir.join("facts");
    let mut unexpected: Vec<String> = Vec::new();
    for e in fsutil::sorted_entries(&dir)? {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != "facts" && name != METADATA_DIR {
            unexpected.push(name);
        }
    }
    let mut temps: Vec<PathBuf> = Vec::new();
    let mut md_files: Vec<PathBuf> = Vec::new();
    let mut subdirs: Vec<PathBuf> = Vec::new();
    let mut stack = vec![facts_dir.clone()];
    while let Some(d) = stack.pop() {
        for e in fsutil::sorted_entries(&d)? {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                subdirs.push(p.clone());
                stack.push(p);
            } else if fsutil::is_atomic_temp(&name) {
                temps.push(p);
            } else if p
                .extension()
                .is_some_and(|x| x.to_string_lossy().to_lowercase() == "md")
            {
                md_files.push(p);
            } else {
                unexpected.push(
                    p.strip_prefix(&dir)
                        .unwrap_or(&p)
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    if !unexpected.is_empty() {
        unexpected.sort();
        return Err(Error::Corrupt(format!(
            "Cannot migrate previous default bucket {}: unexpected entries {unexpected:?}",
            dir.display()
        )));
    }
    let lead_expected = Expected {
        user: udir.user.as_ref(),
        agent: LEGACY_DEFAULT_AGENT,
    };
    let default = AgentName::default_bucket();
    let default_expected = udir.expected(&default);
    let scope = FactScope {
        user_id: udir.raw_user(),
        agent_name: Some(default.as_str().to_owned()),
    };
    let mut upserts = Vec::new();
    let mut moved_ids = Vec::new();
    for p in &md_files {
        let loaded = markdown::load_file(p, lead_expected, now)?;
        let ctx = NormalizeContext {
            scope: &scope,
            existing: None,
            now,
            new_id: &crate::fresh_fact_id,
        };
        let fact = normalize_fact(&loaded.fact.to_draft(), &ctx)?;
        moved_ids.push(fact.id.to_string());
        if let Some(existing) =
            markdown::load_optional(&udir.fact(&default, &fact.id), default_expected, now)?
        {
            if !migration_equivalent(&existing.fact, &fact) {
                return Err(Error::Corrupt(format!(
                    "Fact migration conflict for '{}'",
                    fact.id
                )));
            }
            continue;
        }
        upserts.push((fact.id.clone(), fact.to_draft()));
    }
    let current_rev = manifest::read_manifest(&udir.manifest())?.map_or(0, |m| m.revision);
    let req = CommitRequest {
        agent: Some(default.clone()),
        upserts,
        expected_revision: Some(current_rev),
        ..CommitRequest::default()
    };
    let mut notes = commit::commit(udir, &req, None, now)?.notifications();
    if let Ok(lead) = AgentName::parse(LEGACY_DEFAULT_AGENT) {
        let old_scope = Scope::new(udir.user.clone(), Some(lead));
        notes.extend(moved_ids.into_iter().map(|id| Notification::Remove {
            scope: old_scope.clone(),
            id,
        }));
    }
    // Only now remove the old files, never recursively.
    for p in md_files.iter().chain(temps.iter()) {
        fsutil::remove_file_if_exists(p)?;
    }
    subdirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in &subdirs {
        let _ = std::fs::remove_dir(d);
    }
    let _ = std::fs::remove_dir(&facts_dir);
    let meta = dir.join(METADATA_DIR);
    if meta.is_dir() {
        let target = udir.metadata(&default);
        if target.exists() {
            let _ = std::fs::remove_dir_all(&meta);
        } else if let Err(e) = std::fs::rename(&meta, &target) {
            tracing::warn!(error = %e, "could not move the old default bucket's sidecars");
        }
    }
    let _ = std::fs::remove_dir(&dir);
    fsutil::fsync_dir(&udir.agents())?;
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn meaningful_follows_python_falsiness() {
        assert!(!meaningful(&json!({"a": {"summary": "", "updatedAt": ""}})));
        assert!(!meaningful(
            &json!({"a": 0, "b": 0.0, "c": false, "d": null, "e": []})
        ));
        assert!(meaningful(&json!({"a": {"summary": "x"}})));
        assert!(meaningful(&json!([true])));
    }

    #[test]
    fn legacy_json_parse_is_shared_with_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("memory.json");
        std::fs::write(&p, "{\"facts\": [], \"version\": \"1.0\"}").unwrap();
        let s = read_legacy_doc(&p).unwrap().unwrap();
        assert_eq!(s.doc["version"], "1.0");
        assert!(
            read_legacy_doc(&dir.path().join("absent.json"))
                .unwrap()
                .is_none()
        );
        std::fs::write(&p, "[1]").unwrap();
        assert!(read_legacy_doc(&p).is_err());
    }

    /// Regression (reliability suite, crash cycles): a process killed while writing a
    /// migration backup left `.memory.json.v1.bak.<hex>.tmp` behind for good, since no journal
    /// existed yet for recovery to sweep it.
    #[test]
    fn writing_a_backup_removes_orphans_of_an_interrupted_backup_write() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("memory.json");
        std::fs::write(&p, "{\"facts\": [], \"version\": \"1.0\"}").unwrap();
        let orphan = dir
            .path()
            .join(".memory.json.v1.bak.0123456789abcdef0123456789abcdef.tmp");
        std::fs::write(&orphan, "partial").unwrap();
        // Someone else's temporary and unrelated files stay.
        let other = dir
            .path()
            .join(".other.json.0123456789abcdef0123456789abcdef.tmp");
        std::fs::write(&other, "x").unwrap();
        let source = read_legacy_doc(&p).unwrap().unwrap();
        ensure_backup(&source).unwrap();
        assert!(!orphan.exists());
        assert!(other.exists());
        let bak = dir.path().join("memory.json.v1.bak");
        assert_eq!(std::fs::read(&bak).unwrap(), std::fs::read(&p).unwrap());
    }
}
