//! The `Embedder` port's test double ([`FakeEmbedder`]: deterministic hashed bag-of-words
//! vectors with a concept table for paraphrases, and fault injection) and its contract suite
//! (`embedder_contract!`), which every embedding adapter runs unchanged.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deermem_core::EmbedError;
use deermem_core::ports::Embedder;

/// Lowercased word tokens of `text`: runs of alphanumerics, and each CJK character on its own.
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        let cjk = matches!(c as u32, 0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xAC00..=0xD7AF);
        if c.is_alphanumeric() && !cjk {
            word.extend(c.to_lowercase());
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if cjk {
            out.push(c.to_string());
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The fake's embedding of one text: each word (or the concept it belongs to) adds ±1 to a
/// hashed component; a small constant keeps an empty text off the zero vector; the result is
/// L2-normalised. Public so that the fake HTTP server answers with the same vectors.
pub fn hashed_vector(text: &str, dimension: usize, concepts: &[(&str, &str)]) -> Vec<f32> {
    let dimension = dimension.max(1);
    let mut v = vec![0.0f32; dimension];
    v[0] = 1e-3;
    for w in words(text) {
        let token = concepts
            .iter()
            .find(|(word, _)| *word == w)
            .map_or(w.as_str(), |(_, concept)| concept);
        let h = fnv1a(token);
        let i = (h % dimension as u64) as usize;
        v[i] += if h >> 63 == 0 { 1.0 } else { -1.0 };
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

#[derive(Debug, Default)]
struct Faults {
    next: VecDeque<EmbedError>,
    calls: usize,
    texts: usize,
}

/// A deterministic embedder for tests: texts sharing words (or words mapped to one concept by
/// [`FakeEmbedder::with_concepts`]) get close vectors; errors can be queued.
#[derive(Debug, Clone)]
pub struct FakeEmbedder {
    model_id: String,
    dimension: usize,
    concepts: Arc<Vec<(&'static str, &'static str)>>,
    faults: Arc<Mutex<Faults>>,
}

impl FakeEmbedder {
    /// A fake of `dimension` components (at least 1).
    pub fn new(dimension: usize) -> Self {
        let dimension = dimension.max(1);
        Self {
            model_id: format!("fake:hashed-words@{dimension}"),
            dimension,
            concepts: Arc::new(Vec::new()),
            faults: Arc::new(Mutex::new(Faults::default())),
        }
    }

    /// Maps words to concepts, so that `("tea", "drink")` and `("coffee", "drink")` make texts
    /// about tea and coffee close: the fake's notion of meaning.
    #[must_use]
    pub fn with_concepts(mut self, concepts: &[(&'static str, &'static str)]) -> Self {
        self.concepts = Arc::new(concepts.to_vec());
        self
    }

    /// Fails the next call with `error` (queued after earlier ones).
    pub fn fail_next(&self, error: EmbedError) {
        self.lock().next.push_back(error);
    }

    /// Calls of [`Embedder::embed`] that did work (empty inputs are not counted).
    pub fn calls(&self) -> usize {
        self.lock().calls
    }

    /// Texts embedded so far.
    pub fn texts_embedded(&self) -> usize {
        self.lock().texts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl Embedder for FakeEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        {
            let mut faults = self.lock();
            faults.calls += 1;
            if let Some(e) = faults.next.pop_front() {
                return Err(e);
            }
            faults.texts += texts.len();
        }
        Ok(texts
            .iter()
            .map(|t| hashed_vector(t, self.dimension, &self.concepts))
            .collect())
    }
}

/// What the contract suite needs of an adapter under test.
pub struct EmbedderFixture {
    /// The adapter.
    pub embedder: Arc<dyn Embedder>,
    /// Makes the adapter's next call fail with a retryable error that outlasts its retries
    /// (a server answering 503 every time, a fake's queued error), or `None` when the adapter
    /// has no way to inject one.
    pub break_next: Option<Box<dyn Fn() + Send + Sync>>,
    /// Keeps servers and directories alive for the test.
    pub guard: Box<dyn std::any::Any + Send>,
}

impl std::fmt::Debug for EmbedderFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedderFixture")
            .field("embedder", &self.embedder)
            .field("break_next", &self.break_next.is_some())
            .finish_non_exhaustive()
    }
}

fn texts(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// Identity and dimension are declared.
pub async fn declares_model_and_dimension(f: EmbedderFixture) {
    assert!(
        !f.embedder.model_id().trim().is_empty(),
        "model_id is empty"
    );
    assert!(f.embedder.dimension() >= 1, "dimension is 0");
}

/// An empty input answers an empty output.
pub async fn empty_input_gives_empty_output(f: EmbedderFixture) {
    let out = f.embedder.embed(&[]).await.expect("empty input");
    assert!(out.is_empty());
}

/// One finite unit vector of the declared dimension per text, in order.
pub async fn one_unit_vector_per_text(f: EmbedderFixture) {
    let input = texts(&["Prefers oolong tea", "", "住在上海", "x"]);
    let out = f.embedder.embed(&input).await.expect("embed");
    assert_eq!(out.len(), input.len());
    for v in &out {
        assert_eq!(v.len(), f.embedder.dimension());
        assert!(v.iter().all(|x| x.is_finite()));
        assert!((norm(v) - 1.0).abs() < 1e-3, "norm {}", norm(v));
    }
}

/// The same text gives the same vector in any batch and position; different texts differ.
pub async fn same_text_same_vector_in_any_batch(f: EmbedderFixture) {
    let a = texts(&["Backend engineer at a robotics startup"]);
    let b = texts(&[
        "Lives in Lisbon",
        "Backend engineer at a robotics startup",
        "Allergic to peanuts",
    ]);
    let one = f.embedder.embed(&a).await.expect("embed a");
    let three = f.embedder.embed(&b).await.expect("embed b");
    for (x, y) in one[0].iter().zip(&three[1]) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
    assert_ne!(three[0], three[2]);
}

/// More texts than one request may carry are split by the adapter and answered in order.
pub async fn large_inputs_are_batched_in_order(f: EmbedderFixture) {
    let input: Vec<String> = (0..300).map(|i| format!("fact number {i}")).collect();
    let all = f.embedder.embed(&input).await.expect("embed 300");
    assert_eq!(all.len(), 300);
    let single = f.embedder.embed(&input[257..258]).await.expect("embed one");
    for (x, y) in all[257].iter().zip(&single[0]) {
        assert!((x - y).abs() < 1e-5);
    }
}

/// Queries are embedded under the same rules as documents: one finite unit vector of the
/// declared dimension per text, in order, the same in any batch, nothing for nothing.
pub async fn queries_follow_the_same_rules(f: EmbedderFixture) {
    assert!(
        f.embedder
            .embed_queries(&[])
            .await
            .expect("empty queries")
            .is_empty()
    );
    let input = texts(&["what does she drink", "", "他周末做什么运动"]);
    let out = f.embedder.embed_queries(&input).await.expect("queries");
    assert_eq!(out.len(), input.len());
    for v in &out {
        assert_eq!(v.len(), f.embedder.dimension());
        assert!(v.iter().all(|x| x.is_finite()));
        assert!((norm(v) - 1.0).abs() < 1e-3, "norm {}", norm(v));
    }
    let alone = f
        .embedder
        .embed_queries(&input[2..])
        .await
        .expect("one query");
    for (x, y) in out[2].iter().zip(&alone[0]) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
    assert_ne!(out[0], out[2]);
}

/// A failing model is a typed error, and the adapter works again afterwards.
pub async fn failures_are_typed_and_recoverable(f: EmbedderFixture) {
    let Some(break_next) = &f.break_next else {
        // The adapter has no failure to inject (a local model); its own tests cover load errors.
        return;
    };
    break_next();
    let err = f
        .embedder
        .embed(&texts(&["hello"]))
        .await
        .expect_err("the injected failure");
    assert!(!err.to_string().is_empty());
    let ok = f
        .embedder
        .embed(&texts(&["hello"]))
        .await
        .expect("recovered");
    assert_eq!(ok.len(), 1);
}

/// Expands one `#[test]` per embedder behaviour; `$fixture` evaluates to a future of
/// [`EmbedderFixture`].
#[macro_export]
macro_rules! embedder_contract {
    ($fixture:expr) => {
        $crate::embedder_contract!(@tests $fixture;
            declares_model_and_dimension,
            empty_input_gives_empty_output,
            one_unit_vector_per_text,
            same_text_same_vector_in_any_batch,
            large_inputs_are_batched_in_order,
            queries_follow_the_same_rules,
            failures_are_typed_and_recoverable,
        );
    };
    (@tests $fixture:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::block_on(async {
                    let fixture = $fixture.await;
                    $crate::embedder::$name(fixture).await;
                });
            }
        )*
    };
}
