//! The state every route shares: the memory manager (only through the `MemoryManager` port),
//! the `memory:` and `gateway:` configuration, the metrics registry, the lifecycle flags, the
//! context observers, the optional run journal and the optional turn journal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use deermem_core::ports::MemoryManager;
use deermem_core::{AgentName, MemoryConfig, UserId};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use crate::auth::TokenTable;
use crate::config::GatewayConfig;
use crate::limits::BulkLimiter;
use crate::metrics::Metrics;
use deermem_core::ports::run_journal::JournalError;
use deermem_core::ports::{RunEventStore, TurnAdmin};

/// Where the gateway is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Not yet serving (`/readyz` answers 503 `starting`).
    Starting,
    /// Serving (`/readyz` answers 200).
    Ready,
    /// Draining before exit (`/readyz` answers 503 `stopping`).
    Stopping,
}

/// One served context block, for hosts that record run-level memory identity (which exact
/// memory block, by hash, a run was given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextServed {
    /// The user the block was built for.
    pub user: UserId,
    /// The agent bucket (`None`: the default bucket).
    pub agent: Option<AgentName>,
    /// The thread the caller named.
    pub thread_id: String,
    /// The run the caller named.
    pub run_id: String,
    /// SHA-256 (hex) of the exact block, `<memory>` wrapper included.
    pub content_sha256: String,
}

/// Why a [`ContextObserver`] refused a served block; the request fails instead of handing the
/// block to the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObserverError {
    /// The run already saw a different block (409 with this detail).
    Conflict(String),
    /// The observer could not record the block (500; the message goes to the log only).
    Failed(String),
}

/// Receives every context block served by `GET /api/memory/context` when the caller names both
/// a `thread_id` and a `run_id` and the block is not empty: the seam where a run journal
/// records one `context:memory` event per run. The block is returned to the caller only when
/// every observer accepts it.
///
/// Called on the request's task: an observer that blocks on I/O moves it off the runtime
/// (`spawn_blocking`, `block_in_place`).
#[async_trait::async_trait]
pub trait ContextObserver: Send + Sync + std::fmt::Debug {
    /// A block is about to be served for a run.
    ///
    /// # Errors
    /// [`ObserverError::Conflict`] to refuse the block for this run (409);
    /// [`ObserverError::Failed`] when it could not be recorded (500).
    async fn context_served(&self, event: &ContextServed) -> Result<(), ObserverError>;
}

/// Why the memory backend's storage cannot be reached (its reason, never a credential).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct StorageUnreachable(pub String);

/// Whether the memory backend's storage can be reached now (one round trip to a database,
/// say): `/readyz` answers 503 `unavailable` while it answers `Err` with the reason.
pub type ReadinessCheck = Arc<
    dyn Fn() -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), StorageUnreachable>> + Send>,
        > + Send
        + Sync,
>;

/// Records each served block in a run journal: one `context:memory` event per run.
#[derive(Debug)]
struct JournalObserver(Arc<dyn RunEventStore>);

#[async_trait::async_trait]
impl ContextObserver for JournalObserver {
    async fn context_served(&self, event: &ContextServed) -> Result<(), ObserverError> {
        let recorded = self.0.record_context(
            &event.user,
            event.agent.as_ref(),
            &event.thread_id,
            &event.run_id,
            &event.content_sha256,
        );
        match recorded.await {
            Ok(_) => Ok(()),
            Err(e @ JournalError::Conflict { .. }) => Err(ObserverError::Conflict(e.to_string())),
            Err(e) => Err(ObserverError::Failed(e.to_string())),
        }
    }
}

/// The shared flags; their defaults (0, false) are a starting gateway with no rebuild running.
#[derive(Debug, Default)]
struct Flags {
    /// The [`Lifecycle`]: 0 starting, 1 ready, 2 stopping.
    lifecycle: AtomicU8,
    /// Whether an index rebuild (`warm`) is running.
    rebuild_running: AtomicBool,
}

/// What the router and `serve` share. Cheap to clone.
#[derive(Clone)]
pub struct GatewayState {
    manager: Arc<dyn MemoryManager>,
    memory: Arc<MemoryConfig>,
    gateway: Arc<GatewayConfig>,
    /// The configured credentials, for the authentication layer.
    pub(crate) tokens: Arc<TokenTable>,
    metrics: Metrics,
    flags: Arc<Flags>,
    /// The observers of served context blocks, in the order they were added.
    pub(crate) observers: Vec<Arc<dyn ContextObserver>>,
    journal: Option<Arc<dyn RunEventStore>>,
    turns: Option<Arc<dyn TurnAdmin>>,
    /// The running bulk requests.
    pub(crate) bulk: Arc<BulkLimiter>,
    /// The storage reachability check, if one is installed.
    pub(crate) readiness: Option<ReadinessCheck>,
}

impl std::fmt::Debug for GatewayState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The memory config's backend_config may hold secrets: show only what is safe.
        f.debug_struct("GatewayState")
            .field("manager", &self.manager.name())
            .field("memory_enabled", &self.memory.enabled)
            .field("manager_class", &self.memory.manager_class)
            .field("gateway", &self.gateway)
            .field("lifecycle", &self.lifecycle())
            .field("observers", &self.observers.len())
            .field("run_journal", &self.journal)
            .field("turn_journal", &self.turns)
            .finish_non_exhaustive()
    }
}

impl GatewayState {
    /// State for a manager, the `memory:` section and the `gateway:` section, with a fresh
    /// metrics registry. The gateway starts in [`Lifecycle::Starting`]; [`crate::serve`] marks
    /// it ready once listening (a host mounting [`crate::router`] itself calls
    /// [`GatewayState::mark_ready`]).
    pub fn new(
        manager: Arc<dyn MemoryManager>,
        memory: MemoryConfig,
        gateway: GatewayConfig,
    ) -> Self {
        let tokens = TokenTable::new(&gateway);
        let bulk = BulkLimiter::new(
            gateway.max_bulk_requests_per_user,
            gateway.max_bulk_requests,
        );
        Self {
            manager,
            memory: Arc::new(memory),
            gateway: Arc::new(gateway),
            tokens: Arc::new(tokens),
            metrics: Metrics::new(),
            flags: Arc::default(),
            observers: Vec::new(),
            journal: None,
            turns: None,
            bulk: Arc::new(bulk),
            readiness: None,
        }
    }

    /// Uses a metrics registry the host also holds (to feed queue depth, outcomes, gates).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Adds an observer of served context blocks (observers are called in the order they
    /// were added; the first refusal answers the request).
    #[must_use]
    pub fn with_context_observer(mut self, observer: Arc<dyn ContextObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Records run-level memory identity in `journal`: it observes every served block
    /// (one `context:memory` event per run, 409 for a different block) and serves
    /// `GET /api/threads/{thread_id}/runs/{run_id}/events`. Without a journal that route
    /// answers 501.
    #[must_use]
    pub fn with_run_journal(mut self, journal: Arc<dyn RunEventStore>) -> Self {
        self.observers
            .push(Arc::new(JournalObserver(Arc::clone(&journal))));
        self.journal = Some(journal);
        self
    }

    /// Serves the engine's turn journal: `GET /api/memory/turns` (the caller's own items),
    /// `POST /api/memory/turns/{turn_id}/retry`, `DELETE /api/memory/turns/{turn_id}`, and the
    /// `deermem_turns_pending` / `deermem_turns_dead` gauges of `/metrics` (read from the
    /// journal at each scrape). Without one those routes answer 501 and the gauges are left out.
    #[must_use]
    pub fn with_turn_journal(mut self, turns: Arc<dyn TurnAdmin>) -> Self {
        self.turns = Some(turns);
        self
    }

    /// The turn journal, if one is installed.
    pub fn turn_journal(&self) -> Option<&Arc<dyn TurnAdmin>> {
        self.turns.as_ref()
    }

    /// Makes `/readyz` check that the backend's storage can be reached (see
    /// [`ReadinessCheck`]); without one, readiness is the lifecycle alone.
    #[must_use]
    pub fn with_readiness_check(mut self, check: ReadinessCheck) -> Self {
        self.readiness = Some(check);
        self
    }

    /// The run journal, if one is installed.
    pub fn run_journal(&self) -> Option<&Arc<dyn RunEventStore>> {
        self.journal.as_ref()
    }

    /// The memory backend.
    pub fn manager(&self) -> &Arc<dyn MemoryManager> {
        &self.manager
    }

    /// The `memory:` section.
    pub fn memory_config(&self) -> &MemoryConfig {
        &self.memory
    }

    /// The `gateway:` section.
    pub fn gateway_config(&self) -> &GatewayConfig {
        &self.gateway
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The current lifecycle stage.
    pub fn lifecycle(&self) -> Lifecycle {
        match self.flags.lifecycle.load(Ordering::Acquire) {
            0 => Lifecycle::Starting,
            1 => Lifecycle::Ready,
            _ => Lifecycle::Stopping,
        }
    }

    /// Marks the gateway ready (`/readyz` 200). Index warm-up does not delay this.
    pub fn mark_ready(&self) {
        self.flags.lifecycle.store(1, Ordering::Release);
    }

    /// Marks the gateway as draining (`/readyz` 503).
    pub fn mark_stopping(&self) {
        self.flags.lifecycle.store(2, Ordering::Release);
    }

    /// Whether an index rebuild (`warm`) is running.
    pub fn rebuild_running(&self) -> bool {
        self.flags.rebuild_running.load(Ordering::Acquire)
    }
}

/// Runs the manager's `warm()` (for DeerMem: the full rebuild of the derived search index) in
/// the background. Returns `None` when a warm-up is already running. Readiness never waits
/// for it; the task logs its outcome.
pub fn spawn_warm(state: &GatewayState) -> Option<JoinHandle<Option<bool>>> {
    let running = &state.flags.rebuild_running;
    // Taking the flag fails while another warm-up holds it.
    running
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .ok()?;
    let manager = Arc::clone(&state.manager);
    let flags = Arc::clone(&state.flags);
    let task = async move {
        struct Clear(Arc<Flags>);
        impl Drop for Clear {
            fn drop(&mut self) {
                self.0.rebuild_running.store(false, Ordering::Release);
            }
        }
        let _clear = Clear(flags);
        let outcome = manager.warm().await;
        match outcome {
            Some(true) => tracing::info!("memory backend warm-up finished"),
            Some(false) => tracing::warn!("memory backend warm-up failed"),
            None => tracing::debug!("memory backend has nothing to warm"),
        }
        outcome
    };
    Some(tokio::spawn(task.in_current_span()))
}
