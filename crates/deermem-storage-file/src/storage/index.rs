//! Keeping the derived index in step with the files: commit notifications sent after the locks
//! are released, the dirty scopes (a failed notification, an index write that failed to apply
//! later, a recovered commit), and the records of every fact file for a full rebuild.

use std::path::{Path, PathBuf};

use deermem_core::{AgentName, Fact, Scope, Timestamp, UserId};
use serde_json::Value;

use super::{FileStorage, Inner};
use crate::commit::Notification;
use crate::error::{Error, Result};
use crate::markdown::{self, Expected};

/// One listed fact file and its index record (or why it could not be indexed).
type IndexedFile = (PathBuf, Result<(Scope, Fact)>);

impl FileStorage {
    /// Sends queued notifications to the index; failures mark their scope dirty.
    pub(super) async fn dispatch(&self, notes: Vec<Notification>) {
        let Some(retrieval) = &self.inner.retrieval else {
            return;
        };
        for note in notes {
            let (scope, result) = match &note {
                Notification::Upsert { scope, fact } => {
                    (scope, retrieval.upsert(scope, fact).await)
                }
                Notification::Remove { scope, id } => (scope, retrieval.remove(scope, id).await),
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, ?scope, "retrieval notification failed; scope marked dirty");
                if let Some(agent) = &scope.agent {
                    self.inner.mark_dirty(scope.user.as_ref(), agent);
                }
            }
        }
    }

    /// Marks dirty the scopes whose acknowledged index writes failed to apply later; `true`
    /// when one of `among` (or any, without a list) was among them.
    pub(super) fn absorb_stale_scopes(&self, among: Option<&[Scope]>) -> bool {
        let Some(retrieval) = &self.inner.retrieval else {
            return false;
        };
        let stale = retrieval.take_stale_scopes();
        if stale.is_empty() {
            return false;
        }
        let hit = among.is_none_or(|list| stale.iter().any(|s| list.contains(s)));
        let mut dirty = self.inner.dirty.lock();
        for s in stale {
            if let Some(agent) = s.agent {
                tracing::warn!(user = ?s.user, agent = %agent, "index writes of a scope failed; scope marked dirty");
                dirty.insert((s.user, agent));
            }
        }
        hit
    }
}

impl Inner {
    /// Marks a scope dirty (when an index is configured): its next search rebuilds it from the
    /// files first.
    pub(super) fn mark_dirty(&self, user: Option<&UserId>, agent: &AgentName) {
        if self.retrieval.is_some() {
            self.dirty.lock().insert((user.cloned(), agent.clone()));
        }
    }

    /// Every fact file of the layout, for a full index rebuild or check (restricted to the
    /// memory directories, where the reference globs every Markdown file under the home), and
    /// how many could not be read.
    pub(super) fn collect_all_for_index(&self) -> (Vec<(Scope, Fact)>, usize) {
        self.read_for_index(&self.agent_dirs())
    }

    /// Every agent directory of the layout (the legacy root's, then each user bucket's), in
    /// order: what a full rebuild reads, a batch at a time.
    pub(super) fn agent_dirs(&self) -> Vec<AgentDir> {
        let mut roots: Vec<(Option<String>, PathBuf)> = vec![(None, self.layout.root.clone())];
        if let Ok(users) = crate::fsutil::sorted_entries(&self.layout.root.join("users")) {
            for u in users {
                if u.file_type().is_ok_and(|t| t.is_dir()) {
                    roots.push((Some(u.file_name().to_string_lossy().into_owned()), u.path()));
                }
            }
        }
        let mut agent_dirs: Vec<AgentDir> = Vec::new();
        for (bucket, dir) in roots {
            let Ok(agents) = crate::fsutil::sorted_entries(&dir.join("agents")) else {
                continue;
            };
            for a in agents {
                if !a.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = a.file_name().to_string_lossy().into_owned();
                agent_dirs.push(AgentDir {
                    bucket: bucket.clone(),
                    agent: name,
                    facts: a.path().join("facts"),
                });
            }
        }
        agent_dirs
    }

    /// The index records of the fact files of `dirs` (each directory listed and read
    /// independently, possibly on two threads, merged in order), and how many could not be
    /// read.
    pub(super) fn read_for_index(&self, dirs: &[AgentDir]) -> (Vec<(Scope, Fact)>, usize) {
        let now = self.now();
        let per_agent = crate::par::map_in_order(dirs, |d| {
            let Some(dir) = crate::walk::FactsDir::open(&d.facts)? else {
                return Ok(Vec::new());
            };
            let mut buf = Vec::new();
            let mut out = Vec::new();
            for entry in dir.entries() {
                out.extend(dir.read_entry(entry, &mut buf, |file, read, bytes| {
                    let r = read
                        .map_err(|e| Error::FactParse {
                            path: file.clone(),
                            reason: e.to_string(),
                        })
                        .and_then(|()| {
                            index_record(&file, bytes, d.bucket.as_deref(), &d.agent, now)
                        });
                    (file, r)
                })?);
            }
            Ok(out)
        });
        let mut records = Vec::new();
        let mut failed = 0;
        for listed in per_agent {
            let listed: Result<Vec<IndexedFile>> = listed;
            match listed {
                Ok(files) => {
                    for (file, r) in files {
                        match r {
                            Ok(r) => records.push(r),
                            Err(e) => {
                                failed += 1;
                                tracing::warn!(path = %file.display(), error = %e, "fact not indexed");
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list facts for the index");
                    failed += 1;
                }
            }
        }
        (records, failed)
    }
}

/// One agent directory of the layout: its user bucket (`None` for the legacy root), its
/// directory name and its `facts/` folder.
#[derive(Clone, Debug)]
pub(super) struct AgentDir {
    bucket: Option<String>,
    agent: String,
    facts: PathBuf,
}

/// Parses and validates one file for the full index rebuild: the owner is checked through the
/// bucket (original ids such as e-mail addresses are accepted).
fn index_record(
    path: &Path,
    bytes: &[u8],
    bucket: Option<&str>,
    agent_dir: &str,
    now: Timestamp,
) -> Result<(Scope, Fact)> {
    let parsed = markdown::parse(path, bytes)?;
    let user = match (&parsed.user_id, bucket) {
        (Value::Null, None) => None,
        (Value::String(s), Some(b)) => {
            let u = UserId::new(s.as_str())?;
            if u.bucket() != b {
                return Err(Error::ScopeMismatch {
                    path: path.to_path_buf(),
                    expected: format!("a user of bucket {b:?}"),
                    found: s.clone(),
                });
            }
            Some(u)
        }
        (other, b) => {
            return Err(Error::ScopeMismatch {
                path: path.to_path_buf(),
                expected: format!("user bucket {b:?}"),
                found: other.to_string(),
            });
        }
    };
    let agent = AgentName::parse(agent_dir)?;
    let expected = Expected {
        user: user.as_ref(),
        agent: agent.as_str(),
    };
    let loaded = markdown::validate(path, parsed, expected, now)?;
    Ok((Scope::new(user, Some(agent)), loaded.fact))
}

/// A scope's label in status reports: `user|agent`.
pub(super) fn scope_label(user: Option<&UserId>, agent: Option<&AgentName>) -> String {
    format!(
        "{}|{}",
        user.map_or("", UserId::as_str),
        agent.map_or("", AgentName::as_str)
    )
}
