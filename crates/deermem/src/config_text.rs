//! Reading configuration text: YAML or JSON (a whole DeerFlow `config.yaml` or a bare `memory:`
//! section) into the host's [`MemoryConfig`], with `$VAR` resolution and the migration of the
//! legacy top-level DeerMem keys into `backend_config`. Pure: the environment arrives as a
//! lookup function.

use deermem_core::config::{ConfigWarning, lax};
use deermem_core::{ConfigError, MemoryConfig};
use serde_json::{Map, Value};

/// Top-level legacy DeerMem keys that are moved into `backend_config`.
const LEGACY_KEYS: [&str; 21] = [
    "storage_path",
    "storage_class",
    "debounce_seconds",
    "max_facts",
    "fact_confidence_threshold",
    "max_injection_tokens",
    "token_counting",
    "guaranteed_categories",
    "guaranteed_token_budget",
    "staleness_review_enabled",
    "staleness_age_days",
    "staleness_min_candidates",
    "staleness_max_removals_per_cycle",
    "staleness_protected_categories",
    "staleness_max_lifetime_multiplier",
    "staleness_max_extension_days",
    "consolidation_enabled",
    "consolidation_min_facts",
    "consolidation_max_groups_per_cycle",
    "consolidation_max_sources",
    "model_name",
];

/// Parses a `memory:` section (already env-resolved), migrating legacy top-level keys into
/// `backend_config`.
///
/// # Errors
/// A [`ConfigError`] naming the key.
pub fn memory_config_from_section(
    section: &Value,
) -> Result<(MemoryConfig, Vec<ConfigWarning>), ConfigError> {
    let map = match section {
        Value::Null => return Ok((MemoryConfig::default(), Vec::new())),
        Value::Object(m) => m,
        _ => return Err(ConfigError::new("memory", "must be a mapping")),
    };
    let (own, legacy): (Map<String, Value>, Map<String, Value>) = map
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .partition(|(k, _)| !LEGACY_KEYS.contains(&k.as_str()));
    let (mut cfg, ignored) = lax::deserialize::<MemoryConfig>(&Value::Object(own), "memory")?;
    if cfg.manager_class.trim().is_empty() {
        return Err(ConfigError::new(
            "memory.manager_class",
            "must not be empty",
        ));
    }
    let mut warnings: Vec<ConfigWarning> = ignored
        .iter()
        .map(|key| format!("memory.{key} is not a known key and was ignored"))
        .collect();
    for (key, value) in legacy {
        if value.is_null() || value.as_str() == Some("") {
            continue;
        }
        if key == "storage_path" && value.as_str().is_some_and(|s| s.ends_with(".json")) {
            warnings.push(format!(
                "memory.storage_path={value} looks like a file path; storage_path is now a root directory, so the legacy value was dropped"
            ));
            continue;
        }
        if key == "model_name" {
            let model = cfg
                .backend_config
                .entry("model")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = model
                && !m.contains_key("model")
            {
                m.insert("model".into(), value);
                warnings
                    .push("memory.model_name moved to memory.backend_config.model.model".into());
            }
            continue;
        }
        if !cfg.backend_config.contains_key(&key) {
            warnings.push(format!(
                "memory.{key} is a legacy top-level key; moved to memory.backend_config.{key}"
            ));
            cfg.backend_config.insert(key, value);
        }
    }
    Ok((cfg, warnings))
}

/// Loads the memory configuration from YAML or JSON text: either a whole DeerFlow
/// `config.yaml` with a top-level `memory:` key, or a bare `memory:` section. `$VAR` strings
/// anywhere are resolved with `env`.
///
/// # Errors
/// Unparseable text, a missing environment variable (named), or an invalid value.
pub fn load_config_text(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<LoadedConfig, ConfigError> {
    let root = parse_config_text(text)?;
    let root = resolve_env(root, "", env)?;
    let section = match &root {
        Value::Object(m) if m.contains_key("memory") => {
            m.get("memory").cloned().unwrap_or(Value::Null)
        }
        Value::Object(m) if looks_like_full_config(m) => Value::Null,
        other => other.clone(),
    };
    let (memory, warnings) = memory_config_from_section(&section)?;
    Ok(LoadedConfig {
        memory,
        root,
        warnings,
    })
}

fn looks_like_full_config(m: &Map<String, Value>) -> bool {
    ["gateway", "models", "tools", "sandbox", "skills"]
        .iter()
        .any(|k| m.contains_key(*k))
}

/// A loaded configuration file: the memory section plus the whole (env-resolved) document, so
/// other sections (`gateway:`) can be read from the same file.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedConfig {
    /// The memory section.
    pub memory: MemoryConfig,
    /// The whole document.
    pub root: Value,
    /// Non-fatal notes.
    pub warnings: Vec<ConfigWarning>,
}

/// Parses configuration text (YAML, a superset of JSON) into a JSON value: the one place
/// configuration text is read.
///
/// # Errors
/// Text that is not valid YAML, or YAML that cannot be represented as JSON.
pub fn parse_config_text(text: &str) -> Result<Value, ConfigError> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    // The YAML 1.1 codec the fact files use, so that `yes`/`on`/`0o17` in a config mean what
    // DeerFlow's PyYAML makes of them (see `docs/compat.md`). JSON text is YAML too.
    deermem_pycompat::yaml::parse_document(text)
        .map_err(|e| ConfigError::new("config", format!("invalid YAML/JSON: {e}")))
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The variable a whole-string environment reference names: `$NAME` or `${NAME}`, where NAME
/// is `[A-Za-z_][A-Za-z0-9_]*`; `None` for any other string. For values an adapter resolves
/// itself when it connects (a database URL).
pub fn env_reference(s: &str) -> Option<&str> {
    let name = s.strip_prefix('$')?;
    let name = match name.strip_prefix('{') {
        Some(inner) => inner.strip_suffix('}')?,
        None => name,
    };
    is_env_name(name).then_some(name)
}

/// Replaces every string of the form `$NAME` with the environment variable `NAME`.
///
/// # Errors
/// A missing variable, naming it and the key that referenced it.
pub fn resolve_env(
    v: Value,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Value, ConfigError> {
    Ok(match v {
        Value::String(s) => match s.strip_prefix('$') {
            Some(name) if is_env_name(name) => match env(name) {
                Some(val) => Value::String(val),
                None => {
                    return Err(ConfigError::new(
                        if path.is_empty() { "config" } else { path },
                        format!("environment variable {name} is not set"),
                    ));
                }
            },
            _ => Value::String(s),
        },
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, x)| resolve_env(x, &format!("{path}[{i}]"), env))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, x)| {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    resolve_env(x, &p, env).map(|x| (k, x))
                })
                .collect::<Result<_, _>>()?,
        ),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use deermem_core::MemoryMode;
    use serde_json::json;

    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// The file storage's own default is the DeerMem backend's `cache_max_scopes` default.
    #[cfg(feature = "storage-file")]
    #[test]
    fn the_default_scope_cache_bound_agrees() {
        assert_eq!(
            deermem_updater::DEFAULT_CACHE_MAX_SCOPES,
            deermem_storage_file::DEFAULT_CACHE_MAX_SCOPES
        );
    }

    #[test]
    fn unknown_host_keys_warn_and_legacy_keys_move() {
        let (_, w) =
            memory_config_from_section(&json!({"enabeld": false, "max_facts": 20})).unwrap();
        assert_eq!(w[0], "memory.enabeld is not a known key and was ignored");
        assert!(w[1].contains("memory.backend_config.max_facts"), "{w:?}");
    }

    /// What YAML scalars in a config file mean: what DeerFlow's PyYAML (YAML 1.1) reads from the
    /// same file (checked against PyYAML 6), not what a YAML 1.2 reader would.
    #[test]
    fn yaml_scalars_in_config_mean_what_the_loader_reads() {
        let cases = [
            ("yes", json!(true)),
            ("on", json!(true)),
            ("Off", json!(false)),
            ("0o17", json!("0o17")),
            ("017", json!(15)),
            ("1:30", json!(90)),
            ("1e3", json!("1e3")),
            ("1_000", json!(1000)),
            ("~", json!(null)),
            ("y", json!("y")),
            ("0x1f", json!(31)),
        ];
        for (scalar, pyyaml) in cases {
            let got = parse_config_text(&format!("a: {scalar}")).unwrap();
            assert_eq!(got["a"], pyyaml, "a: {scalar}");
        }
        // A bool key reads these words (lax coercion), and `~` keeps the default.
        let loaded = load_config_text(
            "memory:\n  enabled: off\n  injection_enabled: no\n  mode: ~\n  backend_config:\n    strict_user_scope: yes\n",
            &no_env,
        )
        .unwrap();
        assert!(!loaded.memory.enabled && !loaded.memory.injection_enabled);
        assert_eq!(loaded.memory.mode, MemoryMode::Middleware);
        #[cfg(feature = "storage-file")]
        {
            let bc = &loaded.memory.backend_config;
            let (c, _) = deermem_updater::DeerMemConfig::from_backend_config(bc).unwrap();
            assert!(c.strict_user_scope);
        }
    }

    #[test]
    fn shared_section_validates_and_migrates_legacy_keys() {
        let (c, w) = memory_config_from_section(&json!({
            "enabled": true, "mode": "tool", "max_facts": 50, "storage_path": "memory.json",
            "model_name": "gpt-x", "backend_config": {"max_facts": 70}, "debounce_seconds": 10
        }))
        .unwrap();
        assert_eq!(c.mode, MemoryMode::Tool);
        assert_eq!(
            c.backend_config["max_facts"], 70,
            "never overwrites backend_config"
        );
        assert_eq!(c.backend_config["debounce_seconds"], 10);
        assert_eq!(c.backend_config["model"]["model"], "gpt-x");
        assert!(!c.backend_config.contains_key("storage_path"));
        assert!(w.iter().any(|x| x.contains("looks like a file path")));
        for (key, value) in [
            ("mode", json!("auto")),
            ("shutdown_flush_timeout_seconds", json!(0.5)),
            ("shutdown_flush_timeout_seconds", json!(301)),
            ("enabled", json!("perhaps")),
        ] {
            let err = memory_config_from_section(&json!({ key: value })).unwrap_err();
            assert_eq!(err.key, format!("memory.{key}"));
        }
    }

    #[test]
    fn loads_full_config_or_bare_section_with_env() {
        let env = |k: &str| (k == "OPENAI_API_KEY").then(|| "sk-test".to_owned());
        let full = "memory:\n  mode: tool\n  backend_config:\n    model:\n      model: gpt-4o-mini\n      api_key: $OPENAI_API_KEY\ngateway:\n  bind: 127.0.0.1:1\n";
        let loaded = load_config_text(full, &env).unwrap();
        assert_eq!(loaded.memory.mode, MemoryMode::Tool);
        assert_eq!(loaded.memory.backend_config["model"]["api_key"], "sk-test");
        assert_eq!(loaded.root["gateway"]["bind"], "127.0.0.1:1");
        let bare =
            load_config_text("{\"enabled\": false, \"manager_class\": \"noop\"}", &no_env).unwrap();
        assert!(!bare.memory.enabled);
        assert_eq!(bare.memory.manager_class, "noop");
        let err = load_config_text(
            "memory:\n  backend_config:\n    model:\n      api_key: $MISSING_KEY\n",
            &no_env,
        )
        .unwrap_err();
        assert!(err.message.contains("MISSING_KEY"));
        assert_eq!(err.key, "memory.backend_config.model.api_key");
        assert!(load_config_text("memory: [unclosed", &no_env).is_err());
    }

    #[test]
    fn env_references() {
        assert_eq!(env_reference("$DATABASE_URL"), Some("DATABASE_URL"));
        assert_eq!(env_reference("${DATABASE_URL}"), Some("DATABASE_URL"));
        assert_eq!(env_reference("${_X1}"), Some("_X1"));
        assert_eq!(env_reference("postgres://u@h/db"), None);
        assert_eq!(env_reference("${NOPE"), None);
        assert_eq!(env_reference("${}"), None);
        assert_eq!(env_reference("$1X"), None);
        assert_eq!(env_reference("$A-B"), None);
    }
}
