//! DeerMem's Python compatibility rules, in one place. The Python reference's behaviour depends
//! on how CPython and PyYAML treat text, numbers and files; this crate reproduces those rules
//! once for every DeerMem crate:
//!
//! - [`py`]: Python string and value semantics (`str.strip()`, `splitlines()`, `casefold()`,
//!   `float()` parsing, truthiness, `==` between JSON values, float `repr`).
//! - [`datetime`]: the calendar of Python's `datetime` and the grammar of
//!   `datetime.fromisoformat`, which the reference reads every stored timestamp with.
//! - [`json`]: Python's JSON dialect: one lenient reader (what `json.loads` accepts, with its
//!   error messages and positions) and one `serde_json` [`Formatter`](serde_json::ser::Formatter)
//!   writing `json.dumps(indent=2, ensure_ascii=False)`, optionally HTML-escaping string values.
//! - [`lax`]: pydantic v2's lax-mode coercions (bool, int, float, str, list, bounds), checked
//!   against pydantic's own answers; the config loader uses it ([`lax::de`]), and the gateway
//!   validates its request bodies and queries with its field readers ([`lax::model`]).
//! - [`yaml`]: the PyYAML-compatible YAML 1.1 codec (`safe_load` / `safe_dump`) of the fact
//!   files' front matter, also usable for any YAML 1.1 document ([`yaml::parse_document`]).
//!
//! The crate is pure: no I/O, no clock, no environment, no async runtime, and no dependency on
//! another DeerMem crate (the core depends on it). `cargo xtask tidy` checks both.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

pub mod datetime;
pub mod json;
pub mod lax;
pub mod py;
pub mod yaml;
