//! What of a `backend_config` is shown (the gateway's `/api/memory/config` and `/status`): the
//! configured backend's own settings type, parsed from it and serialised. Each adapter's
//! settings derive `Serialize` as their display form, in which a secret is `"***"` and a URL
//! loses its credentials because of their types (`deermem_core::config::shown`); a key no
//! settings type reads is not a field, so it is never shown. The facade keeps no key list: the
//! table of backends (and, for DeerMem, of storage adapters) names each one's display.
//!
//! A backend whose configuration cannot be shown that way (not compiled into this build, an
//! unknown `manager_class`, settings that do not parse) shows `{"not_shown": <reason>}`, a
//! fixed text that never quotes the configuration.

use serde_json::{Map, Value};

use crate::build::{Display, display};

pub use deermem_core::config::shown::url_without_credentials;

/// The one key of a configuration that is not shown.
const NOT_SHOWN: &str = "not_shown";

/// Why a configuration (or a storage adapter's section of it) is not shown.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Why {
    /// Its adapter is not compiled into this build.
    NotCompiled,
    /// No backend has the configured name.
    UnknownBackend,
    /// It does not parse with its adapter's settings type.
    Invalid,
}

/// `{"not_shown": <reason>}`: a fixed text, never anything of the configuration.
pub(crate) fn not_shown(why: Why) -> Value {
    let reason = match why {
        Why::NotCompiled => "its adapter is not compiled into this build",
        Why::UnknownBackend => "memory.manager_class names no known backend",
        Why::Invalid => "it does not parse; starting the backend names the key",
    };
    let mut m = Map::new();
    m.insert(NOT_SHOWN.into(), Value::String(reason.into()));
    Value::Object(m)
}

/// The part of `backend_config` that may be shown for the backend `manager_class` names: its
/// settings type's display form (every key it reads, with its value or default; secrets such
/// as `api_key` or `postgres.url` as `"***"`; URLs without user-info, query string or
/// fragment; any key it does not read left out, whatever its name), or `{"not_shown": ...}`
/// when the backend is not compiled in, unknown, or its configuration does not parse.
pub fn shown_backend_config(manager_class: &str, backend_config: &Map<String, Value>) -> Value {
    match display(manager_class) {
        Display::Shown(show) => match show(backend_config) {
            Some(v @ Value::Object(_)) => v,
            _ => not_shown(Why::Invalid),
        },
        Display::NotCompiled => not_shown(Why::NotCompiled),
        Display::Unknown => not_shown(Why::UnknownBackend),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn shown(class: &str, v: Value) -> Value {
        shown_backend_config(class, v.as_object().unwrap())
    }

    #[test]
    fn noop_shows_nothing_and_an_unknown_backend_shows_why() {
        assert_eq!(shown("noop", json!({"api_key": "sk-DISTINCT"})), json!({}));
        let out = shown("my.module:Manager", json!({"api_key": "sk-DISTINCT"}));
        assert_eq!(
            out,
            json!({"not_shown": "memory.manager_class names no known backend"})
        );
    }
}
