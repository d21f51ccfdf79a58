//! The staleness scenario's table and chart: change-stream invalidation against TTLs only.

use super::Report;
use crate::scenarios::staleness::{CHANGES, TTL_ONLY};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

impl Report {
    /// The markdown section (empty when the scenario did not run).
    pub(super) fn staleness_markdown(&self, s: &mut String) {
        let rows: Vec<_> = self
            .measurements
            .iter()
            .filter(|m| m.scenario == "staleness")
            .collect();
        let Some(first) = rows.first() else {
            return;
        };
        let f = &first.figures;
        let _ = writeln!(
            s,
            "## staleness after an external write\n\n\
             A plain Postgres client commits a change to a cached row ({} rounds) while {} other \
             commits a second run in the background; reads through each configuration every 2 ms \
             for {} ms after each commit.\n",
            f["rounds"], f["background_writes_per_s"], f["window_ms"]
        );
        let _ = writeln!(
            s,
            "| configuration | fresh within the window | commit → first fresh read p50 / p99 / max ms | stale reads in the window |\n|---|---|---|---|"
        );
        for m in rows {
            let f = &m.figures;
            let first_fresh = match (&m.latency, f["first_fresh_waited_out_s"].as_f64()) {
                (Some(l), _) => format!("{:.1} / {:.1} / {:.1}", l.p50_ms, l.p99_ms, l.max_ms),
                (None, Some(s)) => format!("none; waited out: {s:.1} s"),
                (None, None) => "none".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} of {} | {} | {}% ({} of {}) |",
                m.path,
                f["fresh_within_window"],
                f["rounds"],
                first_fresh,
                f["stale_share_pct"],
                f["stale_reads"],
                f["reads"]
            );
        }
        s.push('\n');
    }

    /// The share of stale reads against the time since the commit, per configuration.
    pub fn staleness_chart(&self, path: &Path) -> Result<(), String> {
        let series: Vec<(&str, Vec<(f64, f64)>)> = [CHANGES, TTL_ONLY]
            .into_iter()
            .filter_map(|name| {
                let m = self
                    .measurements
                    .iter()
                    .find(|m| m.scenario == "staleness" && m.path == name)?;
                let pts = m.figures["stale_pct_by_ms"]
                    .as_array()?
                    .iter()
                    .filter_map(|p| Some((p[0].as_f64()?, p[1].as_f64()?)))
                    .collect();
                Some((name, pts))
            })
            .collect();
        let Some(max_x) = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
            .reduce(f64::max)
        else {
            return Ok(());
        };
        let root = SVGBackend::new(path, (900, 460)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Stale reads after a write that bypasses Ferry",
                ("sans-serif", 22),
            )
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..(max_x + 10.0), 0f64..105f64)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("ms after the commit")
            .y_desc("reads returning the old row (%)")
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name.to_string())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::MiddleRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())
    }
}
