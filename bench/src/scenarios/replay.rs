//! Scenario 6: the replay store at the sidecar's full rate. Signed cache GETs at full
//! concurrency for three clock windows (`auth.max_skew_s`, short here so the window fills and
//! turns over within the run): every request must be served (0 refusals of any kind), and the
//! sidecar's RSS must stay flat once the first window has filled, since the store holds one
//! window of nonces and drops each second as it leaves.

use super::Plan;
use super::{Measurement, Resources};
use crate::env::proc_stat;
use crate::ferry::Ferry;
use crate::Ctx;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let (addr, pid, skew) = (
        ctx.replay_sidecar_addr,
        ctx.replay_sidecar_pid,
        ctx.replay_skew_s,
    );
    let ferry = Ferry::new(format!("http://{addr}"), plan.concurrency);
    ferry
        .post(
            "/v1/cache",
            &json!({"op": "set", "key": "bench:replay", "value": "v"}),
        )
        .await
        .expect("set");
    ctx.step("replay store: signed load for three clock windows");
    let run_for = Duration::from_secs(3 * skew + 1);
    let ok = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let refused: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let rss: Arc<Mutex<Vec<(f64, u64)>>> = Arc::default();
    let start = Instant::now();
    let sampler = {
        let rss = rss.clone();
        tokio::spawn(async move {
            loop {
                let at = start.elapsed().as_secs_f64();
                if let Ok(mut v) = rss.lock() {
                    v.push((at, proc_stat(pid).rss_kb));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let workers = (0..plan.concurrency).map(|_| {
        let (f, ok, refused) = (ferry.clone(), ok.clone(), refused.clone());
        tokio::spawn(async move {
            let get = json!({"op": "get", "key": "bench:replay"});
            while start.elapsed() < run_for {
                match f.post("/v1/cache", &get).await {
                    Ok(_) => {
                        ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => {
                        let code = e.split(':').next().unwrap_or("?").to_string();
                        if let Ok(mut m) = refused.lock() {
                            *m.entry(code).or_default() += 1;
                        }
                    }
                }
            }
        })
    });
    futures::future::join_all(workers).await;
    sampler.abort();
    let secs = start.elapsed().as_secs_f64();
    let served = ok.load(std::sync::atomic::Ordering::Relaxed);
    let refused = refused.lock().map(|m| m.clone()).unwrap_or_default();
    let samples = rss.lock().map(|v| v.clone()).unwrap_or_default();
    // Filled: one window plus a second in. Flat: the most it reached after that.
    let filled_at = (skew + 1) as f64;
    let mb = |kb: u64| kb as f64 / 1024.0;
    let at_fill = samples
        .iter()
        .find(|(t, _)| *t >= filled_at)
        .map_or(0, |(_, kb)| *kb);
    let max_after = samples
        .iter()
        .filter(|(t, _)| *t >= filled_at)
        .map(|(_, kb)| *kb)
        .max()
        .unwrap_or(0);
    let first = samples.first().map_or(0, |(_, kb)| *kb);
    let rps = served as f64 / secs;
    // What one request/s costs in memory, from the growth while the first window filled.
    let bytes_per_rps = if rps > 0.0 {
        (at_fill.saturating_sub(first) as f64 * 1024.0) / rps
    } else {
        0.0
    };
    vec![Measurement {
        scenario: "replay",
        rtt_ms: 0.0,
        path: format!("signed cache GET for {:.0} s, max_skew_s = {skew}", secs),
        latency: None,
        figures: json!({
            "rps": rps.round(),
            "served": served,
            "refused": refused.values().sum::<u64>(),
            "refused_by_status": refused,
            "rss_start_mb": (mb(first) * 10.0).round() / 10.0,
            "rss_window_filled_mb": (mb(at_fill) * 10.0).round() / 10.0,
            "rss_max_after_mb": (mb(max_after) * 10.0).round() / 10.0,
            "bytes_per_request_per_s": bytes_per_rps.round(),
            "concurrency": plan.concurrency,
        }),
    }]
}

/// Resource row for the replay sidecar (its own process).
pub fn resources(pid: u32, during: &Resources) -> Resources {
    let mut r = during.clone();
    r.peak_rss_mb = r.peak_rss_mb.max(proc_stat(pid).rss_kb as f64 / 1024.0);
    r
}
