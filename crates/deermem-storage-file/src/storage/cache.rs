//! The load path and its document cache: a load answers from the cache when a few `stat` calls
//! prove the cached document current, or when the re-read manifest still carries the
//! reference's validation token; otherwise it reads a consistent snapshot under the locks
//! (after recovery and the read migrations) and remembers it.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::SystemTime;

use deermem_core::{AgentName, MemoryDocument, StorageError, Timestamp, UserId};

use super::locked::needs_read_migration;
use super::{FileStorage, Inner};
use crate::commit::Notification;
use crate::error::Result;
use crate::manifest::{self, Signature, StatToken};
use crate::markdown;
use crate::paths::UserDir;

type CacheKey = (Option<UserId>, Option<AgentName>);

/// The cached documents of a storage: at most `cache_max_scopes` of them, the least recently
/// loaded forgotten first (a forgotten scope is read from its files again on its next load).
#[derive(Debug)]
pub(super) struct Documents {
    entries: lru::LruCache<CacheKey, CacheEntry>,
    max: usize,
}

/// What the load cache holds now, and its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheUsage {
    /// Scope documents cached.
    pub scopes: usize,
    /// The bound on them (`cache_max_scopes`).
    pub max_scopes: usize,
}

impl Documents {
    /// An empty cache of at most `max` scopes (at least one).
    pub(super) fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            entries: lru::LruCache::new(NonZeroUsize::new(max).unwrap_or(NonZeroUsize::MIN)),
            max,
        }
    }

    pub(super) fn usage(&self) -> CacheUsage {
        CacheUsage {
            scopes: self.entries.len(),
            max_scopes: self.max,
        }
    }

    /// Forgets every scope of `user`.
    fn forget_user(&mut self, user: &Option<UserId>) {
        let keys: Vec<CacheKey> = self
            .entries
            .iter()
            .filter(|((u, _), _)| u == user)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.entries.pop(&k);
        }
    }
}

#[derive(Debug)]
pub(super) struct CacheEntry {
    /// Shared so a hit clones it outside the cache lock.
    doc: Arc<MemoryDocument>,
    /// The reference's validation token (mtime, size, revision), checked by re-reading.
    sig: Signature,
    /// The manifest's `stat` when the document was read, and when that `stat` was taken: lets
    /// a load skip re-reading the manifest (see [`manifest::StatToken::vouches_for`]).
    stat: Option<StatToken>,
    observed_at: SystemTime,
}

impl FileStorage {
    /// Loads a document (from the cache unless `force`) and dispatches the notifications of
    /// the read migrations the load ran.
    pub(super) async fn load_impl(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        force: bool,
    ) -> std::result::Result<MemoryDocument, StorageError> {
        if !force && let Some(doc) = self.inner.cached(user, agent) {
            return Ok(doc);
        }
        let (user, agent) = (user.cloned(), agent.cloned());
        let (doc, notes) = self
            .run(move |inner| inner.load(user.as_ref(), agent.as_ref(), force))
            .await?;
        self.dispatch(notes).await;
        Ok(doc)
    }
}

impl Inner {
    pub(super) fn invalidate_user(&self, user: &Option<UserId>) {
        self.cache.lock().forget_user(user);
    }

    /// The cached document when a few `stat` calls prove it current: no journal, no legacy
    /// layout to migrate, and a manifest whose `stat` the cache entry vouches for. Runs on the
    /// caller's thread (no file is opened or read); `None` sends the load down the full path,
    /// which re-reads the manifest and compares its revision.
    fn cached(&self, user: Option<&UserId>, agent: Option<&AgentName>) -> Option<MemoryDocument> {
        let udir = self.user_dir(user).ok()?;
        if needs_read_migration(&udir, agent, None) {
            return None;
        }
        let now = manifest::stat_token(&udir.manifest()).ok()?;
        let doc = {
            let mut cache = self.cache.lock();
            let entry = cache.entries.get(&(user.cloned(), agent.cloned()))?;
            let current = match (&entry.stat, &now) {
                (None, None) => entry.sig.is_none(),
                (Some(then), Some(now)) => then.vouches_for(now, entry.observed_at),
                _ => false,
            };
            if !current {
                return None;
            }
            Arc::clone(&entry.doc)
        };
        Some(MemoryDocument::clone(&doc))
    }

    fn read_document_locked(
        &self,
        udir: &UserDir,
        agent: Option<&AgentName>,
        now: Timestamp,
    ) -> Result<(MemoryDocument, Signature)> {
        let (manifest, sig) = manifest::read_with_signature(&udir.manifest())?;
        let facts = match agent {
            Some(a) => markdown::load_all(&udir.facts(a), udir.expected(a), now)?
                .into_iter()
                .map(|l| l.fact)
                .collect(),
            None => Vec::new(),
        };
        let doc = manifest::document(manifest.as_ref(), facts, now)?;
        Ok((doc, sig))
    }

    fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        force: bool,
    ) -> Result<(MemoryDocument, Vec<Notification>)> {
        let udir = self.user_dir(user)?;
        let now = self.now();
        // The stat is taken before the read it vouches for.
        let observed_at = SystemTime::now();
        let token = manifest::stat_token(&udir.manifest()).ok().flatten();
        let (manifest, mut sig) = manifest::read_with_signature(&udir.manifest())?;
        let mut notes = Vec::new();
        if needs_read_migration(&udir, agent, manifest.as_ref()) {
            let _lock = self.lock(&udir)?;
            notes = self.read_migrations_locked(&udir, agent, now)?.0;
            sig = manifest::read_with_signature(&udir.manifest())?.1;
        }
        let key: CacheKey = (user.cloned(), agent.cloned());
        if !force {
            let hit = {
                let mut cache = self.cache.lock();
                match cache.entries.get_mut(&key) {
                    Some(entry) if entry.sig == sig => {
                        // Still current by the reference's token; when the stat taken before
                        // the read describes the same file, remember it for the stat path.
                        if notes.is_empty()
                            && let (Some(t), Some((mtime_ns, size, _))) = (token, sig)
                            && t.mtime_ns == mtime_ns
                            && t.size == size
                        {
                            entry.stat = Some(t);
                            entry.observed_at = observed_at;
                        }
                        Some(Arc::clone(&entry.doc))
                    }
                    _ => None,
                }
            };
            if let Some(doc) = hit {
                return Ok((MemoryDocument::clone(&doc), notes));
            }
        }
        // Miss: read a consistent snapshot under the locks (a user never written to needs no
        // lock and leaves no trace on disk).
        let (doc, sig, stat, observed_at) = if udir.dir.is_dir() {
            let _lock = self.lock(&udir)?;
            // A journal may have appeared since the check above; recovery also sweeps leftovers
            // of commits that crashed before their journal was durable.
            notes.extend(self.read_migrations_locked(&udir, agent, now)?.0);
            // Under the lock no cooperating writer can replace the manifest between this stat
            // and the read below.
            let observed_at = SystemTime::now();
            let stat = manifest::stat_token(&udir.manifest()).ok().flatten();
            let (doc, sig) = self.read_document_locked(&udir, agent, now)?;
            (doc, sig, stat, observed_at)
        } else {
            (MemoryDocument::empty(now), None, None, observed_at)
        };
        let shared = Arc::new(doc);
        self.cache.lock().entries.put(
            key,
            CacheEntry {
                doc: Arc::clone(&shared),
                sig,
                stat,
                observed_at,
            },
        );
        Ok((MemoryDocument::clone(&shared), notes))
    }
}
