//! Administrative reads of the database that are not storage ports: which users it holds and
//! which agent scopes a user has (the hosts' `deermem index rebuild --user`, operators' tools).

use deermem_core::{AgentName, UserId};

use crate::error::PgError;
use crate::store::PgDatabase;

impl PgDatabase {
    /// The raw ids of the users the database holds data for, sorted: the id recorded in one of
    /// the user's facts, else the bucket itself when it is a valid id of its own bucket. The
    /// legacy root layout (the empty bucket) is not a user.
    ///
    /// # Errors
    /// [`PgError::Connect`] or [`PgError::Statement`].
    pub async fn list_users(&self) -> Result<Vec<UserId>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT u.bucket, (SELECT f.fact->>'user_id' FROM facts f \
                   WHERE f.bucket = u.bucket AND f.fact->>'user_id' IS NOT NULL LIMIT 1) \
                 FROM users u WHERE u.bucket <> '' ORDER BY u.bucket COLLATE \"C\"",
                &[],
            )
            .await
            .map_err(|source| PgError::Statement {
                context: "list the users",
                source,
            })?;
        let mut out: Vec<UserId> = rows
            .iter()
            .filter_map(|row| {
                let bucket: String = row.get(0);
                let recorded: Option<String> = row.get(1);
                recorded
                    .and_then(|raw| UserId::new(&raw).ok())
                    .filter(|u| u.bucket() == bucket)
                    .or_else(|| UserId::new(&bucket).ok().filter(|u| u.bucket() == bucket))
            })
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// The agent scopes `user` has facts or metadata in, sorted (names that are not valid
    /// agent names are left out).
    ///
    /// # Errors
    /// [`PgError::Connect`] or [`PgError::Statement`].
    pub async fn agents_of(&self, user: &UserId) -> Result<Vec<AgentName>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT agent FROM facts WHERE bucket = $1 \
                 UNION SELECT agent FROM fact_metadata WHERE bucket = $1",
                &[&user.bucket()],
            )
            .await
            .map_err(|source| PgError::Statement {
                context: "list a user's agents",
                source,
            })?;
        let mut out: Vec<AgentName> = rows
            .iter()
            .filter_map(|row| AgentName::parse(row.get::<_, &str>(0)).ok())
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }
}
