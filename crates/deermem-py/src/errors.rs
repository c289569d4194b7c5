//! Engine errors as the exceptions DeerFlow's memory router maps to status codes: a lost
//! revision race is `MemoryConflictError`, unreadable memory `MemoryCorruptionError`, a
//! missing fact `KeyError(fact_id)`, invalid input `ValueError` whose first argument is the
//! stable code the router matches (`"confidence"`, `"content"`, `"Duplicate fact"`,
//! `"memory_data..."`; the detail is attached as a note), a failed write `OSError`, an
//! unsupported operation `NotImplementedError("<op> not supported by DeerMemManager")`.
//!
//! The two memory error classes come from `deermem_rs._errors`, which re-exports DeerFlow's
//! own classes when DeerFlow is importable.

use deermem::BuildError;
use deermem_core::{InvalidInputCode, ManagerError};
use pyo3::exceptions::{
    PyKeyError, PyNotImplementedError, PyOSError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;

/// The class name used in "not supported by" messages.
const CLASS_NAME: &str = "DeerMemManager";

/// An exception of `deermem_rs._errors` (the DeerFlow classes when DeerFlow is importable).
pub(crate) fn package_error(py: Python<'_>, class: &str, message: String) -> PyErr {
    let made = py
        .import("deermem_rs._errors")
        .and_then(|m| m.getattr(class))
        .and_then(|cls| cls.call1((message.clone(),)));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        // The package's own module is missing: still raise something that says what happened.
        Err(_) => PyRuntimeError::new_err(message),
    }
}

/// `ValueError(code)` with the engine's message attached as a note (Python 3.11+) and as the
/// `detail` attribute, so `str(e)` is the stable code a router compares.
fn coded_value_error(py: Python<'_>, code: &str, detail: &str) -> PyErr {
    let err = PyValueError::new_err(code.to_owned());
    let value = err.value(py);
    if detail != code {
        let _ = value.setattr("detail", detail);
        if value.hasattr("add_note").unwrap_or(false) {
            let _ = value.call_method1("add_note", (detail,));
        }
    }
    err
}

/// The reference's code for an import-document error: the dotted prefix of the message
/// (`memory_data.facts[3].id: ...` → `memory_data.facts`).
fn memory_data_code(message: &str) -> &str {
    let end = message
        .find(|c: char| c == '[' || c == ':' || c.is_whitespace())
        .unwrap_or(message.len());
    let prefix = &message[..end];
    if prefix.starts_with("memory_data") {
        prefix
    } else {
        "memory_data"
    }
}

/// An engine error as a Python exception.
pub(crate) fn to_py(py: Python<'_>, e: ManagerError) -> PyErr {
    match e {
        ManagerError::Unsupported { operation, .. } => PyNotImplementedError::new_err(format!(
            "{} not supported by {CLASS_NAME}",
            operation.replace(' ', "_")
        )),
        ManagerError::Conflict { message, .. } => package_error(py, "MemoryConflictError", message),
        ManagerError::Corruption { message, .. } => {
            package_error(py, "MemoryCorruptionError", message)
        }
        ManagerError::NotFound { fact_id } => PyKeyError::new_err(fact_id),
        ManagerError::InvalidInput { code, message } => match code {
            InvalidInputCode::Confidence => coded_value_error(py, "confidence", &message),
            InvalidInputCode::Content => coded_value_error(py, "content", &message),
            InvalidInputCode::AgentName => coded_value_error(py, "agent_name", &message),
            InvalidInputCode::DuplicateFact => coded_value_error(py, "Duplicate fact", &message),
            InvalidInputCode::MemoryData => {
                coded_value_error(py, memory_data_code(&message), &message)
            }
            _ => PyValueError::new_err(message),
        },
        ManagerError::Storage { message, .. } => PyOSError::new_err(message),
        ManagerError::Timeout { message, .. } => PyTimeoutError::new_err(message),
        other => package_error(py, "MemoryManagerError", other.to_string()),
    }
}

/// A failed engine construction: configuration mistakes are `ValueError`s naming the key.
pub(crate) fn build_to_py(py: Python<'_>, e: BuildError) -> PyErr {
    match e {
        BuildError::Config(c) => PyValueError::new_err(c.to_string()),
        BuildError::Backend { source, .. } => to_py(py, source),
        other => PyValueError::new_err(other.to_string()),
    }
}
