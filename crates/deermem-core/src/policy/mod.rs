//! Pure policies over domain types: no I/O, no clock, no environment. Time arrives as an
//! argument.

pub mod commit;
pub mod eviction;
pub mod fusion;
pub mod language;
pub mod metadata;
pub mod substring;
pub mod text;
