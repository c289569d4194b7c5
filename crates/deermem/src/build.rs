//! Backend selection: `build_backend` reads `manager_class` and builds that backend from its
//! `backend_config`, with every adapter behind a Cargo feature. A backend that is not compiled
//! in fails naming the feature; an unknown `manager_class` fails naming the known ones. There
//! is never a silent fallback: memory is persistent state. The same table names each backend's
//! display of its configuration (`crate::shown`).

use std::path::PathBuf;
use std::sync::Arc;

use deermem_core::ports::{Clock, LanguageModel, MemoryManager};
use deermem_core::{ConfigError, ManagerError, MemoryConfig, MemoryMode};

use crate::clock::SystemClock;
use crate::config_file::resolve_storage_root;
use crate::noop::NoopManager;

/// What a backend's constructor is given (a build with no backend but `noop` reads only the
/// configuration).
#[cfg_attr(
    not(any(
        feature = "honcho",
        feature = "openviking",
        all(feature = "engine", feature = "storage-file")
    )),
    allow(dead_code)
)]
struct Inputs<'a, 'e> {
    config: &'a MemoryConfig,
    root: &'a std::path::Path,
    clock: Arc<dyn Clock>,
    opts: &'a BuildOptions<'e>,
}

/// The error of a backend `name` that refused to start.
#[cfg(any(feature = "honcho", feature = "openviking"))]
fn refused(name: &'static str) -> impl Fn(ManagerError) -> BuildError {
    move |source| BuildError::Backend {
        name: name.to_owned(),
        source,
    }
}

/// Builds one backend.
type Constructor = fn(&Inputs<'_, '_>) -> Result<Backend, BuildError>;

/// Shows one backend's `backend_config`: parsed with the adapter's own settings type and
/// serialised (its display form, which writes no secret); `None` when it does not parse.
pub(crate) type Show = fn(&serde_json::Map<String, serde_json::Value>) -> Option<serde_json::Value>;

/// One backend: its `manager_class` name, the Cargo feature that compiles it in, and its
/// constructor and display when it is compiled in.
struct BackendEntry {
    name: &'static str,
    feature: &'static str,
    build: Option<Constructor>,
    show: Option<Show>,
}

/// Every backend, compiled in or not: the one place a backend is added.
const BACKENDS: [BackendEntry; 4] = [
    BackendEntry {
        name: "deermem",
        feature: if cfg!(feature = "engine") {
            "storage-file"
        } else {
            "engine"
        },
        #[cfg(all(feature = "engine", feature = "storage-file"))]
        build: Some(build_deermem),
        #[cfg(not(all(feature = "engine", feature = "storage-file")))]
        build: None,
        #[cfg(all(feature = "engine", feature = "storage-file"))]
        show: Some(crate::embedded::shown_deermem_config),
        #[cfg(not(all(feature = "engine", feature = "storage-file")))]
        show: None,
    },
    BackendEntry {
        name: "honcho",
        feature: "honcho",
        #[cfg(feature = "honcho")]
        build: Some(build_honcho),
        #[cfg(not(feature = "honcho"))]
        build: None,
        #[cfg(feature = "honcho")]
        show: Some(|bc| {
            let (c, _) = deermem_backend_honcho::HonchoConfig::from_backend_config(bc).ok()?;
            serde_json::to_value(c).ok()
        }),
        #[cfg(not(feature = "honcho"))]
        show: None,
    },
    BackendEntry {
        name: "noop",
        feature: "",
        build: Some(|i| Ok(Backend::Noop(Arc::new(NoopManager::new(i.config.mode))))),
        // It reads no key.
        show: Some(|_| Some(serde_json::Value::Object(serde_json::Map::new()))),
    },
    BackendEntry {
        name: "openviking",
        feature: "openviking",
        #[cfg(feature = "openviking")]
        build: Some(build_openviking),
        #[cfg(not(feature = "openviking"))]
        build: None,
        // The settings without the key (which is read from the environment, and not shown).
        #[cfg(feature = "openviking")]
        show: Some(|bc| {
            let (c, _) =
                deermem_backend_openviking::OpenVikingConfig::settings_from_backend_config(bc)
                    .ok()?;
            serde_json::to_value(c).ok()
        }),
        #[cfg(not(feature = "openviking"))]
        show: None,
    },
];

/// How the backend `manager_class` names shows its configuration.
pub(crate) enum Display {
    /// Its display.
    Shown(Show),
    /// The backend is not compiled into this build.
    NotCompiled,
    /// No backend has that name.
    Unknown,
}

/// The display of the backend `manager_class` names.
pub(crate) fn display(manager_class: &str) -> Display {
    match BACKENDS.iter().find(|b| b.name == manager_class.trim()) {
        Some(BackendEntry {
            show: Some(show), ..
        }) => Display::Shown(*show),
        Some(_) => Display::NotCompiled,
        None => Display::Unknown,
    }
}

/// The backends this build knows by name (compiled in or not).
pub const KNOWN_BACKENDS: [&str; 4] = ["deermem", "honcho", "noop", "openviking"];

/// Why a backend could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// `manager_class` names no known backend.
    #[error(
        "unknown memory.manager_class {name:?}: known backends are {known}; there is no fallback, because memory is persistent state"
    )]
    UnknownBackend {
        /// The configured value.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// The backend exists but this binary was built without its Cargo feature.
    #[error(
        "memory.manager_class {name:?} is not compiled into this build; rebuild with the Cargo feature `{feature}` of the `deermem` crate"
    )]
    NotCompiled {
        /// The backend.
        name: String,
        /// The feature that enables it.
        feature: &'static str,
    },
    /// A configuration value is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The backend refused to start.
    #[error("cannot start memory backend {name:?}: {source}")]
    Backend {
        /// The backend.
        name: String,
        /// Why.
        #[source]
        source: ManagerError,
    },
}

/// Options for building a backend beyond the configuration itself.
pub struct BuildOptions<'a> {
    /// Environment lookup (`$DEERMEM_DATA_DIR`, API keys named by `api_key_env`...).
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The clock; the system clock when `None`.
    pub clock: Option<Arc<dyn Clock>>,
    /// A language model to use instead of the configured one (tests, hosts with their own).
    pub llm: Option<Arc<dyn LanguageModel>>,
    /// Overrides `backend_config.storage_path` (the CLI's `--storage-path`).
    pub storage_path: Option<PathBuf>,
    /// A process that runs one command and exits (the CLI's data commands): with
    /// `storage_class: postgres` it takes no read leases (it reads with the revision check),
    /// so no replica's write waits for a lease it left behind.
    pub short_lived: bool,
    /// Receives the embedded engine's extraction events (metrics, tracing).
    #[cfg(feature = "engine")]
    pub observer: Option<Arc<dyn deermem_updater::UpdateObserver>>,
    /// The host's rule for hidden (`hide_from_ui`) user messages; the structural default when
    /// `None`.
    #[cfg(feature = "engine")]
    pub hidden_messages: Option<deermem_updater::HiddenMessagePolicy>,
    /// Whether the embedded engine replays its turn journal's pending turns in the background
    /// from the start (true by default; one-shot commands turn it off).
    #[cfg(feature = "engine")]
    pub recover_turns: bool,
}

impl std::fmt::Debug for BuildOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildOptions")
            .field("clock", &self.clock)
            .field("llm", &self.llm.as_ref().map(|l| l.model_name().to_owned()))
            .field("storage_path", &self.storage_path)
            .finish_non_exhaustive()
    }
}

impl<'a> BuildOptions<'a> {
    /// Options reading the given environment, with the system clock and the configured model.
    pub fn new(env: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            env,
            clock: None,
            llm: None,
            storage_path: None,
            short_lived: false,
            #[cfg(feature = "engine")]
            observer: None,
            #[cfg(feature = "engine")]
            hidden_messages: None,
            #[cfg(feature = "engine")]
            recover_turns: true,
        }
    }
}

/// A built backend: the manager, plus typed access to the embedded engine's extras.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// The embedded engine (file or PostgreSQL storage, LLM or offline extraction), with the
    /// storage it was built on (for the run journal and the administrative commands).
    #[cfg(all(feature = "engine", feature = "storage-file"))]
    DeerMem(
        Arc<deermem_engine::DeerMemManager>,
        crate::embedded::EmbeddedStorage,
    ),
    /// The minimal backend.
    Noop(Arc<NoopManager>),
    /// Honcho.
    #[cfg(feature = "honcho")]
    Honcho(Arc<deermem_backend_honcho::HonchoManager>),
    /// OpenViking.
    #[cfg(feature = "openviking")]
    OpenViking(Arc<deermem_backend_openviking::OpenVikingManager>),
}

impl Backend {
    /// The manager behind the backend.
    pub fn manager(&self) -> Arc<dyn MemoryManager> {
        match self {
            #[cfg(all(feature = "engine", feature = "storage-file"))]
            Self::DeerMem(m, _) => Arc::clone(m) as Arc<dyn MemoryManager>,
            Self::Noop(m) => Arc::clone(m) as Arc<dyn MemoryManager>,
            #[cfg(feature = "honcho")]
            Self::Honcho(m) => Arc::clone(m) as Arc<dyn MemoryManager>,
            #[cfg(feature = "openviking")]
            Self::OpenViking(m) => Arc::clone(m) as Arc<dyn MemoryManager>,
        }
    }

    /// The embedded DeerMem manager, when that is the backend.
    #[cfg(all(feature = "engine", feature = "storage-file"))]
    pub fn deermem(&self) -> Option<&Arc<deermem_engine::DeerMemManager>> {
        match self {
            Self::DeerMem(m, _) => Some(m),
            _ => None,
        }
    }

    /// The embedded engine's storage, when that is the backend.
    #[cfg(all(feature = "engine", feature = "storage-file"))]
    pub fn embedded_storage(&self) -> Option<&crate::embedded::EmbeddedStorage> {
        match self {
            Self::DeerMem(_, s) => Some(s),
            _ => None,
        }
    }

    /// The backend's `manager_class` name.
    pub fn class(&self) -> &'static str {
        match self {
            #[cfg(all(feature = "engine", feature = "storage-file"))]
            Self::DeerMem(..) => "deermem",
            Self::Noop(_) => "noop",
            #[cfg(feature = "honcho")]
            Self::Honcho(_) => "honcho",
            #[cfg(feature = "openviking")]
            Self::OpenViking(_) => "openviking",
        }
    }
}

/// The storage root a configuration selects (`--storage-path` override, then
/// `backend_config.storage_path`, then the environment defaults).
pub fn storage_root(config: &MemoryConfig, opts: &BuildOptions<'_>) -> PathBuf {
    if let Some(p) = &opts.storage_path {
        return resolve_storage_root(&p.to_string_lossy(), opts.env);
    }
    let configured = config
        .backend_config
        .get("storage_path")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    resolve_storage_root(configured, opts.env)
}

fn check_storage_root(root: &std::path::Path) -> Result<(), ConfigError> {
    if root.is_file() {
        return Err(ConfigError::new(
            "memory.backend_config.storage_path",
            format!(
                "{} resolves to an existing file; storage_path is a root DIRECTORY (per-user memory under {{storage_path}}/users/{{uid}}/). Point it at a directory",
                root.display()
            ),
        ));
    }
    Ok(())
}

/// Builds the backend `config.manager_class` names. Must run inside a tokio runtime (backends
/// start background workers).
///
/// # Errors
/// Unknown or not-compiled backends, invalid configuration, a tool-mode backend without
/// search, or a backend that refuses to start.
pub fn build_backend(config: &MemoryConfig, opts: BuildOptions<'_>) -> Result<Backend, BuildError> {
    let name = config.manager_class.trim().to_owned();
    let clock: Arc<dyn Clock> = opts.clock.clone().unwrap_or_else(|| Arc::new(SystemClock));
    let root = storage_root(config, &opts);
    check_storage_root(&root)?;
    let inputs = Inputs {
        config,
        root: &root,
        clock,
        opts: &opts,
    };
    let backend = match BACKENDS.iter().find(|b| b.name == name) {
        Some(BackendEntry {
            build: Some(build), ..
        }) => build(&inputs)?,
        Some(BackendEntry { feature, .. }) => {
            return Err(BuildError::NotCompiled { name, feature });
        }
        None => {
            return Err(BuildError::UnknownBackend {
                name,
                known: KNOWN_BACKENDS.join(", "),
            });
        }
    };
    let manager = backend.manager();
    if config.mode == MemoryMode::Tool && manager.searcher().is_none() {
        return Err(BuildError::Config(ConfigError::new(
            "memory.mode",
            format!(
                "tool mode needs a backend that supports search; {} does not",
                manager.name()
            ),
        )));
    }
    Ok(backend)
}

/// Builds the backend and returns its manager.
///
/// # Errors
/// As [`build_backend`].
pub fn build_manager(
    config: &MemoryConfig,
    opts: BuildOptions<'_>,
) -> Result<Arc<dyn MemoryManager>, BuildError> {
    build_backend(config, opts).map(|b| b.manager())
}

/// A remote backend's configuration error, saying which backend read the key.
#[cfg(any(feature = "honcho", feature = "openviking"))]
fn naming_backend(e: ConfigError, backend: &str) -> BuildError {
    BuildError::Config(ConfigError::new(
        e.key,
        format!("{} (memory.manager_class: {backend})", e.message),
    ))
}

/// Where a remote backend keeps its capture cursors: the PostgreSQL database when
/// `backend_config` selects `storage_class: postgres` (so replicas share them), else `None`
/// (files under the storage root).
#[cfg(any(feature = "honcho", feature = "openviking"))]
fn remote_cursors(
    config: &MemoryConfig,
    env: &dyn Fn(&str) -> Option<String>,
    backend: &str,
) -> Result<Option<Arc<dyn deermem_core::ports::CursorStorage>>, BuildError> {
    let postgres = config
        .backend_config
        .get("storage_class")
        .and_then(serde_json::Value::as_str)
        == Some("postgres");
    if !postgres {
        return Ok(None);
    }
    #[cfg(feature = "storage-postgres")]
    {
        crate::embedded::remote_cursors(&config.backend_config, env)
            .map(Some)
            .map_err(|e| match e {
                crate::embedded::EmbeddedError::Config(c) => naming_backend(c, backend),
                other => BuildError::Backend {
                    name: backend.to_owned(),
                    source: ManagerError::Unavailable {
                        message: other.to_string(),
                        source: None,
                    },
                },
            })
    }
    #[cfg(not(feature = "storage-postgres"))]
    {
        let _ = env;
        Err(BuildError::NotCompiled {
            name: format!("{backend} cursors in PostgreSQL (storage_class: postgres)"),
            feature: "storage-postgres",
        })
    }
}

/// Honcho. Its configuration is parsed and validated here first, so a mistake in it is a
/// [`BuildError::Config`] naming the key, like the embedded engine's; only a client that
/// cannot start is a [`BuildError::Backend`].
#[cfg(feature = "honcho")]
fn build_honcho(i: &Inputs<'_, '_>) -> Result<Backend, BuildError> {
    let (config, env) = (i.config, i.opts.env);
    let (parsed, _warnings) =
        deermem_backend_honcho::HonchoConfig::from_backend_config(&config.backend_config)
            .map_err(|e| naming_backend(e, "honcho"))?;
    parsed.validate().map_err(|e| naming_backend(e, "honcho"))?;
    let cursors = remote_cursors(config, env, "honcho")?;
    let m = deermem_backend_honcho::from_backend_config_with_cursors(
        &config.backend_config,
        config.mode,
        i.root.to_path_buf(),
        Arc::clone(&i.clock),
        cursors,
    )
    .map_err(refused("honcho"))?;
    Ok(Backend::Honcho(Arc::new(m)))
}

/// OpenViking, with its configuration (and its one supported mode) checked here first as for
/// [`build_honcho`].
#[cfg(feature = "openviking")]
fn build_openviking(i: &Inputs<'_, '_>) -> Result<Backend, BuildError> {
    let (config, env) = (i.config, i.opts.env);
    if config.mode != MemoryMode::Middleware {
        return Err(BuildError::Config(ConfigError::new(
            "memory.mode",
            "the openviking backend supports only memory.mode: middleware; for tool-style access use OpenViking's MCP server",
        )));
    }
    let (parsed, _warnings) = deermem_backend_openviking::OpenVikingConfig::from_backend_config(
        &config.backend_config,
        env,
    )
    .map_err(|e| naming_backend(e, "openviking"))?;
    parsed
        .validate()
        .map_err(|e| naming_backend(e, "openviking"))?;
    let cursors = remote_cursors(config, env, "openviking")?;
    let m = deermem_backend_openviking::OpenVikingManager::from_backend_config_with_cursors(
        &config.backend_config,
        config.mode,
        i.root.to_path_buf(),
        Arc::clone(&i.clock),
        env,
        cursors,
    )
    .map_err(refused("openviking"))?;
    Ok(Backend::OpenViking(Arc::new(m)))
}

#[cfg(all(feature = "engine", feature = "storage-file"))]
fn build_deermem(i: &Inputs<'_, '_>) -> Result<Backend, BuildError> {
    let (config, root, clock, opts) = (i.config, i.root, Arc::clone(&i.clock), i.opts);
    let name = "deermem".to_owned();
    let mut cfg = crate::embedded::deermem_config(&config.backend_config)?;
    if opts.short_lived
        && let Some(serde_json::Value::Object(pg)) = cfg.storage_sections.get_mut("postgres")
    {
        // A short-lived process checks the revision on every load: no read leases to take.
        pg.insert("coherence".into(), "revision_check".into());
    }
    let storage = crate::embedded::open_embedded(
        &cfg,
        root.to_path_buf(),
        Arc::clone(&clock),
        true,
        opts.env,
    )
    .map_err(|e| match e {
        crate::embedded::EmbeddedError::Config(c) => BuildError::Config(c),
        crate::embedded::EmbeddedError::Storage(s) => BuildError::Backend {
            name: name.clone(),
            source: s.into(),
        },
        crate::embedded::EmbeddedError::NotCompiled { storage, feature } => {
            BuildError::NotCompiled {
                name: format!("deermem (storage_class: {storage})"),
                feature,
            }
        }
        other => BuildError::Backend {
            name: name.clone(),
            source: ManagerError::Unavailable {
                message: other.to_string(),
                source: None,
            },
        },
    })?;
    let llm = match &opts.llm {
        Some(llm) => Some(Arc::clone(llm)),
        None => build_llm(&cfg)?,
    };
    let durable = cfg.queue.durable;
    let mut parts = deermem_engine::DeerMemParts::new(cfg, storage.storage(), clock);
    if durable {
        parts.turns = Some(match &storage {
            crate::embedded::EmbeddedStorage::File(_) => shared_file_turn_journal(root),
            // The `turn_journal` table on the storage's own pool, shared by every replica.
            #[cfg(feature = "storage-postgres")]
            crate::embedded::EmbeddedStorage::Postgres(pg) => pg.turn_journal(),
        });
    }
    parts.recover_turns = opts.recover_turns;
    parts.mode = config.mode;
    parts.injection_enabled = config.injection_enabled;
    parts.llm = llm;
    parts.observer = opts.observer.clone();
    if let Some(policy) = &opts.hidden_messages {
        parts.hidden_messages = policy.clone();
    }
    let manager = deermem_engine::DeerMemManager::new(parts)
        .map_err(|source| BuildError::Backend { name, source })?;
    Ok(Backend::DeerMem(Arc::new(manager), storage))
}

/// The configured extraction model, or `None` when no model is configured (the offline
/// rule-based proposer is then used).
#[cfg(all(feature = "engine", feature = "storage-file"))]
fn build_llm(
    cfg: &deermem_updater::DeerMemConfig,
) -> Result<Option<Arc<dyn LanguageModel>>, BuildError> {
    if !cfg.model.is_configured() {
        return Ok(None);
    }
    #[cfg(feature = "llm-openai")]
    {
        let model = deermem_llm_openai::OpenAiChatModel::from_config(&cfg.model)?;
        Ok(Some(Arc::new(model) as Arc<dyn LanguageModel>))
    }
    #[cfg(not(feature = "llm-openai"))]
    {
        Err(BuildError::NotCompiled {
            name: "model (OpenAI-compatible client)".into(),
            feature: "llm-openai",
        })
    }
}

/// The file turn journal of a storage root, one per root in this process: the journal takes an
/// exclusive lock on its root, so two managers built on one root in one process (two
/// configurations, a rebuilt manager while the old one is still alive) share it rather than the
/// second being refused every turn.
#[cfg(all(feature = "engine", feature = "storage-file"))]
fn shared_file_turn_journal(root: &std::path::Path) -> Arc<dyn deermem_core::ports::TurnJournal> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, Weak};
    type Journals = Mutex<HashMap<PathBuf, Weak<deermem_storage_file::DeferredFileTurnJournal>>>;
    static JOURNALS: OnceLock<Journals> = OnceLock::new();
    let key = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut journals = JOURNALS
        .get_or_init(Journals::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    journals.retain(|_, j| j.strong_count() > 0);
    if let Some(j) = journals.get(&key).and_then(Weak::upgrade) {
        return j;
    }
    let j = Arc::new(deermem_storage_file::DeferredFileTurnJournal::in_root(
        root,
        deermem_storage_file::FileTurnJournalOptions::default(),
    ));
    journals.insert(key, Arc::downgrade(&j));
    j
}
