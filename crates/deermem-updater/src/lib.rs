//! DeerMem memory-update pipeline: message filtering and signal detection, the extraction
//! prompt and the model-response parser, the fail-closed gates that turn a proposal into a
//! change set, staleness and consolidation lifecycle, the debounced per-conversation queue, and
//! the injection formatter with its token budgets.

pub mod filter;
pub mod json;
pub mod signals;
pub mod text;
pub mod uploads;
pub mod facts;
pub mod parse;
pub mod staleness;

#[cfg(test)]
mod testutil;
pub mod apply;
pub mod consolidation;
pub mod diff;
pub mod prompt;
pub mod inject;
pub mod tokens;
