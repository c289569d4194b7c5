//! Configuration shared by every backend and host: the host's `memory:` section
//! ([`MemoryConfig`]), the LLM and embedding settings the adapters read ([`ModelConfig`],
//! [`EmbeddingConfig`]), the lax loader every config struct goes through, and the display rules
//! of [`shown`] (a [`ConfigSecret`] shows `"***"`, a URL loses its credentials). Reading config
//! text, `$VAR` resolution and legacy key migration live in the facade (`deermem`); a backend's
//! own `backend_config` keys live in its crate (DeerMem's: `deermem_updater::DeerMemConfig`).
//!
//! Every section is a `#[derive(Deserialize)]` struct read through the one loader in [`lax`]:
//! values are coerced the way the reference's pydantic models coerce them in lax mode (`"20"`
//! is 20, `"yes"` is true, `30.0` is 30, `30.5` is an error for an integer key), `null` keeps
//! the default, and every failure names the key path and its valid range.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

mod embedding;
pub mod lax;
pub mod shown;

pub use embedding::{EmbeddingConfig, EmbeddingProvider, EmbeddingSides, MAX_EMBEDDING_BATCH};
pub use shown::ConfigSecret;

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

/// The float ranges of this file's keys, for `deserialize_with`.
macro_rules! float_ranges {
    ($($name:ident: $lo:expr, $hi:expr;)*) => {$(
        fn $name<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
            lax::float_in(d, $lo, $hi)
        }
    )*};
}

float_ranges! {
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

/// An optional secret; the empty string is `None`.
fn non_empty_secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ConfigSecret>, D::Error> {
    non_empty(d).map(|s| s.map(ConfigSecret::new))
}

/// The LLM used for extraction (`backend_config.model`). An empty `model` means the host's
/// default model, or the offline rule-based proposer when there is none. `Serialize` is its
/// display form ([`shown`]): the key as `"***"`, the base URL without credentials.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Provider name (only OpenAI-compatible endpoints are supported; default `openai`).
    #[serde(deserialize_with = "provider")]
    pub provider: Option<String>,
    /// Model name; `None` means no model is configured.
    #[serde(deserialize_with = "non_empty")]
    pub model: Option<String>,
    /// API key (after `$VAR` resolution): never printed, shown as `"***"`.
    #[serde(deserialize_with = "non_empty_secret")]
    pub api_key: Option<ConfigSecret>,
    /// Base URL of the OpenAI-compatible API (default `https://api.openai.com/v1`), shown
    /// without credentials.
    #[serde(deserialize_with = "non_empty", serialize_with = "shown::opt_url")]
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
