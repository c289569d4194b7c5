//! The remote backends' cursor store ([`CursorStorage`]) in the database: the
//! `remote_cursors` table, keyed by the space and name the cursor files use, so Honcho and
//! OpenViking capture cursors are shared by every replica on the database. A write is one
//! upsert (atomic, durable once acknowledged under `synchronous_commit`).

use std::io;

use async_trait::async_trait;
use deermem_core::ports::CursorStorage;
use deermem_core::ports::cursors::ReadError;

use crate::error::PgError;
use crate::store::PgDatabase;

/// Cursors in the `remote_cursors` table.
#[derive(Clone, Debug)]
pub struct PgCursors {
    store: PgDatabase,
}

impl PgCursors {
    /// Cursors in `store`'s schema (migrated: the table comes with schema version 3).
    pub fn new(store: PgDatabase) -> Self {
        Self { store }
    }
}

fn io_error(e: PgError) -> io::Error {
    io::Error::other(e.to_string())
}

fn statement(context: &'static str) -> impl Fn(tokio_postgres::Error) -> io::Error {
    move |source| io_error(PgError::Statement { context, source })
}

#[async_trait]
impl CursorStorage for PgCursors {
    async fn read(
        &self,
        space: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, ReadError> {
        let client = self
            .store
            .client()
            .await
            .map_err(|e| ReadError::Io(io_error(e)))?;
        // The bound is checked in the database: an oversized cursor is never transferred.
        let limit = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        let row = client
            .query_opt(
                "SELECT CASE WHEN octet_length(body) <= $3::int8 THEN body END \
                 FROM remote_cursors WHERE space = $1 AND name = $2",
                &[&space, &name, &limit],
            )
            .await
            .map_err(|e| ReadError::Io(statement("read a remote cursor")(e)))?;
        let Some(row) = row else {
            return Ok(None);
        };
        match row.get::<_, Option<Vec<u8>>>(0) {
            Some(body) => Ok(Some(body)),
            None => Err(ReadError::TooLarge(max_bytes)),
        }
    }

    async fn write(&self, space: &str, name: &str, bytes: Vec<u8>) -> io::Result<()> {
        let client = self.store.client().await.map_err(io_error)?;
        client
            .execute(
                "INSERT INTO remote_cursors (space, name, body) VALUES ($1, $2, $3) \
                 ON CONFLICT (space, name) DO UPDATE SET body = EXCLUDED.body, updated_at = now()",
                &[&space, &name, &bytes],
            )
            .await
            .map_err(statement("write a remote cursor"))?;
        Ok(())
    }

    fn location(&self, space: &str, name: &str) -> String {
        format!(
            "{}.remote_cursors (space {space:?}, name {name:?})",
            self.store.schema()
        )
    }
}
