//! A small JSON Schema validator for the subset `/openapi.json` uses: `type` (one or a list),
//! `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`, `$ref` into
//! `#/components/schemas/`, `anyOf`, `oneOf`, `allOf`, `nullable`, `minimum` / `maximum`,
//! `minLength` / `maxLength`, `pattern`, and boolean schemas. Annotations are ignored; any
//! other keyword is an error, so the validator never passes what it does not understand.
//!
//! In `closed` mode an object schema with `properties` and no `additionalProperties` accepts
//! no other key: a response field the types do not declare is drift too.

use regex::Regex;
use serde_json::{Map, Value};

/// Keywords that describe without constraining.
const ANNOTATIONS: &[&str] = &[
    "description",
    "default",
    "format",
    "title",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Validates against a document's components.
#[derive(Debug)]
pub(crate) struct Validator<'a> {
    schemas: &'a Map<String, Value>,
    closed: bool,
}

impl<'a> Validator<'a> {
    /// Over an OpenAPI document (its `components.schemas`).
    pub(crate) fn new(document: &'a Value, closed: bool) -> Result<Self, String> {
        let schemas = document["components"]["schemas"]
            .as_object()
            .ok_or("the document has no components.schemas")?;
        Ok(Self { schemas, closed })
    }

    /// Every problem of `value` against `schema`, each with its JSON path.
    pub(crate) fn errors(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut out = Vec::new();
        self.check(schema, value, "$", &mut out, 0);
        out
    }

    fn check(&self, schema: &Value, v: &Value, at: &str, out: &mut Vec<String>, depth: usize) {
        if depth > 64 {
            out.push(format!("{at}: schema nesting too deep (a $ref cycle?)"));
            return;
        }
        let m = match schema {
            Value::Bool(true) => return,
            Value::Bool(false) => {
                out.push(format!("{at}: the schema `false` accepts nothing"));
                return;
            }
            Value::Object(m) => m,
            other => {
                out.push(format!("{at}: not a schema: {other}"));
                return;
            }
        };
        if m.get("nullable") == Some(&Value::Bool(true)) && v.is_null() {
            return;
        }
        for (key, arg) in m {
            match key.as_str() {
                k if ANNOTATIONS.contains(&k) => {}
                "nullable" => {}
                "$ref" => match arg
                    .as_str()
                    .and_then(|r| r.strip_prefix("#/components/schemas/"))
                    .and_then(|name| self.schemas.get(name))
                {
                    Some(target) => self.check(target, v, at, out, depth + 1),
                    None => out.push(format!("{at}: unresolvable $ref {arg}")),
                },
                "type" => {
                    let types: Vec<&str> = match arg {
                        Value::String(t) => vec![t.as_str()],
                        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                        _ => Vec::new(),
                    };
                    let nullable = m.get("nullable") == Some(&Value::Bool(true));
                    if !(types.iter().any(|t| has_type(v, t)) || (nullable && v.is_null())) {
                        out.push(format!("{at}: {} is not of type {arg}", kind(v)));
                    }
                }
                "enum" => {
                    if !arg.as_array().is_some_and(|a| a.contains(v)) {
                        out.push(format!("{at}: {v} is not one of {arg}"));
                    }
                }
                "const" => {
                    if arg != v {
                        out.push(format!("{at}: {v} is not {arg}"));
                    }
                }
                "anyOf" | "oneOf" | "allOf" => {
                    let subs = arg.as_array().map(Vec::as_slice).unwrap_or(&[]);
                    let passing = subs
                        .iter()
                        .filter(|s| self.errors_at(s, v, at, depth).is_empty())
                        .count();
                    let ok = match key.as_str() {
                        "anyOf" => passing >= 1,
                        "oneOf" => passing == 1,
                        _ => passing == subs.len(),
                    };
                    if !ok {
                        out.push(format!(
                            "{at}: {passing} of {} {key} branches match {v}",
                            subs.len()
                        ));
                    }
                }
                "properties" => {
                    if let (Some(props), Value::Object(obj)) = (arg.as_object(), v) {
                        for (name, sub) in props {
                            if let Some(x) = obj.get(name) {
                                self.check(sub, x, &format!("{at}.{name}"), out, depth + 1);
                            }
                        }
                    }
                }
                "required" => {
                    if let (Some(names), Value::Object(obj)) = (arg.as_array(), v) {
                        for name in names.iter().filter_map(Value::as_str) {
                            if !obj.contains_key(name) {
                                out.push(format!("{at}: missing required `{name}`"));
                            }
                        }
                    }
                }
                "additionalProperties" => {
                    if let Value::Object(obj) = v {
                        let declared = m.get("properties").and_then(Value::as_object);
                        for (name, x) in obj {
                            if !declared.is_some_and(|d| d.contains_key(name)) {
                                self.check(arg, x, &format!("{at}.{name}"), out, depth + 1);
                            }
                        }
                    }
                }
                "items" => {
                    if let Value::Array(items) = v {
                        for (i, x) in items.iter().enumerate() {
                            self.check(arg, x, &format!("{at}[{i}]"), out, depth + 1);
                        }
                    }
                }
                "minimum" | "maximum" => {
                    if let (Some(bound), Some(x)) = (arg.as_f64(), v.as_f64()) {
                        let bad = if key == "minimum" {
                            x < bound
                        } else {
                            x > bound
                        };
                        if bad {
                            out.push(format!("{at}: {x} is out of {key} {bound}"));
                        }
                    }
                }
                "minLength" | "maxLength" => {
                    if let (Some(bound), Some(s)) = (arg.as_u64(), v.as_str()) {
                        let n = s.chars().count() as u64;
                        let bad = if key == "minLength" {
                            n < bound
                        } else {
                            n > bound
                        };
                        if bad {
                            out.push(format!("{at}: length {n} is out of {key} {bound}"));
                        }
                    }
                }
                "pattern" => {
                    let Some(text) = v.as_str() else { continue };
                    match arg.as_str().map(Regex::new) {
                        Some(Ok(re)) => {
                            if !re.is_match(text) {
                                out.push(format!("{at}: {text:?} does not match {arg}"));
                            }
                        }
                        _ => out.push(format!("{at}: bad pattern {arg}")),
                    }
                }
                other => out.push(format!("{at}: unsupported keyword `{other}`")),
            }
        }
        if self.closed
            && m.contains_key("properties")
            && !m.contains_key("additionalProperties")
            && let (Some(props), Value::Object(obj)) = (m["properties"].as_object(), v)
        {
            for name in obj.keys() {
                if !props.contains_key(name) {
                    out.push(format!("{at}: undeclared property `{name}`"));
                }
            }
        }
    }

    fn errors_at(&self, schema: &Value, v: &Value, at: &str, depth: usize) -> Vec<String> {
        let mut out = Vec::new();
        self.check(schema, v, at, &mut out, depth + 1);
        out
    }
}

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "number" => v.is_number(),
        "integer" => {
            v.is_i64()
                || v.is_u64()
                || v.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.is_finite())
        }
        _ => false,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
