//! DeerFlow's browser session, for `auth.mode: deerflow_session`: the `access_token` cookie
//! (an HS256 JWT signed with DeerFlow's `AUTH_JWT_SECRET`, the user id in `sub`, the expiry in
//! `exp`), its 401 bodies (`{"detail": {"code", "message"}}`), and the double-submit CSRF rule
//! for writes (`csrf_token` cookie equal to the `X-CSRF-Token` header).
//!
//! What needs DeerFlow's user database is not checked: the token version `ver` (bumped when a
//! password changes) and whether the user still exists. A signed, unexpired cookie of a deleted
//! user, or one issued before a password change, is accepted until it expires.

use axum::http::{HeaderMap, Method, header};
use deermem_core::UserId;
use deermem_core::ids::refuse_derived_bucket;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::auth::constant_time_eq;
use crate::config::safe_user;
use crate::error::GatewayError;
use deermem_core::config::ConfigSecret;

/// The cookie DeerFlow keeps its session JWT in.
pub const SESSION_COOKIE: &str = "access_token";
/// The double-submit cookie of DeerFlow's CSRF rule.
pub const CSRF_COOKIE: &str = "csrf_token";
/// The header that must repeat [`CSRF_COOKIE`] on writes.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// The 403 detail when the CSRF cookie or header is missing (DeerFlow's text).
pub const CSRF_MISSING_DETAIL: &str = "CSRF token missing. Include X-CSRF-Token header.";
/// The 403 detail when they differ (DeerFlow's text).
pub const CSRF_MISMATCH_DETAIL: &str = "CSRF token mismatch.";

/// Why a session-mode request was not authenticated: each is a 401 whose detail is DeerFlow's
/// `{"code", "message"}` object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionRejection {
    /// No `access_token` cookie (and no other credential).
    Missing,
    /// The cookie's `exp` has passed.
    Expired,
    /// The cookie was not signed with the configured secret.
    BadSignature,
    /// Anything else: not a JWT, another algorithm (`none` included), a missing or malformed
    /// claim, a `sub` that cannot be a user id.
    Malformed,
    /// An `Authorization` header whose bearer token is not configured (a present
    /// `Authorization` header never falls back to the cookie).
    BadBearer,
}

impl SessionRejection {
    /// DeerFlow's error code.
    pub fn code(self) -> &'static str {
        match self {
            Self::Missing => "not_authenticated",
            Self::Expired => "token_expired",
            Self::BadSignature | Self::Malformed | Self::BadBearer => "token_invalid",
        }
    }

    /// DeerFlow's message (`Invalid bearer token` is ours: DeerFlow's own bearer tokens are
    /// personal access tokens it looks up in its database).
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => "Authentication required",
            Self::Expired => "Token error: expired",
            Self::BadSignature => "Token error: invalid_signature",
            Self::Malformed => "Token error: malformed",
            Self::BadBearer => "Invalid bearer token",
        }
    }
}

/// Verifies session cookies with DeerFlow's secret, as DeerFlow does: HS256 only, the
/// signature first, then `exp` (required, no leeway) and `nbf` when present; `aud` is refused
/// since none is expected.
#[derive(Clone)]
pub(crate) struct SessionVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for SessionVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionVerifier(HS256, ***)")
    }
}

impl SessionVerifier {
    /// A verifier for `secret`; `None` for an empty secret (the configuration refuses one).
    pub(crate) fn new(secret: &ConfigSecret) -> Option<Self> {
        let key = DecodingKey::from_secret(secret.expose().as_bytes()).ok()?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp"]);
        Some(Self { key, validation })
    }

    /// The user a cookie value stands for.
    ///
    /// # Errors
    /// The [`SessionRejection`] (401) of a token that does not verify, and 403 for a `sub`
    /// shaped like the storage bucket of another user id (see
    /// [`deermem_core::ids::refuse_derived_bucket`]).
    pub(crate) fn verify(&self, token: &str) -> Result<UserId, GatewayError> {
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &self.key, &self.validation)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => SessionRejection::Expired,
                ErrorKind::InvalidSignature => SessionRejection::BadSignature,
                _ => SessionRejection::Malformed,
            })
            .map_err(GatewayError::Session)?;
        match data.claims.get("sub") {
            Some(Value::String(sub)) if !sub.trim().is_empty() => {
                refuse_derived_bucket(sub).map_err(|e| {
                    GatewayError::Forbidden(format!("Refused session cookie: {e}."))
                })?;
                safe_user(sub).map_err(|_| GatewayError::Session(SessionRejection::Malformed))
            }
            _ => Err(GatewayError::Session(SessionRejection::Malformed)),
        }
    }
}

/// Whether DeerFlow's CSRF rule covers the method (state-changing methods).
pub(crate) fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// The value of cookie `name`, read like Starlette reads the `Cookie` header(s): pairs split on
/// `;`, name and value trimmed, surrounding double quotes removed, the last one wins.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut found = None;
    for value in headers.get_all(header::COOKIE) {
        let Ok(text) = value.to_str() else { continue };
        for pair in text.split(';') {
            let (k, v) = pair.split_once('=').unwrap_or(("", pair));
            if k.trim() == name {
                let v = v.trim();
                let v = v
                    .strip_prefix('"')
                    .and_then(|x| x.strip_suffix('"'))
                    .unwrap_or(v);
                found = Some(v.to_owned());
            }
        }
    }
    found
}

/// DeerFlow's double-submit rule: the `csrf_token` cookie and the `X-CSRF-Token` header are
/// both present, not empty, and equal (compared in constant time); 403 otherwise.
pub(crate) fn check_csrf(headers: &HeaderMap) -> Result<(), GatewayError> {
    let from_cookie = cookie(headers, CSRF_COOKIE).filter(|c| !c.is_empty());
    let from_header = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|h| !h.is_empty());
    match (from_cookie, from_header) {
        (Some(c), Some(h)) if constant_time_eq(&c, h) => Ok(()),
        (Some(_), Some(_)) => Err(GatewayError::Forbidden(CSRF_MISMATCH_DETAIL.into())),
        _ => Err(GatewayError::Forbidden(CSRF_MISSING_DETAIL.into())),
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
    fn cookies_are_read_like_starlette() {
        let h = headers(&[
            ("cookie", "a=1; access_token = tok ;csrf_token=\"q\""),
            ("cookie", "a=2"),
        ]);
        assert_eq!(cookie(&h, "access_token").as_deref(), Some("tok"));
        assert_eq!(cookie(&h, "csrf_token").as_deref(), Some("q"));
        assert_eq!(cookie(&h, "a").as_deref(), Some("2"));
        assert_eq!(cookie(&h, "missing"), None);
        assert_eq!(cookie(&headers(&[("cookie", "novalue")]), "novalue"), None);
    }

    #[test]
    fn csrf_needs_an_equal_non_empty_pair() {
        let ok = headers(&[("cookie", "csrf_token=abc"), ("x-csrf-token", "abc")]);
        assert!(check_csrf(&ok).is_ok());
        let detail = |h: &HeaderMap| match check_csrf(h) {
            Err(GatewayError::Forbidden(d)) => d,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            detail(&headers(&[
                ("cookie", "csrf_token=abc"),
                ("x-csrf-token", "abd")
            ])),
            CSRF_MISMATCH_DETAIL
        );
        assert_eq!(
            detail(&headers(&[("x-csrf-token", "abc")])),
            CSRF_MISSING_DETAIL
        );
        assert_eq!(
            detail(&headers(&[("cookie", "csrf_token="), ("x-csrf-token", "")])),
            CSRF_MISSING_DETAIL
        );
        assert!(is_write(&Method::DELETE) && is_write(&Method::PUT));
        assert!(!is_write(&Method::GET) && !is_write(&Method::OPTIONS));
    }
}
