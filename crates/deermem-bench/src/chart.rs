//! The scale report as an SVG chart, written by hand (no plotting dependency): on the left the
//! p50 latencies of the four workloads against the store size, on the right the memory of the
//! rebuild and of the serving process and the serve process's time to readiness. Both axes of
//! the left panel are logarithmic, the size axis of the right one too.

use std::fmt::Write as _;

use serde_json::Value;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 400.0;
const PANEL_W: f64 = 380.0;
const PANEL_H: f64 = 270.0;
const TOP: f64 = 60.0;
const LEFT: [f64; 2] = [70.0, 560.0];
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#17becf", "#ff7f0e",
];

/// One plotted line: a label and its points (size in facts, value).
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

/// The values of `key` of the entries of one workload, by size.
fn series(entries: &[Value], workload: &str, key: &str, scale: f64, label: &str) -> Series {
    let mut points: Vec<(f64, f64)> = entries
        .iter()
        .filter(|e| e["workload"].as_str() == Some(workload))
        .filter_map(|e| Some((e["size"].as_f64()?, e[key].as_f64()? * scale)))
        .filter(|(x, y)| *x > 0.0 && y.is_finite() && *y >= 0.0)
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    Series {
        label: label.to_owned(),
        points,
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A logarithmic axis over `[lo, hi]` (powers of ten around the data).
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl LogAxis {
    fn around(values: impl Iterator<Item = f64>) -> Self {
        let (mut lo, mut hi) = (f64::MAX, f64::MIN);
        for v in values.filter(|v| *v > 0.0) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if lo > hi {
            return Self { lo: 1.0, hi: 10.0 };
        }
        let lo = 10f64.powf(lo.log10().floor());
        let mut hi = 10f64.powf(hi.log10().ceil());
        if hi <= lo {
            hi = lo * 10.0;
        }
        Self { lo, hi }
    }

    /// Position in `[0, 1]`.
    fn at(&self, v: f64) -> f64 {
        (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
    }

    fn ticks(&self) -> Vec<f64> {
        let mut out = Vec::new();
        let mut t = self.lo;
        while t <= self.hi * 1.0001 {
            out.push(t);
            t *= 10.0;
        }
        out
    }
}

fn tick_label(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

/// Draws one panel: frame, ticks, lines with markers and a legend.
fn panel(out: &mut String, index: usize, title: &str, y_label: &str, lines: &[Series]) {
    let left = LEFT[index];
    let x_axis = LogAxis::around(lines.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let y_axis = LogAxis::around(lines.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let px = |x: f64| left + x_axis.at(x) * PANEL_W;
    let py = |y: f64| TOP + PANEL_H - y_axis.at(y) * PANEL_H;
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"##,
        left,
        TOP - 25.0,
        escape(title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{left:.1}" y="{TOP:.1}" width="{PANEL_W:.1}" height="{PANEL_H:.1}" fill="none" stroke="#444"/>"##
    );
    for t in x_axis.ticks() {
        let x = px(t);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{TOP:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            TOP + PANEL_H,
            TOP + PANEL_H + 15.0,
            tick_label(t)
        );
    }
    for t in y_axis.ticks() {
        let y = py(t);
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            left + PANEL_W,
            left - 5.0,
            y + 4.0,
            tick_label(t)
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">facts in the store (log)</text>"##,
        left + PANEL_W / 2.0,
        TOP + PANEL_H + 32.0
    );
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle" transform="rotate(-90 {:.1} {:.1})">{}</text>"##,
        left - 45.0,
        TOP + PANEL_H / 2.0,
        left - 45.0,
        TOP + PANEL_H / 2.0,
        escape(y_label)
    );
    for (i, s) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        if path.len() > 1 {
            let _ = writeln!(
                out,
                r##"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"##,
                path.join(" ")
            );
        }
        for (x, y) in &s.points {
            let _ = writeln!(
                out,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"##,
                px(*x),
                py(*y)
            );
        }
        let ly = TOP + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{:.1}" width="10" height="10" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"##,
            left + 8.0,
            ly - 9.0,
            left + 22.0,
            ly,
            escape(&s.label)
        );
    }
}

/// The chart of a scale report (`{"store", "entries": [...], "machine"}`).
pub fn svg(report: &Value) -> String {
    let empty = Vec::new();
    let entries = report["entries"].as_array().unwrap_or(&empty);
    let store = report["store"].as_str().unwrap_or("file");
    // A workload the report does not hold (older reports have no `search_warm`) is left out.
    let latency: Vec<Series> = [
        series(entries, "search", "p50_us", 1.0, "search p50"),
        series(entries, "get_context", "p50_us", 1.0, "get_context p50"),
        series(
            entries,
            "load_scope_cold",
            "p50_us",
            1.0,
            "load_scope_cold p50",
        ),
        series(entries, "write_fact", "p50_us", 1.0, "write_fact p50"),
        series(
            entries,
            "search_warm",
            "p50_us",
            1.0,
            "search p50, pages cached",
        ),
        series(
            entries,
            "search_from_disk",
            "p50_us",
            1.0,
            "search p50, pages read from the disk",
        ),
    ]
    .into_iter()
    .filter(|s| !s.points.is_empty())
    .collect();
    let mib = 1.0 / 1024.0;
    let memory = [
        series(
            entries,
            "rebuild_index",
            "peak_rss_kb",
            mib,
            "rebuild peak RSS (MiB)",
        ),
        series(
            entries,
            "serve",
            "rss_kb",
            mib,
            "serve RSS after every user (MiB)",
        ),
        series(entries, "serve", "ready_s", 1000.0, "serve readiness (ms)"),
    ];
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">"##
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="white"/><text x="{:.1}" y="18" font-size="12" text-anchor="middle">DeerMem scale run ({} store, 100 facts per user): {}</text>"##,
        WIDTH / 2.0,
        escape(store),
        escape(report["machine"]["cpu"].as_str().unwrap_or("")),
    );
    panel(&mut out, 0, "Latency (p50, µs, log)", "µs", &latency);
    panel(
        &mut out,
        1,
        "Memory (MiB) and readiness (ms), log",
        "MiB / ms",
        &memory,
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_chart_plots_every_series_and_escapes_text() {
        let report = json!({
            "store": "file<x>",
            "machine": {"cpu": "AMD & co"},
            "entries": [
                {"size": 20000, "workload": "search", "p50_us": 40.0},
                {"size": 200000, "workload": "search", "p50_us": 55.0},
                {"size": 20000, "workload": "serve", "rss_kb": 80000, "ready_s": 0.2},
                {"size": 200000, "workload": "serve", "rss_kb": 90000, "ready_s": 0.3},
            ]
        });
        let s = svg(&report);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"), "{s}");
        assert!(
            s.contains("file&lt;x&gt;") && s.contains("AMD &amp; co"),
            "{s}"
        );
        // search (2 points), serve RSS and readiness (2 each): three polylines.
        assert_eq!(s.matches("<polyline").count(), 3, "{s}");
        assert!(s.contains(">10k<") && s.contains(">100k<"), "{s}");
        // Latency workloads the report does not hold get no legend entry.
        assert!(
            s.contains(">search p50<") && !s.contains("pages cached"),
            "{s}"
        );
    }

    #[test]
    fn the_warm_search_has_its_own_line() {
        let report = json!({
            "store": "file",
            "entries": [
                {"size": 20000, "workload": "search", "p50_us": 300.0},
                {"size": 1000000, "workload": "search", "p50_us": 1100.0},
                {"size": 20000, "workload": "search_warm", "p50_us": 290.0},
                {"size": 1000000, "workload": "search_warm", "p50_us": 350.0},
                {"size": 20000, "workload": "search_from_disk", "p50_us": 900.0},
                {"size": 1000000, "workload": "search_from_disk", "p50_us": 1200.0},
            ]
        });
        let s = svg(&report);
        assert!(s.contains(">search p50, pages cached<"), "{s}");
        assert!(s.contains(">search p50, pages read from the disk<"), "{s}");
        assert_eq!(s.matches("<polyline").count(), 3, "{s}");
    }

    #[test]
    fn every_line_of_a_panel_has_its_own_colour() {
        let workloads = [
            "search",
            "get_context",
            "load_scope_cold",
            "write_fact",
            "search_warm",
            "search_from_disk",
        ];
        let entries: Vec<Value> = workloads
            .iter()
            .flat_map(|w| {
                [20_000, 1_000_000]
                    .map(|size| json!({"size": size, "workload": w, "p50_us": 100.0}))
            })
            .collect();
        let s = svg(&json!({"store": "file", "entries": entries}));
        let strokes: std::collections::BTreeSet<&str> = s
            .split("<polyline")
            .skip(1)
            .filter_map(|l| l.split("stroke=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(strokes.len(), workloads.len(), "{s}");
    }

    #[test]
    fn log_axes_cover_the_data() {
        let a = LogAxis::around([20_000.0, 1_000_000.0].into_iter());
        assert!((a.lo - 10_000.0).abs() < 1e-6 && (a.hi - 1_000_000.0).abs() < 1e-3);
        assert!((a.at(1_000_000.0) - 1.0).abs() < 1e-9);
        assert!(a.at(10_000.0).abs() < 1e-9);
        let empty = LogAxis::around(std::iter::empty());
        assert_eq!((empty.lo, empty.hi), (1.0, 10.0));
    }
}
