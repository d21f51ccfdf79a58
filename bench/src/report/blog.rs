//! The blog scenario's table (#43): no cache, TTL only, inferred caching, one mix.

use super::Report;
use std::fmt::Write as _;

impl Report {
    /// The markdown section (empty when the scenario did not run).
    pub(super) fn blog_markdown(&self, s: &mut String) {
        let rows: Vec<_> = self
            .measurements
            .iter()
            .filter(|m| m.scenario == "blog")
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "## blog: an application's mix, 95% reads through Ferry, 5% writes that bypass it\n\n\
             16 readers; post by id (40%), recent posts, a post's comments, an author's page \
             through a view over a join (20% each); writes from a plain Postgres client; posts under \
             REPLICA IDENTITY FULL (they are read by author). Stale: a \
             read of a post that started more than 1 s (`changes.max_lag_ms`) after a newer \
             version committed. Postgres CPU includes the writes'. Each configuration pinned \
             (the load generator on core 0; sidecars, Redis and Postgres on core 1), then \
             unpinned; x no cache is against no cache run the same way. Servers' CPU is \
             Postgres's, the sidecar's and Redis's together.\n"
        );
        let _ = writeln!(
            s,
            "| configuration | reads/s | x no cache | hit rate | Postgres CPU µs per read | sidecar CPU µs per read | Redis CPU µs per read | servers' CPU µs per read | load generator CPU µs per read | stale past the bound | p50 ms | p99 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        // Each row against the no-cache row run the same way (pinned or not).
        let base = |pinned: &serde_json::Value| {
            rows.iter()
                .find(|m| m.figures["pinned"] == *pinned)
                .and_then(|m| m.figures["reads_per_s"].as_f64())
                .unwrap_or(0.0)
        };
        for m in &rows {
            let f = &m.figures;
            let rps = f["reads_per_s"].as_f64().unwrap_or(0.0);
            let base = base(&f["pinned"]);
            let servers: f64 = [
                "pg_cpu_us_per_read",
                "sidecar_cpu_us_per_read",
                "redis_cpu_us_per_read",
            ]
            .iter()
            .filter_map(|k| f[*k].as_f64())
            .sum();
            let (p50, p99) = m
                .latency
                .as_ref()
                .map_or((0.0, 0.0), |l| (l.p50_ms, l.p99_ms));
            let _ = writeln!(
                s,
                "| {} | {rps:.0} | {:.2}x | {}% | {} | {} | {} | {servers:.1} | {} | {} | {p50:.2} | {p99:.2} |",
                m.path,
                if base > 0.0 { rps / base } else { 0.0 },
                f["hit_rate_pct"],
                f["pg_cpu_us_per_read"],
                f["sidecar_cpu_us_per_read"],
                f["redis_cpu_us_per_read"],
                f["load_generator_cpu_us_per_read"],
                f["stale_past_bound"],
            );
        }
        // Hit rate by kind of read, one column per configuration.
        let _ = writeln!(s, "\nHit rate by read:\n");
        let names: Vec<&str> = rows.iter().map(|m| m.path.as_str()).collect();
        let _ = writeln!(s, "| read | {} |", names.join(" | "));
        let _ = writeln!(s, "|---|{}", "---|".repeat(rows.len()));
        let kinds: Vec<String> = rows[0].figures["hit_rate_pct_by_read"]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        for k in &kinds {
            let cells: Vec<String> = rows
                .iter()
                .map(|m| format!("{}%", m.figures["hit_rate_pct_by_read"][k]))
                .collect();
            let _ = writeln!(s, "| {k} | {} |", cells.join(" | "));
        }
        apart_markdown(&rows, s);
        s.push('\n');
    }
}

/// Parts of the servers' CPU per read apart: what the change stream costs, and Redis by command.
fn apart_markdown(rows: &[&crate::scenarios::Measurement], s: &mut String) {
    let _ = writeln!(
        s,
        "\nParts of the servers' CPU, µs per read: the sidecar's change-stream threads; Postgres's \
         walsender (decoding the WAL for the stream), the stream's own session (the visibility \
         query, marks) and the writer's backend; Redis's own time per command (`INFO \
         commandstats`, its five largest; event loop and I/O not included).\n\n\
         | configuration | stream threads | walsender | stream's session | writer | Redis by command |\n\
         |---|---|---|---|---|---|"
    );
    for m in rows {
        let a = &m.figures["cpu_us_per_read_apart"];
        let pg = |k: &str| {
            a["postgres"][k]
                .as_f64()
                .map_or("-".into(), |v| format!("{v}"))
        };
        let redis: Vec<String> = a["redis_commands"]
            .as_array()
            .into_iter()
            .flatten()
            .take(5)
            .map(|c| format!("{} {}", c[0].as_str().unwrap_or("?"), c[1]))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            m.path,
            a["sidecar_stream_thread"],
            pg("walsender"),
            pg("stream's session"),
            pg("writer"),
            redis.join(", "),
        );
    }
}
