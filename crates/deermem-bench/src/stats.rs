//! Latency samples and their summary: operations per second over the wall-clock time of the
//! whole workload, and the 50th / 99th percentile of the per-operation latencies (nearest rank).

use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

/// What one workload measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadResult {
    /// Operations counted for throughput (facts for `rebuild_index`, users for `migrate_v1`).
    pub n: usize,
    /// Wall-clock time of the measured phase.
    pub elapsed: Duration,
    /// Per-operation latencies.
    pub samples: Vec<Duration>,
    /// Workload-specific figures (counts, derived rates).
    pub extra: Map<String, Value>,
}

impl WorkloadResult {
    /// Adds a workload-specific figure.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_owned(), value);
        self
    }

    /// The summary of the samples.
    pub fn summary(&self) -> Summary {
        let mut us: Vec<f64> = self.samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        let secs = self.elapsed.as_secs_f64();
        Summary {
            n: self.n,
            ops_per_sec: if secs > 0.0 {
                self.n as f64 / secs
            } else {
                0.0
            },
            p50_us: percentile(&us, 50.0),
            p99_us: percentile(&us, 99.0),
            mean_us: if us.is_empty() {
                0.0
            } else {
                us.iter().sum::<f64>() / us.len() as f64
            },
            elapsed_s: secs,
        }
    }
}

/// The figures reported for one workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Operations.
    pub n: usize,
    /// `n` over the wall-clock time.
    pub ops_per_sec: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// Wall-clock time of the measured phase, s.
    pub elapsed_s: f64,
}

impl Summary {
    /// The summary as JSON (rounded to 0.1 µs / 0.1 op/s).
    pub fn to_json(&self) -> Value {
        let r = |x: f64| (x * 10.0).round() / 10.0;
        json!({
            "n": self.n,
            "ops_per_sec": r(self.ops_per_sec),
            "p50_us": r(self.p50_us),
            "p99_us": r(self.p99_us),
            "mean_us": r(self.mean_us),
            "elapsed_s": (self.elapsed_s * 1e4).round() / 1e4,
        })
    }
}

/// The nearest-rank percentile of sorted values (0 for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Collects per-operation latencies and the wall-clock time around them.
#[derive(Debug)]
pub struct Recorder {
    started: Instant,
    samples: Vec<Duration>,
}

impl Recorder {
    /// Starts the wall clock.
    pub fn start(capacity: usize) -> Self {
        Self {
            started: Instant::now(),
            samples: Vec::with_capacity(capacity),
        }
    }

    /// Records one latency.
    pub fn push(&mut self, d: Duration) {
        self.samples.push(d);
    }

    /// Stops the wall clock, excluding `untimed` (setup done between measured operations).
    pub fn finish(self, n: usize, untimed: Duration) -> WorkloadResult {
        WorkloadResult {
            n,
            elapsed: self.started.elapsed().saturating_sub(untimed),
            samples: self.samples,
            extra: Map::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), 2.0);
    }

    #[test]
    fn summary_uses_wall_time_for_throughput() {
        let r = WorkloadResult {
            n: 10,
            elapsed: Duration::from_secs(2),
            samples: vec![Duration::from_micros(100); 10],
            extra: Map::new(),
        };
        let s = r.summary();
        assert_eq!(s.ops_per_sec, 5.0);
        assert_eq!(s.p50_us, 100.0);
        assert_eq!(s.mean_us, 100.0);
        assert_eq!(s.to_json()["n"], 10);
    }
}
