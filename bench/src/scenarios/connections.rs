//! Scenario 4: 500 concurrent "isolates" against a Redis limited to 30 clients. Direct: each
//! opens its own connection (count `max number of clients` errors). Ferry: each makes one
//! request to the sidecar (count errors, and the peak connected_clients Redis saw).

use super::{Measurement, Plan};
use crate::ferry::Ferry;
use crate::proxy::LatencyProxy;
use crate::resp;
use crate::Ctx;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The link the isolates are on: long enough that their connections overlap.
const RTT: Duration = Duration::from_millis(5);

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let limited = ctx.limited_redis_addr;
    let to_redis = LatencyProxy::start(limited, RTT).await.expect("proxy");
    let to_sidecar = LatencyProxy::start(ctx.limited_sidecar_addr, RTT)
        .await
        .expect("proxy");
    let mut setup = resp::Conn::connect(limited).await.expect("redis");
    setup
        .cmd(&[b"AUTH", ctx.redis_password.as_bytes()])
        .await
        .expect("auth");
    setup.cmd(&[b"SET", b"bench:key", b"v"]).await.expect("set");
    drop(setup);

    ctx.step("connections: 500 direct isolates");
    let (direct_ok, direct_err, direct_max) = {
        let password = ctx.redis_password.clone();
        let addr = to_redis.addr;
        sample_clients(ctx, limited, async move {
            let tasks = (0..plan.isolates).map(|_| {
                let password = password.clone();
                tokio::spawn(async move {
                    let mut c = resp::Conn::connect(addr).await.map_err(|e| e.to_string())?;
                    c.cmd(&[b"AUTH", password.as_bytes()]).await?;
                    c.cmd(&[b"GET", b"bench:key"]).await.map(|_| ())
                })
            });
            count(futures::future::join_all(tasks).await)
        })
        .await
    };

    ctx.step("connections: 500 isolates through Ferry");
    let ferry_get = json!({"op": "get", "key": "bench:key"});
    let (ferry_ok, ferry_err, ferry_max) = {
        let base = format!("http://{}", to_sidecar.addr);
        sample_clients(ctx, limited, async move {
            let tasks = (0..plan.isolates).map(|_| {
                // A fresh client per isolate: nothing is shared between requests but the sidecar.
                let f = Ferry::new(base.clone(), 1);
                let body = ferry_get.clone();
                tokio::spawn(async move { f.post("/v1/cache", &body).await.map(|_| ()) })
            });
            count(futures::future::join_all(tasks).await)
        })
        .await
    };
    let row = |path: &str, ok: u64, err: u64, peak: u64| Measurement {
        scenario: "connections",
        rtt_ms: RTT.as_secs_f64() * 1000.0,
        path: path.into(),
        latency: None,
        figures: json!({"requests": plan.isolates, "ok": ok, "errors": err, "peak_redis_clients": peak}),
    };
    vec![
        row(
            "direct, a connection per isolate",
            direct_ok,
            direct_err,
            direct_max,
        ),
        row("Ferry (sidecar pool of 8)", ferry_ok, ferry_err, ferry_max),
    ]
}

type Joined = Vec<Result<Result<(), String>, tokio::task::JoinError>>;

fn count(results: Joined) -> (u64, u64) {
    let ok = results.iter().filter(|r| matches!(r, Ok(Ok(())))).count() as u64;
    (ok, results.len() as u64 - ok)
}

/// Runs `fut` while sampling Redis' connected_clients (minus the sampler itself).
async fn sample_clients<F>(ctx: &Ctx, redis: std::net::SocketAddr, fut: F) -> (u64, u64, u64)
where
    F: std::future::Future<Output = (u64, u64)>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let mut conn = resp::Conn::connect(redis).await.expect("sampler");
    conn.cmd(&[b"AUTH", ctx.redis_password.as_bytes()])
        .await
        .expect("auth");
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(info) = conn.cmd(&[b"INFO", b"clients"]).await {
                    let text = String::from_utf8_lossy(&info);
                    if let Some(n) = text
                        .lines()
                        .find_map(|l| l.strip_prefix("connected_clients:"))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                    {
                        peak.fetch_max(n.saturating_sub(1), Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let (ok, err) = fut.await;
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    (ok, err, peak.load(Ordering::Relaxed))
}
