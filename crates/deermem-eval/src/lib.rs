//! The retrieval-quality harness behind `cargo xtask eval retrieval`: a labelled dataset
//! ([`dataset`]), the search modes ranked by the engine's own search path ([`rank`]: the FTS5
//! adapter wrapped in the engine's `HybridRetrieval`, with `SearchQuery.mode` set per mode),
//! the scores ([`score`]: recall@1, recall@5 and MRR per mode, query kind, language and half of
//! the users), and a converter from LongMemEval's JSON ([`longmemeval`]).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod dataset;
pub mod longmemeval;
pub mod rank;
pub mod score;

pub use dataset::{Dataset, DatasetError, EvalFact, EvalQuery};
pub use rank::{Mode, Ranker};
pub use score::{HELD_OUT, Report, Row, Scores, TUNED, Target, evaluate, halves};
