//! The reference's on-disk layout: root resolution, user and agent directories, fact
//! shards, and the names of the manifest, lock, journal, recovery and sidecar files.
//!
//! Every path is built from validated core types (`UserId::bucket`, `AgentName`, `FactId`), so
//! no caller-supplied text can reach outside the root.

use std::path::{Component, Path, PathBuf};

use deermem_core::{AgentName, FactId, UserId};

use crate::error::{Error, Result};
use crate::markdown::Expected;

/// The lock file of a user directory.
pub(crate) const LOCK_FILE: &str = ".memory.lock";
/// The operation journal of a user directory.
pub(crate) const JOURNAL_FILE: &str = ".memory.journal.json";
/// The inode the journal is written into and returned to between commits (DeerMem only; see
/// `fsutil::write_recycled`). Never read; the reference ignores it.
pub(crate) const JOURNAL_SPARE_FILE: &str = ".memory.journal.spare";
/// The pre-image directory of a user directory.
pub(crate) const RECOVERY_DIR: &str = ".recovery";
/// The manifest pre-image name inside a recovery directory (always this, whatever the
/// configured manifest name).
pub(crate) const RECOVERY_MANIFEST: &str = "memory.json";
/// The sidecar directory of an agent.
pub(crate) const METADATA_DIR: &str = ".metadata";
/// The usage sidecar.
pub(crate) const USAGE_FILE: &str = "fact-usage.json";
/// The capacity-eviction audit sidecar.
pub(crate) const AUDIT_FILE: &str = "eviction-audit.json";
/// The agent directory that marks a real custom agent.
pub(crate) const AGENT_CONFIG_FILE: &str = "config.yaml";
/// The old implicit default bucket.
pub(crate) const LEGACY_DEFAULT_AGENT: &str = "lead-agent";
/// Suffix of migration backups.
pub(crate) const BACKUP_SUFFIX: &str = ".v1.bak";

/// Where the storage root is when no `storage_path` is configured: `$DEERMEM_DATA_DIR`, else
/// `~/.deermem`. The lookups are injected so tests can control them.
///
/// Returns `None` when neither the variable nor a home directory is available.
pub fn resolve_root(
    storage_path: &str,
    env: &dyn Fn(&str) -> Option<String>,
    home: &dyn Fn() -> Option<PathBuf>,
) -> Option<PathBuf> {
    if !storage_path.is_empty() {
        return Some(PathBuf::from(storage_path));
    }
    if let Some(dir) = env("DEERMEM_DATA_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    home().map(|h| h.join(".deermem"))
}

/// The process environment and home directory, for [`resolve_root`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The current user's home directory (`$HOME`), for [`resolve_root`].
pub fn process_home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Validates a manifest file name: a plain name ending in `.json`.
///
/// # Errors
/// The reference's message for anything else.
pub(crate) fn validate_manifest_name(name: &str) -> Result<()> {
    let plain = Path::new(name)
        .file_name()
        .is_some_and(|f| f.to_str() == Some(name));
    if !plain || !name.ends_with(".json") || name.contains('\0') {
        return Err(Error::invalid(
            "manifest_filename",
            "manifest_filename must be a plain .json filename.",
        ));
    }
    Ok(())
}

/// The resolved layout of one storage root.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) root: PathBuf,
    pub(crate) manifest_name: String,
    pub(crate) strict_user_scope: bool,
}

/// The directory and names of one user's data.
#[derive(Debug, Clone)]
pub(crate) struct UserDir {
    /// The raw user, or `None` for the legacy root layout.
    pub(crate) user: Option<UserId>,
    /// `root/users/<bucket>` or `root`.
    pub(crate) dir: PathBuf,
    pub(crate) manifest_name: String,
}

impl Layout {
    /// The directory of a user.
    ///
    /// # Errors
    /// A missing user under `strict_user_scope`.
    pub(crate) fn user_dir(&self, user: Option<&UserId>) -> Result<UserDir> {
        let dir = match user {
            Some(u) => self.root.join("users").join(u.bucket()),
            None if self.strict_user_scope => {
                return Err(Error::invalid(
                    "user_id",
                    "user_id is required when strict_user_scope is enabled.",
                ));
            }
            None => self.root.clone(),
        };
        Ok(UserDir {
            user: user.cloned(),
            dir,
            manifest_name: self.manifest_name.clone(),
        })
    }
}

impl UserDir {
    /// The v2 manifest.
    pub(crate) fn manifest(&self) -> PathBuf {
        self.dir.join(&self.manifest_name)
    }

    /// The per-user lock file.
    pub(crate) fn lock(&self) -> PathBuf {
        self.dir.join(LOCK_FILE)
    }

    /// The operation journal.
    pub(crate) fn journal(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    /// The journal's spare inode between commits.
    pub(crate) fn journal_spare(&self) -> PathBuf {
        self.dir.join(JOURNAL_SPARE_FILE)
    }

    /// The recovery directory root.
    pub(crate) fn recovery_root(&self) -> PathBuf {
        self.dir.join(RECOVERY_DIR)
    }

    /// `<U>/agents`.
    pub(crate) fn agents(&self) -> PathBuf {
        self.dir.join("agents")
    }

    /// An agent's directory (the canonical lowercase name).
    pub(crate) fn agent(&self, agent: &AgentName) -> PathBuf {
        self.agents().join(agent.as_str())
    }

    /// An agent's facts directory.
    pub(crate) fn facts(&self, agent: &AgentName) -> PathBuf {
        self.agent(agent).join("facts")
    }

    /// The canonical path of one fact.
    pub(crate) fn fact(&self, agent: &AgentName, id: &FactId) -> PathBuf {
        self.facts(agent)
            .join(id.shard())
            .join(format!("{}.md", id.as_str()))
    }

    /// The fact path relative to the user directory, with POSIX separators (journal form).
    pub(crate) fn fact_rel(&self, agent: &AgentName, id: &FactId) -> String {
        format!(
            "agents/{}/facts/{}/{}.md",
            agent.as_str(),
            id.shard(),
            id.as_str()
        )
    }

    /// The legacy per-agent v1 document.
    pub(crate) fn legacy_agent_doc(&self, agent: &AgentName) -> PathBuf {
        self.agent(agent).join(&self.manifest_name)
    }

    /// An agent's sidecar directory.
    pub(crate) fn metadata(&self, agent: &AgentName) -> PathBuf {
        self.agent(agent).join(METADATA_DIR)
    }

    /// The scope a read of the agent's facts expects.
    pub(crate) fn expected<'a>(&'a self, agent: &'a AgentName) -> Expected<'a> {
        Expected {
            user: self.user.as_ref(),
            agent: agent.as_str(),
        }
    }

    /// The raw user id recorded in facts and scopes.
    pub(crate) fn raw_user(&self) -> Option<String> {
        self.user.as_ref().map(|u| u.as_str().to_owned())
    }

    /// Resolves a journal or legacy-manifest path safely under `base`: relative, no `..`, and
    /// after following symlinks of the existing prefix still below `base`.
    ///
    /// # Errors
    /// Corruption naming the offending path.
    pub(crate) fn resolve_below(base: &Path, rel: &str, what: &str) -> Result<PathBuf> {
        let p = Path::new(rel);
        let escapes =
            || Error::Corrupt(format!("{what} escapes the user memory directory: {rel:?}"));
        if rel.is_empty() || rel.contains('\0') || p.is_absolute() {
            return Err(escapes());
        }
        for c in p.components() {
            match c {
                Component::Normal(_) | Component::CurDir => {}
                _ => return Err(escapes()),
            }
        }
        let joined = base.join(p);
        // Follow symlinks of the deepest existing ancestor and require it below `base`.
        let base_real = base.canonicalize().unwrap_or_else(|_| base.to_path_buf());
        let mut probe = joined.clone();
        loop {
            if let Ok(real) = probe.canonicalize() {
                if !real.starts_with(&base_real) {
                    return Err(escapes());
                }
                break;
            }
            if !probe.pop() {
                break;
            }
        }
        Ok(joined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolution_order() {
        let none_env = |_: &str| None;
        let env = |k: &str| (k == "DEERMEM_DATA_DIR").then(|| "/data".to_owned());
        let empty_env = |_: &str| Some(String::new());
        let home = || Some(PathBuf::from("/home/u"));
        let no_home = || None;
        assert_eq!(
            resolve_root("/cfg", &env, &home),
            Some(PathBuf::from("/cfg"))
        );
        assert_eq!(resolve_root("", &env, &home), Some(PathBuf::from("/data")));
        assert_eq!(
            resolve_root("", &empty_env, &home),
            Some(PathBuf::from("/home/u/.deermem"))
        );
        assert_eq!(
            resolve_root("", &none_env, &home),
            Some(PathBuf::from("/home/u/.deermem"))
        );
        assert_eq!(resolve_root("", &none_env, &no_home), None);
    }

    #[test]
    fn manifest_names() {
        for ok in ["memory.json", "index.json", ".json"] {
            assert!(validate_manifest_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "a/b.json",
            "memory.JSON",
            "memory",
            "../x.json",
            "",
            "a\0.json",
        ] {
            assert!(validate_manifest_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn layout_paths() {
        let layout = Layout {
            root: PathBuf::from("/r"),
            manifest_name: "memory.json".into(),
            strict_user_scope: false,
        };
        let u = UserId::new("alice").unwrap();
        let d = layout.user_dir(Some(&u)).unwrap();
        let a = AgentName::parse("Agent-A").unwrap();
        let id = FactId::new("fact_01HZZZZZZZZZZZZZZZZZZZZZZZ").unwrap();
        assert_eq!(
            d.fact(&a, &id),
            PathBuf::from(
                "/r/users/alice/agents/agent-a/facts/9e/fact_01HZZZZZZZZZZZZZZZZZZZZZZZ.md"
            )
        );
        assert_eq!(
            d.fact_rel(&a, &id),
            "agents/agent-a/facts/9e/fact_01HZZZZZZZZZZZZZZZZZZZZZZZ.md"
        );
        assert_eq!(
            layout.user_dir(None).unwrap().manifest(),
            PathBuf::from("/r/memory.json")
        );
        let strict = Layout {
            strict_user_scope: true,
            ..layout
        };
        assert!(strict.user_dir(None).is_err());
    }

    #[test]
    fn resolve_below_rejects_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        assert!(UserDir::resolve_below(base, "agents/a/facts/x.md", "p").is_ok());
        for bad in ["../x.md", "/etc/passwd", "a/../../x", "", "a\0b"] {
            assert!(UserDir::resolve_below(base, bad, "p").is_err(), "{bad}");
        }
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), base.join("link")).unwrap();
        assert!(UserDir::resolve_below(base, "link/x.md", "p").is_err());
    }
}
