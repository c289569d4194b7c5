//! Python values to the engine's types and back: JSON-like values (dicts, lists, strings,
//! numbers), conversation messages (LangChain message objects read by attribute, or plain
//! dicts), and user/agent scopes.

use deermem_core::ports::MemoryScope;
use deermem_core::{AgentName, IdError, InvalidInputCode, ManagerError, Message, UserId};
use pyo3::IntoPyObjectExt;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Deepest nesting accepted from Python (documents and message kwargs are shallow).
const MAX_DEPTH: usize = 64;

/// How to treat a value JSON cannot hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strictness {
    /// Fail with a `TypeError` / `ValueError` naming the path (documents, configuration).
    Strict,
    /// Keep going with a stand-in: `str(value)` for unknown objects, `null` for NaN (message
    /// metadata, which may carry anything a host put there).
    Lenient,
}

/// A Python value as JSON.
///
/// # Errors
/// Under [`Strictness::Strict`]: non-string keys, objects JSON cannot hold, NaN or infinite
/// floats, and nesting deeper than 64; under both, nesting deeper than 64.
pub(crate) fn to_value(obj: &Bound<'_, PyAny>, how: Strictness) -> PyResult<Value> {
    to_value_at(obj, how, 0, &mut String::from("$"))
}

fn to_value_at(
    obj: &Bound<'_, PyAny>,
    how: Strictness,
    depth: usize,
    path: &mut String,
) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err(format!(
            "{path}: nested more than {MAX_DEPTH} levels deep"
        )));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.extract::<bool>()?));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::from(u));
        }
        return match how {
            Strictness::Strict => Err(PyValueError::new_err(format!(
                "{path}: integer out of range"
            ))),
            Strictness::Lenient => Ok(Value::String(obj.str()?.to_str()?.to_owned())),
        };
    }
    if obj.is_instance_of::<PyFloat>() {
        let f = obj.extract::<f64>()?;
        return match (Number::from_f64(f), how) {
            (Some(n), _) => Ok(Value::Number(n)),
            (None, Strictness::Lenient) => Ok(Value::Null),
            (None, Strictness::Strict) => Err(PyValueError::new_err(format!(
                "{path}: {f} is not a finite number"
            ))),
        };
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key = match k.cast::<PyString>() {
                Ok(s) => s.to_str()?.to_owned(),
                Err(_) if how == Strictness::Lenient => k.str()?.to_str()?.to_owned(),
                Err(_) => {
                    return Err(PyTypeError::new_err(format!(
                        "{path}: keys must be strings, not {}",
                        k.get_type().name()?
                    )));
                }
            };
            let len = path.len();
            path.push('.');
            path.push_str(&key);
            let value = to_value_at(&v, how, depth + 1, path)?;
            path.truncate(len);
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut out = Vec::new();
        for (i, item) in obj.try_iter()?.enumerate() {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            out.push(to_value_at(&item?, how, depth + 1, path)?);
            path.truncate(len);
        }
        return Ok(Value::Array(out));
    }
    match how {
        Strictness::Lenient => Ok(Value::String(obj.str()?.to_str()?.to_owned())),
        Strictness::Strict => Err(PyTypeError::new_err(format!(
            "{path}: a {} cannot be stored (use dicts, lists, strings, numbers, booleans or None)",
            obj.get_type().name()?
        ))),
    }
}

/// A JSON value as a Python object (dicts keep their key order).
///
/// # Errors
/// Python allocation failures.
pub(crate) fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_bound_py_any(py)?,
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_bound_py_any(py)?
            } else if let Some(u) = n.as_u64() {
                u.into_bound_py_any(py)?
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)?
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// A serialisable engine value (a document, a fact list) as Python objects.
///
/// # Errors
/// Serialisation or allocation failures.
pub(crate) fn serialize_to_py<'py, T: serde::Serialize>(
    py: Python<'py>,
    value: &T,
) -> PyResult<Bound<'py, PyAny>> {
    let v = serde_json::to_value(value)
        .map_err(|e| PyValueError::new_err(format!("cannot convert the engine's answer: {e}")))?;
    to_py(py, &v)
}

/// The attributes of a LangChain message the engine reads.
const MESSAGE_ATTRS: [&str; 8] = [
    "type",
    "content",
    "additional_kwargs",
    "tool_calls",
    "tool_call_id",
    "status",
    "name",
    "id",
];

/// One message: a dict as is, any other object by attribute (no LangChain import).
fn message_value(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Ok(d) = obj.cast::<PyDict>() {
        return to_value(d.as_any(), Strictness::Lenient);
    }
    let py = obj.py();
    let mut map = Map::new();
    for attr in MESSAGE_ATTRS {
        // An attribute that is missing or whose property raises is simply absent.
        let Ok(v) = obj.getattr(PyString::intern(py, attr)) else {
            continue;
        };
        if v.is_none() {
            continue;
        }
        map.insert(attr.to_owned(), to_value(&v, Strictness::Lenient)?);
    }
    Ok(Value::Object(map))
}

/// The conversation of an `add`: a list (or tuple) of messages. A message the engine cannot
/// read (no type or role) is skipped and logged, as the filter would drop it anyway; a
/// `messages` that is not a sequence of messages is a `TypeError`.
///
/// # Errors
/// `messages` is a string, a mapping or not iterable.
pub(crate) fn messages(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Message>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyDict>() {
        return Err(PyTypeError::new_err(
            "messages must be a list of messages, not a single string or mapping",
        ));
    }
    let iter = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "messages must be a list of messages, not {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let mut out = Vec::new();
    for (i, item) in iter.enumerate() {
        let value = message_value(&item?)?;
        match serde_json::from_value::<Message>(value) {
            Ok(m) => out.push(m),
            Err(e) => {
                tracing::debug!(index = i, error = %e, "skipping a message without a readable type")
            }
        }
    }
    Ok(out)
}

/// The scope of a call: the user id as the engine validates it and the explicit agent name
/// (lowercased; `None` for the default bucket).
///
/// # Errors
/// `ValueError` with the engine's message for empty, NUL-carrying or over-long user ids and for
/// user ids shaped like the storage bucket of another id; `ValueError("agent_name")` with the
/// reason as its detail for names outside the agent-name
/// grammar.
pub(crate) fn scope(user_id: Option<&str>, agent_name: Option<&str>) -> PyResult<MemoryScope> {
    let invalid = |e: IdError| PyValueError::new_err(e.to_string());
    if let Some(raw) = user_id {
        // The host names the user: the rule on caller-chosen ids applies.
        deermem_core::ids::refuse_derived_bucket(raw)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
    }
    let user = user_id.map(UserId::new).transpose().map_err(invalid)?;
    // `ValueError("agent_name")`, the code DeerFlow's router knows, with the reason attached.
    let agent = agent_name.map(AgentName::parse).transpose().map_err(|e| {
        Python::attach(|py| {
            crate::errors::to_py(
                py,
                ManagerError::invalid(InvalidInputCode::AgentName, e.to_string()),
            )
        })
    })?;
    Ok(MemoryScope::new(user, agent))
}

/// The text of a chat model's answer: a string, or the text of its content blocks.
pub(crate) fn content_text(content: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = content.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    if content.is_none() {
        return Ok(String::new());
    }
    let value = to_value(content, Strictness::Lenient)?;
    Ok(Message {
        kind: deermem_core::MessageKind::Ai,
        content: value,
        additional_kwargs: Map::new(),
        tool_calls: Vec::new(),
        id: None,
        name: None,
        tool_call_id: None,
        status: None,
    }
    .text())
}

/// Reads an optional attribute, treating a raising property as absent.
pub(crate) fn attr<'py>(obj: &Bound<'py, PyAny>, name: &str) -> Option<Bound<'py, PyAny>> {
    obj.getattr(PyString::intern(obj.py(), name))
        .ok()
        .filter(|v| !v.is_none())
}

/// `dict.get(key)` for an optional dict argument.
pub(crate) fn dict_get<'py>(d: &Bound<'py, PyAny>, key: &str) -> Option<Bound<'py, PyAny>> {
    let d = d.cast::<PyDict>().ok()?;
    d.get_item(key).ok().flatten()
}
