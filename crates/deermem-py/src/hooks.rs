//! The host hooks DeerFlow passes to `from_config`, honoured as DeerMem honours them:
//!
//! - `should_keep_hidden_message(additional_kwargs) -> bool` decides about hidden user turns
//!   (the engine's structural rule when absent);
//! - `extraction_callback(metrics)` receives the metrics of every extraction attempt;
//! - `callbacks.on_memory_llm_call` / `on_memory_llm_result` run around every model call;
//! - `trace_context_manager(trace_id)` is entered around the Python calls made for a turn
//!   with a trace id (the host model call, the callbacks, the metrics);
//! - the host chat model (from `host_llm_factory`) answers the extraction prompt through the
//!   `LanguageModel` port ([`PyLlm`]): `invoke(messages, config=...)` on a blocking thread that
//!   holds the GIL only for the call.
//!
//! A hook that raises is logged on the `deermem_rs` logger with its traceback and the turn
//! goes on without it. Hooks are kept in a [`HookSlot`] shared by the engine, so the latest
//! `from_config` of a configuration supplies the hooks of the one engine it shares.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use deermem_core::LlmError;
use deermem_core::ports::{ChatRequest, ChatResponse, ChatRole, LanguageModel, TokenUsage};
use deermem_updater::HiddenMessagePolicy;
use deermem_updater::is_human_input_response;
use deermem_updater::{ExtractionReport, LlmCallInfo, LlmResultInfo, UpdateObserver};
use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};
use serde_json::{Map, Value, json};

use crate::convert;

/// The hooks of one `from_config` call (each `None` when not given).
#[derive(Default)]
pub(crate) struct HookSet {
    /// A `MemoryCallbacks`-shaped object.
    pub(crate) callbacks: Option<Py<PyAny>>,
    /// `should_keep_hidden_message`.
    pub(crate) keep_hidden: Option<Py<PyAny>>,
    /// `trace_context_manager`.
    pub(crate) trace_cm: Option<Py<PyAny>>,
    /// `extraction_callback`.
    pub(crate) extraction: Option<Py<PyAny>>,
    /// The host chat model.
    pub(crate) host_llm: Option<Py<PyAny>>,
}

/// The hooks an engine currently uses.
#[derive(Default)]
pub(crate) struct HookSlot(RwLock<Arc<HookSet>>);

impl std::fmt::Debug for HookSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookSlot")
    }
}

impl HookSlot {
    pub(crate) fn get(&self) -> Arc<HookSet> {
        Arc::clone(&self.0.read())
    }

    pub(crate) fn set(&self, hooks: Arc<HookSet>) {
        *self.0.write() = hooks;
    }
}

/// Logs a hook's exception, with its traceback, on the `deermem_rs` logger.
pub(crate) fn log_hook_error(py: Python<'_>, hook: &str, err: &PyErr) {
    let logged = (|| -> PyResult<()> {
        let logger = py
            .import("logging")?
            .call_method1("getLogger", ("deermem_rs",))?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("exc_info", err.value(py))?;
        logger.call_method(
            "warning",
            ("memory hook %s raised; the turn goes on without it", hook),
            Some(&kwargs),
        )?;
        Ok(())
    })();
    if logged.is_err() {
        tracing::warn!(hook, error = %err, "memory hook raised; the turn goes on without it");
    }
}

/// Runs `f` inside `trace_context_manager(trace_id)` when both are given.
fn with_trace<R>(
    py: Python<'_>,
    hooks: &HookSet,
    trace_id: Option<&str>,
    f: impl FnOnce() -> R,
) -> R {
    let entered = match (&hooks.trace_cm, trace_id) {
        (Some(tcm), Some(trace)) => {
            let cm = tcm.bind(py).call1((trace,)).and_then(|cm| {
                cm.call_method0("__enter__")?;
                Ok(cm)
            });
            match cm {
                Ok(cm) => Some(cm),
                Err(e) => {
                    log_hook_error(py, "trace_context_manager", &e);
                    None
                }
            }
        }
        _ => None,
    };
    let out = f();
    if let Some(cm) = entered
        && let Err(e) = cm.call_method1("__exit__", (py.None(), py.None(), py.None()))
    {
        log_hook_error(py, "trace_context_manager", &e);
    }
    out
}

/// The hidden-message rule: the host's hook when given, else the engine's structural rule
/// (which is also the answer when the hook raises).
pub(crate) fn hidden_policy(slot: Arc<HookSlot>) -> HiddenMessagePolicy {
    HiddenMessagePolicy::with_hook(Arc::new(move |kwargs: &Map<String, Value>| {
        let hooks = slot.get();
        let Some(hook) = &hooks.keep_hidden else {
            return is_human_input_response(kwargs);
        };
        Python::try_attach(|py| {
            let answer = convert::to_py(py, &Value::Object(kwargs.clone()))
                .and_then(|d| hook.bind(py).call1((d,)))
                .and_then(|v| v.is_truthy());
            match answer {
                Ok(keep) => keep,
                Err(e) => {
                    log_hook_error(py, "should_keep_hidden_message", &e);
                    is_human_input_response(kwargs)
                }
            }
        })
        .unwrap_or_else(|| is_human_input_response(kwargs))
    }))
}

thread_local! {
    /// The model call the updater announced on this thread and is about to make: the
    /// observer's `on_llm_call` is invoked synchronously right before `complete` on the same
    /// thread, so [`PyLlm::complete`] picks it up eagerly (before its future is created) to
    /// learn the thread, user and trace of the call.
    static PENDING_CALL: RefCell<Option<LlmCallInfo>> = const { RefCell::new(None) };
}

/// `TokenUsage` in LangChain's `usage_metadata` shape.
fn usage_value(usage: Option<TokenUsage>) -> Value {
    usage.map_or(Value::Null, |u| {
        json!({
            "input_tokens": u.prompt_tokens,
            "output_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        })
    })
}

/// The initial `invoke_config` of a memory model call.
fn invoke_config(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let cfg = PyDict::new(py);
    cfg.set_item("run_name", "memory_agent")?;
    Ok(cfg)
}

fn call_kwargs<'py>(
    py: Python<'py>,
    call: &LlmCallInfo,
    model_name: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let kw = PyDict::new(py);
    kw.set_item("thread_id", &call.thread_id)?;
    kw.set_item("user_id", call.user_id.as_deref())?;
    kw.set_item("trace_id", call.trace_id.as_deref())?;
    kw.set_item("model_name", model_name)?;
    Ok(kw)
}

/// `callbacks.on_memory_llm_call(config, thread_id=, user_id=, trace_id=, model_name=)`, what it
/// raises logged.
fn report_llm_call(
    py: Python<'_>,
    cb: &Py<PyAny>,
    cfg: PyResult<Bound<'_, PyDict>>,
    call: &LlmCallInfo,
    model_name: Option<&str>,
) {
    let r = cfg.and_then(|cfg| {
        let kw = call_kwargs(py, call, model_name)?;
        cb.bind(py)
            .call_method("on_memory_llm_call", (cfg,), Some(&kw))
    });
    if let Err(e) = r {
        log_hook_error(py, "callbacks.on_memory_llm_call", &e);
    }
}

/// `callbacks.on_memory_llm_result(config, prompt=, response=, error=, duration_ms=,
/// model_name=)` with `outcome` the prompt, the response and the error, what it raises logged.
fn report_llm_result<'py>(
    py: Python<'py>,
    cb: &Py<PyAny>,
    cfg: PyResult<Bound<'py, PyDict>>,
    outcome: [Bound<'py, PyAny>; 3],
    duration: std::time::Duration,
    model_name: Option<&str>,
) {
    let [prompt, response, error] = outcome;
    let r = cfg.and_then(|cfg| {
        let kw = PyDict::new(py);
        kw.set_item("prompt", prompt)?;
        kw.set_item("response", response)?;
        kw.set_item("error", error)?;
        kw.set_item("duration_ms", duration.as_secs_f64() * 1000.0)?;
        kw.set_item("model_name", model_name)?;
        cb.bind(py)
            .call_method("on_memory_llm_result", (cfg,), Some(&kw))
    });
    if let Err(e) = r {
        log_hook_error(py, "callbacks.on_memory_llm_result", &e);
    }
}

/// Receives the engine's extraction events and forwards them to the host hooks.
#[derive(Debug)]
pub(crate) struct PyObserver {
    slot: Arc<HookSlot>,
    /// The model is the host's: [`PyLlm`] calls the model-call callbacks itself, with the
    /// prompt and the response objects.
    host_llm: bool,
}

impl PyObserver {
    pub(crate) fn new(slot: Arc<HookSlot>, host_llm: bool) -> Self {
        Self { slot, host_llm }
    }
}

impl UpdateObserver for PyObserver {
    fn on_llm_call(&self, call: &LlmCallInfo) {
        if self.host_llm {
            PENDING_CALL.with(|p| *p.borrow_mut() = Some(call.clone()));
            return;
        }
        let hooks = self.slot.get();
        let Some(cb) = &hooks.callbacks else {
            return;
        };
        Python::try_attach(|py| {
            with_trace(py, &hooks, call.trace_id.as_deref(), || {
                report_llm_call(py, cb, invoke_config(py), call, Some(&call.model_name));
            });
        });
    }

    fn on_llm_result(&self, result: &LlmResultInfo) {
        if self.host_llm {
            return;
        }
        let hooks = self.slot.get();
        let Some(cb) = &hooks.callbacks else {
            return;
        };
        Python::try_attach(|py| {
            with_trace(py, &hooks, result.call.trace_id.as_deref(), || {
                let error = match &result.error {
                    Some(e) => pyo3::exceptions::PyRuntimeError::new_err(e.clone())
                        .value(py)
                        .clone()
                        .into_any(),
                    None => py.None().into_bound(py),
                };
                let none = py.None().into_bound(py);
                let outcome = [none.clone(), none, error];
                let model = Some(result.call.model_name.as_str());
                report_llm_result(py, cb, invoke_config(py), outcome, result.duration, model);
            });
        });
    }

    fn on_extraction(&self, report: &ExtractionReport) {
        let hooks = self.slot.get();
        let Some(cb) = &hooks.extraction else {
            return;
        };
        let mut m = Map::new();
        m.insert("thread_id".into(), Value::from(report.thread_id.clone()));
        m.insert("user_id".into(), json!(report.user_id));
        m.insert("trace_id".into(), json!(report.trace_id));
        // With the host's model there is no configured model name, as in the reference.
        let model = if self.host_llm {
            None
        } else {
            report.model_name.clone()
        };
        m.insert("model_name".into(), json!(model));
        m.insert("success".into(), Value::Bool(report.success));
        m.insert("token_usage".into(), usage_value(report.token_usage));
        // The metrics' own keys, in their order, but for the parser's count the reference
        // does not report.
        if let Some(Value::Object(mut metrics)) =
            report.metrics.and_then(|x| serde_json::to_value(x).ok())
        {
            metrics.shift_remove("dropped_malformed");
            m.extend(metrics);
        }
        let payload = Value::Object(m);
        Python::try_attach(|py| {
            with_trace(py, &hooks, report.trace_id.as_deref(), || {
                let r = convert::to_py(py, &payload).and_then(|p| cb.bind(py).call1((p,)));
                if let Err(e) = r {
                    log_hook_error(py, "extraction_callback", &e);
                }
            });
        });
    }
}

/// LangChain's message classes, when `langchain_core` is importable (the prompt is then the
/// message objects the reference passes; otherwise role/content dicts, which LangChain chat
/// models also accept).
static LANGCHAIN_MESSAGES: PyOnceLock<Option<MessageClasses>> = PyOnceLock::new();

/// `SystemMessage`, `HumanMessage` and `AIMessage`.
type MessageClasses = (Py<PyAny>, Py<PyAny>, Py<PyAny>);

fn prompt<'py>(
    py: Python<'py>,
    messages: &[deermem_core::ports::ChatMessage],
) -> PyResult<Bound<'py, PyList>> {
    let classes = LANGCHAIN_MESSAGES.get_or_init(py, || {
        let m = py.import("langchain_core.messages").ok()?;
        Some((
            m.getattr("SystemMessage").ok()?.unbind(),
            m.getattr("HumanMessage").ok()?.unbind(),
            m.getattr("AIMessage").ok()?.unbind(),
        ))
    });
    let list = PyList::empty(py);
    for msg in messages {
        let item = match classes {
            Some((system, human, ai)) => {
                let cls = match msg.role {
                    ChatRole::System => system,
                    ChatRole::User => human,
                    ChatRole::Assistant => ai,
                };
                let kw = PyDict::new(py);
                kw.set_item("content", &msg.content)?;
                cls.bind(py).call((), Some(&kw))?
            }
            None => {
                let d = PyDict::new(py);
                let role = match msg.role {
                    ChatRole::System => "system",
                    ChatRole::User => "user",
                    ChatRole::Assistant => "assistant",
                };
                d.set_item("role", role)?;
                d.set_item("content", &msg.content)?;
                d.into_any()
            }
        };
        list.append(item)?;
    }
    Ok(list)
}

/// Token usage from a LangChain `usage_metadata` dict.
fn usage_of(response: &Bound<'_, PyAny>) -> Option<TokenUsage> {
    let meta = convert::attr(response, "usage_metadata")?;
    let get = |k: &str| {
        convert::dict_get(&meta, k)
            .and_then(|v| v.extract::<u64>().ok())
            .unwrap_or(0)
    };
    Some(TokenUsage {
        prompt_tokens: get("input_tokens"),
        completion_tokens: get("output_tokens"),
    })
}

/// One call of the host model, with the GIL held only here (on a blocking thread).
fn invoke_host(
    hooks: &HookSet,
    call: &LlmCallInfo,
    messages: &[deermem_core::ports::ChatMessage],
) -> Result<ChatResponse, LlmError> {
    let Some(model) = &hooks.host_llm else {
        return Err(LlmError::NotConfigured);
    };
    Python::try_attach(|py| {
        with_trace(py, hooks, call.trace_id.as_deref(), || {
            let prompt = prompt(py, messages)
                .map_err(|e| LlmError::InvalidResponse(format!("cannot build the prompt: {e}")))?;
            let cfg = invoke_config(py)
                .map_err(|e| LlmError::Transport(format!("cannot build invoke config: {e}")))?;
            if let Some(cb) = &hooks.callbacks {
                report_llm_call(py, cb, Ok(cfg.clone()), call, None);
            }
            let started = Instant::now();
            let kw = PyDict::new(py);
            let result = kw
                .set_item("config", &cfg)
                .and_then(|()| model.bind(py).call_method("invoke", (&prompt,), Some(&kw)));
            if let Some(cb) = &hooks.callbacks {
                let none = py.None().into_bound(py);
                let (response, error) = match &result {
                    Ok(resp) => (resp.clone(), none),
                    Err(e) => (none, e.value(py).clone().into_any()),
                };
                let outcome = [prompt.clone().into_any(), response, error];
                report_llm_result(py, cb, Ok(cfg.clone()), outcome, started.elapsed(), None);
            }
            let response =
                result.map_err(|e| LlmError::Transport(format!("the host model raised: {e}")))?;
            let content = if response.is_instance_of::<PyString>() {
                convert::content_text(&response)
            } else {
                match convert::attr(&response, "content") {
                    Some(c) => convert::content_text(&c),
                    None => {
                        return Err(LlmError::InvalidResponse(
                            "the host model's answer has no `content`".into(),
                        ));
                    }
                }
            }
            .map_err(|e| LlmError::InvalidResponse(e.to_string()))?;
            Ok(ChatResponse {
                content,
                model: None,
                usage: usage_of(&response),
            })
        })
    })
    .unwrap_or_else(|| {
        Err(LlmError::Transport(
            "the Python interpreter is shutting down".into(),
        ))
    })
}

/// The host's chat model behind the `LanguageModel` port.
#[derive(Debug)]
pub(crate) struct PyLlm {
    slot: Arc<HookSlot>,
    name: String,
}

impl PyLlm {
    /// The host model in `slot`, named `name` in logs.
    pub(crate) fn new(slot: Arc<HookSlot>, name: String) -> Self {
        Self { slot, name }
    }
}

impl LanguageModel for PyLlm {
    fn model_name(&self) -> &str {
        &self.name
    }

    // Written out (not `async fn`) so the call announced on this thread is taken before the
    // future exists, wherever the future is later polled.
    fn complete<'life0, 'life1, 'async_trait>(
        &'life0 self,
        request: &'life1 ChatRequest,
    ) -> Pin<Box<dyn Future<Output = Result<ChatResponse, LlmError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        let call = PENDING_CALL
            .with(|p| p.borrow_mut().take())
            .unwrap_or_else(|| LlmCallInfo {
                thread_id: String::new(),
                user_id: None,
                trace_id: None,
                model_name: self.name.clone(),
            });
        let hooks = self.slot.get();
        let messages = request.messages.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || invoke_host(&hooks, &call, &messages))
                .await
                .unwrap_or_else(|e| {
                    Err(LlmError::Transport(format!(
                        "the host model call did not finish: {e}"
                    )))
                })
        })
    }
}
