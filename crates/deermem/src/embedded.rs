//! Composition of the embedded engine's adapters from a DeerMem `backend_config`: the file
//! storage with its FTS5 index, or (`storage_class: postgres`, feature `storage-postgres`) the
//! PostgreSQL storage; [`EmbeddedStorage`] is either, with the administrative operations that
//! are not storage ports and a typed refusal where one storage cannot do them.

#[cfg(feature = "storage-postgres")]
mod postgres;
#[cfg(feature = "retrieval-fts5")]
mod recovering;
mod select;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deermem_core::ports::{Clock, MemoryStorage, Retrieval, RunEventStore};
use deermem_core::{AgentName, ConfigError, StorageError, UserId};
use deermem_storage_file::{
    FileStorage, FileStorageConfig, IndexVerification, RunJournal, RunJournalOptions,
};
use deermem_updater::DeerMemConfig;

#[cfg(feature = "storage-postgres")]
pub use postgres::{PostgresStorage, postgres_config, remote_cursors};
#[cfg(feature = "retrieval-fts5")]
pub use recovering::RecoveringFts5;
pub use select::{StorageClass, storage_class};

/// Why the embedded storage could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddedError {
    /// Invalid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The storage refused to start.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The PostgreSQL storage could not be opened (unreachable, or a newer schema).
    #[cfg(feature = "storage-postgres")]
    #[error(transparent)]
    Postgres(#[from] deermem_storage_postgres::PgError),
    /// An operation that one storage class does not have.
    #[error("{operation} is not available on storage {storage}{hint}")]
    NotAvailable {
        /// What was asked for.
        operation: &'static str,
        /// The configured `storage_class`.
        storage: &'static str,
        /// What to do instead (empty or starting with `; `).
        hint: &'static str,
    },
    /// A `storage_class` in a build without the Cargo feature of its adapter.
    #[error(
        "memory.backend_config.storage_class '{storage}' is not compiled into this build; rebuild with the Cargo feature `{feature}` of the `deermem` crate"
    )]
    NotCompiled {
        /// The configured storage.
        storage: &'static str,
        /// The feature that compiles it in.
        feature: &'static str,
    },
}

/// Parses DeerMem's `backend_config`, logging its warnings, and checks the storage adapters'
/// sections (in a build with the adapter; without it, selecting the adapter fails when the
/// storage is opened).
///
/// # Errors
/// An invalid key, named.
pub fn deermem_config(
    backend_config: &serde_json::Map<String, serde_json::Value>,
) -> Result<DeerMemConfig, ConfigError> {
    let (mut cfg, warnings) = DeerMemConfig::from_backend_config_with_sections(
        backend_config,
        &select::storage_sections(),
    )?;
    select::select(&mut cfg, backend_config)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    #[cfg(feature = "storage-postgres")]
    postgres::check_section(&cfg)?;
    Ok(cfg)
}

/// DeerMem's `backend_config` as shown (the facade's table of backends names it): parsed and
/// checked as [`deermem_config`] does (without logging its warnings again), serialised
/// (`DeerMemConfig`'s display form), with each storage adapter's section shown by that adapter.
/// `None` when it does not parse.
pub(crate) fn shown_deermem_config(
    backend_config: &serde_json::Map<String, serde_json::Value>,
) -> Option<serde_json::Value> {
    let (mut cfg, _warnings) = DeerMemConfig::from_backend_config_with_sections(
        backend_config,
        &select::storage_sections(),
    )
    .ok()?;
    select::select(&mut cfg, backend_config).ok()?;
    #[cfg(feature = "storage-postgres")]
    postgres::check_section(&cfg).ok()?;
    let serde_json::Value::Object(mut shown) = serde_json::to_value(&cfg).ok()? else {
        return None;
    };
    for (key, section) in &cfg.storage_sections {
        shown.insert(key.clone(), select::shown_section(key, section));
    }
    Some(serde_json::Value::Object(shown))
}

/// Opens the derived search index under `root`, or `None` when the configuration disables it
/// (`retrieval_adapter: ""`; storage then always uses its substring scan).
///
/// An index that cannot be opened now (an unusable `{root}/.retrieval/`, a file the adapter
/// could not recreate) does not disable search for the life of the process: the returned
/// [`RecoveringFts5`] reports the cause as `last_error` in the index status, lets search fall
/// back to the substring scan, and opens the index again on the next call (search, write,
/// rebuild, status).
///
/// # Errors
/// `retrieval_adapter: fts5` in a build without the `retrieval-fts5` feature.
pub fn open_retrieval(
    cfg: &DeerMemConfig,
    root: &Path,
    clock: Arc<dyn Clock>,
) -> Result<Option<Arc<dyn Retrieval>>, ConfigError> {
    if cfg.retrieval_adapter.is_empty() {
        return Ok(None);
    }
    #[cfg(feature = "retrieval-fts5")]
    {
        let embedder = open_embedder(cfg)?;
        let index = Arc::new(RecoveringFts5::open(root, clock));
        Ok(Some(match embedder {
            None => index as Arc<dyn Retrieval>,
            #[cfg(feature = "engine")]
            Some(embedder) => Arc::new(deermem_engine::hybrid::HybridRetrieval::new(
                Arc::clone(&index) as Arc<dyn Retrieval>,
                index as Arc<dyn deermem_core::ports::VectorIndex>,
                embedder,
                cfg.default_search_mode(),
            )) as Arc<dyn Retrieval>,
            #[cfg(not(feature = "engine"))]
            Some(_) => {
                return Err(ConfigError::new(
                    "memory.backend_config.embedding.provider",
                    "search by meaning needs the engine; rebuild with the Cargo feature `engine` of the `deermem` crate",
                ));
            }
        }))
    }
    #[cfg(not(feature = "retrieval-fts5"))]
    {
        let _ = (root, clock);
        Err(ConfigError::new(
            "memory.backend_config.retrieval_adapter",
            "'fts5' is not compiled into this build; rebuild with the Cargo feature `retrieval-fts5` of the `deermem` crate, or set retrieval_adapter: \"\"",
        ))
    }
}

/// The embedder `backend_config.embedding` selects, or `None` for `provider: none`. The local
/// model is loaded here (blocking: run at start-up), so a model directory with a missing or
/// damaged file fails the start, naming the path.
///
/// # Errors
/// A provider whose Cargo feature is off, an invalid `openai` setting, or a `local` model that
/// cannot be loaded.
pub fn open_embedder(
    cfg: &DeerMemConfig,
) -> Result<Option<Arc<dyn deermem_core::ports::Embedder>>, ConfigError> {
    use deermem_core::config::EmbeddingProvider;
    match cfg.embedding.provider {
        EmbeddingProvider::None => Ok(None),
        #[cfg(feature = "embed-openai")]
        EmbeddingProvider::Openai => Ok(Some(Arc::new(
            deermem_llm_openai::OpenAiEmbedder::from_config(&cfg.embedding)?,
        ))),
        #[cfg(not(feature = "embed-openai"))]
        EmbeddingProvider::Openai => Err(ConfigError::new(
            "memory.backend_config.embedding.provider",
            "'openai' is not compiled into this build; rebuild with the Cargo feature `embed-openai` of the `deermem` crate, or set provider: none",
        )),
        #[cfg(feature = "embed-local")]
        EmbeddingProvider::Local => deermem_embed_local::LocalEmbedder::from_config(&cfg.embedding)
            .map(|e| Some(Arc::new(e) as Arc<dyn deermem_core::ports::Embedder>))
            .map_err(|e| {
                ConfigError::new("memory.backend_config.embedding.model_path", e.to_string())
            }),
        #[cfg(not(feature = "embed-local"))]
        EmbeddingProvider::Local => Err(ConfigError::new(
            "memory.backend_config.embedding.provider",
            "'local' is not compiled into this build; rebuild with the Cargo feature `embed-local` of the `deermem` crate, or set provider: none",
        )),
    }
}

/// Opens the file storage at `root` with the configured settings and (optionally) its index.
///
/// # Errors
/// Invalid settings or a storage that refuses to start.
pub fn open_storage(
    cfg: &DeerMemConfig,
    root: PathBuf,
    clock: Arc<dyn Clock>,
    with_retrieval: bool,
) -> Result<FileStorage, EmbeddedError> {
    let retrieval = if with_retrieval {
        open_retrieval(cfg, &root, Arc::clone(&clock))?
    } else {
        None
    };
    let config = FileStorageConfig {
        root,
        manifest_filename: cfg.manifest_filename.clone(),
        strict_user_scope: cfg.strict_user_scope,
        lock_timeout: std::time::Duration::from_secs(cfg.file_lock_timeout_seconds),
        audit_max_entries: cfg.eviction_audit_max_entries,
        access_half_life_days: cfg.eviction_access_half_life_days as f64,
        cache_max_scopes: cfg.cache_max_scopes,
        rebuild_batch_facts: deermem_storage_file::DEFAULT_REBUILD_BATCH_FACTS,
    };
    Ok(FileStorage::new(config, clock, retrieval)?)
}

/// The embedded engine's storage: the file store or PostgreSQL, by `storage_class`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EmbeddedStorage {
    /// The file store under the storage root.
    File(Arc<FileStorage>),
    /// PostgreSQL.
    #[cfg(feature = "storage-postgres")]
    Postgres(Arc<PostgresStorage>),
}

/// Opens the storage `cfg.storage_class` selects: the file store at `root` (with its index when
/// `with_retrieval`), or PostgreSQL with its schema migrated (its search is the database's own,
/// so `with_retrieval` does not apply; with an embedder, search by meaning runs over the facts
/// with their vectors in the same database). `env` resolves the PostgreSQL URL's `$VAR`.
///
/// # Errors
/// Invalid settings, a storage that refuses to start, an unreachable database or one whose
/// schema is newer than this build, or PostgreSQL selected in a build without it.
pub fn open_embedded(
    cfg: &DeerMemConfig,
    root: PathBuf,
    clock: Arc<dyn Clock>,
    with_retrieval: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<EmbeddedStorage, EmbeddedError> {
    select::open(cfg, root, clock, with_retrieval, env)
}

impl EmbeddedStorage {
    /// The storage ports, for the engine.
    pub fn storage(&self) -> Arc<dyn MemoryStorage> {
        match self {
            Self::File(s) => Arc::clone(s) as Arc<dyn MemoryStorage>,
            #[cfg(feature = "storage-postgres")]
            Self::Postgres(s) => s.memory(),
        }
    }

    /// The raw ids of the users the storage holds data for, sorted.
    ///
    /// # Errors
    /// The storage cannot be read.
    pub async fn list_users(&self) -> Result<Vec<UserId>, EmbeddedError> {
        match self {
            Self::File(s) => Ok(s.list_users().await?),
            #[cfg(feature = "storage-postgres")]
            Self::Postgres(s) => Ok(s.store().list_users().await?),
        }
    }

    /// The agent scopes of `user` (files: the agent directories under the user's bucket).
    ///
    /// # Errors
    /// The database cannot be read (a missing directory is no agents).
    pub async fn agents_of(&self, user: &UserId) -> Result<Vec<AgentName>, EmbeddedError> {
        match self {
            Self::File(s) => {
                let dir = s.root().join("users").join(user.bucket()).join("agents");
                let mut out: Vec<AgentName> = std::fs::read_dir(dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| AgentName::parse(&e.file_name().to_string_lossy()).ok())
                    .collect();
                out.sort();
                Ok(out)
            }
            #[cfg(feature = "storage-postgres")]
            Self::Postgres(s) => Ok(s.store().agents_of(user).await?),
        }
    }

    /// Whether the storage can be reached now: always for the file store; one round trip for
    /// PostgreSQL (the gateway's `/readyz` asks it).
    ///
    /// # Errors
    /// The database cannot be reached, with PostgreSQL's reason.
    pub async fn check_reachable(&self) -> Result<(), EmbeddedError> {
        match self {
            Self::File(_) => Ok(()),
            #[cfg(feature = "storage-postgres")]
            Self::Postgres(s) => Ok(s.store().ping().await?),
        }
    }

    /// The derived index compared with the canonical facts (the file store's FTS5 index);
    /// `None` where there is nothing to compare: no index, or PostgreSQL, whose search vector
    /// is a generated column of the fact row and cannot drift from it.
    ///
    /// # Errors
    /// As [`FileStorage::verify_index`].
    pub async fn verify_index(&self) -> Result<Option<IndexVerification>, StorageError> {
        match self {
            Self::File(s) => s.verify_index().await,
            #[cfg(feature = "storage-postgres")]
            Self::Postgres(_) => Ok(None),
        }
    }

    /// Opens the run journal that belongs with this storage: JSONL files under
    /// `{root}/.runs` beside the file store, the `run_events` table in the database for
    /// PostgreSQL (shared by every replica).
    ///
    /// # Errors
    /// The journal cannot be opened (its directory, lock or database).
    pub async fn open_run_journal(
        &self,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn RunEventStore>, EmbeddedError> {
        match self {
            Self::File(s) => {
                let _ = clock;
                let dir = RunJournal::dir_for_storage_root(s.root());
                let journal =
                    RunJournal::open(&dir, RunJournalOptions::default()).map_err(|e| {
                        StorageError::Io {
                            context: format!("run journal in {}", dir.display()),
                            source: std::io::Error::other(e.to_string()),
                        }
                    })?;
                Ok(Arc::new(journal))
            }
            #[cfg(feature = "storage-postgres")]
            Self::Postgres(s) => Ok(s.open_run_journal(clock).await?),
        }
    }
}

/// The schema of the configured PostgreSQL database against this build's migrations.
#[cfg(feature = "storage-postgres")]
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SchemaStatus {
    /// The configured schema name.
    pub schema: String,
    /// The newest migration applied in the database (`None`: never migrated).
    pub version: Option<i64>,
    /// The newest migration this build carries.
    pub known: i64,
}

/// What `deermem db migrate` did.
#[cfg(feature = "storage-postgres")]
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SchemaMigration {
    /// The configured schema name.
    pub schema: String,
    /// The version before (`None`: never migrated).
    pub from: Option<i64>,
    /// The version after.
    pub to: i64,
    /// The versions applied now, in order.
    pub applied: Vec<i64>,
}

#[cfg(feature = "storage-postgres")]
fn require_postgres(cfg: &DeerMemConfig) -> Result<(), EmbeddedError> {
    if storage_class(cfg)? == StorageClass::Postgres {
        Ok(())
    } else {
        Err(EmbeddedError::NotAvailable {
            operation: "the database schema",
            storage: "file",
            hint: "; set memory.backend_config.storage_class: postgres and postgres.url",
        })
    }
}

/// Reads the schema version of the configured database without changing anything. Runs on
/// the caller's runtime.
///
/// # Errors
/// Not PostgreSQL storage, invalid settings, an unreachable database.
#[cfg(feature = "storage-postgres")]
pub async fn schema_status(
    cfg: &DeerMemConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SchemaStatus, EmbeddedError> {
    require_postgres(cfg)?;
    let config = postgres_config(cfg, env)?;
    let store = deermem_storage_postgres::PgDatabase::connect(&config).await?;
    Ok(SchemaStatus {
        schema: store.schema().to_owned(),
        version: store.schema_version().await?,
        known: deermem_storage_postgres::known_schema_version(),
    })
}

/// Applies this build's pending migrations to the configured database (under the advisory
/// lock replicas share). Runs on the caller's runtime.
///
/// # Errors
/// Not PostgreSQL storage, invalid settings, an unreachable database, a schema newer than this
/// build (`EmbeddedError::Postgres(PgError::SchemaTooNew)`, nothing changed), a failed
/// migration (rolled back).
#[cfg(feature = "storage-postgres")]
pub async fn migrate_schema(
    cfg: &DeerMemConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SchemaMigration, EmbeddedError> {
    require_postgres(cfg)?;
    let config = postgres_config(cfg, env)?;
    let store = deermem_storage_postgres::PgDatabase::connect(&config).await?;
    let from = store.schema_version().await?;
    let outcome = store.migrate().await?;
    Ok(SchemaMigration {
        schema: store.schema().to_owned(),
        from,
        to: outcome.version,
        applied: outcome.applied,
    })
}
