//! The `backend_config.postgres` settings as the PostgreSQL adapter takes them: built from a URL
//! alone (libpq's TLS parameters read), read from a JSON block, checked when built in code,
//! and their timeouts as durations. One type serves the loader and the adapter.

use std::time::Duration;

use serde_json::Value;

use super::{PostgresSettings, PostgresTlsMode, lax};
use crate::error::ConfigError;

/// The shortest lease `lease_seconds` accepts.
pub const MIN_LEASE_SECONDS: f64 = 0.1;
/// The longest lease `lease_seconds` accepts.
pub const MAX_LEASE_SECONDS: f64 = 60.0;

impl PostgresSettings {
    /// Settings for `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Settings from a connection URL alone (`deermem migrate --to postgres://…`): every other
    /// key at its default, except TLS, which the URL's libpq parameters choose:
    /// `sslmode=disable|allow|prefer` is `disable`, `require` is `require`, `verify-full` is
    /// `verify-full`, and `sslrootcert=<file>` is `tls.ca_file`. Those two parameters are taken
    /// out of the URL handed to the driver. A key=value connection string is taken as it is.
    ///
    /// # Errors
    /// `postgres.tls.mode` for an `sslmode` the adapter does not offer (`verify-ca`) or an
    /// unknown one, then whatever [`PostgresSettings::validate`] reports.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
        let (base, query) = match url.split_once('?') {
            Some((b, q)) if is_url => (b, q),
            _ => {
                let settings = Self::new(url);
                settings.validate()?;
                return Ok(settings);
            }
        };
        let mut kept = Vec::new();
        let mut settings = Self::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sslmode" => {
                    settings.tls.mode = match value {
                        "disable" | "allow" | "prefer" => PostgresTlsMode::Disable,
                        "require" => PostgresTlsMode::Require,
                        "verify-full" => PostgresTlsMode::VerifyFull,
                        "verify-ca" => {
                            return Err(ConfigError::new(
                                "postgres.tls.mode",
                                "sslmode=verify-ca is not offered: use verify-full (the \
                                 certificate and the host name are checked)",
                            ));
                        }
                        other => {
                            return Err(ConfigError::new(
                                "postgres.tls.mode",
                                format!("unknown sslmode {:?} in the URL", shorten(other)),
                            ));
                        }
                    };
                }
                "sslrootcert" => {
                    let decoded = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
                    settings.tls.ca_file = Some(decoded.into_owned());
                }
                _ => kept.push(pair),
            }
        }
        settings.url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Reads the block from its JSON value, with the loader's lax rules, and checks it.
    ///
    /// # Errors
    /// The key (`postgres.pool_size`, …) of a wrong type, an unknown key or a value out of
    /// range.
    pub fn from_value(value: &Value) -> Result<Self, ConfigError> {
        let (settings, _) = lax::deserialize::<Self>(value, "postgres")?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what the loader checks, for settings built in code, and what needs the whole
    /// block: a URL is set, and a CA file is only given to the mode that reads it.
    ///
    /// # Errors
    /// The offending key, e.g. `postgres.pool_size`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| ConfigError::new(format!("postgres.{key}"), message);
        if self.url.trim().is_empty() {
            return Err(bad("url", "is empty".into()));
        }
        if !(1..=super::MAX_POSTGRES_POOL_SIZE).contains(&self.pool_size) {
            return Err(bad(
                "pool_size",
                format!("must be between 1 and {}", super::MAX_POSTGRES_POOL_SIZE),
            ));
        }
        super::postgres::check_schema_name(&self.schema)?;
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
        if self.tls.mode != PostgresTlsMode::VerifyFull && self.tls.ca_file.is_some() {
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

/// `s` cut to 80 characters, for echoing a bad value.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use std::time::Duration;

    use super::*;
    use crate::config::PostgresCoherence as Coherence;
    use crate::config::PostgresSettings as PostgresConfig;
    use crate::config::PostgresTls as TlsConfig;

    #[test]
    fn defaults_and_ranges() {
        let c = PostgresConfig::from_value(&json!({"url": "postgres://u:pw@h/db"})).unwrap();
        assert_eq!(c.pool_size, 8);
        assert_eq!(c.schema, "deermem");
        assert_eq!(c.tls.mode, PostgresTlsMode::Disable);
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
            Err(ConfigError { .. })
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
                Err(ConfigError { key: k, .. }) => assert_eq!(k, key, "{v}"),
                other => panic!("{v}: {other:?}"),
            }
        }
        assert!(matches!(
            PostgresConfig::from_value(&json!({"url": "x", "pool": 3})),
            Err(ConfigError { .. })
        ));
        assert!(matches!(
            PostgresConfig::from_value(&json!({"url": "x", "tls": {"mode": "sometimes"}})),
            Err(ConfigError { .. })
        ));
    }

    #[test]
    fn verify_full_without_a_ca_file_uses_the_bundled_roots() {
        let c = PostgresConfig::from_value(
            &json!({"url": "postgres://h/db", "tls": {"mode": "verify-full"}}),
        )
        .unwrap();
        assert_eq!(c.tls.mode, PostgresTlsMode::VerifyFull);
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
        assert_eq!(c.tls.mode, PostgresTlsMode::VerifyFull);
        assert_eq!(c.tls.ca_file, Some("/etc/ca x.pem".to_owned()));
        let c = PostgresConfig::from_url("postgres://u@h/db?sslmode=require").unwrap();
        assert_eq!(
            (c.url.as_str(), c.tls.mode),
            ("postgres://u@h/db", PostgresTlsMode::Require)
        );
        let c = PostgresConfig::from_url("postgres://u@h/db?sslmode=prefer").unwrap();
        assert_eq!(c.tls.mode, PostgresTlsMode::Disable);
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
                Err(ConfigError { key: k, .. }) => assert_eq!(k, key, "{url}"),
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
