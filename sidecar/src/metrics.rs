//! Prometheus metrics, served as text on the admin listener (`server.admin_listen`, bound to
//! localhost by default; Prometheus cannot sign requests, so this is not on the public port).
//!
//! Process-wide (one sidecar per process in production): requests by route and status, a
//! latency histogram per route, cache outcomes, single-flight waits, pool state and checkout
//! time for each pool, and upstream errors by code.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

#[derive(Default)]
pub struct Histogram {
    counts: [u64; BUCKETS.len()],
    total: u64,
    sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, secs: f64) {
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.counts[i] += 1;
            }
        }
        self.total += 1;
        self.sum += secs;
    }

    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, le) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {}",
                self.counts[i]
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.total
        );
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.total);
    }
}

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    cache: Mutex<BTreeMap<&'static str, u64>>,
    /// Reads cached with no tables named: (outcome, reason class) -> count.
    inferred: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    checkout: Mutex<BTreeMap<&'static str, Histogram>>,
    /// Threads waiting for a pooled connection, per pool.
    pub redis_waiting: AtomicI64,
    pub pg_waiting: AtomicI64,
    pub flights_joined: AtomicU64,
    /// Reads that left their worker's event loop for the pooled path after waiting in line.
    pub pg_reads_spilled: AtomicU64,
    /// Fills waited on another sidecar's lease: woken by its fill, or out of patience.
    fill_waits: [AtomicU64; 2],
}

pub fn global() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    pub fn cache_outcome(&self, status: &'static str) {
        *lock(&self.cache).entry(status).or_default() += 1;
    }

    /// A read cached with no tables named: `cached`, or `bypass` with its reason's class
    /// (`function`, `unwatched`, ... : `read::inferred`).
    pub fn inferred(&self, outcome: &'static str, reason: &'static str) {
        *lock(&self.inferred).entry((outcome, reason)).or_default() += 1;
    }

    pub fn fill_wait(&self, woken: bool) {
        self.fill_waits[usize::from(!woken)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn error(&self, code: &'static str) {
        *lock(&self.errors).entry(code).or_default() += 1;
    }

    pub fn checkout(&self, pool: &'static str, waited: Duration) {
        lock(&self.checkout)
            .entry(pool)
            .or_default()
            .observe(waited.as_secs_f64());
    }

    pub fn request(&self, route: &str, status: u16, took: Duration) {
        *lock(&self.requests)
            .entry((route.to_string(), status))
            .or_default() += 1;
        lock(&self.latency)
            .entry(route.to_string())
            .or_default()
            .observe(took.as_secs_f64());
    }

    /// The Prometheus text exposition. `pools` are (name, max, open, idle) at scrape time.
    pub fn render(&self, pools: &[(&str, u32, u32, u32)]) -> String {
        let mut out = String::new();
        out.push_str("# HELP ferry_requests_total Requests by route and HTTP status.\n# TYPE ferry_requests_total counter\n");
        for ((route, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "ferry_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str("# HELP ferry_request_seconds Request latency by route.\n# TYPE ferry_request_seconds histogram\n");
        for (route, h) in lock(&self.latency).iter() {
            h.render(
                &mut out,
                "ferry_request_seconds",
                &format!("route=\"{route}\""),
            );
        }
        out.push_str("# HELP ferry_cache_total Read outcomes: hit, miss, stale, bypass.\n# TYPE ferry_cache_total counter\n");
        for (status, n) in lock(&self.cache).iter() {
            let _ = writeln!(out, "ferry_cache_total{{status=\"{status}\"}} {n}");
        }
        out.push_str("# HELP ferry_inferred_total Reads cached with no tables named: cached, or bypassed and why (function, unwatched, owned, catalog, not_analysed, ...).\n# TYPE ferry_inferred_total counter\n");
        for ((outcome, reason), n) in lock(&self.inferred).iter() {
            let _ = writeln!(
                out,
                "ferry_inferred_total{{outcome=\"{outcome}\",reason=\"{reason}\"}} {n}"
            );
        }
        out.push_str("# HELP ferry_singleflight_joined_total Reads that waited on another read's Postgres query.\n# TYPE ferry_singleflight_joined_total counter\n");
        let _ = writeln!(
            out,
            "ferry_singleflight_joined_total {}",
            self.flights_joined.load(Ordering::Relaxed)
        );
        out.push_str("# HELP ferry_fill_waits_total Misses that waited on another sidecar's fill (store::coordination::leases), by how the wait ended.\n# TYPE ferry_fill_waits_total counter\n");
        for (i, outcome) in ["woken", "timed_out"].iter().enumerate() {
            let n = self.fill_waits[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "ferry_fill_waits_total{{outcome=\"{outcome}\"}} {n}");
        }
        out.push_str("# HELP ferry_postgres_reads_spilled_total Reads that took the pooled path (a thread hop) after waiting 10 ms in line for their worker's event-loop sessions.\n# TYPE ferry_postgres_reads_spilled_total counter\n");
        let _ = writeln!(
            out,
            "ferry_postgres_reads_spilled_total {}",
            self.pg_reads_spilled.load(Ordering::Relaxed)
        );
        out.push_str("# HELP ferry_errors_total Failures answered, by error code.\n# TYPE ferry_errors_total counter\n");
        for (code, n) in lock(&self.errors).iter() {
            let _ = writeln!(out, "ferry_errors_total{{code=\"{code}\"}} {n}");
        }
        out.push_str("# HELP ferry_pool_connections Pool connections: max (configured), open, idle, in_use, waiting.\n# TYPE ferry_pool_connections gauge\n");
        for (pool, max, open, idle) in pools {
            let waiting = match *pool {
                "redis" => self.redis_waiting.load(Ordering::Relaxed),
                _ => self.pg_waiting.load(Ordering::Relaxed),
            };
            for (state, v) in [
                ("max", i64::from(*max)),
                ("open", i64::from(*open)),
                ("idle", i64::from(*idle)),
                ("in_use", i64::from(open.saturating_sub(*idle))),
                ("waiting", waiting.max(0)),
            ] {
                let _ = writeln!(
                    out,
                    "ferry_pool_connections{{pool=\"{pool}\",state=\"{state}\"}} {v}"
                );
            }
        }
        out.push_str("# HELP ferry_pool_checkout_seconds Time to get a pooled connection.\n# TYPE ferry_pool_checkout_seconds histogram\n");
        for (pool, h) in lock(&self.checkout).iter() {
            h.render(
                &mut out,
                "ferry_pool_checkout_seconds",
                &format!("pool=\"{pool}\""),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_format() {
        let m = Metrics::default();
        m.request("/v1/query", 200, Duration::from_millis(3));
        m.cache_outcome("hit");
        m.error("overloaded");
        let text = m.render(&[("redis", 8, 2, 1)]);
        assert!(text.contains("ferry_requests_total{route=\"/v1/query\",status=\"200\"} 1"));
        assert!(text.contains("ferry_request_seconds_bucket{route=\"/v1/query\",le=\"0.005\"} 1"));
        assert!(text.contains("ferry_request_seconds_bucket{route=\"/v1/query\",le=\"0.001\"} 0"));
        assert!(text.contains("ferry_cache_total{status=\"hit\"} 1"));
        assert!(text.contains("ferry_errors_total{code=\"overloaded\"} 1"));
        assert!(text.contains("ferry_pool_connections{pool=\"redis\",state=\"in_use\"} 1"));
    }

    #[test]
    fn the_grafana_dashboard_uses_only_metrics_that_exist() {
        let m = Metrics::default();
        m.request("/v1/query", 200, Duration::from_millis(1));
        m.cache_outcome("hit");
        m.error("overloaded");
        m.checkout("redis", Duration::from_millis(1));
        let text = m.render(&[("redis", 8, 2, 1)]);
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/grafana-dashboard.json"
        );
        let dash: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard")).expect("json");
        let mut names = 0;
        for panel in dash["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().expect("targets") {
                let expr = target["expr"].as_str().expect("expr");
                for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if word.starts_with("ferry_") {
                        names += 1;
                        assert!(text.contains(word), "{word} is not exported");
                    }
                }
            }
        }
        assert!(names >= 8);
    }
}
