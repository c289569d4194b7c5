//! The one configuration loader below every `#[derive(Deserialize)]` config struct: the lax
//! deserializer of [`deermem_pycompat::lax::de`] (pydantic's rules live there, with the
//! Python compatibility they are), its refusals turned into [`ConfigError`]s. The coercions
//! are re-exported for `#[serde(deserialize_with = "lax::...")]`.

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use deermem_pycompat::lax::de::{
    bool, float, float_in, int_in, scalar_str, strings, to_bool, to_float, to_int,
};

use crate::error::ConfigError;

/// Deserializes `T` from `value`, a section found under `prefix` (`memory.backend_config`),
/// with [`deermem_pycompat::lax::de::deserialize`]: `null` is absent, and the paths of the keys
/// `T` did not read are returned.
///
/// # Errors
/// A [`ConfigError`] whose key is `prefix` plus the path of the bad value.
pub fn deserialize<T: DeserializeOwned>(
    value: &Value,
    prefix: &str,
) -> Result<(T, Vec<String>), ConfigError> {
    deermem_pycompat::lax::de::deserialize(value, prefix)
        .map_err(|e| ConfigError::new(e.key, e.message))
}
