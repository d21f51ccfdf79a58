//! The scenarios: each reproduces one published measurement with Ferry in the proxy's place.

pub mod blog;
mod blog_split;
pub mod connections;
pub mod keys;
pub mod one_client;
pub mod open_connections;
pub mod pinned;
pub mod postgres;
pub mod redis;
pub mod replay;
pub mod scale;
pub mod staleness;
pub mod throughput;
mod wrk;

use crate::env::{proc_stat, ProcStat};
use crate::stats::Summary;
use serde::Serialize;
use std::time::Duration;

/// One measured line of a table.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub scenario: &'static str,
    pub rtt_ms: f64,
    pub path: String,
    pub latency: Option<Summary>,
    /// Scenario-specific figures (i/s, errors, rps, peak clients...).
    pub figures: serde_json::Value,
}

impl Measurement {
    /// A latency row: the summary of `samples`, no other figures.
    pub fn latency(scenario: &'static str, rtt_ms: f64, path: &str, samples: &[Duration]) -> Self {
        Measurement {
            scenario,
            rtt_ms,
            path: path.into(),
            latency: Some(Summary::of(samples)),
            figures: serde_json::json!({}),
        }
    }
}

/// The edge -> sidecar path over HTTPS: a latency proxy in front of the HTTPS sidecar, and a
/// signed client that trusts the bench's CA (keep the proxy alive while the client is used).
pub async fn ferry_over_https(
    ctx: &crate::Ctx,
    rtt: Duration,
) -> (crate::proxy::LatencyProxy, crate::ferry::Ferry) {
    let proxy = crate::proxy::LatencyProxy::start(ctx.https_sidecar_addr, rtt)
        .await
        .expect("proxy");
    let ferry =
        crate::ferry::Ferry::https(format!("https://{}", proxy.addr), 4, ctx.tls.reqwest_root());
    (proxy, ferry)
}

/// The bench's Postgres as a client with its password reaches it (SCRAM over TCP).
pub fn pg_conninfo(ctx: &crate::Ctx) -> String {
    format!(
        "host=127.0.0.1 port={} user=postgres password={} dbname=postgres",
        ctx.pg_addr.port(),
        ctx.pg_password
    )
}

/// A persistent connection to it; its connection task runs until the client is dropped.
pub async fn pg_client(ctx: &crate::Ctx) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&pg_conninfo(ctx), tokio_postgres::NoTls)
        .await
        .expect("connect to postgres");
    tokio::spawn(connection);
    client
}

/// How much to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    pub rtts: Vec<Duration>,
    pub samples: usize,
    pub key_iterations: usize,
    pub throughput_for: Duration,
    pub concurrency: usize,
    pub isolates: usize,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        Plan {
            rtts: [0u64, 1, 5]
                .iter()
                .map(|ms| Duration::from_millis(*ms))
                .collect(),
            samples: if quick { 30 } else { 500 },
            key_iterations: if quick { 3 } else { 20 },
            throughput_for: Duration::from_secs(if quick { 1 } else { 5 }),
            // FERRY_BENCH_CONCURRENCY: for sweeps by hand; the published runs use 32.
            concurrency: std::env::var("FERRY_BENCH_CONCURRENCY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(32),
            isolates: 500,
        }
    }
}

/// Sidecar resource use during one scenario: peak RSS sampled, CPU as a share of one core.
#[derive(Debug, Clone, Serialize)]
pub struct Resources {
    pub scenario: &'static str,
    pub peak_rss_mb: f64,
    pub cpu_core_pct: f64,
    pub seconds: f64,
}

/// Samples a process' RSS every 50 ms while `fut` runs.
pub async fn watch<F: std::future::Future>(
    scenario: &'static str,
    pid: u32,
    fut: F,
) -> (F::Output, Resources) {
    let start = std::time::Instant::now();
    let before: ProcStat = proc_stat(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before.rss_kb));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(proc_stat(pid).rss_kb, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let out = fut.await;
    sampler.abort();
    let after = proc_stat(pid);
    let secs = start.elapsed().as_secs_f64();
    // Linux reports CPU time in clock ticks of 1/100 s.
    let cpu = (after.cpu_ticks.saturating_sub(before.cpu_ticks)) as f64 / 100.0;
    let r = Resources {
        scenario,
        peak_rss_mb: peak
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(after.rss_kb) as f64
            / 1024.0,
        cpu_core_pct: if secs > 0.0 { 100.0 * cpu / secs } else { 0.0 },
        seconds: secs,
    };
    (out, r)
}
