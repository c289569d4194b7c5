//! The `Embedder` port: a batch of texts in, one fixed-dimension unit vector per text out.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::error::EmbedError;

/// Turns texts into vectors whose dot product measures how close their meanings are.
///
/// The contract (asserted by `deermem_testkit::embedder_contract!`):
/// - [`Embedder::model_id`] is non-empty and names the model and its settings closely enough
///   that stored vectors of another id are known to be incomparable (a change re-embeds);
/// - [`Embedder::dimension`] is at least 1 and every vector has exactly that many components;
/// - [`Embedder::embed`] answers exactly one vector per input text, in input order, for any
///   number of texts (the adapter splits batches itself), and an empty slice without any work;
/// - every vector is finite and L2-normalised (norm 1 within 1e-3), so a dot product is the
///   cosine similarity;
/// - the same text gives the same vector (within 1e-5 per component) whatever batch it is in;
/// - [`Embedder::embed_queries`] follows the same rules for search queries; a symmetric model
///   answers the same vector for a text either way, an asymmetric one (e5, bge, nomic) may not;
/// - failures are typed [`EmbedError`]s, never panics, and leave nothing half-done to undo.
#[async_trait]
pub trait Embedder: Send + Sync + Debug {
    /// The model's identity as stored beside its vectors, e.g. `openai:text-embedding-3-small@512`.
    fn model_id(&self) -> &str;

    /// The number of components of every vector.
    fn dimension(&self) -> usize;

    /// Embeds `texts` as documents (the stored facts): one unit vector per text, in order.
    ///
    /// # Errors
    /// The model could not run or answered something unusable.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// Embeds `texts` as search queries. Asymmetric models embed a question differently from
    /// the passage that answers it; the default is [`Embedder::embed`] (a symmetric model).
    ///
    /// # Errors
    /// As [`Embedder::embed`].
    async fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed(texts).await
    }
}

/// Checks an adapter's answer against the contract's shape for `expected` texts of `dimension`
/// and normalises each vector in place (servers answer nearly unit vectors; a zero vector is
/// refused, since it has no direction to compare).
///
/// # Errors
/// [`EmbedError::InvalidResponse`] naming the first problem.
pub fn check_vectors(
    vectors: &mut [Vec<f32>],
    expected: usize,
    dimension: usize,
) -> Result<(), EmbedError> {
    if vectors.len() != expected {
        return Err(EmbedError::InvalidResponse(format!(
            "{} vectors for {expected} texts",
            vectors.len()
        )));
    }
    for (i, v) in vectors.iter_mut().enumerate() {
        if v.len() != dimension {
            return Err(EmbedError::InvalidResponse(format!(
                "vector {i} has {} components, the model's dimension is {dimension}",
                v.len()
            )));
        }
        if v.iter().any(|x| !x.is_finite()) {
            return Err(EmbedError::InvalidResponse(format!(
                "vector {i} has a component that is not a finite number"
            )));
        }
        let norm = v
            .iter()
            .map(|x| f64::from(*x) * f64::from(*x))
            .sum::<f64>()
            .sqrt();
        if norm == 0.0 {
            return Err(EmbedError::InvalidResponse(format!(
                "vector {i} is all zeros"
            )));
        }
        for x in v.iter_mut() {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_vectors_normalises_and_refuses_bad_shapes() {
        let mut ok = vec![vec![3.0, 4.0], vec![0.0, -2.0]];
        check_vectors(&mut ok, 2, 2).unwrap();
        assert_eq!(ok, vec![vec![0.6, 0.8], vec![0.0, -1.0]]);
        for (mut vectors, expected, dim, says) in [
            (vec![vec![1.0, 0.0]], 2, 2, "1 vectors for 2 texts"),
            (vec![vec![1.0]], 1, 2, "vector 0 has 1 components"),
            (vec![vec![1.0, f32::NAN]], 1, 2, "not a finite number"),
            (
                vec![vec![1.0, 0.0], vec![0.0, 0.0]],
                2,
                2,
                "vector 1 is all zeros",
            ),
        ] {
            let err = check_vectors(&mut vectors, expected, dim).unwrap_err();
            assert!(matches!(err, EmbedError::InvalidResponse(_)));
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
