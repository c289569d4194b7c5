//! Migration of the pre-isolation shared layout (`{root}/memory.json`, `{root}/agents/{name}/`)
//! into one user's bucket (`{root}/users/{bucket}/...`), and the read-only fallback to the
//! legacy custom-agent definitions until that migration has run.
//!
//! [`migrate_user_isolation`] is the library half of `deermem migrate --user-isolation`. It
//! keeps every file: legacy entries are moved (a `rename`, or across filesystems a durable copy
//! that is fsynced before the original is removed), never overwritten; where the destination
//! already exists the legacy copy goes to `{root}/migration-conflicts/` for manual review. A
//! second run finds nothing left to move and changes nothing; a dry run only plans.
//!
//! Markdown facts written by DeerMem without a user (`user_id: null` in the front matter) are
//! rescoped to the target user as they arrive in the bucket, because the storage rejects an
//! unscoped fact inside a user bucket as corruption (see `docs/compat.md`, section "Gateway",
//! which lists this module's differences from the reference script).

use std::fmt;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use deermem_core::{AgentName, StorageError, UserId};
use serde_json::Value;

use crate::error::Error;
use crate::fsutil;
use crate::lock::LockRegistry;
use crate::paths::{AGENT_CONFIG_FILE, BACKUP_SUFFIX, JOURNAL_FILE, JOURNAL_SPARE_FILE, LOCK_FILE};

/// Where legacy copies that could not be moved into place are kept for manual review.
pub const CONFLICTS_DIR: &str = "migration-conflicts";

/// The custom-agent persona file that, like `config.yaml`, marks an agent definition.
pub const AGENT_SOUL_FILE: &str = "SOUL.md";

/// How long the migration waits for the storage locks of the legacy root and of the user.
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// How many numbered alternatives are tried for a conflict destination that is taken.
const MAX_CONFLICT_SUFFIX: usize = 1000;

/// How the migration runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolationOptions {
    /// Only plan: report what would move, touch nothing.
    pub dry_run: bool,
    /// The manifest name (`memory.manifest_filename`, default `memory.json`).
    pub manifest_filename: String,
}

impl Default for IsolationOptions {
    fn default() -> Self {
        Self {
            dry_run: false,
            manifest_filename: "memory.json".to_owned(),
        }
    }
}

/// What one report item is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IsolationItemKind {
    /// The legacy user-global manifest `{root}/{manifest}`.
    Manifest,
    /// The legacy manifest's v1 backup `{root}/{manifest}.v1.bak`.
    ManifestBackup,
    /// One legacy agent directory `{root}/agents/{name}` (the name as found on disk).
    Agent(String),
}

impl fmt::Display for IsolationItemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Manifest => f.write_str("manifest"),
            Self::ManifestBackup => f.write_str("manifest backup"),
            Self::Agent(name) => write!(f, "agent {name}"),
        }
    }
}

/// What happened to one item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IsolationAction {
    /// Moved to its place in the user's bucket.
    Moved,
    /// The destination already existed: the legacy copy was moved to the conflicts folder
    /// (the item's `destination`) for manual review.
    Conflict {
        /// The existing entry that took precedence.
        existing: PathBuf,
    },
    /// Dry run: would be moved to `destination`.
    WouldMove,
    /// Dry run: the destination exists, so the legacy copy would go to the conflicts folder.
    WouldConflict {
        /// The existing entry that would take precedence.
        existing: PathBuf,
    },
    /// Nothing left at the legacy place; the bucket already holds the destination.
    AlreadyMigrated,
    /// Not moved; the legacy entry is untouched.
    Failed {
        /// Why.
        reason: String,
    },
}

impl IsolationAction {
    /// The action's short name: `moved`, `conflict`, `would-move`, `would-conflict`,
    /// `already-migrated` or `failed`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Moved => "moved",
            Self::Conflict { .. } => "conflict",
            Self::WouldMove => "would-move",
            Self::WouldConflict { .. } => "would-conflict",
            Self::AlreadyMigrated => "already-migrated",
            Self::Failed { .. } => "failed",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolationItem {
    /// What the item is.
    pub kind: IsolationItemKind,
    /// The legacy path.
    pub source: PathBuf,
    /// Where it went (or would go): its place in the bucket, or the conflicts folder.
    pub destination: PathBuf,
    /// What happened.
    pub action: IsolationAction,
    /// Extra facts worth a line (rescoped fact files, facts of another user...).
    pub notes: Vec<String>,
}

impl fmt::Display for IsolationItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (src, dst) = (self.source.display(), self.destination.display());
        match &self.action {
            IsolationAction::Moved => write!(f, "{}: moved {src} -> {dst}", self.kind)?,
            IsolationAction::Conflict { existing } => write!(
                f,
                "{}: CONFLICT: {} already exists; legacy copy {src} moved to {dst} for manual review",
                self.kind,
                existing.display()
            )?,
            IsolationAction::WouldMove => write!(f, "{}: would move {src} -> {dst}", self.kind)?,
            IsolationAction::WouldConflict { existing } => write!(
                f,
                "{}: would CONFLICT: {} already exists; legacy copy {src} would move to {dst} for manual review",
                self.kind,
                existing.display()
            )?,
            IsolationAction::AlreadyMigrated => {
                write!(f, "{}: already migrated ({dst})", self.kind)?;
            }
            IsolationAction::Failed { reason } => {
                write!(f, "{}: FAILED: {src}: {reason}", self.kind)?;
            }
        }
        for note in &self.notes {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

/// Counts per outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IsolationSummary {
    /// Moved into the bucket.
    pub migrated: usize,
    /// Moved to the conflicts folder.
    pub conflicts: usize,
    /// Dry run: would move or would conflict.
    pub planned: usize,
    /// Already migrated.
    pub current: usize,
    /// Failed.
    pub failed: usize,
}

impl fmt::Display for IsolationSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Summary: migrated={} conflicts={} planned={} current={} failed={}",
            self.migrated, self.conflicts, self.planned, self.current, self.failed
        )
    }
}

/// The outcome of [`migrate_user_isolation`]: one item per legacy entry, then the counts.
/// `Display` prints one line per item and the summary line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolationReport {
    /// The storage root.
    pub root: PathBuf,
    /// The bucket that received the legacy data (`users/{bucket}`).
    pub bucket: String,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// One entry per legacy item, in the order handled.
    pub items: Vec<IsolationItem>,
}

impl IsolationReport {
    /// The counts per outcome.
    pub fn summary(&self) -> IsolationSummary {
        let mut s = IsolationSummary::default();
        for item in &self.items {
            match item.action {
                IsolationAction::Moved => s.migrated += 1,
                IsolationAction::Conflict { .. } => s.conflicts += 1,
                IsolationAction::WouldMove | IsolationAction::WouldConflict { .. } => {
                    s.planned += 1;
                }
                IsolationAction::AlreadyMigrated => s.current += 1,
                IsolationAction::Failed { .. } => s.failed += 1,
            }
        }
        s
    }

    /// Whether any item failed.
    pub fn has_failures(&self) -> bool {
        self.items
            .iter()
            .any(|i| matches!(i.action, IsolationAction::Failed { .. }))
    }

    /// The process exit code, as the Markdown migration's: 1 if any item failed, else 0.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.has_failures())
    }
}

impl fmt::Display for IsolationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.items.is_empty() {
            writeln!(
                f,
                "No legacy shared memory or agents under {}; nothing to migrate.",
                self.root.display()
            )?;
        }
        for item in &self.items {
            writeln!(f, "{item}")?;
        }
        write!(f, "{}", self.summary())
    }
}

/// Moves the pre-isolation shared layout under `root` into `user`'s bucket.
///
/// Handled, in this order:
/// 1. `{root}/{manifest}` → `{root}/users/{bucket}/{manifest}`, as is (v1 or v2; the storage's
///    lazy v1 → v2 migration handles it on first read); conflict copy:
///    `{root}/migration-conflicts/{manifest}`.
/// 2. `{root}/{manifest}.v1.bak`, likewise.
/// 3. Every directory `{root}/agents/{name}/` (memory JSON, `SOUL.md`, `config.yaml`, `facts/`,
///    everything in it) → `{root}/users/{bucket}/agents/{name lowercased}/`; conflict copy:
///    `{root}/migration-conflicts/agents/{name}/`. Plain files directly in `{root}/agents` are
///    left alone; the folder is removed once empty.
///
/// A conflict destination that is itself taken gets a numbered name (`{name}.2`, ...). Markdown
/// facts without a user in their front matter are rescoped to `user` once in the bucket (notes
/// say how many). Both storage locks (the legacy root's and the user's) are held while moving.
///
/// # Errors
/// An invalid manifest name; a root that is not a directory; an operation journal left in the
/// legacy root by an interrupted write (recover it first, nothing is moved); a lock timeout;
/// an I/O error while listing. A failure to move one item is reported in that item (and the
/// others are still handled), not as an error.
pub fn migrate_user_isolation(
    root: &Path,
    user: &UserId,
    options: &IsolationOptions,
) -> Result<IsolationReport, StorageError> {
    crate::paths::validate_manifest_name(&options.manifest_filename)?;
    let mut report = IsolationReport {
        root: root.to_path_buf(),
        bucket: user.bucket().to_owned(),
        dry_run: options.dry_run,
        items: Vec::new(),
    };
    match fs::metadata(root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(StorageError::invalid(
                "storage_path",
                format!("{} is not a directory", root.display()),
            ));
        }
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(Error::io("Failed to stat", root, e).into()),
    }
    let journal = root.join(JOURNAL_FILE);
    if exists(&journal)? {
        return Err(StorageError::corrupt(format!(
            "{} records an interrupted write of the legacy shared layout; let DeerMem recover it \
             (any read of the user-less layout does) before migrating. Nothing was moved.",
            journal.display()
        )));
    }
    let bucket_dir = root.join("users").join(user.bucket());
    let conflicts = root.join(CONFLICTS_DIR);
    let manifest = &options.manifest_filename;
    let backup = format!("{manifest}{BACKUP_SUFFIX}");

    let mut plan: Vec<Planned> = Vec::new();
    for (kind, name) in [
        (IsolationItemKind::Manifest, manifest.as_str()),
        (IsolationItemKind::ManifestBackup, backup.as_str()),
    ] {
        let source = root.join(name);
        let target = bucket_dir.join(name);
        match fs::symlink_metadata(&source) {
            Ok(m) if m.is_dir() => report.items.push(failed(
                kind,
                source,
                target,
                "expected a file, found a directory".into(),
            )),
            Ok(_) => plan.push(Planned {
                kind,
                source,
                target,
                conflict: conflicts.join(name),
            }),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if kind == IsolationItemKind::Manifest && exists(&target)? {
                    report.items.push(IsolationItem {
                        kind,
                        source,
                        destination: target,
                        action: IsolationAction::AlreadyMigrated,
                        notes: Vec::new(),
                    });
                }
            }
            Err(e) => report
                .items
                .push(failed(kind, source, target, format!("cannot stat: {e}"))),
        }
    }
    let legacy_agents = root.join("agents");
    for entry in fsutil::sorted_entries(&legacy_agents).map_err(StorageError::from)? {
        let source = entry.path();
        if !source.is_dir() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            report.items.push(failed(
                IsolationItemKind::Agent(entry.file_name().to_string_lossy().into_owned()),
                source.clone(),
                source,
                "the directory name is not UTF-8; move it by hand".into(),
            ));
            continue;
        };
        plan.push(Planned {
            target: bucket_dir.join("agents").join(name.to_lowercase()),
            conflict: conflicts.join("agents").join(&name),
            kind: IsolationItemKind::Agent(name),
            source,
        });
    }
    if plan.is_empty() {
        return Ok(report);
    }

    // Hold both storage locks while moving, so no DeerMem process writes either side.
    let _locks = if options.dry_run {
        None
    } else {
        let registry = LockRegistry::default();
        let legacy = registry
            .acquire(&root.join(LOCK_FILE), LOCK_TIMEOUT)
            .map_err(StorageError::from)?;
        let bucket = registry
            .acquire(&bucket_dir.join(LOCK_FILE), LOCK_TIMEOUT)
            .map_err(StorageError::from)?;
        Some((legacy, bucket))
    };

    for planned in plan {
        report.items.push(planned.run(user, options.dry_run));
    }
    if !options.dry_run {
        // The journal's spare inode of the user-less layout (never read; see
        // `fsutil::write_recycled`) has no use once that layout is gone.
        let spare = root.join(JOURNAL_SPARE_FILE);
        if let Err(e) = fsutil::remove_file_if_exists(&spare) {
            tracing::debug!(path = %spare.display(), error = %e, "could not remove the journal spare");
        }
    }
    if !options.dry_run && is_empty_dir(&legacy_agents) {
        match fs::remove_dir(&legacy_agents) {
            Ok(()) => fsutil::fsync_dir(root).map_err(StorageError::from)?,
            Err(e) => tracing::warn!(
                path = %legacy_agents.display(),
                error = %e,
                "could not remove the empty legacy agents folder"
            ),
        }
    }
    Ok(report)
}

/// The legacy shared location of a custom agent's definition, `{root}/agents/{name}/`, when it
/// exists and holds a definition (`config.yaml` or `SOUL.md`). Read-only: use it only as a
/// fallback while the per-user definition does not exist (see [`resolve_agent_config_dir`]).
/// The reserved default bucket is not a custom agent and has none.
pub fn legacy_agent_config_dir(root: &Path, agent: &AgentName) -> Option<PathBuf> {
    if agent.is_default() {
        return None;
    }
    let dir = root.join("agents").join(agent.as_str());
    holds_agent_definition(&dir).then_some(dir)
}

/// Where a custom agent's definition was found by [`resolve_agent_config_dir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfigDir {
    /// The directory holding `config.yaml` and/or `SOUL.md`.
    pub path: PathBuf,
    /// `true` for the read-only legacy shared layout (not yet migrated).
    pub legacy: bool,
}

/// The directory of `user`'s definition of `agent`: the per-user
/// `{root}/users/{bucket}/agents/{name}/` when it holds `config.yaml` or `SOUL.md`, else the
/// legacy shared `{root}/agents/{name}/` (read-only fallback for installations not migrated
/// yet), else `None`.
pub fn resolve_agent_config_dir(
    root: &Path,
    user: &UserId,
    agent: &AgentName,
) -> Option<AgentConfigDir> {
    if agent.is_default() {
        return None;
    }
    let own = root
        .join("users")
        .join(user.bucket())
        .join("agents")
        .join(agent.as_str());
    if holds_agent_definition(&own) {
        return Some(AgentConfigDir {
            path: own,
            legacy: false,
        });
    }
    legacy_agent_config_dir(root, agent).map(|path| AgentConfigDir { path, legacy: true })
}

fn holds_agent_definition(dir: &Path) -> bool {
    dir.join(AGENT_CONFIG_FILE).is_file() || dir.join(AGENT_SOUL_FILE).is_file()
}

fn failed(
    kind: IsolationItemKind,
    source: PathBuf,
    destination: PathBuf,
    reason: String,
) -> IsolationItem {
    IsolationItem {
        kind,
        source,
        destination,
        action: IsolationAction::Failed { reason },
        notes: Vec::new(),
    }
}

fn exists(path: &Path) -> Result<bool, StorageError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("Failed to stat", path, e).into()),
    }
}

fn is_empty_dir(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut rd| rd.next().is_none())
}

/// One legacy entry and where it goes.
struct Planned {
    kind: IsolationItemKind,
    source: PathBuf,
    target: PathBuf,
    conflict: PathBuf,
}

impl Planned {
    fn run(self, user: &UserId, dry_run: bool) -> IsolationItem {
        let mut notes = Vec::new();
        let (destination, action) = match self.act(user, dry_run, &mut notes) {
            Ok(done) => done,
            Err((destination, reason)) => {
                return failed(self.kind, self.source, destination, reason);
            }
        };
        IsolationItem {
            kind: self.kind,
            source: self.source,
            destination,
            action,
            notes,
        }
    }

    /// Moves the entry (or, on a dry run, says where it would go): its destination and
    /// action, or the destination and why the move failed.
    fn act(
        &self,
        user: &UserId,
        dry_run: bool,
        notes: &mut Vec<String>,
    ) -> Result<(PathBuf, IsolationAction), (PathBuf, String)> {
        let is_link = fs::symlink_metadata(&self.source).is_ok_and(|m| m.file_type().is_symlink());
        // A symlinked agent directory moves as a link; its facts live outside the root and are
        // not rewritten.
        let is_agent = matches!(self.kind, IsolationItemKind::Agent(_)) && !is_link;
        let target_taken =
            exists(&self.target).map_err(|e| (self.target.clone(), e.to_string()))?;
        if is_link {
            notes.push("a symlink: the link moves, what it points to is not touched".to_owned());
        }
        if !target_taken {
            if dry_run {
                if is_agent {
                    scan_scopes(&self.source, user, false).describe(user, true, notes);
                }
                return Ok((self.target.clone(), IsolationAction::WouldMove));
            }
            move_entry(&self.source, &self.target, false)
                .map_err(|e| (self.target.clone(), e.to_string()))?;
            if is_agent {
                scan_scopes(&self.target, user, true).describe(user, false, notes);
            }
            return Ok((self.target.clone(), IsolationAction::Moved));
        }
        let conflict = free_conflict_path(&self.conflict).ok_or_else(|| {
            (
                self.conflict.clone(),
                format!(
                    "{} exists and no free name is left in the conflicts folder",
                    self.target.display()
                ),
            )
        })?;
        let existing = self.target.clone();
        if dry_run {
            return Ok((conflict, IsolationAction::WouldConflict { existing }));
        }
        move_entry(&self.source, &conflict, false)
            .map_err(|e| (conflict.clone(), e.to_string()))?;
        Ok((conflict, IsolationAction::Conflict { existing }))
    }
}

/// `path`, or the first of `path.2`, `path.3`, ... that does not exist.
fn free_conflict_path(path: &Path) -> Option<PathBuf> {
    if !path.exists() && fs::symlink_metadata(path).is_err() {
        return Some(path.to_path_buf());
    }
    let name = path.file_name()?.to_string_lossy().into_owned();
    (2..=MAX_CONFLICT_SUFFIX)
        .map(|n| path.with_file_name(format!("{name}.{n}")))
        .find(|p| fs::symlink_metadata(p).is_err())
}

// ---------------------------------------------------------------------------------------------
// Moving without overwriting or losing anything.

/// Moves `src` (file, directory or symlink) to `dst`, which must not exist: a `rename` when
/// both are on one filesystem, otherwise (or with `force_copy`, for tests) a copy into a
/// temporary sibling of `dst` that is fsynced, renamed into place and fsynced before `src` is
/// removed. Parents of `dst` are created; both parents are fsynced.
fn move_entry(src: &Path, dst: &Path, force_copy: bool) -> Result<(), Error> {
    let parent = dst
        .parent()
        .ok_or_else(|| Error::Corrupt(format!("{} has no parent directory", dst.display())))?;
    fsutil::create_dir_all(parent)?;
    if fs::symlink_metadata(dst).is_ok() {
        return Err(Error::Corrupt(format!(
            "{} appeared while migrating; nothing was overwritten",
            dst.display()
        )));
    }
    if !force_copy {
        match fs::rename(src, dst) {
            Ok(()) => {
                fsutil::fsync_dir(parent)?;
                if let Some(sp) = src.parent() {
                    fsutil::fsync_dir(sp)?;
                }
                return Ok(());
            }
            Err(e) if e.kind() == ErrorKind::CrossesDevices => {
                tracing::info!(
                    src = %src.display(),
                    dst = %dst.display(),
                    "different filesystems: moving by durable copy"
                );
            }
            Err(e) => return Err(Error::io("Failed to move", src, e)),
        }
    }
    copy_then_remove(src, dst, parent)
}

fn copy_then_remove(src: &Path, dst: &Path, parent: &Path) -> Result<(), Error> {
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staging = parent.join(format!(
        ".{name}.migrating-{}",
        uuid::Uuid::new_v4().simple()
    ));
    if let Err(e) = copy_tree(src, &staging) {
        let _ = remove_tree(&staging);
        return Err(e);
    }
    fsutil::fsync_dir(parent)?;
    if fs::symlink_metadata(dst).is_ok() {
        let _ = remove_tree(&staging);
        return Err(Error::Corrupt(format!(
            "{} appeared while migrating; nothing was overwritten",
            dst.display()
        )));
    }
    fs::rename(&staging, dst).map_err(|e| Error::io("Failed to move into place", dst, e))?;
    fsutil::fsync_dir(parent)?;
    // The copy is durable in its place: only now is the original removed.
    remove_tree(src)?;
    if let Some(sp) = src.parent() {
        fsutil::fsync_dir(sp)?;
    }
    Ok(())
}

/// Copies a file, symlink or directory tree durably (every file and directory fsynced;
/// permissions kept; symlinks recreated, not followed).
fn copy_tree(src: &Path, dst: &Path) -> Result<(), Error> {
    let meta = fs::symlink_metadata(src).map_err(|e| Error::io("Failed to stat", src, e))?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = fs::read_link(src).map_err(|e| Error::io("Failed to read link", src, e))?;
        return make_symlink(&target, dst);
    }
    if ft.is_dir() {
        fs::create_dir(dst).map_err(|e| Error::io("Failed to create directory", dst, e))?;
        for entry in fsutil::sorted_entries(src)? {
            copy_tree(&entry.path(), &dst.join(entry.file_name()))?;
        }
        fs::set_permissions(dst, meta.permissions())
            .map_err(|e| Error::io("Failed to set permissions", dst, e))?;
        return fsutil::fsync_dir(dst);
    }
    if !ft.is_file() {
        return Err(Error::Corrupt(format!(
            "{} is neither a file, a directory nor a symlink; move it by hand",
            src.display()
        )));
    }
    let mut input = fs::File::open(src).map_err(|e| Error::io("Failed to open", src, e))?;
    let mut output = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| Error::io("Failed to create", dst, e))?;
    std::io::copy(&mut input, &mut output).map_err(|e| Error::io("Failed to copy to", dst, e))?;
    output
        .set_permissions(meta.permissions())
        .map_err(|e| Error::io("Failed to set permissions", dst, e))?;
    output
        .sync_all()
        .map_err(|e| Error::io("Failed to fsync", dst, e))
}

#[cfg(unix)]
fn make_symlink(target: &Path, link: &Path) -> Result<(), Error> {
    std::os::unix::fs::symlink(target, link)
        .map_err(|e| Error::io("Failed to create link", link, e))
}

#[cfg(not(unix))]
fn make_symlink(_target: &Path, link: &Path) -> Result<(), Error> {
    Err(Error::Corrupt(format!(
        "{} is a symlink; move it by hand on this platform",
        link.display()
    )))
}

fn remove_tree(path: &Path) -> Result<(), Error> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("Failed to stat", path, e)),
    };
    let result = if meta.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    result.map_err(|e| Error::io("Failed to remove", path, e))
}

// ---------------------------------------------------------------------------------------------
// Rescoping Markdown facts written without a user.

/// What a scan of an agent directory's Markdown facts found.
#[derive(Debug, Default)]
struct ScopeScan {
    /// Fact files without a user (`user_id: null` or none).
    unscoped: usize,
    /// Unscoped fact files that were rewritten with the user.
    rescoped: usize,
    /// Fact files scoped to a user of another bucket.
    foreign: usize,
    /// Fact files whose front matter could not be read or rewritten (left as they are).
    unreadable: Vec<PathBuf>,
}

impl ScopeScan {
    fn describe(&self, user: &UserId, dry_run: bool, notes: &mut Vec<String>) {
        if dry_run && self.unscoped > 0 {
            notes.push(format!(
                "would rescope {} fact file(s) written without a user to user {}",
                self.unscoped,
                user.as_str()
            ));
        }
        if !dry_run && self.rescoped > 0 {
            notes.push(format!(
                "rescoped {} fact file(s) written without a user to user {}",
                self.rescoped,
                user.as_str()
            ));
        }
        if self.foreign > 0 {
            notes.push(format!(
                "{} fact file(s) belong to a user of another bucket and will read as corrupt; review them",
                self.foreign
            ));
        }
        if !self.unreadable.is_empty() {
            notes.push(format!(
                "{} fact file(s) could not be checked and were left as they are (first: {})",
                self.unreadable.len(),
                self.unreadable[0].display()
            ));
        }
    }
}

/// The front matter of a Markdown fact: its text range and where `user_id` stands.
struct FrontMatterScope {
    /// Byte range of the front matter text (between the `---` lines).
    start: usize,
    end: usize,
    /// The parsed `user_id` value (`Null` when absent).
    user: Value,
}

fn read_scope(text: &str) -> Option<FrontMatterScope> {
    let rest = text.strip_prefix("---\n")?;
    let end_rel = rest.find("\n---\n")?;
    let (start, end) = (4, 4 + end_rel);
    let map = deermem_pycompat::yaml::parse_mapping(text.get(start..end)?).ok()?;
    Some(FrontMatterScope {
        start,
        end,
        user: map.get("user_id").cloned().unwrap_or(Value::Null),
    })
}

/// The fact file's text with `user_id` set to `user` (replacing a `user_id: null` line or
/// appending the key), verified by parsing it back: every other key keeps its value.
fn with_user(text: &str, scope: &FrontMatterScope, user: &UserId) -> Option<String> {
    let front = text.get(scope.start..scope.end)?;
    let mut entry = serde_json::Map::new();
    entry.insert("user_id".into(), Value::String(user.as_str().to_owned()));
    let line = deermem_pycompat::yaml::render_mapping(&entry).ok()?;
    let mut lines: Vec<&str> = front.split('\n').collect();
    let existing = lines.iter().position(|l| {
        l.strip_prefix("user_id:")
            .is_some_and(|v| matches!(v.trim(), "" | "null" | "Null" | "NULL" | "~"))
    });
    match existing {
        Some(i) => lines[i] = line.as_str(),
        None => lines.push(line.as_str()),
    }
    let new_front = lines.join("\n");
    let before = deermem_pycompat::yaml::parse_mapping(front).ok()?;
    let mut after = deermem_pycompat::yaml::parse_mapping(&new_front).ok()?;
    if after.get("user_id") != Some(&Value::String(user.as_str().to_owned())) {
        return None;
    }
    after.remove("user_id");
    let mut expected = before;
    expected.remove("user_id");
    if after != expected {
        return None;
    }
    let mut out = String::with_capacity(text.len() + line.len());
    out.push_str(&text[..scope.start]);
    out.push_str(&new_front);
    out.push_str(&text[scope.end..]);
    Some(out)
}

/// Checks the scope of every fact file of an agent directory, rescoping the files written
/// without a user to `user` when `rewrite`.
fn scan_scopes(agent_dir: &Path, user: &UserId, rewrite: bool) -> ScopeScan {
    let mut scan = ScopeScan::default();
    for path in fsutil::markdown_files(&agent_dir.join("facts")).unwrap_or_default() {
        classify(&path, user, &mut scan, rewrite);
    }
    scan
}

fn classify(path: &Path, user: &UserId, scan: &mut ScopeScan, rewrite: bool) {
    let Ok(text) = fs::read_to_string(path) else {
        scan.unreadable.push(path.to_path_buf());
        return;
    };
    let Some(scope) = read_scope(&text) else {
        scan.unreadable.push(path.to_path_buf());
        return;
    };
    match &scope.user {
        Value::Null => {
            scan.unscoped += 1;
            if !rewrite {
                return;
            }
            let Some(new_text) = with_user(&text, &scope, user) else {
                scan.unreadable.push(path.to_path_buf());
                return;
            };
            match fsutil::atomic_write(path, new_text.as_bytes()) {
                Ok(()) => scan.rescoped += 1,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not rescope a fact file");
                    scan.unreadable.push(path.to_path_buf());
                }
            }
        }
        Value::String(s) => {
            let same_bucket = UserId::new(s.as_str()).is_ok_and(|u| u.bucket() == user.bucket());
            if !same_bucket {
                scan.foreign += 1;
            }
        }
        _ => scan.unreadable.push(path.to_path_buf()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(raw: &str) -> UserId {
        UserId::new(raw).unwrap()
    }

    #[test]
    fn copy_fallback_moves_a_tree_and_keeps_everything() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("agents/Coder");
        fs::create_dir_all(src.join("facts/ab")).unwrap();
        fs::write(src.join("SOUL.md"), "soul").unwrap();
        fs::write(src.join("facts/ab/fact_x.md"), "fact").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("SOUL.md", src.join("link")).unwrap();
        let dst = tmp.path().join("users/default/agents/coder");
        move_entry(&src, &dst, true).unwrap();
        assert!(!src.exists());
        assert_eq!(fs::read_to_string(dst.join("SOUL.md")).unwrap(), "soul");
        assert_eq!(
            fs::read_to_string(dst.join("facts/ab/fact_x.md")).unwrap(),
            "fact"
        );
        #[cfg(unix)]
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            PathBuf::from("SOUL.md")
        );
        // No staging directory is left behind.
        let leftovers: Vec<_> = fs::read_dir(dst.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("coder")]);
    }

    #[test]
    fn moves_never_overwrite() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("a.json");
        let dst = tmp.path().join("b.json");
        fs::write(&src, "legacy").unwrap();
        fs::write(&dst, "current").unwrap();
        for force_copy in [false, true] {
            assert!(move_entry(&src, &dst, force_copy).is_err());
            assert_eq!(fs::read_to_string(&src).unwrap(), "legacy");
            assert_eq!(fs::read_to_string(&dst).unwrap(), "current");
        }
        // A file moves by copy too, and the original goes only after the copy.
        let dst2 = tmp.path().join("sub/c.json");
        move_entry(&src, &dst2, true).unwrap();
        assert!(!src.exists());
        assert_eq!(fs::read_to_string(&dst2).unwrap(), "legacy");
    }

    #[test]
    fn a_failed_copy_keeps_the_source_and_leaves_no_staging() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("agents/x");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("config.yaml"), "name: x").unwrap();
        // The destination's parent is a file: the copy cannot even start.
        fs::write(tmp.path().join("blocker"), "").unwrap();
        let dst = tmp.path().join("blocker/x");
        assert!(move_entry(&src, &dst, true).is_err());
        assert_eq!(
            fs::read_to_string(src.join("config.yaml")).unwrap(),
            "name: x"
        );
    }

    #[test]
    fn rescoping_sets_the_user_and_keeps_every_other_key() {
        let text = "---\nid: fact_a\ncategory: context\nconfidence: 0.9\nuser_id: null\nagent_name: coder\n---\n\n# T\n\nBody\n";
        let scope = read_scope(text).unwrap();
        assert_eq!(scope.user, Value::Null);
        let out = with_user(text, &scope, &user("a@b.com")).unwrap();
        assert!(out.contains("\nuser_id: a@b.com\nagent_name: coder\n---\n\n# T\n\nBody\n"));
        let again = read_scope(&out).unwrap();
        assert_eq!(again.user, Value::String("a@b.com".into()));
        // Without the key, it is appended at the end of the front matter.
        let text = "---\nid: fact_b\nagent_name: coder\n---\n\n# T\n\nBody\n";
        let scope = read_scope(text).unwrap();
        let out = with_user(text, &scope, &user("default")).unwrap();
        assert_eq!(
            out,
            "---\nid: fact_b\nagent_name: coder\nuser_id: default\n---\n\n# T\n\nBody\n"
        );
        // A user id YAML would misread is quoted.
        let out = with_user(text, &scope, &user("yes")).unwrap();
        assert_eq!(read_scope(&out).unwrap().user, Value::String("yes".into()));
    }

    #[test]
    fn unreadable_front_matter_is_not_rewritten() {
        assert!(read_scope("no front matter").is_none());
        assert!(read_scope("---\nid: [unclosed\n---\n\nx").is_none());
        assert!(read_scope("---\n---\n").is_none());
    }

    #[cfg(unix)]
    #[test]
    fn a_symlinked_agent_moves_as_a_link_and_its_target_is_not_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside/coder");
        fs::create_dir_all(outside.join("facts/ab")).unwrap();
        let fact = "---\nid: fact_a\nuser_id: null\nagent_name: coder\n---\n\n# T\n\nBody\n";
        fs::write(outside.join("facts/ab/fact_a.md"), fact).unwrap();
        let root = tmp.path().join("root");
        fs::create_dir_all(root.join("agents")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("agents/coder")).unwrap();
        let report =
            migrate_user_isolation(&root, &user("default"), &IsolationOptions::default()).unwrap();
        assert_eq!(report.items.len(), 1);
        assert_eq!(report.items[0].action, IsolationAction::Moved);
        assert!(report.items[0].notes[0].contains("symlink"));
        let moved = root.join("users/default/agents/coder");
        assert!(
            fs::symlink_metadata(&moved)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            fs::read_to_string(outside.join("facts/ab/fact_a.md")).unwrap(),
            fact
        );
    }

    #[test]
    fn conflict_names_are_numbered_when_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("agents/coder");
        assert_eq!(free_conflict_path(&p), Some(p.clone()));
        fs::create_dir_all(&p).unwrap();
        assert_eq!(
            free_conflict_path(&p),
            Some(tmp.path().join("agents/coder.2"))
        );
    }
}
