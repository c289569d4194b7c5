//! The `backend_config.postgres` block: where the PostgreSQL database is, how many connections,
//! which schema, the timeouts and the TLS mode. Read with the lax loader like every other key;
//! the URL is a secret (it may hold a password), so `Debug` and `Serialize` never show it.

use serde::{Deserialize, Deserializer, Serialize};

use super::lax;
use crate::error::ConfigError;

/// The most connections one process may ask for.
pub const MAX_POSTGRES_POOL_SIZE: usize = 256;
/// PostgreSQL's identifier limit (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

/// `backend_config.postgres`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresSettings {
    /// `postgres://user:password@host:port/database` or a key=value connection string, after
    /// `$VAR` resolution by the loader (`${VAR}` is resolved by the host when it connects).
    /// Never serialised, never printed.
    #[serde(skip_serializing)]
    pub url: String,
    /// Connections in this process's pool, 1–256 (default 8).
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 256>")]
    pub pool_size: usize,
    /// The schema holding DeerMem's tables (default `deermem`; created when missing).
    #[serde(deserialize_with = "schema_name")]
    pub schema: String,
    /// Seconds to wait for a connection, (0, 86400] (default 10).
    #[serde(deserialize_with = "seconds")]
    pub connect_timeout_seconds: f64,
    /// Seconds a statement may run before the server cancels it, (0, 86400] (default 30).
    #[serde(deserialize_with = "seconds")]
    pub statement_timeout_seconds: f64,
    /// Transport security.
    pub tls: PostgresTls,
    /// How a replica's cache stays coherent with the other replicas' writes: `lease`
    /// (default) or `revision_check`.
    pub coherence: PostgresCoherence,
    /// Seconds a replica's read lease on a user runs, [0.1, 60] (default 2).
    #[serde(deserialize_with = "lease_seconds")]
    pub lease_seconds: f64,
}

/// `backend_config.postgres.coherence`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PostgresCoherence {
    /// Read leases revoked by every write: a warm read runs no statement.
    #[default]
    Lease,
    /// The user's row read on every load.
    RevisionCheck,
}

impl PostgresCoherence {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::RevisionCheck => "revision_check",
        }
    }
}

/// `backend_config.postgres.tls`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresTls {
    /// `disable` (default), `require` or `verify-full`.
    pub mode: PostgresTlsMode,
    /// PEM file of the certificate authority, required for `verify-full`.
    #[serde(deserialize_with = "super::non_empty")]
    pub ca_file: Option<String>,
}

/// How the connection is protected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PostgresTlsMode {
    /// Plain TCP or a Unix socket.
    #[default]
    Disable,
    /// TLS without checking the certificate.
    Require,
    /// TLS with the certificate checked against `ca_file` and the host name.
    VerifyFull,
}

impl PostgresTlsMode {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Require => "require",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl Default for PostgresSettings {
    fn default() -> Self {
        Self {
            url: String::new(),
            pool_size: 8,
            schema: "deermem".into(),
            connect_timeout_seconds: 10.0,
            statement_timeout_seconds: 30.0,
            tls: PostgresTls::default(),
            coherence: PostgresCoherence::default(),
            lease_seconds: 2.0,
        }
    }
}

impl std::fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("url", &"<redacted>")
            .field("pool_size", &self.pool_size)
            .field("schema", &self.schema)
            .field("connect_timeout_seconds", &self.connect_timeout_seconds)
            .field("statement_timeout_seconds", &self.statement_timeout_seconds)
            .field("tls", &self.tls)
            .field("coherence", &self.coherence)
            .field("lease_seconds", &self.lease_seconds)
            .finish()
    }
}

fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let f = lax::float(d)?;
    if f.is_finite() && f > 0.0 && f <= 86_400.0 {
        Ok(f)
    } else {
        Err(serde::de::Error::custom(format!(
            "must be a number of seconds in (0, 86400] (got {f})"
        )))
    }
}

fn lease_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let f = lax::float(d)?;
    if f.is_finite() && (0.1..=60.0).contains(&f) {
        Ok(f)
    } else {
        Err(serde::de::Error::custom(format!(
            "must be a number of seconds in [0.1, 60] (got {f})"
        )))
    }
}

/// `[a-z_][a-z0-9_]*` within PostgreSQL's identifier length.
fn schema_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    check_schema_name(&s).map_err(|e| serde::de::Error::custom(e.message))?;
    Ok(s)
}

/// Whether `s` is `[a-z_][a-z0-9_]*` within PostgreSQL's identifier length, safe to splice into
/// DDL (it is also quoted there).
pub(super) fn check_schema_name(s: &str) -> Result<(), ConfigError> {
    let mut bytes = s.bytes();
    let plain = matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && s.len() <= MAX_IDENTIFIER_BYTES;
    if plain {
        return Ok(());
    }
    let shown: String = s.chars().take(80).collect();
    Err(ConfigError::new(
        "postgres.schema",
        format!(
            "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most {MAX_IDENTIFIER_BYTES} bytes), got {shown:?}"
        ),
    ))
}

/// The variable a whole-string environment reference names: `$NAME` or `${NAME}`, where NAME
/// is `[A-Za-z_][A-Za-z0-9_]*`; `None` for any other string.
pub fn env_reference(s: &str) -> Option<&str> {
    let name = s.strip_prefix('$')?;
    let name = match name.strip_prefix('{') {
        Some(inner) => inner.strip_suffix('}')?,
        None => name,
    };
    super::is_env_name(name).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_references() {
        assert_eq!(env_reference("$DATABASE_URL"), Some("DATABASE_URL"));
        assert_eq!(env_reference("${DATABASE_URL}"), Some("DATABASE_URL"));
        assert_eq!(env_reference("${_X1}"), Some("_X1"));
        assert_eq!(env_reference("postgres://u@h/db"), None);
        assert_eq!(env_reference("${NOPE"), None);
        assert_eq!(env_reference("${}"), None);
        assert_eq!(env_reference("$1X"), None);
        assert_eq!(env_reference("$A-B"), None);
    }

    #[test]
    fn debug_and_serialize_never_show_the_url() {
        let s = PostgresSettings {
            url: "postgres://user:hunter2@db.internal/mem".into(),
            ..PostgresSettings::default()
        };
        let shown = format!("{s:?}");
        let json = serde_json::to_string(&s).unwrap();
        for text in [shown, json] {
            assert!(
                !text.contains("hunter2") && !text.contains("db.internal"),
                "{text}"
            );
        }
    }
}
