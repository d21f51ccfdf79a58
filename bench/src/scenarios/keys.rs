//! Scenario 3: 100 keys. As 100 sequential requests, as 100 requests over 10 concurrent
//! connections, and as one batch call; values of 100 B and 50 KB. One iteration = all 100.

use super::{Measurement, Plan};
use crate::ferry::Ferry;
use crate::proxy::LatencyProxy;
use crate::stats::Summary;
use crate::Ctx;
use serde_json::json;
use std::time::{Duration, Instant};

const KEYS: usize = 100;

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let setup = Ferry::new(format!("http://{}", ctx.sidecar_addr), 4);
    let mut out = Vec::new();
    for (label, size) in [("100 B", 100usize), ("50 KB", 50 * 1024)] {
        let keys: Vec<String> = (0..KEYS).map(|i| format!("bench:{size}:{i}")).collect();
        // In chunks: 100 x 50 KB is more than one request body may carry (1 MiB).
        for chunk in keys.chunks(10) {
            let entries: Vec<_> = chunk
                .iter()
                .map(|k| json!({"key": k, "value": "x".repeat(size)}))
                .collect();
            setup
                .post("/v1/cache", &json!({"op": "mset", "entries": entries}))
                .await
                .expect("mset");
        }
        for rtt in &plan.rtts {
            let proxy = LatencyProxy::start(ctx.sidecar_addr, *rtt)
                .await
                .expect("proxy");
            let ferry = Ferry::new(format!("http://{}", proxy.addr), 16);
            // Open (and keep) ten connections before timing anything.
            concurrent(&ferry, &keys, 10).await;
            let mut seq = Vec::new();
            let mut conc = Vec::new();
            let mut batch = Vec::new();
            ctx.step(&format!("keys {label}: RTT {rtt:?}"));
            // Each path is timed until every value has arrived, and no longer: decoding the
            // same 100 values is the client's cost whichever way it fetched them.
            let mget = json!({"op": "mget", "keys": keys}).to_string().into_bytes();
            for _ in 0..plan.key_iterations {
                let t = Instant::now();
                for k in &keys {
                    ferry.post_raw("/v1/cache", get(k)).await.expect("get");
                }
                seq.push(t.elapsed());
                let t = Instant::now();
                concurrent(&ferry, &keys, 10).await;
                conc.push(t.elapsed());
                let t = Instant::now();
                let len = ferry
                    .post_raw("/v1/cache", mget.clone())
                    .await
                    .expect("mget");
                batch.push(t.elapsed());
                assert!(len > KEYS * size, "an mget answer of {len} bytes");
            }
            let r = ferry
                .post("/v1/cache", &json!({"op": "mget", "keys": keys}))
                .await
                .expect("mget");
            assert_eq!(r["values"].as_array().map(Vec::len), Some(KEYS));
            let ms = rtt.as_secs_f64() * 1000.0;
            for (path, samples) in [
                ("100 sequential requests", &seq),
                ("10 concurrent connections", &conc),
                ("one batch (mget)", &batch),
            ] {
                out.push(row(ms, &format!("{label}: {path}"), samples));
            }
        }
    }
    out
}

/// 100 gets spread over `n` concurrent workers (each on its own connection).
async fn concurrent(ferry: &Ferry, keys: &[String], n: usize) {
    let chunks: Vec<Vec<String>> = keys
        .chunks(keys.len().div_ceil(n))
        .map(<[_]>::to_vec)
        .collect();
    let tasks = chunks.into_iter().map(|chunk| {
        let f = ferry.clone();
        tokio::spawn(async move {
            for k in chunk {
                f.post_raw("/v1/cache", get(&k)).await.expect("get");
            }
        })
    });
    for t in futures::future::join_all(tasks).await {
        t.expect("worker");
    }
}

/// A cache GET's body.
fn get(key: &str) -> Vec<u8> {
    json!({"op": "get", "key": key}).to_string().into_bytes()
}

fn row(rtt_ms: f64, path: &str, samples: &[Duration]) -> Measurement {
    let s = Summary::of(samples);
    let ips = if s.avg_ms > 0.0 {
        1000.0 / s.avg_ms
    } else {
        0.0
    };
    Measurement {
        scenario: "keys",
        rtt_ms,
        path: path.into(),
        figures: json!({"iterations_per_s": ips}),
        latency: Some(s),
    }
}
