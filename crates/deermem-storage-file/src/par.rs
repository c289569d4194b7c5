//! Independent read-only file work (listing and parsing fact files) spread over the calling
//! thread and one helper thread, with results returned in input order.
//!
//! A cold load or an index rebuild is dominated by per-file system calls (listing shard
//! directories, opening and reading files) and parsing, all independent. The calling thread and
//! a helper take items from a shared counter, so the caller never waits for work the helper has
//! not started: on a busy machine where the helper is not scheduled, the caller simply does
//! everything, and the result is the same either way.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Fewer items than this run on the calling thread alone (a thread costs tens of µs).
const MIN_PARALLEL_ITEMS: usize = 8;

/// Whether the machine has more than one hardware thread.
fn parallel() -> bool {
    static PARALLEL: OnceLock<bool> = OnceLock::new();
    *PARALLEL.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// `items.iter().map(f).collect()`, computed on the calling thread and one helper thread.
///
/// `f` must not panic (a panic is propagated to the caller, as with the sequential map).
pub(crate) fn map_in_order<T, R, F>(items: &[T], f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
{
    if items.len() < MIN_PARALLEL_ITEMS || !parallel() {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return done;
            };
            done.push((i, f(item)));
        }
    };
    let (mine, theirs) = std::thread::scope(|s| {
        // If the helper cannot be started, the calling thread takes every item.
        let helper = std::thread::Builder::new()
            .name("deermem-files".into())
            .spawn_scoped(s, work);
        let mine = work();
        let theirs = match helper {
            Ok(h) => h
                .join()
                .unwrap_or_else(|payload| std::panic::resume_unwind(payload)),
            Err(_) => Vec::new(),
        };
        (mine, theirs)
    });
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    for (i, r) in mine.into_iter().chain(theirs) {
        if let Some(slot) = slots.get_mut(i) {
            *slot = Some(r);
        }
    }
    // Every index below `items.len()` was taken exactly once by a thread that finished.
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_keep_the_input_order() {
        for n in [0_usize, 1, 7, 8, 9, 100, 1000] {
            let items: Vec<usize> = (0..n).collect();
            let got = map_in_order(&items, |i| i * 3);
            let want: Vec<usize> = items.iter().map(|i| i * 3).collect();
            assert_eq!(got, want, "{n}");
        }
    }

    #[test]
    fn borrowed_state_is_shared() {
        let base = String::from("x");
        let items: Vec<String> = (0..50).map(|i| i.to_string()).collect();
        let got = map_in_order(&items, |s| format!("{base}{s}"));
        assert_eq!(got.len(), 50);
        assert_eq!(got[49], "x49");
    }
}
