//! The turn journal's routes: `GET /api/memory/turns` (the caller's accepted turns that are
//! still pending or were dead-lettered), `POST /api/memory/turns/{turn_id}/retry` (a dead turn
//! made pending and queued at once) and `DELETE /api/memory/turns/{turn_id}` (a turn dropped
//! for good), over the [`TurnAdmin`] a host installs with
//! [`GatewayState::with_turn_journal`](crate::GatewayState::with_turn_journal).
//!
//! Every caller sees and acts on its own user's items only: the gateway has no administrator
//! identity (an internal caller acts for the user its owner header names). Another user's id
//! answers 404 like an unknown one, so ids do not leak. An operator sees everyone's items with
//! `deermem turns list`. Without a journal (`queue.durable: false`, a remote backend) the
//! routes answer 501, as the run-events route does without a run journal.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use deermem_core::Message;
use deermem_core::ports::TurnAdmin;
use deermem_core::ports::turn_journal::{
    TurnCounts, TurnFilter, TurnId, TurnItem, TurnJournalError, TurnState,
};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::auth::Caller;
use crate::error::GatewayError;
use crate::extract::{Call, shortened};
use crate::state::GatewayState;

type Result<T, E = GatewayError> = std::result::Result<T, E>;

/// The default of `limit` in `GET /api/memory/turns`.
pub(crate) const DEFAULT_TURN_LIMIT: usize = 100;
/// The largest `limit` accepted.
pub(crate) const MAX_TURN_LIMIT: usize = 1000;
/// How long a `/metrics` scrape waits for the journal's counts before leaving them out.
const COUNTS_TIMEOUT: Duration = Duration::from_secs(2);

/// The 501 detail without a turn journal.
pub(crate) const NO_TURN_JOURNAL_DETAIL: &str = "The turn journal is not in use: this gateway's memory backend keeps no durable turns (queue.durable is off, or the backend is remote).";

/// Where a journal item stands.
// How `TurnState` serialises itself, for the document only.
#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub(crate) enum JournalTurnState {
    /// Waiting for its first or next extraction attempt.
    Pending,
    /// Its attempts are spent: kept until it is retried or dropped.
    Dead,
}

/// One accepted conversation turn in the turn journal.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub(crate) struct JournalTurn {
    /// The turn's id (`turn_` and 32 hex digits).
    pub(crate) id: String,
    /// `pending` or `dead`.
    #[schemars(with = "JournalTurnState")]
    pub(crate) state: TurnState,
    /// The user the turn belongs to (always the caller's).
    pub(crate) user_id: Option<String>,
    /// The agent bucket.
    pub(crate) agent: String,
    /// The host thread id.
    pub(crate) thread_id: String,
    /// The host's trace id.
    pub(crate) trace_id: Option<String>,
    /// Signals seen at admission (`correction`, `preference`...).
    pub(crate) signals: Vec<String>,
    /// Accepted through the emergency path (processed at once, ignoring the watermark).
    pub(crate) emergency: bool,
    /// When it was accepted (ISO 8601, UTC).
    pub(crate) accepted_at: String,
    /// Failed extraction attempts so far.
    pub(crate) attempts: u32,
    /// Not tried again before this instant (ISO 8601, UTC); absent: at once.
    pub(crate) next_attempt_at: Option<String>,
    /// The last failure's message (at most 1024 bytes).
    pub(crate) last_error: Option<String>,
    /// How many messages the turn holds.
    pub(crate) message_count: usize,
    /// The size of the messages as JSON, in bytes.
    pub(crate) message_bytes: usize,
    /// The admitted messages (the caller's own conversation).
    // Serialised by `Message` itself; `JournalMessage` describes that shape.
    #[schemars(with = "Vec<JournalMessage>")]
    pub(crate) messages: Vec<Message>,
}

/// One message of a journal turn, in LangChain's shape (what `POST /api/memory/messages` took,
/// after admission).
// The schema of `Message`'s serialisation, for the document only.
#[derive(JsonSchema)]
#[allow(dead_code)]
pub(crate) struct JournalMessage {
    /// Who produced it: `human`, `ai`, `system` or `tool`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// A string, or a list of content blocks.
    pub(crate) content: Value,
    /// Host metadata; absent when empty.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub(crate) additional_kwargs: Map<String, Value>,
    /// Tool calls of an AI turn; absent when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<Value>,
    /// Message id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    /// Author name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    /// The tool call a tool result answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tool_call_id: Option<String>,
    /// A tool result's status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<String>,
}

impl JournalTurn {
    fn of(item: TurnItem) -> Self {
        let message_bytes = item
            .messages
            .iter()
            .map(|m| serde_json::to_vec(m).map_or(0, |v| v.len()))
            .sum();
        let identity = item.identity;
        Self {
            id: identity.id.as_str().to_owned(),
            state: item.state,
            user_id: identity.user.map(|u| u.as_str().to_owned()),
            agent: identity.agent.as_str().to_owned(),
            thread_id: identity.thread_id,
            trace_id: identity.trace_id,
            signals: identity.signals,
            emergency: identity.emergency,
            accepted_at: item.accepted_at.to_iso_z(),
            attempts: item.attempts,
            next_attempt_at: item.next_attempt_at.map(|t| t.to_iso_z()),
            last_error: item.last_error,
            message_count: item.messages.len(),
            message_bytes,
            messages: item.messages,
        }
    }
}

/// `GET /api/memory/turns`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub(crate) struct JournalTurnList {
    /// How many of the caller's items pass the filter (the list may be cut by `limit`).
    pub(crate) total: usize,
    /// The oldest accepted first, at most `limit`.
    pub(crate) turns: Vec<JournalTurn>,
}

/// The query of `GET /api/memory/turns`.
#[derive(JsonSchema)]
#[allow(dead_code)]
pub(crate) struct TurnsQuery {
    /// Only items in this state; absent or empty: both.
    #[schemars(extend("enum" = ["pending", "dead"]))]
    state: Option<String>,
    /// At most this many items, oldest accepted first.
    #[schemars(range(min = 1, max = MAX_TURN_LIMIT), extend("default" = DEFAULT_TURN_LIMIT))]
    limit: Option<i64>,
}

/// `{turn_id}`.
#[derive(JsonSchema)]
#[allow(dead_code)]
pub(crate) struct TurnIdPath {
    /// Turn id: 1 to 64 of [A-Za-z0-9_-].
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]+$"), length(min = 1, max = 64))]
    turn_id: String,
}

/// The `state` parameter: absent or empty means both states.
pub(crate) fn parse_state(raw: Option<&str>) -> Result<Option<TurnState>> {
    match raw {
        None | Some("") => Ok(None),
        Some("pending") => Ok(Some(TurnState::Pending)),
        Some("dead") => Ok(Some(TurnState::Dead)),
        Some(other) => Err(GatewayError::BadRequest(format!(
            "Invalid state '{}': expected 'pending' or 'dead'.",
            shortened(other, 32)
        ))),
    }
}

/// The `limit` parameter: 1 to [`MAX_TURN_LIMIT`], [`DEFAULT_TURN_LIMIT`] when absent or empty.
pub(crate) fn parse_limit(raw: Option<&str>) -> Result<usize> {
    match raw {
        None | Some("") => Ok(DEFAULT_TURN_LIMIT),
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_TURN_LIMIT).contains(&n) => Ok(n),
            _ => Err(GatewayError::BadRequest(format!(
                "Invalid limit '{}': expected an integer from 1 to {MAX_TURN_LIMIT}.",
                shortened(text, 32)
            ))),
        },
    }
}

/// A turn id taken from the path (400 when it cannot be one).
pub(crate) fn parse_turn_id(path: Result<Path<String>, PathRejection>) -> Result<TurnId> {
    let Path(raw) =
        path.map_err(|_| GatewayError::BadRequest("Invalid turn id in the path.".into()))?;
    TurnId::parse(&raw).map_err(|e| GatewayError::BadRequest(format!("Invalid turn id: {e}")))
}

fn admin(state: &GatewayState) -> Result<Arc<dyn TurnAdmin>> {
    state
        .turn_journal()
        .cloned()
        .ok_or_else(|| GatewayError::NotImplemented(NO_TURN_JOURNAL_DETAIL.into()))
}

/// Runs a journal call on its own task (a timed-out request never cancels a write half-way)
/// in the request's span, and maps its error.
async fn journal_call<T, F>(detail: &'static str, fut: F) -> Result<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T, TurnJournalError>> + Send + 'static,
{
    crate::routes::spawned(|| "turn journal".to_owned(), fut)
        .await?
        .map_err(|e| GatewayError::Journal {
            detail,
            message: e.to_string(),
        })
}

fn not_found(id: &TurnId) -> GatewayError {
    GatewayError::NotFound(format!("Turn '{id}' not found."))
}

/// The caller's own items (in `state`, or in both states), oldest accepted first.
async fn own_items(
    admin: &Arc<dyn TurnAdmin>,
    caller: &Caller,
    state: Option<TurnState>,
) -> Result<Vec<TurnItem>> {
    let user = Some(caller.user.clone());
    let (a, filter) = (Arc::clone(admin), TurnFilter { user, state });
    journal_call("Failed to read the turn journal.", async move {
        a.journal().list(&filter).await
    })
    .await
}

/// The caller's own item `id` (404 when the journal holds none for the caller's user).
async fn own_item(admin: &Arc<dyn TurnAdmin>, caller: &Caller, id: &TurnId) -> Result<TurnItem> {
    let items = own_items(admin, caller, None).await?;
    items
        .into_iter()
        .find(|i| i.id() == id)
        .ok_or_else(|| not_found(id))
}

/// `GET /api/memory/turns`: the caller's items, oldest accepted first.
pub(crate) async fn list_turns(Call { state, caller, q }: Call) -> Result<Json<JournalTurnList>> {
    let wanted = parse_state(q.get("state"))?;
    let limit = parse_limit(q.get("limit"))?;
    let items = own_items(&admin(&state)?, &caller, wanted).await?;
    let total = items.len();
    let turns = items.into_iter().take(limit).map(JournalTurn::of).collect();
    Ok(Json(JournalTurnList { total, turns }))
}

/// `POST /api/memory/turns/{turn_id}/retry`: a dead turn of the caller's made pending, its
/// attempts reset, and queued for an attempt now; answers the item as it is now.
pub(crate) async fn retry_turn(
    State(state): State<GatewayState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<JournalTurn>> {
    let id = parse_turn_id(path)?;
    let admin = admin(&state)?;
    let item = own_item(&admin, &caller, &id).await?;
    if item.state != TurnState::Dead {
        return Err(GatewayError::Conflict(format!(
            "Turn '{id}' is pending, not dead: only a dead-lettered turn can be retried."
        )));
    }
    let target = id.clone();
    let retried = journal_call("Failed to retry the turn.", async move {
        admin.retry_now(&target).await
    })
    .await?;
    match retried {
        Some(item) => {
            tracing::info!(turn_id = %id, user = %caller.user.as_str(), "turn retried through the gateway");
            Ok(Json(JournalTurn::of(item)))
        }
        None => Err(GatewayError::Conflict(format!(
            "Turn '{id}' is no longer dead: it was retried or dropped meanwhile."
        ))),
    }
}

/// `DELETE /api/memory/turns/{turn_id}`: removes one of the caller's turns for good (its
/// extraction will never run); answers the item as it was.
pub(crate) async fn drop_turn(
    State(state): State<GatewayState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<JournalTurn>> {
    let id = parse_turn_id(path)?;
    let admin = admin(&state)?;
    let item = own_item(&admin, &caller, &id).await?;
    let target = id.clone();
    let dropped = journal_call("Failed to drop the turn.", async move {
        admin.journal().drop_turn(&target).await
    })
    .await?;
    if !dropped {
        // Completed or dropped between the lookup and now.
        return Err(not_found(&id));
    }
    tracing::info!(turn_id = %id, user = %caller.user.as_str(), state = item.state.as_str(), "turn dropped through the gateway");
    Ok(Json(JournalTurn::of(item)))
}

/// The journal's counts for `/metrics`: `None` without a journal, and (with a warning in the
/// log) when it cannot be read in time, so the scrape still answers, without the two gauges.
pub(crate) async fn counts_for_metrics(state: &GatewayState) -> Option<TurnCounts> {
    let admin = state.turn_journal()?;
    match tokio::time::timeout(COUNTS_TIMEOUT, admin.journal().counts()).await {
        Ok(Ok(counts)) => Some(counts),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not count the turn journal's items; deermem_turns_pending and deermem_turns_dead are left out of this scrape");
            None
        }
        Err(_) => {
            tracing::warn!(
                timeout_ms = COUNTS_TIMEOUT.as_millis() as u64,
                "the turn journal did not answer its counts in time; deermem_turns_pending and deermem_turns_dead are left out of this scrape"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_and_limit_parameters() {
        assert_eq!(parse_state(None).unwrap(), None);
        assert_eq!(parse_state(Some("")).unwrap(), None);
        assert_eq!(parse_state(Some("dead")).unwrap(), Some(TurnState::Dead));
        assert_eq!(
            parse_state(Some("pending")).unwrap(),
            Some(TurnState::Pending)
        );
        for bad in ["Dead", "all", "dead ", "x\n"] {
            assert!(
                matches!(parse_state(Some(bad)), Err(GatewayError::BadRequest(_))),
                "{bad:?}"
            );
        }
        assert_eq!(parse_limit(None).unwrap(), DEFAULT_TURN_LIMIT);
        assert_eq!(parse_limit(Some("5")).unwrap(), 5);
        assert_eq!(parse_limit(Some("1000")).unwrap(), 1000);
        for bad in ["0", "1001", "-1", "x", "1e3"] {
            assert!(
                matches!(parse_limit(Some(bad)), Err(GatewayError::BadRequest(_))),
                "{bad:?}"
            );
        }
    }
}
