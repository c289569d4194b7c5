//! Engine log events forwarded to Python's `logging` (logger `deermem_rs`), never to stderr.
//!
//! A `tracing` layer is installed as this library's global subscriber when the module loads.
//! Events below the logger's effective level are dropped without touching Python: the level
//! is cached and re-read at most once a second, from the package's own entry points (which
//! hold the GIL anyway), so an engine thread never waits for the GIL to decide. An event
//! that passes is formatted as `message key=value ...` and handed to `logger.log` with the
//! GIL taken for the call; during interpreter shutdown it is dropped.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// The logger name.
const LOGGER: &str = "deermem_rs";

/// Python's numeric levels.
const PY_TRACE: u8 = 5;
const PY_DEBUG: u8 = 10;
const PY_INFO: u8 = 20;
const PY_WARNING: u8 = 30;
const PY_ERROR: u8 = 40;

/// The logger's effective level (Python's WARNING until first read).
static THRESHOLD: AtomicU8 = AtomicU8::new(PY_WARNING);
/// When the level was last read, in milliseconds since [`epoch`] (0: never).
static REFRESHED_MS: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn py_level(level: Level) -> u8 {
    match level {
        Level::TRACE => PY_TRACE,
        Level::DEBUG => PY_DEBUG,
        Level::INFO => PY_INFO,
        Level::WARN => PY_WARNING,
        Level::ERROR => PY_ERROR,
    }
}

/// Re-reads the logger's effective level now (Python calls this after changing levels, and
/// the package calls it at construction).
#[pyfunction]
pub(crate) fn refresh_log_level(py: Python<'_>) -> PyResult<u8> {
    let level: i64 = py
        .import("logging")?
        .call_method1("getLogger", (LOGGER,))?
        .call_method0("getEffectiveLevel")?
        .extract()?;
    let level = u8::try_from(level.clamp(0, 255)).unwrap_or(PY_WARNING);
    THRESHOLD.store(level, Ordering::Relaxed);
    let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
    REFRESHED_MS.store(now.max(1), Ordering::Relaxed);
    Ok(level)
}

/// Re-reads the level when the cached one is more than a second old (cheap otherwise).
pub(crate) fn refresh_if_stale(py: Python<'_>) {
    let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
    let last = REFRESHED_MS.load(Ordering::Relaxed);
    if last == 0 || now.saturating_sub(last) >= 1000 {
        let _ = refresh_log_level(py);
    }
}

/// Collects an event's message and fields.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

/// The layer forwarding events to Python.
struct PythonLogging;

impl<S: Subscriber> Layer<S> for PythonLogging {
    // The level can change at run time, so no call site's interest is cached.
    fn register_callsite(&self, _metadata: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        py_level(*metadata.level()) >= THRESHOLD.load(Ordering::Relaxed)
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let level = py_level(*meta.level());
        if level < THRESHOLD.load(Ordering::Relaxed) {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let text = format!("{}{}", line.message, line.fields);
        let target = meta.target();
        Python::try_attach(|py| {
            let _ = (|| -> PyResult<()> {
                let logger = py.import("logging")?.call_method1("getLogger", (LOGGER,))?;
                let extra = PyDict::new(py);
                extra.set_item("rust_target", target)?;
                let kwargs = PyDict::new(py);
                kwargs.set_item("extra", extra)?;
                logger.call_method("log", (level, "%s", &text), Some(&kwargs))?;
                Ok(())
            })();
        });
    }
}

/// Installs the layer as this library's global `tracing` subscriber (once).
pub(crate) fn install() {
    let _ = epoch();
    let _ =
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PythonLogging));
}
