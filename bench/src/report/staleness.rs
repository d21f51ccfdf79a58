//! The staleness scenario's table and chart: change-stream invalidation against TTLs only.

use super::Report;
use crate::scenarios::staleness::{CHANGES, TTL_ONLY};
use plotters::prelude::SeriesLabelPosition;
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
        let series: Vec<(String, Vec<(f64, f64)>)> = [CHANGES, TTL_ONLY]
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
                Some((name.to_string(), pts))
            })
            .collect();
        let Some(max_x) = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
            .reduce(f64::max)
        else {
            return Ok(());
        };
        super::line_chart(
            path,
            &super::Axes {
                caption: "Stale reads after a write that bypasses Ferry",
                x_desc: "ms after the commit",
                y_desc: "reads returning the old row (%)",
                x: 0.0..(max_x + 10.0),
                y: 0.0..105.0,
                height: 460,
                legend: SeriesLabelPosition::MiddleRight,
                dots: false,
            },
            &series,
        )
    }
}
