//! Moving stored memory between the file store and PostgreSQL (`deermem migrate --from … --to
//! …`), user bucket by user bucket: every revision, summary, fact, usage and audit record kept
//! as stored, so `file → postgres → file` gives back the same bytes.
//!
//! Each bucket is read whole from the source, checksummed (SHA-256 over
//! [`UserSnapshot::canonical_json`]), compared with the destination, written when it differs
//! (one transaction on PostgreSQL; facts and sidecars then the manifest, under the user's
//! locks, on files) and read back to verify the checksum. A bucket the destination already
//! holds identically is left alone, so a second run changes nothing and an interrupted run
//! continues with the buckets not yet verified. A destination bucket that holds something else
//! is refused unless `overwrite` is set. Connection URLs never appear in reports or errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deermem_core::StorageError;
use deermem_core::ports::Clock;
use deermem_core::snapshot::{SnapshotCounts, UserSnapshot};
use deermem_storage_file::{FileStorage, FileStorageConfig};
use deermem_storage_postgres::{PgDatabase, known_schema_version};
pub use deermem_storage_postgres::{PgError, PostgresConfig};
use sha2::{Digest, Sha256};

use crate::clock::SystemClock;

/// Where memory is moved from or to.
#[derive(Clone, Debug, PartialEq)]
pub enum Endpoint {
    /// A file storage root (`file:<root>`).
    File(PathBuf),
    /// A PostgreSQL database (`postgres://…`, `postgresql://…`, or `$VAR` naming one).
    Postgres(PostgresConfig),
}

impl Endpoint {
    /// Reads `file:<root>`, `postgres://…` / `postgresql://…`, or `$VAR` / `${VAR}` whose
    /// value (looked up with `env`) is one of those. The PostgreSQL schema is `schema` when
    /// given, else the default (`deermem`).
    ///
    /// # Errors
    /// [`TransferError::Endpoint`] naming `which` (`--from` / `--to`), never quoting a URL.
    pub fn parse(
        which: &'static str,
        spec: &str,
        schema: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, TransferError> {
        let bad = |message: String| TransferError::Endpoint { which, message };
        let spec = spec.trim();
        let resolved;
        let text = match crate::env_reference(spec) {
            Some(name) => {
                resolved = env(name)
                    .filter(|v| !v.trim().is_empty())
                    .ok_or_else(|| bad(format!("the environment variable {name} is not set")))?;
                resolved.trim()
            }
            None => spec,
        };
        if let Some(root) = text.strip_prefix("file:") {
            let root = root.strip_prefix("//").unwrap_or(root);
            if root.is_empty() {
                return Err(bad(
                    "file: needs a storage root, e.g. file:/var/lib/deermem".into(),
                ));
            }
            return Ok(Self::File(PathBuf::from(root)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            let mut config =
                PostgresConfig::from_url(text).map_err(|e| bad(PgError::from(e).to_string()))?;
            if let Some(schema) = schema {
                config.schema = schema.to_owned();
            }
            config
                .validate()
                .map_err(|e| bad(PgError::from(e).to_string()))?;
            return Ok(Self::Postgres(config));
        }
        Err(bad(
            "expected file:<root>, postgres://… or $VAR naming one of those".into(),
        ))
    }

    /// How reports name it: the root, or `postgres (schema …)` (never the URL).
    pub fn label(&self) -> String {
        match self {
            Self::File(root) => format!("file:{}", root.display()),
            Self::Postgres(c) => format!("postgres (schema {})", c.schema),
        }
    }
}

/// How to move.
#[derive(Clone, Debug)]
pub struct TransferOptions {
    /// Replace destination buckets that hold something else (refused otherwise).
    pub overwrite: bool,
    /// The file store's manifest name (`memory.json`).
    pub manifest_filename: String,
}

impl Default for TransferOptions {
    fn default() -> Self {
        Self {
            overwrite: false,
            manifest_filename: "memory.json".into(),
        }
    }
}

/// Why a transfer, or one bucket of it, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// `--from` or `--to` is not usable.
    #[error("{which}: {message}")]
    Endpoint {
        /// `--from` or `--to`.
        which: &'static str,
        /// What is wrong (no URL in it).
        message: String,
    },
    /// Source and destination are the same place.
    #[error("--from and --to name the same storage ({0}); nothing to move")]
    SameEndpoint(String),
    /// The source database holds no DeerMem schema.
    #[error(
        "the source database has no DeerMem schema {schema:?} (nothing was ever written there, or a different `--pg-schema`)"
    )]
    NoSourceSchema {
        /// The schema looked for.
        schema: String,
    },
    /// The destination already holds this bucket with other content.
    #[error(
        "user bucket {bucket:?} already exists in the destination with different content; it was left alone (use --overwrite to replace it)"
    )]
    DestinationDiffers {
        /// The bucket.
        bucket: String,
    },
    /// What was written does not read back with the source's checksum.
    #[error(
        "user bucket {bucket:?} does not verify: the source's checksum is {expected}, the destination's {found}"
    )]
    Verify {
        /// The bucket.
        bucket: String,
        /// The source's checksum.
        expected: String,
        /// The destination's checksum (`none` when it reads as empty).
        found: String,
    },
    /// The file store failed.
    #[error("file storage: {0}")]
    File(#[from] StorageError),
    /// PostgreSQL failed.
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] PgError),
}

/// What happened to one bucket.
#[derive(Debug)]
pub enum ScopeStatus {
    /// Written and verified.
    Copied,
    /// The destination already held it identically (verified, nothing written).
    Unchanged,
    /// Not moved (the destination bucket is as it was, or wholly replaced on PostgreSQL).
    Failed(TransferError),
}

impl ScopeStatus {
    /// `copied`, `unchanged` or `failed`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Copied => "copied",
            Self::Unchanged => "unchanged",
            Self::Failed(_) => "failed",
        }
    }
}

/// One bucket's line of the report.
#[derive(Debug)]
pub struct ScopeReport {
    /// The user bucket.
    pub bucket: String,
    /// What happened.
    pub status: ScopeStatus,
    /// The source's shared revision (0 when it could not be read).
    pub revision: u64,
    /// What the source bucket holds.
    pub counts: SnapshotCounts,
    /// SHA-256 (hex) of the source bucket's canonical form (empty when it could not be read).
    pub checksum: String,
}

/// The whole run.
#[derive(Debug)]
pub struct TransferReport {
    /// Where from.
    pub from: String,
    /// Where to.
    pub to: String,
    /// Per bucket, in byte order of the bucket names.
    pub scopes: Vec<ScopeReport>,
}

impl TransferReport {
    /// The sum over the buckets that were read.
    pub fn totals(&self) -> SnapshotCounts {
        let mut t = SnapshotCounts::default();
        for s in &self.scopes {
            t += s.counts;
        }
        t
    }

    /// SHA-256 over `bucket checksum` lines of every bucket read: one value to compare runs
    /// and directions by.
    pub fn total_checksum(&self) -> String {
        let mut h = Sha256::new();
        for s in self.scopes.iter().filter(|s| !s.checksum.is_empty()) {
            h.update(s.bucket.as_bytes());
            h.update(b" ");
            h.update(s.checksum.as_bytes());
            h.update(b"\n");
        }
        hex::encode(h.finalize())
    }

    /// Buckets with the given status label.
    pub fn count(&self, label: &str) -> usize {
        self.scopes
            .iter()
            .filter(|s| s.status.label() == label)
            .count()
    }

    /// Whether any bucket failed.
    pub fn has_failures(&self) -> bool {
        self.count("failed") > 0
    }
}

/// The SHA-256 (hex) of a bucket's canonical form.
pub fn checksum(snapshot: &UserSnapshot) -> String {
    hex::encode(Sha256::digest(snapshot.canonical_json().as_bytes()))
}

/// An opened endpoint.
enum Side {
    File(FileStorage),
    Postgres(PgDatabase),
}

impl Side {
    async fn open(
        endpoint: &Endpoint,
        destination: bool,
        options: &TransferOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, TransferError> {
        match endpoint {
            Endpoint::File(root) => {
                if !destination && !root.is_dir() {
                    return Err(TransferError::Endpoint {
                        which: "--from",
                        message: format!("{} is not a directory", root.display()),
                    });
                }
                let mut config = FileStorageConfig::new(root.clone());
                config.manifest_filename = options.manifest_filename.clone();
                Ok(Self::File(FileStorage::new(config, clock, None)?))
            }
            Endpoint::Postgres(config) => {
                let store = PgDatabase::connect(config).await?;
                if destination {
                    store.migrate().await?;
                } else {
                    match store.schema_version().await? {
                        None => {
                            return Err(TransferError::NoSourceSchema {
                                schema: config.schema.clone(),
                            });
                        }
                        Some(found) if found > known_schema_version() => {
                            return Err(PgError::SchemaTooNew {
                                schema: config.schema.clone(),
                                found,
                                known: known_schema_version(),
                            }
                            .into());
                        }
                        Some(_) => {}
                    }
                }
                Ok(Self::Postgres(store))
            }
        }
    }

    async fn buckets(&self) -> Result<Vec<String>, TransferError> {
        Ok(match self {
            Self::File(s) => s.list_buckets().await?,
            Self::Postgres(s) => s.list_buckets().await?,
        })
    }

    async fn read(
        &self,
        bucket: &str,
        clock: &dyn Clock,
    ) -> Result<Option<UserSnapshot>, TransferError> {
        Ok(match self {
            Self::File(s) => s.read_snapshot(bucket).await?,
            Self::Postgres(s) => s.read_snapshot(bucket, clock.now()).await?,
        })
    }

    /// The destination's bucket; a file bucket left incomplete by an interrupted run reads as
    /// empty here (it is ours to finish).
    async fn read_destination(
        &self,
        bucket: &str,
        clock: &dyn Clock,
    ) -> Result<Option<UserSnapshot>, TransferError> {
        if let Self::File(s) = self
            && s.snapshot_incomplete(bucket)?
        {
            return Ok(None);
        }
        self.read(bucket, clock).await
    }

    async fn write(&self, snapshot: &UserSnapshot) -> Result<(), TransferError> {
        match self {
            Self::File(s) => s.write_snapshot(snapshot).await?,
            Self::Postgres(s) => s.write_snapshot(snapshot).await?,
        }
        Ok(())
    }
}

fn same_place(a: &Endpoint, b: &Endpoint) -> bool {
    match (a, b) {
        (Endpoint::File(x), Endpoint::File(y)) => canonical(x) == canonical(y),
        (Endpoint::Postgres(x), Endpoint::Postgres(y)) => x.url == y.url && x.schema == y.schema,
        _ => false,
    }
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_owned())
}

/// Moves every user bucket of `from` to `to`. `each` is called with every bucket's report
/// as soon as it is done (for progress output). One bucket's failure does not stop the
/// others; it is in the report.
///
/// # Errors
/// An endpoint that cannot be opened or listed (nothing was moved then).
pub async fn transfer(
    from: &Endpoint,
    to: &Endpoint,
    options: &TransferOptions,
    mut each: impl FnMut(&ScopeReport),
) -> Result<TransferReport, TransferError> {
    if same_place(from, to) {
        return Err(TransferError::SameEndpoint(from.label()));
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let source = Side::open(from, false, options, clock.clone()).await?;
    let destination = Side::open(to, true, options, clock.clone()).await?;
    let mut report = TransferReport {
        from: from.label(),
        to: to.label(),
        scopes: Vec::new(),
    };
    for bucket in source.buckets().await? {
        let scope = move_bucket(&source, &destination, &bucket, options, clock.as_ref()).await;
        let scope = match scope {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => ScopeReport {
                bucket: bucket.clone(),
                status: ScopeStatus::Failed(e),
                revision: 0,
                counts: SnapshotCounts::default(),
                checksum: String::new(),
            },
        };
        each(&scope);
        report.scopes.push(scope);
    }
    for side in [&source, &destination] {
        if let Side::File(s) = side {
            deermem_core::ports::FactRepository::close(s).await;
        }
    }
    Ok(report)
}

/// One bucket: `None` when the source holds nothing there.
async fn move_bucket(
    source: &Side,
    destination: &Side,
    bucket: &str,
    options: &TransferOptions,
    clock: &dyn Clock,
) -> Result<Option<ScopeReport>, TransferError> {
    let Some(snapshot) = source.read(bucket, clock).await? else {
        return Ok(None);
    };
    let sum = checksum(&snapshot);
    let mut scope = ScopeReport {
        bucket: bucket.to_owned(),
        status: ScopeStatus::Copied,
        revision: snapshot.revision,
        counts: snapshot.counts(),
        checksum: sum.clone(),
    };
    let existing = destination.read_destination(bucket, clock).await;
    let existing = match existing {
        Ok(e) => e,
        // A destination bucket that does not read is replaced only when allowed.
        Err(e) if !options.overwrite => {
            scope.status = ScopeStatus::Failed(e);
            return Ok(Some(scope));
        }
        Err(_) => None,
    };
    if let Some(existing) = existing {
        if checksum(&existing) == sum {
            scope.status = ScopeStatus::Unchanged;
            return Ok(Some(scope));
        }
        if !options.overwrite {
            scope.status = ScopeStatus::Failed(TransferError::DestinationDiffers {
                bucket: bucket.to_owned(),
            });
            return Ok(Some(scope));
        }
    }
    if let Err(e) = destination.write(&snapshot).await {
        scope.status = ScopeStatus::Failed(e);
        return Ok(Some(scope));
    }
    let found = match destination.read(bucket, clock).await {
        Ok(back) => back.map_or_else(|| "none".to_owned(), |s| checksum(&s)),
        Err(e) => {
            scope.status = ScopeStatus::Failed(e);
            return Ok(Some(scope));
        }
    };
    if found != sum {
        scope.status = ScopeStatus::Failed(TransferError::Verify {
            bucket: bucket.to_owned(),
            expected: sum,
            found,
        });
    }
    Ok(Some(scope))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "DATABASE_URL" => Some("postgres://u:hunter2@db.internal/mem?sslmode=require".into()),
            "DATA" => Some("file:/srv/memory".into()),
            "EMPTY" => Some("  ".into()),
            _ => None,
        }
    }

    #[test]
    fn endpoints_parse_and_never_show_the_url() {
        assert_eq!(
            Endpoint::parse("--from", "file:/tmp/root", None, &env).unwrap(),
            Endpoint::File(PathBuf::from("/tmp/root"))
        );
        assert_eq!(
            Endpoint::parse("--from", "$DATA", None, &env).unwrap(),
            Endpoint::File(PathBuf::from("/srv/memory"))
        );
        for spec in ["$DATABASE_URL", "${DATABASE_URL}"] {
            let e = Endpoint::parse("--to", spec, Some("mem_copy"), &env).unwrap();
            let Endpoint::Postgres(c) = &e else {
                panic!("{e:?}")
            };
            assert_eq!(c.schema, "mem_copy");
            assert_eq!(c.tls.mode, deermem_storage_postgres::TlsMode::Require);
            let label = e.label();
            assert_eq!(label, "postgres (schema mem_copy)");
            assert!(!format!("{e:?}").contains("hunter2"));
        }
        for (spec, wanted) in [
            ("$NOPE", "NOPE is not set"),
            ("$EMPTY", "EMPTY is not set"),
            ("file:", "needs a storage root"),
            ("mysql://x", "expected file:<root>"),
            ("postgres://u:hunter2@h/db?sslmode=verify-ca", "verify-ca"),
        ] {
            let err = Endpoint::parse("--to", spec, None, &env).unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with("--to: ") && text.contains(wanted),
                "{spec}: {text}"
            );
            assert!(!text.contains("hunter2"), "{text}");
        }
        let bad_schema = Endpoint::parse("--to", "$DATABASE_URL", Some("x; DROP"), &env);
        assert!(matches!(bad_schema, Err(TransferError::Endpoint { .. })));
    }
}
