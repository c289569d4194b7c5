//! The `backend_config.postgres` block, owned by this adapter: where the database is, how many
//! connections, which schema, the timeouts, the TLS mode and the cache coherence. Read with the
//! core's lax loader like every other key (so a bad value is refused when the configuration is
//! loaded, naming `memory.backend_config.postgres.<key>`), checked by `validate` when built in
//! code, and built from a URL alone by `from_url` (libpq's TLS parameters read). The URL is a
//! secret (it may hold a password, and names the database host): it is a
//! [`ConfigSecret`], so `Debug` never prints it and `Serialize`, the block's display form (the
//! gateway's `/api/memory/config`), writes `"***"` in its place by its type.

use std::time::Duration;

use deermem_core::ConfigError;
use deermem_core::config::{ConfigSecret, lax};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Where the block sits in the host's configuration, for the loader's error keys.
const SECTION: &str = "memory.backend_config.postgres";

/// The one rule for a CA file next to a mode that does not read it.
const CA_FILE_UNREAD: &str = "is only read with tls.mode verify-full (require does not check the certificate); set the mode or remove the file";

/// An optional string; the empty string is `None`.
fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Some(String::deserialize(d)?).filter(|s| !s.is_empty()))
}

/// The most connections one process may ask for.
pub const MAX_POOL_SIZE: usize = 256;
/// PostgreSQL's identifier limit (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

/// `backend_config.postgres`: the adapter's settings.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database` or a key=value connection string, after
    /// `$VAR` resolution by the loader (`${VAR}` is resolved by the host when it connects).
    /// Never printed; serialised as `"***"`.
    pub url: ConfigSecret,
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
    pub tls: TlsConfig,
    /// How a replica's cache stays coherent with the other replicas' writes: `lease`
    /// (default) or `revision_check`.
    pub coherence: Coherence,
    /// Seconds a replica's read lease on a user runs, [0.1, 60] (default 2).
    #[serde(deserialize_with = "lease_seconds")]
    pub lease_seconds: f64,
}

/// `backend_config.postgres.coherence`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Coherence {
    /// Read leases revoked by every write: a warm read runs no statement.
    #[default]
    Lease,
    /// The user's row read on every load.
    RevisionCheck,
}

impl Coherence {
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
pub struct TlsConfig {
    /// `disable` (default), `require` or `verify-full`.
    pub mode: TlsMode,
    /// PEM file of the certificate authority, required for `verify-full`.
    #[serde(deserialize_with = "non_empty")]
    pub ca_file: Option<String>,
}

impl TlsConfig {
    /// The one CA-file rule, for the loader and for [`PostgresConfig::validate`]: a CA file is
    /// only given to the mode that reads it (one that would silently not be checked is a trap).
    /// `section` is the key of the `postgres` block, as the caller names it.
    fn check_ca_file(&self, section: &str) -> Result<(), ConfigError> {
        if self.mode != TlsMode::VerifyFull && self.ca_file.is_some() {
            return Err(ConfigError::new(
                format!("{section}.tls.ca_file"),
                CA_FILE_UNREAD,
            ));
        }
        Ok(())
    }
}

/// How the connection is protected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plain TCP or a Unix socket.
    #[default]
    Disable,
    /// TLS without checking the certificate.
    Require,
    /// TLS with the certificate checked against `ca_file` and the host name.
    VerifyFull,
}

impl TlsMode {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Require => "require",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl Default for PostgresConfig {
    fn default() -> Self {
        Self {
            url: ConfigSecret::default(),
            pool_size: 8,
            schema: "deermem".into(),
            connect_timeout_seconds: 10.0,
            statement_timeout_seconds: 30.0,
            tls: TlsConfig::default(),
            coherence: Coherence::default(),
            lease_seconds: 2.0,
        }
    }
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

/// The one range rule of the timeouts: seconds in (0, 86400].
fn timeout_in_range(f: f64) -> bool {
    f.is_finite() && f > 0.0 && f <= 86_400.0
}

/// The one range rule of the read lease: seconds in [`MIN_LEASE_SECONDS`, `MAX_LEASE_SECONDS`].
fn lease_in_range(f: f64) -> bool {
    f.is_finite() && (MIN_LEASE_SECONDS..=MAX_LEASE_SECONDS).contains(&f)
}

fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let f = lax::float(d)?;
    if timeout_in_range(f) {
        Ok(f)
    } else {
        Err(serde::de::Error::custom(format!(
            "must be a number of seconds in (0, 86400] (got {f})"
        )))
    }
}

fn lease_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let f = lax::float(d)?;
    if lease_in_range(f) {
        Ok(f)
    } else {
        Err(serde::de::Error::custom(format!(
            "must be a number of seconds in [{MIN_LEASE_SECONDS}, {MAX_LEASE_SECONDS}] (got {f})"
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
fn check_schema_name(s: &str) -> Result<(), ConfigError> {
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

/// The shortest lease `lease_seconds` accepts.
pub const MIN_LEASE_SECONDS: f64 = 0.1;
/// The longest lease `lease_seconds` accepts.
pub const MAX_LEASE_SECONDS: f64 = 60.0;

impl PostgresConfig {
    /// Settings for `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: ConfigSecret::new(url),
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
    /// unknown one, then whatever [`PostgresConfig::validate`] reports.
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
                        "disable" | "allow" | "prefer" => TlsMode::Disable,
                        "require" => TlsMode::Require,
                        "verify-full" => TlsMode::VerifyFull,
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
        settings.url = ConfigSecret::new(if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        });
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

    /// Reads the block as the configuration loader does (the keys named
    /// `memory.backend_config.postgres.<key>` in errors), without requiring a URL: a block
    /// next to another storage class is read and checked but not used.
    ///
    /// # Errors
    /// A key of a wrong type or out of range, or an unknown key.
    pub fn from_section(section: &Value) -> Result<Self, ConfigError> {
        Ok(lax::deserialize::<Self>(section, SECTION)?.0)
    }

    /// The block of a configuration that selects this storage (`storage_class: postgres`),
    /// checked at load time: [`PostgresConfig::from_section`], then a URL is required (it may
    /// still be a `$VAR` reference) and a CA file is only given to the mode that reads it.
    ///
    /// # Errors
    /// As [`PostgresConfig::from_section`]; `memory.backend_config.postgres.url` when the block
    /// or its URL is missing; `…postgres.tls.ca_file` for an unread CA file.
    pub fn from_selected_section(section: Option<&Value>) -> Result<Self, ConfigError> {
        let settings = match section {
            Some(v) if !v.is_null() => Self::from_section(v)?,
            _ => Self::default(),
        };
        if settings.url.expose().trim().is_empty() {
            return Err(ConfigError::new(
                format!("{SECTION}.url"),
                "is required with storage_class: postgres (a postgres:// URL, or $DATABASE_URL to read it from the environment)",
            ));
        }
        settings.tls.check_ca_file(SECTION)?;
        Ok(settings)
    }

    /// Checks what the loader checks, for settings built in code, and what needs the whole
    /// block: a URL is set, and a CA file is only given to the mode that reads it.
    ///
    /// # Errors
    /// The offending key, e.g. `postgres.pool_size`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| ConfigError::new(format!("postgres.{key}"), message);
        if self.url.expose().trim().is_empty() {
            return Err(bad("url", "is empty".into()));
        }
        if !(1..=MAX_POOL_SIZE).contains(&self.pool_size) {
            return Err(bad(
                "pool_size",
                format!("must be between 1 and {}", MAX_POOL_SIZE),
            ));
        }
        check_schema_name(&self.schema)?;
        for (key, v) in [
            ("connect_timeout_seconds", self.connect_timeout_seconds),
            ("statement_timeout_seconds", self.statement_timeout_seconds),
        ] {
            if !timeout_in_range(v) {
                return Err(bad(key, "must be a number of seconds in (0, 86400]".into()));
            }
        }
        if !lease_in_range(self.lease_seconds) {
            return Err(bad(
                "lease_seconds",
                format!(
                    "must be a number of seconds in [{MIN_LEASE_SECONDS}, {MAX_LEASE_SECONDS}]"
                ),
            ));
        }
        self.tls.check_ca_file("postgres")
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
        assert_eq!(c.tls.mode, TlsMode::VerifyFull);
        assert_eq!(c.tls.ca_file, None);
    }

    #[test]
    fn from_url_reads_the_libpq_tls_parameters() {
        let c = PostgresConfig::from_url("postgres://u:pw@h:5433/db").unwrap();
        assert_eq!(c.url.expose(), "postgres://u:pw@h:5433/db");
        assert_eq!(c.tls, TlsConfig::default());
        assert_eq!(c.schema, "deermem");
        let c = PostgresConfig::from_url(
            "postgresql://u@h/db?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem",
        )
        .unwrap();
        assert_eq!(c.url.expose(), "postgresql://u@h/db?application_name=x");
        assert_eq!(c.tls.mode, TlsMode::VerifyFull);
        assert_eq!(c.tls.ca_file, Some("/etc/ca x.pem".to_owned()));
        let c = PostgresConfig::from_url("postgres://u@h/db?sslmode=require").unwrap();
        assert_eq!(
            (c.url.expose(), c.tls.mode),
            ("postgres://u@h/db", TlsMode::Require)
        );
        let c = PostgresConfig::from_url("postgres://u@h/db?sslmode=prefer").unwrap();
        assert_eq!(c.tls.mode, TlsMode::Disable);
        let c = PostgresConfig::from_url("host=h user=u sslmode=disable").unwrap();
        assert_eq!(c.url.expose(), "host=h user=u sslmode=disable");
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

    #[test]
    fn debug_and_serialize_never_show_the_url() {
        let s = PostgresConfig::new("postgres://user:hunter2@db.internal/mem");
        let shown = format!("{s:?}");
        let json = serde_json::to_string(&s).unwrap();
        for text in [shown, json] {
            assert!(
                !text.contains("hunter2") && !text.contains("db.internal"),
                "{text}"
            );
        }
    }

    /// The display form of a block as the loader reads it: the URL (a password in it, a
    /// key=value string, a `$VAR` reference alike) is `"***"`, every other key its value or
    /// default.
    #[test]
    fn the_display_never_shows_the_url() {
        for url in [
            "postgres://deermem:pw-DISTINCT-0c9d@db-DISTINCT.internal:5432/memory?sslpassword=DISTINCT",
            "host=db-DISTINCT.internal user=u password=pw-DISTINCT-0c9d",
        ] {
            let c = PostgresConfig::from_selected_section(Some(&json!({
                "url": url, "pool_size": "4",
                "tls": {"mode": "verify-full", "ca_file": "/etc/ca.pem"},
            })))
            .unwrap();
            let shown = serde_json::to_value(&c).unwrap();
            let text = shown.to_string();
            assert!(!text.contains("DISTINCT"), "{text}");
            assert_eq!(shown["url"], "***");
            assert_eq!(shown["pool_size"], 4);
            assert_eq!(
                shown["tls"],
                json!({"mode": "verify-full", "ca_file": "/etc/ca.pem"})
            );
            assert_eq!(shown["coherence"], "lease", "defaults are shown");
        }
    }

    /// The block as the loader reads it next to `storage_class: postgres` (moved here with the
    /// keys from the core's `backend_config` tests).
    #[test]
    fn the_selected_section_is_read_and_checked_at_load() {
        let read = |v: Value| PostgresConfig::from_selected_section(Some(&v));
        let p = read(
            json!({"url": "postgres://u:pw@h/db", "pool_size": "4", "connect_timeout_seconds": 2}),
        )
        .unwrap();
        assert_eq!((p.pool_size, p.schema.as_str()), (4, "deermem"));
        assert_eq!(p.connect_timeout_seconds, 2.0);
        assert_eq!(p.tls.mode, TlsMode::Disable);
        assert_eq!((p.coherence, p.lease_seconds), (Coherence::Lease, 2.0));
        let p = read(json!({"url": "x", "coherence": "revision_check", "lease_seconds": "0.5"}))
            .unwrap();
        assert_eq!(
            (p.coherence, p.lease_seconds),
            (Coherence::RevisionCheck, 0.5)
        );
        assert_eq!(
            PostgresConfig::from_selected_section(None).unwrap_err().key,
            "memory.backend_config.postgres.url"
        );
        let refused = [
            (json!({"url": " "}), "url"),
            (json!({"url": "x", "pool_size": 0}), "pool_size"),
            (json!({"url": "x", "lease_seconds": 0}), "lease_seconds"),
            (json!({"url": "x", "coherence": "x"}), "coherence"),
            (json!({"url": "x", "pool_size": 257}), "pool_size"),
            (json!({"url": "x", "schema": "a\"; DROP"}), "schema"),
            (
                json!({"url": "x", "statement_timeout_seconds": 0}),
                "statement_timeout_seconds",
            ),
            (
                json!({"url": "x", "tls": {"mode": "sometimes"}}),
                "tls.mode",
            ),
            (
                json!({"url": "x", "tls": {"mode": "require", "ca_file": "/ca.pem"}}),
                "tls.ca_file",
            ),
        ];
        for (v, key) in refused {
            let err = read(v.clone()).expect_err(&format!("{v} must fail"));
            assert_eq!(
                err.key,
                format!("memory.backend_config.postgres.{key}"),
                "{v}: {err}"
            );
        }
        let err = read(json!({"url": "x", "pool": 3})).unwrap_err();
        assert_eq!(err.key, "memory.backend_config.postgres");
        // The URL never appears in an error, even a type error next to it.
        let err =
            read(json!({"url": "postgres://u:hunter2@h/db", "pool_size": "many"})).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        // Next to another storage class the block is read (its keys checked), the URL not required.
        assert!(PostgresConfig::from_section(&json!({"pool_size": 3})).is_ok());
        assert!(PostgresConfig::from_section(&json!({"pool_size": 0})).is_err());
    }
}
