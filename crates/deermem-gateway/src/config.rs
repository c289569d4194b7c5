//! The `gateway:` configuration section: bind address, authentication (none, bearer tokens or
//! DeerFlow's session cookie, plus the internal-caller token), the host names the
//! unauthenticated mode also answers, CORS, body size limit and request timeout.
//!
//! Secrets (bearer tokens, the internal token) never appear in `Debug` output, and unknown keys
//! are errors: a typo in a security setting must not silently fall back to a weaker default.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use deermem_core::config::{ConfigSecret, lax};
use deermem_core::ids::{refuse_derived_bucket, safe_user_id};
use deermem_core::{ConfigError, IdError, UserId};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// The default listen address: loopback only.
pub const DEFAULT_BIND: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8765);
/// The default request body limit (2 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
/// The default per-request timeout in seconds.
pub const DEFAULT_REQUEST_TIMEOUT_SECONDS: f64 = 30.0;
/// The smallest accepted body limit.
pub const MIN_MAX_BODY_BYTES: usize = 1024;
/// The largest accepted body limit (256 MiB).
pub const MAX_MAX_BODY_BYTES: usize = 256 * 1024 * 1024;
/// The largest accepted request timeout in seconds.
pub const MAX_REQUEST_TIMEOUT_SECONDS: f64 = 3600.0;
/// The default `max_bulk_requests_per_user`.
pub const DEFAULT_MAX_BULK_REQUESTS_PER_USER: usize = 2;
/// The default `max_bulk_requests`.
pub const DEFAULT_MAX_BULK_REQUESTS: usize = 4;
/// The largest accepted `max_bulk_requests_per_user` / `max_bulk_requests`.
pub const MAX_BULK_REQUESTS: usize = 1024;

/// How callers authenticate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// No authentication: every caller is user `default`. Only loopback addresses are served
    /// unless `allow_unauthenticated_remote` is set.
    #[default]
    None,
    /// Bearer tokens, each mapped to one user.
    Token,
    /// DeerFlow's session cookie (`access_token`, an HS256 JWT signed with DeerFlow's
    /// `AUTH_JWT_SECRET`): the caller is the token's `sub`. Bearer tokens and the internal
    /// token work beside it.
    DeerflowSession,
}

impl AuthMode {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Token => "token",
            Self::DeerflowSession => "deerflow_session",
        }
    }
}

/// The `gateway.auth` section.
#[derive(Clone, Default, PartialEq)]
pub struct AuthConfig {
    /// `none` or `token`.
    pub mode: AuthMode,
    /// Bearer token → user id (already made safe with `safe_user_id`).
    pub tokens: BTreeMap<String, UserId>,
    /// Bearer token → the user id as configured (the raw id, trimmed), for hosts that record
    /// the raw id as stdio callers do (the MCP server). Same bucket as in `tokens`.
    pub token_users: BTreeMap<String, UserId>,
    /// Where the `tokens_file` entries came from, for messages.
    pub tokens_file: Option<PathBuf>,
    /// The shared secret internal callers send in `X-DeerFlow-Internal-Token`; only then is
    /// `X-DeerFlow-Owner-User-Id` honoured.
    pub internal_token: Option<ConfigSecret>,
    /// DeerFlow's `AUTH_JWT_SECRET` (`jwt_secret`, or the contents of `jwt_secret_file`): the
    /// key session cookies are verified with in `deerflow_session` mode.
    pub jwt_secret: Option<ConfigSecret>,
    /// Where `jwt_secret` was read from, for messages.
    pub jwt_secret_file: Option<PathBuf>,
    /// Host names (lowercase, without scheme or port) that `none` mode answers besides the
    /// loopback names, in `Host` and in `Origin`: the name a proxy or `/etc/hosts` gives the
    /// local app (`deerflow.test`).
    pub allowed_hosts: Vec<String>,
    /// Serve non-loopback addresses even in `none` mode.
    pub allow_unauthenticated_remote: bool,
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let users: Vec<&str> = self.tokens.values().map(UserId::as_str).collect();
        f.debug_struct("AuthConfig")
            .field("mode", &self.mode)
            .field(
                "tokens",
                &format_args!("<{} token(s) for {users:?}>", self.tokens.len()),
            )
            .field("tokens_file", &self.tokens_file)
            .field(
                "internal_token",
                &self.internal_token.as_ref().map(|_| "***"),
            )
            .field("jwt_secret", &self.jwt_secret.as_ref().map(|_| "***"))
            .field("jwt_secret_file", &self.jwt_secret_file)
            .field("allowed_hosts", &self.allowed_hosts)
            .field(
                "allow_unauthenticated_remote",
                &self.allow_unauthenticated_remote,
            )
            .finish()
    }
}

/// The `gateway.cors` section: browsers on these origins may call the gateway directly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CorsConfig {
    /// Origins as browsers send them (`scheme://host[:port]`, lowercase, default port left
    /// out), or `*` (only without credentials).
    pub allowed_origins: Vec<String>,
    /// Whether the browser may send cookies (`Access-Control-Allow-Credentials: true`): needed
    /// for DeerFlow's session cookie.
    pub allow_credentials: bool,
}

impl CorsConfig {
    /// Whether `origin` (an `Origin` header value) is one of the allowed origins (`*` allows
    /// every origin).
    pub fn allows(&self, origin: &str) -> bool {
        self.matching(origin).is_some()
    }

    /// The configured entry that allows `origin` (the normalised origin, or `*`), if any.
    pub fn matching(&self, origin: &str) -> Option<&str> {
        let given = normalize_origin(origin).ok();
        self.allowed_origins
            .iter()
            .find(|o| *o == "*" || given.as_deref() == Some(o.as_str()))
            .map(String::as_str)
    }
}

/// The `gateway:` section.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayConfig {
    /// Listen address (`deermem serve --bind` overrides it).
    pub bind: SocketAddr,
    /// Authentication.
    pub auth: AuthConfig,
    /// Cross-origin access for browsers (off when `None`).
    pub cors: Option<CorsConfig>,
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// Per-request time budget; slower requests get 504.
    pub request_timeout: Duration,
    /// Connection handling (`gateway.server`): timeouts, the connection cap, the drain.
    pub server: ServerConfig,
    /// Whole-document imports and exports one user may run at once; more get 429.
    pub max_bulk_requests_per_user: usize,
    /// Whole-document imports and exports running at once for everyone; more get 503.
    pub max_bulk_requests: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            bind: DEFAULT_BIND,
            auth: AuthConfig::default(),
            cors: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_timeout: Duration::from_secs_f64(DEFAULT_REQUEST_TIMEOUT_SECONDS),
            server: ServerConfig::default(),
            max_bulk_requests_per_user: DEFAULT_MAX_BULK_REQUESTS_PER_USER,
            max_bulk_requests: DEFAULT_MAX_BULK_REQUESTS,
        }
    }
}

impl GatewayConfig {
    /// Reads `root["gateway"]` from a whole (env-resolved) configuration document, such as
    /// the `root` of a `deermem::LoadedConfig`. A missing section gives the defaults (no auth,
    /// loopback). A relative `tokens_file` or `jwt_secret_file` is resolved against the current
    /// directory; use [`GatewayConfig::from_root_in`] to resolve it against the config file's
    /// folder.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key (`gateway.auth.mode`...), an unreadable or malformed
    /// tokens file (named, with the line number; the token itself is never shown), an
    /// unreadable or empty JWT secret file.
    pub fn from_root(root: &Value) -> Result<Self, ConfigError> {
        Self::from_root_in(root, None)
    }

    /// As [`GatewayConfig::from_root`], resolving a relative `tokens_file` or `jwt_secret_file`
    /// against `base_dir` (normally the folder of the configuration file).
    ///
    /// # Errors
    /// As [`GatewayConfig::from_root`].
    pub fn from_root_in(root: &Value, base_dir: Option<&Path>) -> Result<Self, ConfigError> {
        let section = match root {
            Value::Object(m) => m.get("gateway").unwrap_or(&Value::Null),
            Value::Null => &Value::Null,
            _ => return Err(ConfigError::new("config", "must be a mapping")),
        };
        if section.is_null() {
            return Ok(Self::default());
        }
        let (s, _) = lax::deserialize::<Section>(section, "gateway")?;
        let d = Self::default();
        Ok(Self {
            bind: s.bind.unwrap_or(d.bind),
            auth: s.auth.build(base_dir)?,
            cors: s.cors.map(CorsSection::build).transpose()?,
            max_body_bytes: s.max_body_bytes.unwrap_or(d.max_body_bytes),
            request_timeout: s.request_timeout_seconds.unwrap_or(d.request_timeout),
            server: s.server.unwrap_or(d.server),
            max_bulk_requests_per_user: s
                .max_bulk_requests_per_user
                .unwrap_or(d.max_bulk_requests_per_user),
            max_bulk_requests: s.max_bulk_requests.unwrap_or(d.max_bulk_requests),
        })
    }

    /// A configuration with DeerFlow session-cookie authentication verified with `secret`
    /// (handy for hosts and tests).
    ///
    /// # Errors
    /// An empty secret.
    pub fn with_deerflow_session(secret: &str) -> Result<Self, ConfigError> {
        let mut cfg = Self::default();
        cfg.auth.mode = AuthMode::DeerflowSession;
        cfg.auth.jwt_secret = Some(jwt_secret(secret, None, "gateway.auth.jwt_secret")?);
        Ok(cfg)
    }

    /// A configuration with bearer-token authentication (handy for hosts and tests).
    ///
    /// # Errors
    /// A user id that cannot be made safe (empty, NUL, too long), or an invalid token.
    pub fn with_tokens<'a>(
        tokens: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ConfigError> {
        let mut cfg = Self::default();
        cfg.auth.mode = AuthMode::Token;
        for (tok, user) in tokens {
            insert_token(&mut cfg.auth, tok, user, "gateway.auth.tokens")?;
        }
        Ok(cfg)
    }

    /// Checks that the gateway may serve on `addr`: in `none` mode only loopback addresses are
    /// allowed unless `allow_unauthenticated_remote` is set.
    ///
    /// # Errors
    /// [`UnauthenticatedRemote`], whose message explains how to enable authentication.
    pub fn check_bind_allowed(&self, addr: &SocketAddr) -> Result<(), UnauthenticatedRemote> {
        if self.loopback_only() && !addr.ip().is_loopback() {
            return Err(UnauthenticatedRemote { addr: *addr });
        }
        Ok(())
    }

    /// Whether requests must come from a loopback `Host`/`Origin` (unauthenticated mode
    /// without `allow_unauthenticated_remote`): the defence against DNS rebinding and
    /// cross-site requests from a browser on the same machine.
    pub fn loopback_only(&self) -> bool {
        self.auth.mode == AuthMode::None && !self.auth.allow_unauthenticated_remote
    }
}

/// The `gateway.server` section: how connections are held and let go. `deermem serve` and
/// `deermem mcp --bind` both use it.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Time a client has to send a complete request head, counted from the connection's
    /// accept for its first request and from the head's first byte for later ones. A partial
    /// head is then answered 408, a connection that sent nothing is closed.
    #[serde(
        rename = "header_read_timeout_seconds",
        deserialize_with = "server_seconds"
    )]
    pub header_read_timeout: Duration,
    /// Time a kept-alive connection may sit idle (no request in flight, nothing read or
    /// written) before it is closed.
    #[serde(
        rename = "keep_alive_timeout_seconds",
        deserialize_with = "server_seconds"
    )]
    pub keep_alive_timeout: Duration,
    /// Most connections served at once; the effective cap is also kept below the process's
    /// descriptor limit. Connections beyond it are answered 503 and closed at once.
    #[serde(deserialize_with = "max_connections")]
    pub max_connections: usize,
    /// After SIGTERM, time in-flight requests get to finish before every connection still
    /// open is closed.
    #[serde(rename = "drain_timeout_seconds", deserialize_with = "server_seconds")]
    pub drain_timeout: Duration,
}

/// The default `gateway.server.header_read_timeout_seconds`.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: f64 = 10.0;
/// The default `gateway.server.keep_alive_timeout_seconds`.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT_SECONDS: f64 = 60.0;
/// The default `gateway.server.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// The default `gateway.server.drain_timeout_seconds`.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: f64 = 10.0;
/// The largest accepted value of each `gateway.server.*_seconds` key.
pub const MAX_SERVER_TIMEOUT_SECONDS: f64 = 3600.0;
/// The largest accepted `gateway.server.max_connections`.
pub const MAX_MAX_CONNECTIONS: usize = 1_000_000;
impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs_f64(DEFAULT_HEADER_READ_TIMEOUT_SECONDS),
            keep_alive_timeout: Duration::from_secs_f64(DEFAULT_KEEP_ALIVE_TIMEOUT_SECONDS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            drain_timeout: Duration::from_secs_f64(DEFAULT_DRAIN_TIMEOUT_SECONDS),
        }
    }
}

// The `gateway:` section is read strictly: no lax coercion (a quoted number or `yes` is an
// error), and an unknown key is an error, not a warning.

/// The `gateway:` section as written; [`GatewayConfig::from_root_in`] builds the runtime form.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Section {
    #[serde(deserialize_with = "bind")]
    bind: Option<SocketAddr>,
    /// Absent, the default section: no authentication.
    auth: AuthSection,
    cors: Option<CorsSection>,
    #[serde(deserialize_with = "max_body_bytes")]
    max_body_bytes: Option<usize>,
    #[serde(deserialize_with = "request_timeout")]
    request_timeout_seconds: Option<Duration>,
    server: Option<ServerConfig>,
    #[serde(deserialize_with = "bulk_limit")]
    max_bulk_requests_per_user: Option<usize>,
    #[serde(deserialize_with = "bulk_limit")]
    max_bulk_requests: Option<usize>,
}

/// `gateway.auth` as written.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct AuthSection {
    mode: AuthMode,
    #[serde(deserialize_with = "tokens")]
    tokens: Vec<(String, String)>,
    tokens_file: Option<String>,
    internal_token: Option<String>,
    jwt_secret: Option<String>,
    jwt_secret_file: Option<String>,
    #[serde(deserialize_with = "allowed_hosts")]
    allowed_hosts: Vec<String>,
    allow_unauthenticated_remote: bool,
}

/// `gateway.cors` as written.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct CorsSection {
    allowed_origins: Value,
    allow_credentials: bool,
}

/// Serving a non-loopback address without authentication, refused by
/// [`GatewayConfig::check_bind_allowed`].
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "refusing to serve {addr} without authentication: set gateway.auth.mode: token (with tokens \
     or tokens_file), bind a loopback address such as 127.0.0.1, or set \
     gateway.auth.allow_unauthenticated_remote: true to accept the risk"
)]
pub struct UnauthenticatedRemote {
    /// The refused listen address.
    pub addr: SocketAddr,
}

/// A listen address; `localhost:PORT` means `127.0.0.1:PORT`.
fn bind<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let v = Value::deserialize(d)?;
    let s = v
        .as_str()
        .ok_or_else(|| D::Error::custom("must be a string like 127.0.0.1:8765"))?
        .trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Some(a));
    }
    if let Some(port) = s.strip_prefix("localhost:")
        && let Ok(p) = port.parse::<u16>()
    {
        return Ok(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)));
    }
    Err(D::Error::custom(format!(
        "must be an IP address and port such as 127.0.0.1:8765 (got {s:?})"
    )))
}

/// A strictly typed number of seconds, greater than 0 and at most `max`.
fn seconds<E: serde::de::Error>(v: &Value, max: f64) -> Result<Duration, E> {
    let f = v
        .as_f64()
        .filter(|f| f.is_finite())
        .ok_or_else(|| E::custom(format!("must be a number (got {v})")))?;
    if !(f > 0.0 && f <= max) {
        return Err(E::custom(format!(
            "must be greater than 0 and at most {max} (got {f})"
        )));
    }
    Ok(Duration::from_secs_f64(f))
}

fn request_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    seconds(&Value::deserialize(d)?, MAX_REQUEST_TIMEOUT_SECONDS).map(Some)
}

fn server_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    seconds(&Value::deserialize(d)?, MAX_SERVER_TIMEOUT_SECONDS)
}

/// A strictly typed integer in `range`, or `message`.
fn uint_in<E: serde::de::Error>(
    v: &Value,
    range: std::ops::RangeInclusive<usize>,
    message: &str,
) -> Result<usize, E> {
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| range.contains(n))
        .ok_or_else(|| E::custom(format!("{message} (got {v})")))
}

fn max_connections<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let message = format!("must be an integer between 1 and {MAX_MAX_CONNECTIONS}");
    uint_in(&Value::deserialize(d)?, 1..=MAX_MAX_CONNECTIONS, &message)
}

fn bulk_limit<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let message = format!("must be an integer from 1 to {MAX_BULK_REQUESTS}");
    uint_in(&Value::deserialize(d)?, 1..=MAX_BULK_REQUESTS, &message).map(Some)
}

fn max_body_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let v = Value::deserialize(d)?;
    uint_in::<D::Error>(&v, 0..=usize::MAX, "must be a positive integer")?;
    let message = format!("must be between {MIN_MAX_BODY_BYTES} and {MAX_MAX_BODY_BYTES}");
    uint_in(&v, MIN_MAX_BODY_BYTES..=MAX_MAX_BODY_BYTES, &message).map(Some)
}

/// The `tokens` mapping, in order, every user a string.
fn tokens<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
    let v = Value::deserialize(d)?;
    let map = v
        .as_object()
        .ok_or_else(|| D::Error::custom("must be a mapping of token to user id"))?;
    map.iter()
        .map(|(tok, user)| {
            user.as_str()
                .map(|u| (tok.clone(), u.to_owned()))
                .ok_or_else(|| D::Error::custom("every token must map to a user id string"))
        })
        .collect()
}

impl AuthSection {
    /// The runtime form: tokens made safe, files read (relative to `base_dir`), the mode's
    /// requirements checked.
    fn build(self, base_dir: Option<&Path>) -> Result<AuthConfig, ConfigError> {
        let mut auth = AuthConfig {
            mode: self.mode,
            allowed_hosts: self.allowed_hosts,
            allow_unauthenticated_remote: self.allow_unauthenticated_remote,
            ..AuthConfig::default()
        };
        for (tok, user) in &self.tokens {
            insert_token(&mut auth, tok, user, "gateway.auth.tokens")?;
        }
        if let Some(f) = &self.tokens_file {
            let (path, text) = read_config_file(f, base_dir, "gateway.auth.tokens_file")?;
            parse_tokens_file(&text, &path, &mut auth)?;
            auth.tokens_file = Some(path);
        }
        if let Some(s) = self.internal_token.filter(|s| !s.is_empty()) {
            validate_token_text(&s, "gateway.auth.internal_token")?;
            auth.internal_token = Some(ConfigSecret::new(s));
        }
        if let Some(s) = &self.jwt_secret {
            auth.jwt_secret = Some(jwt_secret(s, None, "gateway.auth.jwt_secret")?);
        }
        if let Some(f) = &self.jwt_secret_file {
            let key = "gateway.auth.jwt_secret_file";
            if auth.jwt_secret.is_some() {
                return Err(ConfigError::new(
                    key,
                    "set either jwt_secret or jwt_secret_file, not both",
                ));
            }
            let (path, text) = read_config_file(f, base_dir, key)?;
            auth.jwt_secret = Some(jwt_secret(&text, Some(&path), key)?);
            auth.jwt_secret_file = Some(path);
        }
        if auth.mode == AuthMode::Token && auth.tokens.is_empty() && auth.internal_token.is_none() {
            return Err(ConfigError::new(
                "gateway.auth",
                "mode is 'token' but no tokens are configured (set tokens, tokens_file or internal_token)",
            ));
        }
        match (auth.mode, auth.jwt_secret.is_some()) {
            (AuthMode::DeerflowSession, false) => Err(ConfigError::new(
                "gateway.auth",
                "mode is 'deerflow_session' but no jwt_secret or jwt_secret_file is set (use \
                 DeerFlow's AUTH_JWT_SECRET, e.g. jwt_secret: $AUTH_JWT_SECRET)",
            )),
            (AuthMode::None | AuthMode::Token, true) => Err(ConfigError::new(
                "gateway.auth",
                "jwt_secret and jwt_secret_file are only used with mode: deerflow_session",
            )),
            _ => Ok(auth),
        }
    }
}

/// The file a path setting `key` names (relative to `base_dir`, the config file's folder,
/// when relative), and its text.
fn read_config_file(
    raw: &str,
    base_dir: Option<&Path>,
    key: &str,
) -> Result<(PathBuf, String), ConfigError> {
    if raw.trim().is_empty() {
        return Err(ConfigError::new(key, "must be a non-empty path"));
    }
    // Joining keeps an absolute path as it is.
    let path = base_dir.map_or_else(|| PathBuf::from(raw), |base| base.join(raw));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", path.display())))?;
    Ok((path, text))
}

/// DeerFlow's JWT secret: surrounding whitespace (a file's final newline) is not part of it.
fn jwt_secret(raw: &str, file: Option<&Path>, key: &str) -> Result<ConfigSecret, ConfigError> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(ConfigError::new(
            key,
            match file {
                Some(p) => format!("{} is empty", p.display()),
                None => "must not be empty".into(),
            },
        ));
    }
    Ok(ConfigSecret::new(s))
}

/// `allowed_hosts`: bare host names, lowercased, without duplicates.
fn allowed_hosts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Value::deserialize(d)?;
    let items = v
        .as_array()
        .ok_or_else(|| D::Error::custom("must be a list of host names"))?;
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let name = item
            .as_str()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                D::Error::custom(format!("every entry must be a host name (got {item})"))
            })?;
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        let plain = if bare.contains(':') {
            bare.parse::<std::net::Ipv6Addr>().is_ok()
        } else {
            bare.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        };
        if !plain {
            return Err(D::Error::custom(format!(
                "{name:?} is not a host name: give the bare name the browser shows, without \
                 scheme, port or path (e.g. deerflow.test)"
            )));
        }
        let lower = bare.to_ascii_lowercase();
        if !out.contains(&lower) {
            out.push(lower);
        }
    }
    Ok(out)
}

impl CorsSection {
    fn build(self) -> Result<CorsConfig, ConfigError> {
        let key = "gateway.cors.allowed_origins";
        let mut cors = CorsConfig {
            allow_credentials: self.allow_credentials,
            ..CorsConfig::default()
        };
        let items = self
            .allowed_origins
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| {
                ConfigError::new(
                    key,
                    "must list at least one origin such as http://localhost:3000 (leave \
                     gateway.cors out to turn CORS off)",
                )
            })?;
        for item in items {
            let raw = item.as_str().ok_or_else(|| {
                ConfigError::new(key, format!("every entry must be a string (got {item})"))
            })?;
            let origin = if raw.trim() == "*" {
                if cors.allow_credentials {
                    return Err(ConfigError::new(
                        key,
                        "'*' cannot be used with allow_credentials: true (browsers refuse it); \
                         list the origins",
                    ));
                }
                "*".to_owned()
            } else {
                normalize_origin(raw).map_err(|e| ConfigError::new(key, e.to_string()))?
            };
            if !cors.allowed_origins.contains(&origin) {
                cors.allowed_origins.push(origin);
            }
        }
        Ok(cors)
    }
}

/// An origin as browsers serialise it: `scheme://host[:port]`, lowercase, default port left
/// out. Anything with a path, query, fragment or credentials is not an origin.
pub(crate) fn normalize_origin(raw: &str) -> Result<String, OriginError> {
    let raw = raw.trim();
    let url = url::Url::parse(raw).map_err(|source| OriginError::Unparsable {
        raw: raw.to_owned(),
        source,
    })?;
    let is_origin = matches!(url.scheme(), "http" | "https")
        && url.host_str().is_some()
        && url.username().is_empty()
        && url.password().is_none()
        && url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none();
    if !is_origin {
        return Err(OriginError::NotAnOrigin(raw.to_owned()));
    }
    Ok(url.origin().ascii_serialization())
}

/// A configured CORS origin that is not one.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OriginError {
    #[error("{raw:?} is not an origin such as http://localhost:3000 ({source})")]
    Unparsable {
        raw: String,
        source: url::ParseError,
    },
    #[error(
        "{0:?} is not an origin: give scheme, host and port only, such as http://localhost:3000"
    )]
    NotAnOrigin(String),
}

/// The longest token accepted.
const MAX_TOKEN_BYTES: usize = 4096;

/// Checks that a bearer or internal token (set at `key`) can be one.
fn validate_token_text(tok: &str, key: &str) -> Result<(), ConfigError> {
    let why = if tok.is_empty() {
        "a token must not be empty".to_owned()
    } else if tok.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "a token must not contain whitespace or control characters".to_owned()
    } else if tok.len() > MAX_TOKEN_BYTES {
        format!("a token must be at most {MAX_TOKEN_BYTES} bytes")
    } else {
        return Ok(());
    };
    Err(ConfigError::new(key, why))
}

fn insert_token(
    auth: &mut AuthConfig,
    tok: &str,
    user: &str,
    key: &str,
) -> Result<(), ConfigError> {
    validate_token_text(tok, key)?;
    refuse_derived_bucket(user).map_err(|e| ConfigError::new(key, e.to_string()))?;
    let user_id = safe_user(user).map_err(|e| ConfigError::new(key, e.to_string()))?;
    // The raw id lands in the same bucket; one too long to be its own id keeps the safe one.
    let raw = UserId::new(user.trim()).unwrap_or_else(|_| user_id.clone());
    if let Some(existing) = auth.tokens.get(tok).filter(|e| **e != user_id) {
        let (a, b) = (existing.as_str(), user_id.as_str());
        let message = format!("one token is mapped to two users ({a} and {b})");
        return Err(ConfigError::new(key, message));
    }
    auth.tokens.insert(tok.to_owned(), user_id);
    auth.token_users.insert(tok.to_owned(), raw);
    Ok(())
}

/// A user id made safe exactly like the owner header: `safe_user_id`, then validated.
pub(crate) fn safe_user(raw: &str) -> Result<UserId, IdError> {
    UserId::new(safe_user_id(raw.trim())?)
}

/// Parses a tokens file: one `token user` per line, `#` comments and blank lines ignored.
fn parse_tokens_file(text: &str, path: &Path, auth: &mut AuthConfig) -> Result<(), ConfigError> {
    let key = "gateway.auth.tokens_file";
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{}:{}", path.display(), n + 1);
        let mut parts = line.split_whitespace();
        let (Some(tok), Some(user), None) = (parts.next(), parts.next(), parts.next()) else {
            let message = format!("{at}: expected `token user` (two fields separated by spaces)");
            return Err(ConfigError::new(key, message));
        };
        insert_token(auth, tok, user, key)
            .map_err(|e| ConfigError::new(key, format!("{at}: {}", e.message)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn missing_section_gives_secure_defaults() {
        let cfg = GatewayConfig::from_root(&json!({"memory": {}})).unwrap();
        assert_eq!(cfg.bind, DEFAULT_BIND);
        assert_eq!(cfg.auth.mode, AuthMode::None);
        assert!(cfg.loopback_only());
        assert_eq!(cfg.max_body_bytes, 2_097_152);
        assert_eq!(cfg.request_timeout, Duration::from_secs(30));
        assert_eq!(GatewayConfig::from_root(&Value::Null).unwrap(), cfg);
    }

    #[test]
    fn full_section_parses() {
        let cfg = GatewayConfig::from_root(&json!({"gateway": {
            "bind": "0.0.0.0:9000",
            "auth": {"mode": "token", "tokens": {"tok-alice": "alice", "tok-mail": "a@b.com"},
                     "internal_token": "s3cret-internal"},
            "max_body_bytes": 4096,
            "request_timeout_seconds": 2.5
        }}))
        .unwrap();
        assert_eq!(cfg.bind, "0.0.0.0:9000".parse::<SocketAddr>().unwrap());
        assert_eq!(cfg.auth.mode, AuthMode::Token);
        assert_eq!(cfg.auth.tokens["tok-alice"].as_str(), "alice");
        // Token users are made safe like owner headers.
        assert_eq!(
            cfg.auth.tokens["tok-mail"].as_str(),
            "a-b-com-fb98d44ad7501a95"
        );
        // The raw ids are kept beside them, in the same buckets (for the MCP server).
        assert_eq!(cfg.auth.token_users["tok-mail"].as_str(), "a@b.com");
        assert_eq!(
            cfg.auth.token_users["tok-mail"].bucket(),
            cfg.auth.tokens["tok-mail"].bucket()
        );
        assert_eq!(cfg.auth.token_users["tok-alice"].as_str(), "alice");
        assert_eq!(
            cfg.auth.internal_token.as_ref().unwrap().expose(),
            "s3cret-internal"
        );
        assert_eq!(cfg.max_body_bytes, 4096);
        assert_eq!(cfg.request_timeout, Duration::from_millis(2500));
        assert!(!cfg.loopback_only());
    }

    #[test]
    fn bulk_request_limits_parse_and_validate() {
        let cfg = GatewayConfig::default();
        assert_eq!(cfg.max_bulk_requests_per_user, 2);
        assert_eq!(cfg.max_bulk_requests, 4);
        let cfg = GatewayConfig::from_root(&json!({"gateway": {
            "max_bulk_requests_per_user": 1, "max_bulk_requests": 16}}))
        .unwrap();
        assert_eq!(
            (cfg.max_bulk_requests_per_user, cfg.max_bulk_requests),
            (1, 16)
        );
        for (key, bad) in [
            ("max_bulk_requests_per_user", json!(0)),
            ("max_bulk_requests", json!(-1)),
            ("max_bulk_requests", json!(1025)),
            ("max_bulk_requests_per_user", json!("2")),
            ("max_bulk_requests", json!(1.5)),
        ] {
            let err = GatewayConfig::from_root(&json!({"gateway": {key: bad}})).unwrap_err();
            assert_eq!(err.key, format!("gateway.{key}"));
            assert!(err.message.contains("from 1 to 1024"), "{err}");
        }
    }

    #[test]
    fn debug_output_hides_tokens() {
        let cfg = GatewayConfig::from_root(&json!({"gateway": {"auth": {
            "mode": "token", "tokens": {"tok-very-secret": "alice"}, "internal_token": "internal-xyz"}}}))
        .unwrap();
        let dbg = format!("{cfg:?}");
        assert!(!dbg.contains("tok-very-secret"), "{dbg}");
        assert!(!dbg.contains("internal-xyz"), "{dbg}");
        assert!(dbg.contains("alice"), "{dbg}");
    }

    #[test]
    fn typos_and_bad_values_are_errors_naming_the_key() {
        let cases = [
            (
                json!({"gateway": {"auth": {"mdoe": "token"}}}),
                "gateway.auth",
            ),
            (json!({"gateway": {"bnd": "x"}}), "gateway"),
            (
                json!({"gateway": {"auth": {"mode": "basic"}}}),
                "gateway.auth.mode",
            ),
            (
                json!({"gateway": {"auth": {"mode": "token"}}}),
                "gateway.auth",
            ),
            (json!({"gateway": {"bind": "nowhere"}}), "gateway.bind"),
            (
                json!({"gateway": {"max_body_bytes": 10}}),
                "gateway.max_body_bytes",
            ),
            (
                json!({"gateway": {"max_body_bytes": -1}}),
                "gateway.max_body_bytes",
            ),
            (
                json!({"gateway": {"request_timeout_seconds": 0}}),
                "gateway.request_timeout_seconds",
            ),
            (
                json!({"gateway": {"auth": {"tokens": {"a b": "x"}}}}),
                "gateway.auth.tokens",
            ),
            (
                json!({"gateway": {"auth": {"tokens": {"tok": ""}}}}),
                "gateway.auth.tokens",
            ),
            (
                json!({"gateway": {"auth": {"tokens": {"tok": 5}}}}),
                "gateway.auth.tokens",
            ),
            (
                json!({"gateway": {"auth": {"allow_unauthenticated_remote": "yes"}}}),
                "gateway.auth.allow_unauthenticated_remote",
            ),
            (json!({"gateway": 5}), "gateway"),
        ];
        for (root, key) in cases {
            let err = GatewayConfig::from_root(&root).unwrap_err();
            assert_eq!(err.key, key, "{root}: {err}");
        }
    }

    #[test]
    fn deerflow_session_needs_one_secret_and_keeps_it_out_of_debug() {
        let cfg = GatewayConfig::from_root(&json!({"gateway": {"auth": {
            "mode": "deerflow_session", "jwt_secret": "  s3cret-jwt-key\n", "tokens": {"tok-a": "alice"}}}}))
        .unwrap();
        assert_eq!(cfg.auth.mode, AuthMode::DeerflowSession);
        assert_eq!(
            cfg.auth.jwt_secret.as_ref().unwrap().expose(),
            "s3cret-jwt-key"
        );
        assert!(!cfg.loopback_only());
        assert!(!format!("{cfg:?}").contains("s3cret-jwt-key"));
        for (auth, key) in [
            (json!({"mode": "deerflow_session"}), "gateway.auth"),
            (
                json!({"mode": "deerflow_session", "jwt_secret": " "}),
                "gateway.auth.jwt_secret",
            ),
            (
                json!({"mode": "deerflow_session", "jwt_secret": 5}),
                "gateway.auth.jwt_secret",
            ),
            (
                json!({"mode": "token", "tokens": {"t": "a"}, "jwt_secret": "x"}),
                "gateway.auth",
            ),
            (json!({"jwt_secret": "x"}), "gateway.auth"),
            (
                json!({"mode": "deerflow_session", "jwt_secret": "x", "jwt_secret_file": "f"}),
                "gateway.auth.jwt_secret_file",
            ),
        ] {
            let err = GatewayConfig::from_root(&json!({"gateway": {"auth": auth}})).unwrap_err();
            assert_eq!(err.key, key, "{auth}: {err}");
        }
    }

    #[test]
    fn jwt_secret_file_is_read_relative_to_the_config_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("jwt.secret"), "from-a-file\n").unwrap();
        let root = json!({"gateway": {"auth": {"mode": "deerflow_session", "jwt_secret_file": "jwt.secret"}}});
        let cfg = GatewayConfig::from_root_in(&root, Some(dir.path())).unwrap();
        assert_eq!(
            cfg.auth.jwt_secret.as_ref().unwrap().expose(),
            "from-a-file"
        );
        assert_eq!(
            cfg.auth.jwt_secret_file,
            Some(dir.path().join("jwt.secret"))
        );
        std::fs::write(dir.path().join("jwt.secret"), "\n").unwrap();
        let err = GatewayConfig::from_root_in(&root, Some(dir.path())).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
        let err = GatewayConfig::from_root(&root).unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
    }

    #[test]
    fn allowed_hosts_are_bare_lowercase_names() {
        let cfg = GatewayConfig::from_root(&json!({"gateway": {"auth": {
            "allowed_hosts": ["DeerFlow.Test", "deerflow.test", "[::2]", "10.0.0.5"]}}}))
        .unwrap();
        assert_eq!(cfg.auth.allowed_hosts, ["deerflow.test", "::2", "10.0.0.5"]);
        for bad in [
            json!(["http://deerflow.test"]),
            json!(["deerflow.test:3000"]),
            json!(["deerflow.test/x"]),
            json!([""]),
            json!([5]),
            json!("deerflow.test"),
        ] {
            let err =
                GatewayConfig::from_root(&json!({"gateway": {"auth": {"allowed_hosts": bad}}}))
                    .unwrap_err();
            assert_eq!(err.key, "gateway.auth.allowed_hosts", "{bad}: {err}");
        }
    }

    #[test]
    fn cors_origins_are_normalised_like_browsers_send_them() {
        let cfg = GatewayConfig::from_root(&json!({"gateway": {"cors": {
            "allowed_origins": ["HTTP://LocalHost:3000/", "https://app.example:443", "http://[::1]:3000"],
            "allow_credentials": true}}}))
        .unwrap();
        let cors = cfg.cors.unwrap();
        assert_eq!(
            cors.allowed_origins,
            [
                "http://localhost:3000",
                "https://app.example",
                "http://[::1]:3000"
            ]
        );
        assert!(cors.allow_credentials);
        assert!(cors.allows("http://localhost:3000"));
        assert!(!cors.allows("http://localhost:3001"));
        assert!(!cors.allows("null"));
        assert_eq!(GatewayConfig::from_root(&json!({})).unwrap().cors, None);
        let any =
            GatewayConfig::from_root(&json!({"gateway": {"cors": {"allowed_origins": ["*"]}}}))
                .unwrap()
                .cors
                .unwrap();
        assert!(any.allows("https://anything.example") && !any.allow_credentials);
        for (cors, key) in [
            (
                json!({"allowed_origins": []}),
                "gateway.cors.allowed_origins",
            ),
            (json!({}), "gateway.cors.allowed_origins"),
            (
                json!({"allowed_origins": ["http://a.example/app"]}),
                "gateway.cors.allowed_origins",
            ),
            (
                json!({"allowed_origins": ["ftp://a.example"]}),
                "gateway.cors.allowed_origins",
            ),
            (
                json!({"allowed_origins": ["a.example"]}),
                "gateway.cors.allowed_origins",
            ),
            (
                json!({"allowed_origins": ["http://a.example?x=1"]}),
                "gateway.cors.allowed_origins",
            ),
            (
                json!({"allowed_origins": ["*"], "allow_credentials": true}),
                "gateway.cors.allowed_origins",
            ),
            (
                json!({"allowed_origins": ["http://a.example"], "allow_credentials": "yes"}),
                "gateway.cors.allow_credentials",
            ),
            (json!({"origins": ["http://a.example"]}), "gateway.cors"),
            (json!(["http://a.example"]), "gateway.cors"),
        ] {
            let err = GatewayConfig::from_root(&json!({"gateway": {"cors": cors}})).unwrap_err();
            assert_eq!(err.key, key, "{cors}: {err}");
        }
    }

    #[test]
    fn localhost_bind_is_accepted() {
        let cfg =
            GatewayConfig::from_root(&json!({"gateway": {"bind": "localhost:1234"}})).unwrap();
        assert_eq!(cfg.bind, "127.0.0.1:1234".parse::<SocketAddr>().unwrap());
    }

    #[test]
    fn tokens_file_is_read_relative_to_the_config_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokens.txt"),
            "# team tokens\n\ntok-bob bob\n  tok-carol   carol@example.com  \n",
        )
        .unwrap();
        let root = json!({"gateway": {"auth": {"mode": "token", "tokens": {"tok-alice": "alice"},
                                               "tokens_file": "tokens.txt"}}});
        let cfg = GatewayConfig::from_root_in(&root, Some(dir.path())).unwrap();
        assert_eq!(cfg.auth.tokens.len(), 3);
        assert_eq!(cfg.auth.tokens["tok-bob"].as_str(), "bob");
        assert!(
            cfg.auth.tokens["tok-carol"]
                .as_str()
                .starts_with("carol-example-com-")
        );
        assert_eq!(
            cfg.auth.token_users["tok-carol"].as_str(),
            "carol@example.com"
        );
        assert!(
            GatewayConfig::from_root(&root).is_err(),
            "relative to cwd: file absent"
        );
    }

    #[test]
    fn malformed_tokens_file_names_the_line_but_not_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.txt");
        std::fs::write(&path, "ok-token alice\nlonely-secret-token\n").unwrap();
        let root =
            json!({"gateway": {"auth": {"mode": "token", "tokens_file": path.to_str().unwrap()}}});
        let err = GatewayConfig::from_root(&root).unwrap_err().to_string();
        assert!(err.contains("t.txt:2"), "{err}");
        assert!(!err.contains("lonely-secret-token"), "{err}");
        std::fs::write(&path, "tok alice\ntok bob\n").unwrap();
        let err = GatewayConfig::from_root(&root).unwrap_err().to_string();
        assert!(err.contains("two users"), "{err}");
    }

    #[test]
    fn bind_check_refuses_remote_addresses_without_auth() {
        let mut cfg = GatewayConfig::default();
        let remote: SocketAddr = "0.0.0.0:8765".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:8765".parse().unwrap();
        let local6: SocketAddr = "[::1]:8765".parse().unwrap();
        assert!(cfg.check_bind_allowed(&local).is_ok());
        assert!(cfg.check_bind_allowed(&local6).is_ok());
        let err = cfg.check_bind_allowed(&remote).unwrap_err();
        assert_eq!(err.addr, remote);
        let err = err.to_string();
        assert!(err.contains("refusing to serve 0.0.0.0:8765"), "{err}");
        assert!(err.contains("gateway.auth.mode: token"), "{err}");
        cfg.auth.allow_unauthenticated_remote = true;
        assert!(cfg.check_bind_allowed(&remote).is_ok());
        let tok = GatewayConfig::with_tokens([("t", "alice")]).unwrap();
        assert!(tok.check_bind_allowed(&remote).is_ok());
    }
}
