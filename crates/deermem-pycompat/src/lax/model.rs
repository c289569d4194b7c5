//! pydantic-style validation of a whole model (a FastAPI request body or query) over JSON:
//! typed readers that apply [`crate::lax`]'s coercions and constraints to each field and record
//! every problem, in the order the fields are read, as pydantic's error item (`type`, `loc`,
//! `msg`, `input`, `ctx`), so one answer lists them all.
//!
//! A model is read field by field with [`Checker::field`], which handles presence (required,
//! defaulted, `Optional[...] = None`) and the location, and a reader for the value
//! ([`Checker::string`], [`Checker::chars`], [`Checker::float_in`], [`Checker::each`]...). A
//! reader answers `None` for a value it refused (the problem is recorded) and
//! [`Checker::finish`] answers the model only when nothing was refused.

use std::fmt::Display;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::{LaxError, error};

/// One problem: pydantic's error item.
#[derive(Clone, Debug, PartialEq)]
pub struct Issue {
    /// pydantic's error type (`missing`, `string_type`...).
    pub kind: &'static str,
    /// Where: `["body", "facts", 0, "content"]`.
    pub loc: Vec<Value>,
    /// pydantic's message.
    pub msg: String,
    /// The refused value (for `missing`, the object it is missing from).
    pub input: Value,
    /// The failed constraint (`{"le": 1.0}`).
    pub ctx: Option<Value>,
}

/// How a field may be left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// No default: an absent field is `missing`.
    Required,
    /// A default: an absent field takes it (`null` is read like any value).
    Defaulted,
    /// `Optional[...] = None`: absent and `null` are `None`.
    Nullable,
    /// A query parameter for which absent, `null` and empty are `None`.
    Blank,
}

/// One field of a table-driven model: its key, its presence, and the reader of its value.
pub type Field = (
    &'static str,
    Presence,
    fn(&mut Checker, &Value) -> Option<Value>,
);

/// A model being read: where the reader is, and the problems so far.
#[derive(Debug)]
pub struct Checker {
    issues: Vec<Issue>,
    loc: Vec<Value>,
    /// Query parameters: a missing one's input is `null`, not the query.
    query: bool,
}

impl Checker {
    /// A request body, which must be an object, and the object; the `model_attributes_type`
    /// item otherwise.
    ///
    /// # Errors
    /// The body is not an object.
    pub fn body(body: &Value) -> Result<(Self, &Map<String, Value>), Vec<Issue>> {
        let mut c = Self::at_root("body", false);
        match c.object(body) {
            Some(m) => Ok((c, m)),
            None => Err(c.issues),
        }
    }

    /// Query parameters (read from an object of strings).
    pub fn query() -> Self {
        Self::at_root("query", true)
    }

    fn at_root(root: &str, query: bool) -> Self {
        Self {
            issues: Vec::new(),
            loc: vec![root.into()],
            query,
        }
    }

    /// The model when nothing was refused.
    ///
    /// # Errors
    /// Every problem recorded.
    pub fn finish<T>(self, value: Option<T>) -> Result<T, Vec<Issue>> {
        match value {
            Some(v) if self.issues.is_empty() => Ok(v),
            _ => Err(self.issues),
        }
    }

    /// Records a problem with `input` at the current location.
    pub fn push(&mut self, e: LaxError, input: &Value) {
        self.issues.push(Issue {
            kind: e.kind,
            loc: self.loc.clone(),
            msg: e.message,
            input: input.clone(),
            ctx: e.ctx,
        });
    }

    /// A coercion's result: the value, or its error recorded.
    pub fn lax<T>(&mut self, r: Result<T, LaxError>, input: &Value) -> Option<T> {
        r.map_err(|e| self.push(e, input)).ok()
    }

    /// A check's result: the value, or a pydantic `value_error` (`Value error, <e>`).
    pub fn valid<T, E: Display>(&mut self, r: Result<T, E>, input: &Value) -> Option<T> {
        r.map_err(|e| {
            let e = LaxError {
                kind: "value_error",
                message: format!("Value error, {e}"),
                ctx: None,
            };
            self.push(e, input);
        })
        .ok()
    }

    /// `read` one step below the current location, at `key` (a field name or a list index).
    pub fn at<T>(&mut self, key: impl Into<Value>, read: impl FnOnce(&mut Self) -> T) -> T {
        self.loc.push(key.into());
        let out = read(self);
        self.loc.pop();
        out
    }

    /// The field `key` of `m`, read with `read` if present (see [`Presence`]).
    pub fn field<'v, T>(
        &mut self,
        m: &'v Map<String, Value>,
        key: &str,
        presence: Presence,
        read: impl FnOnce(&mut Self, &'v Value) -> Option<T>,
    ) -> Option<T> {
        let skipped = |v: &Value| match v {
            Value::Null => matches!(presence, Presence::Nullable | Presence::Blank),
            Value::String(s) => s.is_empty() && presence == Presence::Blank,
            _ => false,
        };
        match m.get(key) {
            None if presence == Presence::Required => {
                let input = if self.query {
                    Value::Null
                } else {
                    Value::Object(m.clone())
                };
                self.at(key, |c| c.push(error("missing", "Field required"), &input));
                None
            }
            Some(v) if !skipped(v) => self.at(key, |c| read(c, v)),
            _ => None,
        }
    }

    /// The `fields` of `m`, in order: an object of the valid values (absent fields left out).
    pub fn fields(&mut self, m: &Map<String, Value>, fields: &[Field]) -> Map<String, Value> {
        let mut out = Map::new();
        for &(key, presence, read) in fields {
            if let Some(v) = self.field(m, key, presence, read) {
                out.insert(key.to_owned(), v);
            }
        }
        out
    }

    /// A nested model read with `fields`: its object of valid values.
    pub fn model(&mut self, v: &Value, fields: &[Field]) -> Option<Value> {
        let m = self.object(v)?;
        Some(Value::Object(self.fields(m, fields)))
    }

    /// A nested model: an object (`model_attributes_type` otherwise).
    pub fn object<'v>(&mut self, v: &'v Value) -> Option<&'v Map<String, Value>> {
        let msg = "Input should be a valid dictionary or object to extract fields from";
        v.as_object()
            .or_else(|| self.lax(Err(error("model_attributes_type", msg)), v))
    }

    /// A dictionary (`dict_type` otherwise).
    pub fn dict<'v>(&mut self, v: &'v Value) -> Option<&'v Map<String, Value>> {
        let msg = "Input should be a valid dictionary";
        v.as_object()
            .or_else(|| self.lax(Err(error("dict_type", msg)), v))
    }

    /// A string.
    pub fn string(&mut self, v: &Value) -> Option<String> {
        self.lax(super::string(v).map(str::to_owned), v)
    }

    /// A string of `min` to `max` characters.
    pub fn chars(&mut self, v: &Value, min: usize, max: usize) -> Option<String> {
        let s = self.string(v)?;
        let r = super::min_chars(&s, min).and_then(|s| super::max_chars(s, max));
        self.lax(r.map(|_| ()), v)?;
        Some(s)
    }

    /// `s` when `ok(s)`, else a `value_error` with `msg`.
    pub fn check(&mut self, s: String, ok: impl FnOnce(&str) -> bool, msg: &str) -> Option<String> {
        if ok(&s) {
            return Some(s);
        }
        self.valid(Err(msg), &Value::String(s))
    }

    /// A float (`nan` and the infinities included) within the bounds given (`nan` fails `le`).
    pub fn float_in(&mut self, v: &Value, ge: Option<f64>, le: Option<f64>) -> Option<f64> {
        let f = self.lax(super::float(v), v)?;
        self.lax(super::bounded(f, ge, le), v)
    }

    /// A finite float.
    pub fn finite(&mut self, v: &Value) -> Option<f64> {
        let f = self.lax(super::float(v), v)?;
        let msg = "Input should be a finite number";
        let r = if f.is_finite() {
            Ok(f)
        } else {
            Err(error("finite_number", msg))
        };
        self.lax(r, v)
    }

    /// An integer within the bounds given.
    pub fn int_in(&mut self, v: &Value, ge: Option<i64>, le: Option<i64>) -> Option<i64> {
        let i = self.lax(super::int(v), v)?;
        self.lax(super::bounded(i, ge, le), v)
    }

    /// A list, each item read with `read` at its index; `None` when any item was refused.
    pub fn each<T>(
        &mut self,
        v: &Value,
        mut read: impl FnMut(&mut Self, &Value) -> Option<T>,
    ) -> Option<Vec<T>> {
        let items = self.lax(super::list(v), v)?;
        let read: Vec<Option<T>> = items
            .iter()
            .enumerate()
            .map(|(i, item)| self.at(i, |c| read(c, item)))
            .collect();
        read.into_iter().collect()
    }

    /// A list of strings.
    pub fn strings(&mut self, v: &Value) -> Option<Vec<String>> {
        self.each(v, Self::string)
    }

    /// A string parsed with [`FromStr`] (its error is a `value_error`).
    pub fn parse<T: FromStr<Err: Display>>(&mut self, v: &Value) -> Option<T> {
        let s = self.string(v)?;
        self.valid(s.parse(), v)
    }

    /// A value `serde` reads (its error is a `value_error`).
    pub fn serde<T: DeserializeOwned>(&mut self, v: &Value) -> Option<T> {
        self.valid(serde_json::from_value(v.clone()), v)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Presence::{Blank, Defaulted, Nullable, Required};
    use super::*;

    fn kinds(r: Result<impl std::fmt::Debug, Vec<Issue>>) -> Vec<(&'static str, Value)> {
        let issues = r.unwrap_err();
        issues
            .into_iter()
            .map(|i| (i.kind, Value::from(i.loc)))
            .collect()
    }

    type Read = (String, f64, Option<Vec<String>>);

    fn read(body: &Value) -> Result<Read, Vec<Issue>> {
        let (mut c, m) = Checker::body(body)?;
        let name = c.field(m, "name", Required, |c, v| c.chars(v, 1, 3));
        let score = c.field(m, "score", Defaulted, |c, v| {
            c.float_in(v, Some(0.0), Some(1.0))
        });
        let tags = c.field(m, "tags", Nullable, Checker::strings);
        c.finish(name.map(|n| (n, score.unwrap_or(0.5), tags)))
    }

    #[test]
    fn every_problem_is_reported_in_field_order_with_its_location() {
        assert_eq!(
            read(&json!({"name": "ab", "score": "1", "tags": null})).unwrap(),
            ("ab".into(), 1.0, None)
        );
        assert_eq!(
            kinds(read(&json!({"score": null, "tags": ["a", 1]}))),
            [
                ("missing", json!(["body", "name"])),
                ("float_type", json!(["body", "score"])),
                ("string_type", json!(["body", "tags", 1])),
            ]
        );
        let issues = read(&json!({"name": "abcd", "score": 2})).unwrap_err();
        assert_eq!(issues[0].ctx, Some(json!({"max_length": 3})));
        assert_eq!(issues[1].ctx, Some(json!({"le": 1.0})));
        assert_eq!(issues[1].input, json!(2));
        assert_eq!(
            kinds(read(&json!([1]))),
            [("model_attributes_type", json!(["body"]))]
        );
    }

    #[test]
    fn query_parameters_are_missing_with_a_null_input_and_blank_when_empty() {
        let q = json!({"limit": "", "n": ""});
        let m = q.as_object().unwrap();
        let mut c = Checker::query();
        assert_eq!(
            c.field(m, "limit", Blank, |c, v| c.int_in(v, Some(1), None)),
            None
        );
        assert_eq!(c.field(m, "q", Required, Checker::string), None);
        assert_eq!(
            c.field(m, "n", Defaulted, |c, v| c.int_in(v, None, None)),
            None
        );
        let issues = c.finish(Some(())).unwrap_err();
        assert_eq!(issues[0].input, Value::Null);
        assert_eq!(issues[1].kind, "int_parsing");
    }
}
