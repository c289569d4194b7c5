//! Whole-user snapshots, an administrative operation for moving data to and from another
//! storage (`deermem migrate --from/--to`): [`PgDatabase::list_buckets`],
//! [`PgDatabase::read_snapshot`] and [`PgDatabase::write_snapshot`] read and write one user bucket
//! with every stored value kept (revisions, timestamps, the raw user id each fact records, the
//! sidecars' key order). A write is one transaction with the user's row locked and the
//! replicas' read leases on the bucket revoked: a bucket is either wholly copied or untouched,
//! and no replica serves it as it was once the write returns.

use deermem_core::snapshot::{AgentSnapshot, UserSnapshot};
use deermem_core::{AgentName, Timestamp};
use serde_json::Value;
use tokio_postgres::GenericClient;

use crate::error::PgError;
use crate::lease::FENCE_SQL;
use crate::store::PgDatabase;
use crate::stored::{decode_fact, decode_sections, encode_sections, write_fact, write_user};

fn statement(context: &'static str) -> impl Fn(tokio_postgres::Error) -> PgError {
    move |source| PgError::Statement { context, source }
}

fn corrupt(bucket: &str, what: &str, e: impl std::fmt::Display) -> PgError {
    PgError::Snapshot {
        bucket: bucket.to_owned(),
        message: format!("its stored {what} is not readable: {e}"),
    }
}

impl PgDatabase {
    /// The user buckets holding a record, facts or metadata, sorted (byte order).
    ///
    /// # Errors
    /// [`PgError::Connect`] / [`PgError::Statement`].
    pub async fn list_buckets(&self) -> Result<Vec<String>, PgError> {
        let client = self.client().await?;
        Ok(client
            .query(
                "SELECT b FROM (SELECT bucket FROM users WHERE revision > 0 \
                 UNION SELECT bucket FROM facts UNION SELECT bucket FROM fact_metadata) AS u(b) \
                 ORDER BY b COLLATE \"C\"",
                &[],
            )
            .await
            .map_err(statement("list the users"))?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// The whole of one user bucket, or `None` when it holds nothing. Read in one
    /// repeatable-read transaction, so concurrent commits are seen wholly or not at all.
    ///
    /// # Errors
    /// [`PgError::Snapshot`] for a stored value that does not read back;
    /// [`PgError::Connect`] / [`PgError::Statement`].
    pub async fn read_snapshot(
        &self,
        bucket: &str,
        now: Timestamp,
    ) -> Result<Option<UserSnapshot>, PgError> {
        let mut client = self.client().await?;
        let raw: &mut tokio_postgres::Client = &mut client;
        let tx = raw
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(statement("begin"))?;
        let snap = read_in(&tx, bucket, now).await?;
        tx.commit().await.map_err(statement("end"))?;
        Ok(snap.filter(|s| !s.is_empty()))
    }

    /// Replaces the user bucket with `snapshot` in one transaction: its record (revision,
    /// summaries, last update), its facts and metadata exactly, and no other fact or metadata
    /// of the bucket.
    ///
    /// # Errors
    /// [`PgError::Snapshot`] for a revision beyond the database's range;
    /// [`PgError::Connect`] / [`PgError::Statement`] (the transaction is rolled back).
    pub async fn write_snapshot(&self, snapshot: &UserSnapshot) -> Result<(), PgError> {
        let b = snapshot.bucket.as_str();
        let too_big = |what: &str| PgError::Snapshot {
            bucket: b.to_owned(),
            message: format!("its {what} does not fit a PostgreSQL bigint"),
        };
        let revision = i64::try_from(snapshot.revision).map_err(|_| too_big("revision"))?;
        let fence = self.leases().fence(b);
        let mut client = self.client().await?;
        let fenced = client
            .prepare_cached(FENCE_SQL)
            .await
            .map_err(statement("prepare a statement"))?;
        let raw: &mut tokio_postgres::Client = &mut client;
        let tx = raw.transaction().await.map_err(statement("begin"))?;
        tx.execute(
            "INSERT INTO users (bucket) VALUES ($1) ON CONFLICT (bucket) DO NOTHING",
            &[&b],
        )
        .await
        .map_err(statement("create the user"))?;
        // The user's row locked and the replicas' read leases on the bucket revoked.
        let revoked = fence
            .revoke(&tx, &fenced)
            .await
            .map_err(statement("lock the user and revoke the read leases"))?;
        tx.execute("DELETE FROM facts WHERE bucket = $1", &[&b])
            .await
            .map_err(statement("replace the facts"))?;
        tx.execute("DELETE FROM fact_metadata WHERE bucket = $1", &[&b])
            .await
            .map_err(statement("replace the metadata"))?;
        write_user(
            &tx,
            b,
            revision,
            &encode_sections(snapshot.user.0.clone(), snapshot.history.0.clone()),
            &snapshot.last_updated,
        )
        .await
        .map_err(statement("write the user"))?;
        for a in &snapshot.agents {
            let agent = a.agent.as_str();
            for f in &a.facts {
                let fact_revision =
                    i64::try_from(f.revision).map_err(|_| too_big("fact revision"))?;
                // The search columns exactly as the storage's commits write them.
                write_fact(&tx, (b, agent), f, fact_revision)
                    .await
                    .map_err(statement("write a fact"))?;
            }
            if a.usage.is_some() || a.audit.is_some() {
                let usage = Value::Object(a.usage.clone().unwrap_or_default()).to_string();
                let audit = Value::Array(a.audit.clone().unwrap_or_default()).to_string();
                tx.execute(
                    "INSERT INTO fact_metadata (bucket, agent, usage, audit) \
                     VALUES ($1, $2, $3::text::json, $4::text::json)",
                    &[&b, &agent, &usage, &audit],
                )
                .await
                .map_err(statement("write the metadata"))?;
            }
        }
        tx.commit().await.map_err(statement("commit"))?;
        // Replaced only once no replica can serve the bucket as it was.
        fence.settle(revoked).await;
        Ok(())
    }
}

async fn read_in(
    client: &impl GenericClient,
    bucket: &str,
    now: Timestamp,
) -> Result<Option<UserSnapshot>, PgError> {
    let mut snap = UserSnapshot::empty(bucket);
    let row = client
        .query_opt(
            "SELECT revision, summaries::text, coalesce(last_updated, '') FROM users \
             WHERE bucket = $1",
            &[&bucket],
        )
        .await
        .map_err(statement("read the user"))?;
    let Some(row) = row else { return Ok(None) };
    let revision: i64 = row.get(0);
    snap.revision = u64::try_from(revision).map_err(|e| corrupt(bucket, "revision", e))?;
    if snap.revision > 0 {
        (snap.user, snap.history) =
            decode_sections(row.get(1)).map_err(|e| corrupt(bucket, e.what, e.reason))?;
        snap.last_updated = row.get(2);
    }
    let mut agents: std::collections::BTreeMap<String, AgentSnapshot> = Default::default();
    // The agent's entry, created on first sight.
    fn entry<'m>(
        agents: &'m mut std::collections::BTreeMap<String, AgentSnapshot>,
        bucket: &str,
        name: String,
    ) -> Result<&'m mut AgentSnapshot, PgError> {
        Ok(match agents.entry(name) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let agent =
                    AgentName::parse(e.key()).map_err(|err| corrupt(bucket, "agent name", err))?;
                e.insert(AgentSnapshot {
                    agent,
                    facts: Vec::new(),
                    usage: None,
                    audit: None,
                })
            }
        })
    }
    for r in client
        .query(
            "SELECT agent, fact::text FROM facts WHERE bucket = $1 \
             ORDER BY agent COLLATE \"C\", id COLLATE \"C\"",
            &[&bucket],
        )
        .await
        .map_err(statement("read the facts"))?
    {
        let fact = decode_fact(r.get(1), now).map_err(|e| corrupt(bucket, "fact", e.reason))?;
        entry(&mut agents, bucket, r.get(0))?.facts.push(fact);
    }
    for r in client
        .query(
            "SELECT agent, usage::text, audit::text FROM fact_metadata WHERE bucket = $1",
            &[&bucket],
        )
        .await
        .map_err(statement("read the metadata"))?
    {
        let name: String = r.get(0);
        let usage: Value =
            serde_json::from_str(r.get(1)).map_err(|e| corrupt(bucket, "usage", e))?;
        let audit: Value =
            serde_json::from_str(r.get(2)).map_err(|e| corrupt(bucket, "audit", e))?;
        let usage = match usage {
            Value::Object(m) if !m.is_empty() => Some(m),
            _ => None,
        };
        let audit = match audit {
            Value::Array(a) if !a.is_empty() => Some(a),
            _ => None,
        };
        if usage.is_none() && audit.is_none() {
            continue;
        }
        let entry = entry(&mut agents, bucket, name)?;
        entry.usage = usage;
        entry.audit = audit;
    }
    snap.agents = agents.into_values().collect();
    Ok(Some(snap))
}
