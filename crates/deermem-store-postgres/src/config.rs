//! The `backend_config.postgres` keys: where the database is, how many connections, which
//! schema, the timeouts and the TLS mode. The URL is a secret: `Debug` never shows it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::PgError;
use crate::lease::Coherence;

/// How the connection is protected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plain TCP or a Unix socket (a database on loopback or a private network).
    #[default]
    Disable,
    /// TLS, without checking the server's certificate (as libpq's `sslmode=require`): the
    /// traffic is encrypted, but a server impersonating the database is not detected.
    Require,
    /// TLS with the certificate chain checked against `ca_file` (without one, against the
    /// bundled Mozilla root set) and the URL's host checked against the certificate's names.
    VerifyFull,
}

/// The `tls` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// `disable` (default), `require` or `verify-full`.
    #[serde(default)]
    pub mode: TlsMode,
    /// PEM file of the certificate authorities `verify-full` trusts (only that mode reads it).
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
    /// How a replica's cache stays coherent with the other replicas' writes: `lease`
    /// (default; a warm read runs no statement) or `revision_check` (the user's row read on
    /// every load).
    #[serde(default)]
    pub coherence: Coherence,
    /// Seconds a read lease runs in the database (0.1 to 60, default 2): how long a dead
    /// replica can delay a write to a user it read, and how often a replica renews the lease
    /// of a user it keeps reading.
    #[serde(default = "default_lease_seconds")]
    pub lease_seconds: f64,
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
fn default_lease_seconds() -> f64 {
    2.0
}

/// The shortest lease `lease_seconds` accepts.
pub const MIN_LEASE_SECONDS: f64 = 0.1;
/// The longest lease `lease_seconds` accepts.
pub const MAX_LEASE_SECONDS: f64 = 60.0;

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
            .field("coherence", &self.coherence)
            .field("lease_seconds", &self.lease_seconds)
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
            coherence: Coherence::default(),
            lease_seconds: default_lease_seconds(),
        }
    }

    /// A configuration from a connection URL alone (`deermem migrate --to postgres://…`):
    /// every other key at its default, except TLS, which the URL's libpq parameters choose:
    /// `sslmode=disable|allow|prefer` is `disable`, `require` is `require`, `verify-full` is
    /// `verify-full`, and `sslrootcert=<file>` is `tls.ca_file`. Those two parameters are taken
    /// out of the URL handed to the driver. A key=value connection string is taken as it is.
    ///
    /// # Errors
    /// [`PgError::Config`] for an `sslmode` this adapter does not offer (`verify-ca`) or an
    /// unknown one, then whatever [`PostgresConfig::validate`] reports.
    pub fn from_url(url: &str) -> Result<Self, PgError> {
        let bad = |key: &str, message: String| PgError::Config {
            key: format!("postgres.{key}"),
            message,
        };
        let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
        let (base, query) = match url.split_once('?') {
            Some((b, q)) if is_url => (b, q),
            _ => {
                let config = Self::new(url);
                config.validate()?;
                return Ok(config);
            }
        };
        let mut kept = Vec::new();
        let mut tls = TlsConfig::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sslmode" => {
                    tls.mode = match value {
                        "disable" | "allow" | "prefer" => TlsMode::Disable,
                        "require" => TlsMode::Require,
                        "verify-full" => TlsMode::VerifyFull,
                        "verify-ca" => {
                            return Err(bad(
                                "tls.mode",
                                "sslmode=verify-ca is not offered: use verify-full (the \
                                 certificate and the host name are checked)"
                                    .into(),
                            ));
                        }
                        other => {
                            return Err(bad(
                                "tls.mode",
                                format!(
                                    "unknown sslmode {:?} in the URL",
                                    crate::error::shorten(other)
                                ),
                            ));
                        }
                    };
                }
                "sslrootcert" => tls.ca_file = Some(PathBuf::from(percent_decoded(value))),
                _ => kept.push(pair),
            }
        }
        let mut config = Self::new(if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        });
        config.tls = tls;
        config.validate()?;
        Ok(config)
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
        if !(self.lease_seconds.is_finite()
            && (MIN_LEASE_SECONDS..=MAX_LEASE_SECONDS).contains(&self.lease_seconds))
        {
            return Err(bad(
                "lease_seconds",
                format!(
                    "must be a number of seconds in [{MIN_LEASE_SECONDS}, {MAX_LEASE_SECONDS}]"
                ),
            ));
        }
        if self.tls.mode != TlsMode::VerifyFull && self.tls.ca_file.is_some() {
            // A CA file that would silently not be checked is a trap: say so.
            return Err(bad(
                "tls.ca_file",
                "is only read by tls.mode verify-full (require does not check the \
                 certificate); set the mode to verify-full or remove ca_file"
                    .into(),
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

    /// The read lease's length.
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs_f64(self.lease_seconds)
    }
}

/// `%XX` escapes of a URL query value decoded (a malformed escape is kept as it is).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
        assert_eq!(c.coherence, Coherence::Lease);
        assert_eq!(c.lease_seconds, 2.0);
        let c = PostgresConfig::from_value(&json!({"url": "postgres://h/db",
            "coherence": "revision_check", "lease_seconds": 0.5}))
        .unwrap();
        assert_eq!(
            (c.coherence, c.lease_duration()),
            (Coherence::RevisionCheck, Duration::from_millis(500))
        );
        assert!(matches!(
            PostgresConfig::from_value(&json!({"url": "x", "coherence": "sometimes"})),
            Err(PgError::Config { .. })
        ));
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
                json!({"tls": {"mode": "require", "ca_file": "/etc/ca.pem"}}),
                "postgres.tls.ca_file",
            ),
            (json!({"url": "  "}), "postgres.url"),
            (json!({"lease_seconds": 0}), "postgres.lease_seconds"),
            (json!({"lease_seconds": 61}), "postgres.lease_seconds"),
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
    fn verify_full_without_a_ca_file_uses_the_bundled_roots() {
        let c = PostgresConfig::from_value(
            &json!({"url": "postgres://h/db", "tls": {"mode": "verify-full"}}),
        )
        .unwrap();
        assert_eq!(c.tls.mode, TlsMode::VerifyFull);
        assert_eq!(c.tls.ca_file, None);
    }

    #[test]
    fn from_url_reads_the_libpq_tls_parameters() {
        let c = PostgresConfig::from_url("postgres://u:pw@h:5433/db").unwrap();
        assert_eq!(c.url, "postgres://u:pw@h:5433/db");
        assert_eq!(c.tls, TlsConfig::default());
        assert_eq!(c.schema, "deermem");
        let c = PostgresConfig::from_url(
            "postgresql://u@h/db?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem",
        )
        .unwrap();
        assert_eq!(c.url, "postgresql://u@h/db?application_name=x");
        assert_eq!(c.tls.mode, TlsMode::VerifyFull);
        assert_eq!(c.tls.ca_file, Some(PathBuf::from("/etc/ca x.pem")));
        let c = PostgresConfig::from_url("postgres://u@h/db?sslmode=require").unwrap();
        assert_eq!(
            (c.url.as_str(), c.tls.mode),
            ("postgres://u@h/db", TlsMode::Require)
        );
        let c = PostgresConfig::from_url("postgres://u@h/db?sslmode=prefer").unwrap();
        assert_eq!(c.tls.mode, TlsMode::Disable);
        let c = PostgresConfig::from_url("host=h user=u sslmode=disable").unwrap();
        assert_eq!(c.url, "host=h user=u sslmode=disable");
        for (url, key) in [
            ("postgres://h/db?sslmode=verify-ca", "postgres.tls.mode"),
            ("postgres://h/db?sslmode=sometimes", "postgres.tls.mode"),
            // A CA file that require would not read.
            (
                "postgres://h/db?sslmode=require&sslrootcert=/ca.pem",
                "postgres.tls.ca_file",
            ),
            ("", "postgres.url"),
        ] {
            match PostgresConfig::from_url(url) {
                Err(PgError::Config { key: k, .. }) => assert_eq!(k, key, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
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
