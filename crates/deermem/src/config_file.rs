//! Loading configuration files from disk and resolving the storage root.

use std::path::{Path, PathBuf};

use deermem_core::ConfigError;

use crate::config_text::{LoadedConfig, load_config_text};

/// A configuration file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file's content is invalid.
    #[error("invalid config file {path}: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        #[source]
        source: ConfigError,
    },
}

/// The process environment, as the lookup function configuration loading takes.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Loads a DeerFlow `config.yaml` (with a top-level `memory:`) or a bare `memory:` section,
/// resolving `$VAR` strings from the process environment.
///
/// # Errors
/// Unreadable files, invalid YAML, missing environment variables, invalid values.
pub fn load_config_file(path: &Path) -> Result<LoadedConfig, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    load_config_text(&text, &process_env).map_err(|source| ConfigFileError::Invalid {
        path: path.to_path_buf(),
        source,
    })
}

/// The storage root for a configured `storage_path`: an absolute path as is; a relative one
/// against `$DEER_FLOW_HOME` when set (as the DeerFlow host does), else the current directory;
/// an empty one falls back to `$DEERMEM_DATA_DIR`, then `$DEER_FLOW_HOME`, then `~/.deermem`.
pub fn resolve_storage_root(storage_path: &str, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let non_empty = |k: &str| env(k).filter(|v| !v.is_empty());
    if !storage_path.is_empty() {
        let p = PathBuf::from(storage_path);
        if p.is_absolute() {
            return p;
        }
        return match non_empty("DEER_FLOW_HOME") {
            Some(home) => PathBuf::from(home).join(p),
            None => std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p),
        };
    }
    if let Some(dir) = non_empty("DEERMEM_DATA_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = non_empty("DEER_FLOW_HOME") {
        return PathBuf::from(dir);
    }
    match non_empty("HOME") {
        Some(home) => PathBuf::from(home).join(".deermem"),
        None => PathBuf::from(".deermem"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_root_resolution_order() {
        let env = |k: &str| match k {
            "DEERMEM_DATA_DIR" => Some("/data/dm".to_owned()),
            "HOME" => Some("/home/u".to_owned()),
            _ => None,
        };
        assert_eq!(
            resolve_storage_root("/abs/root", &env),
            PathBuf::from("/abs/root")
        );
        assert_eq!(resolve_storage_root("", &env), PathBuf::from("/data/dm"));
        let home_only = |k: &str| (k == "HOME").then(|| "/home/u".to_owned());
        assert_eq!(
            resolve_storage_root("", &home_only),
            PathBuf::from("/home/u/.deermem")
        );
        let flow = |k: &str| (k == "DEER_FLOW_HOME").then(|| "/flow".to_owned());
        assert_eq!(
            resolve_storage_root("mem", &flow),
            PathBuf::from("/flow/mem")
        );
    }

    #[test]
    fn config_file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "memory:\n  max_facts: nope\n  backend_config:\n    max_facts: 5\n",
        )
        .unwrap();
        let loaded = load_config_file(&path).unwrap();
        assert_eq!(loaded.memory.backend_config["max_facts"], 5);
        std::fs::write(&path, "memory:\n  mode: sideways\n").unwrap();
        let err = load_config_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("config.yaml") && err.contains("memory.mode"),
            "{err}"
        );
        assert!(load_config_file(&dir.path().join("missing.yaml")).is_err());
    }
}
