//! The `Engine` handle a Python `DeerMemManager` holds: one method per operation of the
//! memory-manager contract, each a thin call into the `MemoryManager` port with the GIL
//! released for the whole engine call.
//!
//! Handles with the same configuration (the canonical `backend_config`, the mode and whether
//! the host supplies the model) share one engine ([`Shared`]): one update queue, one storage
//! cache, one search index per process. A handle attaches to its engine on construction and
//! again, transparently, after `close` or in a forked child (where it builds a fresh engine on
//! the child's own runtime). The engine is closed when the last handle attached to it closes.

use deermem_core::ports::MemoryManagerExt as _;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deermem::{Backend, BuildError, BuildOptions};
use deermem_core::ports::{
    AddRequest, ContextRequest, FactPatch, MemoryManager, MemoryScope, NewFact, SearchRequest,
};
use deermem_core::{ManagerError, MemoryConfig, MemoryMode, PublicMemoryDocument};
use parking_lot::RwLock;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyList, PyString, PyTuple};
use serde_json::Value;

use crate::convert::{self, Strictness};
use crate::errors;
use crate::hooks::{HookSet, HookSlot, PyLlm, PyObserver, hidden_policy};
use crate::logging;
use crate::process::{self, Process};

/// One engine shared by every handle of a configuration in this process.
pub(crate) struct Shared {
    backend: Backend,
    manager: Arc<dyn MemoryManager>,
    hooks: Arc<HookSlot>,
    /// Handles attached to this engine and not closed.
    handles: AtomicUsize,
    process: Arc<Process>,
}

impl Shared {
    /// Runs an engine future with the GIL released.
    fn run<T, F>(&self, py: Python<'_>, future: F) -> T
    where
        F: Future<Output = T> + Send,
        T: Send,
    {
        py.detach(|| self.process.block_on(future))
    }

    /// Runs one manager call with the GIL released; its error becomes the Python exception.
    fn call<T, F>(&self, py: Python<'_>, future: F) -> PyResult<T>
    where
        F: Future<Output = Result<T, ManagerError>> + Send,
        T: Send,
    {
        self.run(py, future).map_err(|e| errors::to_py(py, e))
    }
}

/// Why attaching failed (built without the GIL, turned into an exception with it).
enum AttachError {
    Runtime(std::io::Error),
    Build(BuildError),
}

fn build(
    process: &Arc<Process>,
    config: &MemoryConfig,
    llm_name: Option<&str>,
    hooks: Arc<HookSet>,
) -> Result<Arc<Shared>, BuildError> {
    let slot = Arc::new(HookSlot::default());
    slot.set(hooks);
    let _runtime = process.runtime().enter();
    let env = deermem::process_env;
    let mut opts = BuildOptions::new(&env);
    opts.observer = Some(Arc::new(PyObserver::new(
        Arc::clone(&slot),
        llm_name.is_some(),
    )));
    opts.hidden_messages = Some(hidden_policy(Arc::clone(&slot)));
    if let Some(name) = llm_name {
        opts.llm = Some(Arc::new(PyLlm::new(Arc::clone(&slot), name.to_owned())));
    }
    let backend = deermem::build_backend(config, opts)?;
    Ok(Arc::new(Shared {
        manager: backend.manager(),
        backend,
        hooks: slot,
        handles: AtomicUsize::new(0),
        process: Arc::clone(process),
    }))
}

/// A handle attached to an engine in the process `pid`.
struct Attached {
    pid: u32,
    shared: Arc<Shared>,
}

/// A memory engine handle (see the module documentation).
#[pyclass(frozen, module = "deermem_rs._native")]
pub(crate) struct Engine {
    key: String,
    config: MemoryConfig,
    /// The host model's name, when the host supplies the model.
    llm_name: Option<String>,
    hooks: Arc<HookSet>,
    /// Read on every call (shared), written only when attaching or closing.
    attached: RwLock<Option<Attached>>,
}

/// The host model's name for logs: its `model_name` or `model` attribute.
fn model_name(model: &Bound<'_, PyAny>) -> String {
    ["model_name", "model"]
        .iter()
        .find_map(|a| convert::attr(model, a).and_then(|v| v.extract::<String>().ok()))
        .unwrap_or_else(|| "host-llm".to_owned())
}

fn optional(obj: Option<Bound<'_, PyAny>>) -> Option<Py<PyAny>> {
    obj.filter(|o| !o.is_none()).map(Bound::unbind)
}

fn document<'py>(py: Python<'py>, doc: &PublicMemoryDocument) -> PyResult<Bound<'py, PyAny>> {
    convert::serialize_to_py(py, doc)
}

impl Engine {
    /// The engine this handle uses in this process, attaching (building it if needed) when
    /// the handle is new, was closed, or was inherited through a fork.
    fn shared(&self, py: Python<'_>) -> PyResult<Arc<Shared>> {
        logging::refresh_if_stale(py);
        let pid = std::process::id();
        if let Some(a) = self.attached.read().as_ref()
            && a.pid == pid
        {
            return Ok(Arc::clone(&a.shared));
        }
        let attached = py.detach(|| -> Result<Arc<Shared>, AttachError> {
            let process = process::current().map_err(AttachError::Runtime)?;
            process
                .engine(&self.key, || {
                    build(
                        &process,
                        &self.config,
                        self.llm_name.as_deref(),
                        Arc::clone(&self.hooks),
                    )
                })
                .map_err(AttachError::Build)
        });
        let shared = match attached {
            Ok(s) => s,
            Err(AttachError::Runtime(e)) => {
                return Err(PyRuntimeError::new_err(format!(
                    "cannot start the memory engine's threads: {e}"
                )));
            }
            Err(AttachError::Build(e)) => return Err(errors::build_to_py(py, e)),
        };
        let mut slot = self.attached.write();
        match slot.as_ref() {
            Some(a) if a.pid == pid => return Ok(Arc::clone(&a.shared)),
            Some(_) => {
                // Attached in the parent before a fork: that engine's threads are not here.
                if let Some(inherited) = slot.take() {
                    std::mem::forget(inherited);
                }
            }
            None => {}
        }
        shared.hooks.set(Arc::clone(&self.hooks));
        shared.handles.fetch_add(1, Ordering::SeqCst);
        *slot = Some(Attached {
            pid,
            shared: Arc::clone(&shared),
        });
        Ok(shared)
    }

    /// One operation on the scope of `user_id` and `agent_name` that answers the document,
    /// returned as Python objects.
    fn document_call<'py, F, Fut>(
        &self,
        py: Python<'py>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
        op: F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        F: FnOnce(Arc<dyn MemoryManager>, MemoryScope) -> Fut,
        Fut: Future<Output = Result<PublicMemoryDocument, ManagerError>> + Send,
    {
        let scope = convert::scope(user_id, agent_name)?;
        let shared = self.shared(py)?;
        let doc = shared.call(py, op(Arc::clone(&shared.manager), scope))?;
        document(py, &doc)
    }
}

#[pymethods]
impl Engine {
    /// Builds (or joins) the engine of this configuration. `backend_config` holds DeerMem's
    /// keys only (the hooks are separate arguments); `host_llm` is the host's chat model, used
    /// when the configuration names no model.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (backend_config, mode, *, callbacks=None, should_keep_hidden_message=None, trace_context_manager=None, extraction_callback=None, host_llm=None))]
    fn new(
        py: Python<'_>,
        backend_config: &Bound<'_, PyAny>,
        mode: &str,
        callbacks: Option<Bound<'_, PyAny>>,
        should_keep_hidden_message: Option<Bound<'_, PyAny>>,
        trace_context_manager: Option<Bound<'_, PyAny>>,
        extraction_callback: Option<Bound<'_, PyAny>>,
        host_llm: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let backend_config = match convert::to_value(backend_config, Strictness::Strict) {
            Ok(Value::Object(m)) => m,
            Ok(Value::Null) => serde_json::Map::new(),
            Ok(_) => {
                return Err(PyTypeError::new_err("backend_config must be a mapping"));
            }
            Err(e) => {
                return Err(PyValueError::new_err(format!(
                    "backend_config cannot be used: {}",
                    e.value(py)
                )));
            }
        };
        let mode = match mode {
            "middleware" => MemoryMode::Middleware,
            "tool" => MemoryMode::Tool,
            other => {
                return Err(PyValueError::new_err(format!(
                    "mode must be 'middleware' or 'tool', not {other:?}"
                )));
            }
        };
        let host_llm = optional(host_llm);
        let llm_name = host_llm.as_ref().map(|m| model_name(m.bind(py)));
        let mut config = MemoryConfig {
            mode,
            manager_class: "deermem".into(),
            backend_config,
            ..MemoryConfig::default()
        };
        // The root is resolved once, here: a later `chdir` or change of `$DEERMEM_DATA_DIR`
        // neither moves this manager nor lets another manager join its engine by mistake.
        // (A `storage_path` of another type is left for the configuration check to refuse.)
        if config
            .backend_config
            .get("storage_path")
            .is_none_or(|v| v.is_null() || v.is_string())
        {
            let root = resolved_root(&config)?;
            config
                .backend_config
                .insert("storage_path".into(), Value::String(root));
        }
        // The canonical form of the resolved configuration: object keys sorted at every level,
        // and a digest of the environment variables it refers to.
        let mut canonical = Value::Object(config.backend_config.clone());
        canonical.sort_all_objects();
        let key = serde_json::json!({
            "backend_config": canonical,
            "environment": environment_digest(&config.backend_config),
            "mode": mode.as_str(),
            "host_llm": llm_name.is_some(),
        })
        .to_string();
        let engine = Self {
            key,
            config,
            llm_name,
            hooks: Arc::new(HookSet {
                callbacks: optional(callbacks),
                keep_hidden: optional(should_keep_hidden_message),
                trace_cm: optional(trace_context_manager),
                extraction: optional(extraction_callback),
                host_llm,
            }),
            attached: RwLock::new(None),
        };
        engine.shared(py)?;
        Ok(engine)
    }

    /// The configuration key this handle shares an engine by: the canonical JSON of the
    /// resolved configuration (absolute storage root, every key, the mode, the model source,
    /// and a digest of the environment variables the configuration names).
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// The pid this handle is attached in (`None` when closed).
    #[getter]
    fn attached_pid(&self) -> Option<u32> {
        self.attached.read().as_ref().map(|a| a.pid)
    }

    /// Queues a conversation turn (`nowait`: the emergency path, processed at once).
    #[pyo3(signature = (thread_id, messages, agent_name=None, user_id=None, trace_id=None, nowait=false))]
    #[allow(clippy::too_many_arguments)]
    fn add(
        &self,
        py: Python<'_>,
        thread_id: &Bound<'_, PyAny>,
        messages: &Bound<'_, PyAny>,
        agent_name: Option<&str>,
        user_id: Option<&str>,
        trace_id: Option<String>,
        nowait: bool,
    ) -> PyResult<()> {
        let thread_id = required_text(thread_id, "thread_id")?;
        let scope = convert::scope(user_id, agent_name)?;
        let messages = convert::messages(messages)?;
        let shared = self.shared(py)?;
        let request = AddRequest {
            thread_id,
            messages,
            scope,
            trace_id,
        };
        let m = &shared.manager;
        // A turn refused because too many turn bytes are pending is offered again every
        // ADMISSION_POLL for up to ADMISSION_WAIT (pending turns drain meanwhile); if it still
        // cannot be kept, `add` raises instead of returning as if it had been (the reference
        // drops such a turn silently).
        let started = std::time::Instant::now();
        loop {
            let attempt = request.clone();
            let result = if nowait {
                shared.run(py, m.add_nowait(attempt))
            } else {
                shared.run(py, m.add(attempt))
            };
            match result {
                Err(deermem_core::ManagerError::Overloaded { .. })
                    if started.elapsed() < ADMISSION_WAIT =>
                {
                    py.detach(|| std::thread::sleep(ADMISSION_POLL));
                    py.check_signals()?;
                }
                Err(deermem_core::ManagerError::Overloaded { message, .. }) => {
                    return Err(errors::package_error(
                        py,
                        "MemoryManagerError",
                        format!(
                            "{message} (still refused after {} s: the turn was not kept)",
                            ADMISSION_WAIT.as_secs()
                        ),
                    ));
                }
                other => return other.map_err(|e| errors::to_py(py, e)),
            }
        }
    }

    /// The injection text (without the `<memory>` wrapper), or `""`.
    #[pyo3(signature = (user_id, agent_name=None, thread_id=None))]
    fn get_context(
        &self,
        py: Python<'_>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
        thread_id: Option<String>,
    ) -> PyResult<String> {
        let scope = convert::scope(user_id, agent_name)?;
        let shared = self.shared(py)?;
        shared.call(
            py,
            shared
                .manager
                .get_context(ContextRequest { scope, thread_id }),
        )
    }

    /// Up to `top_k` facts ranked for `query` (`[]` for a blank query or `top_k <= 0`), by
    /// `mode` (`"bm25"`, `"vector"`, `"hybrid"`; `None` takes the configured default).
    #[pyo3(signature = (query, top_k=None, user_id=None, agent_name=None, category=None, mode=None))]
    #[allow(clippy::too_many_arguments)]
    fn search<'py>(
        &self,
        py: Python<'py>,
        query: &Bound<'py, PyAny>,
        top_k: Option<&Bound<'py, PyAny>>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
        category: Option<String>,
        mode: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let query = required_text(query, "query")?;
        let top_k: i64 = match top_k {
            None => 5,
            Some(k) if k.is_instance_of::<pyo3::types::PyBool>() => {
                return Err(PyTypeError::new_err("top_k must be an integer"));
            }
            Some(k) => k
                .extract()
                .map_err(|_| PyTypeError::new_err("top_k must be an integer"))?,
        };
        let mode = match mode {
            None => None,
            Some(m) => Some(
                m.cast::<PyString>()
                    .map_err(|_| PyTypeError::new_err("mode must be a string or None"))?
                    .to_str()?
                    .parse::<deermem_core::SearchMode>()
                    .map_err(|e| PyValueError::new_err(e.to_string()))?,
            ),
        };
        let scope = convert::scope(user_id, agent_name)?;
        let shared = self.shared(py)?;
        if top_k <= 0 || query.trim().is_empty() {
            return Ok(pyo3::types::PyList::empty(py).into_any());
        }
        let request = SearchRequest {
            query,
            top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
            scope,
            category,
            mode,
        };
        let facts = shared.call(py, shared.manager.search(request))?;
        convert::serialize_to_py(py, &facts)
    }

    /// The memory document of the user and agent bucket.
    #[pyo3(signature = (user_id=None, agent_name=None))]
    fn get_memory<'py>(
        &self,
        py: Python<'py>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.document_call(py, user_id, agent_name, |m, scope| async move {
            m.get_memory(scope).await
        })
    }

    /// The export document (the same as `get_memory`).
    #[pyo3(signature = (user_id=None, agent_name=None))]
    fn export_memory<'py>(
        &self,
        py: Python<'py>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.document_call(py, user_id, agent_name, |m, scope| async move {
            m.export_memory(scope).await
        })
    }

    /// Re-reads storage (and re-indexes the scope), then returns the document.
    #[pyo3(signature = (user_id=None, agent_name=None))]
    fn reload_memory<'py>(
        &self,
        py: Python<'py>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.document_call(py, user_id, agent_name, |m, scope| async move {
            m.reload_memory(scope).await
        })
    }

    /// Clears memory: everything of the user without an agent, one bucket's facts with one.
    #[pyo3(signature = (user_id=None, agent_name=None))]
    fn clear_memory<'py>(
        &self,
        py: Python<'py>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.document_call(py, user_id, agent_name, |m, scope| async move {
            m.clear_memory(scope).await
        })
    }

    /// Not supported by DeerMem (`NotImplementedError`, as the reference).
    #[pyo3(signature = (user_id=None, agent_name=None))]
    fn delete_memory(
        &self,
        py: Python<'_>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<()> {
        let scope = convert::scope(user_id, agent_name)?;
        let shared = self.shared(py)?;
        shared.call(py, shared.manager.delete_memory(scope))
    }

    /// Replaces the bucket with a memory document (the public camelCase shape). The facts are
    /// converted and checked one at a time and trimmed by the capacity policy as they arrive
    /// ([`deermem_engine::ImportTrim`]), so a list of any length costs memory in proportion to
    /// `max_facts`, not to its length; the Python DeerMem's leniency applies (a blank or absent
    /// id is generated, a confidence is coerced with `float()`).
    #[pyo3(signature = (memory_data, user_id=None, agent_name=None))]
    fn import_memory<'py>(
        &self,
        py: Python<'py>,
        memory_data: &Bound<'py, PyAny>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let scope = convert::scope(user_id, agent_name)?;
        let (mut head, facts) = import_head(memory_data)?;
        let shared = self.shared(py)?;
        let Some(deermem) = shared.backend.deermem().cloned() else {
            return Err(PyRuntimeError::new_err(
                "import_memory needs the DeerMem engine",
            ));
        };
        let mut trim = shared.call(py, deermem.import_trim(&scope))?;
        if let Some(facts) = facts {
            let mut chunk = Vec::with_capacity(IMPORT_CHUNK);
            for (i, item) in facts.try_iter()?.enumerate() {
                chunk.push(import_fact(i, &item?)?);
                if chunk.len() == IMPORT_CHUNK {
                    push_chunk(py, &mut trim, &mut chunk)?;
                }
            }
            push_chunk(py, &mut trim, &mut chunk)?;
        }
        head.facts = trim.finish();
        let doc = shared.call(py, shared.manager.import_memory(head, scope))?;
        document(py, &doc)
    }

    /// Creates a fact; returns `(document, fact_id)`, the id `None` when the capacity policy
    /// evicted the new fact at once (nothing stored).
    #[pyo3(signature = (content, category=None, confidence=None, user_id=None, agent_name=None))]
    fn create_fact<'py>(
        &self,
        py: Python<'py>,
        content: &Bound<'py, PyAny>,
        category: Option<&Bound<'py, PyAny>>,
        confidence: Option<&Bound<'py, PyAny>>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let content = required_text(content, "content")?;
        let category = match category {
            Some(c) => text_arg(c, "category")?.unwrap_or_default(),
            None => String::new(),
        };
        let confidence = confidence
            .map(confidence_arg)
            .transpose()?
            .flatten()
            .unwrap_or(0.5);
        let scope = convert::scope(user_id, agent_name)?;
        let shared = self.shared(py)?;
        let fact = NewFact {
            content,
            category,
            confidence,
        };
        let (doc, id) = shared.call(py, shared.manager.create_fact(fact, scope))?;
        let doc = document(py, &doc)?;
        PyTuple::new(py, [doc, convert::to_py(py, &serde_json::json!(id))?])
    }

    /// Updates the given fields of a fact (`None` keeps a field).
    #[pyo3(signature = (fact_id, content=None, category=None, confidence=None, user_id=None, agent_name=None))]
    #[allow(clippy::too_many_arguments)]
    fn update_fact<'py>(
        &self,
        py: Python<'py>,
        fact_id: &Bound<'py, PyAny>,
        content: Option<&Bound<'py, PyAny>>,
        category: Option<&Bound<'py, PyAny>>,
        confidence: Option<&Bound<'py, PyAny>>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fact_id = required_text(fact_id, "fact_id")?;
        let patch = FactPatch {
            content: content
                .map(|c| text_arg(c, "content"))
                .transpose()?
                .flatten(),
            category: category
                .map(|c| text_arg(c, "category"))
                .transpose()?
                .flatten(),
            confidence: confidence.map(confidence_arg).transpose()?.flatten(),
            expected_revision: None,
        };
        self.document_call(py, user_id, agent_name, |m, scope| async move {
            m.update_fact(&fact_id, patch, scope).await
        })
    }

    /// Deletes a fact (`KeyError` when it does not exist).
    #[pyo3(signature = (fact_id, user_id=None, agent_name=None))]
    fn delete_fact<'py>(
        &self,
        py: Python<'py>,
        fact_id: &Bound<'py, PyAny>,
        user_id: Option<&str>,
        agent_name: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fact_id = required_text(fact_id, "fact_id")?;
        self.document_call(py, user_id, agent_name, |m, scope| async move {
            m.delete_fact(&fact_id, None, scope).await
        })
    }

    /// Drains pending updates within `timeout` seconds (a hard limit); true only when the
    /// drain finished in time.
    fn shutdown_flush(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        if timeout.is_nan() {
            return Err(PyValueError::new_err("timeout must be a number of seconds"));
        }
        let budget = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
        let shared = self.shared(py)?;
        let m = &shared.manager;
        Ok(shared.run(py, async {
            // The engine keeps its own deadline for the drain; this bounds the call even if it
            // did not, with a grace for what follows the drain (counting the turn journal's
            // leftovers for the log), so a drained queue is not reported as undrained.
            tokio::time::timeout(
                budget.saturating_add(Duration::from_secs(2)),
                m.shutdown_flush(budget),
            )
            .await
            .unwrap_or(false)
        }))
    }

    /// Warms the token counter: `True` when ready, `False` when warming failed.
    fn warm(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        let shared = self.shared(py)?;
        Ok(shared.run(py, shared.manager.warm()))
    }

    /// Rebuilds the whole derived search index; false when the rebuild failed.
    fn warm_retrieval(&self, py: Python<'_>) -> PyResult<bool> {
        let shared = self.shared(py)?;
        let Some(deermem) = shared.backend.deermem() else {
            return Ok(true);
        };
        let report = shared.run(py, deermem.warm_retrieval());
        Ok(!report.fatal)
    }

    /// Detaches this handle; the engine is closed (its storage and index released) when no
    /// other handle of the configuration is attached. A later call attaches again.
    fn close(&self, py: Python<'_>) {
        let pid = std::process::id();
        let attached = self.attached.write().take();
        let Some(a) = attached else {
            return;
        };
        if a.pid != pid {
            std::mem::forget(a);
            return;
        }
        if a.shared.handles.fetch_sub(1, Ordering::SeqCst) == 1 {
            a.shared.process.remove(&self.key, &a.shared);
            let m = &a.shared.manager;
            a.shared.run(py, m.close());
        }
    }
}

/// The absolute storage root `config` selects now (the facade's resolution: `storage_path`,
/// relative to `$DEER_FLOW_HOME` or the working directory, else `$DEERMEM_DATA_DIR`,
/// `$DEER_FLOW_HOME`, `~/.deermem`), with symbolic links resolved when it exists.
fn resolved_root(config: &MemoryConfig) -> PyResult<String> {
    let env = deermem::process_env;
    let root = deermem::storage_root(config, &BuildOptions::new(&env));
    let root = std::path::absolute(&root).unwrap_or(root);
    let root = std::fs::canonicalize(&root).unwrap_or(root);
    root.into_os_string().into_string().map_err(|p| {
        PyValueError::new_err(format!(
            "storage_path resolves to {}, which is not valid UTF-8",
            std::path::Path::new(&p).display()
        ))
    })
}

/// A digest of the environment variables a configuration refers to (`$NAME` values and the
/// variables `*_env` keys name), so managers whose variables differ get their own engines; the
/// values themselves never appear in the key.
fn environment_digest(config: &serde_json::Map<String, Value>) -> String {
    use sha2::{Digest, Sha256};

    fn names(key: &str, v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::String(s) => {
                if let Some(name) = s.strip_prefix('$') {
                    out.insert(name.to_owned());
                }
                if key.ends_with("_env") {
                    out.insert(s.clone());
                }
            }
            Value::Array(items) => items.iter().for_each(|x| names(key, x, out)),
            Value::Object(m) => m.iter().for_each(|(k, x)| names(k, x, out)),
            _ => {}
        }
    }
    let mut found = std::collections::BTreeSet::new();
    config.iter().for_each(|(k, v)| names(k, v, &mut found));
    let mut hash = Sha256::new();
    for name in &found {
        hash.update(name.as_bytes());
        match std::env::var_os(name) {
            Some(value) => {
                hash.update(b"=");
                hash.update(value.as_encoded_bytes());
            }
            None => hash.update(b" unset"),
        }
        hash.update(b"\0");
    }
    hash.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A string argument, `None` for `None`; any other type is a `TypeError`.
fn text_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<String>> {
    if obj.is_none() {
        return Ok(None);
    }
    let s = obj
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("{name} must be a string")))?;
    Ok(Some(s.to_str()?.to_owned()))
}

/// A string argument that must be given (`None` is a `TypeError` too).
fn required_text(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    text_arg(obj, name)?.ok_or_else(|| PyTypeError::new_err(format!("{name} must be a string")))
}

/// A confidence argument: a real number (`ValueError("confidence")` for anything the engine
/// would refuse is left to the engine, which owns the range).
fn confidence_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
    if obj.is_none() {
        return Ok(None);
    }
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err("confidence must be a number"));
    }
    obj.extract::<f64>()
        .map(Some)
        .map_err(|_| PyTypeError::new_err("confidence must be a number"))
}

/// Import facts converted with the GIL held before each hand-over to the trim, which runs
/// without it.
const IMPORT_CHUNK: usize = 256;

/// How long `add` keeps offering a turn refused for the pending-byte limits before it raises.
const ADMISSION_WAIT: Duration = Duration::from_secs(5);
/// The pause between two offers of a refused turn.
const ADMISSION_POLL: Duration = Duration::from_millis(100);

/// Hands the converted facts to the trim with the GIL released.
fn push_chunk(
    py: Python<'_>,
    trim: &mut deermem_engine::ImportTrim,
    chunk: &mut Vec<deermem_core::PublicFact>,
) -> PyResult<()> {
    let batch = std::mem::take(chunk);
    py.detach(|| batch.into_iter().try_for_each(|f| trim.push(f)))
        .map_err(|e| errors::to_py(py, e))
}

/// An import document without its facts, and its `facts` list (not converted): a mapping
/// whose `user` and `history` are mappings and `facts` a list or tuple, in the public
/// camelCase shape.
fn import_head<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(PublicMemoryDocument, Option<Bound<'py, PyAny>>)> {
    let py = obj.py();
    let Ok(dict) = obj.cast::<PyDict>() else {
        return Err(coded(py, "memory_data", "memory_data must be a mapping"));
    };
    let mut head = serde_json::Map::new();
    let mut facts = None;
    for (k, v) in dict.iter() {
        let Ok(key) = k.cast::<PyString>() else {
            return Err(coded(py, "memory_data", "memory_data keys must be strings"));
        };
        let key = key.to_str()?;
        if key == "facts" {
            if v.is_none() {
                continue;
            }
            if !(v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>()) {
                return Err(coded(
                    py,
                    "memory_data.facts",
                    "memory_data.facts must be a list",
                ));
            }
            facts = Some(v);
            continue;
        }
        let value = convert::to_value(&v, Strictness::Strict).map_err(|e| {
            coded(
                py,
                "memory_data",
                &format!("memory_data cannot be read: {}", e.value(py)),
            )
        })?;
        if !value.is_null() {
            head.insert(key.to_owned(), value);
        }
    }
    for key in ["user", "history"] {
        if head.get(key).is_some_and(|v| !v.is_object()) {
            return Err(coded(
                py,
                &format!("memory_data.{key}"),
                &format!("memory_data.{key} must be a mapping"),
            ));
        }
    }
    let document =
        serde_json::from_value::<PublicMemoryDocument>(Value::Object(head)).map_err(|e| {
            coded(
                py,
                "memory_data",
                &format!("memory_data is not a memory document: {e}"),
            )
        })?;
    Ok((document, facts))
}

/// One fact of an import document, as the Python DeerMem reads it: a `None` or absent id is
/// left blank (the engine generates one), and the confidence is Python's `float()` of it, 0.5
/// when it is `None`, cannot be converted or is not finite, clamped into [0, 1] as DeerFlow's
/// router clamps it.
fn import_fact(i: usize, obj: &Bound<'_, PyAny>) -> PyResult<deermem_core::PublicFact> {
    let py = obj.py();
    let not_a_fact = |why: String| {
        coded(
            py,
            "memory_data.facts",
            &format!("memory_data.facts[{i}] is not a fact: {why}"),
        )
    };
    let Ok(dict) = obj.cast::<PyDict>() else {
        return Err(not_a_fact("not a mapping".into()));
    };
    let mut map = serde_json::Map::new();
    for (k, v) in dict.iter() {
        let Ok(key) = k.cast::<PyString>() else {
            return Err(not_a_fact("keys must be strings".into()));
        };
        let key = key.to_str()?;
        match key {
            "confidence" => {
                map.insert(key.to_owned(), serde_json::json!(lenient_confidence(&v)));
            }
            "id" if v.is_none() => {}
            _ => {
                let value = convert::to_value(&v, Strictness::Strict)
                    .map_err(|e| not_a_fact(e.value(py).to_string()))?;
                map.insert(key.to_owned(), value);
            }
        }
    }
    serde_json::from_value(Value::Object(map)).map_err(|e| not_a_fact(e.to_string()))
}

/// The Python DeerMem's confidence coercion (see [`import_fact`]).
fn lenient_confidence(obj: &Bound<'_, PyAny>) -> f64 {
    const DEFAULT: f64 = 0.5;
    if obj.is_none() {
        return DEFAULT;
    }
    let float = obj
        .py()
        .get_type::<PyFloat>()
        .call1((obj,))
        .and_then(|f| f.extract::<f64>());
    match float {
        Ok(f) if f.is_finite() => f.clamp(0.0, 1.0),
        _ => DEFAULT,
    }
}

/// `ValueError(code)` with a detail, through the same path as the engine's errors.
fn coded(py: Python<'_>, code: &str, detail: &str) -> PyErr {
    let message = if detail.starts_with(code) {
        detail.to_owned()
    } else {
        format!("{code}: {detail}")
    };
    errors::to_py(
        py,
        deermem_core::ManagerError::invalid(deermem_core::InvalidInputCode::MemoryData, message),
    )
}
