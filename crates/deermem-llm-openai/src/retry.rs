//! Retry timing: exponential backoff with jitter, `Retry-After` parsing with a cap, and the
//! injectable [`Sleeper`] so tests can observe the delays without waiting for them.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;

/// How long to wait between attempts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// The delay before the first retry, before jitter (doubled for each later retry).
    pub base_delay: Duration,
    /// The largest backoff delay, before jitter.
    pub max_delay: Duration,
    /// The largest server-requested `Retry-After` delay that is honoured as given; longer
    /// requests are cut to this.
    pub retry_after_cap: Duration,
}

impl Default for RetryPolicy {
    /// 0.5 s doubling up to 8 s; `Retry-After` honoured up to 30 s.
    fn default() -> Self {
        Self {
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            retry_after_cap: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `retry` (0 for the first retry).
    ///
    /// A server hint (`Retry-After`) wins, capped at [`RetryPolicy::retry_after_cap`]; otherwise
    /// the exponential backoff `base * 2^retry`, capped at [`RetryPolicy::max_delay`], is scaled
    /// by a random factor in `[0.5, 1.0]` so that concurrent clients spread out.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(hint) = retry_after {
            return hint.min(self.retry_after_cap);
        }
        let factor = 2u32.saturating_pow(retry.min(20));
        let backoff = self.base_delay.saturating_mul(factor).min(self.max_delay);
        let jitter: f64 = rand::rng().random_range(0.5..=1.0);
        backoff.mul_f64(jitter)
    }
}

/// Parses a `Retry-After` header given in seconds (`"3"`, `"1.5"`). HTTP-date values and
/// anything negative or non-finite give `None` (the caller then uses its own backoff).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    // Anything absurdly large is clamped by the policy cap later; keep the conversion safe.
    Duration::try_from_secs_f64(secs.min(86_400.0)).ok()
}

/// Waits between attempts. The default is [`TokioSleeper`]; tests plug in a recorder.
#[async_trait]
pub trait Sleeper: Send + Sync + Debug {
    /// Waits for `duration`.
    async fn sleep(&self, duration: Duration);
}

/// Sleeps on the tokio timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioSleeper;

#[async_trait]
impl Sleeper for TokioSleeper {
    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            p.delay(4, Some(Duration::from_secs(3600))),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_bounded() {
        let p = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
            retry_after_cap: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let d0 = p.delay(0, None);
            assert!(d0 >= Duration::from_millis(50) && d0 <= Duration::from_millis(100));
            let d2 = p.delay(2, None);
            assert!(d2 >= Duration::from_millis(200) && d2 <= Duration::from_millis(400));
            let d30 = p.delay(30, None);
            assert!(d30 >= Duration::from_millis(500) && d30 <= Duration::from_millis(1000));
        }
    }

    #[test]
    fn parses_retry_after_seconds_only() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 1.5 "),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("NaN"), None);
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(
            parse_retry_after("1e300"),
            Some(Duration::from_secs(86_400))
        );
    }
}
