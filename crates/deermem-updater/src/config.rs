//! The DeerMem backend's own settings, its `memory.backend_config` keys: storage, queue,
//! eviction, staleness, consolidation, injection, search, with their defaults and ranges, read
//! through core's lax loader ([`deermem_core::config::lax`]). Other backends and the host
//! section know nothing of them; the LLM and embedding sections they nest are core's
//! [`ModelConfig`] and [`EmbeddingConfig`], shared with the adapters that read them.

use deermem_core::config::{ConfigWarning, EmbeddingConfig, EmbeddingProvider, ModelConfig, lax};
use deermem_core::policy::eviction::{EvictionParams, EvictionPolicy};
use deermem_core::{ConfigError, SearchMode};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

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

/// The DeerMem `backend_config`: every key the reference accepts, with its default and range.
/// Its fields are the key list: a key that is not a field is reported as unknown.
///
/// `Serialize` is its display form (the gateway's `/api/memory/config`, through the facade):
/// every key with its value or default, the model's and the embedder's keys as `"***"` and
/// their base URLs without credentials by their types (`deermem_core::config::shown`); the
/// storage adapters' sections are not part of it (each adapter shows its own).
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
    pub mode: Option<SearchMode>,
}

fn search_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SearchMode>, D::Error> {
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
    pub fn default_search_mode(&self) -> SearchMode {
        self.search
            .mode
            .unwrap_or(if self.embedding.provider == EmbeddingProvider::None {
                SearchMode::Bm25
            } else {
                SearchMode::Hybrid
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

fn unit<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    lax::float_in(d, 0.0, 1.0)
}

fn one_to_100<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    lax::float_in(d, 1.0, 100.0)
}

/// An optional string; the empty string is `None`.
fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Some(String::deserialize(d)?).filter(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<DeerMemConfig, ConfigError> {
        DeerMemConfig::from_backend_config(v.as_object().unwrap()).map(|(c, _)| c)
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
    fn the_display_never_shows_a_secret() {
        let (c, _) = DeerMemConfig::from_backend_config_with_sections(
            json!({
                "max_facts": 50,
                "model": {"model": "m", "api_key": "sk-DISTINCT-2a6f",
                          "base_url": "http://svc:PW-DISTINCT@llm.internal/v1?key=Q-DISTINCT"},
                "embedding": {"provider": "openai", "api_key": "ek-DISTINCT-2a6f"},
                "postgres": {"url": "postgres://u:pw-DISTINCT@db/m"},
                "my_llm_credential": "cred-DISTINCT",
            })
            .as_object()
            .unwrap(),
            &["postgres"],
        )
        .unwrap();
        let shown = serde_json::to_value(&c).unwrap();
        let text = shown.to_string();
        for secret in ["DISTINCT", "svc"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(shown["max_facts"], 50);
        assert_eq!(shown["model"]["api_key"], "***");
        assert_eq!(shown["model"]["base_url"], "http://llm.internal/v1");
        assert_eq!(shown["embedding"]["api_key"], "***");
        assert_eq!(shown["debounce_seconds"], 30, "defaults are shown");
        assert!(shown.get("postgres").is_none() && shown.get("my_llm_credential").is_none());
    }
}
