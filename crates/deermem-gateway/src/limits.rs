//! Bounds on bulk requests (whole-document import and export): at most
//! `gateway.max_bulk_requests_per_user` at once for one user (more get 429) and
//! `gateway.max_bulk_requests` for everyone (more get 503), both with `Retry-After`. A request
//! takes its slot before its body is read, so a refused request's body is discarded as it
//! arrives and never buffered, and holds it until its manager call ends (even when the request
//! itself timed out meanwhile).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use deermem_core::{OverloadScope, UserId};

use crate::auth::Caller;
use crate::error::GatewayError;
use crate::state::GatewayState;

/// `Retry-After` of a refused bulk request, in seconds: bulk requests are short.
pub(crate) const BULK_RETRY_AFTER_SECONDS: u64 = 1;

#[derive(Debug, Default)]
struct Running {
    total: usize,
    by_user: HashMap<UserId, usize>,
}

/// Counts the bulk requests running, per user and in total.
#[derive(Debug)]
pub(crate) struct BulkLimiter {
    per_user: usize,
    total: usize,
    running: Arc<Mutex<Running>>,
}

impl BulkLimiter {
    pub(crate) fn new(per_user: usize, total: usize) -> Self {
        Self {
            per_user: per_user.max(1),
            total: total.max(1),
            running: Arc::new(Mutex::new(Running::default())),
        }
    }

    /// A slot for `user`, or the refusal (429 for the user's limit, checked first; 503 for
    /// everyone's).
    pub(crate) fn try_acquire(&self, user: &UserId) -> Result<BulkPermit, GatewayError> {
        let mut r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let mine = r.by_user.get(user).copied().unwrap_or(0);
        if mine >= self.per_user {
            return Err(busy(
                OverloadScope::User,
                format!(
                    "Too many memory imports and exports for this user at once (at most {}); retry shortly.",
                    self.per_user
                ),
            ));
        }
        if r.total >= self.total {
            return Err(busy(
                OverloadScope::Global,
                format!(
                    "Too many memory imports and exports at once (at most {} for all users); retry shortly.",
                    self.total
                ),
            ));
        }
        r.total += 1;
        *r.by_user.entry(user.clone()).or_default() += 1;
        Ok(BulkPermit {
            user: user.clone(),
            running: Arc::clone(&self.running),
        })
    }

    /// Bulk requests running now (for tests).
    #[cfg(test)]
    fn running(&self) -> usize {
        self.running.lock().map(|r| r.total).unwrap_or(0)
    }
}

fn busy(scope: OverloadScope, detail: String) -> GatewayError {
    GatewayError::Busy {
        scope,
        detail,
        retry_after_seconds: BULK_RETRY_AFTER_SECONDS,
    }
}

/// One running bulk request; its slot is released when dropped.
#[derive(Debug)]
pub(crate) struct BulkPermit {
    user: UserId,
    running: Arc<Mutex<Running>>,
}

impl Drop for BulkPermit {
    fn drop(&mut self) {
        let mut r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        r.total = r.total.saturating_sub(1);
        if let Some(n) = r.by_user.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                r.by_user.remove(&self.user);
            }
        }
    }
}

/// Extracts a bulk slot for the request's caller (routes without a body; the import takes its
/// slot in its body extractor, which discards a refused request's body).
impl FromRequestParts<GatewayState> for BulkPermit {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &GatewayState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        state.bulk.try_acquire(&caller.user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: &str) -> UserId {
        UserId::new(id).unwrap()
    }

    #[test]
    fn per_user_then_global_limits_with_release_on_drop() {
        let limiter = BulkLimiter::new(2, 3);
        let a1 = limiter.try_acquire(&user("alice")).unwrap();
        let a2 = limiter.try_acquire(&user("alice")).unwrap();
        let refused = limiter.try_acquire(&user("alice")).unwrap_err();
        let (status, _) = refused.status_and_detail();
        assert_eq!(status.as_u16(), 429);
        assert_eq!(
            refused.retry_after_seconds(),
            Some(BULK_RETRY_AFTER_SECONDS)
        );
        let b1 = limiter.try_acquire(&user("bob")).unwrap();
        let refused = limiter.try_acquire(&user("carol")).unwrap_err();
        let (status, detail) = refused.status_and_detail();
        assert_eq!(status.as_u16(), 503);
        assert!(detail.as_str().unwrap().contains("all users"), "{detail}");
        assert_eq!(limiter.running(), 3);
        drop(a1);
        let c1 = limiter.try_acquire(&user("carol")).unwrap();
        drop((a2, b1, c1));
        assert_eq!(limiter.running(), 0);
        // Every slot is back.
        let again: Vec<_> = ["alice", "alice", "bob"]
            .iter()
            .map(|u| limiter.try_acquire(&user(u)).unwrap())
            .collect();
        assert_eq!(again.len(), 3);
    }
}
