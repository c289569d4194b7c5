//! What runs under a user's locks before a read or write touches its files: taking both locks
//! (creating `users/` as the top of per-user trees in a new root), journal recovery, and the
//! lazy read migrations (the legacy global manifest, legacy agent documents, the old
//! `lead-agent` bucket).

use std::sync::atomic::Ordering;

use deermem_core::{AgentName, Timestamp, UserId};

use super::Inner;
use crate::commit::Notification;
use crate::error::Result;
use crate::journal;
use crate::lock::UserLock;
use crate::manifest::{self, Manifest};
use crate::migrate;
use crate::paths::UserDir;

impl Inner {
    pub(super) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub(super) fn user_dir(&self, user: Option<&UserId>) -> Result<UserDir> {
        self.layout.user_dir(user)
    }

    pub(super) fn lock(&self, udir: &UserDir) -> Result<UserLock> {
        // The first user directory of a new root: create `users/` as the top of per-user trees.
        // Checked until this instance has seen `users/` once, so the write path pays no `stat`.
        if !self.users_dir_ready.load(Ordering::Relaxed)
            && let Some(users) = udir.dir.parent()
            && users == self.layout.root.join("users")
        {
            if !users.is_dir() {
                crate::fsutil::create_dir_all(users)?;
                crate::fsutil::mark_top_directory(users);
            }
            self.users_dir_ready.store(true, Ordering::Relaxed);
        }
        self.locks.acquire(&udir.lock(), self.config.lock_timeout)
    }

    /// Runs `f` on the user's directory under its locks, with the time read before they were
    /// taken.
    pub(super) fn locked<T>(
        &self,
        user: Option<&UserId>,
        f: impl FnOnce(&UserDir, Timestamp) -> Result<T>,
    ) -> Result<T> {
        let udir = self.user_dir(user)?;
        let now = self.now();
        let _lock = self.lock(&udir)?;
        f(&udir, now)
    }

    /// Journal recovery; the caller holds the locks. After an interrupted commit was
    /// rolled back or forward, the user's cached documents are dropped and the journal's scope
    /// is marked dirty: the index was never told about the interrupted commit's facts, and the
    /// next search rebuilds that scope from the files.
    pub(super) fn recover_locked(&self, udir: &UserDir) -> Result<()> {
        let (outcome, agent) = journal::recover(udir)?;
        if outcome != journal::Recovery::Nothing {
            self.invalidate_user(&udir.user);
            if let Some(agent) = agent {
                self.mark_dirty(udir.user.as_ref(), &agent);
            }
        }
        Ok(())
    }

    /// Recovery plus the lazy read migrations; the caller holds the locks. Hands back the
    /// index notifications of what was migrated, and the manifest it read when nothing was
    /// migrated after reading it (so a commit under the same locks need not read it again).
    pub(super) fn read_migrations_locked(
        &self,
        udir: &UserDir,
        agent: Option<&AgentName>,
        now: Timestamp,
    ) -> Result<(Vec<Notification>, Option<Option<Manifest>>)> {
        let mut notes = Vec::new();
        self.recover_locked(udir)?;
        let current = manifest::read_manifest(&udir.manifest())?;
        let global_legacy = current.as_ref().is_some_and(Manifest::needs_migration);
        if global_legacy {
            let default = AgentName::default_bucket();
            let out = migrate::migrate_locked(udir, &default, true, true, false, now)?;
            notes.extend(out.notifications);
        }
        let mut migrated = global_legacy;
        if let Some(agent) = agent {
            if udir.legacy_agent_doc(agent).exists() {
                migrated = true;
                let out = migrate::migrate_locked(udir, agent, false, true, false, now)?;
                notes.extend(out.notifications);
            }
            if agent.is_default() && migrate::has_legacy_default_bucket(udir) {
                migrated = true;
                notes.extend(migrate::migrate_legacy_default_bucket(udir, now)?);
            }
        }
        if !notes.is_empty() {
            self.invalidate_user(&udir.user);
        }
        // The manifest read above is still the current one unless a migration ran.
        Ok((notes, (!migrated).then_some(current)))
    }
}

/// Whether a load must take the locks to recover or migrate first (the manifest as read
/// without them, `None` when not read).
pub(super) fn needs_read_migration(
    udir: &UserDir,
    agent: Option<&AgentName>,
    manifest: Option<&Manifest>,
) -> bool {
    udir.journal().exists()
        || agent.is_some_and(|a| udir.legacy_agent_doc(a).exists())
        || manifest.is_some_and(Manifest::needs_migration)
        || (agent.is_some_and(AgentName::is_default) && migrate::has_legacy_default_bucket(udir))
}
