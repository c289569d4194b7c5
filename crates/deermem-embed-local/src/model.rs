//! The loaded model and one batch of inference: tokenize (cut at `max_seq_length` word pieces,
//! padded to the batch's longest), BERT forward with the attention mask, mean pooling over the
//! real tokens, L2 normalisation. Blocking; the adapter calls it on tokio's blocking pool.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::BertModel;
use deermem_core::EmbedError;
use tokenizers::{
    PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection, TruncationParams,
    TruncationStrategy,
};

use crate::files::{ModelFiles, unavailable};

/// Bytes of one text given to the tokenizer. Only the first `max_seq_length` word pieces are
/// kept, and each piece stands for at most a word of text, so a longer tail is never used:
/// cutting it first bounds the work a hostile input can cause.
const MAX_TEXT_BYTES: usize = 64 << 10;

/// A BERT sentence encoder ready to run.
pub(crate) struct Model {
    bert: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    dimension: usize,
    max_seq_length: usize,
}

fn inference(e: impl std::fmt::Display) -> EmbedError {
    EmbedError::InvalidResponse(format!("the local model failed: {e}"))
}

impl Model {
    /// Builds the tokenizer and the network from the files read.
    pub(crate) fn load(files: ModelFiles) -> Result<Self, EmbedError> {
        let mut tokenizer = Tokenizer::from_bytes(&files.tokenizer_json).map_err(|e| {
            unavailable(
                &files.tokenizer_path,
                format!("is not a valid tokenizer ({e})"),
            )
        })?;
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > files.config.vocab_size {
            return Err(unavailable(
                &files.tokenizer_path,
                format!(
                    "has {vocab} tokens, more than the model's vocab_size {}",
                    files.config.vocab_size
                ),
            ));
        }
        // sentence-transformers cuts every input at max_seq_length pieces (special tokens
        // included) and pads each batch to its longest input; tokenizer.json's own settings
        // (a fixed length of 128) are not the ones it uses.
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: files.max_seq_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| unavailable(&files.tokenizer_path, format!("cannot truncate ({e})")))?;
        let padding = tokenizer.get_padding().cloned().unwrap_or_default();
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            pad_to_multiple_of: None,
            ..padding
        }));

        let device = Device::Cpu;
        // Read, not mapped: the buffered loader parses the bytes we hold.
        let vb = VarBuilder::from_buffered_safetensors(files.weights, DType::F32, &device)
            .map_err(|e| {
                unavailable(
                    &files.weights_path,
                    format!("is not a valid safetensors file ({e})"),
                )
            })?;
        let bert = BertModel::load(vb, &files.config).map_err(|e| {
            unavailable(
                &files.weights_path,
                format!("does not hold the weights config.json describes ({e})"),
            )
        })?;
        Ok(Self {
            bert,
            tokenizer,
            device,
            dimension: files.config.hidden_size,
            max_seq_length: files.max_seq_length,
        })
    }

    pub(crate) fn dimension(&self) -> usize {
        self.dimension
    }

    pub(crate) fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// Embeds one batch: a unit vector per text, in order.
    pub(crate) fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let inputs: Vec<&str> = texts.iter().map(|t| head(t, MAX_TEXT_BYTES)).collect();
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| inference(format!("tokenizing: {e}")))?;
        let rows = encodings.len();
        let len = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut ids = Vec::with_capacity(rows * len);
        let mut mask = Vec::with_capacity(rows * len);
        for e in &encodings {
            if e.get_ids().len() != len || e.get_attention_mask().len() != len {
                return Err(inference("the tokenizer did not pad the batch evenly"));
            }
            ids.extend_from_slice(e.get_ids());
            mask.extend_from_slice(e.get_attention_mask());
        }
        let ids = Tensor::from_vec(ids, (rows, len), &self.device).map_err(inference)?;
        let mask = Tensor::from_vec(mask, (rows, len), &self.device).map_err(inference)?;
        let types = ids.zeros_like().map_err(inference)?;
        // (rows, len, hidden)
        let hidden = self
            .bert
            .forward(&ids, &types, Some(&mask))
            .map_err(inference)?;
        let pooled = mean_pool(&hidden, &mask).map_err(inference)?;
        let normalised = l2_normalise(&pooled).map_err(inference)?;
        normalised.to_vec2::<f32>().map_err(inference)
    }
}

/// The mean of the token vectors where the mask is 1 (sentence-transformers' mean pooling; the
/// count is kept at least 1e-9 as it keeps it).
fn mean_pool(hidden: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
    let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
    let counts = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
    summed.broadcast_div(&counts)
}

/// Each row divided by its L2 norm (kept at least 1e-12, as torch's `normalize` does).
fn l2_normalise(rows: &Tensor) -> candle_core::Result<Tensor> {
    let norms = rows
        .sqr()?
        .sum_keepdim(1)?
        .sqrt()?
        .clamp(1e-12f32, f32::MAX)?;
    rows.broadcast_div(&norms)
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn head(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_cuts_on_a_character_boundary() {
        assert_eq!(head("abc", 5), "abc");
        assert_eq!(head("abc", 2), "ab");
        // "é" is two bytes: a cut inside it keeps the whole character out.
        assert_eq!(head("aé", 2), "a");
        assert_eq!(head("茶茶", 4), "茶");
    }

    #[test]
    fn pooling_averages_the_real_tokens_only() {
        let dev = Device::Cpu;
        // Two rows of three tokens of two components; the second row's last token is padding.
        let hidden = Tensor::from_vec(
            vec![
                1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, //
                2.0, 0.0, 4.0, 0.0, 100.0, 100.0,
            ],
            (2, 3, 2),
            &dev,
        )
        .unwrap();
        let mask = Tensor::from_vec(vec![1u32, 1, 1, 1, 1, 0], (2, 3), &dev).unwrap();
        let pooled = mean_pool(&hidden, &mask).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(pooled, vec![vec![3.0, 4.0], vec![3.0, 0.0]]);
        let unit = l2_normalise(&Tensor::new(&[[3.0f32, 4.0], [0.0, 0.0]], &dev).unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(unit, vec![vec![0.6, 0.8], vec![0.0, 0.0]]);
    }
}
