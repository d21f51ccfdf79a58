//! Tables on stdout, and files under bench/results/: markdown and JSON stamped with the date,
//! the machine and versions, plus an SVG chart of latency per path per RTT.

use crate::scenarios::{Measurement, Resources};
use plotters::prelude::*;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;

pub struct Report {
    pub date: String,
    pub quick: bool,
    pub machine: Value,
    pub proxy_overhead_ms: f64,
    pub measurements: Vec<Measurement>,
    pub resources: Vec<Resources>,
}

/// A target from the issue, checked against this run.
pub struct Target {
    pub name: String,
    pub met: bool,
    pub detail: String,
}

impl Report {
    fn find(&self, scenario: &str, rtt: f64, path_starts: &str) -> Option<&Measurement> {
        self.measurements.iter().find(|m| {
            m.scenario == scenario
                && (m.rtt_ms - rtt).abs() < 1e-9
                && m.path.starts_with(path_starts)
        })
    }

    fn avg(&self, scenario: &str, rtt: f64, path: &str) -> Option<f64> {
        self.find(scenario, rtt, path)
            .and_then(|m| m.latency.as_ref())
            .map(|l| l.avg_ms)
    }

    fn p50(&self, scenario: &str, rtt: f64, path: &str) -> Option<f64> {
        self.find(scenario, rtt, path)
            .and_then(|m| m.latency.as_ref())
            .map(|l| l.p50_ms)
    }

    pub fn targets(&self) -> Vec<Target> {
        let mut t = Vec::new();
        let mut push = |name: &str, v: Option<(bool, String)>| {
            if let Some((met, detail)) = v {
                t.push(Target {
                    name: name.into(),
                    met,
                    detail,
                });
            }
        };
        push(
            "redis @5 ms: Ferry mean <= 1/3 of direct",
            (|| {
                let (d, f) = (
                    self.avg("redis", 5.0, "direct")?,
                    self.avg("redis", 5.0, "Ferry")?,
                );
                Some((
                    f * 3.0 <= d,
                    format!("Ferry {f:.2} ms vs direct {d:.2} ms: {:.2}x", d / f),
                ))
            })(),
        );
        push(
            "redis @5 ms: Ferry p50 <= RTT + 0.5 ms",
            (|| {
                let p = self.p50("redis", 5.0, "Ferry")?;
                Some((p <= 5.5, format!("p50 {p:.2} ms")))
            })(),
        );
        push(
            "postgres @5 ms: Ferry uncached mean <= 1/2 of direct",
            (|| {
                let (d, f) = (
                    self.avg("postgres", 5.0, "direct")?,
                    self.avg("postgres", 5.0, "Ferry uncached")?,
                );
                Some((
                    f * 2.0 <= d,
                    format!("Ferry {f:.2} ms vs direct {d:.2} ms: {:.2}x", d / f),
                ))
            })(),
        );
        push(
            "postgres @5 ms: Ferry cached p50 <= RTT + 0.5 ms",
            (|| {
                let p = self.p50("postgres", 5.0, "Ferry cached")?;
                Some((p <= 5.5, format!("p50 {p:.2} ms")))
            })(),
        );
        for size in ["100 B", "50 KB"] {
            push(
                &format!("keys {size} @1 ms: batch >= 20x sequential, >= 3x 10 concurrent"),
                (|| {
                    let s = self.avg("keys", 1.0, &format!("{size}: 100 sequential"))?;
                    let c = self.avg("keys", 1.0, &format!("{size}: 10 concurrent"))?;
                    let b = self.avg("keys", 1.0, &format!("{size}: one batch"))?;
                    Some((
                        s / b >= 20.0 && c / b >= 3.0,
                        format!(
                            "batch {b:.2} ms: {:.1}x sequential, {:.1}x concurrent",
                            s / b,
                            c / b
                        ),
                    ))
                })(),
            );
        }
        push(
            "connections: 0 errors through Ferry, peak Redis clients <= pool (8)",
            (|| {
                let m = self.find("connections", 5.0, "Ferry")?;
                let (e, p) = (
                    m.figures["errors"].as_u64()?,
                    m.figures["peak_redis_clients"].as_u64()?,
                );
                let d = self.find("connections", 5.0, "direct")?.figures["errors"].as_u64()?;
                Some((
                    e == 0 && p <= 8,
                    format!("Ferry: {e} errors, peak {p} clients; direct: {d} errors"),
                ))
            })(),
        );
        push(
            "replay store: 0 refusals at full signed load, RSS flat after the first window",
            (|| {
                let m = self.measurements.iter().find(|m| m.scenario == "replay")?;
                let f = &m.figures;
                let refused = f["refused"].as_u64()?;
                let (filled, max) = (
                    f["rss_window_filled_mb"].as_f64()?,
                    f["rss_max_after_mb"].as_f64()?,
                );
                Some((
                    refused == 0 && max <= filled * 1.25 + 4.0,
                    format!(
                        "{} rps, {refused} refused; RSS {filled:.1} MB when the window filled, \
                         at most {max:.1} MB after; ~{} bytes per request/s",
                        f["rps"], f["bytes_per_request_per_s"]
                    ),
                ))
            })(),
        );
        push(
            "throughput: Ferry cache-hit rps >= webdis",
            (|| {
                let f =
                    self.find("throughput", 0.0, "cache GET: Ferry")?.figures["rps"].as_f64()?;
                let w =
                    self.find("throughput", 0.0, "cache GET: webdis")?.figures["rps"].as_f64()?;
                Some((
                    f >= w,
                    format!("Ferry {f:.0} rps vs webdis {w:.0} rps ({:.2}x)", f / w),
                ))
            })(),
        );
        t
    }

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
        for scenario in ["redis", "postgres", "keys"] {
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
            let _ = writeln!(s, "| path | concurrency | requests/s |\n|---|---|---|");
            for m in tp {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} |",
                    m.path, m.figures["concurrency"], m.figures["rps"]
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
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Mean latency per request vs round-trip time",
                ("sans-serif", 22),
            )
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..5.5f64, 0f64..max_y)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("round-trip time edge <-> data centre (ms)")
            .y_desc("mean latency (ms)")
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
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())
    }
}
