//! The lax deserializer below every `#[derive(Deserialize)]` config struct and wire body that
//! follows a pydantic model: pydantic v2's lax-mode rules, which DeerFlow's config models and
//! FastAPI's request bodies apply, written once.
//!
//! [`deserialize`] runs a struct over a JSON value with three rules every section shares: a key
//! set to `null` is the same as an absent key (the field keeps its default); a bad value's
//! error names its full key path (`serde_path_to_error`); keys the struct does not read are
//! returned (`serde_ignored`) for the caller to warn about or refuse (a struct with
//! `deny_unknown_fields` refuses them itself, reported at its section).
//!
//! The coercions ([`bool()`], [`int_in`], [`float`], [`float_in`], [`scalar_str`]) are used through
//! `#[serde(deserialize_with = "...")]`. Their rules are pydantic's, implemented once in
//! [`crate::lax`] (and checked there against pydantic's own answers); str is strict
//! (a plain `String` field), except [`scalar_str`] where the existing keys already took
//! numbers: a number or boolean becomes Python's `str()` of it.

use crate::lax;
use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeOwned, Deserializer, Error as _, IntoDeserializer, Visitor};
use serde::{Deserialize, forward_to_deserialize_any};
use serde_json::Value;

/// A value the deserializer refused: the full key path of the bad value and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct KeyError {
    /// `prefix` plus the path of the bad value (`memory.backend_config.max_facts`).
    pub key: String,
    /// What is wrong with it, and the valid range.
    pub message: String,
}

/// The error of the config deserializer: a message; the loader adds the key path.
type DeError = de::value::Error;

/// Deserializes `T` from `value`, a section found under `prefix` (`memory.backend_config`).
///
/// Returns `T` and the paths (relative to `prefix`, `a.b` or `a[0]`) of the keys `T` did not
/// read, in document order.
///
/// # Errors
/// A [`KeyError`] whose key is `prefix` plus the path of the bad value.
pub fn deserialize<T: DeserializeOwned>(
    value: &Value,
    prefix: &str,
) -> Result<(T, Vec<String>), KeyError> {
    let mut ignored = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(ValueDe(value), &mut track);
    let mut note = |path: serde_ignored::Path<'_>| ignored.push(ignored_path(&path));
    let result = T::deserialize(serde_ignored::Deserializer::new(de, &mut note));
    match result {
        Ok(t) => Ok((t, ignored)),
        Err(e) => {
            let message = e.to_string();
            let mut segments: Vec<_> = track.path().iter().cloned().collect();
            // A struct that refuses unknown keys (`deny_unknown_fields`) reports one at its
            // section; the message names the key and the keys it knows.
            if message.starts_with("unknown field `") {
                segments.pop();
            }
            let mut path = String::new();
            for segment in &segments {
                match segment {
                    serde_path_to_error::Segment::Seq { index } => path += &format!("[{index}]"),
                    serde_path_to_error::Segment::Map { key } => path += &format!(".{key}"),
                    _ => {}
                }
            }
            Err(KeyError {
                key: join(prefix, &path),
                message,
            })
        }
    }
}

/// `prefix` followed by a relative path (`.a.b`, `[0]` or `a`).
fn join(prefix: &str, path: &str) -> String {
    let path = path.strip_prefix('.').unwrap_or(path);
    match (prefix.is_empty(), path.is_empty()) {
        (_, true) => prefix.to_owned(),
        (true, false) => path.to_owned(),
        (false, false) if path.starts_with('[') => format!("{prefix}{path}"),
        (false, false) => format!("{prefix}.{path}"),
    }
}

fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => join(&ignored_path(parent), key),
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}

/// A deserializer over a borrowed JSON value in which a struct's fields set to `null` are
/// absent.
#[derive(Clone, Copy)]
struct ValueDe<'a>(&'a Value);

impl<'de> IntoDeserializer<'de, DeError> for ValueDe<'de> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl ValueDe<'_> {
    fn not_a_mapping(self) -> DeError {
        DeError::custom(format!("must be a mapping (got {})", self.0))
    }
}

impl<'de> Deserializer<'de> for ValueDe<'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => visitor.visit_u64(u),
                (None, Some(i), _) => visitor.visit_i64(i),
                (None, None, Some(f)) => visitor.visit_f64(f),
                (None, None, None) => Err(DeError::custom(format!("unsupported number {n}"))),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => {
                visitor.visit_seq(SeqDeserializer::new(items.iter().map(ValueDe)))
            }
            Value::Object(m) => visitor.visit_map(MapDeserializer::new(
                m.iter().map(|(k, v)| (k.as_str(), ValueDe(v))),
            )),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match self.0 {
            // A known field set to null is absent; an unknown one is still seen (and reported).
            Value::Object(m) => visitor.visit_map(MapDeserializer::new(
                m.iter()
                    .filter(|(k, v)| !(v.is_null() && fields.contains(&k.as_str())))
                    .map(|(k, v)| (k.as_str(), ValueDe(v))),
            )),
            _ => Err(self.not_a_mapping()),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::Object(_) => self.deserialize_any(visitor),
            _ => Err(self.not_a_mapping()),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            other => Err(DeError::custom(format!("must be a string (got {other})"))),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct identifier ignored_any
    }
}

/// pydantic's lax bool ([`crate::lax::bool`]).
pub fn to_bool(v: &Value) -> Option<bool> {
    lax::bool(v).ok()
}

/// pydantic's lax int ([`crate::lax::int`]).
pub fn to_int(v: &Value) -> Option<i64> {
    lax::int(v).ok()
}

/// pydantic's lax float, `nan` and `inf` included ([`crate::lax::float`]; range
/// checks refuse them).
pub fn to_float(v: &Value) -> Option<f64> {
    lax::float(v).ok()
}

/// A lax bool.
///
/// # Errors
/// A value outside the rules, naming it.
pub fn bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let v = Value::deserialize(d)?;
    to_bool(&v).ok_or_else(|| D::Error::custom(format!("must be a boolean (got {v})")))
}

/// A lax integer from `LO` to `HI` (`HI = i64::MAX`: no upper bound), as any integer type.
///
/// # Errors
/// Not an integer, or out of range; the message gives the range.
pub fn int_in<'de, D, T, const LO: i64, const HI: i64>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    let v = Value::deserialize(d)?;
    let range = if HI == i64::MAX {
        format!("an integer >= {LO}")
    } else {
        format!("an integer between {LO} and {HI}")
    };
    let i = to_int(&v).ok_or_else(|| D::Error::custom(format!("must be {range} (got {v})")))?;
    (LO..=HI)
        .contains(&i)
        .then(|| T::try_from(i).ok())
        .flatten()
        .ok_or_else(|| D::Error::custom(format!("must be {range} (got {i})")))
}

/// A lax float, finite or not (for keys whose own check gives the message).
///
/// # Errors
/// Not a number.
pub fn float<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = Value::deserialize(d)?;
    to_float(&v).ok_or_else(|| D::Error::custom(format!("must be a number (got {v})")))
}

/// A lax finite float from `lo` to `hi` (inclusive); wrap it in a `fn` per range for
/// `deserialize_with`.
///
/// # Errors
/// Not a number, not finite, or out of range.
pub fn float_in<'de, D: Deserializer<'de>>(d: D, lo: f64, hi: f64) -> Result<f64, D::Error> {
    let v = Value::deserialize(d)?;
    match to_float(&v) {
        Some(f) if (lo..=hi).contains(&f) => Ok(f),
        Some(f) if f.is_finite() => Err(D::Error::custom(format!(
            "must be a number between {lo} and {hi} (got {f})"
        ))),
        Some(_) => Err(D::Error::custom(format!(
            "must be a finite number (got {v})"
        ))),
        None => Err(D::Error::custom(format!("must be a number (got {v})"))),
    }
}

/// A string, or Python's `str()` of a number or boolean.
///
/// # Errors
/// A list or mapping.
pub fn scalar_str<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = Value::deserialize(d)?;
    match v {
        Value::String(s) => Ok(s),
        Value::Bool(_) | Value::Number(_) => crate::py::py_str(&v)
            .ok_or_else(|| D::Error::custom(format!("must be a string (got {v})"))),
        _ => Err(D::Error::custom(format!("must be a string (got {v})"))),
    }
}

/// A list of strings, refused as a whole (the error names the key, not an index).
///
/// # Errors
/// Anything but a list of strings.
pub fn strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Value::deserialize(d)?;
    let bad = || D::Error::custom(format!("must be a list of strings (got {v})"));
    v.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|s| s.as_str().map(str::to_owned).ok_or_else(bad))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(default)]
    struct Inner {
        #[serde(deserialize_with = "int_in::<_, _, 1, 10>")]
        n: u32,
    }

    impl Default for Inner {
        fn default() -> Self {
            Self { n: 5 }
        }
    }

    #[derive(Deserialize, Debug, PartialEq, Default)]
    #[serde(default)]
    struct Outer {
        inner: Inner,
        list: Vec<Inner>,
        #[serde(deserialize_with = "bool")]
        flag: bool,
    }

    #[test]
    fn loader_names_the_key_path_skips_nulls_and_reports_unread_keys() {
        let (o, ignored) = deserialize::<Outer>(
            &json!({"inner": {"n": "7", "typo": 1}, "flag": "on", "extra": null, "list": [{"n": null}]}),
            "memory",
        )
        .unwrap();
        assert_eq!(o.inner.n, 7);
        assert_eq!(o.list, [Inner { n: 5 }], "a null field keeps its default");
        assert!(o.flag);
        assert_eq!(ignored, ["inner.typo", "extra"]);
        let e = deserialize::<Outer>(&json!({"inner": {"n": 11}}), "memory").unwrap_err();
        assert_eq!(e.key, "memory.inner.n");
        assert_eq!(e.message, "must be an integer between 1 and 10 (got 11)");
        let e = deserialize::<Outer>(&json!({"list": [{"n": 1}, {"n": 0}]}), "x").unwrap_err();
        assert_eq!(e.key, "x.list[1].n");
        let e = deserialize::<Outer>(&json!({"inner": [1]}), "x").unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.message.as_str()),
            ("x.inner", "must be a mapping (got [1])")
        );
        let e = deserialize::<Outer>(&json!({"flag": "t "}), "").unwrap_err();
        assert_eq!(e.key, "flag");
    }
}
