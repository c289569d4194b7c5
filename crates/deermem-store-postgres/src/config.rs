//! The `backend_config.postgres` keys: where the database is, how many connections, which
//! schema, the timeouts and the TLS mode. The URL is a secret: `Debug` never shows it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::PgError;

/// How the connection is protected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plain TCP or a Unix socket (a database on loopback or a private network).
    #[default]
    Disable,
    /// TLS, without checking the server's certificate.
    Require,
    /// TLS with the certificate checked against `ca_file` and the host name.
    VerifyFull,
}

/// The `tls` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// `disable` (default), `require` or `verify-full`.
    #[serde(default)]
    pub mode: TlsMode,
    /// PEM file of the certificate authority for `verify-full`.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// `backend_config.postgres`, with `$VAR` references already resolved by the loader.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database` (or key=value connection string).
    pub url: String,
    /// Connections in this process's pool.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// The schema holding DeerMem's tables (created when missing).
    #[serde(default = "default_schema")]
    pub schema: String,
    /// Seconds to wait for a connection to open.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_seconds: f64,
    /// Seconds a statement may run before the server cancels it.
    #[serde(default = "default_statement_timeout")]
    pub statement_timeout_seconds: f64,
    /// Transport security.
    #[serde(default)]
    pub tls: TlsConfig,
}

fn default_pool_size() -> usize {
    8
}
fn default_schema() -> String {
    "deermem".into()
}
fn default_connect_timeout() -> f64 {
    10.0
}
fn default_statement_timeout() -> f64 {
    30.0
}

/// The most connections one process may ask for.
pub const MAX_POOL_SIZE: usize = 256;
/// PostgreSQL's identifier limit (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &"<redacted>")
            .field("pool_size", &self.pool_size)
            .field("schema", &self.schema)
            .field("connect_timeout_seconds", &self.connect_timeout_seconds)
            .field("statement_timeout_seconds", &self.statement_timeout_seconds)
            .field("tls", &self.tls)
            .finish()
    }
}

impl PostgresConfig {
    /// A configuration for `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            pool_size: default_pool_size(),
            schema: default_schema(),
            connect_timeout_seconds: default_connect_timeout(),
            statement_timeout_seconds: default_statement_timeout(),
            tls: TlsConfig::default(),
        }
    }

    /// Reads the block from its JSON value (the configuration loader's output).
    ///
    /// # Errors
    /// [`PgError::Config`] naming the key for a wrong type, an unknown key or a value out of
    /// range.
    pub fn from_value(value: &serde_json::Value) -> Result<Self, PgError> {
        let config = Self::deserialize(value).map_err(|e| PgError::Config {
            key: "postgres".into(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and the schema name.
    ///
    /// # Errors
    /// [`PgError::Config`] naming the offending key.
    pub fn validate(&self) -> Result<(), PgError> {
        let bad = |key: &str, message: String| PgError::Config {
            key: format!("postgres.{key}"),
            message,
        };
        if self.url.trim().is_empty() {
            return Err(bad("url", "is empty".into()));
        }
        if !(1..=MAX_POOL_SIZE).contains(&self.pool_size) {
            return Err(bad(
                "pool_size",
                format!("must be between 1 and {MAX_POOL_SIZE}"),
            ));
        }
        if !is_plain_identifier(&self.schema) {
            return Err(bad(
                "schema",
                format!(
                    "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most \
                     {MAX_IDENTIFIER_BYTES} bytes), got {:?}",
                    crate::error::shorten(&self.schema)
                ),
            ));
        }
        for (key, v) in [
            ("connect_timeout_seconds", self.connect_timeout_seconds),
            ("statement_timeout_seconds", self.statement_timeout_seconds),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
                return Err(bad(key, "must be a number of seconds in (0, 86400]".into()));
            }
        }
        if self.tls.mode == TlsMode::VerifyFull && self.tls.ca_file.is_none() {
            return Err(bad(
                "tls.ca_file",
                "is required for tls.mode verify-full".into(),
            ));
        }
        Ok(())
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.connect_timeout_seconds)
    }

    /// The statement timeout.
    pub fn statement_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.statement_timeout_seconds)
    }
}

/// `[a-z_][a-z0-9_]*` within PostgreSQL's identifier length: safe to splice into DDL (it is
/// also quoted there).
fn is_plain_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && s.len() <= MAX_IDENTIFIER_BYTES
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_and_ranges() {
        let c = PostgresConfig::from_value(&json!({"url": "postgres://u:pw@h/db"})).unwrap();
        assert_eq!(c.pool_size, 8);
        assert_eq!(c.schema, "deermem");
        assert_eq!(c.tls.mode, TlsMode::Disable);
        for (patch, key) in [
            (json!({"pool_size": 0}), "postgres.pool_size"),
            (json!({"pool_size": 10_000}), "postgres.pool_size"),
            (
                json!({"schema": "x\"; DROP TABLE users; --"}),
                "postgres.schema",
            ),
            (json!({"schema": "Upper"}), "postgres.schema"),
            (json!({"schema": "a".repeat(64)}), "postgres.schema"),
            (
                json!({"connect_timeout_seconds": -1}),
                "postgres.connect_timeout_seconds",
            ),
            (
                json!({"statement_timeout_seconds": 0}),
                "postgres.statement_timeout_seconds",
            ),
            (
                json!({"tls": {"mode": "verify-full"}}),
                "postgres.tls.ca_file",
            ),
            (json!({"url": "  "}), "postgres.url"),
        ] {
            let mut v = json!({"url": "postgres://u:pw@h/db"});
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            match PostgresConfig::from_value(&v) {
                Err(PgError::Config { key: k, .. }) => assert_eq!(k, key, "{v}"),
                other => panic!("{v}: {other:?}"),
            }
        }
        assert!(matches!(
            PostgresConfig::from_value(&json!({"url": "x", "pool": 3})),
            Err(PgError::Config { .. })
        ));
        assert!(matches!(
            PostgresConfig::from_value(&json!({"url": "x", "tls": {"mode": "sometimes"}})),
            Err(PgError::Config { .. })
        ));
    }

    #[test]
    fn debug_never_shows_the_url() {
        let c = PostgresConfig::new("postgres://user:hunter2@db.internal/mem");
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("db.internal"),
            "{shown}"
        );
    }
}
