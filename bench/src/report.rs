//! Tables on stdout, and files under bench/results/: markdown and JSON stamped with the date,
//! the machine and versions, plus an SVG chart of latency per path per RTT.

use crate::scenarios::{Measurement, Resources};
use plotters::prelude::*;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;

mod blog;
mod scale;
mod staleness;
mod targets;

pub struct Report {
    pub date: String,
    pub quick: bool,
    pub machine: Value,
    pub proxy_overhead_ms: f64,
    pub measurements: Vec<Measurement>,
    pub resources: Vec<Resources>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# Ferry benchmark{}\n",
            if self.quick { " (quick)" } else { "" }
        );
        let _ = writeln!(s, "- date: {}", self.date);
        let _ = writeln!(s, "- machine: {}", self.machine);
        let _ = writeln!(
            s,
            "- latency proxy's own cost per round trip (subtract it): {:.3} ms\n",
            self.proxy_overhead_ms
        );
        for scenario in ["redis", "postgres", "keys", "one client"] {
            let rows: Vec<_> = self
                .measurements
                .iter()
                .filter(|m| m.scenario == scenario)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(s, "## {scenario}\n");
            let ips = scenario == "keys";
            let _ = writeln!(
                s,
                "| RTT ms | path | avg ms | min … max ms | p75 ms | p99 ms |{}",
                if ips { " i/s |" } else { "" }
            );
            let _ = writeln!(
                s,
                "|---|---|---|---|---|---|{}",
                if ips { "---|" } else { "" }
            );
            for m in rows {
                let Some(l) = &m.latency else { continue };
                let [avg, range, p75, p99] = l.cells();
                let extra = if ips {
                    format!(
                        " {:.1} |",
                        m.figures["iterations_per_s"].as_f64().unwrap_or(0.0)
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {avg} | {range} | {p75} | {p99} |{extra}",
                    m.rtt_ms, m.path
                );
            }
            s.push('\n');
        }
        let conns: Vec<_> = self
            .measurements
            .iter()
            .filter(|m| m.scenario == "connections")
            .collect();
        if !conns.is_empty() {
            let _ = writeln!(s, "## connections (Redis maxclients 30, 5 ms RTT)\n");
            let _ = writeln!(
                s,
                "| path | requests | ok | errors | peak Redis clients |\n|---|---|---|---|---|"
            );
            for m in conns {
                let f = &m.figures;
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    m.path, f["requests"], f["ok"], f["errors"], f["peak_redis_clients"]
                );
            }
            s.push('\n');
        }
        let tp: Vec<_> = self
            .measurements
            .iter()
            .filter(|m| m.scenario == "throughput")
            .collect();
        if !tp.is_empty() {
            let _ = writeln!(s, "## throughput (loopback, equal concurrency)\n");
            let _ = writeln!(
                s,
                "| path | concurrency | requests/s | server CPU ms per 1,000 | Postgres CPU ms per 1,000 |\n|---|---|---|---|---|"
            );
            for m in tp.iter().filter(|m| m.figures.get("rps").is_some()) {
                let f = &m.figures;
                let ms = |k: &str| f[k].as_f64().map_or("-".to_string(), |v| format!("{v:.1}"));
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    m.path,
                    f["concurrency"],
                    f["rps"],
                    ms("server_cpu_ms_per_1k"),
                    ms("postgres_cpu_ms_per_1k")
                );
            }
            for m in tp.iter().filter(|m| m.figures.get("connections").is_some()) {
                let f = &m.figures;
                let _ = writeln!(
                    s,
                    "\n{}: {} of {} answered; sidecar RSS {} MB before, {} MB while held.",
                    m.path, f["ok"], f["connections"], f["rss_before_mb"], f["rss_held_mb"]
                );
            }
            s.push('\n');
        }
        let pinned: Vec<_> = self
            .measurements
            .iter()
            .filter(|m| m.scenario == "pinned")
            .collect();
        if !pinned.is_empty() {
            let _ = writeln!(
                s,
                "## pinned (wrk / pgbench on core 0; servers, Redis, Postgres on core 1), then unpinned\n"
            );
            let _ = writeln!(
                s,
                "| path | requests/s | errors | server CPU µs/req | Redis µs/req | Postgres µs/req | load generator µs/req |\n|---|---|---|---|---|---|---|"
            );
            for m in pinned {
                let f = &m.figures;
                let us = |k: &str| f[k].as_f64().map_or("-".to_string(), |v| format!("{v:.1}"));
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    m.path,
                    f["rps"],
                    f["errors"],
                    us("server_cpu_us"),
                    us("redis_cpu_us"),
                    us("postgres_cpu_us"),
                    us("generator_cpu_us")
                );
            }
            s.push('\n');
        }
        for m in self.measurements.iter().filter(|m| m.scenario == "replay") {
            let f = &m.figures;
            let _ = writeln!(s, "## replay store at full signed load\n");
            let _ = writeln!(
                s,
                "| run | requests/s | served | refused | RSS start / window filled / max after (MB) | bytes per request/s |\n|---|---|---|---|---|---|"
            );
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} / {} / {} | {} |\n",
                m.path,
                f["rps"],
                f["served"],
                f["refused"],
                f["rss_start_mb"],
                f["rss_window_filled_mb"],
                f["rss_max_after_mb"],
                f["bytes_per_request_per_s"]
            );
        }
        self.scale_markdown(&mut s);
        self.staleness_markdown(&mut s);
        self.blog_markdown(&mut s);
        if !self.resources.is_empty() {
            let _ = writeln!(s, "## sidecar resources per scenario\n");
            let _ = writeln!(
                s,
                "| scenario | peak RSS MB | CPU (% of one core) | seconds |\n|---|---|---|---|"
            );
            for r in &self.resources {
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {:.0} | {:.1} |",
                    r.scenario, r.peak_rss_mb, r.cpu_core_pct, r.seconds
                );
            }
            s.push('\n');
        }
        let targets = self.targets();
        if !targets.is_empty() {
            let _ = writeln!(s, "## targets\n\n| target | met | figures |\n|---|---|---|");
            for t in targets {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} |",
                    t.name,
                    if t.met { "yes" } else { "**no**" },
                    t.detail
                );
            }
        }
        s
    }

    pub fn json(&self) -> Value {
        json!({
            "date": self.date,
            "quick": self.quick,
            "machine": self.machine,
            "proxy_overhead_ms": self.proxy_overhead_ms,
            "measurements": self.measurements,
            "resources": self.resources,
            "targets": self.targets().iter().map(|t| json!({"target": t.name, "met": t.met, "figures": t.detail})).collect::<Vec<_>>(),
        })
    }

    /// Mean latency per path against RTT, for the redis and postgres scenarios.
    pub fn chart(&self, path: &Path) -> Result<(), String> {
        let series: Vec<(String, Vec<(f64, f64)>)> = {
            let mut names: Vec<String> = Vec::new();
            for m in &self.measurements {
                if matches!(m.scenario, "redis" | "postgres") {
                    let n = format!("{}: {}", m.scenario, m.path);
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
            names
                .into_iter()
                .map(|n| {
                    let pts = self
                        .measurements
                        .iter()
                        .filter(|m| format!("{}: {}", m.scenario, m.path) == n)
                        .filter_map(|m| m.latency.as_ref().map(|l| (m.rtt_ms, l.avg_ms)))
                        .collect();
                    (n, pts)
                })
                .collect()
        };
        if series.is_empty() {
            return Ok(());
        }
        let max_y = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
            .fold(1.0f64, f64::max)
            * 1.1;
        line_chart(
            path,
            &Axes {
                caption: "Mean latency per request vs round-trip time",
                x_desc: "round-trip time edge <-> data centre (ms)",
                y_desc: "mean latency (ms)",
                x: 0.0..5.5,
                y: 0.0..max_y,
                height: 560,
                legend: SeriesLabelPosition::UpperLeft,
                dots: true,
            },
            &series,
        )
    }
}

/// How one chart is laid out.
pub(crate) struct Axes {
    pub caption: &'static str,
    pub x_desc: &'static str,
    pub y_desc: &'static str,
    pub x: std::ops::Range<f64>,
    pub y: std::ops::Range<f64>,
    pub height: u32,
    pub legend: SeriesLabelPosition,
    /// Mark each point, not only the line.
    pub dots: bool,
}

/// Named series as lines on an SVG: both charts of the report.
pub(crate) fn line_chart(
    path: &Path,
    axes: &Axes,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, axes.height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(axes.caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(axes.x.clone(), axes.y.clone())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        if axes.dots {
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
        }
    }
    chart
        .configure_series_labels()
        .position(axes.legend.clone())
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
