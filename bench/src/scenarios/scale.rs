//! Scenario 8: one sidecar against two, and what the shared replay store costs, measured for
//! SCALING.md's capacity model. Each sidecar runs one worker thread. The same load generator
//! sends signed cache GETs and cached `/v1/query` reads, spread evenly over the sidecars. Beside
//! requests/s (bounded by this 2-core machine, which also runs the load generator, Redis and
//! Postgres), each case reports the sidecars' own CPU and Redis's own CPU per 1,000 requests,
//! read from /proc and Redis's INFO: the figures a capacity model can scale from, since they do
//! not depend on what else the machine was doing. A last case runs one sidecar on a Redis
//! Cluster of 3 masters (its lookups take the pooled path there), its Redis CPU summed over the
//! cluster's nodes.

use super::{Measurement, Plan};
use crate::env::{proc_stat, start_sidecar, Proc};
use crate::ferry::Ferry;
use crate::Ctx;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// (label, sidecars, auth.replay, on a Redis Cluster of 3 masters).
const CASES: [(&str, usize, &str, bool); 4] = [
    ("1 sidecar, replay local", 1, "local", false),
    ("1 sidecar, replay shared (default)", 1, "shared", false),
    ("2 sidecars, replay shared", 2, "shared", false),
    ("1 sidecar, Redis Cluster of 3 masters", 1, "shared", true),
];

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let mut out = Vec::new();
    for (label, n, replay, on_cluster) in CASES {
        ctx.step(&format!("scale: {label}"));
        // Started per case: it exists only while its sidecar runs.
        let cluster = on_cluster.then(|| ferry_testkit::RedisCluster::start(3, 1));
        let redis_url = cluster.as_ref().map_or(ctx.redis_url.clone(), |c| c.urls());
        let procs: Vec<Proc> = (0..n)
            .map(|_| {
                start_sidecar(
                    &redis_url,
                    &ctx.pg_url,
                    &[
                        ("FERRY_SERVER_WORKERS", "1"),
                        ("FERRY_AUTH_REPLAY", replay),
                        (
                            "FERRY_REDIS_CLUSTER",
                            if on_cluster { "true" } else { "false" },
                        ),
                        // Not available on a cluster (config refuses it).
                        (
                            "FERRY_UPSTASH_ENABLED",
                            if on_cluster { "false" } else { "true" },
                        ),
                    ],
                )
            })
            .collect();
        let redis_cpu = || async {
            match &cluster {
                Some(c) => Some(c.cpu_seconds()),
                None => redis_cpu_s(ctx).await,
            }
        };
        let clients: Arc<Vec<Ferry>> = Arc::new(
            procs
                .iter()
                .map(|p| Ferry::new(format!("http://{}", p.addr), plan.concurrency))
                .collect(),
        );
        clients[0]
            .post(
                "/v1/cache",
                &json!({"op": "set", "key": "bench:scale", "value": "v".repeat(100)}),
            )
            .await
            .expect("set");
        let query = json!({"sql": "SELECT id, name FROM items WHERE id = 1",
                           "cache": {"ttl_s": 300}});
        clients[0].post("/v1/query", &query).await.expect("fill");
        for (what, path, body) in [
            (
                "cache GET",
                "/v1/cache",
                json!({"op": "get", "key": "bench:scale"}),
            ),
            ("/v1/query hit", "/v1/query", query.clone()),
        ] {
            let pids: Vec<u32> = procs.iter().map(Proc::pid).collect();
            let before = (cpu_ticks(&pids), redis_cpu().await);
            let next = Arc::new(AtomicUsize::new(0));
            let (rps, n_requests) =
                super::throughput::load(plan.concurrency, plan.throughput_for, {
                    let (clients, body) = (clients.clone(), body.clone());
                    move || {
                        let (clients, body, next) = (clients.clone(), body.clone(), next.clone());
                        async move {
                            let c = &clients[next.fetch_add(1, Ordering::Relaxed) % clients.len()];
                            c.post(path, &body).await.is_ok()
                        }
                    }
                })
                .await;
            let after = (cpu_ticks(&pids), redis_cpu().await);
            let per_1k = |ms: f64| (n_requests > 0).then(|| ms * 1000.0 / n_requests as f64);
            // Linux reports CPU time in clock ticks of 1/100 s.
            let sidecar = per_1k(after.0.saturating_sub(before.0) as f64 * 10.0);
            let redis = match (before.1, after.1) {
                (Some(b), Some(a)) => per_1k((a - b) * 1000.0),
                _ => None,
            };
            let round = |v: Option<f64>| v.map(|v| (v * 100.0).round() / 100.0);
            out.push(Measurement {
                scenario: "scale",
                rtt_ms: 0.0,
                path: format!("{what}: {label}"),
                latency: None,
                figures: json!({
                    "rps": rps.round(),
                    "sidecars": n,
                    "replay": replay,
                    "redis_cluster": on_cluster,
                    "concurrency": plan.concurrency,
                    "sidecar_cpu_ms_per_1k": round(sidecar),
                    "redis_cpu_ms_per_1k": round(redis),
                    // What one fully busy sidecar core would serve at this CPU cost.
                    "requests_per_sidecar_core_s": sidecar.map(|ms| (1_000_000.0 / ms).round()),
                }),
            });
        }
    }
    out
}

fn cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter().map(|p| proc_stat(*p).cpu_ticks).sum()
}

/// Redis's own CPU seconds so far (user + system, from `INFO cpu`).
pub(crate) async fn redis_cpu_s(ctx: &Ctx) -> Option<f64> {
    let mut c = crate::resp::Conn::connect(ctx.redis_addr).await.ok()?;
    c.cmd(&[b"AUTH", ctx.redis_password.as_bytes()])
        .await
        .ok()?;
    let info = c.cmd(&[b"INFO", b"cpu"]).await.ok()?;
    let info = String::from_utf8_lossy(&info);
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(field("used_cpu_sys")? + field("used_cpu_user")?)
}

/// The bench's Redis's process id (`INFO server`), for `taskset`.
pub(crate) async fn redis_pid(ctx: &Ctx) -> Option<u32> {
    let mut c = crate::resp::Conn::connect(ctx.redis_addr).await.ok()?;
    c.cmd(&[b"AUTH", ctx.redis_password.as_bytes()])
        .await
        .ok()?;
    let info = c.cmd(&[b"INFO", b"server"]).await.ok()?;
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}
