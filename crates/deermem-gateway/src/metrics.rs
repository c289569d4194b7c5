//! Prometheus metrics with `prometheus-client`: request counts by route, method and status, a
//! latency histogram, requests in flight, plus gauges and counters the host feeds (update-queue
//! depth, extraction outcomes, gate rejections), and the turn journal's pending and dead counts
//! read at each scrape. Exposed in the OpenMetrics 1.0 text format (a counter's family is named
//! without its `_total` suffix; its samples keep it).

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use deermem_core::ports::turn_journal::TurnCounts;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the latency histogram buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How many distinct values a host-fed label (outcome, gate) may take; further values are
/// counted under `other`, so a misbehaving caller cannot grow the exposition without bound.
pub const MAX_HOST_LABEL_VALUES: usize = 64;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    #[prometheus(flatten)]
    route: RouteLabels,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    method: String,
}

impl RouteLabels {
    fn new(route: &str, method: &str) -> Self {
        let (route, method) = (route.to_owned(), method.to_owned());
        Self { route, method }
    }
}

/// A host-fed label (`outcome`, `gate`) and its value.
type HostLabel = [(&'static str, String); 1];

type Gauge64 = Gauge<i64, AtomicI64>;

struct Inner {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram, fn() -> Histogram>,
    in_flight: Gauge64,
    queue_depth: Gauge64,
    extraction: Family<HostLabel, Counter>,
    gate_rejections: Family<HostLabel, Counter>,
    preflights: Family<[(&'static str, String); 2], Counter>,
    ready: Gauge64,
    /// The turn journal's gauges, in a registry of their own: encoded only when a scrape could
    /// read the journal.
    turns_registry: Registry,
    turns_pending: Gauge64,
    turns_dead: Gauge64,
    /// How many values the host-fed labels (outcome, gate) took; held while one is admitted,
    /// so the cap is exact.
    host_labels: Mutex<(usize, usize)>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

impl Default for Inner {
    fn default() -> Self {
        let mut inner = Self {
            registry: Registry::default(),
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            in_flight: Gauge::default(),
            queue_depth: Gauge::default(),
            extraction: Family::default(),
            gate_rejections: Family::default(),
            preflights: Family::default(),
            ready: Gauge::default(),
            turns_registry: Registry::default(),
            turns_pending: Gauge::default(),
            turns_dead: Gauge::default(),
            host_labels: Mutex::new((0, 0)),
        };
        // Each metric: its registry, name, help text (without its final period: the encoder
        // adds it) and field.
        macro_rules! register {
            ($($registry:ident $name:literal $help:literal $field:ident;)*) => {
                $(inner.$registry.register($name, $help, inner.$field.clone());)*
            };
        }
        register! {
            registry "deermem_http_requests"
                "HTTP requests served, by route template, method and status code" requests;
            registry "deermem_http_request_duration_seconds"
                "Time to answer an HTTP request, by route template and method" latency;
            registry "deermem_http_requests_in_flight" "HTTP requests being served now" in_flight;
            registry "deermem_memory_queue_depth"
                "Conversations waiting in the memory update queue" queue_depth;
            registry "deermem_extraction_outcomes" "Memory extraction runs, by outcome" extraction;
            registry "deermem_gate_rejections"
                "Proposed memory updates rejected, by gate" gate_rejections;
            registry "deermem_cors_preflights"
                "CORS preflight requests, by origin (refused origins count as other) and verdict"
                preflights;
            registry "deermem_gateway_ready"
                "1 when the gateway is ready to serve, 0 while starting or stopping" ready;
            turns_registry "deermem_turns_pending"
                "Accepted turns in the turn journal waiting for their first or next extraction attempt"
                turns_pending;
            turns_registry "deermem_turns_dead"
                "Turns in the turn journal whose attempts are spent (dead-lettered), kept until an operator retries or drops them"
                turns_dead;
        }
        inner
    }
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
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

/// Decrements the in-flight gauge when dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Metrics);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inner.in_flight.dec();
    }
}

impl Metrics {
    /// A fresh registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the number of conversations waiting in the memory update queue.
    pub fn set_queue_depth(&self, depth: u64) {
        self.inner
            .queue_depth
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// Counts one extraction outcome (e.g. `committed`, `no_change`, `llm_error`).
    pub fn inc_extraction_outcome(&self, outcome: &str) {
        let admitted = &mut self.inner.host_labels.lock().0;
        bump(&self.inner.extraction, admitted, "outcome", outcome);
    }

    /// Counts one proposal rejected by a gate (e.g. `scope`, `confidence`, `duplicate`).
    pub fn inc_gate_rejection(&self, gate: &str) {
        let admitted = &mut self.inner.host_labels.lock().1;
        bump(&self.inner.gate_rejections, admitted, "gate", gate);
    }

    /// The number of requests being served now.
    pub fn in_flight(&self) -> i64 {
        self.inner.in_flight.get()
    }

    /// The number of finished requests with this route template, method and status.
    pub fn request_count(&self, route: &str, method: &str, status: u16) -> u64 {
        let route = RouteLabels::new(route, method);
        let labels = RequestLabels { route, status };
        self.inner.requests.get(&labels).map_or(0, |c| c.get())
    }

    pub(crate) fn start_request(&self) -> InFlight {
        self.inner.in_flight.inc();
        InFlight(self.clone())
    }

    /// The number of CORS preflights counted under `origin` (the allowing entry, or `other`)
    /// with `verdict` (`allowed`, or anything else for `refused`).
    pub fn preflight_count(&self, origin: &str, verdict: &str) -> u64 {
        let labels = preflight_labels(origin, verdict == "allowed");
        self.inner.preflights.get(&labels).map_or(0, |c| c.get())
    }

    /// Counts a CORS preflight under the configured entry that allowed its origin (the origin,
    /// or `*`), or under `other` when refused, so that clients cannot grow the exposition
    /// without bound (the log line names a refused origin).
    pub(crate) fn record_preflight(&self, allowed_by: Option<&str>) {
        let labels = preflight_labels(allowed_by.unwrap_or("other"), allowed_by.is_some());
        self.inner.preflights.get_or_create(&labels).inc();
    }

    pub(crate) fn record_request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        let route = RouteLabels::new(route, method);
        let latency = self.inner.latency.get_or_create(&route);
        latency.observe(elapsed.as_secs_f64());
        drop(latency);
        let labels = RequestLabels { route, status };
        self.inner.requests.get_or_create(&labels).inc();
    }

    /// The exposition text (OpenMetrics, ending with `# EOF`). `ready` feeds the
    /// `deermem_gateway_ready` gauge.
    pub fn render(&self, ready: bool) -> String {
        self.render_with_turns(ready, None)
    }

    /// As [`Metrics::render`], with the turn journal's counts as the `deermem_turns_pending`
    /// and `deermem_turns_dead` gauges; `None` (no journal, or one that could not be read)
    /// leaves both out.
    pub fn render_with_turns(&self, ready: bool, turns: Option<TurnCounts>) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        self.inner.ready.set(i64::from(ready));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.inner.registry);
        if let Some(counts) = turns {
            let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            self.inner.turns_pending.set(gauge(counts.pending));
            self.inner.turns_dead.set(gauge(counts.dead));
            let _ = encode_registry(&mut out, &self.inner.turns_registry);
        }
        let _ = encode_eof(&mut out);
        out
    }
}

fn preflight_labels(origin: &str, allowed: bool) -> [(&'static str, String); 2] {
    let verdict = if allowed { "allowed" } else { "refused" };
    [
        ("origin", origin.to_owned()),
        ("verdict", verdict.to_owned()),
    ]
}

/// Counts a host-fed label value; past [`MAX_HOST_LABEL_VALUES`] distinct values, a new one
/// counts under `other`.
fn bump(family: &Family<HostLabel, Counter>, admitted: &mut usize, key: &'static str, raw: &str) {
    let value = [(key, label_value(raw))];
    let value = if family.get(&value).is_some() {
        value
    } else if *admitted < MAX_HOST_LABEL_VALUES {
        *admitted += 1;
        value
    } else {
        [(key, "other".into())]
    };
    family.get_or_create(&value).inc();
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
        for line in [
            "deermem_http_requests_total{route=\"/api/memory\",method=\"GET\",status=\"200\"} 2",
            "deermem_http_request_duration_seconds_bucket{le=\"0.025\",route=\"/api/memory\",method=\"GET\"} 1",
            "deermem_http_request_duration_seconds_bucket{le=\"5.0\",route=\"/api/memory\",method=\"GET\"} 2",
            "deermem_http_request_duration_seconds_bucket{le=\"+Inf\",route=\"/api/memory\",method=\"GET\"} 2",
            "deermem_http_request_duration_seconds_count{route=\"/api/memory\",method=\"GET\"} 2",
            "deermem_memory_queue_depth 7",
            "deermem_extraction_outcomes_total{outcome=\"committed\"} 2",
            "deermem_gate_rejections_total{gate=\"scope_gate__x_\"} 1",
            "deermem_gateway_ready 1",
            "# TYPE deermem_http_request_duration_seconds histogram",
            "# TYPE deermem_http_requests counter",
            "# HELP deermem_http_requests HTTP requests served, by route template, method and status code.",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(m.request_count("/api/memory", "GET", 200), 2);
        assert_eq!(m.request_count("/api/memory", "GET", 404), 0);
    }

    #[test]
    fn host_labels_are_capped() {
        let m = Metrics::new();
        for i in 0..(MAX_HOST_LABEL_VALUES + 10) {
            m.inc_gate_rejection(&format!("gate{i}"));
        }
        m.inc_gate_rejection("gate0");
        let text = m.render(false);
        assert!(
            text.contains("deermem_gate_rejections_total{gate=\"other\"} 10"),
            "{text}"
        );
        assert!(text.contains("deermem_gate_rejections_total{gate=\"gate0\"} 2"));
        assert!(text.contains("deermem_gateway_ready 0"));
    }

    #[test]
    fn turn_gauges_only_with_counts() {
        let m = Metrics::new();
        let text = m.render(true);
        assert!(!text.contains("deermem_turns_"), "{text}");
        let text = m.render_with_turns(
            true,
            Some(TurnCounts {
                pending: 3,
                dead: 2,
            }),
        );
        for line in [
            "# TYPE deermem_turns_pending gauge",
            "deermem_turns_pending 3",
            "# TYPE deermem_turns_dead gauge",
            "deermem_turns_dead 2",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.ends_with("deermem_turns_dead 2\n# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        let text = m.render_with_turns(true, None);
        assert!(!text.contains("deermem_turns_"), "{text}");
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
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.record_request("a\"b\\c\nd", "GET", 404, Duration::ZERO);
        let text = m.render(true);
        assert!(
            text.contains("deermem_http_requests_total{route=\"a\\\"b\\\\c\\nd\",method=\"GET\",status=\"404\"} 1"),
            "{text}"
        );
    }
}
