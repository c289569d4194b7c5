//! Logging on stderr (stdout stays machine-readable: JSON output, MCP over stdio): the level
//! from `-v` or `DEERMEM_LOG`, colour only when stderr is a terminal and `NO_COLOR` is unset
//! (MCP hosts capture stderr into log files), and rmcp's WARN for each JSON-RPC error it
//! answers dropped: such an error is the client's mistake, and the MCP server logs it at DEBUG
//! itself.

use std::ffi::OsStr;
use std::io::IsTerminal;

use tracing::{Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

/// Installs the stderr logger for `verbose` (`-v` count). A command that reports a read
/// answered empty under a fail-open policy in its own one-line error (`reports_failed_reads`)
/// silences the backend's warning about it, which would say the same thing twice.
pub(crate) fn init(verbose: u8, reports_failed_reads: bool) {
    let mut default = match verbose {
        0 => "warn",
        1 => "info,deermem=debug",
        _ => "debug",
    }
    .to_owned();
    if reports_failed_reads && verbose == 0 {
        default.push_str(&format!(
            ",{}=off",
            deermem_core::ports::FAIL_OPEN_LOG_TARGET
        ));
    }
    let env = EnvFilter::try_from_env("DEERMEM_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let layer = fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi)
        .with_filter(filter_fn(|meta| !is_answered_error_warning(meta)).and(env));
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// Colour only on a terminal, and never when `NO_COLOR` is set to a non-empty value
/// (no-color.org).
pub(crate) fn use_colour(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// rmcp's WARN event for an error answered to a request (`response error`, with the request
/// `id` and the `error`).
fn is_answered_error_warning(meta: &Metadata<'_>) -> bool {
    meta.is_event()
        && *meta.level() == Level::WARN
        && meta.target() == "rmcp::service"
        && meta.fields().field("id").is_some()
        && meta.fields().field("error").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_needs_a_terminal_and_no_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some(OsStr::new("1"))));
    }
}
