//! Prometheus metrics, hand-written: request counts by route, method and status, a latency
//! histogram, requests in flight, plus gauges and counters the host feeds (update-queue depth,
//! extraction outcomes, gate rejections). Rendered in the Prometheus text format 0.0.4.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// Upper bounds of the latency histogram buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How many distinct values a host-fed label (outcome, gate) may take; further values are
/// counted under `other`, so a misbehaving caller cannot grow the exposition without bound.
pub const MAX_HOST_LABEL_VALUES: usize = 64;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
struct Inner {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<(String, String), Histogram>>,
    in_flight: AtomicI64,
    queue_depth: AtomicU64,
    extraction: Mutex<BTreeMap<String, u64>>,
    gate_rejections: Mutex<BTreeMap<String, u64>>,
}

/// The metrics registry of one gateway. Cheap to clone; clones share the numbers, so the host
/// keeps one to feed the updater's figures.
#[derive(Clone, Default)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("in_flight", &self.inner.in_flight.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Decrements the in-flight gauge when dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Metrics);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// A fresh registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the number of conversations waiting in the memory update queue.
    pub fn set_queue_depth(&self, depth: u64) {
        self.inner.queue_depth.store(depth, Ordering::Relaxed);
    }

    /// Counts one extraction outcome (e.g. `committed`, `no_change`, `llm_error`).
    pub fn inc_extraction_outcome(&self, outcome: &str) {
        bump_capped(&self.inner.extraction, outcome);
    }

    /// Counts one proposal rejected by a gate (e.g. `scope`, `confidence`, `duplicate`).
    pub fn inc_gate_rejection(&self, gate: &str) {
        bump_capped(&self.inner.gate_rejections, gate);
    }

    /// The number of requests being served now.
    pub fn in_flight(&self) -> i64 {
        self.inner.in_flight.load(Ordering::Relaxed)
    }

    /// The number of finished requests with this route template, method and status.
    pub fn request_count(&self, route: &str, method: &str, status: u16) -> u64 {
        self.inner
            .requests
            .lock()
            .get(&(route.to_owned(), method.to_owned(), status))
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn start_request(&self) -> InFlight {
        self.inner.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    pub(crate) fn record_request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        *self
            .inner
            .requests
            .lock()
            .entry((route.to_owned(), method.to_owned(), status))
            .or_insert(0) += 1;
        let secs = elapsed.as_secs_f64();
        let mut lat = self.inner.latency.lock();
        let h = lat
            .entry((route.to_owned(), method.to_owned()))
            .or_default();
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *bound {
                h.buckets[i] += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }

    /// The exposition text. `ready` feeds the `deermem_gateway_ready` gauge.
    pub fn render(&self, ready: bool) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "deermem_http_requests_total",
            "counter",
            "HTTP requests served, by route template, method and status code.",
        );
        for ((route, method, status), n) in self.inner.requests.lock().iter() {
            let _ = writeln!(
                out,
                "deermem_http_requests_total{{route=\"{}\",method=\"{}\",status=\"{status}\"}} {n}",
                escape(route),
                escape(method)
            );
        }
        header(
            &mut out,
            "deermem_http_request_duration_seconds",
            "histogram",
            "Time to answer an HTTP request, by route template and method.",
        );
        for ((route, method), h) in self.inner.latency.lock().iter() {
            let labels = format!("route=\"{}\",method=\"{}\"", escape(route), escape(method));
            for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "deermem_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {}",
                    h.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "deermem_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "deermem_http_request_duration_seconds_sum{{{labels}}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "deermem_http_request_duration_seconds_count{{{labels}}} {}",
                h.count
            );
        }
        header(
            &mut out,
            "deermem_http_requests_in_flight",
            "gauge",
            "HTTP requests being served now.",
        );
        let _ = writeln!(out, "deermem_http_requests_in_flight {}", self.in_flight());
        header(
            &mut out,
            "deermem_memory_queue_depth",
            "gauge",
            "Conversations waiting in the memory update queue.",
        );
        let _ = writeln!(
            out,
            "deermem_memory_queue_depth {}",
            self.inner.queue_depth.load(Ordering::Relaxed)
        );
        header(
            &mut out,
            "deermem_extraction_outcomes_total",
            "counter",
            "Memory extraction runs, by outcome.",
        );
        for (outcome, n) in self.inner.extraction.lock().iter() {
            let _ = writeln!(
                out,
                "deermem_extraction_outcomes_total{{outcome=\"{}\"}} {n}",
                escape(outcome)
            );
        }
        header(
            &mut out,
            "deermem_gate_rejections_total",
            "counter",
            "Proposed memory updates rejected, by gate.",
        );
        for (gate, n) in self.inner.gate_rejections.lock().iter() {
            let _ = writeln!(
                out,
                "deermem_gate_rejections_total{{gate=\"{}\"}} {n}",
                escape(gate)
            );
        }
        header(
            &mut out,
            "deermem_gateway_ready",
            "gauge",
            "1 when the gateway is ready to serve, 0 while starting or stopping.",
        );
        let _ = writeln!(out, "deermem_gateway_ready {}", u8::from(ready));
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Normalises a host-fed label value: at most 64 characters of `[A-Za-z0-9_.-]` (others become
/// `_`), empty becomes `unknown`.
fn label_value(v: &str) -> String {
    let s: String = v
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "unknown".into() } else { s }
}

fn bump_capped(map: &Mutex<BTreeMap<String, u64>>, raw: &str) {
    let key = label_value(raw);
    let mut m = map.lock();
    let key = if m.contains_key(&key) || m.len() < MAX_HOST_LABEL_VALUES {
        key
    } else {
        "other".to_owned()
    };
    *m.entry(key).or_insert(0) += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_host_figures() {
        let m = Metrics::new();
        m.record_request("/api/memory", "GET", 200, Duration::from_millis(20));
        m.record_request("/api/memory", "GET", 200, Duration::from_secs(3));
        m.set_queue_depth(7);
        m.inc_extraction_outcome("committed");
        m.inc_extraction_outcome("committed");
        m.inc_gate_rejection("scope gate\n\"x\"");
        let text = m.render(true);
        assert!(text.contains(
            "deermem_http_requests_total{route=\"/api/memory\",method=\"GET\",status=\"200\"} 2"
        ));
        assert!(text.contains(
            "deermem_http_request_duration_seconds_bucket{route=\"/api/memory\",method=\"GET\",le=\"0.025\"} 1"
        ));
        assert!(text.contains(
            "deermem_http_request_duration_seconds_bucket{route=\"/api/memory\",method=\"GET\",le=\"5\"} 2"
        ));
        assert!(text.contains(
            "deermem_http_request_duration_seconds_count{route=\"/api/memory\",method=\"GET\"} 2"
        ));
        assert!(text.contains("deermem_memory_queue_depth 7"));
        assert!(text.contains("deermem_extraction_outcomes_total{outcome=\"committed\"} 2"));
        assert!(text.contains("deermem_gate_rejections_total{gate=\"scope_gate__x_\"} 1"));
        assert!(text.contains("deermem_gateway_ready 1"));
        assert!(text.contains("# TYPE deermem_http_request_duration_seconds histogram"));
        assert_eq!(m.request_count("/api/memory", "GET", 200), 2);
    }

    #[test]
    fn host_labels_are_capped() {
        let m = Metrics::new();
        for i in 0..(MAX_HOST_LABEL_VALUES + 10) {
            m.inc_gate_rejection(&format!("gate{i}"));
        }
        let text = m.render(false);
        assert!(
            text.contains("deermem_gate_rejections_total{gate=\"other\"} 10"),
            "{text}"
        );
        assert!(text.contains("deermem_gateway_ready 0"));
    }

    #[test]
    fn in_flight_guard_counts() {
        let m = Metrics::new();
        let g = m.start_request();
        assert_eq!(m.in_flight(), 1);
        drop(g);
        assert_eq!(m.in_flight(), 0);
    }

    #[test]
    fn escapes_route_labels() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
