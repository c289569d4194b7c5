//! The turn journal port (`TurnJournal`) on PostgreSQL: the `turn_journal` table, shared by
//! every replica on the database, so a turn one replica acknowledged is applied by another when
//! the first dies.
//!
//! Each operation is one statement (autocommit): an append is durable once it returns, as
//! PostgreSQL's default `synchronous_commit` makes every commit. Leases are columns of the row
//! (`lease_owner`, `lease_until`); [`TurnJournal::claim`] is one `UPDATE` over a `SELECT … FOR
//! UPDATE SKIP LOCKED`, so replicas claiming at the same instant never get the same item, and
//! an item whose owner stopped renewing is claimed by another once its lease has ended (by the
//! claimer's clock, as the port says). Connection failures are
//! [`TurnJournalError::Unavailable`] with PostgreSQL's reason, never the URL or its password.

use std::time::Duration;

use async_trait::async_trait;
use deermem_core::ports::TurnJournal;
use deermem_core::ports::turn_journal::{
    ClaimRequest, NewTurn, TurnCounts, TurnFilter, TurnId, TurnIdentity, TurnItem,
    TurnJournalError, TurnState, bounded_error,
};
use deermem_core::{AgentName, Message, Timestamp, UserId};
use tokio_postgres::Row;

use crate::error::{PgError, db_message, is_unavailable};
use crate::store::PgDatabase;

/// Settings of a [`PgTurnJournal`] (those of the file journal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PgTurnJournalOptions {
    /// Bytes of live items beyond which an append is refused as full (0: no bound). Appends
    /// that run at the same instant on several replicas may together pass it by their own size.
    pub max_bytes: u64,
}

impl Default for PgTurnJournalOptions {
    fn default() -> Self {
        Self {
            max_bytes: 512 * 1024 * 1024,
        }
    }
}

/// The turn journal in the database (see the module documentation).
#[derive(Clone, Debug)]
pub struct PgTurnJournal {
    store: PgDatabase,
    options: PgTurnJournalOptions,
}

/// The columns an item is read from, in [`item_from`]'s order.
const COLUMNS: &str = "id, user_id, agent, thread_id, trace_id, signals, emergency, messages, \
                       accepted_at, attempts, next_attempt_at, last_error, state, seq";

/// [`COLUMNS`] of the table aliased `t`.
const T_COLUMNS: &str = "t.id, t.user_id, t.agent, t.thread_id, t.trace_id, t.signals, \
                         t.emergency, t.messages, t.accepted_at, t.attempts, t.next_attempt_at, \
                         t.last_error, t.state, t.seq";

/// A failure to take a connection.
fn connect_error(e: PgError) -> TurnJournalError {
    // `PgError`'s text is PostgreSQL's or the pool's reason, never the URL.
    let message = format!("PostgreSQL turn journal: {e}");
    TurnJournalError::unavailable(message, e)
}

/// A statement's failure: bad data (SQLSTATE class 22, e.g. a NUL character in a text
/// column) is [`TurnJournalError::Invalid`]; anything else leaves the journal unusable now.
fn statement_error(context: &'static str) -> impl Fn(tokio_postgres::Error) -> TurnJournalError {
    move |e| {
        let reason = db_message(&e);
        let data = !is_unavailable(&e)
            && e.as_db_error()
                .is_some_and(|db| db.code().code().starts_with("22"));
        if data {
            TurnJournalError::Invalid(format!("PostgreSQL turn journal ({context}): {reason}"))
        } else {
            TurnJournalError::unavailable(
                format!("PostgreSQL turn journal ({context}): {reason}"),
                e,
            )
        }
    }
}

/// A stored value that does not read back (a row written by hand or by another program).
fn corrupt(id: &str, what: impl std::fmt::Display) -> TurnJournalError {
    TurnJournalError::Invalid(format!(
        "turn {id:?} in the PostgreSQL turn journal cannot be read: {what}"
    ))
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// What an item weighs against the byte bound: its messages' JSON and its identity's texts.
fn weight(messages_json: &str, identity: &TurnIdentity) -> u64 {
    let texts = identity.id.as_str().len()
        + identity.user.as_ref().map_or(0, |u| u.as_str().len())
        + identity.agent.as_str().len()
        + identity.thread_id.len()
        + identity.trace_id.as_ref().map_or(0, String::len)
        + identity.signals.iter().map(String::len).sum::<usize>();
    u64::try_from(messages_json.len() + texts).unwrap_or(u64::MAX)
}

/// An item and its append order, from a row of [`COLUMNS`].
fn item_from(row: &Row) -> Result<(TurnItem, i64), TurnJournalError> {
    let raw_id: String = row.get(0);
    let id = TurnId::parse(&raw_id).map_err(|e| corrupt(&raw_id, e))?;
    let user = row
        .get::<_, Option<String>>(1)
        .map(UserId::new)
        .transpose()
        .map_err(|e| corrupt(&raw_id, e))?;
    let agent = AgentName::parse(row.get::<_, &str>(2)).map_err(|e| corrupt(&raw_id, e))?;
    let messages: Vec<Message> = serde_json::from_value(row.get::<_, serde_json::Value>(7))
        .map_err(|e| corrupt(&raw_id, e))?;
    let attempts: i32 = row.get(9);
    let state = match row.get::<_, &str>(12) {
        "pending" => TurnState::Pending,
        "dead" => TurnState::Dead,
        other => return Err(corrupt(&raw_id, format!("unknown state {other:?}"))),
    };
    let item = TurnItem {
        identity: TurnIdentity {
            id,
            user,
            agent,
            thread_id: row.get(3),
            trace_id: row.get(4),
            signals: row.get(5),
            emergency: row.get(6),
        },
        messages,
        accepted_at: Timestamp::from_unix_micros(row.get(8)),
        attempts: u32::try_from(attempts).unwrap_or(0),
        next_attempt_at: row
            .get::<_, Option<i64>>(10)
            .map(Timestamp::from_unix_micros),
        last_error: row.get(11),
        state,
    };
    Ok((item, row.get(13)))
}

/// Items of `rows` oldest accepted first; a row that does not read back is skipped with a
/// warning (one bad row must not hide the others), as the file journal skips a bad line.
fn items_from(rows: &[Row]) -> Vec<TurnItem> {
    let mut items: Vec<(TurnItem, i64)> = Vec::with_capacity(rows.len());
    for row in rows {
        match item_from(row) {
            Ok(item) => items.push(item),
            Err(e) => {
                tracing::warn!(error = %e, "a turn journal row that does not read back was skipped")
            }
        }
    }
    items.sort_by_key(|(i, seq)| (i.accepted_at, *seq));
    items.into_iter().map(|(i, _)| i).collect()
}

impl PgTurnJournal {
    /// The journal in `store`'s schema (migrated: the table comes with schema version 6),
    /// sharing its pool.
    pub fn new(store: PgDatabase, options: PgTurnJournalOptions) -> Self {
        Self { store, options }
    }

    /// The journal's settings.
    pub fn options(&self) -> PgTurnJournalOptions {
        self.options
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, TurnJournalError> {
        self.store.client().await.map_err(connect_error)
    }

    async fn insert(
        &self,
        turn: NewTurn,
        lease: Option<(&str, Duration)>,
    ) -> Result<TurnItem, TurnJournalError> {
        let messages = serde_json::to_value(&turn.messages)
            .map_err(|e| TurnJournalError::Invalid(format!("cannot encode the messages: {e}")))?;
        let bytes = weight(&messages.to_string(), &turn.identity);
        let bytes_param = i64::try_from(bytes).unwrap_or(i64::MAX);
        let max = i64::try_from(self.options.max_bytes).unwrap_or(i64::MAX);
        let accepted = turn.accepted_at.unix_micros();
        let (owner, until) = match lease {
            Some((owner, lease)) => (
                Some(owner),
                Some(
                    turn.accepted_at
                        .saturating_add_micros(micros(lease))
                        .unix_micros(),
                ),
            ),
            None => (None, None),
        };
        let identity = &turn.identity;
        let user = identity.user.as_ref().map(UserId::as_str);
        let client = self.client().await?;
        // The bound and the insert in one statement: the sum is what this statement sees.
        let row = client
            .query_one(
                "WITH held AS (SELECT coalesce(sum(bytes), 0)::int8 AS b FROM turn_journal), \
                 added AS ( \
                   INSERT INTO turn_journal (id, user_id, agent, thread_id, trace_id, signals, \
                     emergency, messages, accepted_at, bytes, lease_owner, lease_until) \
                   SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text[], $7::bool, \
                     $8::json, $9::int8, $10::int8, $11::text, $12::int8 FROM held \
                   WHERE $13::int8 = 0 OR held.b + $10::int8 <= $13::int8 \
                   ON CONFLICT (id) DO NOTHING RETURNING 1) \
                 SELECT (SELECT count(*) FROM added)::int8, (SELECT b FROM held)",
                &[
                    &identity.id.as_str(),
                    &user,
                    &identity.agent.as_str(),
                    &identity.thread_id,
                    &identity.trace_id,
                    &identity.signals,
                    &identity.emergency,
                    &messages,
                    &accepted,
                    &bytes_param,
                    &owner,
                    &until,
                    &max,
                ],
            )
            .await
            .map_err(statement_error("append a turn"))?;
        let added: i64 = row.get(0);
        if added == 1 {
            return Ok(TurnItem::new(turn));
        }
        let held: i64 = row.get(1);
        let exists: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM turn_journal WHERE id = $1)",
                &[&identity.id.as_str()],
            )
            .await
            .map_err(statement_error("look up a turn"))?
            .get(0);
        if exists {
            return Err(TurnJournalError::Duplicate(turn.identity.id));
        }
        Err(TurnJournalError::Full {
            message: format!(
                "{held} bytes held + {bytes} > {} bytes in the PostgreSQL turn journal",
                self.options.max_bytes
            ),
        })
    }

    /// One item by id.
    async fn one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        context: &'static str,
    ) -> Result<Option<TurnItem>, TurnJournalError> {
        let client = self.client().await?;
        let row = client
            .query_opt(sql, params)
            .await
            .map_err(statement_error(context))?;
        row.as_ref()
            .map(item_from)
            .transpose()
            .map(|r| r.map(|(i, _)| i))
    }

    /// How many rows a change touched (0 or 1).
    async fn change(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        context: &'static str,
    ) -> Result<bool, TurnJournalError> {
        let client = self.client().await?;
        let n = client
            .execute(sql, params)
            .await
            .map_err(statement_error(context))?;
        Ok(n > 0)
    }
}

#[async_trait]
impl TurnJournal for PgTurnJournal {
    async fn append(&self, turn: NewTurn) -> Result<TurnItem, TurnJournalError> {
        self.insert(turn, None).await
    }

    async fn append_leased(
        &self,
        turn: NewTurn,
        owner: &str,
        lease: Duration,
    ) -> Result<TurnItem, TurnJournalError> {
        self.insert(turn, Some((owner, lease))).await
    }

    async fn complete(&self, id: &TurnId) -> Result<bool, TurnJournalError> {
        self.change(
            "DELETE FROM turn_journal WHERE id = $1",
            &[&id.as_str()],
            "mark a turn done",
        )
        .await
    }

    async fn record_failure(
        &self,
        id: &TurnId,
        error: &str,
        next_attempt_at: Timestamp,
    ) -> Result<Option<TurnItem>, TurnJournalError> {
        let error = bounded_error(error);
        let next = next_attempt_at.unix_micros();
        self.one(
            &format!(
                "UPDATE turn_journal SET attempts = least(attempts, 2147483646) + 1, \
                 last_error = $2, next_attempt_at = $3, lease_owner = NULL, lease_until = NULL \
                 WHERE id = $1 RETURNING {COLUMNS}"
            ),
            &[&id.as_str(), &error, &next],
            "record a failed attempt",
        )
        .await
    }

    async fn dead_letter(&self, id: &TurnId, error: &str) -> Result<bool, TurnJournalError> {
        let error = bounded_error(error);
        self.change(
            "UPDATE turn_journal SET state = 'dead', last_error = $2, lease_owner = NULL, \
             lease_until = NULL WHERE id = $1 AND state = 'pending'",
            &[&id.as_str(), &error],
            "dead-letter a turn",
        )
        .await
    }

    async fn retry(&self, id: &TurnId) -> Result<Option<TurnItem>, TurnJournalError> {
        self.one(
            &format!(
                "UPDATE turn_journal SET state = 'pending', attempts = 0, next_attempt_at = NULL, \
                 lease_owner = NULL, lease_until = NULL \
                 WHERE id = $1 AND state = 'dead' RETURNING {COLUMNS}"
            ),
            &[&id.as_str()],
            "retry a dead turn",
        )
        .await
    }

    async fn drop_turn(&self, id: &TurnId) -> Result<bool, TurnJournalError> {
        self.change(
            "DELETE FROM turn_journal WHERE id = $1",
            &[&id.as_str()],
            "drop a turn",
        )
        .await
    }

    async fn list(&self, filter: &TurnFilter) -> Result<Vec<TurnItem>, TurnJournalError> {
        let user = filter.user.as_ref().map(UserId::as_str);
        let state = filter.state.map(TurnState::as_str);
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM turn_journal \
                     WHERE ($1::text IS NULL OR user_id = $1) \
                       AND ($2::text IS NULL OR state = $2) \
                     ORDER BY accepted_at, seq"
                ),
                &[&user, &state],
            )
            .await
            .map_err(statement_error("list the turns"))?;
        Ok(items_from(&rows))
    }

    async fn counts(&self) -> Result<TurnCounts, TurnJournalError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE state = 'pending')::int8, \
                        count(*) FILTER (WHERE state = 'dead')::int8 FROM turn_journal",
                &[],
            )
            .await
            .map_err(statement_error("count the turns"))?;
        let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok(TurnCounts {
            pending: count(0),
            dead: count(1),
        })
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<TurnItem>, TurnJournalError> {
        let now = request.now.unix_micros();
        let until = request
            .now
            .saturating_add_micros(micros(request.lease))
            .unix_micros();
        let limit: Option<i64> =
            (request.limit > 0).then(|| i64::try_from(request.limit).unwrap_or(i64::MAX));
        let client = self.client().await?;
        // Rows another claimer has locked are skipped, and a row another claimer leased since
        // this statement's snapshot is checked again once locked (and left to it): two
        // replicas never lease the same item. `LIMIT NULL` is no limit.
        let rows = client
            .query(
                &format!(
                    "WITH picked AS ( \
                       SELECT id FROM turn_journal \
                       WHERE state = 'pending' \
                         AND (lease_owner IS NULL OR lease_owner = $1 OR lease_until <= $2) \
                       ORDER BY accepted_at, seq \
                       LIMIT $4 \
                       FOR UPDATE SKIP LOCKED) \
                     UPDATE turn_journal t SET lease_owner = $1, lease_until = $3 \
                     FROM picked WHERE t.id = picked.id \
                     RETURNING {T_COLUMNS}"
                ),
                &[&request.owner, &now, &until, &limit],
            )
            .await
            .map_err(statement_error("claim turns"))?;
        Ok(items_from(&rows))
    }

    async fn release(&self, id: &TurnId, owner: &str) -> Result<(), TurnJournalError> {
        self.change(
            "UPDATE turn_journal SET lease_owner = NULL, lease_until = NULL \
             WHERE id = $1 AND lease_owner = $2",
            &[&id.as_str(), &owner],
            "release a turn",
        )
        .await
        .map(|_| ())
    }
}
