//! The file storage's administrative operations, which are not port methods: the explicit
//! v1 → v2 migration, listing the users a root holds, and comparing the derived index with
//! the fact files.

use std::collections::{BTreeMap, BTreeSet};

use deermem_core::document::{DOCUMENT_VERSION, EMPTY_DOCUMENT_VERSION};
use deermem_core::ports::MigrationReport;
use deermem_core::{AgentName, Fact, IndexedDoc, RetrievalError, Scope, StorageError, UserId};

use super::index::scope_label;
use super::{FileStorage, Inner};
use crate::commit::Notification;
use crate::error::Result;
use crate::journal;
use crate::manifest;
use crate::markdown;
use crate::migrate;

impl FileStorage {
    /// Migrates legacy v1 data of the user into the agent's bucket (explicit migration), or
    /// with `dry_run` only reports whether it would. An administrative operation of this
    /// adapter (`deermem migrate`); normal reads migrate lazily on their own.
    ///
    /// # Errors
    /// `Corrupt` for conflicting summaries or mismatched backups (nothing modified).
    pub async fn migrate(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        dry_run: bool,
    ) -> std::result::Result<MigrationReport, StorageError> {
        let (u, a) = (user.cloned(), agent.clone());
        self.run_write(user, Some(agent), move |inner| {
            inner.migrate(u.as_ref(), &a, dry_run)
        })
        .await
    }

    /// The raw ids of the users this root holds data for (those it can name).
    ///
    /// # Errors
    /// `Io` when the root cannot be read.
    pub async fn list_users(&self) -> std::result::Result<Vec<UserId>, StorageError> {
        self.run(|inner| inner.list_users()).await
    }

    /// Compares the derived index with the canonical fact files, scope by scope: facts the
    /// index lacks, documents it holds for facts that are gone, and documents of an older
    /// revision. A process killed between its durable commit and its index write leaves the
    /// index behind without any record of it, so an honest status has to look. `None` when no
    /// index is configured or the adapter cannot list its documents.
    ///
    /// Reads every fact file: an operator's check (`deermem index status`), not a hot path.
    ///
    /// # Errors
    /// The index cannot be listed (`Unavailable`), or the facts cannot be read.
    pub async fn verify_index(
        &self,
    ) -> std::result::Result<Option<IndexVerification>, StorageError> {
        let Some(retrieval) = self.inner.retrieval.clone() else {
            return Ok(None);
        };
        let indexed = match retrieval.inventory().await {
            Ok(docs) => docs,
            Err(RetrievalError::Unsupported { .. }) => return Ok(None),
            Err(e) => {
                return Err(StorageError::Io {
                    context: "listing the search index".into(),
                    source: std::io::Error::other(e.to_string()),
                });
            }
        };
        let (records, unreadable) = self.run(|inner| Ok(inner.collect_all_for_index())).await?;
        Ok(Some(IndexVerification::compare(
            &records, &indexed, unreadable,
        )))
    }
}

impl Inner {
    fn migrate(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        dry_run: bool,
    ) -> Result<(MigrationReport, Vec<Notification>)> {
        let udir = self.user_dir(user)?;
        let now = self.now();
        // A dry run changes nothing on disk: it does not create the lock file (no writer can
        // be mid-commit where none ever locked) and does not recover a journal.
        let _lock = if dry_run && !udir.lock().exists() {
            None
        } else {
            Some(self.lock(&udir)?)
        };
        if !dry_run {
            self.recover_locked(&udir)?;
            journal::sweep_temp_files(&udir);
        }
        let out = migrate::migrate_locked(&udir, agent, true, true, dry_run, now)?;
        if out.migrated && !dry_run {
            self.invalidate_user(&udir.user);
        }
        let m = manifest::read_manifest(&udir.manifest())?;
        let (to_version, revision) = match &m {
            Some(m) if !dry_run => (m.version(), m.revision),
            Some(m) => (
                if out.migrated {
                    DOCUMENT_VERSION.to_owned()
                } else {
                    m.version()
                },
                m.revision,
            ),
            None => (EMPTY_DOCUMENT_VERSION.to_owned(), 0),
        };
        Ok((
            MigrationReport {
                migrated: out.migrated,
                from_version: out.from_version,
                to_version,
                revision,
                migrated_facts: out.facts,
                dry_run,
            },
            out.notifications,
        ))
    }

    fn list_users(&self) -> Result<Vec<UserId>> {
        let mut out: BTreeSet<UserId> = BTreeSet::new();
        for u in crate::fsutil::sorted_entries(&self.layout.root.join("users"))? {
            if !u.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let bucket = u.file_name().to_string_lossy().into_owned();
            let mut learned: Option<UserId> = None;
            'agents: for a in crate::fsutil::sorted_entries(&u.path().join("agents"))? {
                let Ok(files) = crate::fsutil::markdown_files(&a.path().join("facts")) else {
                    continue;
                };
                for f in files {
                    let Ok(bytes) = std::fs::read(&f) else {
                        continue;
                    };
                    let Ok(parsed) = markdown::parse(&f, &bytes) else {
                        continue;
                    };
                    if let Some(raw) = parsed.user_id.as_str()
                        && let Ok(id) = UserId::new(raw)
                        && id.bucket() == bucket
                    {
                        learned = Some(id);
                        break 'agents;
                    }
                }
            }
            match learned.or_else(|| {
                UserId::new(bucket.clone())
                    .ok()
                    .filter(|u| u.bucket() == bucket)
            }) {
                Some(id) => {
                    out.insert(id);
                }
                None => {
                    tracing::warn!(bucket = %bucket, "skipping a users/ entry that is not a user bucket")
                }
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// How the derived index compares with the canonical facts ([`FileStorage::verify_index`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IndexVerification {
    /// Readable fact files.
    pub canonical_facts: usize,
    /// Fact files that could not be read (they are never indexed; the logs name them).
    pub unreadable_facts: usize,
    /// Documents in the index.
    pub indexed_docs: usize,
    /// Scopes where the two differ, sorted by label.
    pub stale_scopes: Vec<StaleScope>,
}

/// One scope whose index documents differ from its fact files.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StaleScope {
    /// `user|agent`.
    pub scope: String,
    /// Facts on disk the index lacks.
    pub missing: usize,
    /// Index documents whose fact is gone.
    pub extra: usize,
    /// Index documents of another revision than the fact on disk.
    pub outdated: usize,
}

impl IndexVerification {
    fn compare(records: &[(Scope, Fact)], indexed: &[IndexedDoc], unreadable: usize) -> Self {
        type Key = (Option<UserId>, Option<AgentName>);
        let mut canonical: BTreeMap<Key, BTreeMap<&str, u64>> = BTreeMap::new();
        for (scope, fact) in records {
            canonical
                .entry((scope.user.clone(), scope.agent.clone()))
                .or_default()
                .insert(fact.id.as_str(), fact.revision);
        }
        let mut in_index: BTreeMap<Key, BTreeMap<&str, Option<u64>>> = BTreeMap::new();
        for doc in indexed {
            in_index
                .entry((doc.scope.user.clone(), doc.scope.agent.clone()))
                .or_default()
                .insert(doc.fact_id.as_str(), doc.revision);
        }
        let empty_c = BTreeMap::new();
        let empty_i = BTreeMap::new();
        let keys: BTreeSet<&Key> = canonical.keys().chain(in_index.keys()).collect();
        let mut stale_scopes = Vec::new();
        for key in keys {
            let c = canonical.get(key).unwrap_or(&empty_c);
            let i = in_index.get(key).unwrap_or(&empty_i);
            let missing = c.keys().filter(|id| !i.contains_key(*id)).count();
            let extra = i.keys().filter(|id| !c.contains_key(*id)).count();
            let outdated = c
                .iter()
                .filter(|(id, rev)| i.get(*id).is_some_and(|r| *r != Some(**rev)))
                .count();
            if missing + extra + outdated > 0 {
                stale_scopes.push(StaleScope {
                    scope: scope_label(key.0.as_ref(), key.1.as_ref()),
                    missing,
                    extra,
                    outdated,
                });
            }
        }
        stale_scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        Self {
            canonical_facts: records.len(),
            unreadable_facts: unreadable,
            indexed_docs: indexed.len(),
            stale_scopes,
        }
    }
}
