//! Group commit for concurrent writers of one user: the first writer to arrive leads, the
//! writers that arrive while it waits for the user's lock or commits queue behind it, and the
//! leader takes the compatible ones into its own commit (one journal, one manifest write and
//! one set of fsyncs for all of them), then hands each its own result. When the leader is done
//! it passes the lead, with that writer's own work, to the first writer still waiting.
//!
//! This module only moves work and results between threads; what is compatible and how a
//! group commits is the storage's business. Every thread here is a blocking-pool thread that
//! would otherwise wait for the same user lock.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use parking_lot::Mutex;

/// What a waiting writer is told.
enum Reply<W, R> {
    /// Its work was done by a leader.
    Done(R),
    /// It leads now, with its own work.
    Lead(W),
}

struct Group<W, R> {
    waiting: VecDeque<Member<W, R>>,
}

/// The write groups of a storage, one per key (user).
pub(crate) struct Groups<K, W, R> {
    groups: Mutex<HashMap<K, Group<W, R>>>,
}

impl<K, W, R> std::fmt::Debug for Groups<K, W, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups")
            .field("leading", &self.groups.lock().len())
            .finish()
    }
}

impl<K, W, R> Default for Groups<K, W, R> {
    fn default() -> Self {
        Self {
            groups: Mutex::new(HashMap::new()),
        }
    }
}

/// A writer's turn: lead with its work, or the result a leader produced for it.
pub(crate) enum Turn<'g, K: Hash + Eq + Clone, W, R> {
    /// Lead; the guard passes the lead on when dropped.
    Lead(W, Leader<'g, K, W, R>),
    /// Done by a leader.
    Done(R),
    /// The leader vanished without answering (it panicked): the work was lost with it.
    Abandoned,
}

/// A member of the leader's group: its work and where its result goes.
pub(crate) struct Member<W, R> {
    pub(crate) work: W,
    reply: SyncSender<Reply<W, R>>,
}

impl<W, R> Member<W, R> {
    /// Hands the member its result.
    pub(crate) fn finish(self, result: R) {
        // The member waits on its receiver until it hears from a leader; a failed send means
        // its thread is gone and nobody is left to tell.
        let _ = self.reply.send(Reply::Done(result));
    }
}

/// The lead of one key's group. Dropping it passes the lead to the first writer still waiting,
/// or ends the group.
pub(crate) struct Leader<'g, K: Hash + Eq + Clone, W, R> {
    groups: &'g Groups<K, W, R>,
    key: K,
}

impl<K: Hash + Eq + Clone, W, R> Groups<K, W, R> {
    /// Joins the group of `key`: leads at once when nobody does, otherwise waits until a leader
    /// either did the work or passes the lead on.
    pub(crate) fn join(&self, key: K, work: W) -> Turn<'_, K, W, R> {
        let rx: Receiver<Reply<W, R>> = {
            let mut groups = self.groups.lock();
            match groups.get_mut(&key) {
                None => {
                    groups.insert(
                        key.clone(),
                        Group {
                            waiting: VecDeque::new(),
                        },
                    );
                    return Turn::Lead(work, Leader { groups: self, key });
                }
                Some(group) => {
                    let (reply, rx) = sync_channel(1);
                    group.waiting.push_back(Member { work, reply });
                    rx
                }
            }
        };
        match rx.recv() {
            Ok(Reply::Done(r)) => Turn::Done(r),
            Ok(Reply::Lead(work)) => Turn::Lead(work, Leader { groups: self, key }),
            Err(_) => Turn::Abandoned,
        }
    }
}

impl<K: Hash + Eq + Clone, W, R> Leader<'_, K, W, R> {
    /// Takes up to `max` waiting writers whose work `fits` (called in arrival order; a writer
    /// that does not fit stays queued, in order, for a later leader).
    pub(crate) fn take(&self, max: usize, mut fits: impl FnMut(&W) -> bool) -> Vec<Member<W, R>> {
        let mut groups = self.groups.groups.lock();
        let Some(group) = groups.get_mut(&self.key) else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(group.waiting.len());
        while let Some(w) = group.waiting.pop_front() {
            if taken.len() < max && fits(&w.work) {
                taken.push(w);
            } else {
                kept.push_back(w);
            }
        }
        group.waiting = kept;
        taken
    }
}

impl<K: Hash + Eq + Clone, W, R> Drop for Leader<'_, K, W, R> {
    fn drop(&mut self) {
        let mut groups = self.groups.groups.lock();
        let Some(group) = groups.get_mut(&self.key) else {
            return;
        };
        while let Some(next) = group.waiting.pop_front() {
            // A waiter whose thread is gone cannot lead; try the next one.
            if next.reply.send(Reply::Lead(next.work)).is_ok() {
                return;
            }
        }
        groups.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Writers that arrive while a leader is busy are either taken into its group or lead
    /// later themselves; every one gets exactly its own result, and the group ends when the
    /// last leader leaves.
    #[test]
    fn every_writer_gets_its_own_result_once() {
        let groups: Arc<Groups<&'static str, usize, usize>> = Arc::new(Groups::default());
        let led = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let groups = Arc::clone(&groups);
                let led = Arc::clone(&led);
                std::thread::spawn(move || match groups.join("alice", i) {
                    Turn::Lead(mine, leader) => {
                        led.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        // Only even work joins a group; odd work stays queued to lead.
                        for m in leader.take(usize::MAX, |w| w % 2 == 0) {
                            let w = m.work;
                            m.finish(w * 10);
                        }
                        mine * 10
                    }
                    Turn::Done(r) => r,
                    Turn::Abandoned => usize::MAX,
                })
            })
            .collect();
        let mut results: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        results.sort_unstable();
        assert_eq!(results, (0..16).map(|i| i * 10).collect::<Vec<_>>());
        assert!(led.load(Ordering::Relaxed) >= 1);
        assert!(groups.groups.lock().is_empty(), "the group ended");
    }

    /// A waiter that does not fit keeps its place and leads after the leader leaves; a leader
    /// that takes nobody still passes the lead on.
    #[test]
    fn the_lead_passes_to_the_first_writer_still_waiting() {
        let groups: Arc<Groups<u8, &'static str, &'static str>> = Arc::new(Groups::default());
        let Turn::Lead("first", leader) = groups.join(1, "first") else {
            panic!("the first writer leads");
        };
        let g2 = Arc::clone(&groups);
        let second = std::thread::spawn(move || match g2.join(1, "second") {
            Turn::Lead(w, _leader) => format!("led {w}"),
            Turn::Done(r) => format!("done {r}"),
            Turn::Abandoned => "abandoned".to_owned(),
        });
        while groups
            .groups
            .lock()
            .get(&1)
            .is_none_or(|g| g.waiting.is_empty())
        {
            std::thread::yield_now();
        }
        assert!(leader.take(8, |_| false).is_empty(), "nothing fits");
        drop(leader);
        assert_eq!(second.join().unwrap(), "led second");
        assert!(groups.groups.lock().is_empty());
    }

    /// A leader that panics does not leave its waiters blocked: the lead passes on.
    #[test]
    fn a_panicking_leader_passes_the_lead_on() {
        let groups: Arc<Groups<u8, u8, u8>> = Arc::new(Groups::default());
        let g1 = Arc::clone(&groups);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let first = std::thread::spawn(move || {
            let Turn::Lead(_, _leader) = g1.join(7, 1) else {
                return;
            };
            started_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            panic!("leader fails");
        });
        started_rx.recv().unwrap();
        let g2 = Arc::clone(&groups);
        let second = std::thread::spawn(move || matches!(g2.join(7, 2), Turn::Lead(2, _)));
        while groups
            .groups
            .lock()
            .get(&7)
            .is_none_or(|g| g.waiting.is_empty())
        {
            std::thread::yield_now();
        }
        go_tx.send(()).unwrap();
        assert!(first.join().is_err());
        assert!(second.join().unwrap(), "the waiter leads with its own work");
    }
}
