//! The per-process state: a tokio runtime created on first use and the shared engines by
//! configuration. A child created by `fork` (gunicorn-style servers) inherits this memory but
//! none of the runtime's threads, so the state records the pid it was made in; the first call
//! in a child finds a different pid, abandons the inherited state without running its
//! destructors (they would wait for threads that do not exist there) and starts afresh.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;

use crate::engine::Shared;

/// One process's runtime and engines.
pub(crate) struct Process {
    pid: u32,
    runtime: tokio::runtime::Runtime,
    /// The engines by configuration key.
    engines: Mutex<HashMap<String, Arc<Shared>>>,
    /// Serialises engine construction, so two threads asking for one configuration build it
    /// once (the map lock is never held while building).
    building: Mutex<()>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

static CURRENT: Mutex<Option<Arc<Process>>> = Mutex::new(None);

/// The state of this process, created on first use and again after a fork.
///
/// # Errors
/// The runtime's threads could not be started.
pub(crate) fn current() -> std::io::Result<Arc<Process>> {
    let pid = std::process::id();
    let mut slot = CURRENT.lock();
    if let Some(p) = slot.as_ref()
        && p.pid == pid
    {
        return Ok(Arc::clone(p));
    }
    if let Some(inherited) = slot.take() {
        // Made by the parent before a fork: its worker threads are not in this process, so
        // dropping the runtime or an engine would wait for them forever. Leak it instead.
        std::mem::forget(inherited);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("deermem-rs")
        .enable_all()
        .build()?;
    let process = Arc::new(Process {
        pid,
        runtime,
        engines: Mutex::new(HashMap::new()),
        building: Mutex::new(()),
    });
    *slot = Some(Arc::clone(&process));
    Ok(process)
}

impl Process {
    /// The runtime (for `enter` while building an engine).
    pub(crate) fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.runtime
    }

    /// Runs a future to completion on the runtime from a thread that released the GIL. A
    /// host hook running on one of the runtime's threads may call back into the package; the
    /// nested call then blocks in place instead of panicking.
    pub(crate) fn block_on<F: Future>(&self, future: F) -> F::Output {
        tokio::task::block_in_place(|| self.runtime.block_on(future))
    }

    /// The engine for `key`, built by `build` when there is none yet.
    pub(crate) fn engine<E>(
        &self,
        key: &str,
        build: impl FnOnce() -> Result<Arc<Shared>, E>,
    ) -> Result<Arc<Shared>, E> {
        if let Some(e) = self.engines.lock().get(key) {
            return Ok(Arc::clone(e));
        }
        let _building = self.building.lock();
        if let Some(e) = self.engines.lock().get(key) {
            return Ok(Arc::clone(e));
        }
        let engine = build()?;
        self.engines
            .lock()
            .insert(key.to_owned(), Arc::clone(&engine));
        Ok(engine)
    }

    /// Forgets the engine of `key` if it is `engine` (after its last handle closed it).
    pub(crate) fn remove(&self, key: &str, engine: &Arc<Shared>) {
        let mut engines = self.engines.lock();
        if engines.get(key).is_some_and(|e| Arc::ptr_eq(e, engine)) {
            engines.remove(key);
        }
    }
}

/// The pid the package's runtime was created in (`None` before first use); after a fork the
/// child reports its own pid once it has used the package.
#[pyfunction]
pub(crate) fn runtime_pid() -> Option<u32> {
    CURRENT.lock().as_ref().map(|p| p.pid)
}
