//! [`InFlight`]: counts queued and running operations of a backend (each holds an
//! [`InFlightGuard`]) so that shutdown can wait until they are done.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The number of operations in flight.
#[derive(Debug, Default)]
pub struct InFlight {
    tx: watch::Sender<usize>,
}

impl InFlight {
    /// Counts one more operation until the guard drops.
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.tx.send_modify(|n| *n += 1);
        InFlightGuard {
            counter: Arc::clone(self),
        }
    }

    /// Operations in flight now.
    pub fn count(&self) -> usize {
        *self.tx.borrow()
    }

    /// Waits until none is in flight; false when `timeout` passed first.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let mut rx = self.tx.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// One operation in flight; dropping it ends the operation.
#[derive(Debug)]
pub struct InFlightGuard {
    counter: Arc<InFlight>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.counter.tx.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_every_guard() {
        let f = Arc::new(InFlight::default());
        assert!(f.wait_idle(Duration::ZERO).await);
        let a = f.enter();
        let b = f.enter();
        assert_eq!(f.count(), 2);
        assert!(!f.wait_idle(Duration::from_millis(10)).await);
        drop(a);
        let waiter = tokio::spawn({
            let f = Arc::clone(&f);
            async move { f.wait_idle(Duration::from_secs(60)).await }
        });
        drop(b);
        assert!(waiter.await.unwrap());
        assert_eq!(f.count(), 0);
    }
}
