//! The command context: configuration loaded once, the backend built on demand, and parsing of
//! user-facing ids.

use std::path::PathBuf;
use std::sync::Arc;

use deermem::LoadedConfig;
use deermem::{Backend, BuildOptions};
use deermem_core::ports::{MemoryManager, MemoryScope};
use deermem_core::{AgentName, MemoryConfig, UserId};

use crate::args::{GlobalArgs, ScopeArgs};
use crate::error::{CliError, Kind};

/// Everything a command needs besides its own arguments.
pub(crate) struct Ctx {
    pub(crate) global: GlobalArgs,
    pub(crate) loaded: LoadedConfig,
    /// The directory of the config file (relative paths in it resolve against it).
    pub(crate) config_dir: Option<PathBuf>,
}

impl Ctx {
    /// Loads the configuration named by `--config` or `$DEERMEM_CONFIG`, or the defaults.
    pub(crate) fn load(global: GlobalArgs) -> Result<Self, CliError> {
        let path = global.config.clone().or_else(|| {
            std::env::var_os("DEERMEM_CONFIG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let (loaded, config_dir) = match path {
            Some(p) => {
                let loaded =
                    deermem::load_config_file(&p).map_err(|e| CliError::invalid(e.to_string()))?;
                (loaded, p.parent().map(|d| d.to_path_buf()))
            }
            None => (
                LoadedConfig {
                    memory: MemoryConfig::default(),
                    root: serde_json::Value::Null,
                    warnings: Vec::new(),
                },
                None,
            ),
        };
        for w in &loaded.warnings {
            tracing::warn!("{w}");
        }
        Ok(Self {
            global,
            loaded,
            config_dir,
        })
    }

    /// The memory configuration.
    pub(crate) fn memory(&self) -> &MemoryConfig {
        &self.loaded.memory
    }

    /// Build options honouring `--storage-path`, for a command that runs once and exits (it
    /// takes no PostgreSQL read leases); `serve` and `mcp` clear `short_lived`.
    pub(crate) fn build_options(&self) -> BuildOptions<'static> {
        let mut opts = BuildOptions::new(&deermem::process_env);
        opts.storage_path = self.global.storage_path.clone();
        opts.short_lived = true;
        // One-shot commands leave the turn journal to the server that replays it.
        opts.recover_turns = false;
        opts
    }

    /// The storage root the configuration selects.
    pub(crate) fn storage_root(&self) -> PathBuf {
        deermem::storage_root(self.memory(), &self.build_options())
    }

    /// Builds the configured backend.
    pub(crate) fn backend(&self) -> Result<Backend, CliError> {
        deermem::build_backend(self.memory(), self.build_options()).map_err(build_error)
    }

    /// Builds the configured backend's manager.
    pub(crate) fn manager(&self) -> Result<Arc<dyn MemoryManager>, CliError> {
        Ok(self.backend()?.manager())
    }
}

/// Maps a backend build failure to an exit code: configuration mistakes are invalid input (5),
/// including those a remote backend reports while starting (a missing API key, tool mode for
/// OpenViking); anything else is a failure (1).
pub(crate) fn build_error(e: deermem::BuildError) -> CliError {
    match e {
        deermem::BuildError::Config(c) => CliError::invalid(c.to_string()),
        e @ deermem::BuildError::Backend {
            source: deermem_core::ManagerError::InvalidInput { .. },
            ..
        } => CliError::invalid(e.to_string()),
        // The database (or a remote backend) cannot be reached: the "unavailable" code.
        e @ deermem::BuildError::Backend {
            source:
                deermem_core::ManagerError::Unavailable { .. }
                | deermem_core::ManagerError::Timeout { .. },
            ..
        } => CliError::new(Kind::Unavailable, e.to_string()),
        other => CliError::new(Kind::Failure, other.to_string()),
    }
}

/// Parses a raw user id.
pub(crate) fn user(raw: &str) -> Result<UserId, CliError> {
    UserId::new(raw).map_err(CliError::from)
}

/// Parses an optional agent name (omitted means the default bucket).
pub(crate) fn agent(raw: Option<&str>) -> Result<Option<AgentName>, CliError> {
    raw.map(AgentName::parse)
        .transpose()
        .map_err(CliError::from)
}

/// The manager scope of `--user` / `--agent`.
pub(crate) fn scope(args: &ScopeArgs) -> Result<MemoryScope, CliError> {
    Ok(MemoryScope::new(
        Some(user(&args.user)?),
        agent(args.agent.as_deref())?,
    ))
}
