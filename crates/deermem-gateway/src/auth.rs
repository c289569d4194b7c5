//! Caller identity, with the reference's owner resolution: bearer tokens mapped to users,
//! DeerFlow's session cookie (with its CSRF rule, see [`crate::session`]), the internal-caller
//! token that unlocks the owner header, and the loopback `Host`/`Origin` guard of the
//! unauthenticated mode. Every user id is made safe with `safe_user_id`.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use deermem_core::UserId;
use sha2::{Digest, Sha256};

use deermem_core::ids::refuse_derived_bucket;

use crate::config::{AuthMode, GatewayConfig, safe_user};
use crate::error::GatewayError;
use crate::session::{
    SESSION_COOKIE, SessionRejection, SessionVerifier, check_csrf, cookie, is_write,
};
use crate::state::GatewayState;

/// The header internal callers (IM channel workers) authenticate with.
pub const INTERNAL_TOKEN_HEADER: &str = "x-deerflow-internal-token";
/// The header naming the user an internal caller acts for.
pub const OWNER_HEADER: &str = "x-deerflow-owner-user-id";

/// How a caller was identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallerKind {
    /// Authentication is off (`auth.mode: none`): the caller is user `default`.
    Anonymous,
    /// A bearer token.
    Token,
    /// DeerFlow's session cookie (`auth.mode: deerflow_session`).
    Session,
    /// A valid internal token: the owner header, when present, names the user.
    Internal,
}

/// The resolved caller of a request: every manager call of the request is scoped to `user`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The user the request acts for (already safe).
    pub user: UserId,
    /// How the caller was identified.
    pub kind: CallerKind,
}

/// Compares two secrets in time independent of where they differ (and of their lengths: the
/// SHA-256 digests are compared).
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    digest_eq(&digest(a), &digest(b))
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The configured credentials: tokens pre-hashed for constant-time lookup, and the session
/// cookie verifier.
#[derive(Clone)]
pub(crate) struct TokenTable {
    tokens: Vec<([u8; 32], UserId)>,
    internal: Option<[u8; 32]>,
    session: Option<SessionVerifier>,
}

impl std::fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenTable({} token(s))", self.tokens.len())
    }
}

impl TokenTable {
    pub(crate) fn new(cfg: &GatewayConfig) -> Self {
        Self {
            tokens: cfg
                .auth
                .tokens
                .iter()
                .map(|(t, u)| (digest(t), u.clone()))
                .collect(),
            internal: cfg.auth.internal_token.as_ref().map(|s| digest(s.expose())),
            session: cfg.auth.jwt_secret.as_ref().and_then(SessionVerifier::new),
        }
    }

    /// The user of an `Authorization: Bearer <token>` header value; every configured token is
    /// compared, no early exit.
    fn bearer_user(&self, value: &HeaderValue) -> Option<UserId> {
        let given = digest(bearer_token(value.to_str().ok()?)?);
        let found = self.tokens.iter().filter(|(d, _)| digest_eq(d, &given));
        found.fold(None, |_, (_, user)| Some(user.clone()))
    }

    fn internal_matches(&self, token: &str) -> bool {
        let given = digest(token);
        // The same work with or without a configured token.
        let equal = digest_eq(self.internal.as_ref().unwrap_or(&given), &given);
        equal && self.internal.is_some()
    }
}

/// Resolves the caller of a request from its method and headers.
///
/// # Errors
/// 401 without a valid bearer token (token mode), without a valid session cookie (session
/// mode) or with a wrong internal token; 403 for a cookie-authenticated write that fails the
/// CSRF rule, for a `Host`/`Origin` the unauthenticated loopback-only mode does not serve, or
/// for an owner header or session cookie naming the bucket another id is stored in; 400 for an owner header
/// that cannot be a user id.
pub(crate) fn authenticate(
    cfg: &GatewayConfig,
    table: &TokenTable,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Caller, GatewayError> {
    if cfg.loopback_only() {
        check_loopback_request(cfg, headers)?;
    }
    let (user, kind) = match (headers.get(INTERNAL_TOKEN_HEADER), cfg.auth.mode) {
        (Some(raw), _) => {
            if !raw.to_str().is_ok_and(|t| table.internal_matches(t)) {
                return Err(GatewayError::InvalidInternalToken);
            }
            (owner(headers)?, CallerKind::Internal)
        }
        (None, AuthMode::None) => (UserId::default_user(), CallerKind::Anonymous),
        (None, AuthMode::Token) => {
            let bearer = headers.get(axum::http::header::AUTHORIZATION);
            let user = bearer.and_then(|v| table.bearer_user(v));
            (
                user.ok_or(GatewayError::NotAuthenticated)?,
                CallerKind::Token,
            )
        }
        (None, AuthMode::DeerflowSession) => session_caller(table, method, headers)?,
    };
    Ok(Caller { user, kind })
}

/// The user an internal caller acts for: the owner header's, or `default` without one.
fn owner(headers: &HeaderMap) -> Result<UserId, GatewayError> {
    let Some(value) = headers.get(OWNER_HEADER) else {
        return Ok(UserId::default_user());
    };
    let owner = value.to_str().map_err(|_| {
        GatewayError::BadRequest(
            "The X-DeerFlow-Owner-User-Id header must be visible ASCII text.".into(),
        )
    })?;
    let owner = owner.trim();
    if owner.is_empty() {
        return Ok(UserId::default_user());
    }
    refuse_derived_bucket(owner).map_err(|m| {
        GatewayError::Forbidden(format!("Refused X-DeerFlow-Owner-User-Id header: {m}."))
    })?;
    safe_user(owner).map_err(|m| {
        GatewayError::BadRequest(format!("Invalid X-DeerFlow-Owner-User-Id header: {m}"))
    })
}

/// `deerflow_session` mode, after the internal token: a present `Authorization` header is a
/// bearer token and never falls back to the cookie (as in DeerFlow); otherwise writes must
/// pass the CSRF rule (checked before the cookie, as DeerFlow's outer CSRF middleware does),
/// and the `access_token` cookie names the user.
fn session_caller(
    table: &TokenTable,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(UserId, CallerKind), GatewayError> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let user = table.bearer_user(value);
        let user = user.ok_or(GatewayError::Session(SessionRejection::BadBearer))?;
        return Ok((user, CallerKind::Token));
    }
    if is_write(method) {
        check_csrf(headers)?;
    }
    let verifier = table.session.as_ref().ok_or_else(|| {
        GatewayError::Internal(
            "deerflow_session mode without a usable gateway.auth.jwt_secret".into(),
        )
    })?;
    let token = cookie(headers, SESSION_COOKIE)
        .filter(|t| !t.is_empty())
        .ok_or(GatewayError::Session(SessionRejection::Missing))?;
    Ok((verifier.verify(&token)?, CallerKind::Session))
}

/// The token of an `Authorization: Bearer <token>` header value (scheme case-insensitive).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let tok = rest.trim();
    (!tok.is_empty()).then_some(tok)
}

/// Whether a host name (without port) is a loopback name: `localhost`, `127.0.0.0/8`, `::1`.
fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The host part of a `Host` header value (`name[:port]`, `[v6][:port]`).
fn host_name(authority: &str) -> &str {
    let a = authority.trim();
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match a.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => a,
    }
}

/// A header value as it may be quoted in a message: visible ASCII, at most 100 characters.
pub(crate) fn shown(value: &HeaderValue) -> String {
    value.to_str().map_or_else(
        |_| "<not visible ASCII>".to_owned(),
        |text| crate::extract::shortened(text, 100),
    )
}

fn allowed_host(cfg: &GatewayConfig, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    cfg.auth.allowed_hosts.contains(&name)
}

fn check_loopback_request(cfg: &GatewayConfig, headers: &HeaderMap) -> Result<(), GatewayError> {
    if let Some(host) = headers.get(axum::http::header::HOST) {
        let name = host.to_str().map(host_name).unwrap_or("");
        if !is_loopback_host(name) && !allowed_host(cfg, name) {
            return Err(GatewayError::Forbidden(format!(
                "Host {:?} is refused: without authentication the gateway only answers requests \
                 addressed to localhost or to a name in gateway.auth.allowed_hosts (a defence \
                 against DNS rebinding). To serve this name, add {:?} to \
                 gateway.auth.allowed_hosts, or authenticate callers with gateway.auth.mode.",
                shown(host),
                name.to_ascii_lowercase(),
            )));
        }
    }
    if let Some(origin) = headers.get(axum::http::header::ORIGIN) {
        let text = origin.to_str().unwrap_or("");
        let name = text.split_once("://").map(|(_, rest)| host_name(rest));
        let ok = name.is_some_and(|n| is_loopback_host(n) || allowed_host(cfg, n))
            || cfg.cors.as_ref().is_some_and(|c| c.allows(text));
        if !ok {
            let hint = match name.filter(|n| !n.is_empty()) {
                Some(n) => format!(
                    "add {:?} to gateway.auth.allowed_hosts",
                    n.to_ascii_lowercase()
                ),
                None => "send requests from a page served by an allowed host".to_owned(),
            };
            return Err(GatewayError::Forbidden(format!(
                "Origin {:?} is refused: without authentication the gateway only answers pages \
                 served from localhost or from a name in gateway.auth.allowed_hosts (a defence \
                 against cross-site requests). To allow pages from this origin, {hint}, or \
                 authenticate callers with gateway.auth.mode.",
                shown(origin),
            )));
        }
    }
    Ok(())
}

/// Middleware on every `/api` route: resolves the [`Caller`] and stores it in the request.
pub(crate) async fn require_caller(
    State(state): State<GatewayState>,
    mut req: Request,
    next: Next,
) -> Response {
    match authenticate(
        state.gateway_config(),
        &state.tokens,
        req.method(),
        req.headers(),
    ) {
        Ok(caller) => {
            tracing::Span::current().record("user", caller.user.as_str());
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) => {
            tracing::info!(
                status = e.status_and_detail().0.as_u16(),
                "request refused by authentication"
            );
            e.into_response()
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = GatewayError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            GatewayError::Internal("route is missing the authentication layer".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn constant_time_eq_compares_whole_secrets() {
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "abcd"));
        assert!(!constant_time_eq("", "a"));
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token("Bearer tok"), Some("tok"));
        assert_eq!(bearer_token("bearer   tok  "), Some("tok"));
        assert_eq!(bearer_token("Basic tok"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("tok"), None);
    }

    #[test]
    fn host_names() {
        assert_eq!(host_name("localhost:8765"), "localhost");
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert!(is_loopback_host("LOCALHOST"));
        assert!(is_loopback_host("127.1.2.3"));
        assert!(is_loopback_host("::1"));
        assert!(!is_loopback_host("evil.example"));
        assert!(!is_loopback_host("localhost.evil.example"));
        assert!(!is_loopback_host("10.0.0.1"));
    }

    #[test]
    fn token_mode_resolves_users_and_refuses_strangers() {
        let cfg = GatewayConfig::with_tokens([("tok-a", "alice"), ("tok-b", "bob")]).unwrap();
        let table = TokenTable::new(&cfg);
        let c = authenticate(
            &cfg,
            &table,
            &Method::GET,
            &headers(&[("authorization", "Bearer tok-b")]),
        )
        .unwrap();
        assert_eq!((c.user.as_str(), c.kind), ("bob", CallerKind::Token));
        for bad in [
            vec![],
            vec![("authorization", "Bearer nope")],
            vec![("authorization", "tok-a")],
        ] {
            assert!(matches!(
                authenticate(&cfg, &table, &Method::GET, &headers(&bad)),
                Err(GatewayError::NotAuthenticated)
            ));
        }
    }

    #[test]
    fn owner_headers_naming_another_ids_bucket_are_refused() {
        let mut cfg = GatewayConfig::with_tokens([("tok-a", "alice")]).unwrap();
        cfg.auth.internal_token = Some(deermem_core::config::ConfigSecret::new("internal-secret"));
        let table = TokenTable::new(&cfg);
        let as_owner = |owner: &str| {
            authenticate(
                &cfg,
                &table,
                &Method::GET,
                &headers(&[
                    ("x-deerflow-internal-token", "internal-secret"),
                    ("x-deerflow-owner-user-id", owner),
                ]),
            )
        };
        // The victim's own raw id reaches their bucket...
        let victim = as_owner("victim@corp.com").unwrap();
        assert_eq!(victim.user.bucket(), "victim-corp-com-7b46e3848256709a");
        // ...and the bucket name itself, as a raw id, is refused (it would act as the victim).
        for foreign in [
            "victim-corp-com-7b46e3848256709a",
            " victim-corp-com-7b46e3848256709a ",
            "a-b-com-fb98d44ad7501a95",
        ] {
            match as_owner(foreign) {
                Err(e @ GatewayError::Forbidden(_)) => {
                    let (status, detail) = e.status_and_detail();
                    assert_eq!(status.as_u16(), 403);
                    let detail = detail.as_str().unwrap().to_owned();
                    assert!(
                        detail.contains("X-DeerFlow-Owner-User-Id")
                            && detail.contains("storage bucket derived from another user id"),
                        "{detail}"
                    );
                }
                other => panic!("{foreign:?} must be refused: {other:?}"),
            }
        }
        // Ordinary ids are unaffected, bucket-like ones that no other id can produce included.
        for plain in [
            "alice",
            "-1001234567890",
            "550e8400-e29b-41d4-a716-446655440000",
            "build-0123456789abcdef",
            "feishu|ou_AbC/123",
        ] {
            let c = as_owner(plain).unwrap();
            assert_eq!(c.kind, CallerKind::Internal, "{plain}");
            assert_eq!(
                c.user.bucket(),
                deermem_core::ids::safe_user_id(plain).unwrap()
            );
        }
    }

    #[test]
    fn token_tables_refuse_users_named_like_another_ids_bucket() {
        let err = GatewayConfig::with_tokens([
            ("tok-v", "victim@corp.com"),
            ("tok-m", "victim-corp-com-7b46e3848256709a"),
        ])
        .unwrap_err();
        assert!(
            err.message
                .contains("storage bucket derived from another user id"),
            "{err}"
        );
        // From YAML and from a tokens file alike.
        let root = serde_json::json!({"gateway": {"auth": {"mode": "token",
            "tokens": {"tok-m": "victim-corp-com-7b46e3848256709a"}}}});
        let err = GatewayConfig::from_root(&root).unwrap_err();
        assert_eq!(err.key, "gateway.auth.tokens");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "tok-m a-b-com-fb98d44ad7501a95\n").unwrap();
        let root = serde_json::json!({"gateway": {"auth": {"mode": "token",
            "tokens_file": file.to_str().unwrap()}}});
        let err = GatewayConfig::from_root(&root).unwrap_err();
        assert_eq!(err.key, "gateway.auth.tokens_file");
        assert!(err.message.contains(":1:"), "{err}");
        // The victim's own id, and plain ids, still configure.
        let cfg = GatewayConfig::with_tokens([
            ("tok-v", "victim@corp.com"),
            ("tok-b", "build-0123456789abcdef"),
        ])
        .unwrap();
        assert_eq!(
            cfg.auth.tokens["tok-v"].bucket(),
            "victim-corp-com-7b46e3848256709a"
        );
    }

    #[test]
    fn loopback_guard_applies_only_without_auth() {
        let cfg = GatewayConfig::default();
        let table = TokenTable::new(&cfg);
        assert!(
            authenticate(
                &cfg,
                &table,
                &Method::GET,
                &headers(&[("host", "localhost:8765")])
            )
            .is_ok()
        );
        assert!(
            authenticate(
                &cfg,
                &table,
                &Method::GET,
                &headers(&[("host", "127.0.0.1:1")])
            )
            .is_ok()
        );
        assert!(matches!(
            authenticate(
                &cfg,
                &table,
                &Method::GET,
                &headers(&[("host", "rebind.evil.example:8765")])
            ),
            Err(GatewayError::Forbidden(_))
        ));
        assert!(matches!(
            authenticate(
                &cfg,
                &table,
                &Method::GET,
                &headers(&[("origin", "https://evil.example")])
            ),
            Err(GatewayError::Forbidden(_))
        ));
        assert!(matches!(
            authenticate(&cfg, &table, &Method::GET, &headers(&[("origin", "null")])),
            Err(GatewayError::Forbidden(_))
        ));
        assert!(
            authenticate(
                &cfg,
                &table,
                &Method::GET,
                &headers(&[("origin", "http://localhost:3000")])
            )
            .is_ok()
        );
        let tok = GatewayConfig::with_tokens([("t", "alice")]).unwrap();
        let ttable = TokenTable::new(&tok);
        let h = headers(&[("host", "memory.example"), ("authorization", "Bearer t")]);
        assert!(authenticate(&tok, &ttable, &Method::GET, &h).is_ok());
    }
}
