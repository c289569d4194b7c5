//! The `MemoryManager` port: the backend contract a host calls. The required surface is one
//! trait; each optional ability (search, reading, admin, reload, fact CRUD) is a trait of its own
//! reached through an accessor, so an ability is present exactly when it is implemented.
//! [`MemoryManagerExt`] gives callers the flat surface, with a typed `Unsupported` for an absent
//! ability.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::caches::CacheBound;
use crate::config::MemoryMode;
use crate::document::PublicMemoryDocument;
use crate::error::ManagerError;
use crate::fact::PublicFact;
use crate::ids::{AgentName, UserId};
use crate::message::Message;
use crate::search::MatchType;
use crate::time::Timestamp;

/// The `tracing` target of the warning a backend logs when a read fails and its fail-open
/// policy answers with empty memory. A host that reports such failures itself (the CLI's
/// `context` and `search`, through [`MemoryManager::last_backend_failure`]) may silence it.
pub const FAIL_OPEN_LOG_TARGET: &str = "deermem::fail_open";

/// The last failure reaching a remote memory server: typically one the caller did not receive
/// as an error (a read answered with empty memory under a fail-open policy, a capture that
/// failed in the background). Hosts show it (a health page, a CLI warning); it never changes
/// readiness.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendFailure {
    /// What failed: `recall`, `search` or `capture`.
    pub operation: String,
    /// The error as the backend reported it, the server's code and message included (never a
    /// credential).
    pub message: String,
    /// When it happened.
    pub at: Timestamp,
    /// How many such failures the backend has seen since it was built (so a caller can tell a
    /// new failure from one it already saw).
    pub count: u64,
}

/// The user and agent a call acts for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemoryScope {
    /// The user; `None` lets the backend apply its default (DeerMem: the legacy root layout,
    /// or an error under `strict_user_scope`).
    pub user: Option<UserId>,
    /// The agent; `None` is the reserved default bucket.
    pub agent: Option<AgentName>,
}

impl MemoryScope {
    /// A scope for a user and optional agent.
    pub fn new(user: Option<UserId>, agent: Option<AgentName>) -> Self {
        Self { user, agent }
    }

    /// A scope for a user's default bucket.
    pub fn user(user: UserId) -> Self {
        Self {
            user: Some(user),
            agent: None,
        }
    }
}

/// A conversation turn to remember.
#[derive(Clone, Debug, PartialEq)]
pub struct AddRequest {
    /// The host thread id.
    pub thread_id: String,
    /// The raw, unfiltered conversation (the backend filters it).
    pub messages: Vec<Message>,
    /// Who and which agent.
    pub scope: MemoryScope,
    /// Trace id for observability.
    pub trace_id: Option<String>,
}

/// A request for the injection block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContextRequest {
    /// Who and which agent.
    pub scope: MemoryScope,
    /// The thread, when known.
    pub thread_id: Option<String>,
}

/// A search request.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchRequest {
    /// Query text.
    pub query: String,
    /// Result cap (the reference's default is 5).
    pub top_k: usize,
    /// Who and which agent.
    pub scope: MemoryScope,
    /// Only this category (applied before the cut).
    pub category: Option<String>,
    /// How to rank; `None` takes the configured default (`search.mode`).
    pub mode: Option<crate::SearchMode>,
}

/// A fact to create manually.
#[derive(Clone, Debug, PartialEq)]
pub struct NewFact {
    /// Content (stripped; must not be blank).
    pub content: String,
    /// Category (blank means `context`).
    pub category: String,
    /// Confidence in `[0, 1]`.
    pub confidence: f64,
}

impl NewFact {
    /// A fact with the reference's defaults: category `context`, confidence 0.5.
    pub fn new(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            category: "context".into(),
            confidence: 0.5,
        }
    }
}

/// A partial update of a fact: `None` fields are kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FactPatch {
    /// New content.
    pub content: Option<String>,
    /// New category.
    pub category: Option<String>,
    /// New confidence.
    pub confidence: Option<f64>,
    /// Fail with a conflict unless the fact is at this revision.
    pub expected_revision: Option<u64>,
}

/// A search result with its ranking information (for CLIs and HTTP clients that show scores).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoredFact {
    /// The fact in the public shape.
    pub fact: PublicFact,
    /// The backend's relevance score (higher is better), when it has one.
    pub score: Option<f64>,
    /// How the fact matched.
    #[serde(rename = "matchType")]
    pub match_type: MatchType,
}

/// The injection block a run saw, with its identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryContext {
    /// The backend's plain text (what `get_context` returns); may be empty.
    pub body: String,
    /// The exact injected content, `<memory>` wrapper included; empty when nothing is
    /// injected.
    pub block: String,
    /// SHA-256 (hex) of `block`; `None` when nothing is injected.
    pub content_sha256: Option<String>,
}

/// Wraps a context body the way the host injects it: `"<memory>\n{body}\n</memory>\n"`, or
/// nothing for a blank body. Returns the block and its SHA-256.
pub fn wrap_memory_block(body: &str) -> MemoryContext {
    let trimmed = deermem_pycompat::py::strip(body);
    if trimmed.is_empty() {
        return MemoryContext {
            body: body.to_owned(),
            block: String::new(),
            content_sha256: None,
        };
    }
    let block = format!("<memory>\n{trimmed}\n</memory>\n");
    let sha = hex::encode(Sha256::digest(block.as_bytes()));
    MemoryContext {
        body: body.to_owned(),
        block,
        content_sha256: Some(sha),
    }
}

/// A memory backend (DeerMem, noop, Honcho, OpenViking...): the surface every backend has.
///
/// # Contract
/// - **Required.** `add` takes the raw conversation, filters it itself and returns at once (the
///   work is queued); it never fails for backpressure. `get_context` returns plain text ready
///   for injection (the host adds the `<memory>` wrapper) or `""`, within the backend's own
///   budget.
/// - **Abilities.** Search, reading the document, clearing/importing, reloading and fact CRUD
///   are the traits [`MemorySearch`], [`MemoryReader`], [`MemoryAdmin`], [`MemoryReload`] and
///   [`FactAdmin`]. A backend answers `Some(self)` from the accessor of each one it implements
///   and `None` otherwise (the accessors are required, so the choice is explicit). Callers use
///   [`MemoryManagerExt`], which answers [`ManagerError::Unsupported`] for an absent ability.
/// - **Defaults.** `add_nowait` is `add` without a trace id; `shutdown_flush` is `true`; `warm`
///   is `None` ("nothing to warm"); tool mode is allowed and passive writes stop in tool mode.
/// - **Scopes.** An omitted agent is the reserved default bucket; agent names are
///   case-insensitive. A call for user A never returns or changes user B's data.
/// - **Errors.** Conflicts, corruption, missing facts and invalid input have their own
///   variants, so hosts map them without reading message text.
#[async_trait]
pub trait MemoryManager: Send + Sync + Debug {
    /// The backend's name, used in "not supported by" messages (e.g. `DeerMem`).
    fn name(&self) -> &str;

    /// The mode the backend was built for.
    fn mode(&self) -> MemoryMode;

    /// Whether tool mode is allowed at all (it needs [`MemorySearch`]; OpenViking refuses it).
    fn allows_tool_mode(&self) -> bool {
        true
    }

    /// Whether the host keeps passive writes (`add` after each turn) running in tool mode.
    fn passive_writes_in_tool_mode(&self) -> bool {
        false
    }

    /// Queues a conversation for memory extraction.
    ///
    /// # Errors
    /// Invalid input (a bad scope), and [`ManagerError::Overloaded`] when the backend already
    /// holds as many pending turn bytes as it allows for the user or for everyone (the turn was
    /// not kept). A turn refused for queue depth is not an error (the conversation's next turn
    /// carries it again).
    async fn add(&self, request: AddRequest) -> Result<(), ManagerError>;

    /// The emergency path (before summarisation drops messages): processed at once, ignoring
    /// the watermark.
    ///
    /// # Errors
    /// As `add`.
    async fn add_nowait(&self, request: AddRequest) -> Result<(), ManagerError> {
        self.add(AddRequest {
            trace_id: None,
            ..request
        })
        .await
    }

    /// The injection text, without the `<memory>` wrapper.
    ///
    /// # Errors
    /// Backend failures (most backends degrade to `""` instead).
    async fn get_context(&self, request: ContextRequest) -> Result<String, ManagerError>;

    /// The injection block with the wrapper and its identity, so that a host can record which
    /// memory block a run saw.
    ///
    /// # Errors
    /// As `get_context`.
    async fn get_context_block(
        &self,
        request: ContextRequest,
    ) -> Result<MemoryContext, ManagerError> {
        let body = self.get_context(request).await?;
        Ok(wrap_memory_block(&body))
    }

    /// Search, when the backend has it.
    fn searcher(&self) -> Option<&dyn MemorySearch> {
        None
    }

    /// Reading the memory document, when the backend has it.
    fn reader(&self) -> Option<&dyn MemoryReader> {
        None
    }

    /// Clearing and importing, when the backend has them.
    fn admin(&self) -> Option<&dyn MemoryAdmin> {
        None
    }

    /// Re-reading storage, when the backend has it.
    fn reloader(&self) -> Option<&dyn MemoryReload> {
        None
    }

    /// Creating, updating and deleting single facts, when the backend has them.
    fn facts(&self) -> Option<&dyn FactAdmin> {
        None
    }

    /// Drains pending work within `timeout`; true only if everything finished in time.
    async fn shutdown_flush(&self, timeout: Duration) -> bool {
        let _ = timeout;
        true
    }

    /// Warms caches or probes the server: `None` when there is nothing to warm, `Some(false)`
    /// when warming failed.
    async fn warm(&self) -> Option<bool> {
        None
    }

    /// Hook before the host compresses a conversation; returns text to keep.
    async fn on_pre_compress(&self, messages: &[Message]) -> String {
        let _ = messages;
        String::new()
    }

    /// Hook at the start of a turn.
    async fn on_turn_start(&self, turn_number: u64, message: Option<&Message>) {
        let _ = (turn_number, message);
    }

    /// The last failure reaching the backend's server (see [`BackendFailure`]); `None` when
    /// there was none, and for backends that keep no such record.
    fn last_backend_failure(&self) -> Option<BackendFailure> {
        None
    }

    /// The bounds of the backend's in-process caches and tables that could otherwise grow with
    /// the users or facts it serves (see [`CacheBound`]), from its configured values, with what
    /// each holds now when that is cheap to know. Empty (the default) for a backend that keeps
    /// no such cache in this process (a remote server's memory is its own).
    fn cache_bounds(&self) -> Vec<CacheBound> {
        Vec::new()
    }

    /// Releases resources. Idempotent.
    async fn close(&self) {}
}

/// Ranked search over a backend's facts (required for tool mode).
#[async_trait]
pub trait MemorySearch: MemoryManager {
    /// Ranked facts with their scores and match types.
    ///
    /// # Errors
    /// Backend failures; invalid scopes.
    async fn search_scored(&self, request: SearchRequest) -> Result<Vec<ScoredFact>, ManagerError>;

    /// Ranked facts without their scores.
    ///
    /// # Errors
    /// As `search_scored`.
    async fn search(&self, request: SearchRequest) -> Result<Vec<PublicFact>, ManagerError> {
        Ok(MemorySearch::search_scored(self, request)
            .await?
            .into_iter()
            .map(|s| s.fact)
            .collect())
    }
}

/// Reading a scope's memory document.
#[async_trait]
pub trait MemoryReader: MemoryManager {
    /// The memory document of a scope.
    ///
    /// # Errors
    /// Backend failures; invalid scopes.
    async fn get_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError>;

    /// The export document. Not every reader exports (the reference's backends raise here), so
    /// the default is `Unsupported`.
    ///
    /// # Errors
    /// `Unsupported` by default.
    async fn export_memory(
        &self,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let _ = scope;
        Err(ManagerError::unsupported("export memory", self.name()))
    }
}

/// Clearing and replacing a scope's memory.
#[async_trait]
pub trait MemoryAdmin: MemoryManager {
    /// Clears memory: with no agent, every agent's facts and the summaries; with an agent, only
    /// that bucket's facts. Returns the now-empty document.
    ///
    /// # Errors
    /// Backend failures; invalid scopes.
    async fn clear_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError>;

    /// Replaces the bucket with the document's facts and summaries.
    ///
    /// # Errors
    /// Invalid documents; conflicts; backend failures.
    async fn import_memory(
        &self,
        document: PublicMemoryDocument,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError>;
}

/// Re-reading storage, picking up out-of-band edits.
#[async_trait]
pub trait MemoryReload: MemoryManager {
    /// Re-reads storage and returns the document.
    ///
    /// # Errors
    /// Backend failures; invalid scopes.
    async fn reload_memory(&self, scope: MemoryScope)
    -> Result<PublicMemoryDocument, ManagerError>;
}

/// Creating, updating and deleting single facts.
#[async_trait]
pub trait FactAdmin: MemoryManager {
    /// Creates a fact. Returns the fresh document and the new id, or `None` when the capacity
    /// policy evicted the new fact at once (nothing stored).
    ///
    /// # Errors
    /// Invalid input; conflicts; backend failures.
    async fn create_fact(
        &self,
        fact: NewFact,
        scope: MemoryScope,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError>;

    /// Creates a fact at most once per `idempotency_key` (a client's `Idempotency-Key`): the
    /// key names the new fact's id, and when a fact with that id is already stored (an
    /// earlier attempt committed, its answer lost) its document is returned, with the id,
    /// instead of a duplicate or a conflict. Without a key this is [`Self::create_fact`]. The
    /// default ignores the key; backends that can honour it override this.
    ///
    /// # Errors
    /// As [`Self::create_fact`]; invalid input when the key was used for another content.
    async fn create_fact_once(
        &self,
        fact: NewFact,
        scope: MemoryScope,
        idempotency_key: Option<&str>,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        let _ = idempotency_key;
        self.create_fact(fact, scope).await
    }

    /// Updates a fact's non-`None` fields.
    ///
    /// # Errors
    /// `NotFound`; invalid input; conflicts; backend failures.
    async fn update_fact(
        &self,
        fact_id: &str,
        patch: FactPatch,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError>;

    /// Deletes a fact.
    ///
    /// # Errors
    /// `NotFound`; conflicts; backend failures.
    async fn delete_fact(
        &self,
        fact_id: &str,
        expected_revision: Option<u64>,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError>;
}

/// The ability an accessor returned, or `Unsupported` naming the operation and the backend.
fn required<'a, T: ?Sized>(
    ability: Option<&'a T>,
    operation: &'static str,
    backend: &str,
) -> Result<&'a T, ManagerError> {
    ability.ok_or_else(|| ManagerError::unsupported(operation, backend))
}

/// The flat calling surface over any [`MemoryManager`]: each optional operation goes through
/// its ability's accessor and is [`ManagerError::Unsupported`] (with the reference's operation
/// name) when the backend lacks the ability.
#[async_trait]
pub trait MemoryManagerExt: MemoryManager {
    /// Whether [`MemorySearch`] is present.
    fn can_search(&self) -> bool {
        self.searcher().is_some()
    }

    /// Ranked facts for a query.
    ///
    /// # Errors
    /// `Unsupported` without [`MemorySearch`]; the backend's errors.
    async fn search(&self, request: SearchRequest) -> Result<Vec<PublicFact>, ManagerError> {
        let ability = required(self.searcher(), "search", self.name())?;
        MemorySearch::search(ability, request).await
    }

    /// Ranked facts with scores and match types.
    ///
    /// # Errors
    /// As `search`.
    async fn search_scored(&self, request: SearchRequest) -> Result<Vec<ScoredFact>, ManagerError> {
        let ability = required(self.searcher(), "search", self.name())?;
        MemorySearch::search_scored(ability, request).await
    }

    /// The memory document of a scope.
    ///
    /// # Errors
    /// `Unsupported` without [`MemoryReader`]; the backend's errors.
    async fn get_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        let ability = required(self.reader(), "get memory", self.name())?;
        MemoryReader::get_memory(ability, scope).await
    }

    /// The export document.
    ///
    /// # Errors
    /// `Unsupported` without [`MemoryReader`] or when the reader does not export.
    async fn export_memory(
        &self,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let ability = required(self.reader(), "export memory", self.name())?;
        MemoryReader::export_memory(ability, scope).await
    }

    /// Re-reads storage and returns the document.
    ///
    /// # Errors
    /// `Unsupported` without [`MemoryReload`]; the backend's errors.
    async fn reload_memory(
        &self,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let ability = required(self.reloader(), "reload memory", self.name())?;
        MemoryReload::reload_memory(ability, scope).await
    }

    /// Deletes memory. The reference declares it and nothing calls it; no backend implements
    /// it, so it is always `Unsupported`.
    ///
    /// # Errors
    /// Always `Unsupported`.
    async fn delete_memory(&self, scope: MemoryScope) -> Result<(), ManagerError> {
        let _ = scope;
        Err(ManagerError::unsupported("delete memory", self.name()))
    }

    /// Clears memory (see [`MemoryAdmin::clear_memory`]).
    ///
    /// # Errors
    /// `Unsupported` without [`MemoryAdmin`]; the backend's errors.
    async fn clear_memory(&self, scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        let ability = required(self.admin(), "clear memory", self.name())?;
        MemoryAdmin::clear_memory(ability, scope).await
    }

    /// Replaces the bucket (see [`MemoryAdmin::import_memory`]).
    ///
    /// # Errors
    /// `Unsupported` without [`MemoryAdmin`]; the backend's errors.
    async fn import_memory(
        &self,
        document: PublicMemoryDocument,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let ability = required(self.admin(), "import memory", self.name())?;
        MemoryAdmin::import_memory(ability, document, scope).await
    }

    /// Creates a fact (see [`FactAdmin::create_fact`]).
    ///
    /// # Errors
    /// `Unsupported` without [`FactAdmin`]; the backend's errors.
    async fn create_fact(
        &self,
        fact: NewFact,
        scope: MemoryScope,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        let ability = required(self.facts(), "create fact", self.name())?;
        FactAdmin::create_fact(ability, fact, scope).await
    }

    /// Creates a fact at most once per idempotency key (see [`FactAdmin::create_fact_once`]).
    ///
    /// # Errors
    /// `Unsupported` without [`FactAdmin`]; the backend's errors.
    async fn create_fact_once(
        &self,
        fact: NewFact,
        scope: MemoryScope,
        idempotency_key: Option<&str>,
    ) -> Result<(PublicMemoryDocument, Option<String>), ManagerError> {
        let ability = required(self.facts(), "create fact", self.name())?;
        FactAdmin::create_fact_once(ability, fact, scope, idempotency_key).await
    }

    /// Updates a fact (see [`FactAdmin::update_fact`]).
    ///
    /// # Errors
    /// `Unsupported` without [`FactAdmin`]; the backend's errors.
    async fn update_fact(
        &self,
        fact_id: &str,
        patch: FactPatch,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let ability = required(self.facts(), "update fact", self.name())?;
        FactAdmin::update_fact(ability, fact_id, patch, scope).await
    }

    /// Deletes a fact (see [`FactAdmin::delete_fact`]).
    ///
    /// # Errors
    /// `Unsupported` without [`FactAdmin`]; the backend's errors.
    async fn delete_fact(
        &self,
        fact_id: &str,
        expected_revision: Option<u64>,
        scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        let ability = required(self.facts(), "delete fact", self.name())?;
        FactAdmin::delete_fact(ability, fact_id, expected_revision, scope).await
    }
}

impl<T: MemoryManager + ?Sized> MemoryManagerExt for T {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_matches_host_injection() {
        let ctx = wrap_memory_block("User Context:\n- Work: Rust\n");
        assert_eq!(
            ctx.block,
            "<memory>\nUser Context:\n- Work: Rust\n</memory>\n"
        );
        let expected = hex::encode(Sha256::digest(ctx.block.as_bytes()));
        assert_eq!(ctx.content_sha256.as_deref(), Some(expected.as_str()));
        let empty = wrap_memory_block("  \n ");
        assert!(empty.block.is_empty());
        assert!(empty.content_sha256.is_none());
    }
}
