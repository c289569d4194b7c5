//! The run journal port (`RunEventStore`) on PostgreSQL: the `run_events` table, written in one
//! transaction per record under a per-run advisory lock, so every replica sees one memory block
//! per run and per-user sequence numbers that are never reused.

use std::io;
use std::sync::Arc;

use deermem_core::ports::Clock;
use deermem_core::ports::RunEventStore;
use deermem_core::ports::run_journal::{
    CONTEXT_MEMORY_EVENT, EventQuery, EventsLookup, JournalError, RecordOutcome, RunEvent,
    check_record_args, settle_recorded, validate_run_key,
};
use deermem_core::{AgentName, UserId};
use serde_json::Value;
use tokio_postgres::Row;

use crate::config::PostgresConfig;
use crate::error::PgError;
use crate::store::PgDatabase;

/// The most connections the journal's own pool opens (one small transaction per record).
const JOURNAL_POOL_SIZE: usize = 2;

/// The run journal in the database.
pub struct PgRunJournal {
    store: PgDatabase,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for PgRunJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRunJournal")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

fn io_error(context: &str, e: impl std::error::Error + Send + Sync + 'static) -> JournalError {
    JournalError::Io {
        context: format!("run journal in PostgreSQL: {context}"),
        source: io::Error::other(e),
    }
}

impl PgRunJournal {
    /// Connects and applies pending migrations.
    ///
    /// # Errors
    /// As [`PgDatabase::connect`] and [`PgDatabase::migrate`].
    pub async fn open(config: &PostgresConfig, clock: Arc<dyn Clock>) -> Result<Self, PgError> {
        // The journal's own pool: no read leases (it serves no facts, so no listener), at most
        // two connections, and none kept open from the start-up migration.
        let mut own = config.clone();
        own.coherence = crate::Coherence::RevisionCheck;
        own.pool_size = own.pool_size.min(JOURNAL_POOL_SIZE);
        let store = PgDatabase::connect(&own).await?;
        store.migrate().await?;
        store.close_idle();
        Ok(Self { store, clock })
    }

    async fn record(
        &self,
        user: &UserId,
        agent: Option<&AgentName>,
        thread_id: &str,
        run_id: &str,
        content_sha256: &str,
    ) -> Result<RecordOutcome, JournalError> {
        let mut client = self
            .store
            .client()
            .await
            .map_err(|e| io_error("connect", e))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| io_error("begin", e))?;
        let bucket = user.bucket();
        // Replicas recording the same run take turns; different runs do not wait.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2 || '/' || $3))",
            &[&bucket, &thread_id, &run_id],
        )
        .await
        .map_err(|e| io_error("lock the run", e))?;
        let existing = tx
            .query_opt(
                &format!(
                    "SELECT {COLUMNS} FROM run_events WHERE bucket = $1 AND thread_id = $2 \
                          AND run_id = $3 AND event_type = $4"
                ),
                &[&bucket, &thread_id, &run_id, &CONTEXT_MEMORY_EVENT],
            )
            .await
            .map_err(|e| io_error("read the run", e))?;
        if let Some(row) = existing {
            return settle_recorded(event_from(&row)?, content_sha256);
        }
        let seq: i64 = tx
            .query_one(
                "INSERT INTO run_event_counters (bucket, last_seq) VALUES ($1, 1) \
                 ON CONFLICT (bucket) DO UPDATE SET last_seq = run_event_counters.last_seq + 1 \
                 RETURNING last_seq",
                &[&bucket],
            )
            .await
            .map_err(|e| io_error("allocate a sequence number", e))?
            .get(0);
        let event = RunEvent::context_memory(
            u64::try_from(seq).map_err(|e| io_error("sequence number", e))?,
            thread_id,
            run_id,
            agent,
            content_sha256,
            self.clock.now().to_iso_z(),
        );
        tx.execute(
            "INSERT INTO run_events (bucket, seq, thread_id, run_id, event_type, category, \
             content, metadata, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &bucket,
                &seq,
                &event.thread_id,
                &event.run_id,
                &event.event_type,
                &event.category,
                &Value::Object(event.content.clone()),
                &Value::Object(event.metadata.clone()),
                &event.created_at,
            ],
        )
        .await
        .map_err(|e| io_error("append the event", e))?;
        tx.commit().await.map_err(|e| io_error("commit", e))?;
        Ok(RecordOutcome::Recorded(event))
    }

    async fn lookup(
        &self,
        user: &UserId,
        thread_id: &str,
        run_id: &str,
        query: &EventQuery,
    ) -> Result<EventsLookup, JournalError> {
        let client = self
            .store
            .client()
            .await
            .map_err(|e| io_error("connect", e))?;
        let bucket = user.bucket();
        let known: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM run_events WHERE bucket = $1 AND thread_id = $2)",
                &[&bucket, &thread_id],
            )
            .await
            .map_err(|e| io_error("look up the thread", e))?
            .get(0);
        if !known {
            return Ok(EventsLookup::UnknownThread);
        }
        let after = query
            .after_seq
            .map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX));
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let types: Option<Vec<String>> = query.event_types.clone();
        let run_known: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM run_events WHERE bucket = $1 AND thread_id = $2 \
                 AND run_id = $3)",
                &[&bucket, &thread_id, &run_id],
            )
            .await
            .map_err(|e| io_error("look up the run", e))?
            .get(0);
        if !run_known {
            return Ok(EventsLookup::UnknownRun);
        }
        let rows = client
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM run_events WHERE bucket = $1 AND thread_id = $2 \
                          AND run_id = $3 AND seq > $4 \
                          AND ($5::text[] IS NULL OR event_type = ANY($5)) \
                          ORDER BY seq LIMIT $6"
                ),
                &[&bucket, &thread_id, &run_id, &after, &types, &limit],
            )
            .await
            .map_err(|e| io_error("read the run's events", e))?;
        rows.iter()
            .map(event_from)
            .collect::<Result<Vec<_>, _>>()
            .map(EventsLookup::Events)
    }
}

const COLUMNS: &str = "seq, thread_id, run_id, event_type, category, content, metadata, created_at";

fn event_from(row: &Row) -> Result<RunEvent, JournalError> {
    let object = |v: Value, what: &str| match v {
        Value::Object(m) => Ok(m),
        other => Err(io_error(
            "read an event",
            io::Error::other(format!("{what} is not an object: {other}")),
        )),
    };
    let seq: i64 = row.get(0);
    Ok(RunEvent {
        seq: u64::try_from(seq).map_err(|e| io_error("read an event", e))?,
        thread_id: row.get(1),
        run_id: row.get(2),
        event_type: row.get(3),
        category: row.get(4),
        content: object(row.get(5), "content")?,
        metadata: object(row.get(6), "metadata")?,
        created_at: row.get(7),
    })
}

#[async_trait::async_trait]
impl RunEventStore for PgRunJournal {
    async fn record_context(
        &self,
        user: &UserId,
        agent: Option<&AgentName>,
        thread_id: &str,
        run_id: &str,
        content_sha256: &str,
    ) -> Result<RecordOutcome, JournalError> {
        check_record_args(thread_id, run_id, content_sha256)?;
        self.record(user, agent, thread_id, run_id, content_sha256)
            .await
    }

    async fn events(
        &self,
        user: &UserId,
        thread_id: &str,
        run_id: &str,
        query: &EventQuery,
    ) -> Result<EventsLookup, JournalError> {
        validate_run_key("thread_id", thread_id)?;
        validate_run_key("run_id", run_id)?;
        self.lookup(user, thread_id, run_id, query).await
    }
}
