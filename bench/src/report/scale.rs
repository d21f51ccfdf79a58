//! The scale scenario's table: one sidecar against two, the replay store local against shared.

use super::Report;
use std::fmt::Write as _;

impl Report {
    /// The markdown section (empty when the scenario did not run).
    pub(super) fn scale_markdown(&self, s: &mut String) {
        let rows: Vec<_> = self
            .measurements
            .iter()
            .filter(|m| m.scenario == "scale")
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "## scale: sidecars of one worker each, the load spread evenly\n\n\
             requests/s is what this machine gave (its 2 cores also run the load generator, Redis \
             and Postgres); the CPU figures are each server's own, per 1,000 requests.\n"
        );
        let _ = writeln!(
            s,
            "| path | requests/s | sidecar CPU ms per 1,000 | requests per sidecar core-second | Redis CPU ms per 1,000 |\n|---|---|---|---|---|"
        );
        for m in rows {
            let f = &m.figures;
            let ms = |k: &str| f[k].as_f64().map_or("-".to_string(), |v| format!("{v:.2}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                m.path,
                f["rps"],
                ms("sidecar_cpu_ms_per_1k"),
                f["requests_per_sidecar_core_s"],
                ms("redis_cpu_ms_per_1k")
            );
        }
        s.push('\n');
    }
}
