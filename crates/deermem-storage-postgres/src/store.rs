//! The connection pool and the schema: [`PgDatabase::connect`] opens a pool whose connections use
//! the configured schema and statement timeout, [`PgDatabase::migrate`] applies the versioned
//! migrations under `migrations/` (refinery) and refuses a database whose schema is newer than
//! this build.

use std::str::FromStr;
use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::config::SslMode;

use crate::config::Coherence;
use crate::config::PostgresConfig;
use crate::error::PgError;
use crate::lease::{Connector, LeaseHub, LeaseStats};
use crate::tls;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The refinery bookkeeping table, inside the configured schema.
const HISTORY_TABLE: &str = "refinery_schema_history";

/// What [`PgDatabase::migrate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationOutcome {
    /// Versions applied by this call, in order (empty when the schema was current).
    pub applied: Vec<i64>,
    /// The schema version afterwards.
    pub version: i64,
}

/// A pool of connections to DeerMem's schema, and this replica's read leases (see
/// [`crate::PgStorage`] and `docs/postgres.md`): one holder per store and its clones.
#[derive(Clone)]
pub struct PgDatabase {
    pool: Pool,
    schema: String,
    coherence: Coherence,
    leases: Arc<LeaseHub>,
}

impl std::fmt::Debug for PgDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.pool.status();
        f.debug_struct("PgDatabase")
            .field("schema", &self.schema)
            .field("coherence", &self.coherence)
            .field("pool_size", &status.max_size)
            .field("pool_available", &status.available)
            .finish()
    }
}

/// The newest schema version this build carries.
pub fn known_schema_version() -> i64 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| i64::from(m.version()))
        .max()
        .unwrap_or(0)
}

impl PgDatabase {
    /// Opens the pool and checks that a connection can be made. Does not migrate.
    ///
    /// # Errors
    /// [`PgError::Config`] / [`PgError::Url`] for the configuration, [`PgError::Tls`] when
    /// the TLS handshake fails (the certificate refused, no TLS on the server),
    /// [`PgError::Connect`] when the server cannot be reached in time.
    pub async fn connect(config: &PostgresConfig) -> Result<Self, PgError> {
        config.validate()?;
        let mut pg =
            tokio_postgres::Config::from_str(config.url.expose()).map_err(|e| PgError::Url {
                reason: e.to_string(),
            })?;
        // `tls.mode` decides; a URL asking for TLS while the mode is `disable` is a mistake
        // better reported than silently downgraded.
        let connector = tls::connector(&config.tls)?;
        match (&connector, pg.get_ssl_mode()) {
            (None, SslMode::Require) => {
                return Err(PgError::Config {
                    key: "postgres.tls.mode".into(),
                    message: "the URL asks for sslmode=require but tls.mode is disable; set \
                              tls.mode to require or verify-full"
                        .into(),
                });
            }
            (None, _) => pg.ssl_mode(SslMode::Disable),
            (Some(_), _) => pg.ssl_mode(SslMode::Require),
        };
        pg.connect_timeout(config.connect_timeout());
        pg.application_name("deermem");
        // Every pooled connection works in DeerMem's schema under the statement timeout.
        pg.options(format!(
            "-c search_path={} -c statement_timeout={}",
            config.schema,
            config.statement_timeout().as_millis().max(1)
        ));
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        // The lease listener's dedicated connection is made with the same settings.
        let dedicated = Connector {
            pg: pg.clone(),
            tls: connector.clone(),
        };
        let manager = match connector {
            None => Manager::from_config(pg, NoTls, manager_config),
            Some(tls) => Manager::from_config(pg, tls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.connect_timeout()))
            .create_timeout(Some(config.connect_timeout()))
            .build()
            .map_err(|e| PgError::Connect {
                message: e.to_string(),
                source: None,
            })?;
        let store = Self {
            pool,
            schema: config.schema.clone(),
            coherence: config.coherence,
            leases: LeaseHub::new(
                config.lease_duration(),
                config.coherence == Coherence::Lease,
                dedicated,
            ),
        };
        drop(store.client().await?);
        if store.coherence == Coherence::Lease {
            // Listening before the first read or write: a fresh replica's first write hears
            // the holders' answers, and its first reads take leases.
            store.leases.wait_listening(config.connect_timeout()).await;
        }
        Ok(store)
    }

    /// Gives up this replica's read leases and deletes their rows, so that no write on
    /// another replica waits for them (call it when the process stops serving; later reads
    /// take leases again). Returns how many rows were deleted.
    ///
    /// # Errors
    /// [`PgError::Connect`] or [`PgError::Statement`].
    pub async fn release_leases(&self) -> Result<u64, PgError> {
        if self.leases.stats().grants == 0 {
            // Never held one (a short-lived process, `revision_check`): nothing to delete.
            return Ok(0);
        }
        let client = self.client().await?;
        self.leases
            .release(&**client)
            .await
            .map_err(|source| PgError::Statement {
                context: "release the read leases",
                source,
            })
    }

    /// The configured schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// How this replica's storage keeps its cache coherent (`postgres.coherence`).
    pub fn coherence(&self) -> Coherence {
        self.coherence
    }

    /// This replica's lease holder id (its channel is `deermem_<id>`).
    pub fn lease_holder(&self) -> &str {
        self.leases.holder()
    }

    /// The lease counters of this replica (every clone of this store shares them).
    pub fn lease_stats(&self) -> LeaseStats {
        self.leases.stats()
    }

    /// A test hook: the listener waits `delay` before handling each revocation, as a slow
    /// holder would (zero, the default, for none).
    #[doc(hidden)]
    pub fn delay_revocations_for_tests(&self, delay: std::time::Duration) {
        self.leases.set_revocation_delay(delay);
    }

    pub(crate) fn leases(&self) -> &Arc<LeaseHub> {
        &self.leases
    }

    /// A connection from the pool.
    ///
    /// # Errors
    /// [`PgError::Connect`] when none can be had in time, [`PgError::Tls`] when a new
    /// connection's TLS handshake fails.
    pub async fn client(&self) -> Result<deadpool_postgres::Object, PgError> {
        self.pool.get().await.map_err(|e| {
            let message = e.to_string();
            match e {
                deadpool_postgres::PoolError::Backend(e) => match tls::tls_failure(&e) {
                    Some(message) => PgError::Tls { message },
                    // The server's own reason ("password authentication failed for user …",
                    // "database … does not exist"), never the URL or the password.
                    None => PgError::Connect {
                        message: crate::error::db_message(&e),
                        source: Some(e),
                    },
                },
                _ => PgError::Connect {
                    message,
                    source: None,
                },
            }
        })
    }

    /// Closes the idle connections of the pool (a store opened for a migration, or one that is
    /// used rarely, keeps none open between uses).
    pub fn close_idle(&self) {
        drop(self.pool.retain(|_, _| false));
    }

    /// One round trip to the server: whether it can be reached now.
    ///
    /// # Errors
    /// [`PgError::Connect`] (with PostgreSQL's reason) or [`PgError::Statement`].
    pub async fn ping(&self) -> Result<(), PgError> {
        let client = self.client().await?;
        client
            .simple_query("SELECT 1")
            .await
            .map_err(|source| PgError::Statement {
                context: "check the connection",
                source,
            })?;
        Ok(())
    }

    /// The newest schema version applied in the database (`None` before the first migration).
    ///
    /// # Errors
    /// [`PgError::Connect`] or [`PgError::Statement`].
    pub async fn schema_version(&self) -> Result<Option<i64>, PgError> {
        let client = self.client().await?;
        version_on(&client, &self.schema).await
    }

    /// Creates the schema when missing and applies the migrations this build carries, in one
    /// session holding an advisory lock so that replicas starting together take turns.
    ///
    /// # Errors
    /// [`PgError::SchemaTooNew`] when the database is ahead of this build (nothing is
    /// changed), [`PgError::Migration`] when a migration fails (its transaction is rolled
    /// back), [`PgError::Connect`] / [`PgError::Statement`].
    pub async fn migrate(&self) -> Result<MigrationOutcome, PgError> {
        let known = known_schema_version();
        let mut client = self.client().await?;
        let statement =
            |context: &'static str| move |source| PgError::Statement { context, source };
        // One lock per schema name: `hashtext` keeps it in the advisory key space.
        client
            .execute(
                "SELECT pg_advisory_lock(hashtext('deermem-migrate:' || $1::text))",
                &[&self.schema],
            )
            .await
            .map_err(statement("take the migration lock"))?;
        let result = self.migrate_locked(&mut client, known).await;
        let unlock = client
            .execute(
                "SELECT pg_advisory_unlock(hashtext('deermem-migrate:' || $1::text))",
                &[&self.schema],
            )
            .await
            .map_err(statement("release the migration lock"));
        let outcome = result?;
        unlock?;
        Ok(outcome)
    }

    async fn migrate_locked(
        &self,
        client: &mut deadpool_postgres::Object,
        known: i64,
    ) -> Result<MigrationOutcome, PgError> {
        if let Some(found) = version_on(client, &self.schema).await?
            && found > known
        {
            return Err(PgError::SchemaTooNew {
                schema: self.schema.clone(),
                found,
                known,
            });
        }
        client
            .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", self.schema))
            .await
            .map_err(|source| PgError::Statement {
                context: "create the schema",
                source,
            })?;
        let pg: &mut tokio_postgres::Client = &mut *client;
        let report = embedded::migrations::runner()
            .set_abort_divergent(true)
            .set_abort_missing(true)
            .run_async(pg)
            .await
            .map_err(|e| PgError::Migration {
                message: e.to_string(),
            })?;
        let applied = report
            .applied_migrations()
            .iter()
            .map(|m| i64::from(m.version()))
            .collect();
        let version = version_on(client, &self.schema).await?.unwrap_or(0);
        Ok(MigrationOutcome { applied, version })
    }
}

/// The newest applied version in `schema`'s history table, on `client`.
async fn version_on(client: &tokio_postgres::Client, schema: &str) -> Result<Option<i64>, PgError> {
    let table = format!("{schema}.{HISTORY_TABLE}");
    let exists: Option<String> = client
        .query_one("SELECT to_regclass($1)::text", &[&table])
        .await
        .map_err(|source| PgError::Statement {
            context: "look up the schema history",
            source,
        })?
        .get(0);
    if exists.is_none() {
        return Ok(None);
    }
    let row = client
        .query_one(
            &format!("SELECT max(version)::bigint FROM \"{schema}\".{HISTORY_TABLE}"),
            &[],
        )
        .await
        .map_err(|source| PgError::Statement {
            context: "read the schema version",
            source,
        })?;
    Ok(row.get::<_, Option<i64>>(0))
}
