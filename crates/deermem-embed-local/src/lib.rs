//! The `Embedder` port run in-process: sentence-transformers all-MiniLM-L6-v2 (a BERT
//! encoder) on the CPU with candle, its WordPiece tokenizer from the `tokenizers` crate, mean
//! pooling over the attention mask and L2 normalisation, exactly the pipeline
//! sentence-transformers runs for this model. No network: everything is read from a directory
//! (`embedding.model_path`) holding `model.safetensors`, `tokenizer.json` and `config.json`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), deermem_core::EmbedError> {
//! use deermem_core::ports::Embedder;
//! let embedder = deermem_embed_local::LocalEmbedder::load("target/models/all-MiniLM-L6-v2", 32)?;
//! let vectors = embedder.embed(&["Prefers oolong tea".to_owned()]).await?;
//! assert_eq!(vectors[0].len(), 384);
//! # Ok(())
//! # }
//! ```

mod files;
mod model;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use deermem_core::EmbedError;
use deermem_core::config::{EmbeddingConfig, EmbeddingProvider, MAX_EMBEDDING_BATCH};
use deermem_core::ports::{Embedder, check_vectors};

pub use files::{FETCH_HINT, REQUIRED_FILES};

use crate::model::Model;

/// sentence-transformers all-MiniLM-L6-v2 (or another BERT sentence encoder with mean
/// pooling laid out the same way), run on the CPU.
///
/// Inference runs on tokio's blocking pool, one batch of at most `batch_size` texts per task,
/// so the async workers never wait on it; [`Embedder::embed`] therefore needs a tokio runtime.
#[derive(Clone)]
pub struct LocalEmbedder {
    model: Arc<Model>,
    model_id: String,
    dir: PathBuf,
    batch_size: usize,
}

impl std::fmt::Debug for LocalEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEmbedder")
            .field("model_id", &self.model_id)
            .field("dir", &self.dir)
            .field("max_seq_length", &self.model.max_seq_length())
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl LocalEmbedder {
    /// Loads the model from `dir` (blocking: reads about 90 MB), embedding at most
    /// `batch_size` texts at a time (clamped to 1–128).
    ///
    /// # Errors
    /// [`EmbedError::Unavailable`] naming the missing, unreadable or corrupt file and how to get
    /// the model directory.
    pub fn load(dir: impl AsRef<Path>, batch_size: usize) -> Result<Self, EmbedError> {
        let dir = dir.as_ref();
        let files = files::ModelFiles::read(dir)?;
        let name = files.name.clone();
        let model = Model::load(files)?;
        let model_id = format!("local:{name}@{}", model.dimension());
        Ok(Self {
            model: Arc::new(model),
            model_id,
            dir: dir.to_path_buf(),
            batch_size: batch_size.clamp(1, MAX_EMBEDDING_BATCH),
        })
    }

    /// Loads the model named by `backend_config.embedding` (`provider: local`, `model_path`,
    /// `batch_size`).
    ///
    /// # Errors
    /// [`EmbedError::Unavailable`] when the provider is not `local`, `model_path` is not set,
    /// or the model cannot be loaded (see [`LocalEmbedder::load`]).
    pub fn from_config(config: &EmbeddingConfig) -> Result<Self, EmbedError> {
        if config.provider != EmbeddingProvider::Local {
            return Err(EmbedError::Unavailable(format!(
                "the local embedder needs embedding.provider: local (it is {:?})",
                config.provider
            )));
        }
        let Some(path) = &config.model_path else {
            return Err(EmbedError::Unavailable(format!(
                "embedding.provider is local but embedding.model_path is not set: {FETCH_HINT}"
            )));
        };
        Self::load(path, config.batch_size)
    }

    /// The directory the model was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The longest input in word pieces (special tokens included); longer texts are cut, as
    /// sentence-transformers cuts them.
    pub fn max_seq_length(&self) -> usize {
        self.model.max_seq_length()
    }

    /// Texts embedded per blocking task.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }
}

#[async_trait]
impl Embedder for LocalEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dimension(&self) -> usize {
        self.model.dimension()
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(self.batch_size) {
            let model = Arc::clone(&self.model);
            let batch = batch.to_vec();
            let vectors = tokio::task::spawn_blocking(move || model.embed_batch(&batch))
                .await
                .map_err(|e| {
                    EmbedError::InvalidResponse(format!("the local model's inference failed: {e}"))
                })??;
            out.extend(vectors);
        }
        let dimension = self.model.dimension();
        check_vectors(&mut out, texts.len(), dimension)?;
        Ok(out)
    }
}
