//! The `gateway:` configuration section: bind address, authentication (none or bearer tokens,
//! plus the internal-caller token), body size limit and request timeout.
//!
//! Secrets (bearer tokens, the internal token) never appear in `Debug` output, and unknown keys
//! are errors: a typo in a security setting must not silently fall back to a weaker default.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use deermem_core::ids::safe_user_id;
use deermem_core::{ConfigError, UserId};
use serde_json::{Map, Value};

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

const GATEWAY_KEYS: [&str; 4] = ["bind", "auth", "max_body_bytes", "request_timeout_seconds"];
const AUTH_KEYS: [&str; 5] = [
    "mode",
    "tokens",
    "tokens_file",
    "internal_token",
    "allow_unauthenticated_remote",
];

/// How callers authenticate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuthMode {
    /// No authentication: every caller is user `default`. Only loopback addresses are served
    /// unless `allow_unauthenticated_remote` is set.
    #[default]
    None,
    /// Bearer tokens, each mapped to one user.
    Token,
}

impl AuthMode {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Token => "token",
        }
    }
}

/// A secret string that never prints itself.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself (compare it with [`crate::auth::constant_time_eq`]).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
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
    pub internal_token: Option<Secret>,
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
            .field(
                "allow_unauthenticated_remote",
                &self.allow_unauthenticated_remote,
            )
            .finish()
    }
}

/// The `gateway:` section.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayConfig {
    /// Listen address (`deermem serve --bind` overrides it).
    pub bind: SocketAddr,
    /// Authentication.
    pub auth: AuthConfig,
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// Per-request time budget; slower requests get 504.
    pub request_timeout: Duration,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            bind: DEFAULT_BIND,
            auth: AuthConfig::default(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_timeout: Duration::from_secs_f64(DEFAULT_REQUEST_TIMEOUT_SECONDS),
        }
    }
}

impl GatewayConfig {
    /// Reads `root["gateway"]` from a whole (env-resolved) configuration document, such as
    /// [`deermem_core::LoadedConfig::root`]. A missing section gives the defaults (no auth,
    /// loopback). A relative `tokens_file` is resolved against the current directory; use
    /// [`GatewayConfig::from_root_in`] to resolve it against the config file's folder.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key (`gateway.auth.mode`...), an unreadable or malformed
    /// tokens file (named, with the line number; the token itself is never shown).
    pub fn from_root(root: &Value) -> Result<Self, ConfigError> {
        Self::from_root_in(root, None)
    }

    /// As [`GatewayConfig::from_root`], resolving a relative `tokens_file` against `base_dir`
    /// (normally the folder of the configuration file).
    ///
    /// # Errors
    /// As [`GatewayConfig::from_root`].
    pub fn from_root_in(root: &Value, base_dir: Option<&Path>) -> Result<Self, ConfigError> {
        let section = match root {
            Value::Object(m) => m.get("gateway").cloned().unwrap_or(Value::Null),
            Value::Null => Value::Null,
            _ => return Err(ConfigError::new("config", "must be a mapping")),
        };
        let map = match section {
            Value::Null => return Ok(Self::default()),
            Value::Object(m) => m,
            _ => return Err(ConfigError::new("gateway", "must be a mapping")),
        };
        reject_unknown(&map, &GATEWAY_KEYS, "gateway")?;
        let mut cfg = Self::default();
        if let Some(v) = present(&map, "bind") {
            let s = v.as_str().ok_or_else(|| {
                ConfigError::new("gateway.bind", "must be a string like 127.0.0.1:8765")
            })?;
            cfg.bind = parse_bind(s).map_err(|m| ConfigError::new("gateway.bind", m))?;
        }
        if let Some(v) = present(&map, "max_body_bytes") {
            let n = v.as_u64().ok_or_else(|| {
                ConfigError::new(
                    "gateway.max_body_bytes",
                    format!("must be a positive integer (got {v})"),
                )
            })?;
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if !(MIN_MAX_BODY_BYTES..=MAX_MAX_BODY_BYTES).contains(&n) {
                return Err(ConfigError::new(
                    "gateway.max_body_bytes",
                    format!(
                        "must be between {MIN_MAX_BODY_BYTES} and {MAX_MAX_BODY_BYTES} (got {n})"
                    ),
                ));
            }
            cfg.max_body_bytes = n;
        }
        if let Some(v) = present(&map, "request_timeout_seconds") {
            let f = v.as_f64().filter(|f| f.is_finite()).ok_or_else(|| {
                ConfigError::new(
                    "gateway.request_timeout_seconds",
                    format!("must be a number (got {v})"),
                )
            })?;
            if !(f > 0.0 && f <= MAX_REQUEST_TIMEOUT_SECONDS) {
                return Err(ConfigError::new(
                    "gateway.request_timeout_seconds",
                    format!(
                        "must be greater than 0 and at most {MAX_REQUEST_TIMEOUT_SECONDS} (got {f})"
                    ),
                ));
            }
            cfg.request_timeout = Duration::from_secs_f64(f);
        }
        if let Some(v) = present(&map, "auth") {
            cfg.auth = parse_auth(v, base_dir)?;
        }
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
    /// A message explaining how to enable authentication.
    pub fn check_bind_allowed(&self, addr: &SocketAddr) -> Result<(), String> {
        if self.auth.mode == AuthMode::None
            && !self.auth.allow_unauthenticated_remote
            && !addr.ip().is_loopback()
        {
            return Err(format!(
                "refusing to serve {addr} without authentication: set gateway.auth.mode: token \
                 (with tokens or tokens_file), bind a loopback address such as 127.0.0.1, or set \
                 gateway.auth.allow_unauthenticated_remote: true to accept the risk"
            ));
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

fn present<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn reject_unknown(m: &Map<String, Value>, known: &[&str], prefix: &str) -> Result<(), ConfigError> {
    let unknown: Vec<&str> = m
        .keys()
        .map(String::as_str)
        .filter(|k| !known.contains(k))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::new(
            prefix,
            format!("unknown key(s) {unknown:?}; known keys are {known:?}"),
        ))
    }
}

/// Parses a listen address; `localhost:PORT` means `127.0.0.1:PORT`.
fn parse_bind(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Some(port) = s.strip_prefix("localhost:")
        && let Ok(p) = port.parse::<u16>()
    {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p));
    }
    Err(format!(
        "must be an IP address and port such as 127.0.0.1:8765 (got {s:?})"
    ))
}

fn parse_auth(v: &Value, base_dir: Option<&Path>) -> Result<AuthConfig, ConfigError> {
    let map = v
        .as_object()
        .ok_or_else(|| ConfigError::new("gateway.auth", "must be a mapping"))?;
    reject_unknown(map, &AUTH_KEYS, "gateway.auth")?;
    let mut auth = AuthConfig::default();
    if let Some(m) = present(map, "mode") {
        auth.mode = match m.as_str() {
            Some("none") => AuthMode::None,
            Some("token") => AuthMode::Token,
            _ => {
                return Err(ConfigError::new(
                    "gateway.auth.mode",
                    format!("must be 'none' or 'token' (got {m})"),
                ));
            }
        };
    }
    if let Some(t) = present(map, "tokens") {
        let tm = t.as_object().ok_or_else(|| {
            ConfigError::new(
                "gateway.auth.tokens",
                "must be a mapping of token to user id",
            )
        })?;
        for (tok, user) in tm {
            let user = user.as_str().ok_or_else(|| {
                ConfigError::new(
                    "gateway.auth.tokens",
                    "every token must map to a user id string",
                )
            })?;
            insert_token(&mut auth, tok, user, "gateway.auth.tokens")?;
        }
    }
    if let Some(f) = present(map, "tokens_file") {
        let raw = f.as_str().filter(|s| !s.trim().is_empty()).ok_or_else(|| {
            ConfigError::new("gateway.auth.tokens_file", "must be a non-empty path")
        })?;
        let mut path = PathBuf::from(raw);
        if path.is_relative()
            && let Some(base) = base_dir
        {
            path = base.join(path);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ConfigError::new(
                "gateway.auth.tokens_file",
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        parse_tokens_file(&text, &path, &mut auth)?;
        auth.tokens_file = Some(path);
    }
    if let Some(t) = present(map, "internal_token") {
        let s = t
            .as_str()
            .ok_or_else(|| ConfigError::new("gateway.auth.internal_token", "must be a string"))?;
        if !s.is_empty() {
            validate_token_text(s)
                .map_err(|m| ConfigError::new("gateway.auth.internal_token", m))?;
            auth.internal_token = Some(Secret::new(s));
        }
    }
    if let Some(b) = present(map, "allow_unauthenticated_remote") {
        auth.allow_unauthenticated_remote = b.as_bool().ok_or_else(|| {
            ConfigError::new(
                "gateway.auth.allow_unauthenticated_remote",
                "must be true or false",
            )
        })?;
    }
    if auth.mode == AuthMode::Token && auth.tokens.is_empty() && auth.internal_token.is_none() {
        return Err(ConfigError::new(
            "gateway.auth",
            "mode is 'token' but no tokens are configured (set tokens, tokens_file or internal_token)",
        ));
    }
    Ok(auth)
}

fn validate_token_text(tok: &str) -> Result<(), String> {
    if tok.is_empty() {
        return Err("a token must not be empty".into());
    }
    if tok.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("a token must not contain whitespace or control characters".into());
    }
    if tok.len() > 4096 {
        return Err("a token must be at most 4096 bytes".into());
    }
    Ok(())
}

fn insert_token(
    auth: &mut AuthConfig,
    tok: &str,
    user: &str,
    key: &str,
) -> Result<(), ConfigError> {
    validate_token_text(tok).map_err(|m| ConfigError::new(key, m))?;
    let user_id = safe_user(user).map_err(|m| ConfigError::new(key, m))?;
    // The raw id lands in the same bucket; one too long to be its own id keeps the safe one.
    let raw = UserId::new(user.trim()).unwrap_or_else(|_| user_id.clone());
    let tokens = &mut auth.tokens;
    match tokens.get(tok) {
        Some(existing) if existing != &user_id => Err(ConfigError::new(
            key,
            format!(
                "one token is mapped to two users ({} and {})",
                existing.as_str(),
                user_id.as_str()
            ),
        )),
        _ => {
            tokens.insert(tok.to_owned(), user_id);
            auth.token_users.insert(tok.to_owned(), raw);
            Ok(())
        }
    }
}

/// A user id made safe exactly like the owner header: `safe_user_id`, then validated.
pub(crate) fn safe_user(raw: &str) -> Result<UserId, String> {
    let safe = safe_user_id(raw.trim()).map_err(|e| e.to_string())?;
    UserId::new(safe).map_err(|e| e.to_string())
}

/// Parses a tokens file: one `token user` per line, `#` comments and blank lines ignored.
fn parse_tokens_file(text: &str, path: &Path, auth: &mut AuthConfig) -> Result<(), ConfigError> {
    let key = "gateway.auth.tokens_file";
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(tok), Some(user), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(ConfigError::new(
                key,
                format!(
                    "{}:{}: expected `token user` (two fields separated by spaces)",
                    path.display(),
                    n + 1
                ),
            ));
        };
        insert_token(auth, tok, user, key).map_err(|e| {
            ConfigError::new(key, format!("{}:{}: {}", path.display(), n + 1, e.message))
        })?;
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
        assert!(err.contains("gateway.auth.mode: token"), "{err}");
        cfg.auth.allow_unauthenticated_remote = true;
        assert!(cfg.check_bind_allowed(&remote).is_ok());
        let tok = GatewayConfig::with_tokens([("t", "alice")]).unwrap();
        assert!(tok.check_bind_allowed(&remote).is_ok());
    }
}
