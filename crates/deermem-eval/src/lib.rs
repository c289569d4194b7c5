//! The retrieval-quality harness behind `cargo xtask eval retrieval`: a labelled dataset
//! ([`dataset`]), the search modes ranked the way the engine ranks them ([`rank`]: BM25 through
//! the FTS5 adapter, exact vector ranking and reciprocal rank fusion from the core's
//! `policy::fusion`), the scores ([`score`]: recall@1, recall@5, MRR per mode and per query kind),
//! and a converter from LongMemEval's JSON ([`longmemeval`]).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod dataset;
pub mod longmemeval;
pub mod rank;
pub mod score;

pub use dataset::{Dataset, DatasetError, EvalFact, EvalQuery};
pub use rank::{Mode, Ranker};
pub use score::{HELD_OUT, Report, Row, Scores, TUNED, evaluate, halves};
