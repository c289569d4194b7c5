//! Bounded retries on `backon`: exponential backoff with jitter, a server's `Retry-After`
//! honoured up to a cap, and an injectable [`Sleeper`] so tests observe the delays without
//! waiting for them.

use std::fmt::Debug;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable as _;
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
    /// Retry at once, ignoring any server hint.
    pub const IMMEDIATE: Self = Self {
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        retry_after_cap: Duration::ZERO,
    };

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

/// A [`TokioSleeper`] to hand to [`retry`].
pub fn tokio_sleeper() -> Arc<dyn Sleeper> {
    Arc::new(TokioSleeper)
}

/// Runs `op` until it succeeds, fails with an error `classify` calls final, or `retries`
/// retries were made. `classify` returns `None` for a final error and `Some(hint)` for a
/// retryable one, `hint` being the server's `Retry-After`. `notify` sees each retried error and
/// the delay before the next attempt.
///
/// The future is boxed (and `Send`), so callers' futures stay `Send` whatever they borrow.
///
/// # Errors
/// The last error.
pub fn retry<'a, T, E, Fut>(
    policy: RetryPolicy,
    retries: u32,
    sleeper: Arc<dyn Sleeper>,
    op: impl FnMut() -> Fut + Send + 'a,
    classify: impl Fn(&E) -> Option<Option<Duration>> + Send + Sync + 'a,
    notify: impl FnMut(&E, Duration) + Send + 'a,
) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'a>>
where
    Fut: Future<Output = Result<T, E>> + Send + 'a,
    T: Send + 'a,
    E: Send + 'a,
{
    let backoff = (0..retries).map(move |n| policy.delay(n, None));
    let classify = Arc::new(classify);
    let when = Arc::clone(&classify);
    Box::pin(
        op.retry(backoff)
            .sleep(move |d| {
                let sleeper = Arc::clone(&sleeper);
                async move { sleeper.sleep(d).await }
            })
            .when(move |e| when(e).is_some())
            .adjust(move |e, backoff| {
                let hint = classify(e).flatten();
                backoff.map(|d| hint.map_or(d, |h| h.min(policy.retry_after_cap)))
            })
            .notify(notify),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<Duration>>);

    #[async_trait]
    impl Sleeper for Recorder {
        async fn sleep(&self, d: Duration) {
            self.0.lock().unwrap().push(d);
        }
    }

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

    /// Fails with the scripted errors (`Some(hint)` retryable, `None` final), then succeeds;
    /// the error is the attempt's number.
    async fn run(
        script: Vec<Option<Option<Duration>>>,
        retries: u32,
    ) -> (Result<u32, u32>, Vec<Duration>, u32) {
        let rec = Arc::new(Recorder::default());
        let calls = Mutex::new(0u32);
        let mut notified = 0;
        let result = retry(
            RetryPolicy {
                base_delay: Duration::from_millis(100),
                max_delay: Duration::from_secs(1),
                retry_after_cap: Duration::from_secs(5),
            },
            retries,
            rec.clone(),
            || {
                let n = {
                    let mut c = calls.lock().unwrap();
                    *c += 1;
                    *c
                };
                let outcome = script.get(n as usize - 1).copied();
                async move {
                    match outcome {
                        Some(_) => Err(n),
                        None => Ok(n),
                    }
                }
            },
            |e: &u32| script[*e as usize - 1],
            |_, _| notified += 1,
        )
        .await;
        let delays = rec.0.lock().unwrap().clone();
        (result, delays, notified)
    }

    #[tokio::test]
    async fn retries_are_bounded_and_honour_hints() {
        let hinted = Some(Some(Duration::from_secs(60)));
        let plain = Some(None);
        // Two retryable failures, then success.
        let (r, delays, notified) = run(vec![hinted, plain], 3).await;
        assert_eq!(r, Ok(3));
        assert_eq!(delays[0], Duration::from_secs(5), "the hint, capped");
        assert!(delays[1] >= Duration::from_millis(100) && delays[1] <= Duration::from_millis(200));
        assert_eq!(notified, 2);
        // Out of retries: the last error comes back.
        let (r, delays, _) = run(vec![plain, plain, plain], 2).await;
        assert_eq!((r, delays.len()), (Err(3), 2));
        // A final error is not retried.
        let (r, delays, _) = run(vec![plain, None, plain], 5).await;
        assert_eq!((r, delays.len()), (Err(2), 1));
        let (r, delays, _) = run(vec![plain], 0).await;
        assert_eq!((r, delays.len()), (Err(1), 0));
    }
}
