//! Configuration of the host's `memory:` section: the shared host fields, the DeerMem
//! `backend_config` keys with their defaults and ranges, `$VAR` resolution and the legacy
//! top-level key migration. Parsing is pure: the environment arrives as a lookup function.
//!
//! Every section is a `#[derive(Deserialize)]` struct read through the one loader in [`lax`]:
//! values are coerced the way the reference's pydantic models coerce them in lax mode (`"20"`
//! is 20, `"yes"` is true, `30.0` is 30, `30.5` is an error for an integer key), `null` keeps
//! the default, and every failure names the key path and its valid range.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::error::ConfigError;
use crate::policy::eviction::{EvictionParams, EvictionPolicy};

mod embedding;
pub mod lax;

pub use embedding::{EmbeddingConfig, EmbeddingProvider, EmbeddingSides, MAX_EMBEDDING_BATCH};

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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryConfig {
    /// Master switch for the call sites and the gateway routes.
    #[serde(deserialize_with = "lax::bool")]
    pub enabled: bool,
    /// Middleware or tool mode.
    pub mode: MemoryMode,
    /// Whether the `<memory>` block is injected at all.
    #[serde(deserialize_with = "lax::bool")]
    pub injection_enabled: bool,
    /// Hard budget for draining pending updates at shutdown, 1–300 s.
    #[serde(deserialize_with = "one_to_300")]
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

impl MemoryConfig {
    /// Parses a `memory:` section (already env-resolved), migrating legacy top-level keys into
    /// `backend_config`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key.
    pub fn from_section(section: &Value) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let map = match section {
            Value::Null => return Ok((Self::default(), Vec::new())),
            Value::Object(m) => m,
            _ => return Err(ConfigError::new("memory", "must be a mapping")),
        };
        let (own, legacy): (Map<String, Value>, Map<String, Value>) = map
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .partition(|(k, _)| !LEGACY_KEYS.contains(&k.as_str()));
        let (mut cfg, ignored) = lax::deserialize::<Self>(&Value::Object(own), "memory")?;
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
                    warnings.push(
                        "memory.model_name moved to memory.backend_config.model.model".into(),
                    );
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

/// The float ranges of this file's keys, for `deserialize_with`.
macro_rules! float_ranges {
    ($($name:ident: $lo:expr, $hi:expr;)*) => {$(
        fn $name<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
            lax::float_in(d, $lo, $hi)
        }
    )*};
}

float_ranges! {
    unit: 0.0, 1.0;
    one_to_100: 1.0, 100.0;
    one_to_300: 1.0, 300.0;
    zero_to_2: 0.0, 2.0;
    request_timeout: 0.1, 3600.0;
    connect_timeout: 0.1, 600.0;
}

fn some_unit_to_2<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    zero_to_2(d).map(Some)
}

/// An optional string; the empty string is `None`.
fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Some(String::deserialize(d)?).filter(|s| !s.is_empty()))
}

/// The LLM used for extraction (`backend_config.model`). An empty `model` means the host's
/// default model, or the offline rule-based proposer when there is none.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Provider name (only OpenAI-compatible endpoints are supported; default `openai`).
    #[serde(deserialize_with = "provider")]
    pub provider: Option<String>,
    /// Model name; `None` means no model is configured.
    #[serde(deserialize_with = "non_empty")]
    pub model: Option<String>,
    /// API key (after `$VAR` resolution). Never printed by `Debug`.
    #[serde(deserialize_with = "non_empty")]
    pub api_key: Option<String>,
    /// Base URL of the OpenAI-compatible API (default `https://api.openai.com/v1`).
    #[serde(deserialize_with = "non_empty")]
    pub base_url: Option<String>,
    /// Sampling temperature, 0–2.
    #[serde(deserialize_with = "some_unit_to_2")]
    pub temperature: Option<f64>,
    /// Request timeout in seconds (default 60).
    #[serde(deserialize_with = "request_timeout")]
    pub timeout_seconds: f64,
    /// Connect timeout in seconds (default 10).
    #[serde(deserialize_with = "connect_timeout")]
    pub connect_timeout_seconds: f64,
    /// Retries on 429, 5xx and transport errors (default 2).
    #[serde(deserialize_with = "lax::int_in::<_, _, 0, 10>")]
    pub max_retries: u32,
    /// Output token cap.
    #[serde(deserialize_with = "some_max_tokens")]
    pub max_tokens: Option<u32>,
}

fn some_max_tokens<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    lax::int_in::<_, _, 1, 1_000_000>(d).map(Some)
}

fn provider<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let p = non_empty(d)?;
    match p.as_deref() {
        None
        | Some("openai" | "openai-compatible" | "deepseek" | "vllm" | "ollama" | "llamacpp") => {
            Ok(p)
        }
        Some(other) => Err(serde::de::Error::custom(format!(
            "{other:?} is not supported; use an OpenAI-compatible endpoint ('openai')"
        ))),
    }
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

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            provider: None,
            model: None,
            api_key: None,
            base_url: None,
            temperature: None,
            timeout_seconds: 60.0,
            connect_timeout_seconds: 10.0,
            max_retries: 2,
            max_tokens: None,
        }
    }
}

impl ModelConfig {
    /// Whether a model is configured.
    pub fn is_configured(&self) -> bool {
        self.model.as_deref().is_some_and(|m| !m.trim().is_empty())
    }
}

/// The DeerMem `backend_config`: every key the reference accepts, with its default and range.
/// Its fields are the key list: a key that is not a field is reported as unknown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct DeerMemConfig {
    pub storage_path: String,
    /// The storage adapter, by the name the composition root knows it by (checked there).
    pub storage_class: String,
    #[serde(deserialize_with = "lax::bool")]
    pub strict_user_scope: bool,
    #[serde(deserialize_with = "manifest_filename")]
    pub manifest_filename: String,
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 120>")]
    pub file_lock_timeout_seconds: u64,
    /// The search index, by the name the composition root knows it by (checked there, with
    /// its default for the selected storage; `""` disables it).
    pub retrieval_adapter: String,
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 300>")]
    pub debounce_seconds: u64,
    #[serde(deserialize_with = "lax::int_in::<_, _, 0, { i64::MAX }>")]
    pub queue_max_depth: u64,
    /// Bytes of queued conversation turns one user may have pending (0: no limit).
    #[serde(deserialize_with = "lax::int_in::<_, _, 0, { i64::MAX }>")]
    pub queue_max_pending_bytes_per_user: u64,
    /// Bytes of queued conversation turns pending for all users together (0: no limit).
    #[serde(deserialize_with = "lax::int_in::<_, _, 0, { i64::MAX }>")]
    pub queue_max_pending_bytes: u64,
    #[serde(deserialize_with = "lax::int_in::<_, _, 10, 500>")]
    pub max_facts: usize,
    pub fact_eviction_policy: EvictionPolicy,
    #[serde(deserialize_with = "lax::bool")]
    pub fact_eviction_shadow_enabled: bool,
    #[serde(deserialize_with = "unit")]
    pub eviction_confidence_weight: f64,
    #[serde(deserialize_with = "unit")]
    pub eviction_confirmation_weight: f64,
    #[serde(deserialize_with = "unit")]
    pub eviction_access_weight: f64,
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 3650>")]
    pub eviction_confirmation_half_life_days: u64,
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 3650>")]
    pub eviction_access_half_life_days: u64,
    #[serde(deserialize_with = "unit")]
    pub eviction_correction_reserved_fraction: f64,
    #[serde(deserialize_with = "lax::int_in::<_, _, 0, 100>")]
    pub eviction_correction_reserved_max: usize,
    #[serde(deserialize_with = "lax::int_in::<_, _, 0, 10_000>")]
    pub eviction_audit_max_entries: usize,
    #[serde(deserialize_with = "unit")]
    pub fact_confidence_threshold: f64,
    #[serde(deserialize_with = "lax::int_in::<_, _, 100, 8000>")]
    pub max_injection_tokens: usize,
    pub token_counting: TokenCounting,
    #[serde(deserialize_with = "lax::strings")]
    pub guaranteed_categories: Vec<String>,
    #[serde(deserialize_with = "lax::int_in::<_, _, 50, 2000>")]
    pub guaranteed_token_budget: usize,
    #[serde(deserialize_with = "lax::bool")]
    pub staleness_review_enabled: bool,
    #[serde(deserialize_with = "lax::int_in::<_, _, 30, 365>")]
    pub staleness_age_days: u64,
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 50>")]
    pub staleness_min_candidates: usize,
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 50>")]
    pub staleness_max_removals_per_cycle: usize,
    #[serde(deserialize_with = "lax::strings")]
    pub staleness_protected_categories: Vec<String>,
    #[serde(deserialize_with = "one_to_100")]
    pub staleness_max_lifetime_multiplier: f64,
    #[serde(deserialize_with = "lax::int_in::<_, _, 90, 36_500>")]
    pub staleness_max_extension_days: u64,
    #[serde(deserialize_with = "lax::bool")]
    pub consolidation_enabled: bool,
    #[serde(deserialize_with = "lax::int_in::<_, _, 3, 30>")]
    pub consolidation_min_facts: usize,
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 10>")]
    pub consolidation_max_groups_per_cycle: usize,
    #[serde(deserialize_with = "lax::int_in::<_, _, 2, 20>")]
    pub consolidation_max_sources: usize,
    #[serde(deserialize_with = "lax::int_in::<_, _, 0, { i64::MAX }>")]
    pub watermark_max_keys: usize,
    /// Scope documents the storage's load cache keeps in this process (least recently used
    /// forgotten first): with `cache_max_scopes`, the memory a serving process takes does not
    /// grow with the number of users it has served. Read by the file storage.
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 1_048_576>")]
    pub cache_max_scopes: usize,
    #[serde(deserialize_with = "non_empty")]
    pub patterns_dir: Option<String>,
    #[serde(deserialize_with = "non_empty")]
    pub prompts_dir: Option<String>,
    pub model: ModelConfig,
    /// The storage adapters' own sections (`postgres:`), by key, as written: each adapter
    /// reads and checks its section with its own type (the facade does it at load time). Never
    /// serialised: a section may hold a secret.
    #[serde(skip)]
    pub storage_sections: Map<String, Value>,
    /// The embedding model that ranks search by meaning (`provider: none` by default).
    pub embedding: EmbeddingConfig,
    /// How search ranks by default.
    pub search: SearchSettings,
    /// The turn journal and the retries of failed extractions (`queue:`).
    pub queue: QueueSettings,
}

/// `backend_config.queue`: the durable turn journal and how failed extractions are retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueSettings {
    /// Accepted turns are written to the turn journal before they are acknowledged, and
    /// replayed after a restart (`false`: kept in memory only, lost by a restart).
    #[serde(deserialize_with = "lax::bool")]
    pub durable: bool,
    /// Retries of a turn whose extraction failed.
    pub retry: RetrySettings,
    /// Seconds a replica's lease on a journal turn lasts without renewal: how long the turns of
    /// a replica that died wait before another takes them.
    #[serde(deserialize_with = "lax::int_in::<_, _, 2, 86_400>")]
    pub turn_lease: u64,
    /// Seconds between two claim rounds of a serving process (renewing its leases, taking the
    /// turns whose owner died); shorter than `turn_lease`.
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 3_600>")]
    pub claim_interval: u64,
}

/// The default `queue.turn_lease`, in seconds.
pub const DEFAULT_TURN_LEASE_SECONDS: u64 = 60;
/// The default `queue.claim_interval`, in seconds.
pub const DEFAULT_CLAIM_INTERVAL_SECONDS: u64 = 20;

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            durable: true,
            retry: RetrySettings::default(),
            turn_lease: DEFAULT_TURN_LEASE_SECONDS,
            claim_interval: DEFAULT_CLAIM_INTERVAL_SECONDS,
        }
    }
}

impl QueueSettings {
    /// `turn_lease` as a duration.
    pub fn turn_lease(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.turn_lease)
    }

    /// `claim_interval` as a duration.
    pub fn claim_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.claim_interval)
    }

    /// A claim round must come before the leases it renews end.
    fn check(&self) -> Result<(), ConfigError> {
        if self.claim_interval >= self.turn_lease {
            return Err(ConfigError::new(
                "memory.backend_config.queue.claim_interval",
                format!(
                    "must be shorter than queue.turn_lease ({} s): a process renews its leases once per claim round, so its turns would pass to another replica while it works on them",
                    self.turn_lease
                ),
            ));
        }
        Ok(())
    }
}

/// `backend_config.queue.retry`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetrySettings {
    /// Attempts of one turn (the first included) before it is dead-lettered.
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 1000>")]
    pub max_attempts: u32,
    /// Seconds after its acceptance past which a failing turn is dead-lettered.
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 31_536_000>")]
    pub max_age: u64,
    /// The pause before the first retry, in milliseconds; it doubles on every retry.
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 3_600_000>")]
    pub initial_backoff_ms: u64,
    /// The longest pause between two attempts, in seconds (a longer `Retry-After` is cut to it).
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 86_400>")]
    pub max_backoff: u64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_attempts: 10,
            max_age: 86_400,
            initial_backoff_ms: 2_000,
            max_backoff: 300,
        }
    }
}

/// `backend_config.search`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchSettings {
    /// `bm25`, `vector` or `hybrid`; unset means `hybrid` when an embedder is configured,
    /// else `bm25`.
    #[serde(deserialize_with = "search_mode")]
    pub mode: Option<crate::SearchMode>,
}

fn search_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<crate::SearchMode>, D::Error> {
    let raw = Option::<String>::deserialize(d)?.unwrap_or_default();
    if raw.trim().is_empty() {
        return Ok(None);
    }
    raw.parse().map(Some).map_err(serde::de::Error::custom)
}

fn manifest_filename<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    if name.contains('/')
        || name.contains('\\')
        || !name.ends_with(".json")
        || name == ".."
        || name.contains('\0')
    {
        return Err(serde::de::Error::custom(
            "manifest_filename must be a plain .json filename.",
        ));
    }
    Ok(name)
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
            cache_max_scopes: DEFAULT_CACHE_MAX_SCOPES,
            patterns_dir: None,
            prompts_dir: None,
            model: ModelConfig::default(),
            storage_sections: Map::new(),
            embedding: EmbeddingConfig::default(),
            search: SearchSettings::default(),
            queue: QueueSettings::default(),
        }
    }
}

/// The default `cache_max_scopes`: about 100 MiB of 100-fact scopes.
pub const DEFAULT_CACHE_MAX_SCOPES: usize = 1024;
/// The default `queue_max_pending_bytes_per_user` (16 MiB).
pub const DEFAULT_QUEUE_MAX_PENDING_BYTES_PER_USER: u64 = 16 * 1024 * 1024;
/// The default `queue_max_pending_bytes` (64 MiB).
pub const DEFAULT_QUEUE_MAX_PENDING_BYTES: u64 = 64 * 1024 * 1024;

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
        Self::from_backend_config_with_sections(bc, &[])
    }

    /// [`DeerMemConfig::from_backend_config`] with the keys in `sections` taken as storage
    /// adapters' own sections: kept as written in [`DeerMemConfig::storage_sections`] for the
    /// adapter to read, not reported as unknown.
    ///
    /// # Errors
    /// As [`DeerMemConfig::from_backend_config`].
    pub fn from_backend_config_with_sections(
        bc: &Map<String, Value>,
        sections: &[&str],
    ) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let prefix = "memory.backend_config";
        let (own, storage_sections): (Map<String, Value>, Map<String, Value>) = bc
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .partition(|(k, _)| !sections.contains(&k.as_str()));
        let (mut c, ignored) = lax::deserialize::<Self>(&Value::Object(own), prefix)?;
        c.storage_sections = storage_sections;
        let (model, top): (Vec<&String>, Vec<&String>) =
            ignored.iter().partition(|k| k.starts_with("model."));
        let mut warnings = Vec::new();
        if !top.is_empty() {
            warnings.push(format!(
                "Unknown backend_config keys ignored by DeerMem; check for typos: {top:?}"
            ));
        }
        if !model.is_empty() {
            let model: Vec<&str> = model.iter().map(|k| &k["model.".len()..]).collect();
            warnings.push(format!(
                "Unknown backend_config.model keys ignored: {model:?}"
            ));
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
        c.check_search_mode()?;
        c.queue.check()?;
        Ok((c, warnings))
    }

    /// The search mode used when a request names none: `search.mode`, else `hybrid` with an
    /// embedder and `bm25` without.
    pub fn default_search_mode(&self) -> crate::SearchMode {
        self.search
            .mode
            .unwrap_or(if self.embedding.provider == EmbeddingProvider::None {
                crate::SearchMode::Bm25
            } else {
                crate::SearchMode::Hybrid
            })
    }

    /// A vector or hybrid default needs an embedder, and the `local` embedder its
    /// `model_path`; vectors live beside an index, so an embedder without a retrieval adapter
    /// is refused too.
    fn check_search_mode(&self) -> Result<(), ConfigError> {
        let provider = self.embedding.provider;
        if provider == EmbeddingProvider::None {
            if let Some(mode) = self.search.mode.filter(|m| m.uses_vectors()) {
                return Err(ConfigError::new(
                    "memory.backend_config.search.mode",
                    format!(
                        "{:?} ranks by embeddings; configure embedding.provider (openai or local) or use bm25",
                        mode.as_str()
                    ),
                ));
            }
            return Ok(());
        }
        if self.retrieval_adapter.is_empty() {
            return Err(ConfigError::new(
                "memory.backend_config.embedding.provider",
                "vectors are stored beside the search index; set retrieval_adapter (fts5 or postgres) or embedding.provider: none",
            ));
        }
        if provider == EmbeddingProvider::Local && self.embedding.model_path.is_none() {
            return Err(ConfigError::new(
                "memory.backend_config.embedding.model_path",
                "is required with provider: local (a directory holding model.safetensors, tokenizer.json and config.json)",
            ));
        }
        if provider == EmbeddingProvider::Local {
            for (key, sides) in [
                ("input_type", &self.embedding.input_type),
                ("prefix", &self.embedding.prefix),
            ] {
                if !sides.is_empty() {
                    return Err(ConfigError::new(
                        format!("memory.backend_config.embedding.{key}"),
                        "applies to provider: openai only; the local model embeds queries and documents alike",
                    ));
                }
            }
        }
        Ok(())
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
        assert_eq!(c.cache_max_scopes, 1024);
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
            ("cache_max_scopes", json!(0)),
            ("cache_max_scopes", json!(1_048_577)),
            ("fact_eviction_policy", json!("lru")),
            ("token_counting", json!("words")),
            ("guaranteed_categories", json!("correction")),
            ("staleness_protected_categories", json!([1])),
            ("manifest_filename", json!("../memory.json")),
            ("manifest_filename", json!("memory.yaml")),
            ("strict_user_scope", json!("maybe")),
            ("max_facts", json!(20.5)),
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
    fn one_lax_rule_for_every_key() {
        // Every lax key takes pydantic's table, nothing more: no padding, no empty string.
        let c = parse(json!({"max_facts": "1_00", "debounce_seconds": "20.0", "strict_user_scope": "T",
            "consolidation_enabled": 1.0, "fact_confidence_threshold": true, "staleness_review_enabled": "n"}))
        .unwrap();
        assert_eq!((c.max_facts, c.debounce_seconds), (100, 20));
        assert!(c.strict_user_scope && c.consolidation_enabled && !c.staleness_review_enabled);
        assert_eq!(c.fact_confidence_threshold, 1.0);
        for (key, bad) in [
            ("strict_user_scope", json!(" yes ")),
            ("strict_user_scope", json!("")),
            ("strict_user_scope", json!(2)),
            ("max_facts", json!("20.5")),
            ("max_facts", json!("0x20")),
        ] {
            let err = parse(json!({ key: bad.clone() })).expect_err(&format!("{key}={bad}"));
            assert_eq!(err.key, format!("memory.backend_config.{key}"), "{err}");
        }
        let err = parse(json!({"model": {"timeout_seconds": 0}})).unwrap_err();
        assert_eq!(err.key, "memory.backend_config.model.timeout_seconds");
        assert_eq!(
            err.to_string(),
            "memory.backend_config.model.timeout_seconds: must be a number between 0.1 and 3600 (got 0)"
        );
    }

    #[test]
    fn unknown_keys_are_derived_from_the_structs() {
        let (_, w) = DeerMemConfig::from_backend_config(
            json!({"max_fact": 5, "typo": null, "model": {"modle": "m"}, "strict_user_scope": null})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            w,
            [
                r#"Unknown backend_config keys ignored by DeerMem; check for typos: ["max_fact", "typo"]"#,
                r#"Unknown backend_config.model keys ignored: ["modle"]"#,
            ]
        );
        let (_, w) =
            MemoryConfig::from_section(&json!({"enabeld": false, "max_facts": 20})).unwrap();
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
        let loaded = MemoryConfig::load_str(
            "memory:\n  enabled: off\n  injection_enabled: no\n  mode: ~\n  backend_config:\n    strict_user_scope: yes\n",
            &no_env,
        )
        .unwrap();
        assert!(!loaded.memory.enabled && !loaded.memory.injection_enabled);
        assert_eq!(loaded.memory.mode, MemoryMode::Middleware);
        let (c, _) = DeerMemConfig::from_backend_config(&loaded.memory.backend_config).unwrap();
        assert!(c.strict_user_scope);
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
    fn queue_settings_default_to_durable_and_are_checked() {
        let c = parse(json!({})).unwrap();
        assert!(c.queue.durable);
        assert_eq!(c.queue.retry.max_attempts, 10);
        assert_eq!(c.queue.retry.max_age, 86_400);
        let c = parse(
            json!({"queue": {"durable": "false", "retry": {"max_attempts": "3", "max_age": 60}}}),
        )
        .unwrap();
        assert!(!c.queue.durable);
        assert_eq!((c.queue.retry.max_attempts, c.queue.retry.max_age), (3, 60));
        let err = parse(json!({"queue": {"retry": {"max_attempts": 0}}})).unwrap_err();
        assert_eq!(err.key, "memory.backend_config.queue.retry.max_attempts");
        assert_eq!((c.queue.turn_lease, c.queue.claim_interval), (60, 20));
        let c = parse(json!({"queue": {"turn_lease": "4", "claim_interval": 1}})).unwrap();
        assert_eq!(c.queue.turn_lease(), std::time::Duration::from_secs(4));
        assert_eq!(c.queue.claim_interval(), std::time::Duration::from_secs(1));
        for (bad, key) in [
            (json!({"turn_lease": 1}), "turn_lease"),
            (json!({"claim_interval": 0}), "claim_interval"),
            (
                json!({"turn_lease": 10, "claim_interval": 10}),
                "claim_interval",
            ),
        ] {
            let err = parse(json!({ "queue": bad })).unwrap_err();
            assert_eq!(
                err.key,
                format!("memory.backend_config.queue.{key}"),
                "{bad}"
            );
        }
    }

    #[test]
    fn search_mode_defaults_follow_the_embedder_and_vector_modes_need_one() {
        use crate::SearchMode;
        let c = parse(json!({})).unwrap();
        assert_eq!(c.default_search_mode(), SearchMode::Bm25);
        let c = parse(json!({"embedding": {"provider": "local", "model_path": "/m"}})).unwrap();
        assert_eq!(c.default_search_mode(), SearchMode::Hybrid);
        let c = parse(json!({"embedding": {"provider": "openai"}, "search": {"mode": "Vector"}}))
            .unwrap();
        assert_eq!(c.default_search_mode(), SearchMode::Vector);
        let err = parse(json!({"search": {"mode": "hybrid"}})).unwrap_err();
        assert_eq!(err.key, "memory.backend_config.search.mode");
        let err = parse(json!({"embedding": {"provider": "local"}})).unwrap_err();
        assert_eq!(err.key, "memory.backend_config.embedding.model_path");
        let err = parse(
            json!({"embedding": {"provider": "local", "model_path": "/m",
            "prefix": {"query": "query: "}}}),
        )
        .unwrap_err();
        assert_eq!(err.key, "memory.backend_config.embedding.prefix");
        let err = parse(json!({"embedding": {"provider": "openai"}, "retrieval_adapter": ""}))
            .unwrap_err();
        assert_eq!(err.key, "memory.backend_config.embedding.provider");
        assert!(parse(json!({"search": {"mode": "semantic"}})).is_err());
        assert!(parse(json!({"search": {"mode": "bm25"}})).is_ok());
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
