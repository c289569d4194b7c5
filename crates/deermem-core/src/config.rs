//! Configuration of the host's `memory:` section: the shared host fields, the DeerMem
//! `backend_config` keys with their defaults and ranges, `$VAR` resolution and the legacy
//! top-level key migration. Parsing is pure: the environment arrives as a lookup function.
//!
//! Values are coerced the way the reference's pydantic models coerce them in lax mode (`"20"`
//! is 20, `"yes"` is true, `30.0` is 30, `30.5` is an error for an integer key) and every
//! failure names the key and its valid range.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ConfigError;
use crate::policy::eviction::{EvictionParams, EvictionPolicy};

/// How memory reaches the agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum MemoryMode {
    /// Passive extraction after every turn plus automatic injection (the default).
    #[default]
    Middleware,
    /// The model calls the memory tools itself; only summaries are injected.
    Tool,
}

impl MemoryMode {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Middleware => "middleware",
            Self::Tool => "tool",
        }
    }
}

/// How the injection budget counts tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenCounting {
    /// BPE counting with the `cl100k_base` encoding (bundled; never downloaded).
    #[default]
    Tiktoken,
    /// The network-free CJK-aware character estimate.
    Char,
}

/// A non-fatal note produced while loading configuration (ignored keys, migrated legacy keys).
pub type ConfigWarning = String;

/// The shared host `memory:` section.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryConfig {
    /// Master switch for the call sites and the gateway routes.
    pub enabled: bool,
    /// Middleware or tool mode.
    pub mode: MemoryMode,
    /// Whether the `<memory>` block is injected at all.
    pub injection_enabled: bool,
    /// Hard budget for draining pending updates at shutdown, 1–300 s.
    pub shutdown_flush_timeout_seconds: f64,
    /// Backend name: `deermem`, `noop`, `honcho`, `openviking`.
    pub manager_class: String,
    /// The backend's private settings, passed to it unchanged.
    pub backend_config: Map<String, Value>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            mode: MemoryMode::Middleware,
            injection_enabled: true,
            shutdown_flush_timeout_seconds: 30.0,
            manager_class: "deermem".into(),
            backend_config: Map::new(),
        }
    }
}

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

const SHARED_KEYS: [&str; 6] = [
    "enabled",
    "mode",
    "injection_enabled",
    "shutdown_flush_timeout_seconds",
    "manager_class",
    "backend_config",
];

impl MemoryConfig {
    /// Parses a `memory:` section (already env-resolved), migrating legacy top-level keys into
    /// `backend_config`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key.
    pub fn from_section(section: &Value) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let mut warnings = Vec::new();
        let map = match section {
            Value::Null => return Ok((Self::default(), warnings)),
            Value::Object(m) => m,
            _ => return Err(ConfigError::new("memory", "must be a mapping")),
        };
        let mut cfg = Self::default();
        let lax = Lax { prefix: "memory" };
        if let Some(v) = present(map, "enabled") {
            cfg.enabled = lax.bool("enabled", v)?;
        }
        if let Some(v) = present(map, "mode") {
            cfg.mode = match v.as_str() {
                Some("middleware") => MemoryMode::Middleware,
                Some("tool") => MemoryMode::Tool,
                _ => {
                    return Err(ConfigError::new(
                        "memory.mode",
                        format!("must be 'middleware' or 'tool' (got {v})"),
                    ));
                }
            };
        }
        if let Some(v) = present(map, "injection_enabled") {
            cfg.injection_enabled = lax.bool("injection_enabled", v)?;
        }
        if let Some(v) = present(map, "shutdown_flush_timeout_seconds") {
            cfg.shutdown_flush_timeout_seconds =
                lax.float_range("shutdown_flush_timeout_seconds", v, 1.0, 300.0)?;
        }
        if let Some(v) = present(map, "manager_class") {
            cfg.manager_class = lax.string("manager_class", v)?;
            if cfg.manager_class.trim().is_empty() {
                return Err(ConfigError::new(
                    "memory.manager_class",
                    "must not be empty",
                ));
            }
        }
        if let Some(v) = present(map, "backend_config") {
            match v {
                Value::Object(m) => cfg.backend_config = m.clone(),
                _ => {
                    return Err(ConfigError::new(
                        "memory.backend_config",
                        "must be a mapping",
                    ));
                }
            }
        }
        for (key, value) in map {
            if SHARED_KEYS.contains(&key.as_str()) {
                continue;
            }
            if !LEGACY_KEYS.contains(&key.as_str()) {
                warnings.push(format!("memory.{key} is not a known key and was ignored"));
                continue;
            }
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
                    m.insert("model".into(), value.clone());
                    warnings.push(
                        "memory.model_name moved to memory.backend_config.model.model".into(),
                    );
                }
                continue;
            }
            if !cfg.backend_config.contains_key(key) {
                cfg.backend_config.insert(key.clone(), value.clone());
                warnings.push(format!(
                    "memory.{key} is a legacy top-level key; moved to memory.backend_config.{key}"
                ));
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
    pub fn load_str(
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
        let (memory, warnings) = Self::from_section(&section)?;
        Ok(LoadedConfig {
            memory,
            root,
            warnings,
        })
    }

    /// Whether the tool-mode tools are registered (`enabled` and `mode: tool`).
    pub fn use_memory_tools(&self) -> bool {
        self.enabled && self.mode == MemoryMode::Tool
    }
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

/// Parses YAML (a superset of JSON) configuration text into a JSON value.
///
/// # Errors
/// Text that is not valid YAML, or YAML that cannot be represented as JSON.
pub fn parse_config_text(text: &str) -> Result<Value, ConfigError> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    let yaml: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| ConfigError::new("config", format!("invalid YAML/JSON: {e}")))?;
    serde_json::to_value(yaml)
        .map_err(|e| ConfigError::new("config", format!("unsupported value: {e}")))
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
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

fn present<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

/// Lax (pydantic-style) coercion with errors naming `prefix.key`.
struct Lax {
    prefix: &'static str,
}

impl Lax {
    fn err(&self, key: &str, msg: impl Into<String>) -> ConfigError {
        ConfigError::new(format!("{}.{key}", self.prefix), msg)
    }

    fn bool(&self, key: &str, v: &Value) -> Result<bool, ConfigError> {
        match v {
            Value::Bool(b) => Ok(*b),
            Value::Number(n) if n.as_i64() == Some(0) => Ok(false),
            Value::Number(n) if n.as_i64() == Some(1) => Ok(true),
            Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "1" | "t" | "y" => Ok(true),
                "false" | "no" | "off" | "0" | "f" | "n" => Ok(false),
                _ => Err(self.err(key, format!("must be a boolean (got {v})"))),
            },
            _ => Err(self.err(key, format!("must be a boolean (got {v})"))),
        }
    }

    fn int(&self, key: &str, v: &Value) -> Result<i64, ConfigError> {
        let bad = || self.err(key, format!("must be an integer (got {v})"));
        match v {
            Value::Bool(b) => Ok(i64::from(*b)),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Ok(i)
                } else {
                    let f = n.as_f64().ok_or_else(bad)?;
                    if f.fract() == 0.0 && f.abs() < 9.0e15 {
                        Ok(f as i64)
                    } else {
                        Err(bad())
                    }
                }
            }
            Value::String(s) => s.trim().parse::<i64>().map_err(|_| bad()),
            _ => Err(bad()),
        }
    }

    fn int_range(
        &self,
        key: &str,
        v: &Value,
        lo: i64,
        hi: Option<i64>,
    ) -> Result<i64, ConfigError> {
        let i = self.int(key, v)?;
        let ok = i >= lo && hi.is_none_or(|h| i <= h);
        if ok {
            Ok(i)
        } else {
            Err(self.err(
                key,
                match hi {
                    Some(h) => format!("must be an integer between {lo} and {h} (got {i})"),
                    None => format!("must be an integer >= {lo} (got {i})"),
                },
            ))
        }
    }

    fn float(&self, key: &str, v: &Value) -> Result<f64, ConfigError> {
        let bad = || self.err(key, format!("must be a number (got {v})"));
        let f = match v {
            Value::Bool(b) => f64::from(u8::from(*b)),
            Value::Number(n) => n.as_f64().ok_or_else(bad)?,
            Value::String(s) => deermem_pycompat::py::parse_float(s).ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        if f.is_finite() {
            Ok(f)
        } else {
            Err(self.err(key, format!("must be a finite number (got {v})")))
        }
    }

    fn float_range(&self, key: &str, v: &Value, lo: f64, hi: f64) -> Result<f64, ConfigError> {
        let f = self.float(key, v)?;
        if (lo..=hi).contains(&f) {
            Ok(f)
        } else {
            Err(self.err(
                key,
                format!("must be a number between {lo} and {hi} (got {f})"),
            ))
        }
    }

    fn string(&self, key: &str, v: &Value) -> Result<String, ConfigError> {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| self.err(key, format!("must be a string (got {v})")))
    }

    fn string_list(&self, key: &str, v: &Value) -> Result<Vec<String>, ConfigError> {
        match v {
            Value::Array(items) => items
                .iter()
                .map(|i| {
                    i.as_str().map(str::to_owned).ok_or_else(|| {
                        self.err(key, format!("must be a list of strings (got {v})"))
                    })
                })
                .collect(),
            _ => Err(self.err(key, format!("must be a list of strings (got {v})"))),
        }
    }
}

/// The LLM used for extraction (`backend_config.model`). An empty `model` means the host's
/// default model, or the offline rule-based proposer when there is none.
#[derive(Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ModelConfig {
    /// Provider name (only OpenAI-compatible endpoints are supported; default `openai`).
    pub provider: Option<String>,
    /// Model name; `None` means no model is configured.
    pub model: Option<String>,
    /// API key (after `$VAR` resolution). Never printed by `Debug`.
    pub api_key: Option<String>,
    /// Base URL of the OpenAI-compatible API (default `https://api.openai.com/v1`).
    pub base_url: Option<String>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Request timeout in seconds (default 60).
    pub timeout_seconds: f64,
    /// Connect timeout in seconds (default 10).
    pub connect_timeout_seconds: f64,
    /// Retries on 429, 5xx and transport errors (default 2).
    pub max_retries: u32,
    /// Output token cap.
    pub max_tokens: Option<u32>,
}

impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConfig")
            .field("provider", &self.provider)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("base_url", &self.base_url)
            .field("temperature", &self.temperature)
            .field("timeout_seconds", &self.timeout_seconds)
            .field("connect_timeout_seconds", &self.connect_timeout_seconds)
            .field("max_retries", &self.max_retries)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

impl ModelConfig {
    fn defaults() -> Self {
        Self {
            timeout_seconds: 60.0,
            connect_timeout_seconds: 10.0,
            max_retries: 2,
            ..Self::default()
        }
    }

    /// Whether a model is configured.
    pub fn is_configured(&self) -> bool {
        self.model.as_deref().is_some_and(|m| !m.trim().is_empty())
    }
}

/// The DeerMem `backend_config`: every key the reference accepts, with its default and range.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct DeerMemConfig {
    pub storage_path: String,
    pub storage_class: String,
    pub strict_user_scope: bool,
    pub manifest_filename: String,
    pub file_lock_timeout_seconds: u64,
    pub retrieval_adapter: String,
    pub debounce_seconds: u64,
    pub queue_max_depth: u64,
    /// Bytes of queued conversation turns one user may have pending (0: no limit).
    pub queue_max_pending_bytes_per_user: u64,
    /// Bytes of queued conversation turns pending for all users together (0: no limit).
    pub queue_max_pending_bytes: u64,
    pub max_facts: usize,
    pub fact_eviction_policy: EvictionPolicy,
    pub fact_eviction_shadow_enabled: bool,
    pub eviction_confidence_weight: f64,
    pub eviction_confirmation_weight: f64,
    pub eviction_access_weight: f64,
    pub eviction_confirmation_half_life_days: u64,
    pub eviction_access_half_life_days: u64,
    pub eviction_correction_reserved_fraction: f64,
    pub eviction_correction_reserved_max: usize,
    pub eviction_audit_max_entries: usize,
    pub fact_confidence_threshold: f64,
    pub max_injection_tokens: usize,
    pub token_counting: TokenCounting,
    pub guaranteed_categories: Vec<String>,
    pub guaranteed_token_budget: usize,
    pub staleness_review_enabled: bool,
    pub staleness_age_days: u64,
    pub staleness_min_candidates: usize,
    pub staleness_max_removals_per_cycle: usize,
    pub staleness_protected_categories: Vec<String>,
    pub staleness_max_lifetime_multiplier: f64,
    pub staleness_max_extension_days: u64,
    pub consolidation_enabled: bool,
    pub consolidation_min_facts: usize,
    pub consolidation_max_groups_per_cycle: usize,
    pub consolidation_max_sources: usize,
    pub watermark_max_keys: usize,
    pub patterns_dir: Option<String>,
    pub prompts_dir: Option<String>,
    pub model: ModelConfig,
}

impl Default for DeerMemConfig {
    fn default() -> Self {
        Self {
            storage_path: String::new(),
            storage_class: String::new(),
            strict_user_scope: false,
            manifest_filename: "memory.json".into(),
            file_lock_timeout_seconds: 10,
            retrieval_adapter: "fts5".into(),
            debounce_seconds: 30,
            queue_max_depth: 1000,
            queue_max_pending_bytes_per_user: DEFAULT_QUEUE_MAX_PENDING_BYTES_PER_USER,
            queue_max_pending_bytes: DEFAULT_QUEUE_MAX_PENDING_BYTES,
            max_facts: 100,
            fact_eviction_policy: EvictionPolicy::Confidence,
            fact_eviction_shadow_enabled: false,
            eviction_confidence_weight: 0.65,
            eviction_confirmation_weight: 0.25,
            eviction_access_weight: 0.10,
            eviction_confirmation_half_life_days: 90,
            eviction_access_half_life_days: 30,
            eviction_correction_reserved_fraction: 0.10,
            eviction_correction_reserved_max: 10,
            eviction_audit_max_entries: 200,
            fact_confidence_threshold: 0.7,
            max_injection_tokens: 2000,
            token_counting: TokenCounting::Tiktoken,
            guaranteed_categories: vec!["correction".into()],
            guaranteed_token_budget: 500,
            staleness_review_enabled: true,
            staleness_age_days: 90,
            staleness_min_candidates: 3,
            staleness_max_removals_per_cycle: 10,
            staleness_protected_categories: vec!["correction".into()],
            staleness_max_lifetime_multiplier: 20.0,
            staleness_max_extension_days: 3650,
            consolidation_enabled: false,
            consolidation_min_facts: 8,
            consolidation_max_groups_per_cycle: 3,
            consolidation_max_sources: 8,
            watermark_max_keys: 4096,
            patterns_dir: None,
            prompts_dir: None,
            model: ModelConfig::defaults(),
        }
    }
}

/// The default `queue_max_pending_bytes_per_user` (16 MiB).
pub const DEFAULT_QUEUE_MAX_PENDING_BYTES_PER_USER: u64 = 16 * 1024 * 1024;
/// The default `queue_max_pending_bytes` (64 MiB).
pub const DEFAULT_QUEUE_MAX_PENDING_BYTES: u64 = 64 * 1024 * 1024;

/// Keys DeerMem reads from `backend_config`.
pub const DEERMEM_KEYS: [&str; 41] = [
    "storage_path",
    "storage_class",
    "strict_user_scope",
    "manifest_filename",
    "file_lock_timeout_seconds",
    "retrieval_adapter",
    "debounce_seconds",
    "queue_max_depth",
    "queue_max_pending_bytes_per_user",
    "queue_max_pending_bytes",
    "max_facts",
    "fact_eviction_policy",
    "fact_eviction_shadow_enabled",
    "eviction_confidence_weight",
    "eviction_confirmation_weight",
    "eviction_access_weight",
    "eviction_confirmation_half_life_days",
    "eviction_access_half_life_days",
    "eviction_correction_reserved_fraction",
    "eviction_correction_reserved_max",
    "eviction_audit_max_entries",
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
    "watermark_max_keys",
    "patterns_dir",
    "prompts_dir",
    "model",
];

mod shown;

pub use shown::{shown_backend_config, url_without_credentials};

/// Keys that secrets live under; redacted wherever configuration is shown.
pub const SECRET_KEY_NAMES: [&str; 11] = [
    "api_key",
    "apikey",
    "token",
    "tokens",
    "secret",
    "password",
    "internal_token",
    "authorization",
    "headers",
    "credentials",
    "private_key",
];

/// Returns a copy of a configuration value with every secret-looking key's value replaced by
/// `"***"` (keys named like [`SECRET_KEY_NAMES`], compared case-insensitively, and any key
/// ending in `_key`, `_token` or `_secret`).
pub fn redact_secrets(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    let lk = k.to_ascii_lowercase();
                    let secret = SECRET_KEY_NAMES.contains(&lk.as_str())
                        || lk.ends_with("_key")
                        || lk.ends_with("_token")
                        || lk.ends_with("_secret")
                        || lk.ends_with("_password");
                    let redacted = if secret && !x.is_null() && !lk.ends_with("_env") {
                        Value::String("***".into())
                    } else {
                        redact_secrets(x)
                    };
                    (k.clone(), redacted)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact_secrets).collect()),
        other => other.clone(),
    }
}

impl DeerMemConfig {
    /// Parses DeerMem's `backend_config`: `null` values take the default, unknown keys produce
    /// a warning, every known key is coerced and range-checked.
    ///
    /// This is pure; the one check that needs the filesystem (a `storage_path` naming an
    /// existing file) is done by the composition root.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `memory.backend_config.<key>` and its valid range.
    pub fn from_backend_config(
        bc: &Map<String, Value>,
    ) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let mut c = Self::default();
        let mut warnings = Vec::new();
        let l = Lax {
            prefix: "memory.backend_config",
        };
        let unknown: Vec<&str> = bc
            .keys()
            .map(String::as_str)
            .filter(|k| !DEERMEM_KEYS.contains(k))
            .collect();
        if !unknown.is_empty() {
            warnings.push(format!(
                "Unknown backend_config keys ignored by DeerMem; check for typos: {unknown:?}"
            ));
        }
        let g = |k: &str| present(bc, k);
        let as_u64 = |i: i64| u64::try_from(i).unwrap_or(0);
        let as_usize = |i: i64| usize::try_from(i).unwrap_or(0);

        if let Some(v) = g("storage_path") {
            c.storage_path = l.string("storage_path", v)?;
        }
        if let Some(v) = g("storage_class") {
            c.storage_class = l.string("storage_class", v)?;
            if !matches!(c.storage_class.as_str(), "" | "file") {
                return Err(l.err(
                    "storage_class",
                    format!("{:?} is not available; this engine ships the file storage only ('' or 'file'). Refusing to silently fall back because memory is persistent state", c.storage_class),
                ));
            }
        }
        if let Some(v) = g("strict_user_scope") {
            c.strict_user_scope = l.bool("strict_user_scope", v)?;
        }
        if let Some(v) = g("manifest_filename") {
            c.manifest_filename = l.string("manifest_filename", v)?;
            let name = &c.manifest_filename;
            if name.contains('/')
                || name.contains('\\')
                || !name.ends_with(".json")
                || name == ".."
                || name.contains('\0')
            {
                return Err(l.err(
                    "manifest_filename",
                    "manifest_filename must be a plain .json filename.",
                ));
            }
        }
        if let Some(v) = g("file_lock_timeout_seconds") {
            c.file_lock_timeout_seconds =
                as_u64(l.int_range("file_lock_timeout_seconds", v, 1, Some(120))?);
        }
        if let Some(v) = g("retrieval_adapter") {
            c.retrieval_adapter = l.string("retrieval_adapter", v)?;
            if !matches!(c.retrieval_adapter.as_str(), "" | "fts5") {
                return Err(l.err(
                    "retrieval_adapter",
                    format!("{:?} failed to load: only 'fts5' or '' (disabled) are available. Refusing to silently fall back", c.retrieval_adapter),
                ));
            }
        }
        if let Some(v) = g("debounce_seconds") {
            c.debounce_seconds = as_u64(l.int_range("debounce_seconds", v, 1, Some(300))?);
        }
        if let Some(v) = g("queue_max_depth") {
            c.queue_max_depth = as_u64(l.int_range("queue_max_depth", v, 0, None)?);
        }
        if let Some(v) = g("queue_max_pending_bytes_per_user") {
            c.queue_max_pending_bytes_per_user =
                as_u64(l.int_range("queue_max_pending_bytes_per_user", v, 0, None)?);
        }
        if let Some(v) = g("queue_max_pending_bytes") {
            c.queue_max_pending_bytes =
                as_u64(l.int_range("queue_max_pending_bytes", v, 0, None)?);
        }
        if let Some(v) = g("max_facts") {
            c.max_facts = as_usize(l.int_range("max_facts", v, 10, Some(500))?);
        }
        if let Some(v) = g("fact_eviction_policy") {
            c.fact_eviction_policy = match v.as_str() {
                Some("confidence") => EvictionPolicy::Confidence,
                Some("hybrid-v1") => EvictionPolicy::HybridV1,
                _ => {
                    return Err(l.err(
                        "fact_eviction_policy",
                        format!("must be 'confidence' or 'hybrid-v1' (got {v})"),
                    ));
                }
            };
        }
        if let Some(v) = g("fact_eviction_shadow_enabled") {
            c.fact_eviction_shadow_enabled = l.bool("fact_eviction_shadow_enabled", v)?;
        }
        if let Some(v) = g("eviction_confidence_weight") {
            c.eviction_confidence_weight =
                l.float_range("eviction_confidence_weight", v, 0.0, 1.0)?;
        }
        if let Some(v) = g("eviction_confirmation_weight") {
            c.eviction_confirmation_weight =
                l.float_range("eviction_confirmation_weight", v, 0.0, 1.0)?;
        }
        if let Some(v) = g("eviction_access_weight") {
            c.eviction_access_weight = l.float_range("eviction_access_weight", v, 0.0, 1.0)?;
        }
        if let Some(v) = g("eviction_confirmation_half_life_days") {
            c.eviction_confirmation_half_life_days =
                as_u64(l.int_range("eviction_confirmation_half_life_days", v, 1, Some(3650))?);
        }
        if let Some(v) = g("eviction_access_half_life_days") {
            c.eviction_access_half_life_days =
                as_u64(l.int_range("eviction_access_half_life_days", v, 1, Some(3650))?);
        }
        if let Some(v) = g("eviction_correction_reserved_fraction") {
            c.eviction_correction_reserved_fraction =
                l.float_range("eviction_correction_reserved_fraction", v, 0.0, 1.0)?;
        }
        if let Some(v) = g("eviction_correction_reserved_max") {
            c.eviction_correction_reserved_max =
                as_usize(l.int_range("eviction_correction_reserved_max", v, 0, Some(100))?);
        }
        if let Some(v) = g("eviction_audit_max_entries") {
            c.eviction_audit_max_entries =
                as_usize(l.int_range("eviction_audit_max_entries", v, 0, Some(10_000))?);
        }
        if let Some(v) = g("fact_confidence_threshold") {
            c.fact_confidence_threshold =
                l.float_range("fact_confidence_threshold", v, 0.0, 1.0)?;
        }
        if let Some(v) = g("max_injection_tokens") {
            c.max_injection_tokens =
                as_usize(l.int_range("max_injection_tokens", v, 100, Some(8000))?);
        }
        if let Some(v) = g("token_counting") {
            c.token_counting = match v.as_str() {
                Some("tiktoken") => TokenCounting::Tiktoken,
                Some("char") => TokenCounting::Char,
                _ => {
                    return Err(l.err(
                        "token_counting",
                        format!("must be 'tiktoken' or 'char' (got {v})"),
                    ));
                }
            };
        }
        if let Some(v) = g("guaranteed_categories") {
            c.guaranteed_categories = l.string_list("guaranteed_categories", v)?;
        }
        if let Some(v) = g("guaranteed_token_budget") {
            c.guaranteed_token_budget =
                as_usize(l.int_range("guaranteed_token_budget", v, 50, Some(2000))?);
        }
        if let Some(v) = g("staleness_review_enabled") {
            c.staleness_review_enabled = l.bool("staleness_review_enabled", v)?;
        }
        if let Some(v) = g("staleness_age_days") {
            c.staleness_age_days = as_u64(l.int_range("staleness_age_days", v, 30, Some(365))?);
        }
        if let Some(v) = g("staleness_min_candidates") {
            c.staleness_min_candidates =
                as_usize(l.int_range("staleness_min_candidates", v, 1, Some(50))?);
        }
        if let Some(v) = g("staleness_max_removals_per_cycle") {
            c.staleness_max_removals_per_cycle =
                as_usize(l.int_range("staleness_max_removals_per_cycle", v, 1, Some(50))?);
        }
        if let Some(v) = g("staleness_protected_categories") {
            c.staleness_protected_categories =
                l.string_list("staleness_protected_categories", v)?;
        }
        if let Some(v) = g("staleness_max_lifetime_multiplier") {
            c.staleness_max_lifetime_multiplier =
                l.float_range("staleness_max_lifetime_multiplier", v, 1.0, 100.0)?;
        }
        if let Some(v) = g("staleness_max_extension_days") {
            c.staleness_max_extension_days =
                as_u64(l.int_range("staleness_max_extension_days", v, 90, Some(36_500))?);
        }
        if let Some(v) = g("consolidation_enabled") {
            c.consolidation_enabled = l.bool("consolidation_enabled", v)?;
        }
        if let Some(v) = g("consolidation_min_facts") {
            c.consolidation_min_facts =
                as_usize(l.int_range("consolidation_min_facts", v, 3, Some(30))?);
        }
        if let Some(v) = g("consolidation_max_groups_per_cycle") {
            c.consolidation_max_groups_per_cycle =
                as_usize(l.int_range("consolidation_max_groups_per_cycle", v, 1, Some(10))?);
        }
        if let Some(v) = g("consolidation_max_sources") {
            c.consolidation_max_sources =
                as_usize(l.int_range("consolidation_max_sources", v, 2, Some(20))?);
        }
        if let Some(v) = g("watermark_max_keys") {
            c.watermark_max_keys = as_usize(l.int_range("watermark_max_keys", v, 0, None)?);
        }
        if let Some(v) = g("patterns_dir") {
            c.patterns_dir = Some(l.string("patterns_dir", v)?).filter(|s| !s.is_empty());
        }
        if let Some(v) = g("prompts_dir") {
            c.prompts_dir = Some(l.string("prompts_dir", v)?).filter(|s| !s.is_empty());
        }
        if let Some(v) = g("model") {
            c.model = parse_model(v, &mut warnings)?;
        }
        let sum = c.eviction_confidence_weight
            + c.eviction_confirmation_weight
            + c.eviction_access_weight;
        if (sum - 1.0).abs() > 1e-9 {
            return Err(ConfigError::new(
                "memory.backend_config.eviction_confidence_weight",
                format!("DeerMem eviction weights must sum to 1.0 (got {sum})"),
            ));
        }
        Ok((c, warnings))
    }

    /// The eviction parameters this configuration selects.
    pub fn eviction_params(&self, policy: EvictionPolicy) -> EvictionParams {
        EvictionParams {
            max_facts: self.max_facts,
            policy,
            confidence_weight: self.eviction_confidence_weight,
            confirmation_weight: self.eviction_confirmation_weight,
            access_weight: self.eviction_access_weight,
            confirmation_half_life_days: self.eviction_confirmation_half_life_days as f64,
            access_half_life_days: self.eviction_access_half_life_days as f64,
            correction_reserved_fraction: self.eviction_correction_reserved_fraction,
            correction_reserved_max: self.eviction_correction_reserved_max,
        }
    }

    /// Whether usage and confirmation metadata is collected (hybrid policy or shadow mode).
    pub fn tracks_usage(&self) -> bool {
        self.fact_eviction_policy == EvictionPolicy::HybridV1 || self.fact_eviction_shadow_enabled
    }
}

fn parse_model(v: &Value, warnings: &mut Vec<ConfigWarning>) -> Result<ModelConfig, ConfigError> {
    let l = Lax {
        prefix: "memory.backend_config.model",
    };
    let m = match v {
        Value::Object(m) => m,
        _ => {
            return Err(ConfigError::new(
                "memory.backend_config.model",
                "must be a mapping",
            ));
        }
    };
    let mut out = ModelConfig::defaults();
    let known = [
        "provider",
        "model",
        "api_key",
        "base_url",
        "temperature",
        "timeout_seconds",
        "connect_timeout_seconds",
        "max_retries",
        "max_tokens",
    ];
    let unknown: Vec<&str> = m
        .keys()
        .map(String::as_str)
        .filter(|k| !known.contains(k))
        .collect();
    if !unknown.is_empty() {
        warnings.push(format!(
            "Unknown backend_config.model keys ignored: {unknown:?}"
        ));
    }
    let opt_str = |k: &str| -> Result<Option<String>, ConfigError> {
        present(m, k)
            .map(|v| l.string(k, v))
            .transpose()
            .map(|o| o.filter(|s| !s.is_empty()))
    };
    out.provider = opt_str("provider")?;
    if let Some(p) = &out.provider
        && !matches!(
            p.as_str(),
            "openai" | "openai-compatible" | "deepseek" | "vllm" | "ollama" | "llamacpp"
        )
    {
        return Err(l.err(
            "provider",
            format!("{p:?} is not supported; use an OpenAI-compatible endpoint ('openai')"),
        ));
    }
    out.model = opt_str("model")?;
    out.api_key = opt_str("api_key")?;
    out.base_url = opt_str("base_url")?;
    if let Some(v) = present(m, "temperature") {
        out.temperature = Some(l.float_range("temperature", v, 0.0, 2.0)?);
    }
    if let Some(v) = present(m, "timeout_seconds") {
        out.timeout_seconds = l.float_range("timeout_seconds", v, 0.1, 3600.0)?;
    }
    if let Some(v) = present(m, "connect_timeout_seconds") {
        out.connect_timeout_seconds = l.float_range("connect_timeout_seconds", v, 0.1, 600.0)?;
    }
    if let Some(v) = present(m, "max_retries") {
        out.max_retries = u32::try_from(l.int_range("max_retries", v, 0, Some(10))?).unwrap_or(0);
    }
    if let Some(v) = present(m, "max_tokens") {
        out.max_tokens =
            Some(u32::try_from(l.int_range("max_tokens", v, 1, Some(1_000_000))?).unwrap_or(1));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<DeerMemConfig, ConfigError> {
        DeerMemConfig::from_backend_config(v.as_object().unwrap()).map(|(c, _)| c)
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_match_reference() {
        let c = parse(json!({})).unwrap();
        assert_eq!(c.max_facts, 100);
        assert_eq!(c.fact_confidence_threshold, 0.7);
        assert_eq!(c.debounce_seconds, 30);
        assert_eq!(c.max_injection_tokens, 2000);
        assert!(!c.consolidation_enabled);
        assert_eq!(c.staleness_age_days, 90);
        assert_eq!(c.guaranteed_categories, vec!["correction"]);
        assert_eq!(c.retrieval_adapter, "fts5");
        assert_eq!(c.manifest_filename, "memory.json");
        assert_eq!(c.watermark_max_keys, 4096);
        assert_eq!(c.queue_max_depth, 1000);
        assert_eq!(c.queue_max_pending_bytes_per_user, 16 * 1024 * 1024);
        assert_eq!(c.queue_max_pending_bytes, 64 * 1024 * 1024);
        assert!(!c.model.is_configured());
    }

    #[test]
    fn every_ranged_key_rejects_out_of_range_values_naming_the_key() {
        let cases: &[(&str, Value)] = &[
            ("file_lock_timeout_seconds", json!(0)),
            ("file_lock_timeout_seconds", json!(121)),
            ("debounce_seconds", json!(0)),
            ("debounce_seconds", json!(301)),
            ("queue_max_depth", json!(-1)),
            ("queue_max_pending_bytes_per_user", json!(-1)),
            ("queue_max_pending_bytes", json!(-1)),
            ("max_facts", json!(9)),
            ("max_facts", json!(501)),
            ("eviction_confidence_weight", json!(1.5)),
            ("eviction_confirmation_weight", json!(-0.1)),
            ("eviction_access_weight", json!(2)),
            ("eviction_confirmation_half_life_days", json!(0)),
            ("eviction_access_half_life_days", json!(3651)),
            ("eviction_correction_reserved_fraction", json!(1.1)),
            ("eviction_correction_reserved_max", json!(101)),
            ("eviction_audit_max_entries", json!(10_001)),
            ("fact_confidence_threshold", json!(1.01)),
            ("max_injection_tokens", json!(99)),
            ("max_injection_tokens", json!(8001)),
            ("guaranteed_token_budget", json!(49)),
            ("guaranteed_token_budget", json!(2001)),
            ("staleness_age_days", json!(29)),
            ("staleness_age_days", json!(366)),
            ("staleness_min_candidates", json!(0)),
            ("staleness_min_candidates", json!(51)),
            ("staleness_max_removals_per_cycle", json!(51)),
            ("staleness_max_lifetime_multiplier", json!(0.5)),
            ("staleness_max_lifetime_multiplier", json!(100.5)),
            ("staleness_max_extension_days", json!(89)),
            ("staleness_max_extension_days", json!(36501)),
            ("consolidation_min_facts", json!(2)),
            ("consolidation_min_facts", json!(31)),
            ("consolidation_max_groups_per_cycle", json!(11)),
            ("consolidation_max_sources", json!(1)),
            ("consolidation_max_sources", json!(21)),
            ("watermark_max_keys", json!(-5)),
            ("fact_eviction_policy", json!("lru")),
            ("token_counting", json!("words")),
            ("guaranteed_categories", json!("correction")),
            ("staleness_protected_categories", json!([1])),
            ("manifest_filename", json!("../memory.json")),
            ("manifest_filename", json!("memory.yaml")),
            ("strict_user_scope", json!("maybe")),
            ("max_facts", json!(20.5)),
            ("retrieval_adapter", json!("my.module:factory")),
            ("storage_class", json!("pkg.Storage")),
        ];
        for (key, value) in cases {
            let err = parse(json!({ *key: value.clone() }))
                .expect_err(&format!("{key}={value} must fail"));
            assert_eq!(err.key, format!("memory.backend_config.{key}"), "{err}");
        }
    }

    #[test]
    fn lax_coercion_like_pydantic() {
        let c = parse(json!({"max_facts": "20", "strict_user_scope": "yes", "debounce_seconds": 30.0, "staleness_review_enabled": 0, "max_injection_tokens": null})).unwrap();
        assert_eq!(c.max_facts, 20);
        assert!(c.strict_user_scope);
        assert_eq!(c.debounce_seconds, 30);
        assert!(!c.staleness_review_enabled);
        assert_eq!(c.max_injection_tokens, 2000);
    }

    #[test]
    fn eviction_weights_must_sum_to_one() {
        let err = parse(json!({"eviction_confidence_weight": 0.5})).unwrap_err();
        assert!(err.message.contains("must sum to 1.0"));
        assert!(
            parse(json!({"eviction_confidence_weight": 0.5, "eviction_confirmation_weight": 0.4}))
                .is_ok()
        );
    }

    #[test]
    fn unknown_keys_warn() {
        let (_, w) =
            DeerMemConfig::from_backend_config(json!({"max_fact": 5}).as_object().unwrap())
                .unwrap();
        assert!(w[0].contains("max_fact"));
    }

    #[test]
    fn shared_section_validates_and_migrates_legacy_keys() {
        let (c, w) = MemoryConfig::from_section(&json!({
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
            let err = MemoryConfig::from_section(&json!({ key: value })).unwrap_err();
            assert_eq!(err.key, format!("memory.{key}"));
        }
    }

    #[test]
    fn loads_full_config_or_bare_section_with_env() {
        let env = |k: &str| (k == "OPENAI_API_KEY").then(|| "sk-test".to_owned());
        let full = "memory:\n  mode: tool\n  backend_config:\n    model:\n      model: gpt-4o-mini\n      api_key: $OPENAI_API_KEY\ngateway:\n  bind: 127.0.0.1:1\n";
        let loaded = MemoryConfig::load_str(full, &env).unwrap();
        assert_eq!(loaded.memory.mode, MemoryMode::Tool);
        assert_eq!(loaded.memory.backend_config["model"]["api_key"], "sk-test");
        assert_eq!(loaded.root["gateway"]["bind"], "127.0.0.1:1");
        let bare =
            MemoryConfig::load_str("{\"enabled\": false, \"manager_class\": \"noop\"}", &no_env)
                .unwrap();
        assert!(!bare.memory.enabled);
        assert_eq!(bare.memory.manager_class, "noop");
        let err = MemoryConfig::load_str(
            "memory:\n  backend_config:\n    model:\n      api_key: $MISSING_KEY\n",
            &no_env,
        )
        .unwrap_err();
        assert!(err.message.contains("MISSING_KEY"));
        assert_eq!(err.key, "memory.backend_config.model.api_key");
        assert!(MemoryConfig::load_str("memory: [unclosed", &no_env).is_err());
    }

    #[test]
    fn model_config_hides_secrets_and_validates() {
        let c = parse(json!({"model": {"model": "m", "api_key": "sk-secret", "temperature": 0.2}}))
            .unwrap();
        assert!(c.model.is_configured());
        assert!(!format!("{c:?}").contains("sk-secret"));
        assert!(parse(json!({"model": {"temperature": 5}})).is_err());
        assert!(parse(json!({"model": {"provider": "anthropic"}})).is_err());
    }

    #[test]
    fn redaction_hides_secret_values() {
        let red = redact_secrets(
            &json!({"model": {"api_key": "sk", "model": "m"}, "honcho_token": "t", "api_key_env": "OV_KEY", "tokens": {"a": "b"}, "headers": {"Authorization": "Bearer x"}}),
        );
        assert_eq!(red["model"]["api_key"], "***");
        assert_eq!(red["model"]["model"], "m");
        assert_eq!(red["honcho_token"], "***");
        assert_eq!(red["api_key_env"], "OV_KEY");
        assert_eq!(red["tokens"], "***");
        assert_eq!(red["headers"], "***");
    }
}
