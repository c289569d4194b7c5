//! JSON in the Python reference's dialect, read and written one way for every DeerMem crate.
//!
//! - Reading: one lenient reader following CPython's `json` scanner (`NaN`, `Infinity` and
//!   `-Infinity` accepted, duplicate keys keeping the last value at the first key's position,
//!   Python's error messages and positions). [`parse_lenient`] builds a `serde_json::Value` (the
//!   storage's JSON files); [`decode_str`] and [`decode_prefix`] build a [`PyJson`], which keeps
//!   ints and floats apart, for model output (with a work [`Budget`]);
//!   [`python_decode_error`] gives the error `json.loads` raises, for request bodies.
//! - Writing: [`PyFormatter`], a `serde_json` formatter producing
//!   `json.dumps(ensure_ascii=False, indent=2)`, optionally HTML-escaping string values;
//!   [`to_python_json`], [`dumps`] and [`dumps_html_escaped`] use it.

mod read;
mod write;

pub use read::{
    Budget, DecodeError, ErrorKind, JsonError, MAX_DECODE_DEPTH, MAX_DEPTH, PyJson, decode_prefix,
    decode_str, parse_lenient, python_decode_error,
};
pub use write::{PyFormatter, WriteError, dumps, dumps_html_escaped, to_python_json};
