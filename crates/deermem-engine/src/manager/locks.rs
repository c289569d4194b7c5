//! Per-user write turns inside one manager: the manager's own read-compute-commit loops (fact
//! create, update, delete, clear, import) of one user take turns instead of racing each other
//! into revision conflicts. Other processes (and the update pipeline) are still handled by the
//! storage's expected revisions and the loops' retries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deermem_core::UserId;
use tokio::sync::OwnedMutexGuard;

/// One async mutex per user bucket with a write in progress; entries are dropped with their
/// last guard, so the map only ever holds the users being written right now.
#[derive(Debug, Default)]
pub(crate) struct UserWriteTurns {
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The turn of one user; the next writer of that user proceeds when it is dropped.
#[derive(Debug)]
pub(crate) struct WriteTurn<'a> {
    owner: &'a UserWriteTurns,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl UserWriteTurns {
    /// Waits for the turn of `user` (`None`: the user-less layout).
    pub(crate) async fn take(&self, user: Option<&UserId>) -> WriteTurn<'_> {
        let key = user.map_or_else(String::new, |u| u.bucket().to_owned());
        let mutex = {
            let mut turns = self
                .turns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            turns.entry(key.clone()).or_default().clone()
        };
        let guard = mutex.lock_owned().await;
        WriteTurn {
            owner: self,
            key,
            guard: Some(guard),
        }
    }

    /// How many users have an entry (a writer holding or waiting for a turn).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

impl Drop for WriteTurn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = self
            .owner
            .turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Only the map still refers to the mutex: nobody holds or awaits it.
        if turns
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            turns.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writers_of_one_user_take_turns_and_other_users_do_not_wait() {
        let turns = Arc::new(UserWriteTurns::default());
        let alice = UserId::new("alice").unwrap();
        let bob = UserId::new("bob").unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (turns, alice, inside, most) =
                (turns.clone(), alice.clone(), inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = turns.take(Some(&alice)).await;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        // Bob's turn is free while Alice's writers queue.
        let held = turns.take(Some(&alice)).await;
        tokio::time::timeout(Duration::from_secs(5), turns.take(Some(&bob)))
            .await
            .expect("another user's turn never waits");
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "one writer of a user at a time"
        );
        assert_eq!(turns.len(), 0, "finished turns leave no entry behind");
        let _none = turns.take(None).await;
        assert_eq!(turns.len(), 1);
    }
}
