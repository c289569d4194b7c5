//! `storage_class: postgres`: the `backend_config.postgres` block made into the adapter's
//! connection settings (the URL's `$VAR` / `${VAR}` read from the environment), the pool opened
//! and the schema migrated at start (a newer schema refused), search by meaning when an
//! embedder is configured (the hybrid retrieval over the facts, vectors in the database), the run
//! and turn journals in the same database, and the remote backends' cursors there when they run with `storage_class:
//! postgres`.

use std::sync::Arc;

use deermem_core::ConfigError;
use deermem_core::ports::{Clock, MemoryStorage, RunEventStore, TurnJournal};
use deermem_storage_postgres::{
    MigrationOutcome, PgCursors, PgDatabase, PgError, PgFactIndex, PgIndexedStorage, PgRunJournal,
    PgStorage, PgTurnJournal, PgTurnJournalOptions, PostgresConfig,
};
use deermem_updater::DeerMemConfig;

use super::EmbeddedError;

/// The storage ports on PostgreSQL, with the pool they use and the settings they came from.
pub struct PostgresStorage {
    /// What the engine uses: the storage itself, or (with an embedder) the storage with its
    /// search answered by the hybrid retrieval over its facts and their vectors.
    memory: Arc<dyn MemoryStorage>,
    store: PgDatabase,
    config: PostgresConfig,
    /// What the start-up migration did.
    migration: MigrationOutcome,
}

impl std::fmt::Debug for PostgresStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("store", &self.store)
            .field("config", &self.config)
            .field("migration", &self.migration)
            .finish_non_exhaustive()
    }
}

impl PostgresStorage {
    /// The storage ports as the engine uses them: the PostgreSQL storage, or with an
    /// embedder configured the same storage whose search is the hybrid retrieval over
    /// [`PgFactIndex`] (vectors in the `fact_vectors` table, shared by every replica).
    pub fn memory(&self) -> Arc<dyn MemoryStorage> {
        Arc::clone(&self.memory)
    }

    /// The connection pool (administrative reads).
    pub fn store(&self) -> &PgDatabase {
        &self.store
    }

    /// The turn journal in the same database, on the storage's pool: the `turn_journal` table
    /// every replica shares (leases in the rows, so the turns of a replica that died are
    /// applied by another once its leases end).
    pub fn turn_journal(&self) -> Arc<dyn TurnJournal> {
        Arc::new(PgTurnJournal::new(
            self.store.clone(),
            PgTurnJournalOptions::default(),
        ))
    }

    /// Opens the run journal in the same database.
    ///
    /// # Errors
    /// As [`PgRunJournal::open`].
    pub async fn open_run_journal(
        &self,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn RunEventStore>, PgError> {
        Ok(Arc::new(PgRunJournal::open(&self.config, clock).await?))
    }
}

/// The adapter's settings for `cfg` (which selects `storage_class: postgres`), with the URL's
/// environment reference resolved through `env`.
///
/// # Errors
/// A missing `postgres` block or URL, an unset variable, or a value the adapter refuses; the
/// URL is never quoted.
pub fn postgres_config(
    cfg: &DeerMemConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PostgresConfig, ConfigError> {
    let url_key = "memory.backend_config.postgres.url";
    let settings = &PostgresConfig::from_selected_section(cfg.storage_sections.get("postgres"))?;
    let url = match crate::env_reference(settings.url.expose().trim()) {
        Some(name) => env(name).filter(|v| !v.trim().is_empty()).ok_or_else(|| {
            ConfigError::new(url_key, format!("environment variable {name} is not set"))
        })?,
        None => settings.url.expose().to_owned(),
    };
    let config = PostgresConfig {
        url: url.into(),
        ..settings.clone()
    };
    config
        .validate()
        .map_err(|e| ConfigError::new(format!("memory.backend_config.{}", e.key), e.message))?;
    Ok(config)
}

/// Checks the `postgres` section at load time: with `storage_class: postgres` as the storage
/// reads it (a URL required), next to another storage class its keys only.
///
/// # Errors
/// The offending key, `memory.backend_config.postgres.<key>`.
pub(super) fn check_section(cfg: &DeerMemConfig) -> Result<(), ConfigError> {
    let section = cfg.storage_sections.get("postgres");
    if super::storage_class(cfg)? == super::StorageClass::Postgres {
        PostgresConfig::from_selected_section(section)?;
    } else if let Some(v) = section.filter(|v| !v.is_null()) {
        PostgresConfig::from_section(v)?;
    }
    Ok(())
}

/// Connects, applies the pending schema migrations (refusing a schema newer than this build)
/// and returns the storage. Callable from synchronous code and from inside any tokio runtime.
/// On a multi-threaded runtime (the CLI's, the gateway's) the work runs on it, so the pool's
/// connections live there; elsewhere (a current-thread runtime, no runtime) it runs on a
/// short-lived runtime of its own, and the pool replaces the connection that runtime took
/// with it on first use.
///
/// # Errors
/// [`EmbeddedError::Config`] for the settings, [`EmbeddedError::Postgres`] when the database
/// cannot be reached or its schema is newer.
pub(super) fn open(
    cfg: &DeerMemConfig,
    clock: Arc<dyn Clock>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PostgresStorage, EmbeddedError> {
    let config = postgres_config(cfg, env)?;
    let (store, migration) = connect_and_migrate(&config)?;
    let storage = Arc::new(
        PgStorage::new(
            store.clone(),
            Arc::clone(&clock),
            cfg.eviction_access_half_life_days as f64,
            cfg.eviction_audit_max_entries,
        )
        .with_cache_max_scopes(cfg.cache_max_scopes),
    );
    let memory = with_search_by_meaning(cfg, &storage, &store, clock)?;
    Ok(PostgresStorage {
        memory,
        store,
        config,
        migration,
    })
}

/// The storage as the engine uses it: `storage` itself without an embedder; with one, the
/// storage whose search goes through the engine's hybrid retrieval over the facts
/// ([`PgFactIndex`]: BM25 from the storage's own search, vectors in `fact_vectors`).
///
/// # Errors
/// The embedder cannot be opened (see [`super::open_embedder`]), or the engine is not compiled
/// in.
fn with_search_by_meaning(
    cfg: &DeerMemConfig,
    storage: &Arc<PgStorage>,
    store: &PgDatabase,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn MemoryStorage>, ConfigError> {
    let Some(embedder) = super::open_embedder(cfg)? else {
        return Ok(Arc::clone(storage) as Arc<dyn MemoryStorage>);
    };
    #[cfg(feature = "engine")]
    {
        let index = Arc::new(PgFactIndex::new(Arc::clone(storage), store.clone(), clock));
        let hybrid = deermem_engine::hybrid::HybridRetrieval::new(
            Arc::clone(&index) as Arc<dyn deermem_core::ports::Retrieval>,
            index as Arc<dyn deermem_core::ports::VectorIndex>,
            embedder,
            cfg.default_search_mode(),
        );
        Ok(Arc::new(PgIndexedStorage::new(
            Arc::clone(storage),
            Arc::new(hybrid),
        )))
    }
    #[cfg(not(feature = "engine"))]
    {
        let _ = (embedder, store, clock);
        Err(ConfigError::new(
            "memory.backend_config.embedding.provider",
            "search by meaning needs the engine; rebuild with the Cargo feature `engine` of the `deermem` crate",
        ))
    }
}

/// Connects and applies the pending migrations, on the caller's multi-threaded runtime when
/// there is one (see [`open`]), else on a short-lived runtime of its own.
fn connect_and_migrate(config: &PostgresConfig) -> Result<(PgDatabase, MigrationOutcome), PgError> {
    let work = async {
        let store = PgDatabase::connect(config).await?;
        let migration = store.migrate().await?;
        Ok::<_, PgError>((store, migration))
    };
    let (store, migration) = match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(work))?
        }
        _ => std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| PgError::Connect {
                            message: format!("cannot start a runtime to connect: {e}"),
                            source: None,
                        })?;
                    runtime.block_on(work)
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(PgError::Connect {
                        message: "the connection thread stopped unexpectedly".into(),
                        source: None,
                    })
                })
                // The connection went with that runtime: none is kept.
                .inspect(|(store, _)| store.close_idle())
        })?,
    };
    if !migration.applied.is_empty() {
        tracing::info!(
            applied = ?migration.applied,
            version = migration.version,
            schema = store.schema(),
            "applied PostgreSQL schema migrations"
        );
    }
    Ok((store, migration))
}

/// The Honcho and OpenViking cursor store in the database `backend_config` names
/// (`storage_class: postgres` with its `postgres` block), migrated like the storage at start.
/// Only those two keys are read with DeerMem's parser: every other key is the remote
/// backend's, even one whose name DeerMem also uses with another type (the backend reports its
/// own warnings).
///
/// # Errors
/// As opening the PostgreSQL storage: configuration, connection and migration errors.
pub fn remote_cursors(
    backend_config: &serde_json::Map<String, serde_json::Value>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn deermem_core::ports::CursorStorage>, EmbeddedError> {
    let selection: serde_json::Map<String, serde_json::Value> = backend_config
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "storage_class" | "postgres"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let (cfg, _) = DeerMemConfig::from_backend_config_with_sections(
        &selection,
        &super::select::storage_sections(),
    )?;
    let mut config = postgres_config(&cfg, env)?;
    // Cursors are read and written in transactions of their own: no read leases, no listener.
    config.coherence = deermem_storage_postgres::Coherence::RevisionCheck;
    let (store, _) = connect_and_migrate(&config)?;
    Ok(Arc::new(PgCursors::new(store)))
}
