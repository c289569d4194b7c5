//! Shared helpers: temp roots, fixture copies, tree snapshots, a recording retrieval fake and
//! the Python availability check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deermem_core::ports::Retrieval;
use deermem_core::{
    AgentName, Fact, FactDraft, MatchType, RetrievalError, RetrievalStats, Scope, SearchHit,
    SearchQuery, UserId,
};
use deermem_pycompat::py;
use deermem_storage_file::{FileStorage, FileStorageConfig};
use deermem_testkit::clock::ManualClock;
use serde_json::{Value, json};

pub(crate) fn user(s: &str) -> UserId {
    UserId::new(s).unwrap()
}

pub(crate) fn agent(s: &str) -> AgentName {
    AgentName::parse(s).unwrap()
}

pub(crate) fn draft(v: Value) -> FactDraft {
    FactDraft::try_from(v).unwrap()
}

pub(crate) fn fact(id: &str, content: &str) -> FactDraft {
    draft(
        json!({"id": id, "content": content, "category": "preference", "confidence": 0.9, "source": "manual"}),
    )
}

pub(crate) fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::at("2026-01-01T00:00:00Z"))
}

pub(crate) fn open(root: &Path, clock: &Arc<ManualClock>) -> FileStorage {
    FileStorage::new(FileStorageConfig::new(root), clock.clone(), None).unwrap()
}

pub(crate) fn open_with(
    root: &Path,
    clock: &Arc<ManualClock>,
    retrieval: Arc<dyn Retrieval>,
) -> FileStorage {
    FileStorage::new(FileStorageConfig::new(root), clock.clone(), Some(retrieval)).unwrap()
}

/// The Python reference's fixture roots, committed under `testdata/python-deermem/`.
pub(crate) fn fixtures_dir() -> PathBuf {
    deermem_testkit::fixtures::python_deermem()
}

pub(crate) fn copy_dir(src: &Path, dst: &Path) {
    deermem_testkit::fixtures::copy_tree(src, dst);
}

/// Every file below `root` (relative path → bytes).
pub(crate) fn snapshot(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// Whether `python3` with PyYAML is available; prints the skip reason when not.
pub(crate) fn python_with_yaml() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import yaml"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIP: python3 with PyYAML is not available (python3 -c 'import yaml' failed)");
    }
    ok
}

/// One recorded retrieval call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    Upsert(Option<String>, String, String),
    Remove(Option<String>, String, String),
    Rebuild(usize),
    Clear,
    Close,
}

/// A retrieval fake that records calls and keeps a substring index; it can be told to fail.
/// `(raw user, agent, fact id)` of an indexed document.
type DocKey = (Option<String>, String, String);

#[derive(Debug, Default)]
pub(crate) struct Recording {
    pub(crate) calls: Mutex<Vec<Call>>,
    pub(crate) docs: Mutex<BTreeMap<DocKey, Fact>>,
    pub(crate) fail_upserts: Mutex<Vec<String>>,
    pub(crate) bulk_unsupported: bool,
    /// Answer `indexed_scopes` (so a full rebuild streams scope batches).
    pub(crate) lists_scopes: bool,
    /// Scopes to report once through `take_stale_scopes` (an acknowledged write that failed
    /// later).
    pub(crate) stale: Mutex<Vec<Scope>>,
}

fn key(scope: &Scope) -> (Option<String>, String) {
    (
        scope.user.as_ref().map(|u| u.as_str().to_owned()),
        scope
            .agent
            .as_ref()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default(),
    )
}

impl Recording {
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl Retrieval for Recording {
    fn take_stale_scopes(&self) -> Vec<Scope> {
        std::mem::take(&mut *self.stale.lock().unwrap())
    }

    fn kind(&self) -> &'static str {
        "recording"
    }

    async fn upsert(&self, scope: &Scope, fact: &Fact) -> Result<(), RetrievalError> {
        let (u, a) = key(scope);
        self.calls
            .lock()
            .unwrap()
            .push(Call::Upsert(u.clone(), a.clone(), fact.id.to_string()));
        if self
            .fail_upserts
            .lock()
            .unwrap()
            .contains(&fact.id.to_string())
        {
            return Err(RetrievalError::Backend("injected failure".into()));
        }
        self.docs
            .lock()
            .unwrap()
            .insert((u, a, fact.id.to_string()), fact.clone());
        Ok(())
    }

    async fn remove(&self, scope: &Scope, id: &str) -> Result<(), RetrievalError> {
        let (u, a) = key(scope);
        self.calls
            .lock()
            .unwrap()
            .push(Call::Remove(u.clone(), a.clone(), id.to_owned()));
        self.docs.lock().unwrap().remove(&(u, a, id.to_owned()));
        Ok(())
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        let q = py::lower(py::strip(&query.text));
        let docs = self.docs.lock().unwrap();
        let mut hits: Vec<SearchHit> = docs
            .iter()
            .filter(|((u, a, _), _)| {
                query
                    .scopes
                    .iter()
                    .any(|s| key(s) == (u.clone(), a.clone()))
            })
            .filter(|(_, f)| py::lower(&f.content).contains(&q))
            .map(|(_, f)| SearchHit {
                fact: f.clone(),
                score: 1.0,
                match_type: MatchType::Fts5,
                bm25: None,
            })
            .collect();
        hits.truncate(query.top_k);
        Ok(hits)
    }

    async fn clear(&self, scopes: Option<&[Scope]>) -> Result<(), RetrievalError> {
        self.calls.lock().unwrap().push(Call::Clear);
        let mut docs = self.docs.lock().unwrap();
        match scopes {
            None => docs.clear(),
            Some(list) => {
                let keys: Vec<_> = list.iter().map(key).collect();
                docs.retain(|(u, a, _), _| !keys.contains(&(u.clone(), a.clone())));
            }
        }
        Ok(())
    }

    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError> {
        if self.bulk_unsupported {
            return Err(RetrievalError::Unsupported {
                operation: "rebuild",
                adapter: "recording",
            });
        }
        self.calls.lock().unwrap().push(Call::Rebuild(facts.len()));
        {
            let mut docs = self.docs.lock().unwrap();
            match scopes {
                None => docs.clear(),
                Some(list) => {
                    let keys: Vec<_> = list.iter().map(key).collect();
                    docs.retain(|(u, a, _), _| !keys.contains(&(u.clone(), a.clone())));
                }
            }
            for (s, f) in facts {
                let (u, a) = key(s);
                docs.insert((u, a, f.id.to_string()), f.clone());
            }
        }
        Ok(facts.len())
    }

    async fn indexed_scopes(&self) -> Result<Vec<Scope>, RetrievalError> {
        if !self.lists_scopes {
            return Err(RetrievalError::Unsupported {
                operation: "indexed_scopes",
                adapter: "recording",
            });
        }
        let docs = self.docs.lock().unwrap();
        let mut scopes: Vec<Scope> = Vec::new();
        for (u, a, _) in docs.keys() {
            let scope = Scope::new(u.as_deref().map(user), Some(agent(a)));
            if !scopes.contains(&scope) {
                scopes.push(scope);
            }
        }
        Ok(scopes)
    }

    async fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        Ok(RetrievalStats {
            adapter: "recording".into(),
            total_docs: self.docs.lock().unwrap().len() as u64,
            ..RetrievalStats::default()
        })
    }

    async fn close(&self) {
        self.calls.lock().unwrap().push(Call::Close);
    }
}

/// Holds the user's lock from outside the storage (another open file description, as another
/// process would) until dropped.
pub(crate) fn hold_user_lock(root: &std::path::Path, user: &str) -> std::fs::File {
    let dir = root.join("users").join(user);
    std::fs::create_dir_all(&dir).unwrap();
    let holder = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(".memory.lock"))
        .unwrap();
    holder.lock().unwrap();
    holder
}

/// The path of a fact file under a root, by user bucket (the directory name), agent and id.
pub(crate) fn fact_path(root: &Path, bucket: &str, agent: &str, id: &str) -> PathBuf {
    root.join(format!(
        "users/{bucket}/agents/{agent}/facts/{}/{id}.md",
        deermem_core::FactId::new(id).unwrap().shard()
    ))
}
